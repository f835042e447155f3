from __future__ import annotations

from pathlib import Path

import pytest
import torch

from pike.config import EvalConfig, LimitsConfig, TimingConfig
from pike.task import Task

pytest_plugins = ["tests.fake_openai"]  # the `fake_llm` fixture: a local OpenAI-compatible server

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
CANDIDATES = Path(__file__).resolve().parent / "candidates"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def mlp_task() -> Task:
    return Task.from_file(EXAMPLES / "tasks" / "1_GeluMLP.py")


@pytest.fixture(scope="session", autouse=True)
def build_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("build-cache")


@pytest.fixture
def fast_config(build_cache: Path) -> EvalConfig:
    """The evaluator protocol with short timing and tight limits, so failures show quickly."""
    return EvalConfig(
        device="cpu",
        trials=3,
        timing=TimingConfig(warmup_calls=2, warmup_seconds=0.0, min_calls=5, min_seconds=0.05),
        limits=LimitsConfig(load_seconds=240, check_seconds=20, timing_seconds=60, memory_gib=2),
        build_cache=build_cache,
    )


def candidate(name: str) -> str:
    return (CANDIDATES / f"{name}.py").read_text()
