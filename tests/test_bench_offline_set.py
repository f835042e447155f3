"""bench/offline_set.py: an offline benchmark's results JSON kept as a pike solution set
that `read_set` accepts, with each task's state and the benchmark's claims."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType

import pytest

from pike.agents.offline import named_in
from pike.solution_set import read_set
from tests.conftest import EXAMPLES

BENCH = Path(__file__).resolve().parent.parent / "bench"
TASKS = EXAMPLES / "tasks"


@pytest.fixture
def offline_set(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(BENCH))  # the script imports its `common`
    spec = importlib.util.spec_from_file_location("bench_offline_set", BENCH / "offline_set.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _results(tmp_path: Path, rows: list[dict]) -> Path:
    path = tmp_path / "offline-x.json"
    path.write_text(json.dumps({"device": "cuda", "device_name": "GPU", "torch_version": "2",
                                "date": "2026-11-27", "rows": rows}))
    return path


def test_every_task_gets_an_entry_and_the_best_its_rendered_file(
        offline_set: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    results = _results(tmp_path, [
        {"task": "1_GeluMLP", "offline_idea": "cuda_graph + inference_mode",
         "offline_speedup": 2.0, "compile": {"compile:default": {"speedup": 1.6},
                                             "compile:reduce-overhead": {"speedup": None}},
         "settings": {"device_name": "NVIDIA H100", "date": "2026-11-24"}},
        {"task": "2_ConvBlock", "offline_idea": None, "error": "baseline: reference failed"},
        {"task": "9_Gone", "offline_idea": "tf32"},  # a task no longer in the folder
    ])
    out = tmp_path / "set"
    manifest = offline_set.write(results, TASKS, out)
    assert read_set(out) == manifest  # the set pike audit reads
    entries = {e.task: e for e in manifest.tasks}
    ok = entries["1_GeluMLP"]
    assert (ok.status, ok.file, ok.speedup_vs_eager) == ("ok", "1_GeluMLP.py", 2.0)
    assert ok.compile_speedups == {"compile:default": pytest.approx(1.25)}
    assert ok.device_name == "NVIDIA H100" and "cuda_graph + inference_mode" in ok.detail
    assert named_in((out / "1_GeluMLP.py").read_text()) == ["inference_mode", "cuda_graph"]
    assert (entries["2_ConvBlock"].status, entries["2_ConvBlock"].file) == ("error", None)
    assert "reference failed" in entries["2_ConvBlock"].detail
    assert entries["3_CausalAttention"].status == "no_candidates"  # never run
    assert manifest.claimed_geomean == pytest.approx(2.0 ** (1 / 3))
    assert "9_Gone" in capsys.readouterr().err
    with pytest.raises(SystemExit, match="not an empty folder"):
        offline_set.write(results, TASKS, out)


def test_a_best_slower_than_eager_keeps_the_reference_as_pike_sets_do(
        offline_set: ModuleType, tmp_path: Path) -> None:
    results = _results(tmp_path, [{"task": "1_GeluMLP", "offline_idea": "tf32",
                                   "offline_speedup": 0.8}])
    manifest = offline_set.write(results, TASKS, tmp_path / "set")
    slower = manifest.tasks[0]
    assert (slower.task, slower.status, slower.file) == ("1_GeluMLP", "slower", None)
    assert "0.8x of eager" in slower.detail and "reference is kept" in slower.detail
    assert not (tmp_path / "set" / "1_GeluMLP.py").exists()
    assert manifest.claimed_geomean == pytest.approx(1.0) and manifest.version == 2
    assert read_set(tmp_path / "set") == manifest


def test_a_transformation_this_agent_does_not_know_is_refused(
        offline_set: ModuleType, tmp_path: Path) -> None:
    results = _results(tmp_path, [{"task": "1_GeluMLP", "offline_idea": "cuda_graph + fp8",
                                   "offline_speedup": 9.0}])
    with pytest.raises(SystemExit, match="no transformation fp8"):
        offline_set.write(results, TASKS, tmp_path / "set")
    assert not (tmp_path / "set").exists()
