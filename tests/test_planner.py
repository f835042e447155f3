"""The planner agent: ranked steps before each round (PIKE-B) or generation (PIKE-O), one
step per optimizer query, its calls in the budget and the store."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pike.agents import AgentContext, plan_ideas, planner_messages
from pike.evaluate.verdict import TimingStats, Verdict
from pike.store import RunStore
from tests.fake_openai import FakeOpenAI, Reply
from tests.test_evolve import evolve_config  # noqa: F401 (fixture)
from tests.test_optimize import GOOD, MLP, fenced, pike, prompt_of, spec

STEPS = ["Fuse the GELU chain into one kernel.", "Replace pow with x*x*x.",
         "Use F.gelu with approximate='tanh'.", "Drop the extra contiguous copy."]


class Planned:
    """Plans for the planner, code for everyone else."""

    def __call__(self, body: dict[str, Any]) -> Reply:
        prompt = prompt_of(body)
        if "Plan the next optimizations" in prompt:
            return Reply(content="\n".join(f"{i + 1}. {s}" for i, s in enumerate(STEPS)))
        return Reply(content=fenced(GOOD))


def test_plan_ideas_give_each_query_one_step_several_or_the_plan() -> None:
    assert plan_ideas(STEPS, 5, "one") == [*STEPS, STEPS[0]]
    several = plan_ideas(STEPS, 2, "several")
    assert several[0] == "; then ".join(STEPS[:3]) and several[1].startswith(STEPS[1])
    free = plan_ideas(STEPS, 3, "free")
    assert len(set(free)) == 1 and all(s in free[0] for s in STEPS)
    assert plan_ideas([], 3, "one") == []


def test_the_planner_sees_the_best_its_profile_and_the_floor() -> None:
    ctx = AgentContext(task_source="class Model: ...", backend="triton", device="H100",
                       reference_profile="REFERENCE-PROFILE")
    first = planner_messages(ctx, None, None, 6)[-1]["content"]
    assert "the reference" in first and "REFERENCE-PROFILE" in first and "Triton" in first
    best = Verdict(status="ok", runtime=TimingStats.from_samples([0.2]), speedup=3.0,
                   times_floor=4.5)
    later = planner_messages(ctx, "class ModelNew: ...", best, 6)[-1]["content"]
    assert "3.00x" in later and "4.5x the least time" in later and "class ModelNew" in later


def test_branching_with_the_planner_implements_one_step_per_query(
        fake_llm: FakeOpenAI, run_config: Path, tmp_path: Path) -> None:
    fake_llm.handler = Planned()
    out = tmp_path / "run"
    result = pike("optimize", MLP, "--llm", spec(fake_llm), "--planner", "--budget-queries", "6",
                  "--config", run_config, "--out", out)
    assert result.exit_code == 0, result.output
    store = RunStore.open(out)
    keys = [c["role"] for c in store.llm_calls("1_GeluMLP")]
    assert keys[0] == "plan:0" and "brainstorm:0" not in keys
    assert "plan:1" in keys and len(keys) == 6  # plans count in the budget
    first_round = sorted((r for r in store.candidates("1_GeluMLP")
                          if r.role == "optimize" and r.round == 0), key=lambda r: r.branch)
    assert [r.idea for r in first_round] == STEPS[:len(first_round)]  # the steps, in the store
    prompts = [prompt_of(r["body"]) for r in fake_llm.requests]
    assert any(f"Apply this idea: {STEPS[0]}" in p for p in prompts)
    # the second plan starts from the best of round 0, not from the reference
    second_plan = next(p for p in prompts[1:] if "Plan the next optimizations" in p)
    assert "The current best solution" in second_plan


def test_evolve_with_the_planner_and_the_guided_preset(
        fake_llm: FakeOpenAI, evolve_config: Path, tmp_path: Path) -> None:  # noqa: F811
    fake_llm.handler = Planned()
    out = tmp_path / "run"
    result = pike("optimize", MLP, "--llm", spec(fake_llm), "--strategy", "evolve",
                  "--preset", "guided", "--budget-queries", "5", "--config", evolve_config,
                  "--out", out)
    assert result.exit_code == 0, result.output
    store = RunStore.open(out)
    config = store.config()
    assert config["search"]["planner"] is True and config["eval"]["profile"] is True
    assert store.llm_calls("1_GeluMLP")[0]["role"] == "plan:0"
    prompts = [prompt_of(r["body"]) for r in fake_llm.requests]
    assert any("Implement this step of the plan" in p for p in prompts)
    assert pike("optimize", MLP, "--planner").exit_code == 2  # needs an LLM
