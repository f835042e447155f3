"""A task's size on the meta device, and what a reference child of it holds on the host."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from pike.evaluate import task_size
from pike.evaluate.protocol import EXTRA_TRIALS, timed_set_count

EXAMPLES = Path(__file__).parents[1] / "examples" / "tasks"
F32 = 4


def _task(tmp_path: Path, body: str) -> str:
    path = tmp_path / "task.py"
    path.write_text("import time\nimport torch\nimport torch.nn as nn\n\n" + body)
    return str(path)


def test_an_example_task_s_bytes_are_its_inputs_outputs_and_weights() -> None:
    # 1_GeluMLP: x (64, 256) -> fc1 (256 -> 1024) -> fc2 (1024 -> 256)
    answer = task_size.on_meta(str(EXAMPLES / "1_GeluMLP.py"))
    assert answer == {"inputs": 64 * 256 * F32, "outputs": 64 * 256 * F32,
                      "params": (256 * 1024 + 1024 + 1024 * 256 + 256) * F32}
    assert task_size._MODULE not in sys.modules  # its import is dropped after


@pytest.mark.parametrize("name", ["2_ConvBlock.py", "3_CausalAttention.py"])
def test_every_example_task_has_a_size(name: str) -> None:
    answer = task_size.on_meta(str(EXAMPLES / name))
    assert "error" not in answer, answer
    assert answer["inputs"] > 0 and answer["outputs"] > 0


def test_a_task_with_a_tuple_output_and_buffers_counts_each_leaf(tmp_path: Path) -> None:
    path = _task(tmp_path, """
class Model(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.register_buffer("scale", torch.ones(n, dtype=torch.float64))

    def forward(self, x, k):
        return x * 2, {"half": (x[:, :k] * 0.5).half()}

def get_inputs():
    return [torch.randn(8, 16), 4]

def get_init_inputs():
    return [16]
""")
    assert task_size.on_meta(path) == {"inputs": 8 * 16 * F32,
                                       "outputs": 8 * 16 * F32 + 8 * 4 * 2,
                                       "params": 16 * 8}


@pytest.mark.parametrize("forward, why", [
    ("return x * x.sum().item()", "item"),  # a value read from a tensor: meta has none
    ("raise SystemExit(3)", "SystemExit"),
])
def test_a_task_that_cannot_run_on_meta_says_why(tmp_path: Path, forward: str, why: str) -> None:
    path = _task(tmp_path, f"""
class Model(nn.Module):
    def forward(self, x):
        {forward}

def get_inputs():
    return [torch.randn(4, 4)]

def get_init_inputs():
    return []
""")
    answer = task_size.on_meta(path)
    assert set(answer) == {"error"} and why.lower() in answer["error"].lower(), answer


def test_a_task_that_takes_real_memory_on_meta_gives_no_size(tmp_path: Path) -> None:
    # an explicit device is not the meta device's to override: 64 MiB really allocated
    path = _task(tmp_path, """
class Model(nn.Module):
    def forward(self, x):
        return x + 1

def get_inputs():
    return [torch.ones(16 * 2**20, device="cpu")]

def get_init_inputs():
    return []
""")
    answer = task_size.on_meta(path, real_limit=32 * 2**20)
    assert "real memory" in answer.get("error", ""), answer
    assert "inputs" in task_size.on_meta(path)  # under the default limit it is a size


def test_a_task_too_slow_to_size_is_cut_at_the_limit(tmp_path: Path) -> None:
    path = _task(tmp_path, """
class Model(nn.Module):
    def forward(self, x):
        return x

def get_inputs():
    time.sleep(30)
    return [torch.ones(4)]

def get_init_inputs():
    return []
""")
    answer = task_size.on_meta(path, limit_s=0.3)
    assert "not done in" in answer.get("error", ""), answer


def test_structural_bytes_follow_the_protocol_s_counts() -> None:
    trials, input_sets = 5, 2
    sets, timed = trials + EXTRA_TRIALS, timed_set_count(input_sets)
    answer = {"inputs": 10, "outputs": 100, "params": 7}
    assert task_size.structural_for(answer, trials, input_sets) == (
        (sets + timed + 1) * 10 + (sets + 1) * 100 + 7)
    # with the scratch on disk only what is in flight and the weights; on the CPU the
    # timed sets' inputs are held in memory as well
    assert task_size.structural_for(answer, trials, input_sets, files_in_memory=False) == (
        10 + 100 + 7)
    assert task_size.structural_for(answer, trials, input_sets, files_in_memory=False,
                                    on_cpu=True) == (timed + 1) * 10 + 100 + 7
    for bad in ({"error": "x"}, {"inputs": 1, "outputs": 2}, {**answer, "params": -1},
                {**answer, "inputs": True}, {**answer, "outputs": 1.5}):
        assert task_size.structural_for(bad, trials, input_sets) is None


def test_a_task_that_names_cuda_is_not_run_before_its_device_is_held(tmp_path: Path) -> None:
    path = _task(tmp_path, """
raise RuntimeError("imported")  # never reached: the source is read, not run

def get_inputs():
    return [torch.randn(4).to('CUDA'.lower())]
""")
    answer = task_size.on_meta(path)
    assert "names CUDA" in answer.get("error", ""), answer
    assert "error" in task_size.on_meta(str(tmp_path / "missing.py"))


def test_what_the_task_does_at_import_stays_in_the_sizing_process(tmp_path: Path) -> None:
    """The reference's child imports the task again after its size: a torch.library
    namespace defined at import (which may be defined once a process), or a default
    device set there, would have failed or changed that import."""
    from pike.evaluate.child_setup import import_file

    path = _task(tmp_path, """
LIB = torch.library.Library("pike_task_size_test", "DEF")
torch.set_default_dtype(torch.float64)

class Model(nn.Module):
    def forward(self, x):
        return x * 2

def get_inputs():
    return [torch.randn(4, 4)]

def get_init_inputs():
    return []
""")
    assert task_size.on_meta(path) == {"inputs": 4 * 4 * 8, "outputs": 4 * 4 * 8, "params": 0}
    assert torch.get_default_dtype() == torch.float32
    try:
        import_file(path, "pike_task_size_test_module")  # the first import in this process
    finally:
        sys.modules.pop("pike_task_size_test_module", None)
        torch.set_default_dtype(torch.float32)


def test_a_process_the_task_starts_neither_holds_the_answer_nor_outlives_it(
        tmp_path: Path) -> None:
    """A task that forks at import: the fork holds the answer's pipe open, so the answer
    is its first line, not what comes before the pipe closes; and it is ended with the
    sizing process (their group)."""
    import time

    import psutil

    marker = tmp_path / "forked.pid"
    path = _task(tmp_path, f"""
import os
if os.fork() == 0:
    open({str(marker)!r}, "w").write(str(os.getpid()))
    time.sleep(60)
    os._exit(0)

class Model(nn.Module):
    def forward(self, x):
        return x

def get_inputs():
    return [torch.ones(4)]

def get_init_inputs():
    return []
""")
    started = time.monotonic()
    answer = task_size.on_meta(path, limit_s=20)
    assert answer == {"inputs": 16, "outputs": 16, "params": 0}
    assert time.monotonic() - started < 15
    for _ in range(100):
        if marker.exists() and marker.read_text():
            break
        time.sleep(0.05)
    if not (marker.exists() and marker.read_text()):
        return  # ended before it could write: it did not outlive the sizing either
    pid = int(marker.read_text())
    for _ in range(100):
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                break
        except psutil.NoSuchProcess:
            break
        time.sleep(0.05)
    else:
        pytest.fail(f"the task's own process {pid} outlived its sizing")
