"""Candidates of one task that wait for the device at once are timed in one window beside
one eager, each judged against eager as in a window of its own (shared_window.py)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from types import SimpleNamespace
from typing import Any

import psutil
import pytest

from pike.config import EvalConfig, TimingConfig
from pike.evaluate import candidate_windows, judge, reference_cache, shared_window, timing_window
from pike.evaluate import reference as reference_module
from pike.evaluate.pool import LocalPool
from pike.evaluate.shared_window import WindowQueue
from pike.evaluate.timing_window import GIVE_UP_AFTER_ROUNDS, Timer, time_interleaved
from pike.evaluate.verdict import Verdict
from pike.task import Task
from tests.conftest import candidate


def _steady(ms: float) -> Iterator[float]:
    while True:
        yield ms


def _fake_blocks(monkeypatch: pytest.MonkeyPatch, per_call_ms: dict[str, Iterator[float]],
                 fail: dict[str, int] | None = None) -> list[str]:
    """Each block adds four samples to its timer (the next of its mode's times); a mode
    in `fail` fails in that block. Returns the modes in the order their blocks ran."""
    ran: list[str] = []

    def one_block(timer: Timer, **_: object) -> None:
        ran.append(timer.mode)
        if fail and ran.count(timer.mode) == fail.get(timer.mode):
            timer.failure = Verdict(status="crashed", phase="timing", message="died")
            return
        timer.samples.extend(next(per_call_ms[timer.mode]) for _ in range(4))

    monkeypatch.setattr(timing_window, "_time_one_block", one_block)
    return ran


def _timers(*modes: str) -> list[Timer]:
    return [Timer(child=None, mode=m) for m in modes]  # type: ignore[arg-type]


def test_each_candidate_of_a_shared_window_gives_up_alone(
        monkeypatch: pytest.MonkeyPatch) -> None:
    ran = _fake_blocks(monkeypatch, {"eager": _steady(1.0), "hopeless": _steady(40.0),
                                     "behind": _steady(0.9), "best": _steady(0.2)})
    timers = _timers("eager", "hopeless", "behind", "best")
    time_interleaved(timers, TimingConfig(rounds=20), give_up=True, best=lambda: 5.0,
                     each=True)
    eager, hopeless, behind, best = timers
    assert hopeless.gave_up_after == GIVE_UP_AFTER_ROUNDS and hopeless.behind_best is None
    assert behind.gave_up_after == GIVE_UP_AFTER_ROUNDS and behind.behind_best == 5.0
    assert best.gave_up_after is None  # 5x: the bar's own figure, timed to the end
    assert ran.count("best") == ran.count("eager") == 20
    assert ran.count("hopeless") == ran.count("behind") == GIVE_UP_AFTER_ROUNDS


def test_a_candidate_that_fails_stops_only_itself_and_the_window_ends_with_the_last(
        monkeypatch: pytest.MonkeyPatch) -> None:
    ran = _fake_blocks(monkeypatch, {"eager": _steady(1.0), "dies": _steady(0.5),
                                     "lives": _steady(0.5)}, fail={"dies": 2})
    timers = _timers("eager", "dies", "lives")
    time_interleaved(timers, TimingConfig(rounds=10), each=True)
    assert timers[1].failure is not None and ran.count("dies") == 2
    assert timers[2].failure is None and ran.count("lives") == ran.count("eager") == 10
    # all candidates gone: the window ends after that round
    ran = _fake_blocks(monkeypatch, {"eager": _steady(1.0), "a": _steady(0.5),
                                     "b": _steady(0.5)}, fail={"a": 2, "b": 3})
    timers = _timers("eager", "a", "b")
    time_interleaved(timers, TimingConfig(rounds=10), each=True)
    assert ran.count("eager") == 3
    # the reference failing ends it at once (after its round)
    ran = _fake_blocks(monkeypatch, {"eager": _steady(1.0), "a": _steady(0.5)},
                       fail={"eager": 2})
    timers = _timers("eager", "a")
    time_interleaved(timers, TimingConfig(rounds=10), each=True)
    assert ran.count("a") == 2 and ran.count("eager") == 2


def test_an_answer_that_makes_the_leader_raise_fails_only_its_candidate(
        monkeypatch: pytest.MonkeyPatch) -> None:
    class Child:
        unresponsive = False

    ran: list[str] = []

    def one_block(timer: Timer, **_: object) -> None:
        ran.append(timer.mode)
        if timer.mode == "garbled":
            raise TypeError("'int' object is not iterable")
        timer.samples.extend([1.0] * 4)

    monkeypatch.setattr(timing_window, "_time_one_block", one_block)
    timers = [Timer(child=Child(), mode=m)  # type: ignore[arg-type]
              for m in ("eager", "garbled", "honest")]
    time_interleaved(timers, TimingConfig(rounds=6), each=True)
    assert timers[1].failure is not None and timers[1].failure.status == "rejected"
    assert "could not read" in timers[1].failure.message and timers[1].child.unresponsive
    assert ran.count("honest") == ran.count("eager") == 6 and ran.count("garbled") == 1
    # eager's own trouble is the window's: it is raised
    monkeypatch.setattr(timing_window, "_time_one_block",
                        lambda timer, **_: (_ for _ in ()).throw(RuntimeError("evaluator")))
    with pytest.raises(RuntimeError):
        time_interleaved(_timers("eager", "honest"), TimingConfig(rounds=2), each=True)


def test_probe_calls_that_are_no_list_are_ignored(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(timing_window, "request", lambda *a, **k: {
        "samples": [1.0, 1.0, 1.0], "probe_calls": 5})
    class Child:
        line_ready_at = 0.0
        timed_calls = probes_timed = 0  # as ChildProcess counts them

    timer = Timer(child=Child(), mode="candidate", warmed=True)  # type: ignore[arg-type]
    timing_window._time_one_block(timer, min_calls=3, min_seconds=0.0, max_calls=3)
    assert timer.samples == [1.0, 1.0, 1.0] and timer.probe_samples == []


@pytest.mark.parametrize(("probes", "sets", "kept"), [
    ([1], [0, 3], True),   # its probe, with the probe set's sample (set 3: a probe set)
    ([1], [0, 1], False),  # a probe named with no sample of a probe set
    ([0, 1], [2, 3], False),  # two in a block, where at most one is drawn
])
def test_a_candidates_probe_counts_only_with_a_probe_sets_sample(
        monkeypatch: pytest.MonkeyPatch, probes: list[int], sets: list[int], kept: bool) -> None:
    """The list of probe calls is the child's word; the sample of a probe set's outputs
    (checked against the reference's answers for that set) is the evidence."""
    monkeypatch.setattr(timing_window, "request", lambda *a, **k: {
        "samples": [1.0, 2.0, 3.0], "probe_calls": probes,
        "outputs": [{"call": i, "set": k, "leaves": []} for i, k in enumerate(sets)]})

    class Child:
        line_ready_at = 0.0
        timed_calls = probes_timed = 0
        request = SimpleNamespace(input_sets=2)  # sets 0 and 1 rotate; 2 on are probes

    timer = Timer(child=Child(), mode="candidate", warmed=True)  # type: ignore[arg-type]
    timing_window._time_one_block(timer, min_calls=3, min_seconds=0.0, max_calls=3)
    if kept:
        assert timer.failure is None and timer.probe_samples == [2.0]
        assert timer.child.probes_timed == 1
    else:
        assert timer.failure is not None and timer.failure.status == "rejected"
        assert "records were rewritten" in timer.failure.message
        assert timer.samples == [] and timer.child.probes_timed == 0
    eager = Timer(child=Child(), mode="eager", warmed=True)  # type: ignore[arg-type]
    timing_window._time_one_block(eager, min_calls=3, min_seconds=0.0, max_calls=3)
    assert eager.failure is None  # the reference's child runs no candidate code


def test_each_candidate_of_a_window_is_held_to_the_usual_time_as_the_window_began() -> None:
    reference = reference_module.ReferenceRun.__new__(reference_module.ReferenceRun)
    reference.window_ms = [5.0]
    eager = Timer(child=None, mode="eager", samples=[5.45] * 10,  # type: ignore[arg-type]
                  usual_ms=5.0)
    timers = [eager, Timer(child=None, mode="candidate")]  # type: ignore[arg-type]
    assert candidate_windows._window_drift(reference, timers) == pytest.approx(0.09)
    reference.window_ms.append(5.45)  # the first candidate of the window kept eager's median
    assert candidate_windows._window_drift(reference, timers) == pytest.approx(0.09)  # still off


def test_without_each_a_failure_still_ends_the_window_and_failed_modes_leave_eager_timed(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # the confirming window: one failure ends it, as before
    ran = _fake_blocks(monkeypatch, {"eager": _steady(1.0), "a": _steady(0.5),
                                     "b": _steady(0.5)}, fail={"a": 2})
    time_interleaved(_timers("eager", "a", "b"), TimingConfig(rounds=10))
    assert ran.count("eager") == 2
    # a baseline whose every compile mode failed to build times eager in every round
    ran = _fake_blocks(monkeypatch, {"eager": _steady(1.0)})
    timers = _timers("eager", "compile:default")
    timers[1].error = "did not compile"
    time_interleaved(timers, TimingConfig(rounds=10))
    assert ran == ["eager"] * 10


def test_before_block_is_told_each_timer_before_its_block(
        monkeypatch: pytest.MonkeyPatch) -> None:
    ran = _fake_blocks(monkeypatch, {"eager": _steady(1.0), "a": _steady(0.5),
                                     "b": _steady(0.5)})
    told: list[str] = []
    time_interleaved(_timers("eager", "a", "b"), TimingConfig(rounds=4), each=True,
                     before_block=lambda timer: told.append(timer.mode))
    assert told == ran == ["eager", "a", "b", "b", "a", "eager"] * 2


def test_a_window_takes_who_joins_until_it_is_closed_or_full() -> None:
    queue = WindowQueue()
    first, seat, leads = queue.join("a", most=3)  # type: ignore[arg-type]
    assert leads and seat.child == "a"
    same, _, leads_b = queue.join("b", most=3)  # type: ignore[arg-type]
    assert same is first and not leads_b
    queue.join("c", most=3)  # type: ignore[arg-type]
    full, _, leads_d = queue.join("d", most=3)  # type: ignore[arg-type]
    assert full is not first and leads_d  # the first was full
    assert [s.child for s in queue.close(full)] == ["d"]
    after, _, leads_e = queue.join("e", most=3)  # type: ignore[arg-type]
    assert after is not full and leads_e  # a closed window takes no one


def test_the_turns_stop_every_candidate_tree_but_the_timed_one(children: Any) -> None:
    a, b = children(), children()  # each a parent with a child of its own
    timers = [Timer(child=p, mode="candidate") for p in (a, b)]  # type: ignore[arg-type]
    turns = shared_window._Turns(timers, lambda proc: proc.pid)

    def status(root: psutil.Process) -> set[str]:
        return {p.status() for p in [root, *root.children(recursive=True)]}

    def settles(root: psutil.Process, stopped: bool) -> bool:
        """Whether the tree is seen all stopped (or none stopped) within two seconds: a
        signal is delivered a moment after it is sent."""
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline:
            seen = status(root)
            if (seen == {psutil.STATUS_STOPPED} if stopped
                    else psutil.STATUS_STOPPED not in seen):
                return True
            time.sleep(0.01)
        return False

    try:
        turns(timers[0])
        assert settles(a, stopped=False) and settles(b, stopped=True)
        turns(timers[1])
        assert settles(a, stopped=True) and settles(b, stopped=False)
        turns(Timer(child=None, mode="eager"))  # type: ignore[arg-type]
        assert settles(a, stopped=True) and settles(b, stopped=True)
    finally:
        turns.release()
    assert settles(a, stopped=False) and settles(b, stopped=False)


def _count_joins(monkeypatch: pytest.MonkeyPatch) -> threading.Semaphore:
    """A semaphore released each time a candidate joins a window."""
    joined = threading.Semaphore(0)
    real_join = WindowQueue.join

    def join(self: WindowQueue, child: Any, most: int) -> Any:
        found = real_join(self, child, most)
        joined.release()
        return found

    monkeypatch.setattr(WindowQueue, "join", join)
    return joined


def _stops(procs: list[tuple[int, int]]) -> bool:
    """Whether every live one of `procs` (pid, start ticks) is seen stopped within a second
    (a signal is delivered a moment after it is sent)."""
    deadline = time.monotonic() + 1.0
    while True:
        try:
            if all(psutil.Process(pid).status() == psutil.STATUS_STOPPED
                   for pid, _ in procs if psutil.pid_exists(pid)):
                return True
        except psutil.NoSuchProcess:
            continue
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)


def test_three_evaluations_waiting_at_once_are_timed_in_one_window(
        mlp_task: Task, fast_config: EvalConfig, monkeypatch: pytest.MonkeyPatch) -> None:
    """Real children in a pool of three: the device (held here as on a GPU) is taken only
    once all three wait, so they share its window. Each verdict is its own: the faster
    and the slower candidate are told apart, and the cheat that skips the work when timed
    is caught in the shared window as in one of its own. Each candidate's tree is
    stopped while eager and the others are timed."""
    joined = _count_joins(monkeypatch)
    @contextmanager
    def hold(device: str, *, exclusive: bool, keep: Any = (),
             purpose: str = "other") -> Iterator[None]:
        for _ in range(3):  # the device stays busy until all three wait for it
            assert joined.acquire(timeout=120)
        keep()
        yield

    others_stopped: list[bool] = []
    real_call = shared_window._Turns.__call__

    def call(self: Any, timer: Timer) -> None:
        real_call(self, timer)
        for key, procs in self._trees.items():
            if key != id(timer.child):
                others_stopped.append(_stops(procs))

    monkeypatch.setattr(shared_window, "hold", hold)
    monkeypatch.setattr(shared_window._Turns, "__call__", call)
    windows: list[int] = []
    real_interleaved = shared_window.time_interleaved
    monkeypatch.setattr(shared_window, "time_interleaved",
                        lambda timers, *a, **k: windows.append(len(timers))
                        or real_interleaved(timers, *a, **k))

    # one thread a child: on a loaded host its 2-thread calls of 0.4 ms took up to 300 ms
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    reference_cache.close_references()
    names = ["fused", "slower", "counts_calls"]
    pool = LocalPool(fast_config, workers=3)
    try:
        verdicts = dict(pool.judge_many(mlp_task, [candidate(n) for n in names]))
    finally:
        pool.close()
        reference_cache.close_references()  # its one-thread reference must not time later tests' eager
    fused, slower, cheat = (verdicts[i] for i in range(3))
    assert windows == [4]  # one window: eager and the three
    assert fused.ok and slower.ok, (fused.message, slower.message)
    assert fused.window_candidates == slower.window_candidates == 3
    assert fused.speedup and slower.speedup and fused.speedup > slower.speedup
    assert not cheat.ok, cheat.status
    assert others_stopped and all(others_stopped)
    for verdict in (fused, slower):
        steps = verdict.steps
        assert 0 < steps["timing.calls"] <= steps["timing.blocks"] <= steps["timing"]


def test_a_window_of_its_own_where_sharing_is_off(
        mlp_task: Task, fast_config: EvalConfig, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shared_window, "timed_together",
                        lambda *a, **k: pytest.fail("shared"))
    cfg = fast_config.model_copy(update={"timing": fast_config.timing.model_copy(
        update={"share_window": 1})})
    verdict = judge.evaluate(mlp_task, candidate("fused"), cfg)
    assert verdict.ok and verdict.window_candidates is None


def test_the_others_are_timed_alone_where_the_leader_fails_before_timing(
        mlp_task: Task, fast_config: EvalConfig, monkeypatch: pytest.MonkeyPatch) -> None:
    # an error of the evaluator in the leader's thread (not a candidate's failure) must
    # not leave the candidate that joined its window waiting, nor without its verdict
    joined = _count_joins(monkeypatch)
    failed: list[bool] = []

    def lead(*args: Any, **kwargs: Any) -> None:
        if not failed:  # the first window only: both have joined it
            for _ in range(2):
                assert joined.acquire(timeout=120)
            failed.append(True)
            raise judge.EvaluatorError("the leader's trouble")
        real_lead(*args, **kwargs)

    real_lead = shared_window._lead
    monkeypatch.setattr(shared_window, "_lead", lead)
    reference_cache.close_references()
    reference_cache.keep_references(3)
    outcomes: list[object] = []

    def one(name: str) -> None:
        try:
            outcomes.append(judge.evaluate(mlp_task, candidate(name), fast_config))
        except judge.EvaluatorError as err:
            outcomes.append(err)

    threads = [threading.Thread(target=one, args=(n,)) for n in ("fused", "slower")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    reference_cache.close_references()
    assert failed and len(outcomes) == 2
    errors = [o for o in outcomes if isinstance(o, judge.EvaluatorError)]
    alone = [o for o in outcomes if isinstance(o, Verdict) and o.ok
             and o.window_candidates is None]
    assert len(errors) == 1 and len(alone) == 1, outcomes


def test_a_block_with_more_samples_than_a_sampler_takes_is_rejected(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A block's sampler takes at most eight calls and a probe: more in the child's reply
    is forged, and the reference would compute each (ReferenceRun.timed_answers)."""
    many = timing_window.SAMPLES_A_BLOCK + 1
    monkeypatch.setattr(timing_window, "request", lambda *a, **k: {
        "samples": [1.0] * many, "probe_calls": [],
        "outputs": [{"call": i, "set": 0, "leaves": []} for i in range(many)]})

    class Child:
        line_ready_at = 0.0
        timed_calls = probes_timed = 0
        request = SimpleNamespace(input_sets=2)

    timer = Timer(child=Child(), mode="candidate", warmed=True)  # type: ignore[arg-type]
    timing_window._time_one_block(timer, min_calls=many, min_seconds=0.0, max_calls=many)
    assert timer.failure is not None and timer.failure.status == "rejected"
    assert f"it sent {many} samples of one block's outputs" in timer.failure.message
