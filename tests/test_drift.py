"""Drift is caught, not averaged in: a window whose reference is off its usual time in the
run is timed again, and a verdict still off is `noisy`, never a search's best."""

from __future__ import annotations

from pathlib import Path

import psutil
import pytest

from pike.config import EvalConfig
from pike.evaluate import candidate_windows, judge
from pike.evaluate.timing_window import Timer, time_interleaved
from pike.evaluate.verdict import TimingStats, Verdict
from pike.store import RunStore


def _window(reference_ms: float, candidate_ms: float) -> list[Timer]:
    return [Timer(child=None, mode="eager", samples=[reference_ms] * 10),  # type: ignore[arg-type]
            Timer(child=None, mode="candidate", samples=[candidate_ms] * 10)]  # type: ignore[arg-type]


def _reference(*usual_ms: float) -> judge.ReferenceRun:
    run = judge.ReferenceRun.__new__(judge.ReferenceRun)
    run.window_ms = list(usual_ms)
    run.renewals = 0
    return run


def test_a_drifting_window_is_timed_again_and_the_steady_one_kept(
        monkeypatch: pytest.MonkeyPatch) -> None:
    again = [_window(5.9, 2.5)]
    monkeypatch.setattr(candidate_windows, "_timing_window", lambda *a, **k: again.pop())
    reference = _reference(5.8, 5.9, 6.0)
    timers, usual = candidate_windows._steady_window(reference, None, "cuda:0", EvalConfig(),  # type: ignore[arg-type]
                                         _window(13.1, 3.3))
    assert usual is None and timers[0].samples[0] == 5.9 and again == []
    assert reference.window_ms[-1] == 5.9


def test_a_window_still_off_after_the_retries_is_noisy(monkeypatch: pytest.MonkeyPatch) -> None:
    renewed = []
    monkeypatch.setattr(candidate_windows, "_timing_window",
                        lambda *a, **k: renewed.append(k.get("renew")) or _window(13.1, 3.3))
    timers, usual = candidate_windows._steady_window(_reference(5.8, 5.9, 6.0), None, "cuda:0",  # type: ignore[arg-type]
                                         EvalConfig(), _window(13.1, 3.3))
    # twice with the same reference child, then once with a fresh one
    assert renewed == [False, False, True] and usual == 5.9


def test_a_fresh_reference_child_ends_the_drift(monkeypatch: pytest.MonkeyPatch) -> None:
    def window(*a: object, renew: bool = False, **k: object) -> list[Timer]:
        return _window(5.9 if renew else 13.1, 3.3)  # the old child was the slow one

    monkeypatch.setattr(candidate_windows, "_timing_window", window)
    timers, usual = candidate_windows._steady_window(_reference(5.8, 5.9, 6.0), None, "cuda:0",  # type: ignore[arg-type]
                                         EvalConfig(), _window(13.1, 3.3))
    assert usual is None and timers[0].samples[0] == 5.9


def test_a_reference_run_renews_its_child_from_the_same_seeds(tmp_path: Path) -> None:
    from pike.task import load_task
    task = load_task(Path(__file__).parent.parent / "examples" / "tasks" / "1_GeluMLP.py")
    cfg = EvalConfig(device="cpu", trials=2)
    reference = judge.run_reference(task, cfg, "cpu", keep_child=True, cache=False)
    try:
        old = reference.child
        assert old is not None and old.proc is not None
        old_pid = old.proc.pid
        assert reference.renew_child()
        assert reference.child is not old and reference.renewals == 1
        assert not psutil.pid_exists(old_pid)  # the old child is gone
        timer = Timer(reference.child, "eager")  # the fresh child times the reference
        time_interleaved([timer], cfg.timing)
        assert timer.failure is None and timer.samples
        spare = list(reference._spare_tmps)
        assert spare and all((d / "work").is_dir() for d in spare)
    finally:
        reference.close()
    assert not any(d.exists() for d in spare)


def test_the_first_window_and_cpu_timings_are_not_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(candidate_windows, "_timing_window", lambda *a, **k: pytest.fail("timed again"))
    reference = _reference()
    assert candidate_windows._steady_window(reference, None, "cuda:0", EvalConfig(),  # type: ignore[arg-type]
                                _window(13.1, 3.3))[1] is None
    assert reference.window_ms == [13.1]
    assert candidate_windows._steady_window(_reference(5.9), None, "cpu", EvalConfig(),  # type: ignore[arg-type]
                                _window(13.1, 3.3))[1] is None


def test_a_window_off_by_less_than_its_own_spread_is_not_noisy(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # a launch-bound task: the reference's calls spread by 40% within the window (as on
    # the H100 for the example MLP), its median 20% off the usual: noise, not drift
    monkeypatch.setattr(candidate_windows, "_timing_window", lambda *a, **k: pytest.fail("timed again"))
    spread = _window(0.08, 0.03)
    spread[0].samples = [0.065, 0.07, 0.072, 0.08, 0.08, 0.09, 0.104, 0.11]
    assert candidate_windows._steady_window(_reference(0.1, 0.097), None, "cuda:0", EvalConfig(),  # type: ignore[arg-type]
                                spread)[1] is None


def test_a_noisy_verdict_is_never_the_best(tmp_path: Path) -> None:
    store = RunStore.create(tmp_path / "run", {}, "test")
    store.add_task("t", str(tmp_path / "t.py"), "x", "")
    stats = TimingStats.from_samples([1.0])
    noisy = Verdict(status="ok", runtime=stats, reference=stats, noisy=True,
                    noisy_speedup=4.0, reference_usual_ms=0.45)
    steady = Verdict(status="ok", runtime=stats, reference=stats, speedup=1.8)
    for verdict in (noisy, steady):
        cid = store.add_candidate("t", "src", parent_id=None, role="optimize", round=0,
                                  branch=0)
        store.set_verdict(cid, verdict)
    best = store.best("t")
    assert best is not None and best.verdict.speedup == 1.8
