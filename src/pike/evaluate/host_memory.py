"""Room on the host for one more evaluation child: start it only where its memory fits.

The pool and a benchmark's `--jobs` count children, not bytes. On KernelBench level1 a
child of one task holds gigabytes of the host's memory (its inputs are drawn there, and
the CUDA context and pinned staging take more), so `pike bench --jobs 4 --workers 3` on
one H200 host of 125 GiB had the kernel's out-of-memory killer take references and
baseline builds again and again: a task failed when its reference was killed twice, and
baselines were stored as failed (bench-level1-h200-partial). What the killer takes is
chosen well (children before pike, `oom_killer.child_oom_score`), but a killed evaluation is
time lost and may end a task.

So a child waits, before it begins loading (after its imports, which every child needs),
until the host's available memory, less what the children already begun are still
expected to take, covers what a child of its task took before plus a headroom. What a
task's child takes is learned from its own children: the most any of them held when pike
measured it, its tree's RSS (`ChildProcess.peak_rss`) and its files in a scratch in
memory (`peak_files`, held_files: a reference's inputs and trials' expected outputs,
28 GiB on a level1 task of 4 GiB outputs), the reference's first, which every task
begins with. A task nobody has measured yet is expected to take what the largest one
measured took, and so is a task whose children in a role are all still loading (what
they hold so far is no measure); a task's first candidates at least what its reference
took. Where a new task's reference child answered the "size" event (task_size.py: its
inputs, outputs and weights found on the meta device), its reference is expected at its
structural bytes plus the most any measured task's reference took beyond its own: on
the H100's level1 bench a 10 GiB task's reference was otherwise expected at 50.9 GiB.

Nothing waits where no other child is begun (there is nothing to wait for). A new task's
reference (no child of its task begun in this process yet) waits up to `_NEW_TASK_WAIT_S`
while other tasks run, since they end and give their memory back; and a task not yet
measured does not begin while another such task's reference still loads, so each
footprint is measured before the next is guessed (on that level1 bench four references
began at once and took the host), unless its size is known from its answer. A resumed
bench recalls each task's size from its run store (`remember`, campaign's
`host_footprint`). Any other child
waits at most `_LONGEST_WAIT_S`: a kept reference holds its memory for its task's whole
search, and a host too small for the reference and one candidate must still make
progress, as it did before (the killer remains the last word there).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Protocol

import psutil

from pike.evaluate.leftovers import refuse_new_work_if_ending

log = logging.getLogger(__name__)

_GIB = 2**30
_POLL_S = 0.25
_LONGEST_WAIT_S = 300.0
_NEW_TASK_WAIT_S = 3600.0


class Measured(Protocol):
    """What the gate reads of a child (sandbox.ChildProcess has it)."""

    @property
    def last_rss_bytes(self) -> int | None: ...

    @property
    def peak_rss(self) -> int: ...

    @property
    def last_files_bytes(self) -> int: ...

    @property
    def peak_files(self) -> int: ...

    @property
    def phase(self) -> str: ...

    @property
    def phase_seconds(self) -> dict[str, float]: ...

    def ended(self) -> bool: ...


def _available() -> int:
    return int(psutil.virtual_memory().available)


def default_headroom() -> int:
    """What stays free for pike itself, the page cache and the unmeasured: 5% of the
    host's memory, at least 2 GiB."""
    return max(2 * _GIB, psutil.virtual_memory().total // 20)


# Phases in which a child may not yet hold what its task's children take: it loads its
# inputs and model and runs its checks (a reference writes its expected outputs there, a
# candidate its trials'); past them it is counted at its own peak. Not a baseline's
# `build`: its reference has loaded, and its expected outputs, no longer in its folder,
# would be expected again.
# A candidate is `queued` between its warm-up and its trials: its trials' outputs are
# still to come.
LOADING = ("setup", "load", "init", "queued", "check")
_BEFORE_CHECK = ("setup", "load", "init", "queued")


def _reached_check(child: Measured) -> bool:
    """It began its checks (the trials, where a child writes its outputs), whatever phase
    it is in now (`finish` puts every child in cleanup)."""
    return bool({child.phase, *child.phase_seconds} - {*_BEFORE_CHECK, "cleanup"})


def _holds(child: Measured) -> int:
    return (child.last_rss_bytes or 0) + child.last_files_bytes


def _most(child: Measured) -> int:
    return child.peak_rss + child.peak_files


class HostMemory:
    """The children begun in this process and what each task's children take, by role
    (a reference's baseline builds take more than its search-time child; candidates
    differ from references)."""

    def __init__(self, available: Callable[[], int] = _available,
                 headroom: int | None = None, longest_wait_s: float = _LONGEST_WAIT_S,
                 sleep: Callable[[float], None] = time.sleep,
                 new_task_wait_s: float = _NEW_TASK_WAIT_S) -> None:
        self._available, self._sleep = available, sleep
        self._headroom = headroom
        self.longest_wait_s, self.new_task_wait_s = longest_wait_s, new_task_wait_s
        self._lock = threading.Lock()
        self._begun: dict[int, tuple[Measured, str, str]] = {}  # id -> child, task, role
        self._peak: dict[tuple[str, str], int] = {}  # (task, role) -> the most one took
        self._measured: set[tuple[str, str]] = set()  # (task, role): see _settled
        self._started: set[str] = set()  # tasks a child of which has begun here
        # task -> its reference's structural bytes (task_size), or None: asked, no answer
        self._structural: dict[str, int | None] = {}
        self._reclaimers: list[Callable[[], bool]] = []

    def reclaim_with(self, free_one: Callable[[], bool]) -> None:
        """`free_one` ends one child pike keeps only for later (an idle cached reference)
        and says whether it did; a child waiting for room calls it before each longer
        wait, so a kept child never holds a waiting one off for the gate's whole wait."""
        self._reclaimers.append(free_one)

    @property
    def headroom(self) -> int:
        if self._headroom is None:
            self._headroom = default_headroom()
        return self._headroom

    def expected(self, task: str, role: str = "candidate") -> int:
        """What a child of `task` in `role` is expected to take: the most one of its
        children in that role took, once one has been measured past loading; until then
        at least the most any child in that role took, and for a candidate what its
        task's reference took (it reads the same inputs and writes outputs as large).
        A child still loading has not shown its size: on the H100's level1 bench task
        7's candidates, last measured at 0.6 GiB, were taken by the host's out-of-memory
        killer (4 GiB outputs a trial, through files), a wave begun together."""
        own = self._own(task, role)
        if self._settled(task, role):
            return own
        if role == "candidate" and self._settled(task, "reference"):
            # not the largest any task's candidates took: a small task's first wave would
            # wait behind a large task's size
            return max(own, self._own(task, "reference"))
        if role == "reference" and (estimate := self._estimate(task)) is not None:
            return max(own, estimate)
        anyone = [*(v for (_, r), v in self._peak.items() if r == role),
                  *(_most(c) for c, _, r in self._begun.values() if r == role)]
        return max([own, *anyone])

    def _estimate(self, task: str) -> int | None:
        """`task`'s reference from its structural bytes, plus the most a measured task's
        reference took beyond its own (the host's part: torch, the CUDA context, compile
        workers); None where either is unknown. A host's part of 0 or less is no measure
        of it (structural bytes counted that a task did not hold, weights built on the
        GPU): until one task took more than its own, new tasks are guessed as before."""
        structural = self._structural.get(task)
        if structural is None:
            return None
        beyond = max((self._own(t, "reference") - n for t, n in self._structural.items()
                      if t != task and n is not None and self._settled(t, "reference")),
                     default=0)
        return structural + beyond if beyond > 0 else None

    def begun(self, child: Measured) -> bool:
        """`child` has been admitted (and not released)."""
        with self._lock:
            return id(child) in self._begun

    def wants_size(self, task: str) -> bool:
        """Whether to ask a reference's child of `task` its size (ask_size) before it is
        admitted: once per task. One already measured is asked too (a resumed run's
        task whose store kept no size): its size beside its measure is what the host's
        part is learned from."""
        with self._lock:
            return task not in self._structural

    def sized(self, task: str, structural: int | None) -> None:
        """`task`'s reference holds `structural` bytes of its task's own (task_size), or
        None: it was asked and gave no size (it is not asked again)."""
        with self._lock:
            self._structural[task] = structural

    def structural(self, task: str) -> int | None:
        with self._lock:
            return self._structural.get(task)

    def _settled(self, task: str, role: str) -> bool:
        """A child of `task` in `role` has been measured past its loading: begun and out of
        the loading phases, or released after its setup, load and init (one that failed
        there, an import error, says nothing of what the task's children take), or
        recalled from a resumed run's store."""
        return (task, role) in self._measured or any(
            (t, r) == (task, role) and c.phase not in LOADING
            for c, t, r in self._begun.values())

    def _coming(self, child: Measured, task: str, role: str) -> int:
        """What a begun child is still expected to take: its task's expectation while it
        loads, at most its own peak once past loading (a kept reference, idle, takes no
        more than it has held)."""
        if child.phase in LOADING:
            return max(0, self.expected(task, role) - _holds(child))
        # past loading its files grow no more (a reference's expected outputs are mapped
        # by pike then, and unlinked: held, though no folder shows them)
        return max(0, child.peak_rss - (child.last_rss_bytes or 0))

    def _new_task(self, task: str) -> bool:
        """No child of `task` has begun in this process: a task a bench has yet to start
        (one whose kept reference was closed goes on as before, at the gate's usual
        wait; one whose size a resumed run recalled is new all the same)."""
        return task not in self._started

    def measured(self, task: str, role: str) -> int | None:
        """What `task`'s children in `role` took at most, as measured (or recalled); None
        where none has been: what `expected` would guess from other tasks is no measure."""
        with self._lock:  # (a campaign's thread asks while others' children begin)
            return self._own(task, role) or None

    def room_for(self, task: str, count: int) -> int:
        """How many of `count` candidate children of `task` the host has room for now
        beside one reference of it, by what its own children took (measured or
        recalled), at least one; `count` where its candidates were never measured: a
        guess from other tasks is no reason to leave one out."""
        with self._lock:
            each = self._own(task, "candidate")
            if count <= 1 or not each:
                return count
            coming = sum(self._coming(c, t, r) for c, t, r in self._begun.values())
            free = (self._available() - coming - self.headroom
                    - self._own(task, "reference"))
        return max(1, min(count, free // each))

    def _own(self, task: str, role: str) -> int:
        """The most `task`'s children in `role` took, released or begun (0: none measured)."""
        own = [_most(c) for c, t, r in self._begun.values() if (t, r) == (task, role)]
        return max([self._peak.get((task, role), 0), *own])

    def remember(self, task: str, role: str, taken: int) -> None:
        """A size measured before (a resumed run's store): `task`'s children in `role` are
        expected to take it from their first, not the largest any other task took."""
        with self._lock:
            self._peak[(task, role)] = max(self._peak.get((task, role), 0), taken)
            self._measured.add((task, role))

    def _fits(self, task: str, role: str) -> bool:
        if not self._begun:
            return True
        if role == "reference" and not self._settled(task, role) and \
                self._estimate(task) is None and any(
                r == role and t != task and not self._settled(t, r) and c.phase in LOADING
                for c, t, r in self._begun.values()):
            return False  # another new footprint is being measured: guess from it after
        coming = sum(self._coming(c, t, r) for c, t, r in self._begun.values())
        return self._available() - coming >= self.expected(task, role) + self.headroom

    def admit(self, child: Measured, task: str, role: str = "candidate",
              limit_s: float | None = None) -> float:
        """Wait until the host has room for `child` of `task` in `role` (at most
        `limit_s`; by default the gate's longest wait, or for a new task's reference its
        longer one; 0 counts it at once), then count it as begun; the seconds waited. Call
        `release` when it has ended."""
        limit = self.longest_wait_s if limit_s is None else limit_s
        if limit_s is None and role == "reference":
            with self._lock:
                if self._new_task(task):
                    limit = self.new_task_wait_s
        started = time.monotonic()
        said = False
        while True:
            refuse_new_work_if_ending()  # pike's exit: the child is killed, not begun
            with self._lock:
                if id(child) in self._begun:
                    return 0.0
                waited = time.monotonic() - started
                # a child the killer took meanwhile begins at once: its crash is reported
                if self._fits(task, role) or waited >= limit or child.ended():
                    if said and waited >= limit:
                        log.warning("a child started after %.0f s without the host memory "
                                    "it is expected to take (%.1f GiB)", waited,
                                    self.expected(task, role) / _GIB)
                    self._begun[id(child)] = (child, task, role)
                    self._started.add(task)
                    return waited if said else 0.0
                if not said:
                    log.info("a child waits for host memory: %.1f GiB expected, "
                             "%.1f GiB available%s", self.expected(task, role) / _GIB,
                             self._available() / _GIB,
                             ", a new task's reference (it waits for the running ones)"
                             if limit > self.longest_wait_s else "")
                    said = True
            if not any(free_one() for free_one in list(self._reclaimers)):
                self._sleep(_POLL_S)

    def release(self, child: Measured) -> None:
        """`child` has ended: what it took is kept for its task's next children."""
        with self._lock:
            entry = self._begun.pop(id(child), None)
            if entry is not None and _most(child):
                key = (entry[1], entry[2])
                self._peak[key] = max(self._peak.get(key, 0), _most(child))
                if _reached_check(child):
                    self._measured.add(key)


HOST = HostMemory()  # one per process: every evaluation thread's children share the host
