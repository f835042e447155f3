"""`pike bench` measures every task's baselines before any search starts, so no search's
time budget runs while another task's baselines hold the GPU alone."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from pike.config import RunConfig
from pike.errors import TaskError
from pike.search import campaign
from pike.search.session import OptimizeResult
from pike.store import RunStore
from pike.task import Task
from tests.conftest import EXAMPLES

TASKS = EXAMPLES / "tasks"


class _Stored:
    def model_dump(self, mode: str = "json") -> dict[str, Any]:
        return {"modes": [{"mode": "eager", "stats": {"median_ms": 1.0}}]}


def _fakes(monkeypatch: pytest.MonkeyPatch, failing: str = "") -> list[tuple[str, str]]:
    steps: list[tuple[str, str]] = []
    lock = threading.Lock()

    def measure(task: Task, cfg: Any, modes: Any, **_: Any) -> _Stored:
        with lock:
            steps.append(("baseline", task.name))
        if task.name == failing:
            raise TaskError("the reference failed")
        return _Stored()

    def search(store: RunStore, task: Task, cfg: Any, replay: Any, event: Any,
               evaluations: Any) -> OptimizeResult:
        with lock:
            steps.append(("search", task.name))
        return OptimizeResult(run_dir=store.path.parent, task=task.name, best_source=None,
                              best_verdict=None, queries=0, dollars=0.0, verdicts={})

    monkeypatch.setattr(campaign, "measure_baselines", measure)
    monkeypatch.setattr(campaign, "search_task", search)
    return steps


def test_every_baseline_is_measured_before_any_search(monkeypatch: pytest.MonkeyPatch,
                                                      tmp_path: Path) -> None:
    steps = _fakes(monkeypatch)
    phases: list[tuple[str, str]] = []
    result = campaign.bench(TASKS, RunConfig(), out=tmp_path / "run", jobs=2,
                            on_event=lambda kind, **d: phases.append((d["task"], d.get("phase", kind))))
    names = [o.task for o in result.outcomes]
    assert len(names) == 3
    assert [s for s, _ in steps] == ["baseline"] * 3 + ["search"] * 3
    assert sorted(n for s, n in steps if s == "search") == sorted(names)
    for name in names:  # each task waits for a search slot once measured
        mine = [p for t, p in phases if t == name]
        assert mine[:3] == ["baseline", "waiting", "search"]
    with RunStore.open(tmp_path / "run") as store:
        assert all(store.get_state(n, "baseline") for n in names)

    # resumed: measured baselines are kept, nothing is measured again
    steps.clear()
    with RunStore.open(tmp_path / "run") as store:
        store.set_state(names[0], "done", None)
    campaign.bench(None, resume=tmp_path / "run", jobs=2)
    assert steps == [("search", names[0])]


def test_a_task_whose_reference_fails_in_its_baseline_is_done_with_its_error(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    failing = "2_ConvBlock"
    steps = _fakes(monkeypatch, failing=failing)
    result = campaign.bench(TASKS, RunConfig(), out=tmp_path / "run", jobs=1)
    assert ("search", failing) not in steps
    outcome = next(o for o in result.outcomes if o.task == failing)
    assert outcome.error == "the reference failed"
    assert all(o.error is None for o in result.outcomes if o.task != failing)
    with RunStore.open(tmp_path / "run") as store:
        assert store.get_state(failing, "done") is True
        assert store.get_state(failing, "baseline") is None


def test_with_several_gpus_each_tasks_baselines_are_measured_on_one_all_at_once(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """`--devices`: the baseline phase is not one task after another on the first GPU."""
    import time
    from types import SimpleNamespace

    _fakes(monkeypatch)
    where: dict[str, str] = {}
    at_once: list[int] = []
    running = [0]
    lock = threading.Lock()

    def measure(task: Task, cfg: RunConfig, modes: Any, **_: Any) -> _Stored:
        with lock:
            where[task.name] = cfg.eval.device or ""
            running[0] += 1
            at_once.append(running[0])
        time.sleep(0.1)
        with lock:
            running[0] -= 1
        return _Stored()

    monkeypatch.setattr(campaign, "measure_baselines", measure)
    # the searches are faked: no evaluation pool on GPUs this host may not have
    monkeypatch.setattr(campaign, "make_pool", lambda cfg: SimpleNamespace(close=lambda: None))
    cfg = RunConfig()
    cfg.eval.devices = ["cuda:0", "cuda:1"]
    campaign.bench(TASKS, cfg, out=tmp_path / "run", jobs=1)
    assert set(where.values()) == {"cuda:0", "cuda:1"} and len(where) == 3
    assert max(at_once) == 2  # one per GPU, though the campaign runs one task at a time


@pytest.mark.parametrize(("jobs", "device", "devices", "asked", "expected"), [
    (2, "cuda", [], "auto", "on"),  # two tasks' baselines on one GPU: each build alone
    (1, "cuda", [], "auto", "off"),  # stops the other; one at a time: nobody waits
    (1, None, ["cuda:0", "cuda:1"], "auto", "off"),  # one per GPU
    (3, None, ["cuda:0", "cuda:1"], "auto", "on"),
    (2, "cpu", [], "auto", "off"),  # no device lock on the CPU: nothing waits
    (2, "cuda", [], "off", "off"),  # what the user set stands
    (1, "cpu", [], "on", "on"),
])
def test_autotuning_modes_are_pre_built_where_baselines_share_a_gpu(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, jobs: int, device: str | None,
        devices: list[str], asked: str, expected: str) -> None:
    from types import SimpleNamespace

    _fakes(monkeypatch)
    seen: list[str] = []

    def measure(task: Task, cfg: RunConfig, modes: Any, **_: Any) -> _Stored:
        seen.append(cfg.eval.prebuild_autotune)
        return _Stored()

    monkeypatch.setattr(campaign, "measure_baselines", measure)
    monkeypatch.setattr(campaign, "make_pool", lambda cfg: SimpleNamespace(close=lambda: None))
    cfg = RunConfig()
    cfg.eval.device, cfg.eval.devices = device, devices
    cfg.eval.prebuild_autotune = asked  # type: ignore[assignment]
    campaign.bench(TASKS, cfg, out=tmp_path / "run", jobs=jobs)
    assert seen == [expected] * 3
