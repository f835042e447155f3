"""What both roles of the child share: the Failure that ends it, loading a module and
building its model, and drawing, shifting and loading the input sets; with the step clock
whose spans the child reports to the parent.
"""

from __future__ import annotations

import copy
import importlib.util
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from pike.config import BUILD_ON_DEVICE_BYTES
from pike.evaluate.diagnostics import describe_exception
from pike.evaluate.leaf_files import read_leaves
from pike.evaluate.protocol import ChildRequest, ShiftSpec
from pike.evaluate.steps import StepClock

STEPS = StepClock()  # this child's steps, sent to the parent with its trials' end
_manual_seed = torch.manual_seed
REFERENCE_MODULE = "pike_reference"


class Failure(Exception):
    """Ends the child with a verdict-worthy failure."""

    def __init__(self, status: str, phase: str, message: str) -> None:
        super().__init__(message)
        self.status, self.phase, self.message = status, phase, message


def import_file(path: str, name: str) -> Any:
    """The module at `path`, registered as `name` (pickling and dataclasses need it there)."""
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def trial_seed(seed: int, trial: int) -> int:
    """The seed trial `trial` draws its inputs with (the weights take `seed` itself)."""
    return seed + 1 + trial


def _guarded(status: str, phase: str, path: str, fn: Callable[[], Any]) -> Any:
    try:
        return fn()
    except Failure:
        raise
    except BaseException as exc:  # candidate code may raise anything, SystemExit included
        raise Failure(status, phase, describe_exception(exc, path)) from None


def _to_device(values: list[Any], device: torch.device) -> list[Any]:
    return [v.to(device) if isinstance(v, torch.Tensor) else v for v in values]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def construct(cls: Callable[..., Any], init_inputs: list[Any], device: torch.device,
              construct_on: str) -> Any:
    """`cls(*init_inputs)` where `construct_on` says: on the device itself ('device'),
    under torch.device and with the init inputs' tensors moved there first, or on the
    CPU's defaults, to be moved after. The move: a task written to be built on a GPU sets
    that default before its own `get_init_inputs()` (level5's 12_deepseekv3_MLA_decode and
    14_llama2_decode run a forward of those inputs in `__init__`), where the evaluator
    draws them on the CPU; built on the GPU without it, both failed "Expected all tensors
    to be on the same device" (H100, 2026-12-05).

    Built without autograd, as every call is then made: a constructor that runs a forward
    and writes its results into buffers (14_llama2_decode's 4,096-token prefill into its
    KV caches) otherwise leaves those buffers holding the forward's whole graph of saved
    tensors for as long as the model lives, memory no cache emptying returns: about 35 GiB
    at full size beside its 18 GiB of caches and weights, the 53 GiB an H100 found held
    elsewhere when 14's candidate ran out of memory in its constructor
    (bench/results/constructor-graph-cpu-level5-14.md). Parameters still require grad."""
    with torch.no_grad():
        if construct_on != "device":
            return cls(*init_inputs)
        with torch.device(device):
            return cls(*_to_device(init_inputs, device))


def resolve_construct_on(construct_on: str, cls: Callable[..., Any], init_inputs: list[Any],
                         device: torch.device) -> str:
    """'cpu' or 'device': for 'auto', 'device' where the device is a GPU and the model,
    built first on the meta device (no memory, no arithmetic), holds at least
    BUILD_ON_DEVICE_BYTES; a constructor the meta device cannot run is built on the CPU,
    as KernelBench builds every task."""
    if construct_on != "auto":
        return construct_on
    if device.type == "cpu":
        return "cpu"
    dtype = torch.get_default_dtype()
    try:
        # its own copy of the arguments, and the defaults put back: what this extra run of
        # the constructor changes must not reach the real build (which candidates mirror)
        # init inputs moved there as `construct` moves them, and built without autograd
        # as it builds: a constructor that writes into a weight in place fails with it on
        with torch.device("meta"), torch.no_grad():
            shell = cls(*_to_device(copy.deepcopy(init_inputs), torch.device("meta")))
        size = sum(t.numel() * t.element_size() for t in [*shell.parameters(), *shell.buffers()])
    except Exception:  # the constructor reads values; lazy modules (no size yet); no module
        return "cpu"
    finally:
        torch.set_default_dtype(dtype)
    return "device" if size >= BUILD_ON_DEVICE_BYTES else "cpu"


def _build_model(req: ChildRequest, module: Any, init_inputs: list[Any], device: torch.device,
                 status: str) -> torch.nn.Module:
    cls = next((getattr(module, n) for n in req.class_names if hasattr(module, n)), None)
    if cls is None:
        raise Failure(status, "load", f"defines none of {', '.join(req.class_names)}")

    def seeded_build() -> torch.nn.Module:
        _manual_seed(req.seed)
        model = construct(cls, init_inputs, device, req.construct_on)
        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"{type(model).__name__} is not a torch.nn.Module")
        model = model.to(device)
        return model.eval() if req.model_mode == "eval" else model

    return _guarded("task_error" if req.role == "reference" else "runtime_error", "init",
                    req.module_path, seeded_build)


def _draw_inputs(module: Any, req: ChildRequest, seed: int,
                 device: torch.device | None = None) -> list[Any]:
    """get_inputs() under `seed`: where a device is given, with it as the default device,
    so a KernelBench task's hundreds of megabytes are drawn by the GPU instead of the host
    (seconds each); a get_inputs() that cannot run there is drawn on the host instead."""
    if device is not None and device.type != "cpu":
        try:
            with torch.device(device):
                return _draw_inputs(module, req, seed)
        except Failure:
            pass
    _manual_seed(seed)
    inputs = _guarded("task_error", "load", req.module_path, module.get_inputs)
    if not isinstance(inputs, (list, tuple)):
        raise Failure("task_error", "load", "get_inputs() must return a list or tuple")
    return list(inputs)


def _loaded_one_by_one(folder: Path, names: list[str], device: torch.device,
                       step: str) -> Iterator[list[Any]]:
    """Each named input set of `folder` read onto the device (timed as `step`) only when
    the caller is done with the last."""
    for name in names:
        with STEPS.span(step):
            loaded = _to_device(read_leaves(folder / f"{name}.pt", trusted=True), device)
        yield loaded
        del loaded  # (held here, the last set would live on while the next one loads)


def _shift_distribution(value: Any, spec: ShiftSpec | None) -> Any:
    if spec is None or not (isinstance(value, torch.Tensor) and value.is_floating_point()):
        return value
    if spec.kind == "affine":
        return value * spec.scale + spec.offset
    noise = torch.rand(value.shape, device=value.device,
                       generator=torch.Generator(value.device).manual_seed(spec.seed))
    # uniform over three times the scale: as wide as the affine shape's bulk, no tails
    return ((noise * 2 - 1) * 3 * spec.scale + spec.offset).to(value.dtype)
