"""Profiles: a torch.profiler pass after the checks, stored with the verdict, shown by
`pike eval --profile`, and put into the optimizer's prompts under a token budget."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml

from pike.agents import AgentContext, optimize_messages
from pike.config import EvalConfig
from pike.evaluate import evaluate
from pike.evaluate.profile import OpTime, ProfileSummary, profile_calls, render
from pike.evaluate.verdict import TimingStats, Verdict
from pike.store import RunStore
from pike.task import Task
from tests.conftest import candidate
from tests.fake_openai import FakeOpenAI
from tests.test_optimize import GOOD, MLP, Scripted, pike, prompt_of, spec


def test_a_correct_candidate_gets_a_profile_only_when_asked(mlp_task: Task,
                                                            fast_config: EvalConfig) -> None:
    plain = evaluate(mlp_task, candidate("fused"), fast_config)
    assert plain.ok and plain.profile is None
    fast_config.profile = True
    fast_config.profile_calls = 3
    profiled = evaluate(mlp_task, candidate("fused"), fast_config)
    assert profiled.ok and profiled.profile is not None
    summary = profiled.profile
    assert summary.calls == 3 and summary.host_ms_per_call > 0
    assert any(op.name.startswith("aten::") for op in summary.top_ops)
    assert summary.device_ms_per_call is None and "no GPU" in summary.ncu
    wrong = evaluate(mlp_task, candidate("wrong_values"), fast_config)
    assert not wrong.ok and wrong.profile is None


def test_eval_profile_prints_where_the_time_goes(tmp_path: Path, build_cache: Path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump({"eval": {
        "device": "cpu", "trials": 2, "build_cache": str(build_cache),
        "timing": {"min_calls": 5, "min_seconds": 0.02, "rounds": 2, "warmup_seconds": 0.0}}}))
    cand = tmp_path / "fused.py"
    cand.write_text(candidate("fused"))
    result = pike("eval", MLP, cand, "--profile", "--config", config)
    assert result.exit_code == 0, result.output
    assert "top ops by host time" in result.output and "aten::" in result.output
    as_json = pike("eval", MLP, cand, "--profile", "--json", "--config", config)
    assert json.loads(as_json.output)["profile"]["calls"] == 10


def _summary(ops: int) -> ProfileSummary:
    return ProfileSummary(calls=5, device="cuda:0", host_ms_per_call=0.5,
                          device_ms_per_call=2.0, kernel_launches_per_call=40,
                          peak_memory_mb=512,
                          top_kernels=[OpTime(name=f"kernel_{i}", ms_per_call=0.1, share=0.05,
                                              count_per_call=1) for i in range(ops)],
                          top_ops=[OpTime(name=f"aten::op_{i}", ms_per_call=0.01, share=0.02,
                                          count_per_call=2) for i in range(ops)])


def test_render_keeps_to_its_token_budget_at_line_boundaries() -> None:
    text = render(_summary(8), max_tokens=300)
    assert "40 kernel launches" in text and "kernel_0" in text and "peak GPU memory" in text
    short = render(_summary(8), max_tokens=60)
    assert len(short) <= 60 * 4 and short.splitlines()[0] == text.splitlines()[0]
    assert short in text  # cut at a line, never mid-line


def test_profile_calls_on_cpu_counts_ops_per_call() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU())
    x = torch.randn(8, 64)
    summary = profile_calls(lambda: model(x), torch.device("cpu"), 4)
    addmm = next(op for op in summary.top_ops if op.name == "aten::addmm")
    assert addmm.count_per_call == 1 and 0 < addmm.share <= 1


def test_the_optimizer_sees_the_profile_of_what_it_improves() -> None:
    ctx = AgentContext(task_source="class Model: ...", backend="any", device="cpu",
                       reference_profile="profile over 5 calls: REFERENCE-PROFILE",
                       profile_tokens=300)
    first = optimize_messages(ctx, None, None, None)[-1]["content"]
    assert "Where the time goes in the reference" in first and "REFERENCE-PROFILE" in first
    parent = Verdict(status="ok", runtime=TimingStats.from_samples([1.0]), speedup=2.0,
                     profile=_summary(2))
    later = optimize_messages(ctx, "class ModelNew: ...", parent, None)[-1]["content"]
    assert "Where the time goes in the current solution" in later and "kernel_1" in later
    assert "REFERENCE-PROFILE" not in later


def test_a_profiled_search_starts_from_the_reference_profile(
        fake_llm: FakeOpenAI, run_config: Path, tmp_path: Path) -> None:
    cfg = yaml.safe_load(run_config.read_text())
    cfg["eval"].update(profile=True, profile_calls=2)
    run_config.write_text(yaml.safe_dump(cfg))
    fake_llm.handler = Scripted(optimize=[GOOD])
    out = tmp_path / "run"
    result = pike("optimize", MLP, "--llm", spec(fake_llm), "--budget-queries", "3",
                  "--config", run_config, "--out", out)
    assert result.exit_code == 0, result.output
    prompts = [prompt_of(r["body"]) for r in fake_llm.requests]
    assert any("Where the time goes in the reference" in p for p in prompts)
    store = RunStore.open(out)
    assert store.get_state("1_GeluMLP", "reference_profile")["calls"] == 2
    assert all(r.verdict.profile is not None for r in store.candidates("1_GeluMLP")
               if r.verdict and r.verdict.ok)


@pytest.mark.gpu
def test_a_cuda_profile_counts_kernel_launches(mlp_task: Task, fast_config: EvalConfig) -> None:
    fast_config.device = "cuda"
    fast_config.profile = True
    verdict = evaluate(mlp_task, candidate("fused"), fast_config)
    assert verdict.ok and verdict.profile is not None
    assert verdict.profile.kernel_launches_per_call and verdict.profile.top_kernels
    assert verdict.profile.peak_memory_mb and verdict.profile.device_ms_per_call
