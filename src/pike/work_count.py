"""Counting a task's work: the FLOPs of one forward of its reference model and the bytes
that must move (`Work`), as the floor (pike.floor) takes them. The forward runs in this
process, on the meta device, the CPU or a GPU; what its ops read is recorded by
pike.forward_reads.
"""

from __future__ import annotations

import contextlib
import re
import sys
import types
from collections.abc import Iterator
from typing import Any, Literal

import torch
from pydantic import BaseModel, Field
from torch.utils import _pytree as pytree
from torch.utils.flop_counter import FlopCounterMode, flop_registry

from pike.errors import TaskError
from pike.evaluate.child_setup import construct
from pike.forward_reads import (
    _distinct,
    _leaf_storages,
    _nbytes,
    _OpRecorder,
    _read_bytes,
    _storage_key,
    _tensors,
)
from pike.task import Task

DtypeClass = Literal["fp32", "fp16", "bf16", "fp64", "fp8", "none"]

TOP_OPS = 8
_DTYPE_CLASS: dict[torch.dtype, DtypeClass] = {
    torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16", torch.float64: "fp64",
}


def _cpu_sdpa_flops(*args: Any, out_val: Any = None, **kwargs: Any) -> int:
    """FlopCounterMode knows the CUDA attention kernels but not the CPU one: same formula."""
    cuda_formula = flop_registry[torch.ops.aten._scaled_dot_product_flash_attention]
    return int(cuda_formula(*args, out_val=out_val, **kwargs))


_cpu_sdpa_flops._get_raw = True  # type: ignore[attr-defined]  # takes tensors, not shapes
_EXTRA_FORMULAS = {torch.ops.aten._scaled_dot_product_flash_attention_for_cpu: _cpu_sdpa_flops}
# ops that move or allocate data and do no arithmetic: left out of the "uncounted" note
_NO_MATH = {
    "aten._to_copy", "aten.clone", "aten.copy_", "aten.detach", "aten.empty", "aten.empty_like",
    "aten.empty_strided", "aten.full", "aten.full_like", "aten.lift_fresh", "aten.ones",
    "aten.ones_like", "aten.zeros", "aten.zeros_like", "aten.contiguous", "aten.fill_",
    "aten.zero_", "aten.arange", "aten.cat", "aten.stack", "aten._unsafe_view",
}
# uncounted ops whose names say they carry many FLOPs: worth a louder note
_HEAVY = re.compile(r"conv|mm|matmul|attention|linear|einsum|gemm|lstm|gru|rnn|fft")


class Work(BaseModel):
    """What one forward of a task's reference does: FLOPs and the bytes that must move."""

    flops: int = Field(ge=0, description="FLOPs counted by torch's FlopCounterMode")
    flops_by_op: dict[str, int] = Field(default_factory=dict,
                                        description=f"top {TOP_OPS} ops by FLOPs, then 'other'")
    bytes_min: int = Field(ge=0, description="what the forward reads of inputs, parameters "
                           "and buffers, plus its outputs")
    bytes_inputs: int = 0
    bytes_params: int = 0
    bytes_buffers: int = 0
    bytes_outputs: int = 0
    dtype: DtypeClass = Field("fp32", description="dominant floating dtype of params and inputs")
    counted_on: str = Field("cpu", description="the torch device the forward ran on")
    notes: list[str] = Field(default_factory=list)


def count_work(task: Task, device: str = "cpu", seed: int = 42,
               build_on_device: bool = False) -> Work:
    """FLOPs and minimum bytes of one forward of `task`'s reference model.

    Runs the task's code in THIS process: call it only on trusted reference code (the task
    the user gave), never on a candidate; candidates run only in the evaluator's sandbox.

    Like the evaluator: inputs drawn after seeding `seed + 1` (trial 0), weights after
    seeding `seed`, the model as constructed (no .eval()), forward under torch.no_grad().
    The caller's RNG state is left as it was. `device` is where the forward runs: "cpu",
    "cuda", or "meta" (no arithmetic, fast for big tasks, but fails on tasks that read
    tensor values, such as `.item()`; then use "cpu"). The model is built on the CPU and
    moved, or with `build_on_device` built under torch.device(device), as the evaluator does
    with `eval.construct_on: device` (the meta device always builds under itself).

    bytes_min counts of each input, parameter and buffer only what the forward's ops read
    or write of it (the union of the byte ranges their views cover: a KV cache of which
    one slice is read counts that slice, its chunks read one by one count in full; an
    unused weight counts nothing; an embedding counts the rows it gathers; `zeros_like(x)`
    reads nothing of x), so it stays a lower bound; outputs count in full, once (an output
    that is an input is not counted twice). Intermediates are not counted: a fused kernel
    may keep them on chip.
    Raises TaskError when the task's code fails.
    """
    target = torch.device(device)
    fork = [torch.cuda.current_device()] if target.type == "cuda" else []
    with _own_defaults(), torch.random.fork_rng(devices=fork):
        module = _load_module(task)
        model, inputs = _build(task, module, target, seed, build_on_device)
        leaves = {"params": list(model.parameters()), "buffers": list(model.buffers()),
                  "inputs": _tensors(inputs)}
        recorder = _OpRecorder({_storage_key(t) for ts in leaves.values() for t in ts})
        counter = FlopCounterMode(display=False, custom_mapping=_EXTRA_FORMULAS)
        try:
            with torch.no_grad(), recorder, counter:
                output = model(*inputs)
        except Exception as err:
            raise TaskError(_failure(task, "forward", err, target)) from None
    by_op = {str(op): int(n) for op, n in counter.get_flop_counts().get("Global", {}).items()}
    known = {str(op) for op in counter.flop_registry}
    storages = _leaf_storages(leaves)
    sizes = _read_bytes(storages, recorder.reads)
    sizes["outputs"] = _nbytes([t for t in _distinct(_tensors(output))
                                if _storage_key(t) not in recorder.leaves])
    return Work(
        flops=int(counter.get_total_flops()),
        flops_by_op=_top(by_op),
        bytes_min=sum(sizes.values()),
        bytes_inputs=sizes["inputs"], bytes_params=sizes["params"],
        bytes_buffers=sizes["buffers"], bytes_outputs=sizes["outputs"],
        dtype=_dtype_class([*model.parameters(), *_tensors(inputs)], _tensors(output)),
        counted_on=str(target),
        notes=[*_work_notes(recorder, known, sizes), *_unread_note(storages, sizes)],
    )


def io_bytes(task: Task, device: str = "meta", seed: int = 42) -> tuple[int, int]:
    """One input set's bytes and one forward's output bytes, every leaf in full (what the
    evaluator writes of a trial: bench/staging_bytes.py); built and run as count_work does,
    in THIS process (trusted reference code only). Raises TaskError when the code fails."""
    target = torch.device(device)
    fork = [torch.cuda.current_device()] if target.type == "cuda" else []
    with _own_defaults(), torch.random.fork_rng(devices=fork):
        model, inputs = _build(task, _load_module(task), target, seed, False)
        try:
            with torch.no_grad():
                output = model(*inputs)
        except Exception as err:
            raise TaskError(_failure(task, "forward", err, target)) from None
    return _nbytes(_tensors(inputs)), _nbytes(_tensors(output))


def count_work_cheaply(task: Task, fallback: str = "cpu", seed: int = 42,
                       build_on_device: bool = False) -> Work:
    """count_work on the meta device (no memory, no arithmetic) and, when the task's code
    fails there (it reads tensor values, say), on `fallback` with real arithmetic; a task
    that fails there too raises that TaskError."""
    try:
        return count_work(task, "meta", seed)
    except TaskError:
        return count_work(task, fallback, seed, build_on_device)


@contextlib.contextmanager
def _own_defaults() -> Iterator[None]:
    """Gives the caller back torch's default dtype and device as they were: task code sets
    them (4_llama2's constructor sets bfloat16), and the next task counted in this process
    would otherwise be built in the last one's dtype."""
    dtype, device = torch.get_default_dtype(), torch.get_default_device()
    try:
        yield
    finally:
        torch.set_default_dtype(dtype)
        if torch.get_default_device() != device:  # None: no device mode left behind
            torch.set_default_device(None if device.type == "cpu" else device)


def _load_module(task: Task) -> types.ModuleType:
    name = "pike_floor_" + re.sub(r"\W", "_", task.name)
    module = types.ModuleType(name)
    module.__file__ = str(task.path)
    sys.modules[name] = module  # dataclasses and pickling look a module up by name
    try:
        exec(compile(task.source, str(task.path), "exec"), module.__dict__)
    except Exception as err:
        raise TaskError(_failure(task, "load", err)) from None
    finally:
        sys.modules.pop(name, None)
    return module


def _build(task: Task, module: types.ModuleType, target: torch.device, seed: int,
           build_on_device: bool) -> tuple[torch.nn.Module, list[Any]]:
    try:
        init_inputs = list(module.get_init_inputs())
        torch.manual_seed(seed + 1)
        inputs = list(module.get_inputs())
        torch.manual_seed(seed)
        on_device = build_on_device or target.type == "meta"
        model = construct(module.Model, init_inputs, target,
                          "device" if on_device else "cpu").to(target)
        moved = pytree.tree_map(lambda v: v.to(target) if isinstance(v, torch.Tensor) else v,
                                inputs)
    except Exception as err:
        raise TaskError(_failure(task, "init", err, target)) from None
    return model, moved


def _failure(task: Task, phase: str, err: BaseException,
             target: torch.device | None = None) -> str:
    first = (str(err).splitlines() or [""])[0]
    hint = "; count on device 'cpu'" if target is not None and target.type == "meta" else ""
    return f"{task.path.name}: counting work failed at {phase}: {type(err).__name__}: {first}{hint}"


def _unread_note(storages: dict[str, dict[int, int]], sizes: dict[str, int]) -> list[str]:
    held = sum(n for by_key in storages.values() for n in by_key.values())
    read = sizes["params"] + sizes["buffers"] + sizes["inputs"]
    if held <= read * 1.01:
        return []
    return [f"the forward reads {read / 1e6:.4g} MB of the {held / 1e6:.4g} MB its inputs, "
            "parameters and buffers hold (slices of caches, unused weights); only what it "
            "reads is counted"]


def _dtype_class(primary: list[torch.Tensor], fallback: list[torch.Tensor]) -> DtypeClass:
    for tensors in (primary, fallback):
        weight: dict[DtypeClass, int] = {}
        for t in tensors:
            if t.is_floating_point():
                cls = _DTYPE_CLASS.get(t.dtype, "fp8" if t.element_size() == 1 else "fp32")
                weight[cls] = weight.get(cls, 0) + t.numel() * t.element_size()
        if weight:
            return max(weight, key=lambda c: weight[c])
    return "none"


def _top(by_op: dict[str, int]) -> dict[str, int]:
    ranked = sorted(by_op.items(), key=lambda kv: -kv[1])
    top = dict(ranked[:TOP_OPS])
    rest = sum(n for _, n in ranked[TOP_OPS:])
    if rest:
        top["other"] = rest
    return top


def _work_notes(recorder: _OpRecorder, known: set[str], sizes: dict[str, int]) -> list[str]:
    notes = []
    uncounted = sorted(op for op in recorder.ops
                       if op not in known and op not in _NO_MATH and op not in recorder.views)
    heavy = [op for op in uncounted if _HEAVY.search(op.split(".", 1)[-1]) or
             not op.startswith(("aten.", "prims."))]
    if heavy:
        notes.append(f"no FLOP formula for {', '.join(heavy)}: their FLOPs are not counted, "
                     "so the compute floor is low")
    light = [op for op in uncounted if op not in heavy]
    if light:
        shown = ", ".join(op.removeprefix("aten.") for op in light[:8])
        more = f" and {len(light) - 8} more" if len(light) > 8 else ""
        notes.append(f"FLOPs count matmul, convolution and attention only; {shown}{more} "
                     "ran uncounted (elementwise and reductions), so FLOPs are a lower bound")
    if recorder.causal:
        notes.append("a causal mask was seen: the reference computes the masked-out scores, "
                     "a kernel that skips them does about half the attention FLOPs")
    total = sum(sizes.values())
    if total and sizes["buffers"] > 0.25 * total:
        notes.append(f"buffers are {sizes['buffers'] / total:.0%} of bytes_min; a kernel that "
                     "recomputes constant buffers (masks, tables) need not read them")
    return notes
