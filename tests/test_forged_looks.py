"""The wall-clock check looks at up to three timing windows before it rejects: a burst of
host load can stretch an honest candidate's blocks alone in one or two windows."""

from __future__ import annotations

from typing import Any

import pytest

from pike.config import EvalConfig
from pike.evaluate import candidate_windows, evaluate
from pike.evaluate import judge as judge_module
from pike.evaluate import reference as reference_module
from pike.task import Task
from tests.conftest import candidate

FORGED = "reported timings that do not account for the wall time of its timing blocks"


def _looks(monkeypatch: pytest.MonkeyPatch, flagged: int) -> list[bool]:
    """Make the first `flagged` windows look forged; record each window's `flipped`."""
    seen: list[bool] = []
    window = judge_module._timing_window

    def timing_window(*args: Any, **kwargs: Any) -> list:
        seen.append(bool(kwargs.get("flipped", False)))
        return window(*args, **kwargs)

    looks = iter(range(100))
    monkeypatch.setattr(judge_module, "_timing_window", timing_window)
    monkeypatch.setattr(candidate_windows, "_timing_window", timing_window)  # a steady window's
    monkeypatch.setattr(judge_module, "_forged",
                        lambda reference, timers, strict=False:
                        FORGED if next(looks) < flagged else None)
    return seen


@pytest.mark.parametrize("flagged", [1, 2])
def test_an_honest_window_after_flagged_ones_keeps_the_candidate(
        mlp_task: Task, fast_config: EvalConfig, monkeypatch: pytest.MonkeyPatch,
        flagged: int) -> None:
    seen = _looks(monkeypatch, flagged)
    verdict = evaluate(mlp_task, candidate("fused"), fast_config)
    assert verdict.ok, verdict.message
    # every look after the first flips the blocks' order, so a burst lands elsewhere
    assert seen[:flagged + 1] == [False, True, False][:flagged + 1]


def test_timings_flagged_in_every_window_are_rejected(
        mlp_task: Task, fast_config: EvalConfig, monkeypatch: pytest.MonkeyPatch) -> None:
    seen = _looks(monkeypatch, 99)
    verdict = evaluate(mlp_task, candidate("fused"), fast_config)
    assert verdict.status == "rejected"
    assert FORGED in verdict.message and "in each of 3 timing windows" in verdict.message
    assert seen == [False, True, False]


def test_a_flipped_window_starts_with_the_last_timer() -> None:
    from pike.config import TimingConfig
    from pike.evaluate import timing_window

    order: list[str] = []

    class Fake:
        def __init__(self, mode: str) -> None:
            self.mode, self.stopped, self.failure, self.gave_up_after = mode, False, None, None

    original = timing_window._time_one_block
    try:
        timing_window._time_one_block = lambda timer, **_: order.append(timer.mode)  # type: ignore
        cfg = TimingConfig(rounds=4)
        timing_window.time_interleaved([Fake("eager"), Fake("candidate")], cfg)  # type: ignore
        assert order == ["eager", "candidate", "candidate", "eager"] * 2
        order.clear()
        timing_window.time_interleaved([Fake("eager"), Fake("candidate")], cfg, flipped=True)  # type: ignore
        assert order == ["candidate", "eager", "eager", "candidate"] * 2
    finally:
        timing_window._time_one_block = original


def test_a_kept_loop_cost_is_returned_without_taking_the_device_and_renewed_per_child(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    # Each evaluation asks for the reference's loop cost twice; with the cost kept, an
    # exclusive hold only waited behind other windows and stopped every other child.
    import contextlib

    holds: list[bool] = []

    @contextlib.contextmanager
    def hold(device: str, *, exclusive: bool, keep: Any = (), purpose: str = "") -> Any:
        holds.append(exclusive)
        yield

    class Child:
        def enter_phase(self, phase: str) -> None:
            pass

    measured: list[object] = []
    monkeypatch.setattr(reference_module, "hold", hold)
    monkeypatch.setattr(reference_module, "calibrate",
                        lambda child: measured.append(child) or f"cost of {id(child)}")
    first, second = Child(), Child()
    reference = reference_module.ReferenceRun(inputs_dir=tmp_path, expected=[], env={},
                                              child=first, _tmp=tmp_path, device="cuda:0")
    assert reference.loop_cost() == f"cost of {id(first)}"
    assert reference.loop_cost() == reference.loop_cost()
    assert holds == [True] and measured == [first]
    reference.child = second  # a renewed child measures its own
    assert reference.loop_cost() == f"cost of {id(second)}"
    assert holds == [True, True] and measured == [first, second]
    reference.child = None  # closed: its last figure, no device
    assert reference.loop_cost() == f"cost of {id(second)}" and holds == [True, True]
