"""bench/baseline_phase.py: a baseline phase's cost with and without pre-built autotuning
modes; each setting measured in its own build cache, the tasks `--jobs` at once."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from pike.config import RunConfig
from pike.evaluate.baseline import Baseline, ModeTiming
from tests.conftest import bench_script


@pytest.fixture(scope="module")
def phase() -> ModuleType:
    return bench_script("baseline_phase")


def test_each_setting_s_figures_come_from_its_own_measurement(
        phase: ModuleType, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from pike.task import load_tasks

    seen: list[tuple[str, str, Any]] = []

    def measure(task: Any, cfg: RunConfig, modes: list[str]) -> Baseline:
        setting = cfg.eval.prebuild_autotune
        seen.append((task.name, setting, cfg.eval.build_cache))
        pre = 20.0 if setting == "on" else None
        return Baseline(task=task.name, task_path="t.py", task_sha256="x", device="cpu",
                        device_name="cpu", torch_version="t", host="h", date="d", modes=[
                            ModeTiming(mode="eager", build_s=0.1),
                            ModeTiming(mode="compile:max-autotune-no-cudagraphs",
                                       build_s=25.0, prebuild_s=pre)])

    monkeypatch.setattr(phase, "measure_baselines", measure)
    tasks = load_tasks(Path(__file__).resolve().parent.parent / "examples" / "tasks")[:2]
    cfg = RunConfig()
    cfg.eval.device = "cpu"
    found = {}
    for setting in ("off", "on"):
        run = cfg.model_copy(deep=True)
        run.eval.prebuild_autotune = setting  # type: ignore[assignment]
        run.eval.build_cache = tmp_path / setting
        found[setting] = phase.measure_phase(tasks, run, jobs=2)
    # the setting asked for reaches every task, each setting in its own build cache
    assert sorted(s for _, s, _ in seen) == ["off", "off", "on", "on"]
    assert {c for _, s, c in seen if s == "on"} == {tmp_path / "on"}
    modes = {s: [m for t in r["tasks"] for m in t["modes"]] for s, r in found.items()}
    assert sum(map(phase.alone_seconds, modes["off"])) == pytest.approx(50.0)
    assert sum(map(phase.alone_seconds, modes["on"])) == pytest.approx(10.0)
    data = {"device": "cpu", "device_name": "cpu", "torch_version": "t", "date": "d",
            "command": "c", "jobs": 2, "task_names": [t.name for t in tasks],
            "modes": ["eager", "compile:max-autotune-no-cudagraphs"], "settings": found}
    text = phase.render(data)
    assert "| off | " in text and "| 50.0 | 0.0 | 0 |" in text
    assert "| 10.0 | 40.0 | 0 |" in text
    assert f"| {tasks[0].name} | compile:max-autotune-no-cudagraphs | 25.0 (25.0); - | " \
           "25.0 (5.0); - |" in text
