"""The offline strategy: a greedy search over program transformations, no LLM.

Round 1 judges every applicable transformation alone, less the torch.compile modes the
task's baseline ruled out (incorrect, or no build within the limit: `hopeless_modes`) and
those it measured correct but no faster than eager (`known_alone`, session.no_gain_modes:
on a GEMM task each mode is about 0.97x, and its candidate alone held a lane for one to
four minutes to say so again); those stay partners for the later rounds, and are judged
alone only where nothing else was correct alone. Each later round judges the best set
so far plus one more compatible transformation that was correct alone (one that breaks the
tolerance alone, such as fp16 on a deep network, breaks it in company too), and keeps the
fastest if it beats the best by more than the noise margin; partners are tried fastest
alone first, and of the builds no faster than eager only the quickest to build, once
the others' verdicts are in and budget is left, so a short budget reaches the likeliest
sets. It stops when nothing improves or a budget (number of candidates, seconds) is
spent; where nothing improves with budget left, it spends the rest on the no-gain builds
the rounds passed over, with the best set, one at a time. The seconds are those its lanes
ran: wall-clock time less the time its evaluations stood stopped by timing windows
(`paused` in their verdicts) or waited for a device another held alone
(`wait_for_device`), each one's shared among the search's candidates in evaluation beside
it (on average over its time): one window stops them all at once, so two candidates
stopped by it for 3 s stood the search still for 3 s, and a candidate in evaluation alone
stood it still for all of its own stopped time. It is exact where the number in
evaluation stayed the same over each one's time; where it changed (a long build beside
short candidates) it can leave out a few seconds more than the search stood still, since
verdicts carry their stopped seconds, not when they were stopped. Beside three other
tasks on one GPU a 120 s budget was half spent with its candidates stopped. A window
timing one of its own candidates stops its other lanes too, so with several lanes a
search alone on a GPU also runs somewhat past its seconds of wall time. Candidates are
recorded like LLM ones (role 'offline', idea = the transformation set), so reports,
resume and `--seed-offline` work.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import Any

from pike.agents.offline import applicable, compatible, render
from pike.evaluate.verdict import Verdict
from pike.search.base import Judge
from pike.search.drain import due

_IMPROVES = 0.98  # a new set must be 2% faster than the best to count as better
_clock = time.monotonic
# torch.compile modes by what their build costs as a candidate beside other evaluations.
# Of the modes a baseline found no faster than eager, only the first is tried with the
# best set: on the H200 level2 bench (bench-level2-h200-fresh) the tries of all three
# with the best set on 7 GEMM tasks never made a task's best with reduce-overhead or
# max-autotune (4 bests were compile:default's), and max-autotune's took 69 to 186 s,
# the last verdict of 5 of those 7 searches.
_BUILD_ORDER = ("compile:default", "compile:reduce-overhead",
                "compile:max-autotune-no-cudagraphs", "compile:max-autotune")


def _stood(verdict: Verdict) -> float:
    """Seconds an evaluation stood still for others: stopped by their timing windows
    (`paused`), and waiting for the device while they held it alone, to start its child
    or to time it (`wait_for_device`; a baseline's autotuning build and window beside the
    searches on one GPU)."""
    return (verdict.phase_seconds.get("paused", 0.0)
            + verdict.steps.get("wait_for_device", 0.0))


def _build_rank(name: str) -> int:
    return _BUILD_ORDER.index(name) if name in _BUILD_ORDER else len(_BUILD_ORDER)


class _InFlight:
    """How many of a search's candidates were in evaluation together, on average over each
    one's time in it. A window stops every other child at once, so the stopped seconds of
    candidates in evaluation together overlap: each one's, divided by this, adds up to the
    time the search stood still. Called from the search's thread only."""

    def __init__(self) -> None:
        self._count, self._area, self._last = 0, 0.0, _clock()
        self._began: dict[int, tuple[float, float]] = {}

    def _now(self) -> float:
        now = _clock()
        self._area += self._count * (now - self._last)
        self._last = now
        return now

    def start(self, key: int) -> None:
        now = self._now()
        self._count += 1
        self._began[key] = (now, self._area)

    def end(self, key: int) -> float:
        now = self._now()
        began, area = self._began.pop(key)
        self._count -= 1
        return max(1.0, (self._area - area) / (now - began)) if now > began else 1.0


class OfflineSearch:
    def __init__(self, store: Any, task_name: str, task_source: str, device: str,
                 judge: Judge, max_candidates: int, max_seconds: float, batch: int = 1,
                 on_event: Callable[..., None] = lambda kind, **data: None,
                 compile_speedups: dict[str, float] | None = None,
                 skip: dict[str, str] | None = None,
                 known_alone: dict[str, float] | None = None,
                 build_seconds: dict[str, float] | None = None) -> None:
        self.store, self.task, self.task_source = store, task_name, task_source
        self.compile_speedups = compile_speedups
        self.skip = skip or {}  # transformations not worth a candidate here, with why
        # transformations whose speedup alone the baseline measured: partners, not candidates
        self.known_alone = known_alone or {}
        # each compile mode's build in the task's baseline: how long a candidate of it holds
        # its lane before anything else (a guess for the budget left, not a limit)
        self.build_seconds = build_seconds or {}
        self.device, self.judge = device, judge
        self.max_candidates, self.max_seconds = max_candidates, max_seconds
        self.batch = max(1, batch)  # in evaluation at once (the pool's width)
        self.on_event = on_event
        self._started = _clock()
        self._stopped = 0.0  # seconds the search stood stopped by other timers
        self._in_flight = _InFlight()
        # a resumed search has the budget that is left, not a new one
        self._made = sum(1 for r in store.candidates(task_name) if r.role == "offline")
        spent = store.get_state(task_name, "offline_seconds") or 0.0
        self._started -= float(spent)

    def run(self) -> None:
        names = applicable(self.task_source, self.device, self.compile_speedups)
        skipped = {n: why for n, why in self.skip.items() if n in names}
        if skipped:
            self.on_event("skipped", skipped=skipped)
        names = [n for n in names if n not in skipped]
        # a mode judged alone before (a search resumed from an older pike) keeps its verdict
        judged = {r.idea: r.verdict for r in self.store.candidates(self.task)
                  if r.role == "offline" and r.verdict is not None}
        known = {n: s for n, s in self.known_alone.items() if n in names and n not in judged}
        if known:
            self.on_event("known_alone", known=known)
        alone = [n for n in names if n not in known]
        self.on_event("round", round=0, branches=len(alone))
        results = self._try([(n,) for n in alone], 0)
        best = self._fastest(results)
        if best is None and known:  # nothing else correct alone: the modes' own verdicts
            self.on_event("round", round=0, branches=len(known))
            results.update(self._try([(n,) for n in known], 0, first_branch=len(alone)))
            best, known = self._fastest(results), {}
        best_speedup = self._speedup(results[best]) if best is not None else 0.0
        speedups = {**known, **{s[0]: self._speedup(v) for s, v in results.items()}}
        names = sorted((n for n in names if speedups.get(n, 0.0) > 0),
                       key=lambda n: -speedups[n])  # fastest alone first; ties as listed
        round_ = 1
        while best is not None and self._room():
            self.on_event("round", round=round_, branches=len(names))
            partners = [n for n in names if n not in best and compatible((*best, n))]
            if not partners:
                return
            sets = {n: tuple(sorted((*best, n))) for n in partners}
            tries = [sets[n] for n in partners if n not in known]
            found = self._try(tries, round_)
            # A build no faster than eager alone starts once the cheap partners' verdicts
            # are in, and only with budget left: started beside them, it held its lane (and
            # the search's end) for minutes where a short budget was already spent. Only
            # the quickest to build of them is tried.
            later = sorted((n for n in partners if n in known), key=_build_rank)
            if later and self._room():
                found.update(self._try([sets[later[0]]], round_, first_branch=len(tries)))
            results = {s: v for s, v in found.items() if v is not None}
            challenger = self._fastest(results)
            speedup = self._speedup(results[challenger]) if challenger is not None else 0.0
            if challenger is None or speedup * _IMPROVES < best_speedup:
                self._spend_the_rest([(n, sets[n]) for n in later[1:]], round_,
                                     first_branch=len(tries) + 1)
                return
            best, best_speedup, round_ = challenger, speedup, round_ + 1

    def _spend_the_rest(self, sets: list[tuple[str, tuple[str, ...]]], round_: int,
                        first_branch: int) -> None:
        """Where the greedy path ends with budget left, the builds it passed over (the
        slower no-gain modes with the best set), quickest to build first and one at a time,
        so none starts once the budget is spent, nor where the mode's build in the baseline
        took longer than the budget left (max-autotune's took 69 to 186 s as a candidate):
        on the H200 level2 bench a GEMM task's search ended at 7 candidates with 8 of its
        120 s unspent."""
        for branch, (mode, names) in enumerate(sets, first_branch):
            if not self._room():
                return
            if self.build_seconds.get(mode, 0.0) > self.max_seconds - self._spent():
                continue
            self._try([names], round_, first_branch=branch)

    def _room(self) -> bool:
        return (self._made < self.max_candidates
                and self._spent() < self.max_seconds and not due())

    def _spent(self) -> float:
        return _clock() - self._started - self._stopped

    def _try(self, sets: list[tuple[str, ...]], round_: int, first_branch: int = 0
             ) -> dict[tuple[str, ...], Verdict | None]:
        """Verdicts of these transformation sets (None: no budget left for it), `batch` in
        evaluation at a time: each one that ends makes room for the next, so a quick
        candidate never waits for a slow compile beside it. Sets judged before (a resumed
        search) are not judged again; the store is written from this thread only."""
        results: dict[tuple[str, ...], Verdict | None] = dict.fromkeys(sets)
        known = {r.idea: r for r in self.store.candidates(self.task) if r.role == "offline"}
        waiting = deque(enumerate(sets, first_branch))
        running: dict[Future[Verdict], tuple[tuple[str, ...], int]] = {}
        # one at a time: in this thread, as a search without a pool does (plain tracebacks)
        lanes = (ThreadPoolExecutor(self.batch, thread_name_prefix="pike-offline")
                 if self.batch > 1 else None)

        def submit(source: str) -> Future[Verdict]:
            if lanes is not None:
                return lanes.submit(self._judge_one, source)
            done: Future[Verdict] = Future()
            done.set_result(self._judge_one(source))
            return done

        try:
            while waiting or running:
                while waiting and len(running) < self.batch:
                    branch, names = waiting.popleft()
                    cid = self._candidate(names, round_, branch, known)
                    if cid is None:
                        continue
                    row = self.store.candidate(cid)
                    if row.verdict is not None:
                        results[names] = row.verdict
                        continue
                    self._in_flight.start(cid)
                    running[submit(row.source)] = (names, cid)
                if not running:
                    break
                finished, _ = wait(running, return_when=FIRST_COMPLETED)
                for future in finished:
                    names, cid = running.pop(future)
                    beside = self._in_flight.end(cid)
                    self._record(cid, future.result(), beside)
                    results[names] = self.store.candidate(cid).verdict
        finally:  # an error or Ctrl-C: what has not started is dropped
            if lanes is not None:
                lanes.shutdown(wait=False, cancel_futures=True)
        return results

    def _candidate(self, names: tuple[str, ...], round_: int, branch: int,
                   known: dict[str, Any]) -> int | None:
        """The candidate of this set: recorded before, new while there is budget, or None."""
        idea = " + ".join(names)
        if idea in known:
            return int(known[idea].id)
        if not self._room():
            return None
        self._made += 1
        return int(self.store.add_candidate(
            self.task, render(self.task_source, names), parent_id=None,
            role="offline", round=round_, branch=branch, idea=idea))

    def _judge_one(self, source: str) -> Verdict:
        for _, verdict in self.judge([source]):
            return verdict
        raise AssertionError("the judge gave no verdict")  # pragma: no cover

    def _record(self, cid: int, verdict: Verdict, beside: float) -> None:
        self.store.set_verdict(cid, verdict)
        self._stopped += _stood(verdict) / beside
        self.store.set_state(self.task, "offline_seconds", self._spent())
        self.on_event("verdict", candidate=cid, verdict=verdict)

    @staticmethod
    def _speedup(verdict: Verdict | None) -> float:
        # Speedups are ratios taken in one window with the reference, so they compare
        # across evaluations on a drifting host better than absolute runtimes do.
        if verdict is None or not verdict.ok:
            return 0.0
        return verdict.speedup or 0.0

    def _fastest(self, results: dict[tuple[str, ...], Verdict | None]) -> tuple[str, ...] | None:
        ok = {s: self._speedup(v) for s, v in results.items() if self._speedup(v) > 0}
        return max(ok, key=lambda s: ok[s]) if ok else None
