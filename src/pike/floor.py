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

The counting is in pike.work_count (what the forward's ops read: pike.forward_reads), the
device peaks in pike.device_peaks; their public names are importable from here too.
"""

from __future__ import annotations

import logging
import math
from typing import Literal

from pydantic import BaseModel, Field

from pike.device_peaks import Device, Precision, load_devices, match_device
from pike.work_count import DtypeClass, Work, count_work, count_work_cheaply

logger = logging.getLogger(__name__)

__all__ = [
    "Device", "Floor", "Work", "count_work", "count_work_cheaply", "describe", "floor",
    "load_devices", "match_device", "no_floor_reason", "times_floor",
]

_CPU_NAMES = {"", "cpu", "x86_64", "amd64", "i386", "i686", "aarch64", "arm64", "arm", "ppc64le"}


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
