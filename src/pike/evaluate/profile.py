"""Where a module's time goes: a torch.profiler pass after the checks, outside the timed
region, and its summary rendered short enough for an LLM prompt.

The pass runs in the child that owns the module (the candidate's own process for a
candidate), so a candidate could tamper with its profile. That is acceptable because a
profile only informs prompts and users; verdicts and speedups never read it.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, Field

if TYPE_CHECKING:
    import torch

_TOP = 8


class OpTime(BaseModel):
    name: str
    ms_per_call: float = Field(description="self time per forward call")
    share: float = Field(description="of the profiled time of its kind (device or host)")
    count_per_call: float


class KernelMetrics(BaseModel):
    """Nsight Compute's hardware counters for one kernel (evaluate/ncu.py), as a share of the
    GPU's peak, averaged over its profiled launches; None where ncu gave no number."""

    name: str
    launches: int = Field(description="profiled launches averaged")
    achieved_occupancy_pct: float | None = Field(None, description="warps active vs. possible")
    dram_throughput_pct: float | None = None
    sm_throughput_pct: float | None = None


class ProfileSummary(BaseModel):
    calls: int = Field(description="forward calls profiled")
    device: str
    host_ms_per_call: float = Field(description="self CPU time of all ops, per call")
    device_ms_per_call: float | None = Field(None, description="kernel time per call (CUDA)")
    kernel_launches_per_call: float | None = None
    top_ops: list[OpTime] = Field(default_factory=list, description="by self host time")
    top_kernels: list[OpTime] = Field(default_factory=list, description="by device time")
    peak_memory_mb: float | None = Field(None, description="peak allocated on the device")
    ncu: str = Field("", description="what Nsight Compute gave, or why nothing")
    kernel_metrics: list[KernelMetrics] = Field(
        default_factory=list, description="Nsight Compute's metrics of the top kernels "
        "(EvalConfig.ncu)")


def _device_time(evt: Any) -> float:
    # renamed from cuda_time in torch 2.4; either is in microseconds
    return float(getattr(evt, "self_device_time_total", None)
                 or getattr(evt, "self_cuda_time_total", 0.0) or 0.0)


def profile_calls(fn: Callable[[], Any], device: torch.device, calls: int) -> ProfileSummary:
    """Run `fn` (one forward call) `calls` times under torch.profiler and summarize."""
    import torch  # the verdict module imports this one and stays free of torch
    from torch.profiler import ProfilerActivity, profile

    on_cuda = device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_cuda else [])
    fn()  # lazy work (compiles, allocator growth) belongs to no call
    if on_cuda:
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
    with profile(activities=activities) as prof:
        for _ in range(calls):
            fn()
        if on_cuda:
            torch.cuda.synchronize(device)
    events = prof.key_averages()
    host = [e for e in events if e.self_cpu_time_total > 0]
    host_total = sum(e.self_cpu_time_total for e in host) or 1.0
    top_ops = [OpTime(name=e.key[:80], ms_per_call=e.self_cpu_time_total / 1e3 / calls,
                      share=e.self_cpu_time_total / host_total, count_per_call=e.count / calls)
               for e in sorted(host, key=lambda e: -e.self_cpu_time_total)[:_TOP]]
    summary = ProfileSummary(calls=calls, device=str(device),
                             host_ms_per_call=host_total / 1e3 / calls, top_ops=top_ops,
                             ncu=_ncu_note(on_cuda))
    if on_cuda:
        kernels = [e for e in events if _device_time(e) > 0 and _is_kernel(e)]
        device_total = sum(_device_time(e) for e in kernels)
        summary.device_ms_per_call = device_total / 1e3 / calls
        summary.kernel_launches_per_call = sum(e.count for e in kernels) / calls
        summary.top_kernels = [
            OpTime(name=e.key[:80], ms_per_call=_device_time(e) / 1e3 / calls,
                   share=_device_time(e) / (device_total or 1.0), count_per_call=e.count / calls)
            for e in sorted(kernels, key=lambda e: -_device_time(e))[:_TOP]]
        summary.peak_memory_mb = torch.cuda.max_memory_allocated(device) / 2**20
    return summary


def _is_kernel(evt: Any) -> bool:
    kind = getattr(evt, "device_type", None)
    return kind is not None and str(kind).endswith(("CUDA", "PrivateUse1"))


def _ncu_note(on_cuda: bool) -> str:
    if not on_cuda:
        return "no GPU: Nsight Compute does not apply"
    if shutil.which("ncu") is None:
        return "Nsight Compute (ncu) is not installed: no per-kernel hardware metrics"
    return "Nsight Compute (ncu) is installed: eval.ncu adds per-kernel metrics"


def _metric_lines(metrics: list[KernelMetrics]) -> list[str]:
    if not metrics:
        return []

    def pct(value: float | None) -> str:
        return "?" if value is None else f"{value:.0f}%"

    return ["Nsight Compute, % of peak (achieved occupancy, DRAM and SM throughput):"] + [
        f"- {m.name[:80]}: occupancy {pct(m.achieved_occupancy_pct)}, "
        f"DRAM {pct(m.dram_throughput_pct)}, SM {pct(m.sm_throughput_pct)}" for m in metrics]


def render(summary: ProfileSummary, max_tokens: int = 300) -> str:
    """A few lines for a prompt: totals, launches, the top kernels (or ops), memory; cut to
    about `max_tokens` tokens (4 characters each) at a line boundary."""
    lines = [f"profile over {summary.calls} calls on {summary.device}: host (CPU) time "
             f"{summary.host_ms_per_call:.3f} ms per call"]
    if summary.device_ms_per_call is not None:
        lines[0] += (f", GPU kernel time {summary.device_ms_per_call:.3f} ms per call in "
                     f"{summary.kernel_launches_per_call or 0:.0f} kernel launches")
        if summary.peak_memory_mb is not None:
            lines.append(f"peak GPU memory {summary.peak_memory_mb:.0f} MB")
        lines.append("top kernels by GPU time:")
        lines += [f"- {k.name}: {k.ms_per_call:.3f} ms ({k.share:.0%}), "
                  f"{k.count_per_call:.0f}x per call" for k in summary.top_kernels]
        lines += _metric_lines(summary.kernel_metrics)
    lines.append("top ops by host time:")
    lines += [f"- {o.name}: {o.ms_per_call:.3f} ms ({o.share:.0%}), "
              f"{o.count_per_call:.0f}x per call" for o in summary.top_ops]
    budget, kept = max_tokens * 4, []
    for line in lines:
        if sum(len(k) + 1 for k in kept) + len(line) > budget:
            break
        kept.append(line)
    return "\n".join(kept)
