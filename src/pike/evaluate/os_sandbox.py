"""The OS sandbox around every evaluation child: bubblewrap (`bwrap`, what Flatpak uses).

Inside, a child has its own PID, network, IPC, UTS, cgroup and user namespaces and a
filesystem of its own: the system's directories and the Python installation read-only,
a private `/tmp` and `/dev/shm`, the GPU's device nodes where there is one, and under
`/pike/` only the folders its evaluation gives it (work, outputs, inputs, build cache).
It cannot see the parent, the reference's child, other candidates or the real home, and
it dies with the process that started it (`--die-with-parent`); when the child ends,
everything it started ends with its PID namespace.

The in-process guards (guards.py) stay as a second line. Where bwrap or the namespaces it
needs are missing, `eval.sandbox: auto` warns once and runs without it; `required`
refuses to run.
"""

from __future__ import annotations

import functools
import glob
import json
import logging
import os
import shutil
import stat
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from pike.errors import EvaluatorError
from pike.evaluate import disk_use

log = logging.getLogger(__name__)

INSIDE_ROOT = "/pike"
NAMESPACES = ("user", "pid", "network", "ipc", "uts", "cgroup", "mount")
# Merged-/usr systems have these as symlinks into /usr; others as directories.
_TOP_LEVEL = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
_SYSTEM_DIRS = ("/usr", "/etc", "/opt")


@dataclass(frozen=True)
class Mount:
    """A host path the child sees at `inside`."""

    host: Path
    inside: str
    writable: bool = False


@dataclass
class SandboxPlan:
    """How one child is wrapped: bwrap's arguments and the paths it sees."""

    mounts: list[Mount] = field(default_factory=list)
    share_network: bool = False

    def inside(self, host: Path | str) -> str:
        """`host` as the child sees it (the longest mount that holds it)."""
        full = os.path.realpath(host)
        best: Mount | None = None
        for m in self.mounts:
            root = os.path.realpath(m.host)
            if (full == root or full.startswith(root + os.sep)) and (
                    best is None or len(root) > len(os.path.realpath(best.host))):
                best = m
        if best is None:
            raise ValueError(f"{host} is not mounted in the sandbox")
        rest = os.path.relpath(full, os.path.realpath(best.host))
        return best.inside if rest == "." else f"{best.inside}/{rest}"

    def prefix(self) -> list[str]:
        args = [_bwrap(), "--unshare-all", "--die-with-parent", "--new-session",
                "--cap-drop", "ALL", "--hostname", "pike-sandbox"]
        if self.share_network:
            args.append("--share-net")
        # The private /tmp first: a Python installation under /tmp (a CI venv) is then
        # mounted over it, not hidden by it.
        args += ["--proc", "/proc", "--dev", "/dev"]
        for private in ("/tmp", "/dev/shm"):  # host memory, which no RSS counts: bounded
            args += [*_sized(), "--tmpfs", private]
        args += ["--ro-bind-try", "/sys", "/sys"]
        for private in _HIDDEN_SYS:  # read by root only; no GPU stack reads them
            if os.path.isdir(private):
                args += ["--tmpfs", private]
        for path in _TOP_LEVEL:
            if os.path.islink(path):
                args += ["--symlink", os.readlink(path), path]
            elif os.path.isdir(path):
                args += ["--ro-bind", path, path]
        for path in _system_paths():
            args += ["--ro-bind", path, path]
        for path, is_folder in _private_system_entries():
            args += ["--tmpfs", path] if is_folder else ["--ro-bind", os.devnull, path]
        for node in sorted(glob.glob("/dev/nvidia*")):  # the GPU, where there is one
            args += ["--dev-bind", node, node]
        for m in self.mounts:
            args += ["--bind" if m.writable else "--ro-bind", str(m.host), m.inside]
        args += ["--chdir", self.mounts[0].inside if self.mounts else "/tmp"]
        return [*args, "--"]

    def describe(self) -> dict[str, str]:
        """The namespaces and mounts in force, for `pike eval --explain`."""
        namespaces = [n for n in NAMESPACES if not (n == "network" and self.share_network)]
        own = ", ".join(f"{m.inside} ({'rw' if m.writable else 'ro'})" for m in self.mounts)
        return {
            "os sandbox": f"bubblewrap {_bwrap_version()}; namespaces: {', '.join(namespaces)}; "
                          "dies with pike",
            "mounts": f"read-only: {', '.join(_system_paths())}, the top-level links; "
                      f"hidden: what other users may not read in {', '.join(_PRIVATE_SCAN)} "
                      f"({len(_private_system_entries())} entries), and "
                      f"{', '.join(_HIDDEN_SYS)}; "
                      f"private: /tmp, /dev/shm ({_tmpfs_size()}), /proc (own PID "
                      f"namespace); {own}; "
                      f"GPU nodes: {', '.join(sorted(glob.glob('/dev/nvidia*'))) or 'none'}; "
                      "nothing else of the host (no real home, no other process)",
        }


def _bwrap() -> str:
    return os.environ.get("PIKE_BWRAP") or shutil.which("bwrap") or "bwrap"


def _tmpfs_size() -> str:
    return (f"{disk_use.PRIVATE_TMPFS_BYTES / 2**30:g} GiB each" if _bwrap_sizes_tmpfs()
            else "unbounded: this bwrap has no --size")


def _sized() -> list[str]:
    """bwrap's size for the next tmpfs (disk_use.PRIVATE_TMPFS_BYTES), where this bwrap
    has `--size` (0.6 and later); else the kernel's default, half the host's memory."""
    return ["--size", str(disk_use.PRIVATE_TMPFS_BYTES)] if _bwrap_sizes_tmpfs() else []


@functools.cache
def _bwrap_sizes_tmpfs() -> bool:
    try:
        done = subprocess.run([_bwrap(), "--help"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return "--size" in done.stdout + done.stderr


@functools.cache
def _bwrap_version() -> str:
    try:
        done = subprocess.run([_bwrap(), "--version"], capture_output=True, text=True,
                              timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return "?"
    return done.stdout.strip().removeprefix("bubblewrap ") or "?"


@functools.cache
def sandbox_problem() -> str | None:
    """Why the sandbox cannot run here (None when it can): a trial run of bwrap."""
    if shutil.which(_bwrap()) is None and not os.path.isfile(_bwrap()):
        return "bubblewrap (`bwrap`) is not installed (apt install bubblewrap)"
    try:
        done = subprocess.run([*SandboxPlan().prefix(), sys.executable, "-c", "pass"],
                              capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as err:
        return f"bwrap could not start: {err}"
    if done.returncode != 0:
        why = (done.stderr.strip().splitlines() or ["no message"])[-1]
        return f"bwrap cannot create its namespaces here ({why})"
    return None


@functools.cache
def _warn_once(problem: str) -> None:
    log.warning("no OS sandbox: %s; candidates run with the in-process guards only "
                "(set eval.sandbox: required to refuse instead)", problem)


def sandbox_active(mode: str) -> bool:
    """Whether children run in the OS sandbox, per EvalConfig.sandbox."""
    if mode == "off":
        return False
    problem = sandbox_problem()
    if problem is None:
        return True
    if mode == "required":
        raise EvaluatorError(f"eval.sandbox is 'required' but {problem}")
    _warn_once(problem)
    return False


def sandbox_status(mode: str) -> str:
    """One line for users: what isolates the children here."""
    if mode == "off":
        return "off (eval.sandbox: off): in-process guards only"
    problem = sandbox_problem()
    if problem is None:
        return f"bubblewrap {_bwrap_version()}: own PID, network, IPC and mount namespaces"
    return f"unavailable ({problem}); in-process guards only"


# Folders whose files other users may not read are shown without them: inside the
# sandbox the child is its own user namespace's root, which is the real root where pike
# runs as root, and as the files' owner it read /etc/shadow (helper-58). /usr is left
# out: a walk of it costs seconds, and it holds no such file on a usual system.
_PRIVATE_SCAN = ("/etc", "/opt")
# /sys holds thousands of files only root may read, too many to hide one by one; these
# folders are hidden whole: the firmware's tables, the machine's serial numbers (DMI),
# the kernel's debug and security files (helper-59 read ACPI tables as root inside).
_HIDDEN_SYS = ("/sys/firmware", "/sys/devices/virtual/dmi", "/sys/kernel/debug",
               "/sys/kernel/security")
_PRIVATE_SCAN_MAX = 200_000  # entries read per folder, once per process


@functools.cache
def _private_system_entries() -> tuple[tuple[str, bool], ...]:
    return tuple(private_entries(_PRIVATE_SCAN, _PRIVATE_SCAN_MAX))


def private_entries(roots: tuple[str, ...], most: int) -> list[tuple[str, bool]]:
    """(path, is a folder) of what in `roots` other users may not read: files without
    read permission for others, folders without read and search permission for them
    (not walked into). Links are not followed; a root past `most` entries is read no
    further (logged)."""
    found: list[tuple[str, bool]] = []
    for root in roots:
        seen = 0
        for folder, folders, files in os.walk(root):
            seen += len(folders) + len(files)
            for name in list(folders):
                path = os.path.join(folder, name)
                if not _others_may(path, 0o005):
                    found.append((path, True))
                    folders.remove(name)
            found += [(os.path.join(folder, name), False) for name in files
                      if not _others_may(os.path.join(folder, name), 0o004)]
            if seen > most:
                log.warning("%s holds over %d entries: the ones past them were not checked "
                            "for files other users may not read, and the sandbox shows them",
                            root, most)
                break
    return found


def _others_may(path: str, bits: int) -> bool:
    try:
        info = os.lstat(path)
    except OSError:
        return True  # gone: nothing to hide
    return stat.S_ISLNK(info.st_mode) or info.st_mode & bits == bits


@functools.cache
def _system_paths() -> tuple[str, ...]:
    """Read-only host paths the child's Python needs: the system's directories, the
    interpreter and every entry of the child's own sys.path (site-packages, an editable
    install's source), but never the real home itself or a folder that holds it."""
    home = os.path.realpath(Path.home())
    wanted = [p for p in _SYSTEM_DIRS if os.path.isdir(p)]
    for path in [sys.prefix, sys.base_prefix, sys.exec_prefix,
                 os.path.dirname(os.path.realpath(sys.executable)), *_child_sys_path()]:
        real = os.path.realpath(path)
        if not os.path.isdir(real) or real == "/":
            continue
        if home == real or home.startswith(real + os.sep):
            continue  # the home or above it: its own site-packages come through sys.path
        wanted.append(real)
    if os.environ.get("CUDA_HOME") and os.path.isdir(os.environ["CUDA_HOME"]):
        wanted.append(os.path.realpath(os.environ["CUDA_HOME"]))
    # Drop paths inside another one: one mount serves both.
    kept: list[str] = []
    for path in sorted(set(wanted), key=len):
        if not any(path == k or path.startswith(k + os.sep) for k in kept):
            kept.append(path)
    return tuple(sorted(kept))


@functools.cache
def _child_sys_path() -> tuple[str, ...]:
    """sys.path of a fresh interpreter like the child's (not this process's, which pytest
    or a user's script may have extended with the project or the tasks' folder)."""
    env = {k: v for k, v in os.environ.items() if k in ("PATH", "PYTHONPATH", "PYTHONHOME")}
    try:
        done = subprocess.run([sys.executable, "-I" if "PYTHONPATH" not in env else "-s",
                               "-c", "import sys, json; print(json.dumps(sys.path[1:]))"],
                              capture_output=True, text=True, timeout=30, env=env, cwd="/")
        entries = json.loads(done.stdout)
    except (OSError, subprocess.TimeoutExpired, ValueError):
        entries = [p for p in sys.path if p]
    # The pike package itself, wherever it is installed from.
    import pike

    return (*entries, str(Path(pike.__file__).resolve().parent.parent))
