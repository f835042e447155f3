"""The timing protocol, shared by reference, torch.compile baselines and candidates.

CUDA: before each call a buffer larger than L2 is overwritten (so no call starts with a
warm cache), a start event is recorded, the call runs, the whole device is synchronized
(so work the candidate put on other streams is counted), then the end event is recorded.
CPU: the same loop with perf_counter. Warm-up and call counts follow TimingConfig.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

from pike.config import TimingConfig

# Bind at import so a candidate that patches these names cannot change our clock.
_perf_counter = time.perf_counter
_Event = torch.cuda.Event
_synchronize = torch.cuda.synchronize

_L2_FLUSH_FALLBACK_BYTES = 256 * 1024 * 1024


def _l2_flush_buffer(device: torch.device) -> torch.Tensor:
    props = torch.cuda.get_device_properties(device)
    l2 = getattr(props, "L2_cache_size", 0) or _L2_FLUSH_FALLBACK_BYTES // 4
    return torch.empty(max(4 * l2, 64 * 1024 * 1024) // 4, dtype=torch.int32, device=device)


def time_calls(fn: Callable[[], Any], device: torch.device, cfg: TimingConfig) -> list[float]:
    """Warm up, then time calls of `fn` until the config's counts are met; milliseconds."""
    if device.type == "cuda":
        return _time_cuda(fn, device, cfg)
    return _time_host(fn, cfg)


def _enough(samples: list[float], spent_s: float, cfg: TimingConfig) -> bool:
    if len(samples) >= cfg.max_calls:
        return True
    return len(samples) >= cfg.min_calls and spent_s >= cfg.min_seconds


def _warm_up(fn: Callable[[], Any], sync: Callable[[], None], cfg: TimingConfig) -> None:
    start = _perf_counter()
    calls = 0
    while calls < cfg.warmup_calls or _perf_counter() - start < cfg.warmup_seconds:
        fn()
        sync()
        calls += 1


def _time_host(fn: Callable[[], Any], cfg: TimingConfig) -> list[float]:
    _warm_up(fn, lambda: None, cfg)
    samples: list[float] = []
    spent = 0.0
    while not _enough(samples, spent, cfg):
        t0 = _perf_counter()
        fn()
        elapsed = _perf_counter() - t0
        spent += elapsed
        samples.append(elapsed * 1e3)
    return samples


def _time_cuda(fn: Callable[[], Any], device: torch.device, cfg: TimingConfig) -> list[float]:
    def sync() -> None:
        _synchronize(device)

    flush = _l2_flush_buffer(device) if cfg.flush_l2 else None
    _warm_up(fn, sync, cfg)
    samples: list[float] = []
    spent = 0.0
    with torch.cuda.device(device):
        while not _enough(samples, spent, cfg):
            if flush is not None:
                flush.zero_()
            start, end = _Event(enable_timing=True), _Event(enable_timing=True)
            start.record()
            fn()
            _synchronize(device)
            end.record()
            end.synchronize()
            elapsed_ms = start.elapsed_time(end)
            spent += elapsed_ms / 1e3
            samples.append(elapsed_ms)
    return samples
