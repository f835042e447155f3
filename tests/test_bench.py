"""`pike bench`, `show`, `export` and `report` end to end: two example tasks, the fake LLM
server, a kill mid-campaign (the second task's search not started yet), a resume, and the report
opened in a headless browser."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from pike.solution_set import read_set
from pike.store import RunStore
from tests.conftest import CANDIDATES, EXAMPLES, judged_in
from tests.fake_openai import FakeOpenAI, Reply
from tests.test_optimize import GOOD, WRONG, fenced, pike, prompt_of, spec
from tests.test_report import images_loaded_in_browser

TASKS = EXAMPLES / "tasks"
NAMES = ["1_GeluMLP", "2_ConvBlock"]
SDPA = (EXAMPLES / "candidates" / "3_CausalAttention_sdpa.py").read_text()
CONV_AS_IS = (TASKS / "2_ConvBlock.py").read_text() + "\n\nclass ModelNew(Model):\n    pass\n"


class PerTask:
    """A correct reply for whichever task the prompt shows, except the second branch's
    first reply in each task, which is wrong, so the error fixer has work in every task.

    Chosen by branch, not by arrival: a kill can land after a call's budget is reserved
    but before it reaches the server; it counts as spent, so the resumed search may have
    room for one call only, the first branch's, and that one must be able to pass.
    """

    def __init__(self, delay_s: float) -> None:
        self.delay_s, self.calls = delay_s, 0
        self.per_task: dict[str, int] = {}

    def __call__(self, body: dict[str, Any]) -> Reply:
        prompt = prompt_of(body)
        if "optimization ideas" in prompt:
            return Reply(content="1. Fuse elementwise ops.\n2. Use a fused kernel.\n",
                         delay_s=self.delay_s)
        self.calls += 1
        if "NewGELU" in prompt:
            source = GOOD
        elif "softmax" in prompt:
            source = SDPA
        else:
            source = CONV_AS_IS
        if "failed the evaluator" not in prompt and "Use a fused kernel" in prompt:
            self.per_task[source] = self.per_task.get(source, 0) + 1
            if self.per_task[source] == 1:
                return Reply(content=fenced(WRONG), delay_s=self.delay_s)
        return Reply(content=fenced(source), delay_s=self.delay_s)


def bench_config(run_config: Path) -> Path:
    cfg = yaml.safe_load(run_config.read_text())
    cfg["search"]["baseline_modes"] = ["eager", "compile:default"]
    run_config.write_text(yaml.safe_dump(cfg))
    return run_config


def test_bench_survives_a_kill_and_reports_every_figure(
        fake_llm: FakeOpenAI, run_config: Path, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "160")
    fake_llm.handler = PerTask(delay_s=0.2)
    config = bench_config(run_config)
    out = tmp_path / "campaign"
    child = subprocess.Popen(
        [sys.executable, "-m", "pike", "bench", str(TASKS), "--tasks", "1,2", "--llm",
         spec(fake_llm), "--budget-queries", "4", "--jobs", "1", "--config", str(config),
         "--out", str(out)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:  # kill it once a few candidates are judged
        if (out / "run.sqlite").exists() and len(judged_in(out)) >= 3:
            break
        assert child.poll() is None, "the campaign ended before it could be killed"
        time.sleep(0.2)
    os.killpg(child.pid, signal.SIGKILL)
    child.wait()
    judged_before = judged_in(out)
    with RunStore.open(out) as store:
        assert [t["name"] for t in store.tasks()] == NAMES
        baselines_before = {n: store.get_state(n, "baseline") for n in NAMES}
        assert not all(store.get_state(n, "done") for n in NAMES)
        # baselines come first; the second task's search is the resume's, from its start
        assert not [c for c in store.candidates(NAMES[-1]) if c.verdict is not None]

    result = pike("bench", "--resume", out)
    assert result.exit_code == 0, result.output

    with RunStore.open(out) as store:
        for name in NAMES:
            assert store.get_state(name, "done") is True
            keys = [c["role"] for c in store.llm_calls(name)]
            assert len(keys) == len(set(keys))  # nothing recorded twice
            # each task's own budget, a call in flight at the kill counted as spent
            assert store.spent(name)[0] == 4
            baseline = store.get_state(name, "baseline")
            assert [m["mode"] for m in baseline["modes"]] == ["eager", "compile:default"]
            # what its children took on the host, for the next resume's gate
            assert store.get_state(name, "host_footprint")["reference"] > 50 * 2**20
            if baselines_before[name] is not None:  # measured once, kept across the resume
                assert baseline == baselines_before[name]
            best = store.best(name)
            assert best is not None and best.verdict.ok, [
                (r.id, r.role, r.verdict and r.verdict.status,
                 r.verdict and (r.verdict.message or "")[:300])
                for r in store.candidates() if r.task == name]
        for cid, verdict in judged_before.items():  # finished evaluations were not redone
            assert store.candidate(cid).verdict == verdict
        assert any(r.role == "fix" and r.verdict.ok for r in store.candidates())
    assert sorted(p.name for p in (out / "best").iterdir()) == [f"{n}.py" for n in NAMES]
    # the same files as a solution set, which pike audit takes as it is
    solutions = read_set(out / "solutions")
    assert [e.task for e in solutions.tasks] == NAMES
    for entry in solutions.tasks:
        if entry.status == "slower":  # the loaded host's best below eager: the set keeps
            assert entry.file is None and "reference is kept" in entry.detail  # the reference
            continue
        assert entry.status == "ok" and entry.file
        assert (out / "solutions" / entry.file).read_text() == (
            out / "best" / f"{entry.task}.py").read_text()
    assert not [p for p in out.iterdir() if p.name.startswith(".solutions")]

    shown = pike("show", out)
    assert shown.exit_code == 0, shown.output
    for name in NAMES:
        assert name in shown.output
    assert "recent verdicts" in shown.output

    exported = tmp_path / "gelu_best.py"
    result = pike("export", out, "1_GeluMLP", "--out", exported)
    assert result.exit_code == 0, result.output
    text = exported.read_text()
    assert text.startswith("# pike solution for 1_GeluMLP") and "verdict: ok" in text
    assert "class ModelNew" in text
    ok = pike("eval", TASKS / "1_GeluMLP.py", exported, "--device", "cpu")
    assert ok.exit_code == 0, ok.output  # the exported file is still a correct candidate

    report_dir = tmp_path / "report"
    result = pike("report", out, "--out", report_dir)
    assert result.exit_code == 0, result.output
    page = report_dir / "index.html"
    loaded, total = images_loaded_in_browser(page, tmp_path)
    assert loaded == total >= 5


def test_export_and_bench_errors_are_one_line(tmp_path: Path) -> None:
    store = RunStore.create(tmp_path / "run", {}, "test")
    store.add_task("a", "a.py", "0" * 64, "src")
    store.add_task("b", "b.py", "1" * 64, "src")
    store.close()
    result = pike("export", tmp_path / "run")
    assert result.exit_code == 2 and "name one of: a, b" in result.output
    result = pike("export", tmp_path / "run", "a")
    assert result.exit_code == 2 and "no correct candidate" in result.output
    result = pike("bench", TASKS, "--strategy", "evolve")
    assert result.exit_code == 2 and "needs a model" in result.output
    result = pike("bench", TASKS, "--tasks", "1,x")
    assert result.exit_code == 2 and "numeric task ids" in result.output
    result = pike("bench")
    assert result.exit_code == 2 and "task folder" in result.output
    assert (CANDIDATES / "fused.py").exists()


def test_ctrl_c_stops_the_campaign_without_starting_queued_tasks(
        fake_llm: FakeOpenAI, run_config: Path, tmp_path: Path) -> None:
    fake_llm.handler = PerTask(delay_s=0.2)
    cfg = yaml.safe_load(run_config.read_text())
    cfg["search"]["baseline_modes"] = ["eager"]
    run_config.write_text(yaml.safe_dump(cfg))
    out = tmp_path / "campaign"
    child = subprocess.Popen(
        [sys.executable, "-m", "pike", "bench", str(TASKS), "--llm", spec(fake_llm),
         "--budget-queries", "6", "--jobs", "1", "--config", str(run_config), "--out",
         str(out)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and not judged_in(out):
        assert child.poll() is None, "the campaign ended before it could be interrupted"
        time.sleep(0.2)
    child.send_signal(signal.SIGINT)
    _, err = child.communicate(timeout=120)
    assert child.returncode == 130, err
    assert "pike bench --resume" in " ".join(err.split())
    with RunStore.open(out) as store:  # the queued tasks never started
        assert not store.candidates("3_CausalAttention")
        assert not store.llm_calls("3_CausalAttention")


def test_resume_refuses_options_it_would_ignore(tmp_path: Path) -> None:
    result = pike("bench", "--resume", tmp_path, "--budget-queries", "9")
    assert result.exit_code == 2 and "drop --budget-queries" in result.output
    result = pike("optimize", "--resume", tmp_path, "--llm", "openai:gpt-5", "--planner")
    assert result.exit_code == 2 and "drop --llm, --planner" in result.output
    result = pike("optimize", "--replay", tmp_path, "--construct-on", "device")
    assert result.exit_code == 2 and "drop --construct-on" in result.output


def test_redo_runs_a_task_again_and_fill_baselines_measures_a_failed_mode_again(
        run_config: Path, tmp_path: Path) -> None:
    import shutil

    tasks = tmp_path / "tasks"
    tasks.mkdir()
    for name in ("1_GeluMLP.py", "3_GeluMLPAgain.py"):  # a second task, as small
        shutil.copy(TASKS / "1_GeluMLP.py", tasks / name)
    cfg = yaml.safe_load(run_config.read_text())
    cfg["search"]["baseline_modes"] = ["eager"]
    cfg["search"]["offline"] = {"max_candidates": 1}  # inference mode: no compile on CPU
    run_config.write_text(yaml.safe_dump(cfg))
    out = tmp_path / "campaign"
    done = pike("bench", tasks, "--config", run_config, "--out", out)
    assert done.exit_code == 0, done.output
    gelu, attention = "1_GeluMLP", "3_GeluMLPAgain"
    with RunStore.open(out) as store:
        first = {t: [c.id for c in store.candidates(t)] for t in (gelu, attention)}
        assert all(first.values())
        kept_baseline = store.get_state(gelu, "baseline")
        failed = dict(store.get_state(attention, "baseline"))  # type: ignore[arg-type]
        # a mode cut off beside other tasks' work, as a stored baseline can hold
        failed["modes"] = [{"mode": "eager", "error": "timed out"}]
        store.set_state(attention, "baseline", failed)

    filled = pike("bench", "--resume", out, "--fill-baselines")
    assert filled.exit_code == 0, filled.output
    with RunStore.open(out) as store:
        baseline = store.get_state(attention, "baseline")
        assert baseline["modes"][0]["stats"] and not baseline["modes"][0]["error"]  # type: ignore[index]
        assert store.get_state(gelu, "baseline") == kept_baseline  # no gap: not measured again
        assert {t: [c.id for c in store.candidates(t)] for t in first} == first

    redone = pike("bench", "--resume", out, "--redo", "1")
    assert redone.exit_code == 0, redone.output
    with RunStore.open(out) as store:
        again = [c.id for c in store.candidates(gelu)]
        assert again and min(again) > max(first[attention] + first[gelu])  # all new
        assert store.get_state(gelu, "done") is True
        assert store.get_state(gelu, "baseline") != kept_baseline  # measured again
        assert [c.id for c in store.candidates(attention)] == first[attention]
    assert (out / "solutions" / "manifest.json").exists()

    unknown = pike("bench", "--resume", out, "--redo", "7")
    assert unknown.exit_code == 2 and "no such task in this campaign" in unknown.output
    with RunStore.open(out) as store:
        assert [c.id for c in store.candidates(gelu)] == again  # nothing dropped
    alone = pike("bench", tasks, "--redo", "1")
    assert alone.exit_code == 2 and "give --resume RUN_DIR" in alone.output
