"""Checks that fail before work starts: each is one line, said before any progress shows."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from pike.cli import app
from pike.config import EvalConfig, LLMConfig, RunConfig
from pike.errors import ConfigError, EvaluatorError, LLMError, StoreError
from pike.preflight import check_device, check_devices, check_models, check_new_run_dir
from pike.store import RunStore
from tests.conftest import EXAMPLES


def llm(model: str | None, fixer: str | None = None) -> RunConfig:
    return RunConfig(llm=LLMConfig(model=model, fixer=fixer))


def test_models_need_a_known_spec_and_their_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GEMINI_API_KEY", raising=False)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    check_models(llm("openai:gpt-5"))
    check_models(llm(None, fixer="gemini:flash"))  # offline: no model is called
    with pytest.raises(LLMError, match="^GEMINI_API_KEY is not set: export it to use "
                                       "gemini:flash$"):
        check_models(llm("openai:gpt-5", fixer="gemini:flash"))
    with pytest.raises(ConfigError, match="unknown model spec 'gpt-5'"):
        check_models(llm("gpt-5"))


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks a host without CUDA")
def test_a_cuda_device_without_cuda_is_refused() -> None:
    check_device(None)
    check_device("cpu")
    with pytest.raises(EvaluatorError, match="device cuda:1 asked for, but CUDA is not "
                                             "available here"):
        check_devices(EvalConfig(device="cpu", devices=["cuda:1"], sandbox="off"))


def test_a_gpu_index_past_the_host_s_gpus_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    check_device("cuda:1")
    with pytest.raises(EvaluatorError, match="device cuda:2 asked for, but this host has 2 "
                                             "GPUs"):
        check_device("cuda:2")


def test_the_ray_backend_needs_ray(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "ray" else real(name, *a))
    with pytest.raises(ConfigError, match=r"pip install 'ray>=2.9'"):
        check_devices(EvalConfig(cluster="ray"))


def test_an_existing_run_is_not_overwritten(tmp_path: Path) -> None:
    check_new_run_dir(None)
    check_new_run_dir(tmp_path / "new")
    RunStore.create(tmp_path / "old", {}, "pike optimize").close()
    with pytest.raises(StoreError, match="a pike run already exists at"):
        check_new_run_dir(tmp_path / "old")


def assert_one_line_before_anything(result: object) -> None:
    assert result.exit_code == 2, result.output  # type: ignore[attr-defined]
    assert result.stdout == ""  # type: ignore[attr-defined]
    lines = result.stderr.splitlines()  # type: ignore[attr-defined]
    assert len(lines) == 1 and lines[0].startswith("error: "), lines


def test_bench_says_a_missing_key_before_its_display(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    result = CliRunner().invoke(app, ["bench", str(EXAMPLES / "tasks"), "--tasks", "1",
                                      "--llm", "openai:gpt-5"])
    assert_one_line_before_anything(result)
    assert "OPENAI_API_KEY is not set" in result.stderr


def test_a_resumed_run_is_checked_with_its_recorded_config(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("OPENROUTER_API_KEY", raising=False)
    recorded = llm("openrouter:vendor/model").model_dump(mode="json")
    with RunStore.create(tmp_path / "run", recorded, "pike optimize t.py") as store:
        store.add_task("t", "t.py", "0" * 64, "x = 1\n")
    result = CliRunner().invoke(app, ["optimize", "--resume", str(tmp_path / "run")])
    assert_one_line_before_anything(result)
    assert "OPENROUTER_API_KEY is not set" in result.stderr


def test_an_existing_out_folder_is_refused_before_the_search(tmp_path: Path) -> None:
    RunStore.create(tmp_path / "run", {}, "pike optimize").close()
    result = CliRunner().invoke(app, ["optimize", str(EXAMPLES / "tasks" / "1_GeluMLP.py"),
                                      "--device", "cpu", "--out", str(tmp_path / "run")])
    assert_one_line_before_anything(result)
    assert "a pike run already exists" in result.stderr


def test_a_seed_set_that_cannot_be_matched_fails_before_the_search(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    seeds = tmp_path / "set"
    seeds.mkdir()
    (seeds / "mapping.yaml").write_text("1_GeluMLP: [not, a, file]\n")
    result = CliRunner().invoke(app, ["optimize", str(EXAMPLES / "tasks" / "1_GeluMLP.py"),
                                      "--device", "cpu", "--llm", "openai:gpt-5",
                                      "--seed-from", str(seeds), "--out", str(tmp_path / "run")])
    assert_one_line_before_anything(result)
    assert "mapping.yaml" in result.stderr
    assert not (tmp_path / "run").exists()  # said before the run was even created
