"""One device, many evaluations: timing runs alone, other GPU work may share.

Evaluations in several processes (a benchmark with `--jobs`, an evaluation pool) share a
GPU. Correctness trials may overlap each other, but a timed window must see no other
candidate's GPU work, or the speedup measures the neighbours. So trials hold the device's
lock shared and timing holds it exclusive. Plain `flock` lets new shared holders in while
a timer waits, which can starve timing for as long as trials keep arriving; a second
lock, the turnstile, gives the timer priority: whoever wants the device passes through the
turnstile, and a timer keeps it closed while it waits for the shared holders to leave.

The locks are files under the cache dir keyed by the device as this host names it
(CUDA_VISIBLE_DEVICES included), so processes of one user on one host agree. CPU
evaluations are not locked: the host's cores are not one device.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def lock_dir() -> Path:
    base = os.environ.get("PIKE_LOCK_DIR") or Path.home() / ".cache" / "pike" / "locks"
    path = Path(base)
    path.mkdir(parents=True, exist_ok=True)
    return path


def _key(device: str) -> str:
    # The physical GPU, as the child will see it (driver.py maps the same way).
    index = int(device.partition(":")[2] or 0)
    visible = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    physical = visible[index] if index < len(visible) else str(index)
    return re.sub(r"[^A-Za-z0-9_.-]", "_", f"cuda-{physical}")


@contextmanager
def _flock(path: Path, mode: int) -> Iterator[None]:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, mode)
        yield
    finally:
        os.close(fd)  # closing releases the lock, also when the holder is killed


@contextmanager
def hold(device: str, *, exclusive: bool) -> Iterator[None]:
    """Hold `device` for trials (shared) or for timing (exclusive); no-op off CUDA."""
    if not device.startswith("cuda"):
        yield
        return
    folder, key = lock_dir(), _key(device)
    turnstile, device_lock = folder / f"{key}.turnstile", folder / f"{key}.lock"
    if exclusive:
        with _flock(turnstile, fcntl.LOCK_EX), _flock(device_lock, fcntl.LOCK_EX):
            yield
        return
    with _flock(turnstile, fcntl.LOCK_EX):
        fd = os.open(device_lock, os.O_RDWR | os.O_CREAT, 0o600)
        fcntl.flock(fd, fcntl.LOCK_SH)
    try:
        yield
    finally:
        os.close(fd)


def hold_for_work(device: str, scope: str) -> contextlib.AbstractContextManager[None]:
    """The shared hold around GPU work that is not timing (start, load, builds, trials),
    or nothing where `eval.device_lock` is timing_only (to measure what the hold buys)."""
    if scope == "timing_only":
        return contextlib.nullcontext()
    return hold(device, exclusive=False)
