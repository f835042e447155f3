"""eval.construct_on: models built on the device itself (tasks written to be built on the
GPU), both sides alike, and never confused in the reference cache with models built on the
CPU."""

from __future__ import annotations

import copy
import types
from pathlib import Path
from typing import Any

import pytest
import torch

from pike.config import EvalConfig, TimingConfig
from pike.evaluate import candidate_files, reference_cache
from pike.evaluate.child_setup import Failure, _build_model
from pike.evaluate.protocol import ChildRequest
from pike.task import Task


class BuiltOnMeta(torch.nn.Module):
    """Fails unless its constructor runs where the model is meant to live (meta here)."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(4))
        if self.w.device.type != "meta":
            raise RuntimeError(f"built on {self.w.device}")


def request(construct_on: str) -> ChildRequest:
    return ChildRequest(role="reference", module_path="task.py", class_names=["Model"],
                        inputs_dir=".", outputs_dir=".", device="meta", trials=1, seed=0,
                        model_mode="as_constructed", construct_on=construct_on,
                        timing=TimingConfig())


def test_construct_on_device_runs_the_constructor_on_the_device() -> None:
    module = types.SimpleNamespace(Model=BuiltOnMeta)
    model = _build_model(request("device"), module, [], torch.device("meta"), "task_error")
    assert model.w.device.type == "meta"
    assert torch.empty(1).device.type == "cpu"  # the default device is given back
    with pytest.raises(Failure, match="built on cpu"):
        _build_model(request("cpu"), module, [], torch.device("meta"), "task_error")


class RunsItsInitInputs(torch.nn.Module):
    """As level5's 12 and 14: a forward of a tensor from get_init_inputs() in __init__,
    which fails where that tensor and the weights live apart."""

    def __init__(self, warm_up: torch.Tensor, scale: float) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)
        self.cache = torch.nn.Buffer(self.fc(warm_up) * scale)


def test_construct_on_device_moves_the_init_inputs_to_the_device_first() -> None:
    module = types.SimpleNamespace(Model=RunsItsInitInputs)
    drawn = torch.ones(2, 4)  # drawn on the CPU, as the evaluator draws them
    model = _build_model(request("device"), module, [drawn, 2.0], torch.device("meta"),
                         "task_error")
    assert model.cache.device.type == "meta" and model.cache.shape == (2, 4)
    assert drawn.device.type == "cpu"  # the caller's list keeps its own tensors
    built = _build_model(request("cpu"), module, [drawn, 2.0], torch.device("meta"),
                         "task_error")  # on the CPU, then moved: as KernelBench builds it
    assert built.cache.device.type == "meta"


class Prefills(torch.nn.Module):
    """As level5's 14_llama2_decode: a forward in __init__ that writes a layer's output
    into a cache buffer, which the calls then read."""

    def __init__(self, prompt: torch.Tensor) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)
        self.register_buffer("cache", torch.zeros(8, 4))
        self.cache[: len(prompt)] = torch.relu(self.fc(prompt))  # the prefill

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x) + self.cache.sum(0)


@pytest.mark.parametrize("construct_on", ["cpu", "device"])
def test_a_constructors_forward_leaves_no_autograd_graph_in_its_buffers(
        construct_on: str) -> None:
    # Built with autograd on, the cache would hold the prefill's graph (CopySlices, and
    # the saved tensors behind it) for the model's life: on level5's 14 at full size,
    # gigabytes of the card's memory no cache emptying returns.
    torch.manual_seed(0)  # the request's seed: the same weights
    with_graph = Prefills(torch.ones(3, 4))
    assert with_graph.cache.grad_fn is not None  # what an unguarded build leaves
    model = _build_model(request(construct_on), types.SimpleNamespace(Model=Prefills),
                         [torch.ones(3, 4)], torch.device("cpu"), "task_error")
    assert model.cache.grad_fn is None and not model.cache.requires_grad
    assert torch.equal(model.cache, with_graph.cache.detach())  # the same values
    assert all(p.requires_grad for p in model.parameters())  # weights stay parameters
    assert torch.is_grad_enabled()  # the caller's mode is given back
    # the float64 rule's copy (own_rounding) deep-copies the model: a buffer holding a
    # graph cannot be copied so ("Only Tensors created explicitly by the user ...")
    with pytest.raises(RuntimeError, match="graph leaves"):
        copy.deepcopy(with_graph)
    assert torch.equal(copy.deepcopy(model).cache, model.cache)


class ZeroesAColumn(torch.nn.Module):
    """Writes into its weight in place in __init__: a build with autograd on refuses it
    ("a view of a leaf Variable that requires grad is being used in an in-place
    operation"); the real build and the meta one that sizes it must agree."""

    def __init__(self, size: int) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(size, size)
        self.fc.weight[:, 0] = 0


class TurnsGradOff(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.set_grad_enabled(False)
        self.fc = torch.nn.Linear(2, 2)


def test_the_sizing_build_and_the_real_one_agree_and_grad_mode_is_given_back(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from pike.evaluate import child_setup
    monkeypatch.setattr(child_setup, "BUILD_ON_DEVICE_BYTES", 1000)
    # sized on the meta device as it is built: 64 x 64 weights reach the bound
    assert child_setup.resolve_construct_on("auto", ZeroesAColumn, [64],
                                            torch.device("meta")) == "device"
    model = _build_model(request("cpu"), types.SimpleNamespace(Model=ZeroesAColumn), [64],
                         torch.device("cpu"), "task_error")
    assert not model.fc.weight[:, 0].any() and model.fc.weight.requires_grad
    # a constructor's own switch of grad mode ends with it (it used to outlive it)
    _build_model(request("cpu"), types.SimpleNamespace(Model=TurnsGradOff), [],
                 torch.device("cpu"), "task_error")
    assert torch.is_grad_enabled()


def test_the_reference_cache_keeps_apart_models_built_or_timed_differently(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "1_T.py"
    path.write_text("import torch\n\n\nclass Model(torch.nn.Module):\n    pass\n\n\n"
                    "def get_inputs():\n    return []\n\n\n"
                    "def get_init_inputs():\n    return []\n")
    task = Task.from_file(path)
    started: list[tuple[str, float]] = []

    def start(task: Task, cfg: EvalConfig, device: str, keep_child: bool) -> Any:
        started.append((cfg.construct_on, cfg.timing.warmup_calls))
        return types.SimpleNamespace(usable=lambda: True, users=0, close=lambda: None)

    monkeypatch.setattr(reference_cache, "_start_reference", start)
    try:
        # (where built, warm-up calls the child makes, timed seconds a block's request asks)
        for construct_on, warm_ups, seconds in [("cpu", 3, 0.1), ("device", 3, 0.1),
                                                ("cpu", 3, 0.1), ("cpu", 4, 0.1),
                                                ("cpu", 3, 0.5)]:
            cfg = EvalConfig(construct_on=construct_on)
            cfg.timing.warmup_calls, cfg.timing.min_seconds = warm_ups, seconds
            reference_cache.run_reference(task, cfg, "cpu", keep_child=True)
    finally:
        reference_cache._references.clear()
    # the last shares the first's child: each block's request carries its seconds (a
    # search's screening windows and its confirming window time the same reference)
    assert started == [("cpu", 3), ("device", 3), ("cpu", 4)]



class Wide(torch.nn.Module):
    """A model of `size` weights, built wherever the default device says."""

    def __init__(self, size: int) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.empty(size))
        self.register_buffer("b", torch.empty(size // 2, dtype=torch.float16))


class ReadsItsValues(torch.nn.Module):
    def __init__(self, size: int) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.empty(size))
        if float(self.w.detach().sum()) != float(self.w.detach().sum()):  # meta has no values
            raise RuntimeError("unreachable")


def test_auto_builds_on_the_gpu_only_where_weights_and_buffers_reach_the_bound(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from pike.evaluate import child_setup
    monkeypatch.setattr(child_setup, "BUILD_ON_DEVICE_BYTES", 1000)
    gpu = torch.device("meta")  # any device that is not the CPU
    # 200 fp32 weights and 100 fp16 buffer values: 1,000 bytes, counted without memory
    assert child_setup.resolve_construct_on("auto", Wide, [200], gpu) == "device"
    assert child_setup.resolve_construct_on("auto", Wide, [199], gpu) == "cpu"
    assert child_setup.resolve_construct_on("auto", Wide, [200], torch.device("cpu")) == "cpu"
    # what the meta device cannot build is built as KernelBench builds it
    assert child_setup.resolve_construct_on("auto", ReadsItsValues, [10_000], gpu) == "cpu"
    assert child_setup.resolve_construct_on("auto", int, [5], gpu) == "cpu"  # not a module
    # a constructor running its CPU-drawn init inputs is sized, not taken for unbuildable
    monkeypatch.setattr(child_setup, "BUILD_ON_DEVICE_BYTES", 80)
    assert child_setup.resolve_construct_on(
        "auto", RunsItsInitInputs, [torch.ones(2, 4), 1.0], gpu) == "device"
    for chosen in ("cpu", "device"):  # said outright, it stands
        assert child_setup.resolve_construct_on(chosen, Wide, [10], gpu) == chosen
    assert torch.empty(1).device.type == "cpu"  # the default device is given back


def test_the_references_choice_reaches_its_candidates_and_its_replacements(
        mlp_task: Task, tmp_path: Path) -> None:
    cfg = EvalConfig(device="cpu", trials=1, construct_on="auto")
    reference_cache.close_references()
    run = reference_cache.run_reference(mlp_task, cfg, "cpu", keep_child=False)
    try:
        assert run.request is not None and run.request.construct_on == "cpu"  # settled
        run.request.construct_on = "device"  # as a reference on a GPU settles a big task
        files = candidate_files.candidate_folders(cfg, "cpu", tmp_path / "cand")
        assert files.request.construct_on == "auto"  # launched before the reference is known
        candidate_files.attach_reference(files, run, cfg)
        assert files.request.construct_on == "device"
    finally:
        run.close()


class Lazy(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.LazyLinear(8)  # no size until its first call


class Meddles(torch.nn.Module):
    """A constructor with side effects: what its count on the meta device does must not
    reach the real build."""

    def __init__(self, sizes: list[int]) -> None:
        super().__init__()
        torch.set_default_dtype(torch.float64)
        self.w = torch.nn.Parameter(torch.empty(sizes.pop()))


def test_the_count_leaves_no_trace_and_tells_lazy_modules_apart(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from pike.evaluate import child_setup
    monkeypatch.setattr(child_setup, "BUILD_ON_DEVICE_BYTES", 1000)
    gpu = torch.device("meta")
    assert child_setup.resolve_construct_on("auto", Lazy, [], gpu) == "cpu"
    sizes = [500]
    try:
        assert child_setup.resolve_construct_on("auto", Meddles, [sizes], gpu) == "device"
        assert sizes == [500]  # its own copy of the arguments
        assert torch.get_default_dtype() == torch.float32  # the default put back
    finally:
        torch.set_default_dtype(torch.float32)


_RUNS_ITS_INIT_INPUTS = '''\
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, warm_up):
        super().__init__()
        self.fc = nn.Linear(64, 64)
        self.register_buffer("cache", self.fc(warm_up).detach())

    def forward(self, x):
        return self.fc(x) + self.cache.sum()


def get_inputs():
    return [torch.randn(8, 64)]


def get_init_inputs():
    return [torch.randn(2, 64)]
'''


@pytest.mark.gpu
def test_a_task_running_its_init_inputs_in_init_builds_on_the_gpu(tmp_path: Path) -> None:
    """Built on the GPU (construct_on 'device'), both sides get their init inputs there."""
    from pike.evaluate import evaluate
    path = tmp_path / "1_RunsItsInitInputs.py"
    path.write_text(_RUNS_ITS_INIT_INPUTS)
    candidate = _RUNS_ITS_INIT_INPUTS.replace("class Model(", "class ModelNew(")
    verdict = evaluate(Task.from_file(path), candidate,
                       EvalConfig(device="cuda", construct_on="device", trials=2))
    assert verdict.ok, verdict.message
    assert verdict.built_on == "device"


@pytest.mark.gpu
def test_a_prefill_in_init_leaves_only_the_models_own_memory_on_the_gpu() -> None:
    """Level5's 14_llama2_decode at a small size: what the built model holds on the card is
    its weights and caches, not the prefill's autograd graph besides."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")

    class PrefillsWide(torch.nn.Module):
        def __init__(self, prompt: torch.Tensor) -> None:
            super().__init__()
            self.fc = torch.nn.Sequential(*(torch.nn.Linear(1024, 1024) for _ in range(4)))
            self.register_buffer("cache", torch.zeros(len(prompt), 1024))
            self.cache[:] = self.fc(prompt)  # four layers' activations saved with autograd

    # the first matmul of a thread takes cuBLAS's workspace from the same allocator (33 MiB
    # on an H100, 2026-12-06): taken here, it is not counted as the model's
    torch.nn.Linear(1024, 1024, device="cuda")(torch.randn(8, 1024, device="cuda"))
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    before = torch.cuda.memory_allocated()
    model = _build_model(request("device"), types.SimpleNamespace(Model=PrefillsWide),
                         [torch.randn(4096, 1024)], torch.device("cuda"), "task_error")
    held = torch.cuda.memory_allocated() - before
    own = sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])
    assert held <= own * 1.05 + 2**20, (held, own)  # with the graph: about 4 activations more
