"""The timing protocol, shared by reference, torch.compile baselines and candidates.

CUDA: before each call a buffer larger than L2 is overwritten (so no call starts with a
warm cache), a start event is recorded, the call runs, an end event is recorded, the
whole device is synchronized and a second end event is recorded. The call's time ends at
the first end event, or at the second when work on other streams ran past the first, so
side streams are counted while the host's wake-up latency after a synchronize is not.
CPU: the same loop with perf_counter.

The evaluator times in blocks: the parent alternates short blocks of the reference and of
the candidate (each in its own process), so both see the same state of a host whose speed
drifts. `time_block` is one such block; `time_calls` is a whole measurement in one go.
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
# Between the end event on the current stream and one recorded after a device-wide
# synchronize there is only the host's wake-up latency (a few microseconds), unless work
# ran on other streams past the end event; then the later event is the honest end.
_ESCAPED_WORK_MS = 0.02


def _l2_flush_buffer(device: torch.device) -> torch.Tensor:
    props = torch.cuda.get_device_properties(device)
    l2 = getattr(props, "L2_cache_size", 0) or _L2_FLUSH_FALLBACK_BYTES // 4
    return torch.empty(max(4 * l2, 64 * 1024 * 1024) // 4, dtype=torch.int32, device=device)


def time_calls(fn: Callable[[], Any], device: torch.device, cfg: TimingConfig) -> list[float]:
    """Warm up, then time calls of `fn` until the config's counts are met; milliseconds."""
    return time_block(fn, device, cfg, warm_up=True, min_calls=cfg.min_calls,
                      min_seconds=cfg.min_seconds, max_calls=cfg.max_calls)


def time_block(fn: Callable[[], Any], device: torch.device, cfg: TimingConfig, *,
               warm_up: bool, min_calls: int, min_seconds: float,
               max_calls: int, after: Callable[[Any], None] | None = None) -> list[float]:
    """One block of timed calls (after the full warm-up, or one untimed call); milliseconds.

    `after` sees each timed call's output once its time is taken, outside the timed region
    (the candidate's child samples it there, for the parent to compare); `fn.pick`, where
    `fn` has one (timed_calls.InputRotation.caller), chooses each timed call's inputs
    before its clock starts."""
    sync = (lambda: _synchronize(device)) if device.type == "cuda" else (lambda: None)
    if warm_up:
        _warm_up(fn, sync, cfg)
    else:
        fn()  # the other process ran in between: refill this one's host-side caches
        sync()
    pick: Callable[[], None] = getattr(fn, "pick", None) or (lambda: None)
    if device.type == "cuda":
        return _time_cuda(fn, device, cfg.flush_l2, min_calls, min_seconds, max_calls, after,
                          pick)
    return _time_host(fn, min_calls, min_seconds, max_calls, after, pick)


def warm_up(fn: Callable[[], Any], device: torch.device, cfg: TimingConfig) -> None:
    """The warm-up of a first block, on its own: a torch.compile mode compiles here."""
    _warm_up(fn, (lambda: _synchronize(device)) if device.type == "cuda" else (lambda: None), cfg)


def _enough(count: int, spent_s: float, min_calls: int, min_seconds: float,
            max_calls: int) -> bool:
    if count >= max_calls:
        return True
    return count >= min_calls and spent_s >= min_seconds


def _warm_up(fn: Callable[[], Any], sync: Callable[[], None], cfg: TimingConfig) -> None:
    start = _perf_counter()
    calls = 0
    while calls < cfg.warmup_calls or _perf_counter() - start < cfg.warmup_seconds:
        fn()
        sync()
        calls += 1


def _time_host(fn: Callable[[], Any], min_calls: int, min_seconds: float,
               max_calls: int, after: Callable[[Any], None] | None,
               pick: Callable[[], None]) -> list[float]:
    samples: list[float] = []
    spent = 0.0
    while not _enough(len(samples), spent, min_calls, min_seconds, max_calls):
        pick()
        t0 = _perf_counter()
        out = fn()
        elapsed = _perf_counter() - t0
        spent += elapsed
        samples.append(elapsed * 1e3)
        if after is not None:
            after(out)
        del out
    return samples


_flush_buffers: dict[torch.device, torch.Tensor] = {}


def _time_cuda(fn: Callable[[], Any], device: torch.device, flush_l2: bool, min_calls: int,
               min_seconds: float, max_calls: int,
               after: Callable[[Any], None] | None,
               pick: Callable[[], None]) -> list[float]:
    flush = None
    if flush_l2:
        if device not in _flush_buffers:
            _flush_buffers[device] = _l2_flush_buffer(device)
        flush = _flush_buffers[device]
    samples: list[float] = []
    spent = 0.0
    with torch.cuda.device(device):
        while not _enough(len(samples), spent, min_calls, min_seconds, max_calls):
            if flush is not None:
                flush.zero_()
            pick()
            start, end, end_all = (_Event(enable_timing=True) for _ in range(3))
            start.record()
            out = fn()
            end.record()
            _synchronize(device)
            end_all.record()
            end_all.synchronize()
            elapsed_ms = start.elapsed_time(end)
            if end.elapsed_time(end_all) > _ESCAPED_WORK_MS:
                elapsed_ms = start.elapsed_time(end_all)
            spent += elapsed_ms / 1e3
            samples.append(elapsed_ms)
            if after is not None:
                after(out)
            del out
    return samples
