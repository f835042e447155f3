"""The floor: a lower bound on a task's runtime on a device, from its FLOPs and the bytes
that must move.

    work = count_work(task)                      # FLOPs and bytes of the reference, once
    fl = floor(work, "NVIDIA H100 80GB HBM3")    # None on a CPU or an unknown device
    describe(fl, runtime_ms=eager_ms)            # one line for prompts and the CLI

The floor is max(compute time, memory time): FLOPs at the device's dense peak, and the
bytes that must cross DRAM at least once (inputs, parameters, buffers, outputs) at its
bandwidth. No kernel launch, dispatch or synchronization cost is in it.

Precision: the task's dtype is the contract, so the headline floor (`ms`) uses the peak of
the dtype the task is written in, and for fp32 that is the CUDA-core fp32 peak, except for
convolutions: cuDNN runs fp32 convolutions in TF32 unless told not to
(`torch.backends.cudnn.allow_tf32`, on by default), so the reference itself does, and
their FLOPs count at the TF32 peak (on an H200 compile default ran
6_GoogleNetInceptionModule in 0.8x of the all-fp32 floor). The
evaluator also passes candidates that compute in TF32, bf16 or fp16 when they stay within
tolerance, so every Floor also carries `lowp_ms`: the same floor at the fastest tensor-core
peak on file (bf16/fp16 on every listed device). For fp16 and bf16 tasks the two agree.

What the FLOPs are: those of the reference's own algorithm, as torch's FlopCounterMode
counts them (matrix multiplies, convolutions, attention; elementwise ops and reductions
count zero). Ops it has no formula for are listed in `Work.notes`. A candidate that skips
work the reference does (masked-out attention blocks, dead code) can beat the compute floor;
the notes say when a causal mask was seen.
"""

from __future__ import annotations

import contextlib
import logging
import math
import re
import sys
import types
from collections.abc import Iterable, Iterator
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any, Literal

import torch
import yaml
from pydantic import BaseModel, ConfigDict, Field, PositiveFloat, ValidationError
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode, flop_registry

from pike.errors import ConfigError, TaskError
from pike.task import Task

logger = logging.getLogger(__name__)

__all__ = [
    "Device", "Floor", "Work", "count_work", "count_work_cheaply", "describe", "floor",
    "load_devices", "match_device", "no_floor_reason", "times_floor",
]

Precision = Literal["bf16", "fp16", "tf32", "fp32"]
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
_CPU_NAMES = {"", "cpu", "x86_64", "amd64", "i386", "i686", "aarch64", "arm64", "arm", "ppc64le"}


class Device(BaseModel):
    """One accelerator's dense peaks (FLOP/s) and DRAM bandwidth (bytes/s), from devices.yaml."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    names: list[str] = Field(min_length=1, description="torch.cuda.get_device_name() strings")
    bf16: PositiveFloat
    fp16: PositiveFloat
    tf32: PositiveFloat
    fp32: PositiveFloat = Field(description="CUDA-core (non-tensor-core) fp32 peak")
    bandwidth: PositiveFloat
    source: str
    uncertain: list[str] = Field(description="fields whose figure is an estimate or a choice")

    def peak(self, precision: Precision) -> float:
        return float(getattr(self, precision))


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


class Floor(BaseModel):
    """The least time a task can take on a device: max(compute time, memory time).

    `ms`/`bound` use the peak of the task's own dtype (fp32 tasks: CUDA-core fp32);
    `lowp_*` allow the fastest tensor-core precision on file (bf16/fp16), which the evaluator
    admits when a candidate stays within tolerance. They agree for fp16 and bf16 tasks.
    """

    device: str = Field(description="the devices.yaml entry")
    dtype: DtypeClass
    flops: int
    bytes_min: int
    bandwidth: float = Field(description="bytes/s")
    memory_ms: float
    precision: Precision = Field(description="whose peak `compute_ms` uses")
    peak_flops: float = Field(description="FLOP/s: the rate compute_ms works out at (the "
                              "precision's peak, or between it and TF32's: tf32_flops)")
    tf32_flops: int = Field(0, description="of flops, those counted at the TF32 peak: an "
                            "fp32 task's convolutions, which cuDNN runs in TF32 by default")
    compute_ms: float
    ms: float
    bound: Literal["compute", "memory"]
    lowp_precision: Precision
    lowp_peak_flops: float
    lowp_compute_ms: float
    lowp_ms: float
    lowp_bound: Literal["compute", "memory"]
    notes: list[str] = Field(default_factory=list)


# ---------------------------------------------------------------- devices

def load_devices(path: str | Path | None = None) -> list[Device]:
    """The device entries of `path`, or of the devices.yaml shipped with pike."""
    if path is None:
        return list(_bundled_devices())
    return _parse_devices(Path(path).read_text(), str(path))


@lru_cache(maxsize=1)
def _bundled_devices() -> tuple[Device, ...]:
    text = resources.files("pike").joinpath("data/devices.yaml").read_text()
    return tuple(_parse_devices(text, "pike/data/devices.yaml"))


def _parse_devices(text: str, where: str) -> list[Device]:
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise ConfigError(f"{where}: not valid YAML ({str(err).splitlines()[0]})") from None
    entries = raw.get("devices") if isinstance(raw, dict) else None
    if not isinstance(entries, list):
        raise ConfigError(f"{where}: not a device file (wants a `devices:` list)")
    devices = []
    for i, entry in enumerate(entries):
        try:
            devices.append(Device.model_validate(entry))
        except ValidationError as err:
            first = err.errors()[0]
            name = entry.get("name", f"entry {i + 1}") if isinstance(entry, dict) else i + 1
            field = ".".join(map(str, first["loc"])) or "entry"
            raise ConfigError(f"{where}: {name}: {field}: {first['msg']}") from None
    seen: dict[str, str] = {}
    for device in devices:
        for name in [device.name, *device.names]:
            key = _normalize(name)
            if seen.setdefault(key, device.name) != device.name:
                raise ConfigError(f"{where}: {name!r} names both {seen[key]} and {device.name}")
    return devices


def _normalize(name: str) -> str:
    words = re.sub(r"[\s_\-]+", " ", name.strip().lower())
    return words.removeprefix("nvidia ").strip()


def match_device(device_name: str, devices: Iterable[Device] | None = None) -> Device | None:
    """The entry whose names include `device_name` (a torch.cuda.get_device_name() string)."""
    key = _normalize(device_name)
    for device in devices if devices is not None else _bundled_devices():
        if key in {_normalize(n) for n in [device.name, *device.names]}:
            return device
    return None


# ---------------------------------------------------------------- counting

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
        with torch.device(target) if on_device else contextlib.nullcontext():
            model = module.Model(*init_inputs)
        model = model.to(target)
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


class _OpRecorder(TorchDispatchMode):
    """Records which aten ops ran, and whether any attention was causal."""

    def __init__(self, leaves: set[int] | None = None) -> None:
        super().__init__()
        self.ops: dict[str, int] = {}
        self.views: set[str] = set()
        self.causal = False
        self.leaves = leaves or set()  # storages of inputs, parameters and buffers
        self.reads: dict[int, _StorageReads] = {}  # leaf storage -> what ops used of it

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (),
                           kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        name = str(getattr(func, "overloadpacket", func))
        self.ops[name] = self.ops.get(name, 0) + 1
        if name in ("aten.tril", "aten.triu", "aten.tril_", "aten.triu_"):
            self.causal = True
        schema = getattr(func, "_schema", None)
        for i, arg in enumerate(schema.arguments if schema is not None else ()):
            if arg.name == "is_causal":
                self.causal |= bool(args[i] if i < len(args) else kwargs.get("is_causal", False))
        out = func(*args, **kwargs)
        if getattr(func, "is_view", False):
            self.views.add(name)  # a view moves nothing; the op that uses it does
        elif name not in _METADATA_ONLY:
            # An index op reads of its table at most what it gathers (an embedding reads
            # the rows it looks up), however large the table is.
            table = args[0] if name in _INDEX_OPS and args else None
            cap = _nbytes(_tensors(out)) if table is not None else None
            for t in _tensors((args, kwargs)):
                key = _storage_key(t)
                if key is not None and key in self.leaves:
                    self.reads.setdefault(key, _StorageReads(t.untyped_storage().nbytes())
                                          ).add(t, cap if t is table else None)
        return out


# Ops that take a tensor only for its shape, dtype and device, or change only its
# metadata in place: they read none of its data.
_METADATA_ONLY = frozenset(f"aten.{op}" for op in (
    "empty_like", "zeros_like", "ones_like", "full_like", "rand_like", "randn_like",
    "randint_like", "new_empty", "new_zeros", "new_ones", "new_full", "new_empty_strided",
    "unsqueeze_", "squeeze_", "t_", "transpose_", "swapdims_", "swapaxes_", "as_strided_",
    "resize_", "resize_as_", "set_", "detach_"))
# Ops that gather part of their first argument (a table) by indices: what they read of the
# table is at most what they return (lookups of one row repeated count each time).
_INDEX_OPS = frozenset(f"aten.{op}" for op in (
    "embedding", "index_select", "gather", "index", "take"))
_MAX_RUNS = 1 << 16  # contiguous runs of one view listed exactly; more are summed instead


class _StorageReads:
    """The bytes of one storage the forward's ops used: the union of the byte ranges of
    every view read (two chunks of one tensor count twice as much as one, one slice read
    twice counts once), as exact runs where a view splits into few contiguous runs, else
    the largest such view alone; never more than the storage holds."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.runs: list[tuple[int, int]] = []  # [start, end) in bytes
        self.largest_scattered = 0  # a view of too many runs to list: its distinct bytes
        self._merge_at = 4 * _MAX_RUNS  # doubled after each merge: merging stays n log n

    def add(self, t: torch.Tensor, cap: int | None = None) -> None:
        distinct = _view_bytes(t)
        if cap is not None and cap < distinct:  # an index op gathered part of it
            self.largest_scattered = max(self.largest_scattered, cap)
            return
        runs = _contiguous_runs(t)
        if runs is None:
            self.largest_scattered = max(self.largest_scattered, distinct)
            return
        self.runs.extend(runs)
        if len(self.runs) > self._merge_at:
            self.runs = _merged(self.runs)
            self._merge_at = max(self._merge_at, 2 * len(self.runs))

    def total(self) -> int:
        covered = sum(end - start for start, end in _merged(self.runs))
        return min(max(covered, self.largest_scattered), self.capacity)


def _contiguous_runs(t: torch.Tensor) -> list[tuple[int, int]] | None:
    """The byte ranges a view covers, one per contiguous run, or None where it has more
    than _MAX_RUNS runs (a column of a large matrix) or strides pike cannot order."""
    size = t.element_size()
    dims = sorted(((n, st) for n, st in zip(t.shape, t.stride(), strict=True)
                   if n > 1 and st != 0), key=lambda d: d[1])
    if t.numel() == 0:
        return []
    if any(st < 0 for _, st in dims):
        return None
    run, inner = 1, 0  # elements per contiguous run, and how many of the dims it spans
    for n, st in dims:
        if st != run:
            break
        run *= n
        inner += 1
    outer = dims[inner:]
    if math.prod(n for n, _ in outer) > _MAX_RUNS:
        return None
    starts = [t.storage_offset()]
    for n, st in outer:
        starts = [s + i * st for s in starts for i in range(n)]
    return [(s * size, (s + run) * size) for s in starts]


def _merged(runs: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for start, end in sorted(runs):
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out


def _nbytes(tensors: list[torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def _tensors(value: Any) -> list[torch.Tensor]:
    return [leaf for leaf in pytree.tree_leaves(value) if isinstance(leaf, torch.Tensor)]


def _storage_key(t: torch.Tensor) -> int | None:
    try:
        return t.untyped_storage()._cdata  # the same for every view of one storage
    except (NotImplementedError, RuntimeError):  # sparse and other storage-less layouts
        return None


def _view_bytes(t: torch.Tensor) -> int:
    """The bytes a view spans without repeats (a broadcast dimension, stride 0, adds none),
    at most its storage's size."""
    elements = math.prod(n for n, st in zip(t.shape, t.stride(), strict=True) if st != 0)
    if t.numel() == 0:
        elements = 0
    return min(elements * t.element_size(), t.untyped_storage().nbytes())


def _distinct(tensors: Iterable[torch.Tensor]) -> list[torch.Tensor]:
    seen: set[tuple[Any, ...]] = set()
    out = []
    for t in tensors:
        key = (_storage_key(t), t.storage_offset(), tuple(t.shape), tuple(t.stride()), t.dtype)
        if key not in seen:
            seen.add(key)
            out.append(t)
    return out


def _leaf_storages(leaves: dict[str, list[torch.Tensor]]) -> dict[str, dict[int, int]]:
    """Per kind, each storage of its tensors once (key -> bytes it holds); a parameter
    also passed as an input counts under the first kind listed."""
    seen: set[int | None] = {None}  # storage-less layouts (sparse) hold nothing countable
    out: dict[str, dict[int, int]] = {}
    for kind, tensors in leaves.items():
        out[kind] = {}
        for t in tensors:
            key = _storage_key(t)
            if key not in seen:
                seen.add(key)
                out[kind][key] = t.untyped_storage().nbytes()
    return out


def _read_bytes(storages: dict[str, dict[int, int]],
                reads: dict[int, _StorageReads]) -> dict[str, int]:
    """Per kind, the bytes the forward's ops used of its storages."""
    return {kind: sum(reads[key].total() for key in held if key in reads)
            for kind, held in storages.items()}


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


# ---------------------------------------------------------------- the floor

def floor(work: Work, device_name: str) -> Floor | None:
    """The floor of `work` on the device named `device_name`; None on a CPU or a device with
    no entry in devices.yaml (no_floor_reason() says which)."""
    device, reason = _resolve(work, device_name)
    if device is None:
        logger.info("no floor: %s", reason)
        return None
    notes = []
    precision: Precision = "fp32"
    if work.dtype in ("fp16", "bf16"):
        precision = work.dtype
    elif work.dtype == "fp64":
        notes.append("fp64 task: compute uses the fp32 peak, so its floor is loose")
    lowp: Precision = precision
    if precision == "fp32":
        lowp = max(("bf16", "fp16", "tf32"), key=device.peak)
    if device.uncertain:
        notes.append(f"{device.name}: estimated peaks for {', '.join(device.uncertain)}")
    memory_ms = work.bytes_min / device.bandwidth * 1e3
    in_tf32 = convolution_flops(work) if work.dtype == "fp32" else 0  # not fp64's
    if in_tf32:
        notes.append("convolutions at the TF32 peak: cuDNN runs fp32 convolutions in TF32 "
                     "by default (torch.backends.cudnn.allow_tf32), the reference's too")
    compute_ms = (in_tf32 / device.peak("tf32")
                  + (work.flops - in_tf32) / device.peak(precision)) * 1e3
    # the peak the compute time works out at, where convolutions and the rest mix
    peak = work.flops / compute_ms * 1e3 if compute_ms > 0 else device.peak(precision)
    lowp_compute_ms = work.flops / device.peak(lowp) * 1e3
    return Floor(
        device=device.name, dtype=work.dtype, flops=work.flops, bytes_min=work.bytes_min,
        bandwidth=device.bandwidth, memory_ms=memory_ms,
        precision=precision, peak_flops=peak, tf32_flops=in_tf32, compute_ms=compute_ms,
        ms=max(compute_ms, memory_ms), bound=_bound(compute_ms, memory_ms),
        lowp_precision=lowp, lowp_peak_flops=device.peak(lowp), lowp_compute_ms=lowp_compute_ms,
        lowp_ms=max(lowp_compute_ms, memory_ms), lowp_bound=_bound(lowp_compute_ms, memory_ms),
        notes=notes,
    )


def convolution_flops(work: Work) -> int:
    """Of the work's counted FLOPs, the convolutions' (forward ops only: `flops_by_op` keeps
    the largest ops by name; a convolution folded into its 'other' is counted at fp32)."""
    return sum(n for op, n in work.flops_by_op.items()
               if "convolution" in op and "backward" not in op)


def no_floor_reason(work: Work, device_name: str) -> str | None:
    """Why `floor(work, device_name)` is None, or None when there is a floor."""
    return _resolve(work, device_name)[1]


def _resolve(work: Work, device_name: str) -> tuple[Device | None, str | None]:
    raw = device_name.strip().lower()
    if raw in _CPU_NAMES or raw.startswith("cpu"):
        return None, f"{device_name or 'cpu'} is a CPU: pike keeps peaks for GPUs only"
    device = match_device(device_name)
    if device is None:
        return None, f"no peaks on file for {device_name!r} (add it to pike/data/devices.yaml)"
    if work.dtype == "fp8":
        return None, "fp8 task: no fp8 peaks on file"
    return device, None


def _bound(compute_ms: float, memory_ms: float) -> Literal["compute", "memory"]:
    return "compute" if compute_ms >= memory_ms else "memory"


def times_floor(runtime_ms: float, floor: Floor, lowp: bool = False) -> float:
    """`runtime_ms` as a multiple of the floor (1.0 = at the floor); `lowp` compares with
    the tensor-core floor instead. Infinite when the floor is zero (a task with no work)."""
    bound_ms = floor.lowp_ms if lowp else floor.ms
    return runtime_ms / bound_ms if bound_ms > 0 else math.inf


def describe(floor: Floor | None, runtime_ms: float | None = None, label: str = "eager") -> str:
    """One line, e.g. "floor 0.0143 ms on H100 SXM (memory-bound: 48 MB at 3.35 TB/s);
    eager is 25x the floor"."""
    if floor is None:
        return "no floor for this device"
    if floor.bound == "memory":
        why = f"memory-bound: {_si(floor.bytes_min, 'B')} at {_si(floor.bandwidth, 'B/s')}"
    else:
        why = (f"compute-bound: {_si(floor.flops, 'FLOP')} at "
               f"{_si(floor.peak_flops, 'FLOP/s')} {floor.precision}"
               + (f", its {_si(floor.tf32_flops, 'FLOP')} of convolutions in TF32"
                  if floor.tf32_flops else ""))
    if floor.lowp_ms < floor.ms * 0.99:
        why += f"; {_duration(floor.lowp_ms)} with {floor.lowp_precision} tensor cores"
    line = f"floor {_duration(floor.ms)} on {floor.device} ({why})"
    if runtime_ms is not None:
        line += f"; {label} is {_times(times_floor(runtime_ms, floor))} the floor"
    return line


def _duration(ms: float) -> str:
    if ms >= 1000:
        return f"{ms:,.0f} ms"
    if ms >= 0.01 or ms == 0:
        return f"{ms:.3g} ms"
    return f"{ms * 1e3:.3g} µs" if ms >= 1e-5 else f"{ms * 1e6:.3g} ns"


def _times(x: float) -> str:
    return "inf x" if math.isinf(x) else (f"{x:,.0f}x" if x >= 1000 else f"{x:.3g}x")


def _si(value: float, unit: str) -> str:
    for scale, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if value >= scale:
            return f"{value / scale:.3g} {prefix}{unit}"
    return f"{value:.3g} {unit}"
