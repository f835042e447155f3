from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from pike.config import EvalConfig, LimitsConfig, TimingConfig
from pike.evaluate import spares
from pike.task import Task

pytest_plugins = ["tests.fake_openai"]  # the `fake_llm` fixture: a local OpenAI-compatible server

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
CANDIDATES = Path(__file__).resolve().parent / "candidates"
BENCH = ROOT / "bench"


def bench_script(name: str) -> Any:
    """A bench/ script as a module (they import their `common` module from bench/)."""
    import importlib

    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(BENCH))
        return importlib.import_module(name)


# The files that take longest, longest first (from a CI run's --durations on 2 workers, in
# seconds): run first, so that `--dist loadfile` hands out the small files last and both
# workers end close together, rather than one starting a long file as the other ends. The
# rest follow in collection order. A file's figure need not be exact, only its rank.
LONGEST_FILES = {
    "test_optimize.py": 350, "test_evaluate.py": 315, "test_cli.py": 270,
    "test_bench.py": 270, "test_orphans.py": 220, "test_ray_pool.py": 190,
    "test_offline.py": 180, "test_audit.py": 160, "test_evolve.py": 155,
    "test_docs_examples.py": 150,
    "test_bench_stop_after.py": 150, "test_bench_offline.py": 125, "test_os_sandbox.py": 120,
    "test_pool.py": 100, "test_planner.py": 100, "test_prebuild.py": 85,
    "test_shared_builds.py": 85, "test_profile.py": 75, "test_shared_window.py": 50,
    "test_bench_audit_offline.py": 40, "test_device_lock.py": 40, "test_prompt_budget.py": 30,
    "test_spares.py": 30,
}


def pytest_configure(config: pytest.Config) -> None:
    if hasattr(config.option, "loadscopereorder"):  # xdist's: by test count, else as collected
        config.option.loadscopereorder = False


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    items.sort(key=lambda item: -LONGEST_FILES.get(item.path.name, 0))  # stable: files whole
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _no_spare_children_between_tests() -> Iterator[None]:
    """A pool a test left open would keep launching spare children into later tests,
    with the environment of the test that launched them."""
    yield
    spares.forget_pools()


@pytest.fixture(scope="session")
def mlp_task() -> Task:
    return Task.from_file(EXAMPLES / "tasks" / "1_GeluMLP.py")


@pytest.fixture(scope="session", autouse=True)
def build_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One build cache for the session; under xdist, one for all its workers (the
    session's base folder holds each worker's): each torch.compile graph and extension is
    then built cold once per run, not once per worker. Builds are safe to share: inductor
    writes its cache atomically and extension builds take a lock."""
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent
    folder = base / "build-cache"
    folder.mkdir(exist_ok=True)
    return folder


@pytest.fixture
def fast_config(build_cache: Path) -> EvalConfig:
    """The evaluator protocol with short timing and tight limits, so failures show quickly."""
    return fast_protocol(build_cache)


def fast_protocol(build_cache: Path | None = None) -> EvalConfig:
    return EvalConfig(
        device="cpu",
        trials=3,
        timing=TimingConfig(warmup_calls=2, warmup_seconds=0.0, min_calls=5, min_seconds=0.05),
        limits=LimitsConfig(load_seconds=240, check_seconds=20, timing_seconds=60, memory_gib=2),
        build_cache=build_cache,
    )


def clock_rule_spy(monkeypatch: pytest.MonkeyPatch, caller: Any) -> list[tuple[float, float, float]]:
    """Replace `caller`'s wall_clock_factor (judge's or confirm's) with one that records,
    each time it is applied: the judged child's median stretch, the reference's, and the
    factor the rule gave."""
    from pike.evaluate import wall_clock_check
    seen: list[tuple[float, float, float]] = []

    def spy(cost: Any, judged: Any, reference: Any) -> float:
        factor = wall_clock_check.wall_clock_factor(cost, judged, reference)
        seen.append((wall_clock_check._stretch(cost, judged)[1],
                     wall_clock_check._stretch(cost, reference)[1], factor))
        return factor

    monkeypatch.setattr(caller, "wall_clock_factor", spy)
    return seen


def judged_in(run_dir: Path) -> dict[int, Any]:
    """The verdicts a run store holds so far, by candidate id: none while the store is
    missing or its schema is still being written (a run just started in a child)."""
    from pike.errors import StoreError
    from pike.store import RunStore

    try:
        with RunStore.open(run_dir) as store:
            return {r.id: r.verdict for r in store.candidates() if r.verdict}
    except StoreError:
        return {}


def listening_child(proc: subprocess.Popen, limit_s: float, pausable_on: str | None = "cuda:0"
                    ) -> tuple[Any, int]:
    """A ChildProcess around `proc` (not started by pike) that reads the messages written
    to the returned fd, as its _receive_one does."""
    from pike.evaluate.sandbox import ChildProcess

    read_fd, write_fd = os.pipe()
    child = ChildProcess.__new__(ChildProcess)
    child.proc, child._from_child, child._buffer = proc, read_fd, b""
    child.phase, child.phase_started, child.phase_seconds = "check", time.monotonic(), {}
    child.phase_limits = {"load": limit_s, "check": limit_s}
    child.memory_limit, child.stage, child.unresponsive = 2**40, None, False
    child._log, child.sandboxed, child.env = None, False, {}
    child.pausable_on = pausable_on
    return child, write_fd

def candidate(name: str) -> str:
    return (CANDIDATES / f"{name}.py").read_text()


@pytest.fixture
def run_config(tmp_path: Path, build_cache: Path) -> Path:
    """A pike.yaml for searches on CPU against the fake LLM server: fast protocol, small
    branching, a price for the fake model, and no confirming window: it loads the best
    again and times it beside eager, and on two cores it was a third of a search test's
    CPU time. The tests of the window set confirm_top themselves (tests/test_confirm.py,
    test_screening.py, test_offline.py; test_cli_output.py's searches confirm too)."""
    path = tmp_path / "pike.yaml"
    path.write_text(yaml.safe_dump({
        "runs_dir": str(tmp_path / "runs"),
        "eval": {"device": "cpu", "trials": 2, "build_cache": str(build_cache),
                 "timing": {"warmup_calls": 1, "warmup_seconds": 0.0, "min_calls": 5,
                            "min_seconds": 0.02, "rounds": 2},
                 "limits": {"load_seconds": 120, "check_seconds": 30, "timing_seconds": 60,
                            "memory_gib": 2}},
        "llm": {"retry_wait_s": 0.01, "max_retries": 1, "timeout_s": 20, "max_tokens": 200,
                "pricing": {"fake-model": {"input_per_mtok": 1000.0,
                                           "output_per_mtok": 1000.0}}},
        "search": {"branching": {"branches": 2, "max_fix_attempts": 1, "top_k": 2},
                   "confirm_top": 0},
    }))
    return path


# A task that only builds under torch.device(...), as eval.construct_on: device builds it;
# the CPU shows that context too, so it is testable without a GPU.
BUILT_UNDER_A_DEVICE = '''\
import torch
import torch.nn as nn
from torch.overrides import _get_current_function_mode_stack


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        modes = [type(m).__name__ for m in _get_current_function_mode_stack()]
        if "DeviceContext" not in modes:
            raise RuntimeError("not built under torch.device")
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        return self.fc(x)


def get_inputs():
    return [torch.randn(4, 8)]


def get_init_inputs():
    return []
'''


# A process with a child of its own, running until killed: what a candidate's child tree
# looks like to the pausing and turn-taking code (device_lock.py, shared_window.py).
_PARENT_OF_ONE = (
    "import subprocess, sys, time\n"
    "subprocess.Popen([sys.executable, '-c', 'import time\\nwhile True: time.sleep(0.01)'])\n"
    "while True: time.sleep(0.01)\n")


@pytest.fixture
def children() -> Iterator[Any]:
    """start() -> the root of a new parent-and-child tree (psutil.Process); all are
    killed at the end."""
    import sys

    import psutil

    started: list[subprocess.Popen] = []

    def start() -> psutil.Process:
        proc = subprocess.Popen([sys.executable, "-c", _PARENT_OF_ONE])
        started.append(proc)
        root = psutil.Process(proc.pid)
        deadline = time.monotonic() + 10
        while not root.children() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert root.children(), "the grandchild did not start"
        return root

    yield start
    for proc in started:
        for p in psutil.Process(proc.pid).children(recursive=True):
            p.kill()
        proc.kill()
        proc.wait()
