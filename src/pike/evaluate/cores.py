"""CPU cores for timing, kept apart from builds.

On a GPU, eager PyTorch and small kernels are bound by the host: how fast the timed
process gets CPU time decides its launch rate. When a pool builds other candidates at
the same time (nvcc, Triton, inductor keep every core busy), the timed window would
measure that load. So on a host with cores to spare, each GPU gets `timing_cores` cores
of its own: every child starts on the other cores (its compilers inherit them), and the
candidate and reference children move onto the GPU's timing cores only while they are
timed. Linux only; elsewhere, or with too few cores, nothing moves.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from functools import cache
from pathlib import Path

log = logging.getLogger(__name__)

_MIN_BUILD_CORES = 2


@cache
def _host_cores() -> tuple[int, ...]:
    getter = getattr(os, "sched_getaffinity", None)
    return tuple(sorted(getter(0))) if getter else ()


@cache
def _gpus() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def split(timing_cores: int, gpus: int | None = None) -> tuple[list[frozenset[int]],
                                                                frozenset[int]] | None:
    """(timing cores of each GPU, build cores), or None where the host cannot spare them."""
    cores, gpus = _host_cores(), _gpus() if gpus is None else gpus
    if timing_cores <= 0 or gpus <= 0 or len(cores) < gpus * timing_cores + _MIN_BUILD_CORES:
        return None
    lanes = [frozenset(cores[g * timing_cores:(g + 1) * timing_cores]) for g in range(gpus)]
    return lanes, frozenset(cores[gpus * timing_cores:])


def build_cores(device: str, timing_cores: int) -> int:
    """How many cores a build on `device` may use: the build cores of a GPU host, else all."""
    plan = split(timing_cores) if device.startswith("cuda") else None
    return len(plan[1]) if plan is not None else max(1, len(_host_cores()) or os.cpu_count() or 1)


def _gpu_index(device: str) -> int:
    return int(device.partition(":")[2] or 0)


def _move(pid: int, cores: frozenset[int]) -> None:
    """Every thread of `pid` onto `cores` (threads keep their own masks, so each one)."""
    try:
        tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except OSError:
        tids = [pid]
    for tid in tids:
        try:
            os.sched_setaffinity(tid, cores)
        except OSError:  # the thread ended meanwhile
            pass


def start_on_build_cores(pid: int, device: str, timing_cores: int) -> None:
    """A new child (and what it spawns) stays off the timing cores."""
    plan = split(timing_cores) if device.startswith("cuda") else None
    if plan is not None:
        _move(pid, plan[1])


@contextmanager
def timing_cores(pids: Iterable[int | None], device: str, timing_cores: int) -> Iterator[None]:
    """The timed children on the GPU's own cores for the `with` block, then back."""
    plan = split(timing_cores) if device.startswith("cuda") else None
    lane = _gpu_index(device)
    live = [p for p in pids if p is not None and Path(f"/proc/{p}").exists()]
    if plan is None or lane >= len(plan[0]):
        yield
        return
    for pid in live:
        _move(pid, plan[0][lane])
    try:
        yield
    finally:
        for pid in live:
            _move(pid, plan[1])
