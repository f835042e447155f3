"""Child-side guards against candidates that cheat or attack, installed before they load.

- An audit hook (PEP 578) refuses network access (but for urllib3's import-time bind of a
  loopback port 0, which reaches no one), writes outside the child's own
  directories, patching of the classes the timer and the checks use, and walking the
  garbage collector's objects or the evaluator's frames; every refusal is recorded, and
  any record makes the verdict `rejected`.
- An integrity snapshot of the functions the evaluator relies on is compared after each
  phase, to catch patches the audit hook cannot see (module attributes).
- Global backend flags are snapshotted and reported when the candidate changes them:
  the reference runs in a process of its own with the defaults, so a flag only changes
  the candidate's own numbers, and the verdict says which.

This raises the bar for lazy cheating; it is not a security boundary (ctypes can undo
any of it). The process sandbox (own session, scrubbed environment, network namespace
where available) is the outer layer.
"""

from __future__ import annotations

import _imp
import ast
import contextlib
import ctypes
import functools
import gc
import importlib
import ipaddress
import json
import os
import sys
import sysconfig
import threading
import time
import types
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

import torch

from pike.evaluate import callbacks

_EVALUATOR_DIR = str(Path(__file__).resolve().parent)
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
_NETWORK_EVENTS = ("socket.connect", "socket.bind", "socket.sendto", "socket.sendmsg")
_TORCH_PARTS = ("/torch/", "/triton/")
_LIBRARY_PARTS = (*_TORCH_PARTS, "/lib/python3")
# Import roots outside the usual layout (a PYTHONPATH folder, `pip install --target`):
# set by Guards.install before any candidate code runs (library_roots)
_library_roots: tuple[str, ...] = ()
# The folders the child may write (as prefixes): nothing in them is a library's, whatever
# its path says (a candidate's own work/torch/helper.py is not torch's). Set by install.
_untrusted_dirs: tuple[str, ...] = ()
# Events that give code a file name: a name the guards trust, given by the candidate's own
# code, would pass its threads and patches off as a library's
_NAMING_EVENTS = ("compile", "code.__new__", "exec")
# Events that make code objects with no naming event: marshal data can hold a code object
# under any file name (a candidate's own, with the name's bytes swapped)
_MARSHAL_EVENTS = ("marshal.loads", "marshal.load")
# The standard library proper (not its site-packages): its helpers (code, codeop) compile
# and exec on their caller's behalf, so the code they work for is further out
_STDLIB = tuple(dict.fromkeys(
    form.rstrip(os.sep) + os.sep
    for folder in (sysconfig.get_paths().get("stdlib"), os.path.dirname(os.__file__)) if folder
    for form in (os.path.abspath(folder), os.path.realpath(folder))))
# inductor's and Triton's generated modules (set in the child's environment at its start):
# code there that a library thread runs is torch's work
_BUILD_CACHES = tuple(os.environ[v] for v in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")
                      if os.environ.get(v))
# where the standard library's thread pool runs each submitted function
_POOL_WORKER_FILE = os.path.join("concurrent", "futures", "thread.py")
_GC_EVENTS = ("gc.get_objects", "gc.get_referrers", "gc.get_referents")
# event -> which of its arguments are paths it changes (a hard link's source becomes
# writable through the link; a symlink's target is checked when it is opened)
_PATH_EVENTS = {"os.remove": (0,), "os.rmdir": (0,), "os.chmod": (0,), "os.truncate": (0,),
                "os.rename": (0, 1), "os.link": (0, 1), "os.symlink": (1,),
                "shutil.rmtree": (0,)}
# What may be written under /dev (the sandbox's /dev/shm is private and listed as writable
# where there is one; the host's is not).
_DEVICE_SINKS = frozenset({"/dev/null", "/dev/stdout", "/dev/stderr", "/dev/tty"})


# The attributes that hand out a frame other than by walking the stack: a traceback's, and
# a suspended generator's or coroutine's, whose locals are otherwise out of reach (the
# timing's probe sets wait in one: timed_calls._sealed_probes). Reading them raises the audit
# event object.__getattr__; f_back and f_locals do not.
_FRAME_ATTRIBUTES = frozenset({"tb_frame", "gi_frame", "cr_frame", "ag_frame"})
# The frames above a probe's taker that must be the evaluator's: the rotation's call, the
# timing loop's (two), the runner's serving loop
_TAKER_DEPTH = 4
_get_ident = threading.get_ident  # taken at import, as the hook's (Guards._hook)
# Ways to have code called back from inside any frame, the evaluator's included: a
# profile or trace function is handed each frame, an audit hook runs inside every event
# (the probes' seal raises one), a monitoring callback names each code start. Red team
# round 10 read the sealed probe sets so, through each of the first three (`ok` at 114x
# to 1,470x on the CPU), one of them installed from a finalizer with no candidate frame
# on the stack. Refused whoever raises them: torch and the evaluator install none.
_CALLBACK_EVENTS = frozenset({"sys.setprofile", "sys.settrace", "sys.addaudithook",
                              "sys._setprofileallthreads", "sys._settraceallthreads",
                              "sys.monitoring.register_callback"})
# Libraries torch imports on a candidate's behalf that add an audit hook of their own as
# they are imported: filelock 4 on CPython 3.12 and later (torch.compile's caches lock
# with it). Imported by the candidate's own call, the import was refused: level5's
# 11_mamba2_pytorch, a torch.compile in its __init__, was `rejected` on an H100
# (2026-12-06). Imported first, with their hooks left out (_imported_without_hooks): a
# library's hook is code any frame's events run, and filelock's reads a keyword default
# the candidate can replace with an object of its own (a review's candidate read the
# sealed probes so, `ok` at 157x on the CPU with a stand-in of filelock 4.3.2's hook).
# filelock's fork handling stands on os.register_at_fork as well. torch imports none.
_IMPORTED_BEFORE_THE_HOOK = ("filelock",)
# ctypes' ways to read memory by address, whose reads raise no event: an object at an
# address (from_address, cast to py_object), bytes at one (string_at, memmove). Red team
# round 11 read the sealed probe generator's frame so (`ok` at 1,768x on the CPU). Refused
# where the candidate's own code asks; torch asks for some itself (a CUDA launch through
# ctypes casts its arguments), and native code of the candidate's reads memory anyway
# (Known gaps).
_CTYPES_READS = frozenset({"ctypes.cdata", "ctypes.string_at", "ctypes.wstring_at",
                           "ctypes.PyObj_FromPtr"})
_CTYPES_MEMORY_FUNCTIONS = frozenset(
    getattr(ctypes, name) for name in ("_memmove_addr", "_memset_addr", "_cast_addr",
                                       "_string_at_addr", "_wstring_at_addr")
    if hasattr(ctypes, name))
# The events Guards._audit decides on; the hook lets every other one pass at once (an
# integrity snapshot alone raises builtins.id thousands of times, and a walk of the
# stack for each stretched a candidate's timing blocks past the wall-clock margin).
_WATCHED_EVENTS = frozenset({
    *_NETWORK_EVENTS, *_GC_EVENTS, *_NAMING_EVENTS, *_MARSHAL_EVENTS, *_PATH_EVENTS,
    *_CALLBACK_EVENTS, *_CTYPES_READS, "ctypes.call_function", "ctypes.dlsym",
    "sys._getframe", "sys._current_frames", "object.__setattr__", "object.__delattr__", "object.__getattr__", "open"})


# Only these hand out frames through those attributes; anything else named in the event
# is the candidate's own object, whose attribute would run its code inside the hook (an
# event any code may raise with sys.audit: reads_inside_the_hook)
_FRAME_HOLDERS = (types.GeneratorType, types.CoroutineType, types.AsyncGeneratorType,
                  types.TracebackType)


def _evaluator_frame(holder: object, attribute: str) -> bool:
    """Whether `holder.attribute` (one of _FRAME_ATTRIBUTES) is a frame of the evaluator's
    code."""
    if type(holder) not in _FRAME_HOLDERS:
        return False
    code = getattr(getattr(holder, attribute, None), "f_code", None)
    return code is not None and code.co_filename.startswith(_EVALUATOR_DIR)


def _process_memory_file(path: str | bytes | os.PathLike[str]) -> bool:
    """/proc/PID/mem (or a thread's, or through a link): read at an object's address, the
    interpreter's memory, as ctypes reads it."""
    try:
        name = os.fsdecode(path)
        if not os.path.isabs(name) and os.path.basename(name) in ("mem", "pagemap"):
            return True  # relative to a folder the event does not name (dir_fd=/proc/self)
        full = os.path.realpath(name)
    except (OSError, ValueError):
        return False
    return full.startswith("/proc/") and full.rsplit("/", 1)[-1] in ("mem", "pagemap")


def _linked_elsewhere(path: str | bytes | os.PathLike[str]) -> bool:
    """An existing regular file with other names: writing it writes them too."""
    try:
        info = os.stat(path)
    except (OSError, ValueError):
        return False
    return info.st_nlink > 1 and (info.st_mode & 0o170000) == 0o100000


def _patched_by_candidate(raiser: FrameType) -> bool:
    """Whether candidate code is anywhere on the stack of a patch of a protected class
    (`raiser`: the patching frame). Library code patching on its own (torch's internals)
    passes; a candidate that routes the patch through a library helper (unittest.mock,
    setattr in functools) does not."""
    return _candidate_code_on(raiser)


def _candidate_code_on(frame: FrameType | None, also_trusted: tuple[str, ...] = ()) -> bool:
    """Whether a frame of this stack runs code outside the evaluator, the libraries and
    the folders in `also_trusted`."""
    while frame is not None:
        if not _trusted_name(frame.f_code.co_filename, also_trusted):
            return True
        frame = frame.f_back
    return False


def _stdlib_file(filename: str) -> bool:
    return filename.startswith(_STDLIB) and "-packages" not in filename


def _served_code(frame: FrameType | None) -> FrameType | None:
    """The nearest frame outside the standard library: the code a standard library helper
    (code.InteractiveInterpreter, codeop) compiles or runs for. Frozen frames (importlib)
    are not passed over: what the import system compiles is named after the file it read."""
    while frame is not None and _stdlib_file(frame.f_code.co_filename):
        frame = frame.f_back
    return frame


def _for_the_candidate(frame: FrameType | None,
                       honest: Callable[[FrameType], bool] | None = None) -> bool:
    """Whether code made here (a compile, a marshal load) is made for the candidate: its
    nearest caller outside the standard library is the candidate's code; or that caller is
    importlib's (frozen), the candidate's code is further down the stack, and what
    importlib makes is not what lies in the file it names (`honest`, given the frozen
    frame, says whether it is): an importlib loader subclass of the candidate's whose
    `get_data` returns other bytes, or the candidate's own call into importlib's internals
    (`SourceLoader.source_to_code`, `_compile_bytecode`) with bytes of its own. An import
    reads the file it names, so a library module imported from the candidate's code still
    passes. zipimport's frames still decide themselves (an archive's members are no files
    to compare with: Known gaps)."""
    served = _served_code(frame)
    if served is None:
        # the standard library alone: a thread pool's worker calling compile or marshal
        # for whoever submitted it (ThreadPoolExecutor.submit(compile, ...)); an import
        # has importlib's frames, torch's work its own
        return True
    name = served.f_code.co_filename
    if name.startswith("<frozen "):
        if honest is None or name.startswith("<frozen zipimport"):
            return False
        return _candidate_code_on(served, _BUILD_CACHES) and not honest(served)
    return not _trusted_name(name)


def _renaming_for_imports_only(rename: Callable[[Any, str], None],
                               guards: Guards) -> Callable[[Any, str], None]:
    """`_imp._fix_co_filename`, which renames a code object and all it holds in place and
    raises no audit event, for importlib's `_compile_bytecode` alone (a cached module's
    code, after the file it was found as): the candidate's own call would give its code a
    library's file name. The original is still reachable through this closure, so this
    raises the bar; the guards still trust a thread by its code's file name."""
    def fix_co_filename(code: Any, path: str) -> None:
        caller = sys._getframe(1)
        by_importlib = (caller.f_code.co_name == "_compile_bytecode"
                        and caller.f_code.co_filename.startswith("<frozen importlib"))
        if guards.armed and not by_importlib and _candidate_code_on(caller, _BUILD_CACHES):
            guards._refuse("renaming code objects (_imp._fix_co_filename)")
        rename(code, path)
    return fix_co_filename


def _never(frame: FrameType) -> bool:
    return False  # importlib makes no code object with CodeType or replace()


def _file_holds(path: object, data: object, skip: int = 0) -> bool:
    """Whether the file at `path` holds `data` after its first `skip` bytes (a pyc's
    header); False where it cannot be read or `data` is no bytes or text."""
    if isinstance(data, str):
        data = data.encode()
    if not isinstance(path, (str, bytes)) or not isinstance(data, (bytes, bytearray,
                                                                    memoryview)):
        return False
    try:
        with open(path, "rb") as file:
            file.seek(skip)
            return file.read() == bytes(data)
    except (OSError, ValueError):
        return False


def _compiles_its_file(source: object, name: str) -> Callable[[FrameType], bool]:
    return lambda frame: _file_holds(name, source)


def _loads_its_file(data: object) -> Callable[[FrameType], bool]:
    """importlib unmarshals a cached module's code in `_compile_bytecode`, told the pyc's
    path (`bytecode_path`): the data must be that file's, less its 16-byte header, and the
    file outside the folders the candidate may write (the names inside marshal data are
    the data's own: a pyc it wrote there would vouch for any of them)."""
    def honest(frame: FrameType) -> bool:
        at: FrameType | None = frame
        while at is not None and at.f_code.co_filename.startswith("<frozen "):
            path = at.f_locals.get("bytecode_path")
            if path is not None:
                return (isinstance(path, str) and not os.path.realpath(path).startswith(
                            (*_untrusted_dirs, *_BUILD_CACHES))
                        and _file_holds(path, data, skip=16))
            at = at.f_back
        return False
    return honest


def _library_file(filename: str) -> bool:
    if filename.startswith(_untrusted_dirs) or not _plain_path(filename):
        return False
    return any(p in filename for p in _LIBRARY_PARTS) or filename.startswith(_library_roots)


def _plain_path(filename: str) -> bool:
    """A path that names a file the way the import system does: absolute, normalized, and
    not through /proc/self/cwd or /proc/self/root (which reach a writable folder under
    another prefix), nor `//` (which POSIX keeps apart from `/`)."""
    return (filename == os.path.normpath(filename) and not filename.startswith("//")
            and not filename.startswith("/proc/"))


def _trusted_name(filename: str, also_trusted: tuple[str, ...] = _BUILD_CACHES) -> bool:
    """A code file name the guards take for the evaluator's, a library's or one of
    `also_trusted`'s (by default the build caches', which some guards trust)."""
    return filename.startswith((_EVALUATOR_DIR, "<frozen ", *also_trusted)) or _library_file(
        filename)


def _named_file(event: str, args: tuple[Any, ...]) -> str | None:
    """The file name a compile, a new code object or an exec'd code object carries."""
    name = getattr(args[0], "co_filename", None) if event == "exec" and args else (
        args[1] if len(args) > 1 else None)
    return os.fsdecode(name) if isinstance(name, (str, bytes)) else None


def library_roots(path: list[str], untrusted: list[str]) -> tuple[str, ...]:
    """The interpreter's import roots (`path`, as sys.path before the candidate loads)
    whose code counts as a library's wherever it lies: on the H200 a PYTHONPATH folder
    held tqdm, whose idle monitor thread, started inside torch.compile, was taken for the
    candidate's and rejected every compile candidate. A root that holds, or is, any of
    `untrusted` (the folders the child may write, the candidate's own file) is none: what
    lies there the candidate could have put there; so is one inside any of them."""
    roots: list[str] = []
    for entry in path:
        if not entry or not os.path.isabs(entry) or not os.path.isdir(entry):
            continue  # the working directory ('' or relative) is never a library's
        for form in {os.path.abspath(entry), os.path.realpath(entry)}:
            if not any(_within(v, form) or _within(form, v)
                       for u in untrusted for v in {u, os.path.realpath(u)}):
                roots.append(form.rstrip(os.sep) + os.sep)
    return tuple(dict.fromkeys(roots))


def _within(path: str, root: str) -> bool:
    path, root = os.path.abspath(path), os.path.abspath(root)
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def _loopback_probe(args: tuple[Any, ...]) -> bool:
    """A bind to a loopback address on port 0, the probe urllib3 runs when it is imported
    (to learn whether IPv6 works; requests and diffusers import it): it reaches no one, and
    refusing it rejected every candidate of a task that imports diffusers."""
    address = args[1] if len(args) > 1 else None
    if not (isinstance(address, tuple) and len(address) >= 2 and address[1] == 0):
        return False
    try:
        return ipaddress.ip_address(address[0]).is_loopback
    except ValueError:  # a host name, which would need a lookup
        return False


def _protected_types() -> tuple[type, ...]:
    found: list[type] = [torch.Tensor, torch.UntypedStorage, torch.nn.Module]
    if hasattr(torch, "cuda"):
        found += [torch.cuda.Event, torch.cuda.Stream]
    return (*found, *_evaluator_classes())


# The child's classes whose methods run around the candidate's calls: the timing's
# rotation and samplers, the channel its reports go through, the slot its outputs go to,
# its step clock (plain classes: a pydantic model's class may fill itself in later).
_CHILD_CLASSES = {"pike.evaluate.timed_calls": ("InputRotation", "TimedOutputSamples",
                                                "RehearsedSamples"),
                  "pike.evaluate.protocol": ("Channel",),
                  "pike.evaluate.outputs_handoff": ("OutputsSlot",),
                  "pike.evaluate.steps": ("StepClock",)}


def _evaluator_classes() -> list[type]:
    """The guards' own class and the child's classes above: a method patched on one would
    change what the hook or the probes' seal asks, or what the child reports
    (patches_guards_class, patches_rotation_class). CPython raises no audit event for
    `SomeClass.name = value` (object.__setattr__ only for that function's own calls; 3.8
    to 3.13 checked), so `_integrity_snapshot` holds their attributes one by one."""
    found: list[type] = [Guards]
    for module_name, names in _CHILD_CLASSES.items():
        module = sys.modules.get(module_name)
        found += [getattr(module, name) for name in names
                  if module is not None and isinstance(getattr(module, name, None), type)]
    return found


def _imported_without_hooks(names: tuple[str, ...], untrusted: tuple[str, ...]) -> None:
    """Import `names` with `sys.addaudithook` a no-op meanwhile, from the library folders
    only: the child's own folder (its cwd, sys.path's first entry) holds the candidate's
    file, and a module there of a library's name would be imported as the library."""
    path, add_hook = sys.path[:], sys.addaudithook
    cwd = os.getcwd()
    sys.path[:] = [p for p in path if p and os.path.abspath(p) != cwd
                   and not (os.path.abspath(p) + os.sep).startswith(untrusted)]
    sys.addaudithook = lambda hook: None
    try:
        for name in names:
            with contextlib.suppress(ImportError):
                importlib.import_module(name)
    finally:
        sys.addaudithook, sys.path[:] = add_hook, path


@dataclass
class Guards:
    """The child's guard state; `violations` turn into a `rejected` verdict."""

    writable: list[str]
    enabled: bool = True
    module_path: str = ""  # the candidate's file: no folder holding it counts as a library's
    violations: list[str] = field(default_factory=list)
    armed: bool = False  # off while the evaluator itself loads inputs and saves outputs
    _protected: tuple[type, ...] = ()
    _snapshot: dict[str, int] = field(default_factory=dict)
    _callbacks: dict[str, object] = field(default_factory=dict)  # callbacks.snapshot()
    _flags: dict[str, Any] = field(default_factory=dict)
    _threads: set[int] = field(default_factory=set)

    def install(self) -> None:
        if not self.enabled:
            return
        self._protected = _protected_types()
        self._flags = backend_flags()
        self._threads = {t.ident or 0 for t in threading.enumerate()}
        global _library_roots, _untrusted_dirs
        _library_roots = library_roots(
            list(sys.path), [*self.writable, *_BUILD_CACHES, os.getcwd(),
                             *([self.module_path] if self.module_path else [])])
        _untrusted_dirs = tuple(dict.fromkeys(
            form.rstrip(os.sep) + os.sep for w in self.writable
            for form in (os.path.abspath(w), os.path.realpath(w))))
        _imported_without_hooks(_IMPORTED_BEFORE_THE_HOOK, _untrusted_dirs)
        _imp._fix_co_filename = _renaming_for_imports_only(_imp._fix_co_filename, self)
        # after the folder lists are set: they are in it (a candidate's code that emptied
        # them would pass for a library's with every guard)
        self._snapshot = _integrity_snapshot()
        self._callbacks = callbacks.snapshot()
        sys.addaudithook(self._hook())

    def _hook(self) -> Callable[[str, tuple[Any, ...]], None]:
        """The audit hook. It watches an event where the guards are armed or candidate
        code is on the event's stack: a timed call can walk its stack to these Guards and
        set `armed` as the evaluator does between calls (disarms_the_guards in
        tests/candidates: `ok` at 83x on the CPU, the sealed probes read, before). Which
        threads are inside the hook's own look at the stack (whose frame reads raise
        events again) is kept in this closure alone: no object the candidate reaches
        holds the hook, so no flag of it can be set to switch the guards off."""
        looking: set[int] = set()
        # what the hook calls, taken now: the candidate reaches the instance, the class and
        # the sys module, and a swapped sys._getframe (swaps_getframe) or _audit
        # (replaces_audit) would blind it
        audit, getframe, get_ident = Guards._audit, sys._getframe, threading.get_ident

        def hook(event: str, args: tuple[Any, ...]) -> None:
            if event not in _WATCHED_EVENTS or (
                    event == "object.__getattr__"
                    and (len(args) < 2 or args[1] not in _FRAME_ATTRIBUTES)) or (
                    event == "ctypes.call_function"
                    and (not args or args[0] not in _CTYPES_MEMORY_FUNCTIONS)):
                return  # builtins.id and __code__ reads come by the thousand
            me = get_ident()
            if me in looking:
                return
            looking.add(me)
            try:
                raiser = getframe(1)
                # `is True`: an object of the candidate's there would run its __bool__.
                # A sys._getframe unarmed is not worth a walk of the stack: the probes'
                # seal asks for one at each probe, inside the timed calls, and what it
                # refuses (an evaluator's frame) f_back gives a disarmed candidate anyway.
                watched = (self.armed is True or event in _CALLBACK_EVENTS
                           or (event != "sys._getframe" and _candidate_code_on(raiser)))
                frame_read = (event == "object.__getattr__" and watched
                              and _evaluator_frame(args[0], args[1])
                              and _candidate_code_on(raiser))
            finally:
                looking.discard(me)
            if watched:
                audit(self, event, args, raiser, frame_read)

        return hook

    def probe_taker_is_foreign(self, resumer: FrameType, sealed_on: int) -> bool:
        """Whether `resumer`, the frame that resumed the timing's sealed probe sets
        (timed_calls._sealed_probes), is not the rotation's own call in the timing loop: on
        another thread than the one that sealed them (a thread of the candidate's, whose
        stack holds only the standard library's frames: pulls_by_thread), with the guards
        armed (a take from inside a timed call; `is not False`: an object of the
        candidate's there would run its code while the seal's frame is on the stack), or
        with a frame of code outside the evaluator among the few above it (the rotation's
        call, the timing loop, the runner): a bounded look, since it runs inside a
        timed call's measured time."""
        if self.enabled is False:
            return False
        if _get_ident() != sealed_on or self.armed is not False:
            return True
        frame: FrameType | None = resumer
        for _ in range(_TAKER_DEPTH):
            if frame is None:
                return False
            if not frame.f_code.co_filename.startswith(_EVALUATOR_DIR):
                return True
            frame = frame.f_back
        return False

    def _refuse(self, what: str) -> None:
        if what not in self.violations:
            self.violations.append(what)
        raise PermissionError(f"pike evaluator: {what} is not allowed")

    def _audit(self, event: str, args: tuple[Any, ...], raiser: FrameType,
               evaluator_frame_read: bool) -> None:
        """An event the hook watches; `raiser` is the frame that raised it, and
        `evaluator_frame_read` whether it read an evaluator's frame for candidate code
        (the evaluator describing a candidate's exception reads traceback frames itself,
        and a candidate's own frames pass)."""
        if event in _NETWORK_EVENTS:
            if not (event == "socket.bind" and _loopback_probe(args)):
                self._refuse("network access")
        elif event in _GC_EVENTS:
            self._refuse(f"{event}() (walking the interpreter's objects)")
        elif event in _CALLBACK_EVENTS:
            self._refuse(f"{event}() (code called back from inside the evaluator's frames)")
        elif event in _CTYPES_READS or event == "ctypes.call_function" or (
                event == "ctypes.dlsym" and len(args) > 1 and isinstance(args[1], str)
                and args[1].lstrip("_").startswith("Py")):
            if _for_the_candidate(raiser):
                self._refuse(f"{event} (reading the process's memory by address)")
        elif event == "sys._current_frames":
            # every thread's innermost frame, the timing loop's among them: a thread of the
            # candidate's walked f_back from it to the probes' seal while the loop took one
            if _for_the_candidate(raiser):
                self._refuse("sys._current_frames() (reading every thread's frames)")
        elif event == "sys._getframe":
            frame = args[0] if args else None
            if frame is not None and frame.f_code.co_filename.startswith(_EVALUATOR_DIR):
                self._refuse("inspecting the evaluator's frames")
        elif event == "object.__getattr__":
            if evaluator_frame_read:
                self._refuse("inspecting the evaluator's frames")
        elif event in ("object.__setattr__", "object.__delattr__"):
            # by identity: `in` would call a candidate metaclass's __eq__ inside the hook
            if args and isinstance(args[0], type) and any(args[0] is t for t in self._protected):
                if _patched_by_candidate(raiser):
                    self._refuse(f"patching {args[0].__module__}.{args[0].__qualname__}")
        elif event == "open":
            self._check_open(args)
        elif event in _NAMING_EVENTS:
            name = _named_file(event, args)
            # only the candidate's own call, or a standard library helper's on its behalf:
            # torch's compilers name code after torch's files while the candidate's forward
            # is further down the stack
            honest = (_compiles_its_file(args[0] if args else None, name)
                      if event == "compile" and name is not None
                      else _never if event == "code.__new__" else None)
            if name is not None and _trusted_name(name) and _for_the_candidate(
                    raiser, honest):
                self._refuse(f"code named after a library's file ({name})")
            elif (event == "compile" and name is None and args
                  and isinstance(args[0], ast.AST) and _for_the_candidate(raiser)):
                # the event names no file for a syntax tree: any name may be inside
                self._refuse("compiling a syntax tree (the file name it gives is not seen)")
        elif event in _MARSHAL_EVENTS:
            if _for_the_candidate(raiser, _loads_its_file(args[0] if args else None)):
                self._refuse("loading code objects from marshal data")
        elif event in _PATH_EVENTS:
            # rename, replace and link: the destination counts as much as the source
            for path in (args[i] for i in _PATH_EVENTS[event] if i < len(args)):
                if isinstance(path, (str, bytes, os.PathLike)) and not self._may_write(path):
                    self._refuse(f"{event.split('.')[1]} of {os.fsdecode(path)}")

    def _check_open(self, args: tuple[Any, ...]) -> None:
        path, mode, flags = (list(args) + [None, None, None])[:3]
        if isinstance(path, (str, bytes, os.PathLike)) and _process_memory_file(path):
            self._refuse(f"opening {os.fsdecode(path)} (the process's memory)")
        writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
            isinstance(flags, int) and flags & _WRITE_FLAGS)
        if writing and isinstance(path, (str, bytes, os.PathLike)) and not self._may_write(path):
            self._refuse(f"writing {os.fsdecode(path)}")
        if writing and isinstance(path, (str, bytes, os.PathLike)) and _linked_elsewhere(path):
            self._refuse(f"writing {os.fsdecode(path)}, a hard link to a file elsewhere")

    def _may_write(self, path: str | bytes | os.PathLike[str]) -> bool:
        full = os.path.realpath(os.fsdecode(path))
        return full in _DEVICE_SINKS or any(
            full == root or full.startswith(root + os.sep) for root in self.writable)

    def check_after(self, phase: str) -> None:
        """Record patched evaluator functions and threads left running by candidate code."""
        if not self.enabled:
            return
        patched = [name for name, ident in _integrity_snapshot().items()
                   if self._snapshot.get(name) != ident]
        if patched:
            self.violations.append(f"patching {', '.join(patched[:5])} (seen after {phase})")
        installed = callbacks.changed_since(self._callbacks)
        if installed:
            self.violations.append(f"{installed[0]} (code the interpreter calls back inside "
                                   f"any frame, the evaluator's too; seen after {phase})")
        stacks = sys._current_frames()
        stray = [t for t in threading.enumerate()
                 if (t.ident or 0) not in self._threads and t.is_alive()
                 and _runs_user_code(t, stacks.get(t.ident or 0))]
        if stray:
            self.violations.append(f"a thread that outlives the call ({stray[0].name}, "
                                   f"seen after {phase})")

    def changed_flags(self) -> dict[str, tuple[Any, Any]]:
        if not self.enabled:
            return {}
        now = backend_flags()
        return {k: (v, now.get(k)) for k, v in self._flags.items() if now.get(k) != v}


_CALLBACKS_AT_IMPORT = callbacks.snapshot()  # what the rehearsal compares with


def rehearse_check_after() -> None:
    """The work of `Guards.check_after` with nothing to compare: the trusted reference's
    calibration of the timing loop does it after each block, so the loop cost it measures
    includes what a guarded child spends between its blocks (2 ms or more on a busy host;
    left out, an honest candidate of microsecond calls looked like one forging its times)."""
    _integrity_snapshot()
    callbacks.changed_since(_CALLBACKS_AT_IMPORT)
    sys._current_frames()
    threading.enumerate()


def _runs_user_code(thread: threading.Thread, stack: FrameType | None) -> bool:
    """A thread started from code outside torch and the standard library (the candidate),
    or one started by a library that runs the candidate's work now: a thread pool's
    worker (its target is the standard library's) running a function of the candidate's,
    or any function that is not torch's or Triton's (a builtin that holds the host
    without a Python frame of the candidate's on the stack). An idle worker passes, but
    not a waiting threading.Timer of the candidate's function: it waits in threading's
    code and runs the function later, between the guards' looks."""
    if isinstance(thread, threading.Timer):
        fn = thread.function
        while isinstance(fn, functools.partial):
            fn = fn.func
        if not _library_function(fn):
            return True
    target = getattr(thread, "_target", None) or getattr(type(thread), "run", None)
    code = getattr(target, "__code__", None)
    filename = code.co_filename if code else ""
    if not (_library_file(filename) or "threading.py" in filename):
        return True
    # torch's own threads run what torch gives them, unless that is the candidate's code
    # (a target wrapped by torch: Thread(target=torch.no_grad()(spin))); only a pool that
    # is not torch's runs foreign work items
    torchs = any(part in filename for part in _TORCH_PARTS)
    return _candidate_code_on(stack, _BUILD_CACHES) or (
        not torchs and _runs_foreign_work_item(stack))


def _runs_foreign_work_item(frame: FrameType | None) -> bool:
    """Whether this stack is a thread pool's worker running a work item whose function is
    not torch's or Triton's."""
    while frame is not None:
        code = frame.f_code
        if code.co_name == "run" and code.co_filename.endswith(_POOL_WORKER_FILE):
            item = frame.f_locals.get("self")
            future = getattr(item, "future", None)
            if future is None or future.done():  # an item whose result is in: finishing
                return False
            fn = getattr(item, "fn", None)
            while isinstance(fn, functools.partial):
                fn = fn.func
            return fn is not None and not _library_function(fn)
        frame = frame.f_back
    return False


def _library_function(fn: Any) -> bool:
    code = getattr(fn, "__code__", None)
    if code is not None:
        return any(part in code.co_filename for part in _TORCH_PARTS)
    module = getattr(fn, "__module__", None) or ""
    return module.split(".")[0] in ("torch", "triton")


def backend_flags() -> dict[str, Any]:
    """Process-wide settings that change what a model computes or how fast: torch's older
    flags and, where this torch has them, its per-backend `fp32_precision` settings."""
    backends = torch.backends
    readers: dict[str, Callable[[], Any]] = {
        "default_dtype": lambda: str(torch.get_default_dtype()),
        "float32_matmul_precision": torch.get_float32_matmul_precision,
        "deterministic_algorithms": torch.are_deterministic_algorithms_enabled,
        "cudnn.benchmark": lambda: backends.cudnn.benchmark,
        "cudnn.deterministic": lambda: backends.cudnn.deterministic,
        "cudnn.allow_tf32": lambda: backends.cudnn.allow_tf32,
        "cuda.matmul.allow_tf32": lambda: backends.cuda.matmul.allow_tf32,
        "cuda.matmul.allow_fp16_reduced_precision_reduction":
            lambda: backends.cuda.matmul.allow_fp16_reduced_precision_reduction,
    }
    for name, owner in (("fp32_precision", backends),
                        ("cuda.matmul.fp32_precision", backends.cuda.matmul),
                        ("cudnn.fp32_precision", backends.cudnn),
                        ("cudnn.conv.fp32_precision", getattr(backends.cudnn, "conv", None)),
                        ("cudnn.rnn.fp32_precision", getattr(backends.cudnn, "rnn", None))):
        if owner is not None and hasattr(owner, "fp32_precision"):
            readers[name] = lambda owner=owner: owner.fp32_precision
    return {name: _read_flag(read) for name, read in readers.items()}


def _read_flag(read: Callable[[], Any]) -> Any:
    """A flag's value, or why it cannot be read: once a candidate sets TF32 by torch's
    newer per-backend API, the older getters raise ("a mix of the legacy and new APIs"),
    and an honest candidate that did so was `crashed` by the guard that reads them."""
    try:
        return read()
    except RuntimeError as err:
        return "unreadable: " + (str(err).split(",")[0] or type(err).__name__)[:120]


def _integrity_snapshot() -> dict[str, int]:
    """Identity of every function the evaluator calls by attribute lookup at run time."""
    watched: dict[str, Callable[..., Any] | Any] = {
        "time.perf_counter": time.perf_counter, "time.monotonic": time.monotonic,
        "torch.cuda.synchronize": torch.cuda.synchronize, "torch.cuda.Event": torch.cuda.Event,
        "torch.allclose": torch.allclose, "torch.equal": torch.equal, "torch.save": torch.save,
        "torch.load": torch.load, "json.dumps": json.dumps, "os.write": os.write,
        "gc.get_objects": gc.get_objects, "sys.addaudithook": sys.addaudithook,
    }
    for cls in (torch.cuda.Event, torch.cuda.Stream):  # what the timer calls methods of
        for name, value in vars(cls).items():
            if callable(value) and not name.startswith("__"):
                watched[f"torch.cuda.{cls.__name__}.{name}"] = value
    # Tensor methods: the checks and the timed outputs' samples call them on outputs.
    for cls in (torch.Tensor, torch._C.TensorBase):
        for name, value in vars(cls).items():
            if callable(value):
                watched[f"{cls.__module__}.{cls.__qualname__}.{name}"] = value
    for cls in _evaluator_classes():  # every attribute: a class patch raises no event
        for name, value in vars(cls).items():
            watched[f"{cls.__module__}.{cls.__qualname__}.{name}"] = value
    for module_name, module in list(sys.modules.items()):
        if module_name.startswith("pike.evaluate") and module is not None:
            for name, value in vars(module).items():
                # tuples and frozensets: the folder lists that say whose code is whose
                if callable(value) or isinstance(value, (int, float, str, tuple, frozenset)):
                    watched[f"{module_name}.{name}"] = value
    return {name: id(value) for name, value in watched.items()}
