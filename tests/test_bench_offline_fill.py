"""bench/offline.py --fill-compile and bench/retime_offline.py, run as a user runs them."""

from __future__ import annotations

import json
import platform
import subprocess
import sys
from pathlib import Path

import pytest

from pike.solution_set import read_set

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples" / "tasks"


def _bench(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=600)


def _results(path: Path, compile_modes: dict) -> None:
    row = {"task": "1_GeluMLP", "compile": compile_modes, "best_compile_speedup": None,
           "eager_ms": 0.1, "offline_idea": "inference_mode", "offline_speedup": 1.1,
           "offline_ms": 0.09, "verdicts": {"ok": 1}, "seconds": 1.0}
    path.write_text(json.dumps({
        "benchmark": "offline", "device": "cpu", "device_name": "", "torch_version": "x",
        "host": "h", "date": "d", "command": "python bench/offline.py examples/tasks",
        "runs": "/tmp", "jobs": 1, "workers": 1, "max_candidates": 1, "max_seconds": 1.0,
        "baselines": "offline", "rows": [row], "not_run": [],
        "notes": ["kept across calls"]}))


@pytest.mark.slow
def test_fill_compile_judges_modes_without_a_verdict_and_keeps_wrong_ones(
        tmp_path: Path) -> None:
    results = tmp_path / "offline-t.json"
    _results(results, {
        "compile:default": {"speedup": None,
                            "error": "timeout: no progress for 300 s in phase 'check'"},
        "compile:max-autotune-no-cudagraphs": {"speedup": None, "error": "incorrect: 1 of 5"}})
    data = json.loads(results.read_text())
    data["device_name"] = platform.processor() or "cpu"  # what bench/common.py names a CPU
    results.write_text(json.dumps(data))
    done = _bench("bench/offline.py", str(EXAMPLES), "--ids", "1", "--device", "cpu",
                  "--resume", "--fill-compile", "--fill-limit", "120", "--tag", "t",
                  "--out", str(tmp_path))
    assert done.returncode == 0, done.stderr[-2000:]
    after = json.loads(results.read_text())
    modes = after["rows"][0]["compile"]
    assert modes["compile:default"]["filled"]["limit_s"] == 120
    assert modes["compile:reduce-overhead"]["filled"]  # never judged before
    assert modes["compile:max-autotune-no-cudagraphs"] == {"speedup": None,
                                                            "error": "incorrect: 1 of 5"}
    assert after["notes"] == ["kept across calls"]
    assert "judged again by `--fill-compile`" in (tmp_path / "offline-t.md").read_text()


def test_fill_compile_needs_resume(tmp_path: Path) -> None:
    done = _bench("bench/offline.py", str(EXAMPLES), "--device", "cpu", "--fill-compile",
                  "--out", str(tmp_path))
    assert done.returncode != 0 and "--resume" in done.stderr


def test_retime_judges_the_best_again_beside_the_benchs_figure(tmp_path: Path) -> None:
    results = tmp_path / "offline.json"
    _results(results, {})
    done = _bench("bench/retime_offline.py", str(results), str(EXAMPLES), "--ids", "1",
                  "--device", "cpu", "--tag", "t", "--out", str(tmp_path))
    assert done.returncode == 0, done.stderr[-2000:]
    row = json.loads((tmp_path / "retime-t.json").read_text())["rows"][0]
    assert row["status"] == "ok" and row["speedup_alone"] > 0
    assert row["speedup_in_bench"] == 1.1 and row["idea"] == "inference_mode"


@pytest.mark.slow
def test_redo_runs_named_tasks_again_and_keeps_the_rest(tmp_path: Path) -> None:
    results = tmp_path / "offline-t.json"
    _results(results, {})
    data = json.loads(results.read_text())
    data["device_name"] = platform.processor() or "cpu"
    data["rows"].append({**data["rows"][0], "task": "2_ConvBlock", "offline_idea": "kept"})
    data["rows"][0]["offline_idea"] = "stale"
    results.write_text(json.dumps(data))
    done = _bench("bench/offline.py", str(EXAMPLES), "--ids", "1,2", "--device", "cpu",
                  "--resume", "--redo", "1", "--max-candidates", "2", "--max-seconds", "60",
                  "--tag", "t", "--out", str(tmp_path))
    assert done.returncode == 0, done.stderr[-2000:]
    rows = {r["task"]: r for r in json.loads(results.read_text())["rows"]}
    assert rows["1_GeluMLP"]["offline_idea"] != "stale" and "settings" in rows["1_GeluMLP"]
    assert rows["2_ConvBlock"]["offline_idea"] == "kept"
    # the files behind the new row, as a solution set pike audit reads
    manifest = read_set(tmp_path / "offline-t-set")
    assert [e.task for e in manifest.tasks] == ["1_GeluMLP"]
    entry = manifest.tasks[0]
    assert entry.status == "ok" and entry.speedup_vs_eager == pytest.approx(
        rows["1_GeluMLP"]["offline_speedup"])


def test_a_redo_cut_off_before_the_task_ran_keeps_its_old_row(tmp_path: Path) -> None:
    results = tmp_path / "offline-t.json"
    _results(results, {})
    data = json.loads(results.read_text())
    data["device_name"] = platform.processor() or "cpu"
    results.write_text(json.dumps(data))
    # --start-before 0: the call ends before any task starts, as a call cut off early does
    done = _bench("bench/offline.py", str(EXAMPLES), "--ids", "1", "--device", "cpu",
                  "--resume", "--redo", "1", "--start-before", "0", "--tag", "t",
                  "--out", str(tmp_path))
    assert done.returncode == 0, done.stderr[-2000:]
    after = json.loads(results.read_text())
    assert [r["task"] for r in after["rows"]] == ["1_GeluMLP"]
    assert after["rows"][0]["offline_idea"] == "inference_mode"
    assert after["redo_pending"] == ["1_GeluMLP"] and after["not_run"] == []
    assert "not run again yet" in (tmp_path / "offline-t.md").read_text()
    # a later --resume goes on with the redo, named again or not
    again = _bench("bench/offline.py", str(EXAMPLES), "--ids", "1", "--device", "cpu",
                   "--resume", "--start-before", "0", "--tag", "t", "--out", str(tmp_path))
    assert again.returncode == 0, again.stderr[-2000:]
    assert json.loads(results.read_text())["redo_pending"] == ["1_GeluMLP"]


def test_a_redo_that_fails_keeps_the_good_row(tmp_path: Path) -> None:
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    source = (EXAMPLES / "1_GeluMLP.py").read_text()
    (tasks / "1_GeluMLP.py").write_text(source.replace(
        "def get_inputs():", "def get_inputs():\n    raise RuntimeError('broken since')", 1))
    results = tmp_path / "offline-t.json"
    _results(results, {})
    data = json.loads(results.read_text())
    data["device_name"] = platform.processor() or "cpu"
    results.write_text(json.dumps(data))
    done = _bench("bench/offline.py", str(tasks), "--device", "cpu", "--resume", "--redo", "1",
                  "--max-candidates", "1", "--tag", "t", "--out", str(tmp_path))
    assert done.returncode == 0, done.stderr[-2000:]
    row = json.loads(results.read_text())["rows"][0]
    assert row["offline_speedup"] == 1.1 and "error" not in row
    assert "broken since" in row["redo_error"]


def test_refill_judges_again_only_timeouts_filled_with_fewer_compile_threads() -> None:
    sys.path.insert(0, str(ROOT / "bench"))
    from offline import missing_modes

    timeout = "timeout: no progress for 300 s in phase 'load'"
    row = {"compile": {
        "compile:default": {"speedup": None, "error": timeout, "filled": {"limit_s": 300}},
        "compile:max-autotune-no-cudagraphs": {
            "speedup": None, "error": timeout, "filled": {"limit_s": 420, "compile_threads": 4}},
        "compile:reduce-overhead": {"speedup": None, "error": "incorrect: 3 of 5",
                                    "filled": {"limit_s": 300}}}}
    assert missing_modes(row) == []  # a filled timeout is a verdict
    assert missing_modes(row, compile_threads=4) == ["compile:default"]
    assert missing_modes(row, compile_threads=8) == ["compile:default",
                                                     "compile:max-autotune-no-cudagraphs"]


def test_redo_keeps_compile_modes_judged_alone_where_the_new_search_has_no_speedup() -> None:
    sys.path.insert(0, str(ROOT / "bench"))
    from offline import keep_filled

    filled = {"limit_s": 400, "compile_threads": 4}
    before = {"task": "t", "compile": {
        "compile:default": {"speedup": 3.0, "error": None, "filled": filled},
        "compile:reduce-overhead": {"speedup": 6.6, "error": None, "filled": filled},
        "compile:max-autotune-no-cudagraphs": {"speedup": 1.5, "error": None}}}
    row = {"task": "t", "offline_speedup": 2.75, "compile": {
        "compile:default": {"speedup": 2.75, "error": None},
        "compile:reduce-overhead": {"speedup": None, "error": "rejected: left processes"},
        "compile:max-autotune-no-cudagraphs": {"speedup": None, "error": "timeout: 300 s"}}}
    keep_filled(row, before)
    assert row["compile"]["compile:default"]["speedup"] == 2.75  # the new search's own
    assert row["compile"]["compile:reduce-overhead"]["speedup"] == 6.6  # judged alone
    assert row["compile"]["compile:reduce-overhead"]["kept_from_before_redo"]
    assert row["compile"]["compile:max-autotune-no-cudagraphs"]["speedup"] is None  # not filled
    assert row["best_compile_speedup"] == 6.6
    assert row["offline_vs_best_compile"] == 2.75 / 6.6


def test_a_mode_rejected_for_exiting_compile_workers_is_judged_again() -> None:
    sys.path.insert(0, str(ROOT / "bench"))
    from offline import missing_modes

    row = {"compile": {
        "compile:default": {"speedup": None, "error": "rejected: left processes running "
                                                      "after it finished: python3 (pid 1)"},
        "compile:max-autotune-no-cudagraphs": {"speedup": None,
                                               "error": "rejected: opened a socket"},
        "compile:reduce-overhead": {"speedup": 2.0, "error": None}}}
    assert missing_modes(row) == ["compile:default"]


def test_a_fill_cut_by_an_interrupt_keeps_only_the_modes_judged_before_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import argparse

    sys.path.insert(0, str(ROOT / "bench"))
    import offline

    from pike.config import RunConfig
    from pike.evaluate.verdict import Verdict
    from pike.task import Task

    class InterruptedPool:
        """The first mode is judged; then Ctrl-C kills the children of the others."""

        def __init__(self, *args: object, **kwargs: object) -> None:
            pass

        def judge_many(self, task: Task, sources: list[str]):
            yield 0, Verdict(status="ok", speedup=1.5)
            offline.STOPPING.set()
            yield 1, Verdict(status="crashed", message="killed by signal SIGKILL")
            raise RuntimeError("the reference child was killed too")

        def close(self) -> None:
            pass

    monkeypatch.setattr(offline, "LocalPool", InterruptedPool)
    row = {"task": "1_GeluMLP", "compile": {}, "eager_ms": 1.0}
    saved: list[dict] = []
    md = tmp_path / "offline.md"
    md.write_text("")
    args = argparse.Namespace(refill_timeouts=False, fill_modes=None, start_before=None,
                              fill_limit=60.0, jobs=1)
    offline._fill(args, [Task.from_file(EXAMPLES / "1_GeluMLP.py")], [row], RunConfig(),
                  lambda: saved.append(json.loads(json.dumps(row))), md)
    judged = [m for m, e in row["compile"].items()]
    assert len(judged) == 1 and row["compile"][judged[0]]["speedup"] == 1.5
    assert "fill_error" not in row
    assert saved and saved[-1] == row


def test_an_interrupted_benchmark_ends_with_one_line_not_a_traceback(
        capsys: pytest.CaptureFixture[str]) -> None:
    sys.path.insert(0, str(ROOT / "bench"))
    from common import run_script

    def interrupted() -> int:
        raise KeyboardInterrupt

    with pytest.raises(SystemExit) as ended:
        run_script(interrupted)
    assert ended.value.code == 130
    err = capsys.readouterr().err
    assert err.startswith("interrupted:") and "--resume" in err and "Traceback" not in err
