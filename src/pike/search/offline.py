"""The offline strategy: a greedy search over program transformations, no LLM.

Round 1 judges every applicable transformation alone, less the torch.compile modes the
task's baseline ruled out (incorrect, or no build within the limit: `hopeless_modes`) and
those it measured correct but no faster than eager (`known_alone`, baseline_modes.no_gain_modes:
on a GEMM task each mode is about 0.97x, and its candidate alone held a lane for one to
four minutes to say so again); those stay partners for the later rounds, and are judged
alone only where nothing else was correct alone. Each later round judges the best set
so far plus one more compatible transformation that was correct alone (one that breaks the
tolerance alone, such as fp16 on a deep network, breaks it in company too), and keeps the
fastest if it beats the best by more than the noise margin; partners are tried fastest
alone first, and of the builds no faster than eager only the quickest to build, once
the others' verdicts are in and budget is left, so a short budget reaches the likeliest
sets. Lanes a round leaves free while its last candidates run take the next round as
its verdicts so far make it (`_try`'s `ahead`), where the candidate count leaves room
for the round that comes after them. It stops when nothing improves or a budget (number
of candidates, seconds) is spent; where nothing improves with budget left, it spends the
rest on the no-gain builds the rounds passed over, with the best set, side by side. The
seconds are those its lanes ran: wall-clock time less the time its evaluations stood
stopped by timing windows (`paused` in their verdicts), waited for a device another held
alone (`wait_for_device`), for host memory (`wait_for_memory`: mostly other tasks'
children; a wide search of a large task can also wait for its own, and then runs past
its seconds) or for the task's reference run (`reference`), each one's shared among the
search's candidates in evaluation beside it (on average over its time): one window stops them all at once, so two candidates
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
from functools import partial
from typing import Any

from pike.agents.offline import applicable, compatible, render
from pike.evaluate import search_bar
from pike.evaluate.pool import POOL_STEPS
from pike.evaluate.verdict import Verdict
from pike.search.base import Judge
from pike.search.drain import due
from pike.task import source_sha256

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
    (`wait_to_list`) or to time it (`wait_for_device`; a baseline's autotuning build and
    window beside the searches on one GPU), waiting for host memory other children held
    (`wait_for_memory`), and waiting for the task's reference run (`reference`: made once
    per task, as its baselines are, and near zero where a live one is kept; on the H200
    level2 bench the first four candidates of tasks resumed beside seven others each
    waited 100 s for it, and two searches ended after 4 and 5 candidates). Also the pool's
    own: held back behind another candidate's second try given room (`wait_in_pool`), and
    a first try that ran out of GPU memory beside others (`crowded_try`): on the H200
    level2 bench (bench-level2-h200-auto) the four searches that judged 8 or fewer spent a
    median 34 to 84 s a candidate outside its verdict's own time (0 s in the other 16),
    and their budgets counted it."""
    return (verdict.phase_seconds.get("paused", 0.0)
            + sum(verdict.steps.get(step, 0.0) for step in _STOOD_STEPS))


_STOOD_STEPS = ("wait_to_list", "wait_for_device", "wait_for_memory", "reference",
                *POOL_STEPS)


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

    def elapsed(self) -> float:
        """Seconds the evaluations in flight have been in it so far, added up: the most
        their verdicts' stopped time can take off the search's spent seconds."""
        now = _clock()
        return sum(now - began for began, _ in self._began.values())


def _as_partner(verdict: Verdict | None) -> float:
    """A set's speedup for ordering the partners of the best: as the search ranks, and
    also where the set's window ended because it was far behind the best (its figure from
    a few rounds, behind_best): correct alone, it may still help in company (tf32 behind
    fp16 alone, and fp16 + tf32 the best of a GEMM task)."""
    return (verdict.speedup or 0.0) if verdict is not None and verdict.comparable else 0.0


class OfflineSearch:
    def __init__(self, store: Any, task_name: str, task_source: str, device: str,
                 judge: Judge, max_candidates: int, max_seconds: float, batch: int = 1,
                 on_event: Callable[..., None] = lambda kind, **data: None,
                 compile_speedups: dict[str, float] | None = None,
                 skip: dict[str, str] | None = None,
                 known_alone: dict[str, float] | None = None,
                 build_seconds: dict[str, float] | None = None, bar_rank: int = 1,
                 spent: Callable[[], None] = lambda: None) -> None:
        self.store, self.task, self.task_source = store, task_name, task_source
        # called once, when the budget (seconds or candidates) first leaves no room for
        # another candidate: a campaign's next task can start searching beside this one's
        # last candidates instead of after them
        self._spent_said, self._say_spent = False, spent
        # the evaluator's bar is this best figure so far (search.confirm_top: what the
        # confirming window always times again is timed in full; search_bar.py)
        self.bar_rank = bar_rank
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
        made = [r for r in store.candidates(task_name) if r.role == "offline"]
        self._made = len(made)
        self._ideas = {r.idea: int(r.id) for r in made}  # each set's candidate
        self._running: dict[Future[Verdict], int] = {}  # in evaluation: candidate ids
        self._lanes: ThreadPoolExecutor | None = None
        spent = store.get_state(task_name, "offline_seconds") or 0.0
        self._started -= float(spent)
        self._bar_key = source_sha256(task_source)

    def run(self) -> None:
        # Its bar, for the evaluator: a candidate far behind it gets a few rounds of a
        # timing window, not all of them (search_bar.py); a resumed search's figures count.
        judged = [r.verdict for r in self.store.candidates(self.task)
                  if r.role == "offline" and r.verdict is not None]
        try:
            with search_bar.held(self._bar_key, map(self._speedup, judged), self.bar_rank):
                self._search()
                self._finish_ahead()
        finally:  # an error or Ctrl-C: what has not started is dropped
            if self._lanes is not None:
                self._lanes.shutdown(wait=False, cancel_futures=True)

    def _search(self) -> None:
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

        def pairs_with_the_fastest_so_far(found: dict[tuple[str, ...], Verdict | None]
                                          ) -> list[tuple[str, ...]]:
            lead = self._fastest(found)
            ok = {s[0]: _as_partner(v) for s, v in found.items() if _as_partner(v) > 0}
            order = sorted(ok, key=lambda n: -ok[n])
            return self._next_sets(lead, order, known) if lead is not None else []

        results = self._try([(n,) for n in alone], 0, ahead=pairs_with_the_fastest_so_far)
        best = self._fastest(results)
        if best is None and known:  # nothing else correct alone: the modes' own verdicts
            self.on_event("round", round=0, branches=len(known))
            results.update(self._try([(n,) for n in known], 0, first_branch=len(alone)))
            best, known = self._fastest(results), {}
        best_speedup = self._speedup(results[best]) if best is not None else 0.0
        # a candidate cut short behind the best is still a partner, in its place
        speedups = {**known, **{s[0]: _as_partner(v) for s, v in results.items()}}
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

            if_it_improves = partial(self._next_if_it_improves, bar=best_speedup,
                                     names=names, known=known)
            found = self._try(tries, round_, ahead=if_it_improves)
            # A build no faster than eager alone starts once the cheap partners' verdicts
            # are in, and only with budget left: started beside them, it held its lane (and
            # the search's end) for minutes where a short budget was already spent. Only
            # the quickest to build of them is tried.
            later = sorted((n for n in partners if n in known), key=_build_rank)
            if later and self._room():
                # the build runs alone: the next round may start beside it
                found.update(self._try([sets[later[0]]], round_, first_branch=len(tries),
                                       ahead=partial(if_it_improves, before=dict(found))))
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
        slower no-gain modes with the best set), quickest to build first, side by side in
        the lanes free, each started only while budget is left and where the mode's build
        in the baseline fits in the budget left (max-autotune's took 69 to 186 s as a
        candidate): on the H200 level2 bench a GEMM task's search ended at 7 candidates
        with 8 of its 120 s unspent. One at a time, they were each search's last 100 to
        160 s with three of its four lanes idle (H200, 2026-11-30)."""
        modes = {names: mode for mode, names in sets}

        def fits(names: tuple[str, ...]) -> bool:  # as the verdicts in flight leave it
            return self._room() and (self.build_seconds.get(modes[names], 0.0)
                                     <= self.max_seconds - self._spent())

        self._try([names for _, names in sets], round_, first_branch, may_start=fits)

    def _room(self, settle: bool = True) -> bool:
        """Budget left for another candidate. A candidate's stopped seconds come off the
        search's spent seconds only with its verdict, so while candidates are in flight the
        seconds read high: on the H200 level2 bench a GEMM task's search read 146 s of its
        120 with three candidates in evaluation, stopped for most of their time by other
        tasks' windows, and 84 s once their verdicts were in; it had ended at 8 candidates
        (bench-level2-h200-in-flight). Where only the seconds stand in the way and the
        verdicts in flight could bring them under the budget, `settle` waits for them (they
        are judged to the end either way) before saying no; a start ahead of its round
        does not wait."""
        def room() -> bool:
            return (self._made < self.max_candidates
                    and self._spent() < self.max_seconds and not due())

        while settle and not room() and self._running and self._made < self.max_candidates \
                and not due() and self._spent() - self._in_flight.elapsed() < self.max_seconds:
            self._next_verdicts()
        has_room = room()
        if not has_room and settle and not self._spent_said:
            self._spent_said = True
            self._say_spent()
        return has_room

    def _spent(self) -> float:
        return _clock() - self._started - self._stopped

    def _next_sets(self, best: tuple[str, ...], names: list[str],
                   known: dict[str, float]) -> list[tuple[str, ...]]:
        """The round after `best`: it with each compatible partner of `names` (in their
        order), less the no-gain builds, which wait for their turn in the round itself."""
        return [tuple(sorted((*best, n))) for n in names
                if n not in best and n not in known and compatible((*best, n))]

    def _next_if_it_improves(self, found: dict[tuple[str, ...], Verdict | None], *,
                             bar: float, names: list[str], known: dict[str, float],
                             before: dict[tuple[str, ...], Verdict | None] | None = None
                             ) -> list[tuple[str, ...]]:
        """The round after this one's fastest so far (with the round's verdicts `before`
        this call), where it beats the best `bar` by the margin; none where it does not."""
        done = {s: v for s, v in {**(before or {}), **found}.items() if v is not None}
        lead = self._fastest(done)
        if lead is None or self._speedup(done[lead]) * _IMPROVES < bar:
            return []
        return self._next_sets(lead, names, known)

    def _try(self, sets: list[tuple[str, ...]], round_: int, first_branch: int = 0,
             ahead: Callable[[dict[tuple[str, ...], Verdict | None]],
                             list[tuple[str, ...]]] | None = None,
             may_start: Callable[[tuple[str, ...]], bool] | None = None
             ) -> dict[tuple[str, ...], Verdict | None]:
        """Verdicts of these transformation sets (None: no budget left for it), `batch` in
        evaluation at a time: each one that ends makes room for the next, so a quick
        candidate never waits for a slow compile beside it. Sets judged before (a resumed
        search, or started ahead of this round) are not judged again; a new one starts
        only where `may_start` allows it then. The store is written from this thread only.

        Where the round has nothing left to start and lanes stand free while its last
        candidates run, `ahead` names the next round's sets as the verdicts so far make
        it (the fastest so far with each partner), and they start in those lanes as the
        next round's candidates: on the H200 level2 bench a four-lane search had 2.2 to
        3.3 candidates in evaluation on average, each round's last one or two running
        alone. Where the round ends with another best, those are extra candidates of the
        search, judged and kept like any other."""
        results: dict[tuple[str, ...], Verdict | None] = dict.fromkeys(sets)
        waiting = deque(enumerate(sets, first_branch))
        mine: dict[int, tuple[str, ...]] = {}  # this round's candidates in evaluation

        def collect() -> None:  # verdicts recorded, here or while `_room` waited for them
            for cid in [c for c in mine if c not in self._running.values()]:
                results[mine.pop(cid)] = self.store.candidate(cid).verdict

        while True:
            while waiting and len(self._running) < self.batch:
                branch, names = waiting.popleft()
                if may_start is not None and " + ".join(names) not in self._ideas \
                        and not may_start(names):
                    continue
                cid = self._candidate(names, round_, branch)
                if cid is None:
                    continue
                if cid in self._running.values():
                    mine[cid] = names  # started ahead of this round
                    continue
                row = self.store.candidate(cid)
                if row.verdict is not None:
                    results[names] = row.verdict
                    continue
                mine[cid] = names
                self._start(cid, row.source)
            collect()
            if ahead is not None and not waiting and mine and len(self._running) < self.batch:
                self._start_ahead(ahead(results), round_ + 1)
            if not mine and not waiting:
                return results
            if self._running:
                self._next_verdicts()
            collect()

    def _start(self, cid: int, source: str) -> None:
        self._in_flight.start(cid)
        if self.batch > 1:
            # one set of lanes for the whole search: a candidate started ahead of its
            # round is still in evaluation when that round begins
            if self._lanes is None:
                self._lanes = ThreadPoolExecutor(self.batch, thread_name_prefix="pike-offline")
            future = self._lanes.submit(self._judge_one, source)
        else:  # one at a time, in this thread, as a search without a pool does
            future = Future()
            future.set_result(self._judge_one(source))
        self._running[future] = cid

    def _start_ahead(self, sets: list[tuple[str, ...]], round_: int) -> None:
        new = [names for names in sets if " + ".join(names) not in self._ideas]
        if self.max_candidates - self._made < 2 * len(new):
            return  # the round that comes (another best, maybe) must still fit in the count
        for branch, names in enumerate(sets):
            if len(self._running) >= self.batch:
                return
            if " + ".join(names) in self._ideas:
                continue  # judged, in evaluation, or made before
            cid = self._candidate(names, round_, branch, settle=False)
            if cid is None:
                return
            self._start(cid, self.store.candidate(cid).source)

    def _next_verdicts(self) -> list[int]:
        """Wait for one or more evaluations to end; record their verdicts."""
        finished, _ = wait(self._running, return_when=FIRST_COMPLETED)
        ended = []
        for future in finished:
            cid = self._running.pop(future)
            self._record(cid, future.result(), self._in_flight.end(cid))
            ended.append(cid)
        return ended

    def _finish_ahead(self) -> None:
        """Candidates started ahead of a round that did not come (another best, or the
        budget spent) are judged to the end and kept, not dropped; so are those a run cut
        off before (Ctrl-C, a campaign's time limit) had in evaluation where this run's
        rounds did not reach them again."""
        while self._running:
            self._next_verdicts()
        left = [idea for idea, cid in self._ideas.items()
                if self.store.candidate(cid).verdict is None]
        if left and not due():
            self._try([tuple(idea.split(" + ")) for idea in left], 0)

    def _candidate(self, names: tuple[str, ...], round_: int, branch: int,
                   settle: bool = True) -> int | None:
        """The candidate of this set: recorded before, new while there is budget, or None."""
        idea = " + ".join(names)
        if idea in self._ideas:
            return self._ideas[idea]
        if not self._room(settle):
            return None
        self._made += 1
        cid = int(self.store.add_candidate(
            self.task, render(self.task_source, names), parent_id=None,
            role="offline", round=round_, branch=branch, idea=idea))
        self._ideas[idea] = cid
        return cid

    def _judge_one(self, source: str) -> Verdict:
        for _, verdict in self.judge([source]):
            return verdict
        raise AssertionError("the judge gave no verdict")  # pragma: no cover

    def _record(self, cid: int, verdict: Verdict, beside: float) -> None:
        self.store.set_verdict(cid, verdict)
        search_bar.raise_to(self._bar_key, self._speedup(verdict))
        self._stopped += _stood(verdict) / beside
        self.store.set_state(self.task, "offline_seconds", self._spent())
        self.on_event("verdict", candidate=cid, verdict=verdict)

    @staticmethod
    def _speedup(verdict: Verdict | None) -> float:
        # Speedups are ratios taken in one window with the reference, so they compare
        # across evaluations on a drifting host better than absolute runtimes do.
        if verdict is None or not verdict.rankable:
            return 0.0
        return verdict.speedup or 0.0

    def _fastest(self, results: dict[tuple[str, ...], Verdict | None]) -> tuple[str, ...] | None:
        ok = {s: self._speedup(v) for s, v in results.items() if self._speedup(v) > 0}
        return max(ok, key=lambda s: ok[s]) if ok else None
