"""One device, many evaluations: timing runs alone, other GPU work may share.

Evaluations in several processes (a benchmark with `--jobs`, an evaluation pool) share a
GPU. Correctness trials may overlap each other, but a timed window must see no other
candidate's GPU work, or the speedup measures the neighbours. So trials hold the device's
lock shared and timing holds it exclusive. Plain `flock` lets new shared holders in while
a timer waits, which can starve timing for as long as trials keep arriving; a second
lock, the turnstile, gives the timer priority: whoever wants the device passes through the
turnstile, and a timer keeps it closed while it waits for the shared holders to leave.

The locks are files under the cache dir keyed by the device as this host names it
(CUDA_VISIBLE_DEVICES included), so processes of one user on one host agree. CPU
evaluations are not locked: the host's cores are not one device.

Pausing (`eval.device_lock: pause_others`, the default): a candidate's child is put on
the device's list for its whole life instead of holding the device shared while it loads,
builds and runs its trials, and a timer stops (SIGSTOP) every listed child's process tree
but its own for its window, then lets them go on (SIGCONT). A compile of a minute no
longer keeps every timer waiting for it, and a child can reach no other window with work
started outside its phases (a thread it left running). A reference's child is listed too
while it starts and makes its inputs and expected outputs, and unlisted before it is
timed. What cannot be stopped still holds the device shared: the parent's own GPU work
(comparisons).
A child stopped by a timer that died is let go by its own parent (`resume_unless_timed`);
its phase limits do not count the time it was stopped (sandbox.ChildProcess).
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import re
import signal
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import cast

from pike.evaluate import device_holds, process_stopper
from pike.evaluate.process_stopper import Proc

log = logging.getLogger(__name__)

# After stopping the others, kernels they had queued still run: a moment for them to end
# (the reference's drift check catches what a longer queue leaves in the window).
_SETTLE_S = 0.02


def lock_dir() -> Path:
    base = os.environ.get("PIKE_LOCK_DIR") or Path.home() / ".cache" / "pike" / "locks"
    path = Path(base)
    path.mkdir(parents=True, exist_ok=True)
    return path


def physical_gpu(device: str) -> str:
    """The GPU that `device` ('cuda', 'cuda:N') of this process is: its entry in
    CUDA_VISIBLE_DEVICES (an index or a UUID), or N where that does not say. A child is
    given it as its only GPU (child_launch), its lock files are named by it, and the
    card's processes are read by it (gpu_holders)."""
    index = int(device.partition(":")[2] or 0)
    visible = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    return visible[index] if index < len(visible) else str(index)


def _key(device: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", f"cuda-{physical_gpu(device)}")


def _lock_file(device: str, kind: str) -> Path:
    """The device's `lock`, `turnstile` or `children` (the listed children's folder)."""
    return lock_dir() / f"{_key(device)}.{kind}"


@contextmanager
def _flock(path: Path, mode: int) -> Iterator[None]:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, mode)
        yield
    finally:
        os.close(fd)  # closing releases the lock, also when the holder is killed


@contextmanager
def hold(device: str, *, exclusive: bool,
         keep: Iterable[int] | Callable[[], Iterable[int]] = (),
         purpose: str = device_holds.OTHER) -> Iterator[None]:
    """Hold `device` for trials (shared) or for timing (exclusive); no-op off CUDA. An
    exclusive holder stops the listed children (see `list_child`) but those in `keep` (the
    pids of the children it times) until it lets the device go; a callable `keep` is
    asked once the device is held (a shared window takes whoever joined until then), and
    not at all off CUDA. An exclusive hold goes into the device-holds ledger as `purpose`
    where one is recorded (device_holds.py)."""
    if not device.startswith("cuda"):
        yield
        return
    turnstile, device_lock = _lock_file(device, "turnstile"), _lock_file(device, "lock")
    if exclusive:
        asked = time.time()
        with _flock(turnstile, fcntl.LOCK_EX), _flock(device_lock, fcntl.LOCK_EX):
            held = time.time()
            kept = set(keep() if callable(keep) else keep)
            stopped = _stop_listed(_listed_dir(device), kept)
            stopping_s = time.time() - held
            try:
                yield
            finally:
                _signal_all(stopped, signal.SIGCONT)
                device_holds.note(purpose, device, asked, held, time.time(), len(stopped),
                                  stopping_s)
        return
    with _flock(turnstile, fcntl.LOCK_EX):
        fd = os.open(device_lock, os.O_RDWR | os.O_CREAT, 0o600)
        fcntl.flock(fd, fcntl.LOCK_SH)
    try:
        yield
    finally:
        os.close(fd)


def hold_for_work(device: str, scope: str) -> contextlib.AbstractContextManager[None]:
    """The shared hold around GPU work that is not timing and cannot be stopped (the
    parent's comparisons, a profiler's pass), or nothing where `eval.device_lock` is
    timing_only (to measure what the hold buys)."""
    if scope == "timing_only":
        return contextlib.nullcontext()
    return hold(device, exclusive=False)


def hold_for_build(device: str, scope: str) -> contextlib.AbstractContextManager[None]:
    """What a candidate child's start, load, builds, warm-up and trials hold: the device
    shared where `eval.device_lock` is every_gpu_use; nothing otherwise (pausing stops
    the child for a timer instead, `list_child`)."""
    if scope == "every_gpu_use":
        return hold(device, exclusive=False)
    return contextlib.nullcontext()


def _listed_dir(device: str) -> Path:
    path = _lock_file(device, "children")
    path.mkdir(exist_ok=True)
    return path


def list_child(device: str, pid: int, scope: str) -> bool:
    """Put the child `pid` on `device`'s list, so that timers stop it for their windows,
    where `eval.device_lock` is pause_others (False and nothing otherwise); call it before
    the child begins. Listing waits for no one: a window that began before the entry was
    written did not see it, so a child listed while a timer holds the device stops its
    own tree at once, and its parent lets it go on once no timer holds the device
    (sandbox.ChildProcess._stopped_by_a_timer, as after a timer that died). A window
    that begins after the entry is written stops it as any listed child. (Listing used to
    pass the turnstile, and so waited behind every timer waiting or timing then, with
    16 evaluations on a GPU nearly always one.)"""
    if scope != "pause_others" or not device.startswith("cuda"):
        return False
    folder = _listed_dir(device)
    part = folder / f".{pid}.part"  # whole or absent: a timer reads entries at any time
    part.write_text(_started(pid))
    part.replace(folder / str(pid))
    if timed_now(device):
        _stop_trees([pid])
    return True


def unlist_child(device: str, pid: int) -> None:
    (_listed_dir(device) / str(pid)).unlink(missing_ok=True)


def _started(pid: int) -> str:
    """What a listing entry says of its child's start, which the stopper checks it against
    (process_stopper._same_start): its start in clock ticks since boot, which a change of
    the wall clock does not move (a start since the epoch did: after a clock step of a
    second every entry looked stale, was dropped, and no timer stopped those children)."""
    return process_stopper.start_tag(pid) or "t0"


def _stop_listed(folder: Path, keep: set[int]) -> list[Proc]:
    """SIGSTOP the trees of the listed children but `keep` (process_stopper.py, where the
    walk of the host's processes does not wait on the parent's threads)."""
    return cast(list[Proc], process_stopper.call(
        "stop_listed", folder=str(folder), keep=sorted(keep), settle_s=_SETTLE_S))


def _stop_trees(roots: list[int]) -> list[Proc]:
    """SIGSTOP the process trees under `roots`; the processes stopped."""
    return cast(list[Proc], process_stopper.call("stop_trees", roots=roots))


def _signal_all(procs: list[Proc], sig: int) -> None:
    if procs:
        process_stopper.call("signal_all", procs=procs, sig=int(sig))


def tree_of(pid: int) -> list[Proc]:
    """The process tree under `pid`, itself included (empty when it has ended)."""
    return cast(list[Proc], process_stopper.call("trees", roots=[pid]))


def set_stopped(procs: list[Proc], stop: bool) -> None:
    """SIGSTOP (or SIGCONT) each of `procs` that still is the process it was."""
    _signal_all(procs, signal.SIGSTOP if stop else signal.SIGCONT)


@contextmanager
def _held_unless_timed(device: str) -> Iterator[bool]:
    """Whether `device` is free of timers, holding it shared (without waiting) for the
    `with` block where it is: no timer takes it before the block ends."""
    fd = os.open(_lock_file(device, "lock"), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        os.close(fd)  # lets go of the shared hold too


def timed_now(device: str) -> bool:
    """Whether a timer holds `device` alone at this moment."""
    with _held_unless_timed(device) as free:
        return not free


def stopped(pid: int) -> bool:
    return process_stopper.is_stopped(pid)


def resume_unless_timed(device: str, pid: int) -> bool:
    """For a child's parent that finds it stopped: True while a timer holds the device
    (the stop is the timer's, and its time is not the child's); otherwise the child's
    tree is let go on (its timer died, or it stopped itself on being listed) and False.
    The device is held shared until the tree is let go: a timer that took it between the
    look and the SIGCONT would have stopped the child first, and the SIGCONT would then
    let it run through that timer's window."""
    with _held_unless_timed(device) as free:
        if not free:
            return True
        log.info("child %d found stopped with no timer on %s: letting it go on", pid, device)
        _signal_all(tree_of(pid), signal.SIGCONT)
        return False
