"""`pike optimize` end to end: real openai SDK, a fake OpenAI-compatible server, CPU."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from pike.agents.prompt import estimate_tokens
from pike.cli import app
from pike.errors import StoreError
from pike.evaluate.verdict import TimingStats, Verdict
from pike.store import RunStore
from tests.conftest import CANDIDATES, EXAMPLES
from tests.fake_openai import FakeOpenAI, Reply

MLP = str(EXAMPLES / "tasks" / "1_GeluMLP.py")
GOOD = (CANDIDATES / "fused.py").read_text()
WRONG = (CANDIDATES / "wrong_values.py").read_text()
SECRET = "sk-pike-test-secret-0123456789"
# A correct candidate that fails if the parent's API key reached its environment.
LEAK_PROBE = GOOD + f'''

import os as _os
if any("{SECRET}" in v for v in _os.environ.values()):
    raise RuntimeError("the API key leaked into the candidate's environment")
'''


def fenced(source: str) -> str:
    return f"Here is the module.\n\n```python\n{source}```\n"


def prompt_of(body: dict[str, Any]) -> str:
    return body["messages"][-1]["content"]


class Scripted:
    """Replies by role: ideas to the brainstormer, code to the optimizer and the fixer."""

    def __init__(self, optimize: list[str], fix: str = GOOD, delay_s: float = 0.0) -> None:
        self.optimize, self.fix, self.delay_s = optimize, fix, delay_s
        self.optimize_calls = 0

    def __call__(self, body: dict[str, Any]) -> Reply:
        prompt = prompt_of(body)
        if "optimization ideas" in prompt:
            return Reply(content="1. Fuse the GELU into one call.\n2. Use F.gelu(tanh).\n",
                         delay_s=self.delay_s)
        if "failed the evaluator" in prompt:
            return Reply(content=fenced(self.fix), delay_s=self.delay_s)
        source = self.optimize[self.optimize_calls % len(self.optimize)]
        self.optimize_calls += 1
        return Reply(content=fenced(source) if source else "I cannot help with that.",
                     delay_s=self.delay_s)


def tokens_of(messages: list[dict[str, str]]) -> int:
    return sum(estimate_tokens(m["content"]) for m in messages)


def pike(*args: str | Path) -> Any:
    result = CliRunner().invoke(app, [str(a) for a in args])
    if result.exception and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result


def spec(fake: FakeOpenAI) -> str:
    return f"{fake.url}#fake-model"


def test_optimize_end_to_end_keeps_to_the_query_budget(fake_llm: FakeOpenAI,
                                                       run_config: Path, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PIKE_LLM_API_KEY", SECRET)
    fake_llm.handler = Scripted(optimize=[LEAK_PROBE, ""])
    out = tmp_path / "run"
    result = pike("optimize", MLP, "--llm", spec(fake_llm), "--budget-queries", "5",
                  "--config", run_config, "--out", out)
    assert result.exit_code == 0, result.output
    assert (out / "best.py").read_text() in {LEAK_PROBE.strip() + "\n", GOOD.strip() + "\n"}
    summary = json.loads((out / "summary.json").read_text())
    assert summary["queries"] == 5 == len(fake_llm.requests)
    store = RunStore.open(out)
    rows = store.candidates("1_GeluMLP")
    # the probe passed: the key in the parent's environment never reached a candidate
    assert any(r.verdict and r.verdict.ok and "leaked" in r.source for r in rows)
    # a reply without code is a recorded failed candidate, not a crash
    assert any(r.verdict and "no ```python block" in r.verdict.message for r in rows)
    keys = [c["role"] for c in store.llm_calls("1_GeluMLP")]
    assert len(keys) == len(set(keys)) == 5 and keys[0] == "brainstorm:0"
    headers = {k.lower(): v for k, v in fake_llm.requests[0]["headers"].items()}
    assert headers["authorization"] == f"Bearer {SECRET}"


def test_the_dollar_budget_is_never_exceeded_and_the_search_holds_its_bar(
        fake_llm: FakeOpenAI, run_config: Path, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    from pike.evaluate import candidate_windows, search_bar, shared_window
    from pike.task import Task

    # the bar (tests/test_search_bar.py): each timing window is told the search's best
    # so far; PIKE-B's seeds and PIKE-O's fitness take a cut-short figure as it is, the
    # best does not
    seen: list[float | None] = []
    real = candidate_windows.time_interleaved

    def spy(*args: Any, **kwargs: Any) -> None:
        best = kwargs.get("best")
        seen.append(best() if best else None)
        real(*args, **kwargs)

    monkeypatch.setattr(candidate_windows, "time_interleaved", spy)
    monkeypatch.setattr(shared_window, "time_interleaved", spy)
    fake_llm.handler = Scripted(optimize=[GOOD])
    out = tmp_path / "run"
    # each call: 100 tokens in + 50 out at $1000/Mtok = $0.15; before the first reply the
    # estimate assumes max_tokens (200) out, after it the costliest call seen
    result = pike("optimize", MLP, "--llm", spec(fake_llm), "--budget-dollars", "1.0",
                  "--config", run_config, "--out", out)
    assert result.exit_code == 0, result.output
    queries, dollars = RunStore.open(out).spent("1_GeluMLP")
    assert dollars <= 1.0 and queries == len(fake_llm.requests) >= 4
    # its first windows see no best yet, later ones the best of the verdicts before them
    assert seen[0] is None and any(b for b in seen[1:]), seen
    assert search_bar.current(Task.from_file(MLP).sha256) is None  # let go as it ended


def test_replay_reproduces_the_best_solution_without_any_llm_where_the_run_kept_its_runs(
        fake_llm: FakeOpenAI, run_config: Path, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = yaml.safe_load(run_config.read_text())
    cfg["runs_dir"] = str(tmp_path / "kept")
    run_config.write_text(yaml.safe_dump(cfg))
    # One search checks three things, each an end-to-end run of its own before: the error
    # fixer (on its own model) rescues failing candidates, every prompt's parts are
    # recorded, and a replay reproduces it all.
    fake_llm.handler = Scripted(optimize=[WRONG], fix=GOOD)
    first = tmp_path / "first"
    result = pike("optimize", MLP, "--llm", spec(fake_llm), "--fixer-llm",
                  f"{fake_llm.url}#fake-fixer", "--budget-queries", "6", "--config",
                  run_config, "--out", first)
    assert result.exit_code == 0, result.output
    store = RunStore.open(first)
    rows = {r.id: r for r in store.candidates("1_GeluMLP")}
    fixes = [r for r in rows.values() if r.role == "fix"]
    assert fixes and all(r.verdict and r.verdict.ok for r in fixes)
    assert all(rows[r.parent_id].verdict.status == "incorrect" for r in fixes)
    models = {c["role"].split(":")[0]: c["model"] for c in store.llm_calls("1_GeluMLP")}
    assert models["fix"].endswith("#fake-fixer") and models["optimize"].endswith("#fake-model")
    calls = store.llm_calls("1_GeluMLP")
    assert len(calls) == 6
    for call in calls:  # the parts of every prompt, recorded with its call
        parts = call["prompt_parts"]
        assert parts["budget"] == 12000  # LLMConfig's default
        assert parts["tokens"]["task"] > 0 and parts["tokens"]["system"] > 0
        assert sum(parts["tokens"].values()) == parts["total"] == tokens_of(call["messages"])
    first_round = [c for c in calls if c["role"].startswith("optimize:0:")]
    assert first_round and all(c["prompt_parts"]["tokens"]["step"] > 0
                               for c in first_round)  # the ideas
    fake_llm.close()  # no server from here on
    monkeypatch.chdir(tmp_path)
    result = pike("optimize", "--replay", first)  # no --out: beside the replayed run's runs
    assert result.exit_code == 0, result.output
    [again] = (tmp_path / "kept").iterdir()
    assert again.name.split("-")[0] == "1_GeluMLP"
    assert not (tmp_path / "pike-runs").exists()
    assert (again / "best.py").read_text() == (first / "best.py").read_text()
    old, new = RunStore.open(first), RunStore.open(again)
    # parallel calls finish in any order; what was asked is the same
    assert sorted(c["role"] for c in new.llm_calls("1_GeluMLP")) == \
        sorted(c["role"] for c in old.llm_calls("1_GeluMLP"))
    assert [r.verdict.status for r in new.candidates("1_GeluMLP")] == \
        [r.verdict.status for r in old.candidates("1_GeluMLP")]
    # each call's prompt parts as recorded, not counted again
    assert {c["role"]: c["prompt_parts"] for c in new.llm_calls("1_GeluMLP")} == \
        {c["role"]: c["prompt_parts"] for c in calls}


@pytest.mark.parametrize("strategy", [[], ["--preset", "openevolve"]],
                         ids=["branching", "evolve"])
def test_resume_after_kill_continues_without_double_counting(
        fake_llm: FakeOpenAI, run_config: Path, tmp_path: Path, strategy: list[str]) -> None:
    fake_llm.handler = Scripted(optimize=[WRONG, GOOD], delay_s=0.3)
    out = tmp_path / "run"
    child = subprocess.Popen(
        [sys.executable, "-m", "pike", "optimize", MLP, "--llm", spec(fake_llm),
         "--budget-queries", "8", "--config", str(run_config), "--out", str(out), *strategy],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:  # kill it once some candidates have verdicts
        if (out / "run.sqlite").exists():
            try:
                done = [r for r in RunStore.open(out).candidates("1_GeluMLP") if r.verdict]
            except StoreError:  # the run is still writing the new store's schema
                done = []
            if len(done) >= 2:
                break
        time.sleep(0.2)
    os.killpg(child.pid, signal.SIGKILL)
    child.wait()
    before = RunStore.open(out)
    calls_before = len(before.llm_calls("1_GeluMLP"))
    judged_before = {r.id: r.verdict for r in before.candidates("1_GeluMLP") if r.verdict}
    assert 0 < calls_before < 8
    result = pike("optimize", "--resume", out)
    assert result.exit_code == 0, result.output
    # its status lines count the whole run: the kept verdicts from its first line on
    assert "verdicts:" in result.output and "verdicts: none yet" not in result.output
    after = RunStore.open(out)
    keys = [c["role"] for c in after.llm_calls("1_GeluMLP")]
    assert len(keys) == len(set(keys))  # no call recorded twice
    # Calls in flight at the kill stay counted (they were sent, and may be billed): over
    # both runs the provider saw no more requests than the budget, and the store counts
    # the whole budget as spent.
    assert len(fake_llm.requests) <= 8
    assert after.spent("1_GeluMLP")[0] == 8
    for cid, verdict in judged_before.items():  # finished evaluations were not redone
        assert after.candidate(cid).verdict == verdict


def test_seeds_take_the_best_of_each_branch_first(tmp_path: Path) -> None:
    from pike.config import BranchingConfig
    from pike.search.branching import BranchingSearch, _spread

    store = RunStore.create(tmp_path / "run", {}, "test")

    def ok(ms: float) -> Verdict:
        return Verdict(status="ok", runtime=TimingStats.from_samples([ms]), speedup=1.0 / ms)

    made = {}
    for name, branch, ms in [("a1", 0, 1.0), ("a2", 0, 1.1), ("b1", 1, 2.0), ("c1", 2, 3.0)]:
        cid = store.add_candidate("t", name, parent_id=None, role="optimize", round=0,
                                  branch=branch)
        store.set_verdict(cid, ok(ms))
        made[name] = cid
    bad = store.add_candidate("t", "x", parent_id=None, role="optimize", round=0, branch=3)
    store.set_verdict(bad, Verdict(status="incorrect", message="wrong"))
    search = BranchingSearch(store, "t", querier=None, ctx=None,  # type: ignore[arg-type]
                             cfg=BranchingConfig(top_k=3), judge=None,  # type: ignore[arg-type]
                             concurrency=1)
    assert [s.source for s in search._seeds()] == ["a1", "b1", "c1"]
    search.cfg = BranchingConfig(top_k=6)
    assert [s.source for s in search._seeds()] == ["a1", "b1", "c1", "a2", None]
    assert _spread(10, 4) == [4, 3, 2, 1]
    assert sum(_spread(7, 3)) == 7 and _spread(7, 3)[0] >= _spread(7, 3)[-1]


def test_a_missing_key_is_one_line_naming_the_variable(run_config: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    result = pike("optimize", MLP, "--llm", "openai:gpt-5", "--config", run_config)
    assert result.exit_code == 2
    assert "OPENAI_API_KEY" in result.output


def test_seed_offline_starts_the_llm_search_from_the_best_offline_candidate(
        fake_llm: FakeOpenAI, run_config: Path, tmp_path: Path) -> None:
    cfg = yaml.safe_load(run_config.read_text())
    cfg["search"]["offline"] = {"max_candidates": 1}
    run_config.write_text(yaml.safe_dump(cfg))
    fake_llm.handler = Scripted(optimize=[GOOD])
    out = tmp_path / "run"
    result = pike("optimize", MLP, "--llm", spec(fake_llm), "--seed-offline",
                  "--budget-queries", "3", "--config", run_config, "--out", out)
    assert result.exit_code == 0, result.output
    rows = RunStore.open(out).candidates("1_GeluMLP")
    offline = [r for r in rows if r.role == "offline"]
    assert len(offline) == 1 and offline[0].verdict.ok
    first_optimize = next(r for r in rows if r.role == "optimize")
    assert first_optimize.parent_id == offline[0].id
    optimizer_prompts = [prompt_of(r["body"]) for r in fake_llm.requests
                         if "optimization ideas" not in prompt_of(r["body"])]
    assert "pike offline transformation" in optimizer_prompts[0]


def _set_with(tmp_path: Path, source: str) -> Path:
    folder = tmp_path / "set"
    folder.mkdir()
    (folder / "1_GeluMLP.py").write_text(source)
    return folder


def test_a_correct_set_file_seeds_every_first_round_branch(
        fake_llm: FakeOpenAI, run_config: Path, tmp_path: Path) -> None:
    fake_llm.handler = Scripted(optimize=[GOOD])
    marked = GOOD + "\n# from the solution set\n"
    out = tmp_path / "run"
    result = pike("optimize", MLP, "--llm", spec(fake_llm), "--budget-queries", "3",
                  "--config", run_config, "--out", out,
                  "--seed-from", _set_with(tmp_path, marked))
    assert result.exit_code == 0, result.output
    store = RunStore.open(out)
    seed = [r for r in store.candidates("1_GeluMLP") if r.role == "seed"]
    assert len(seed) == 1 and seed[0].verdict.ok and seed[0].idea.endswith("1_GeluMLP.py")
    first_round = [r for r in store.candidates("1_GeluMLP")
                   if r.role == "optimize" and r.round == 0]
    assert first_round and all(r.parent_id == seed[0].id for r in first_round)
    prompts = [prompt_of(r["body"]) for r in fake_llm.requests]
    assert sum("# from the solution set" in p for p in prompts) == len(first_round)


def test_a_failing_set_file_seeds_nothing_unless_the_fixer_repairs_it(
        fake_llm: FakeOpenAI, run_config: Path, tmp_path: Path) -> None:
    fake_llm.handler = Scripted(optimize=[GOOD], fix=GOOD + "\n# repaired\n")
    solutions = _set_with(tmp_path, WRONG)
    plain, fixed = tmp_path / "plain", tmp_path / "fixed"
    result = pike("optimize", MLP, "--llm", spec(fake_llm), "--budget-queries", "3",
                  "--config", run_config, "--out", plain, "--seed-from", solutions)
    assert result.exit_code == 0, result.output
    store = RunStore.open(plain)
    assert [r.verdict.status for r in store.candidates("1_GeluMLP") if r.role == "seed"] \
        == ["incorrect"]
    assert all(r.parent_id is None for r in store.candidates("1_GeluMLP")
               if r.role == "optimize" and r.round == 0)  # round 0 starts from the reference
    result = pike("optimize", MLP, "--llm", spec(fake_llm), "--budget-queries", "3",
                  "--config", run_config, "--out", fixed, "--seed-from", solutions,
                  "--fix-seeds")
    assert result.exit_code == 0, result.output
    store = RunStore.open(fixed)
    calls = [c["role"] for c in store.llm_calls("1_GeluMLP")]
    assert calls[0] == "fix:-1:0:1"  # the fixer's repair comes first, within the budget
    repaired = [r for r in store.candidates("1_GeluMLP") if r.role == "fix" and r.round == -1]
    assert len(repaired) == 1 and repaired[0].verdict.ok
    first_round = [r for r in store.candidates("1_GeluMLP")
                   if r.role == "optimize" and r.round == 0]
    assert first_round and all(r.parent_id == repaired[0].id for r in first_round)
    assert pike("optimize", MLP, "--fix-seeds").exit_code == 2
