"""bench/floor.py --remerge: the merged columns of a floor results file come again from a
later offline benchmark's results, on the stored measurement, with no GPU and no task."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests.conftest import bench_script

MERGED = " (offline bench)"
MEASURED = {"device": "cuda", "device_name": "Fake H100", "torch_version": "9.9.9",
            "host": "gpu-host", "date": "2026-01-02T03:04:05+00:00",
            "command": "python bench/floor.py tasks --modes none --tag t"}


@pytest.fixture(scope="module")
def bench_floor() -> ModuleType:
    return bench_script("floor")


def floor_row(task: str, eager_ms: float, floor_ms: float) -> dict:
    return {"task": task, "floor_ms": floor_ms, "bound": "memory", "flops": 1e6,
            "bytes_min": 1e6, "modes_ms": {"eager": eager_ms},
            "modes_x_floor": {"eager": eager_ms / floor_ms,
                              "compile:default" + MERGED: 123.0, "offline" + MERGED: 45.0}}


def write_inputs(tmp_path: Path) -> Path:
    """A floor file measured with an older offline file, and a newer offline file."""
    rows = [floor_row("1_A", 0.2, 0.01), floor_row("2_B", 0.5, 0.1),
            {"task": "3_C", "error": "baseline: boom"}]
    (tmp_path / "floor-t.json").write_text(json.dumps(
        {"benchmark": "floor", **MEASURED, "earlier_calls": ["python first call"],
         "rows": rows, "not_run": [], "note": "recovered from a log"}))
    offline = {"rows": [
        {"task": "1_A", "offline_speedup": 4.0, "compile": {
            "compile:default": {"speedup": 2.0, "error": None},
            "compile:reduce-overhead": {"speedup": 5.0, "error": None,
                                        "filled": {"limit_s": 300.0, "date": "2026-11-24"}},
            "compile:max-autotune-no-cudagraphs": {"speedup": None, "error": "timeout",
                                                   "filled": {"limit_s": 300.0}}}},
        {"task": "2_B", "offline_speedup": None, "compile": {}},
        {"task": "3_C", "offline_speedup": 3.0, "compile": {}}]}
    (tmp_path / "offline.json").write_text(json.dumps(offline))
    return tmp_path / "offline.json"


def test_remerge_replaces_the_merged_columns_only(bench_floor: ModuleType, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    offline = write_inputs(tmp_path)
    command = ["bench/floor.py", str(tmp_path / "no-tasks-here"), "--remerge",
               "--offline-results", str(offline), "--tag", "t", "--out", str(tmp_path)]
    monkeypatch.setattr(sys, "argv", command)
    assert bench_floor.main() == 0
    result = json.loads((tmp_path / "floor-t.json").read_text())
    rows = {r["task"]: r for r in result["rows"]}
    assert rows["1_A"]["modes_x_floor"] == pytest.approx({
        "eager": 20.0, "compile:default" + MERGED: 0.2 / 2.0 / 0.01,
        "compile:reduce-overhead" + MERGED: 0.2 / 5.0 / 0.01,
        "offline" + MERGED: 0.2 / 4.0 / 0.01})
    assert rows["2_B"]["modes_x_floor"] == {"eager": 5.0}  # its old merged columns are gone
    assert rows["3_C"] == {"task": "3_C", "error": "baseline: boom"}
    assert {k: result[k] for k in MEASURED} == MEASURED
    assert result["earlier_calls"] == ["python first call"]
    assert result["note"] == "recovered from a log"
    assert result["remerged"]["offline_results"] == str(offline)
    assert result["tasks_x_floor"] == {"eager": 2, "compile:default" + MERGED: 1,
                                       "compile:reduce-overhead" + MERGED: 1,
                                       "offline" + MERGED: 1}
    assert result["geomean_x_floor"]["eager"] == pytest.approx(10.0)
    md = (tmp_path / "floor-t.md").read_text()
    assert "Fake H100" in md and MEASURED["date"] in md
    assert f"re-merged from {offline}" in md and "(no new measurement)" in md
    assert "123x" not in md and "45x" not in md


CACHE_TASK = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("cache", torch.randn(4096, 256))

    def forward(self, q):
        return q @ self.cache[:{rows}].t()


def get_inputs():
    return [torch.randn(1, 256)]


def get_init_inputs():
    return []
"""


def test_recount_counts_bytes_again_and_rescales_the_multiples(
        bench_floor: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from pike.floor import count_work, floor
    from pike.task import Task

    tasks = tmp_path / "tasks"
    tasks.mkdir()
    (tasks / "1_Decode.py").write_text(CACHE_TASK.format(rows=64))
    (tasks / "2_Other.py").write_text(CACHE_TASK.format(rows=128))
    device = "NVIDIA H100 80GB HBM3"
    now = floor(count_work(Task.from_file(tasks / "1_Decode.py")), device)
    assert now is not None and now.bound == "memory"
    old_ms = 4096 * 256 * 4 / 3.35e12 * 1e3  # the whole cache at the H100's bandwidth
    old = {"task": "1_Decode", "flops": 2 * 64 * 256, "bytes_min": 4096 * 256 * 4,
           "floor_ms": old_ms, "bound": "memory", "modes_ms": {"eager": 0.01},
           "modes_x_floor": {"eager": 0.01 / old_ms, "offline" + MERGED: 0.005 / old_ms}}
    other = {**old, "task": "2_Other", "flops": 999}  # counted from another program
    (tmp_path / "floor-t.json").write_text(json.dumps(
        {"benchmark": "floor", **MEASURED, "device_name": device, "earlier_calls": [],
         "rows": [old, other], "not_run": []}))
    monkeypatch.setattr(sys, "argv", ["bench/floor.py", str(tasks), "--recount", "--tag", "t",
                                      "--out", str(tmp_path)])
    assert bench_floor.main() == 0
    result = json.loads((tmp_path / "floor-t.json").read_text())
    rows = {r["task"]: r for r in result["rows"]}
    decode = rows["1_Decode"]
    assert decode["bytes_min"] == (256 + 64 * 256 + 64) * 4  # q, the slice read, the output
    assert decode["floor_ms"] == pytest.approx(now.ms)
    assert decode["modes_x_floor"] == pytest.approx(
        {"eager": 0.01 / now.ms, "offline" + MERGED: 0.005 / now.ms})
    assert decode["modes_ms"] == {"eager": 0.01}  # the measurement stays
    assert "count again on the device" in rows["2_Other"]["recount_error"]
    assert rows["2_Other"]["floor_ms"] == old_ms
    assert result["recounted"]["not_recounted"] == ["2_Other"]
    assert result["date"] == MEASURED["date"]
    assert "not counted again" in (tmp_path / "floor-t.md").read_text()
    result["recounted"]["notes"] = ["2_Other was counted on the GPU"]  # added by hand
    assert "- 2_Other was counted on the GPU" in bench_floor.markdown(result)


CONV_TASK = """
import torch


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(256, 256, 3, padding=1, bias=False)

    def forward(self, x):
        return self.conv(x)


def get_inputs():
    return [torch.randn(8, 256, 64, 64)]


def get_init_inputs():
    return []
"""


def test_recount_takes_up_the_floors_tf32_convolutions(
        bench_floor: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A row written when the floor counted an fp32 task's convolutions at the CUDA-core
    peak: the same FLOPs, a lower compute floor now, the multiples scaled up with it."""
    from pike.floor import count_work, floor
    from pike.task import Task

    tasks = tmp_path / "tasks"
    tasks.mkdir()
    (tasks / "1_Conv.py").write_text(CONV_TASK)
    device = "NVIDIA H100 80GB HBM3"
    work = count_work(Task.from_file(tasks / "1_Conv.py"))
    now = floor(work, device)
    assert now is not None and now.bound == "compute" and now.tf32_flops == work.flops
    old_ms = work.flops / 67e12 * 1e3  # every FLOP at the fp32 peak, as it was
    row = {"task": "1_Conv", "flops": work.flops, "bytes_min": work.bytes_min,
           "floor_ms": old_ms, "bound": "compute", "modes_ms": {"eager": 1.0},
           "modes_x_floor": {"eager": 1.0 / old_ms}}
    (tmp_path / "floor-t.json").write_text(json.dumps(
        {"benchmark": "floor", **MEASURED, "device_name": device, "earlier_calls": [],
         "rows": [row], "not_run": []}))
    monkeypatch.setattr(sys, "argv", ["bench/floor.py", str(tasks), "--recount", "--tag", "t",
                                      "--out", str(tmp_path)])
    assert bench_floor.main() == 0
    out = json.loads((tmp_path / "floor-t.json").read_text())["rows"][0]
    assert "recount_error" not in out
    assert out["floor_ms"] == pytest.approx(now.ms) and now.ms < old_ms / 7
    assert out["modes_x_floor"]["eager"] == pytest.approx(1.0 / now.ms)
    # the same FLOPs counted as another dtype class than the device's (a half-precision
    # row, whose floor is its tensor-core one): refused, as other FLOPs are
    half = {**row, "floor_ms": now.lowp_ms, "lowp_floor_ms": now.lowp_ms}
    refused = bench_floor.recounted_row(half, Task.from_file(tasks / "1_Conv.py"), device)
    assert "count again on the device" in refused["recount_error"]
    assert refused["floor_ms"] == now.lowp_ms


@pytest.mark.parametrize("has_cuda, expected", [(True, "cuda"), (False, "cpu")])
def test_recount_of_a_task_that_reads_values_counts_on_the_gpu_where_there_is_one(
        bench_floor: ModuleType, monkeypatch: pytest.MonkeyPatch, has_cuda: bool,
        expected: str) -> None:
    from pike.errors import TaskError
    from pike.floor import Work

    tried: list[str] = []

    def count_work(task: object, device: str, seed: int, on_device: bool = False) -> Work:
        tried.append(device)
        if device == "meta":
            raise TaskError("reads tensor values")
        raise RuntimeError(f"counted on {device}")  # stops here: only the order matters

    monkeypatch.setattr("pike.work_count.count_work", count_work)
    monkeypatch.setattr(bench_floor.torch.cuda, "is_available", lambda: has_cuda)
    row = {"task": "1_A", "floor_ms": 0.1, "bound": "memory", "flops": 1}
    out = bench_floor.recounted_row(row, object(), "NVIDIA H100 80GB HBM3")
    assert tried == ["meta", expected]
    assert out["recount_error"] == f"counted on {expected}" and out["floor_ms"] == 0.1


def test_a_resumed_call_on_some_ids_keeps_the_others_as_they_were(
        bench_floor: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    for name in ("1_A", "2_B", "3_C"):
        (tasks / f"{name}.py").write_text(CACHE_TASK.format(rows=64))
    for name in ("4_D", "10_E"):
        (tasks / f"{name}.py").write_text(CACHE_TASK.format(rows=64))
    (tmp_path / "floor-t.json").write_text(json.dumps(
        {"benchmark": "floor", **MEASURED, "earlier_calls": [],
         "rows": [floor_row("1_A", 0.2, 0.01), {"task": "4_D", "error": "baseline: OOM"},
                  {"task": "10_E", "error": "baseline: no diffusers"}],
         "not_run": ["2_B", "3_C"], "notes": ["written by hand"]}))
    runs_dirs: set[Path] = set()

    def one_task(task: Any, cfg: Any, offline: bool, runs: Path) -> dict:
        runs_dirs.add(runs)
        return floor_row(task.name, 0.5, 0.1)

    monkeypatch.setattr(bench_floor, "one_task", one_task)
    monkeypatch.setattr(sys, "argv", ["bench/floor.py", str(tasks), "--ids", "4,2", "--resume",
                                      "--modes", "none", "--tag", "t", "--out", str(tmp_path)])
    assert bench_floor.main() == 0
    result = json.loads((tmp_path / "floor-t.json").read_text())
    assert [r["task"] for r in result["rows"]] == ["1_A", "2_B", "4_D", "10_E"]
    assert result["rows"][-1]["error"] == "baseline: no diffusers"  # not selected: kept
    assert "error" not in result["rows"][2]  # selected: ran again
    assert result["not_run"] == ["3_C"]
    assert result["notes"] == ["written by hand"]
    assert "- Note: written by hand" in (tmp_path / "floor-t.md").read_text()
    # the offline searches' runs are kept beside the figures, not in a temp dir left behind
    assert runs_dirs == {tmp_path / "floor-t-runs"}
