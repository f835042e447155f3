"""Which physical device a measurement ran on, so that a later call can tell whether it runs
on the same one.

A resumed audit keeps a task's baselines from an earlier call only where the task is now
measured on the very card that timed them (its file's verdict must be compared with a bar
from that card). Names do not tell: every H200 is called "NVIDIA H200", the OS sandbox
names every host "pike-sandbox", and `cuda:1` of one machine is not `cuda:1` of the next.
A CUDA device's UUID does tell, and on a CPU the kernel's boot id tells one host (and one
boot of it) from another. An empty identity means "unknown": nothing is ever kept on it.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

_BOOT_ID = Path("/proc/sys/kernel/random/boot_id")
_PROBE_SECONDS = 120.0


def identity(device: str) -> str:
    """This process's view of `device` ("cuda:1", "cpu"); '' where it cannot be told. In
    a process that may use CUDA (the evaluator's child, a probe), never in pike's own."""
    try:
        if device.startswith("cuda"):
            import torch

            return f"GPU-{torch.cuda.get_device_properties(torch.device(device)).uuid}"
        if device == "cpu":
            return f"cpu-{_BOOT_ID.read_text().strip()}"
    except Exception:  # noqa: BLE001 - an old torch, no driver, no procfs: unknown
        pass
    return ""  # other kinds of device (two of one host would share a boot id)


def _probe_code() -> str:
    return ("import sys; from pike.evaluate.device_identity import identity; "
            "print(identity(sys.argv[1]))")


def probe(device: str, timeout: float = _PROBE_SECONDS) -> str:
    """`identity(device)` as a fresh Python process sees it, so pike's own process never
    starts CUDA (its children own the GPU); '' where the probe fails or hangs."""
    if not device.startswith("cuda"):
        return identity(device)
    try:
        proc = subprocess.Popen([sys.executable, "-c", _probe_code(), device], stdout=subprocess.PIPE,
                                stderr=subprocess.DEVNULL, text=True)
    except OSError:
        return ""
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        # A probe stuck in the driver may not even die at once: give up on it, unwaited.
        proc.kill()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        return ""
    lines = out.strip().splitlines()
    return lines[-1] if proc.returncode == 0 and lines else ""
