"""A baseline cut off by Ctrl-C (or another task's error) is no result: the stop kills its
children, and what that looks like (a mode's build killed, a reference that crashed) must
not be stored as the task's failure nor built again.

On an H200 `pike bench` (bench/results/bench-level2-h200-pipelined.md) two baseline builds
killed by the shutdown were printed as failures, and a killed pre-build was followed by a
build "again alone" while pike was exiting."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from pike.config import RunConfig
from pike.errors import TaskError
from pike.evaluate import baseline as baseline_module
from pike.evaluate.baseline import ModeFailed
from pike.search import campaign, drain
from pike.store import RunStore
from pike.task import load_task
from tests.conftest import EXAMPLES

TASK = EXAMPLES / "tasks" / "1_GeluMLP.py"
AUTOTUNE = "compile:max-autotune-no-cudagraphs"


def _prebuild_failed() -> ModeFailed:
    err = ModeFailed.__new__(ModeFailed)
    Exception.__init__(err, "its pre-build was killed")
    err.mode, err.in_prebuild, err.reason = AUTOTUNE, True, "crashed: killed by SIGKILL"
    err.build_s, err.prebuild_s = 3.0, 3.0
    return err


@pytest.mark.parametrize("stopped", [True, False])
def test_a_mode_failing_as_the_caller_stops_ends_the_baseline_instead_of_a_new_build(
        monkeypatch: pytest.MonkeyPatch, stopped: bool) -> None:
    children: list[str] = []
    events: list[str] = []

    def reference(*_: Any, **__: Any) -> Any:
        children.append("reference")
        return SimpleNamespace(work=lambda: None, close=lambda: None, env={})

    def time_modes(task: Any, ref: Any, modes: list[str], *_: Any, **__: Any) -> list[Any]:
        if len(children) == 1:
            raise _prebuild_failed()
        return [SimpleNamespace(mode=m, samples=[1.0] * 5, error=None, build_s=0.1,
                                prebuild_s=None, checked=True, check_note=None)
                for m in modes]

    monkeypatch.setattr(baseline_module, "run_reference", reference)
    monkeypatch.setattr(baseline_module, "time_reference_modes", time_modes)
    monkeypatch.setattr(baseline_module, "_STOP_GRACE_S", 0.2)
    task = load_task(TASK)
    modes = ["eager", AUTOTUNE]
    kwargs = {"on_event": lambda kind, **d: events.append(kind),
              "stopped": lambda: stopped}
    if stopped:
        with pytest.raises(baseline_module.BaselineStopped):
            baseline_module.measure_baselines(task, RunConfig(), modes, **kwargs)
        assert children == ["reference"] and "prebuild_failed" not in events
    else:  # a failure of its own: built again alone, as before
        result = baseline_module.measure_baselines(task, RunConfig(), modes, **kwargs)
        assert children == ["reference", "reference"] and "prebuild_failed" in events
        assert all(m.error is None for m in result.modes)


def test_stopped_meanwhile_waits_a_moment_for_the_stop_and_no_longer(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(baseline_module, "_STOP_GRACE_S", 0.3)
    asked = [0]

    def soon() -> bool:
        asked[0] += 1
        return asked[0] > 2  # the stop shows a moment after the failure

    assert baseline_module.stopped_meanwhile(soon)
    assert not baseline_module.stopped_meanwhile(lambda: False)
    assert not baseline_module.stopped_meanwhile(None)  # no caller to stop: no wait


def test_a_reference_crashing_as_the_campaign_stops_leaves_its_task_open(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(baseline_module, "_STOP_GRACE_S", 0.2)
    first = sorted(p.stem for p in (EXAMPLES / "tasks").glob("*.py"))[0]

    def measure(task: Any, cfg: Any, modes: Any, **_: Any) -> Any:
        drain.halt(interrupted=True)  # Ctrl-C reached the campaign as its reference died
        raise TaskError("the reference crashed: killed by signal SIGKILL")

    monkeypatch.setattr(campaign, "measure_baselines", measure)
    monkeypatch.setattr(campaign, "search_task", lambda *a, **k: pytest.fail("no search"))
    result = campaign.bench(EXAMPLES / "tasks", RunConfig(), out=tmp_path / "run", jobs=1)
    assert first in result.open_tasks
    with RunStore.open(tmp_path / "run") as store:
        assert store.get_state(first, "error") is None
        assert not store.get_state(first, "done")


def _measured_for_real(monkeypatch: pytest.MonkeyPatch, halt: Any) -> list[str]:
    """campaign -> the real measure_baselines, whose reference child and timed modes are
    faked: the autotuning mode's build fails, and `halt` runs as it does."""
    children: list[str] = []

    def reference(*_: Any, **__: Any) -> Any:
        children.append("reference")
        return SimpleNamespace(work=lambda: None, close=lambda: None, env={})

    def time_modes(task: Any, ref: Any, modes: list[str], *_: Any, **__: Any) -> list[Any]:
        halt()
        return [SimpleNamespace(mode=m, samples=[] if m == AUTOTUNE else [1.0] * 5,
                                error="crashed: killed by signal SIGKILL" if m == AUTOTUNE
                                else None, build_s=0.1, prebuild_s=None, checked=True,
                                check_note=None, failure=None)
                for m in modes]

    monkeypatch.setattr(baseline_module, "run_reference", reference)
    monkeypatch.setattr(baseline_module, "time_reference_modes", time_modes)
    monkeypatch.setattr(baseline_module, "_STOP_GRACE_S", 0.2)
    monkeypatch.setattr(campaign, "search_task", lambda *a, **k: pytest.fail("no search"))
    return children


@pytest.mark.parametrize("interrupted", [True, False])
def test_only_an_interrupt_takes_a_failed_mode_for_the_stop(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, interrupted: bool) -> None:
    # Ctrl-C kills the children: the failed mode may be that, and nothing is stored.
    # Another task's error only halts: the others finish what they are in, and a mode that
    # failed then failed on its own; its baseline is stored with that failure.
    _measured_for_real(monkeypatch, lambda: drain.halt(interrupted=interrupted))
    cfg = RunConfig()
    cfg.search.baseline_modes = ["eager", AUTOTUNE]
    first = sorted(p.stem for p in (EXAMPLES / "tasks").glob("*.py"))[0]
    campaign.bench(EXAMPLES / "tasks", cfg, out=tmp_path / "run", jobs=1)
    with RunStore.open(tmp_path / "run") as store:
        stored = store.get_state(first, "baseline")
        assert store.get_state(first, "error") is None
    if interrupted:
        assert stored is None
    else:
        modes = {m["mode"]: m for m in stored["modes"]}
        assert modes[AUTOTUNE]["error"] and modes["eager"]["stats"]
