"""Candidates of one task that wait for the device at once share one timing window.

A candidate is timed in blocks alternating with its task's reference (eager), with the
device to themselves while every other evaluation is stopped (device_lock.py). On an
H200 level2 bench with four evaluations per task those windows stopped the evaluations
for 44% of their time, and the candidates waiting for a window waited most often behind
another candidate of their own task. Candidates of one reference that wait at the same
moment are therefore timed in one window: eager once, the candidates in the same ABBA
rounds beside it (k + 1 timers' blocks where k windows of their own take 2k). Each
verdict is still its own timer against eager's, as in a window of its own; a failure or
a give-up ends only that candidate's timing (timing_window.time_interleaved's `each`). The
window's first candidate leads it: it waits for the device, and whoever joined by the
time it has it is timed with it (at most `eval.timing.share_window`).

What it trusts: the candidates in one window take turns, and each one's process tree is
stopped (SIGSTOP, as a timer stops every other evaluation) while eager and the others
are timed, so its threads cannot reach their blocks. Kernels it queued before its stop
can, as in a window of its own they can reach eager's (the reference's drift check
looks at eager's; another candidate's blocks stretched this way make it look slower,
and may have it cut short by the give-up rules, but never make the one that queued them
faster; a settling pause after each stop, as a timer's, would cost a second a window).
Whatever a candidate's answer makes the leader's thread raise is that candidate's
failure (timing_window._time_own_block), so no candidate can end the others' window. Each
window's eager carries the reference's usual time as the window began, so the first
candidate to keep eager's median does not move the drift check of the others. The trees
are taken when the window begins; a process started later is not stopped until the next
window. Windows timed again (a reference off its usual time, blocks their calls do not
account for) are each alone.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from pike.config import EvalConfig
from pike.evaluate import device_holds
from pike.evaluate.cores import timing_cores
from pike.evaluate.device_lock import hold, set_stopped, tree_of
from pike.evaluate.process_stopper import Proc
from pike.evaluate.sandbox import ChildProcess
from pike.evaluate.steps import current as current_steps
from pike.evaluate.timing_window import Timer, add_timing_steps, time_interleaved

if TYPE_CHECKING:
    from pike.evaluate.reference import ReferenceRun


@dataclass
class _Seat:
    child: ChildProcess
    timer: Timer | None = None  # set once the window has timed it


@dataclass
class _Window:
    seats: list[_Seat] = field(default_factory=list)
    closed: bool = False
    done: threading.Event = field(default_factory=threading.Event)
    began: float = 0.0
    ended: float = 0.0
    eager: Timer | None = None


class WindowQueue:
    """The candidates of one reference waiting for a window: one open group at a time,
    closed when its leader has the device."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._open: _Window | None = None

    def join(self, child: ChildProcess, most: int) -> tuple[_Window, _Seat, bool]:
        """A seat in the open window (or a new one, which the caller leads): (window,
        seat, whether the caller leads it)."""
        with self._lock:
            window = self._open
            leads = window is None or window.closed or len(window.seats) >= most
            if leads:
                window = self._open = _Window()
            assert window is not None
            seat = _Seat(child)
            window.seats.append(seat)
            return window, seat, leads

    def close(self, window: _Window) -> list[_Seat]:
        """No one joins `window` from now on; its seats."""
        with self._lock:
            window.closed = True
            if self._open is window:
                self._open = None
            return list(window.seats)


def timed_together(reference: ReferenceRun, child: ChildProcess, device: str,
                   cfg: EvalConfig, best: Callable[[], float | None] | None,
                   pid_of: Callable[[ChildProcess | None], int | None]) -> list[Timer] | None:
    """[eager, the candidate's timer] from a window shared with the candidates of
    `reference` waiting with it; None where the window's leader failed before timing it
    (the caller times it alone). Records the evaluation's steps as a window of its own
    does: `wait_for_device` until the window began, `timing` for the whole window, and
    `timing.calls` and `timing.blocks` of its own blocks and its share of eager's."""
    child.permit("timing")
    window, seat, leads = reference.windows.join(child, cfg.timing.share_window)
    joined = time.perf_counter()
    if leads:
        try:
            _lead(window, reference, device, cfg, best, pid_of)
        finally:  # also where it failed: those who joined are then timed alone
            reference.windows.close(window)
            window.done.set()
    else:
        window.done.wait()
    steps = current_steps()
    if seat.timer is None or window.eager is None:
        steps.add("wait_for_device", time.perf_counter() - joined)
        return None
    steps.add("wait_for_device", max(0.0, window.began - joined))
    steps.add("timing", window.ended - window.began)
    share = len([s for s in window.seats if s.timer is not None])
    add_timing_steps(steps, [(seat.timer, 1.0), (window.eager, 1.0 / share)])
    return [window.eager, seat.timer]


def _lead(window: _Window, reference: ReferenceRun, device: str, cfg: EvalConfig,
          best: Callable[[], float | None] | None,
          pid_of: Callable[[ChildProcess | None], int | None]) -> None:
    seats: list[_Seat] = []

    def seated() -> list[int]:
        return [pid_of(s.child) or -1 for s in seats]

    def close() -> list[int]:  # asked once the device is held: whoever joined by then
        seats.extend(reference.windows.close(window))
        return seated()

    with ExitStack() as alone:
        alone.enter_context(hold(device, exclusive=True, keep=close,
                                 purpose=device_holds.CANDIDATE_WINDOW))
        alone.enter_context(reference.talking)
        if not seats:  # off CUDA nothing is held: whoever joined while eager was busy
            close()
        assert reference.child is not None
        window.began = time.perf_counter()
        eager = Timer(reference.child, "eager", usual_ms=reference.usual_ms())
        candidates = [Timer(s.child, "candidate", shared_by=len(seats)) for s in seats]
        timers = [eager, *candidates]
        turns = _Turns(candidates, pid_of) if len(candidates) > 1 else None
        with timing_cores([pid_of(t.child) for t in timers], device, cfg.timing_cores):
            try:
                time_interleaved(timers, cfg.timing, give_up=device.startswith("cuda"),
                                 best=best, each=True, before_block=turns)
            finally:
                if turns is not None:
                    turns.release()
        reference.child.enter_phase("idle")
        window.ended = time.perf_counter()
        if cfg.guards:  # the wall-clock check's figure, while the device is held
            reference.calibrate_in_window(eager, seated())
    window.eager = eager
    for seat, timer in zip(seats, candidates, strict=True):
        seat.timer = timer


class _Turns:
    """Before each block, every candidate's process tree but the timed one's stopped."""

    def __init__(self, candidates: list[Timer],
                 pid_of: Callable[[ChildProcess | None], int | None]) -> None:
        self._trees: dict[int, list[Proc]] = {}
        for timer in candidates:
            pid = pid_of(timer.child)
            self._trees[id(timer.child)] = tree_of(pid) if pid is not None else []
        self._stopped: set[int] = set()

    def __call__(self, timer: Timer) -> None:
        for key, procs in self._trees.items():
            stop = key != id(timer.child)
            if stop != (key in self._stopped):
                set_stopped(procs, stop)
                (self._stopped.add if stop else self._stopped.discard)(key)

    def release(self) -> None:
        for key in list(self._stopped):
            set_stopped(self._trees[key], False)
        self._stopped.clear()
