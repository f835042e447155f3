"""Prompt assembly under a token budget: parts kept by priority, the budget respected, the
task source never cut, what was trimmed or dropped noted, and the per-part counts recorded
with every LLM call of a real search (that a replay keeps them: tests/test_optimize.py's
replay test, on the run it makes)."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import yaml

from pike.agents import AgentContext, ProgramView, evolve_messages, fix_messages
from pike.agents.prompt import Assembly, Part, Prompt, assemble, estimate_tokens, fit
from pike.agents.roles import optimize_messages, planner_messages
from pike.evaluate.profile import OpTime, ProfileSummary
from pike.evaluate.verdict import TimingStats, Verdict
from pike.store import RunStore
from tests.fake_openai import FakeOpenAI
from tests.test_optimize import GOOD, MLP, Scripted, pike, spec, tokens_of

TASK = "class Model:\n    pass\n" + "# the reference, long\n" * 40  # ~230 tokens
PROGRAM = "class ModelNew:\n" + "    x = 1  # padding\n" * 20  # ~110 tokens each


def program(tag: str) -> str:
    return PROGRAM + f"# program {tag}\n"


def test_assembly_keeps_higher_priorities_whole_and_drops_or_trims_the_lower() -> None:
    parts = [Part("task", "t" * 400, 0, "never"),  # 100 tokens
             Part("low", "l" * 400, 1),
             Part("high", "h" * 400, 9),
             Part("mid", "\n".join(["m" * 39] * 10), 5, "head")]  # 10 lines of 10 tokens
    kept = assemble(parts, budget=260)
    assert kept.text("task") == "t" * 400 and kept.text("high") == "h" * 400
    assert kept.text("mid").startswith("m" * 39) and "more lines cut" in kept.text("mid")
    assert kept.text("low") == ""
    assert kept.dropped == {"low": 100} and kept.trimmed == {"mid": 100}
    assert sum(kept.tokens.values()) <= 260
    # with room for everything, nothing is touched; with no limit either
    assert assemble(parts, 1000).texts == assemble(parts, None).texts == \
        {p.name: p.text for p in parts}


def test_a_smaller_part_after_a_dropped_one_still_gets_the_room_left() -> None:
    parts = [Part("task", "t" * 40, 0, "never"), Part("big", "b" * 800, 9),
             Part("small", "s" * 40, 1)]
    kept = assemble(parts, budget=50)
    assert kept.text("big") == "" and kept.text("small") == "s" * 40


def test_a_tail_cut_keeps_the_end_where_an_error_names_its_cause() -> None:
    report = "\n".join(f"frame {i}" for i in range(100)) + "\nRuntimeError: shapes differ"
    kept = assemble([Part("errors", report, 1, "tail")], budget=40)
    text = kept.text("errors")
    assert text.endswith("RuntimeError: shapes differ") and "earlier lines cut" in text
    assert "frame 0\n" not in text and estimate_tokens(text) <= 40


def test_the_task_source_is_never_cut_even_over_the_budget() -> None:
    ctx = AgentContext(TASK, "any", "CPU", prompt_tokens=50)
    prompt = optimize_messages(ctx, program("parent"), None, "fuse it")
    assert TASK.strip() in prompt[1]["content"]
    assert "program parent" not in prompt[1]["content"]
    assert set(prompt.parts.dropped) == {"parent", "step"}
    assert prompt.parts.total > prompt.parts.budget == 50  # over, and the record says so


def test_an_evolution_prompt_keeps_to_the_budget_by_priority() -> None:
    top = [ProgramView(program(f"top{i}"), "1.5x") for i in range(1, 6)]
    failed = ProgramView(program("failed"), status="incorrect", message="wrong values")
    args = (ProgramView(program("A"), "2.0x"), ProgramView(program("B"), "1.8x"), top, failed,
            "fuse the GELU")
    unlimited = evolve_messages(AgentContext(TASK, "any", "CPU", prompt_tokens=None), *args)
    assert unlimited.parts.dropped == {} and unlimited.parts.budget is None
    budget = unlimited.parts.total - 300  # room for all but about three programs
    prompt = evolve_messages(AgentContext(TASK, "any", "CPU", prompt_tokens=budget), *args)
    text = prompt[1]["content"]
    assert tokens_of(prompt) == prompt.parts.total <= budget
    assert sum(prompt.parts.tokens.values()) == prompt.parts.total
    # both parents and the step stay; the lowest priorities go first: the failed attempt,
    # then the top programs from the last
    assert "program A" in text and "program B" in text and "fuse the GELU" in text
    assert set(prompt.parts.dropped) == {"errors", "top:5", "top:4"}
    assert "program top3" in text and "program top4" not in text
    assert "program failed" not in text
    assert prompt.parts.dropped["top:5"] == estimate_tokens(program("top5"))


def test_a_crossover_without_room_for_parent_b_becomes_a_mutation() -> None:
    big = ProgramView(program("B") * 5)
    ctx = AgentContext(TASK, "any", "CPU", prompt_tokens=900)
    prompt = evolve_messages(ctx, ProgramView(program("A")), big, [], None)
    text = prompt[1]["content"]
    assert "Parent B" not in text and "Rewrite this program" in text and "program A" in text
    assert set(prompt.parts.dropped) == {"other"}


def _profiled(ms: float) -> Verdict:
    profile = ProfileSummary(calls=3, device="cpu", host_ms_per_call=ms, top_ops=[
        OpTime(name=f"aten::op_{i}", ms_per_call=0.1, share=0.1, count_per_call=1)
        for i in range(8)])
    return Verdict(status="ok", runtime=TimingStats.from_samples([ms]), speedup=1.2,
                   profile=profile)


def test_a_profile_goes_with_the_program_it_describes() -> None:
    huge = program("best") * 30
    for make in (lambda c: optimize_messages(c, huge, _profiled(2.0), None),
                 lambda c: planner_messages(c, huge, _profiled(2.0), 4)):
        prompt = make(AgentContext(TASK, "any", "CPU", prompt_tokens=1000))
        assert set(prompt.parts.dropped) == {"parent", "profile"}
        assert "aten::op_0" not in prompt[1]["content"]
        whole = make(AgentContext(TASK, "any", "CPU", prompt_tokens=None))
        assert "aten::op_0" in whole[1]["content"]


def test_the_fixer_keeps_the_failing_source_and_the_end_of_a_long_report() -> None:
    message = "\n".join(f"  File 'candidate.py', line {i}" for i in range(200))
    verdict = Verdict(status="runtime_error", message=message + "\nValueError: bad shape")
    ctx = AgentContext(TASK, "any", "CPU", prompt_tokens=900)  # ~660 without the report
    prompt = fix_messages(ctx, program("failing"), verdict)
    text = prompt[1]["content"]
    assert "program failing" in text and "ValueError: bad shape" in text
    assert "earlier lines cut" in text and "errors" in prompt.parts.trimmed
    assert prompt.parts.total <= 900
    tight = fix_messages(AgentContext(TASK, "any", "CPU", prompt_tokens=100), program("f"),
                         verdict)
    assert "program f" in tight[1]["content"]  # the fixer cannot fix what it does not see
    assert "too long for the prompt" in tight[1]["content"]


def test_fit_leaves_room_for_the_templates_own_words() -> None:
    parts = [Part("task", "t" * 80, 0, "never"), Part("a", "a" * 400, 2),
             Part("b", "b" * 400, 1)]

    def render(kept: Assembly) -> list[dict[str, str]]:
        # 40 tokens of instructions, and a 10-token header over each part shown
        body = "p" * 160 + "".join("h" * 40 + kept.text(n) for n in ("task", "a", "b")
                                   if kept.text(n))
        return [{"role": "user", "content": body}]

    # the parts alone (220 tokens) fit 250, but not with the words around them (290)
    assert assemble(parts, 250).dropped == {}
    prompt = fit(parts, 250, render)
    assert isinstance(prompt, Prompt) and tokens_of(prompt) <= 250
    assert prompt.parts.tokens == {"task": 20, "a": 100, "b": 0, "frame": 60}
    assert prompt.parts.dropped == {"b": 100}


def searched_calls(fake_llm: FakeOpenAI, config: Path, out: Path, queries: int) -> list[dict]:
    """The LLM calls a branching search on the MLP task recorded."""
    fake_llm.handler = Scripted(optimize=[GOOD])
    result = pike("optimize", MLP, "--llm", spec(fake_llm), "--budget-queries", str(queries),
                  "--config", config, "--out", out)
    assert result.exit_code == 0, result.output
    return RunStore.open(out).llm_calls("1_GeluMLP")


def test_the_configured_budget_reaches_the_prompts_and_the_store(
        fake_llm: FakeOpenAI, run_config: Path, tmp_path: Path) -> None:
    cfg = yaml.safe_load(run_config.read_text())
    # the reference with the system message and an idea (~450 tokens) fits; a parent
    # beside them (~580) does not
    cfg["llm"]["prompt_tokens"] = 520
    run_config.write_text(yaml.safe_dump(cfg))
    calls = searched_calls(fake_llm, run_config, tmp_path / "run", 4)
    assert {c["prompt_parts"]["budget"] for c in calls} == {520}
    # round 1 improves a parent that no longer fits beside the reference: dropped, noted
    later = [c for c in calls if c["role"].startswith("optimize:1")]
    assert later and all("parent" in c["prompt_parts"]["dropped"] for c in later)


def test_a_store_from_before_prompt_parts_opens_and_records_them(tmp_path: Path) -> None:
    from pike import store_schema

    path = tmp_path / "old" / "run.sqlite"
    path.parent.mkdir()
    conn = sqlite3.connect(path)  # a run store as the first schema made it
    conn.executescript(store_schema._SCHEMA_V1)
    conn.executemany("INSERT INTO meta (key, value) VALUES (?, ?)",
                     [("schema_version", "1"), ("created_at", "then"), ("command", "pike"),
                      ("config", "{}")])
    conn.execute("INSERT INTO llm_calls (task, role, messages, recorded_at)"
                 " VALUES ('t', 'optimize:0:0', '[]', 'then')")
    conn.commit()
    conn.close()
    with RunStore.open(path.parent) as store:
        prompt = optimize_messages(AgentContext(TASK, "any", "CPU"), None, None, "an idea")
        from pike.llm.call import LLMCall

        store.record_llm_call("t", LLMCall(role="optimize:0:1", model="m", messages=prompt,
                                           prompt_parts=prompt.parts))
        old, new = store.llm_calls("t")
    assert old["prompt_parts"] is None
    assert new["prompt_parts"] == json.loads(prompt.parts.model_dump_json())
