"""A baseline mode that runs out of GPU memory beside other evaluations is measured again.

On an H200 `pike bench` of level1 tasks (bench/results/bench-level1-h200-partial.md),
50_conv_standard_2D's compile:reduce-overhead failed in 0.5 s with "CUDA error: out of
memory" while four searches held the GPU's memory, and was stored as the task's failed
mode. The device's memory is shared, so such a failure need not be the mode's own."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from pike.config import RunConfig
from pike.errors import TaskError
from pike.evaluate import baseline as baseline_module
from pike.evaluate.baseline import ModeFailed
from pike.task import load_task
from tests.conftest import EXAMPLES

TASK = EXAMPLES / "tasks" / "1_GeluMLP.py"
MODES = ["eager", "compile:default", "compile:reduce-overhead"]
OOM = "torch.AcceleratorError: CUDA error: out of memory"


def _timer(mode: str, error: str | None) -> SimpleNamespace:
    return SimpleNamespace(mode=mode, samples=[] if error else [1.0] * 5, error=error,
                           build_s=0.1, prebuild_s=None, checked=True, check_note=None,
                           failure=None)


def _mode_failed(mode: str, reason: str) -> ModeFailed:
    err = ModeFailed.__new__(ModeFailed)
    Exception.__init__(err, reason)
    err.mode, err.in_prebuild, err.reason = mode, False, reason
    err.build_s, err.prebuild_s = 0.5, None
    return err


def _measure(monkeypatch: pytest.MonkeyPatch, passes: list[Any], device: str = "cuda:0",
             stopped: bool = False, events: list[dict] | None = None,
             failed_before: dict[str, Any] | None = None) -> tuple[Any, list[list[str]]]:
    """measure_baselines with each reference child's modes answered by the next of
    `passes`: {mode: error or None}, or an exception (ModeFailed, TaskError) to raise.
    Returns the baseline (or the BaselineStopped raised) and the modes each child was
    asked for; `events` collects on_event's calls."""
    asked: list[list[str]] = []

    def reference(*_: Any, **__: Any) -> Any:
        return SimpleNamespace(work=lambda: None, close=lambda: None, env={})

    def time_modes(task: Any, ref: Any, modes: list[str], cfg: Any, dev: Any,
                   on_built: Any = None, **__: Any) -> list[Any]:
        asked.append(list(modes))
        answer = passes[min(len(asked), len(passes)) - 1]
        if isinstance(answer, Exception):
            raise answer
        timers = [_timer(m, answer.get(m)) for m in modes]
        for timer in timers:
            if on_built is not None:
                on_built(timer)
        return timers

    monkeypatch.setattr(baseline_module, "run_reference", reference)
    monkeypatch.setattr(baseline_module, "time_reference_modes", time_modes)
    monkeypatch.setattr(baseline_module, "resolve_device", lambda d: device)
    monkeypatch.setattr(baseline_module, "_STOP_GRACE_S", 0.1)
    monkeypatch.setattr(baseline_module, "_OUT_OF_MEMORY_WAIT_S", 0.1)
    on_event = None if events is None else (lambda kind, **d: events.append({"kind": kind, **d}))
    try:
        result = baseline_module.measure_baselines(load_task(TASK), RunConfig(), MODES,
                                                   on_event=on_event, stopped=lambda: stopped,
                                                   failed_before=failed_before)
    except baseline_module.BaselineStopped as err:
        return err, asked
    return result, asked


def _errors(result: Any) -> dict[str, str | None]:
    return {m.mode: m.error for m in result.modes}


def test_a_mode_out_of_memory_once_is_measured_again_with_the_others(
        monkeypatch: pytest.MonkeyPatch) -> None:
    events: list[dict] = []
    result, asked = _measure(monkeypatch, [{"compile:reduce-overhead": OOM}, {}],
                             events=events)
    assert asked == [MODES, MODES]  # whole, so every mode is beside the same eager
    assert all(error is None for error in _errors(result).values())
    assert all(m.speedup_vs_eager for m in result.modes)
    # the second pass's builds are shown as a new child's
    assert [e["again"] for e in events] == [False] * 3 + [True] * 3


def test_a_mode_failing_on_its_own_keeps_its_failure_unbuilt_in_the_second_pass(
        monkeypatch: pytest.MonkeyPatch) -> None:
    own = "InductorError: a lowering failed"
    result, asked = _measure(monkeypatch, [
        {"compile:default": own, "compile:reduce-overhead": OOM}, {}])
    assert asked == [MODES, ["eager", "compile:reduce-overhead"]]
    assert _errors(result) == {"eager": None, "compile:default": own,
                               "compile:reduce-overhead": None}


def test_a_second_pass_that_fails_more_modes_or_cannot_run_leaves_the_first_standing(
        monkeypatch: pytest.MonkeyPatch) -> None:
    first = {"compile:reduce-overhead": OOM}
    worse, asked = _measure(monkeypatch, [first, {"compile:default": OOM,
                                                  "compile:reduce-overhead": OOM}])
    assert len(asked) == 2 and _errors(worse)["compile:default"] is None
    lost, asked = _measure(monkeypatch, [first, TaskError("the reference ran out too")])
    assert len(asked) == 2 and _errors(lost) == {"eager": None, "compile:default": None,
                                                 "compile:reduce-overhead": OOM}


def test_a_mode_out_of_memory_twice_keeps_its_failure_and_is_not_tried_a_third_time(
        monkeypatch: pytest.MonkeyPatch) -> None:
    result, asked = _measure(monkeypatch, [{"compile:reduce-overhead": OOM}])
    assert len(asked) == 2
    assert _errors(result)["compile:reduce-overhead"] == OOM
    assert _errors(result)["compile:default"] is None


def test_a_child_taken_down_by_out_of_memory_is_measured_again_with_that_mode(
        monkeypatch: pytest.MonkeyPatch) -> None:
    down = _mode_failed("compile:default", "crashed in phase 'build': CUDA out of memory")
    result, asked = _measure(monkeypatch, [down, {}, {}])
    # the first pass goes on without it (as for any mode that takes its child down);
    # the second measures every mode again, the one that ran out too
    assert asked == [MODES, ["eager", "compile:reduce-overhead"], MODES]
    assert all(error is None for error in _errors(result).values())


@pytest.mark.parametrize(("device", "error"), [
    ("cuda:0", "InductorError: a lowering failed"),  # the mode's own failure
    ("cpu", "RuntimeError: out of memory"),  # no device shared with other evaluations
])
def test_other_failures_and_the_cpu_are_not_measured_again(
        monkeypatch: pytest.MonkeyPatch, device: str, error: str) -> None:
    result, asked = _measure(monkeypatch, [{"compile:default": error}, {}], device=device)
    assert len(asked) == 1 and _errors(result)["compile:default"] == error


def test_a_stop_seen_after_an_out_of_memory_failure_ends_the_baseline_unmeasured_again(
        monkeypatch: pytest.MonkeyPatch) -> None:
    result, asked = _measure(monkeypatch, [{"compile:default": OOM}, {}], stopped=True)
    assert isinstance(result, baseline_module.BaselineStopped) and len(asked) == 1


def test_modes_that_failed_in_an_earlier_call_are_kept_failed_and_not_built_again(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from pike.evaluate.baseline import ModeTiming

    before = {"compile:default": ModeTiming(mode="compile:default", build_s=300.0,
                                            error="timeout (in an earlier call)")}
    result, asked = _measure(monkeypatch, [{}], failed_before=before)
    assert asked == [["eager", "compile:reduce-overhead"]]
    assert _errors(result) == {"eager": None, "compile:default": "timeout (in an earlier call)",
                               "compile:reduce-overhead": None}
    assert [m.mode for m in result.modes] == MODES  # in the modes' order
    # a second pass (another mode out of GPU memory) keeps the earlier failure too
    result, asked = _measure(monkeypatch, [{"compile:reduce-overhead": OOM}, {}],
                             failed_before=before)
    assert asked == [["eager", "compile:reduce-overhead"]] * 2
    assert _errors(result)["compile:default"] == "timeout (in an earlier call)"
