"""Temp folders that outlive a killed pike: each is named after the process that made it,
and the next pike to start removes those whose owner is gone.

`pike-cand-<pid>-*` and `pike-ref-<pid>-*` hold a candidate's work and a reference's
inputs; a pike ended by SIGKILL (or the OOM killer) cannot remove them itself. The owner's
start is in the name too (clock ticks since boot, `t<ticks>`, which a change of the wall
clock does not move; before 2026-12-04 seconds since the epoch, still understood), so a
recycled pid does not keep a dead run's folder alive, and a live one's is never taken for
a dead one's.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import itertools
import logging
import os
import re
import signal
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil

from pike.evaluate import process_stopper
from pike.evaluate.tree_removal import remove_tree

log = logging.getLogger(__name__)

# cache: a build cache of its own for one measurement (bench/baseline_phase.py)
_KINDS = ("cand", "ref", "ncu", "ray-tasks", "cache")
_NAME = re.compile(r"^pike-(?:" + "|".join(_KINDS) + r")-(\d+)-(t?\d+)-")


@functools.cache
def _owner_tag() -> str:
    started = process_stopper.start_tag(os.getpid())
    if started is None:  # no /proc to read: the start in seconds, as older pikes named it
        started = str(int(psutil.Process().create_time()))
    return f"{os.getpid()}-{started}"


# Free space /dev/shm must have to hold the evaluator's files: input sets and outputs of
# large tasks run to gigabytes, and a full tmpfs fails an honest candidate's writes.
_SHM_FREE_GIB, _SHM_FREE_SHARE = 8.0, 0.25


@functools.cache
def scratch_root() -> Path:
    """Where the evaluator's files go: $PIKE_SCRATCH, else $TMPDIR where set, else
    /dev/shm (memory: writing and reading a KernelBench task's gigabytes of inputs and
    outputs there is several times faster than on disk) when it has room, else the temp
    folder. One answer per process, so a reference's inputs and its candidates' folders
    share a file system (inputs are staged by hard link)."""
    chosen = os.environ.get("PIKE_SCRATCH")
    if chosen:
        return Path(chosen)
    if not os.environ.get("TMPDIR") and _roomy_tmpfs(Path("/dev/shm")):
        return Path("/dev/shm")
    return Path(tempfile.gettempdir())


def _roomy_tmpfs(path: Path) -> bool:
    try:
        stat = os.statvfs(path)
    except OSError:
        return False
    free, size = stat.f_bavail * stat.f_frsize, stat.f_blocks * stat.f_frsize
    return (os.access(path, os.W_OK) and free >= _SHM_FREE_GIB * 2**30
            and free >= _SHM_FREE_SHARE * size)


# Set once pike is ending after a Ctrl-C: its worker threads run on until the exit and
# must not start a child or make a folder that the cleanup has already passed over.
_ENDING = threading.Event()
# Held from the check of _ENDING to the folder (or child) existing, and taken to set it: a
# worker thread that had passed the check could otherwise make its folder after the
# cleanup's last look (seen in CI: a `pike-cand-*` left after an interrupted optimize).
_NEW_WORK = threading.Lock()


def refuse_new_work_if_ending() -> None:
    """Raised in a worker thread that would start new work while pike ends (it unwinds as a
    Ctrl-C does: its child killed at once, nothing recorded)."""
    if _ENDING.is_set():
        raise KeyboardInterrupt("pike is ending")


@contextlib.contextmanager
def new_work() -> Iterator[None]:
    """Start a child or make a folder inside this: either it exists before the cleanup
    looks, or it is refused."""
    with _NEW_WORK:
        refuse_new_work_if_ending()
        yield


def make_temp_dir(kind: str) -> Path:
    """A new temp folder of this process: `pike-<kind>-<pid>-<start time>-<random>`."""
    assert kind in _KINDS
    refuse_new_work_if_ending()
    sweep_orphaned_dirs()
    with new_work():
        return Path(tempfile.mkdtemp(prefix=f"pike-{kind}-{_owner_tag()}-",
                                     dir=scratch_root()))


def _owner_alive(pid: int, started: str) -> bool:
    """Whether the folder's owner runs: its start as written, `t<ticks>` or (older pikes)
    whole seconds since the epoch."""
    if started.startswith("t"):
        return started == process_stopper.start_tag(pid)
    try:
        return int(psutil.Process(pid).create_time()) == int(started)
    except psutil.Error:
        return False


def at_exit_uninterrupted(cleanup: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
    """atexit.register(cleanup, ...), with Ctrl-C ignored from when it begins: removing a
    large task's inputs takes seconds, and a SIGINT then (a time limit's, after pike had
    already stopped on its own) gave a KeyboardInterrupt traceback and left the rest of
    the folders for a later pike's sweep. SIGTERM and SIGKILL still end it."""
    def run() -> None:
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGINT, signal.SIG_IGN)
        cleanup(*args, **kwargs)

    atexit.register(run)


def end_children_and_remove_own_dirs(wait_s: float = 5.0) -> list[str]:
    """For an exit that skips every cleanup (an interrupted optimize, bench or audit: its
    worker threads may be mid-evaluation, so nothing waits for them): refuse new work, end
    this process's children, then remove its temp folders on this host. Left for the next pike to sweep, a large task's inputs
    and outputs would hold gigabytes of /dev/shm, which is memory, until some pike starts
    again. What the killed children's evaluations would have recorded is lost, not
    recorded as crashes: the campaign closed its store before the exception reached the
    CLI."""
    removed: list[str] = []
    # No new child or folder from here on. The lock is held only for a mkdtemp or a fork;
    # the grace period keeps a stuck holder from holding up the exit.
    got = _NEW_WORK.acquire(timeout=wait_s)
    _ENDING.set()
    if got:
        _NEW_WORK.release()
    # At least twice: a killed child's end can show a folder its thread was about to
    # fill. Then again briefly while one is left: a worker thread still writing into a
    # folder (the flag does not stop a write) makes its removal fail with ENOTEMPTY.
    deadline = time.monotonic() + wait_s
    for attempt in itertools.count():
        _kill_children(wait_s)
        removed += _remove_dirs_of(_is_mine)
        if attempt >= 1 and (not _dirs_of(_is_mine) or time.monotonic() > deadline):
            return removed
        time.sleep(0.1 * attempt)


def _kill_children(wait_s: float) -> None:
    children = psutil.Process().children(recursive=True)
    for child in children:
        try:
            child.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(children, timeout=wait_s)


def _is_mine(owner: int, started: str) -> bool:
    return f"{owner}-{started}" == _owner_tag()


def _remove_dirs_of(owned_by: Callable[[int, str], bool]) -> list[str]:
    return [name for root in _roots() for name in _remove_dirs(root, owned_by)]


def _roots() -> list[str]:
    """The folders the evaluator's temp folders are made in: the temp folder and the
    scratch root, once each."""
    return list(dict.fromkeys([tempfile.gettempdir(), str(scratch_root())]))


def _dirs_of(owned_by: Callable[[int, str], bool], folder: str | None = None) -> list[Path]:
    """The pike temp folders in `folder` (or every root) whose owner (pid, start time)
    matches."""
    if folder is None:
        return [path for root in _roots() for path in _dirs_of(owned_by, root)]
    try:
        entries = list(Path(folder).iterdir())
    except OSError:
        return []
    return [path for path in entries
            if (match := _NAME.match(path.name)) and path.is_dir()
            and owned_by(int(match[1]), match[2])]


def _remove_dirs(folder: str, owned_by: Callable[[int, str], bool]) -> list[str]:
    """Remove the pike temp folders in `folder` whose owner (pid, start time) matches."""
    removed = []
    for path in _dirs_of(owned_by, folder):
        if remove_tree(path):  # else logged; the next pike's sweep gets another chance
            removed.append(path.name)
    return removed


@functools.cache
def sweep_orphaned_dirs(folder: str | None = None) -> list[str]:
    """Remove the temp folders of pike processes that are gone (once per process), in
    `folder`, or in the temp folder and the scratch root."""
    if folder is None:
        return [name for root in _roots() for name in sweep_orphaned_dirs(root)]
    removed = _remove_dirs(folder, lambda owner, at: not _owner_alive(owner, at))
    if removed:
        log.info("removed %d temp folders left by pike processes that were killed",
                 len(removed))
    return removed
