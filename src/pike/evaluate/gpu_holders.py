"""Who held a GPU's memory when a candidate ran out of it, said in its verdict.

The card's allocator names only the failing process's own share ("this process has
26.21 GiB memory in use ... 174.56 MiB is free" of 79 GiB): where the rest went is what
the user, or the next session, needs. On an H100, level5's 14_llama2_decode ran out in
its candidate's constructor twice, in an audit with one task at a time, and the 53 GiB
held elsewhere could not be told from the verdict. nvidia-smi lists each process's
memory on each card; pike names the processes that are its own children (the reference
of a task, a candidate) and itself.

Read after the fact (the candidate's child has ended by then), so it shows what stayed:
the reference children and other processes, not the peak of the moment.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import weakref
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

import psutil

from pike.evaluate import device_lock

if TYPE_CHECKING:
    from pike.evaluate.sandbox import ChildProcess

log = logging.getLogger(__name__)
_live: weakref.WeakSet[ChildProcess] = weakref.WeakSet()
_QUERY_TIMEOUT_S = 10.0


def started(child: ChildProcess) -> None:
    """A child whose process runs now (sandbox.ChildProcess.__enter__): one to name."""
    _live.add(child)


def said_in(message: str, device: str) -> str:
    """`message` with a line on who held `device`'s memory, where nvidia-smi says so. A
    diagnostic: whatever goes wrong in it leaves the message as it was."""
    try:
        line = holders_line(device)
    except Exception as err:  # noqa: BLE001 - never the verdict's failure
        log.debug("who held %s's memory could not be told: %s", device, err)
        return message
    return f"{message}\n{line}" if line else message


def holders_line(device: str, children: Iterable[ChildProcess] | None = None) -> str | None:
    """'GPU memory held after it ran out: 52.1 GiB by the reference of 14_llama2_decode
    (idle), ...', or None where it cannot be told (no nvidia-smi, another card kind)."""
    rows = _apps_on(device)
    if not rows:
        return None
    names = _names(list(_live) if children is None else list(children))
    parts = [f"{mib / 1024:.1f} GiB by {_named(pid, names) or _other(pid)}"
             for pid, mib in sorted(rows, key=lambda r: -r[1])]
    return "GPU memory held after it ran out: " + ", ".join(parts)


def _apps_on(device: str) -> list[tuple[int, int]]:
    """(pid, MiB) of each process with memory on `device`'s physical card."""
    uuid = _card_uuid(device)
    if uuid is None:
        return []
    out = _smi("--query-compute-apps=pid,gpu_uuid,used_memory")
    rows = []
    for line in out.splitlines():
        fields = [f.strip() for f in line.split(",")]
        if len(fields) == 3 and fields[1] == uuid and fields[0].isdigit() \
                and fields[2].isdigit():
            rows.append((int(fields[0]), int(fields[2])))
    return rows


def _card_uuid(device: str) -> str | None:
    """The UUID of the physical card `device` ('cuda', 'cuda:N') is, through
    CUDA_VISIBLE_DEVICES (indices or UUIDs), as nvidia-smi names cards."""
    if not device.startswith("cuda"):
        return None
    entry = device_lock.physical_gpu(device)
    cards = [[f.strip() for f in line.split(",")]
             for line in _smi("--query-gpu=index,uuid").splitlines()]
    for fields in cards:
        if len(fields) == 2 and (fields[0] == entry or fields[1].startswith(entry)):
            return fields[1]
    return None


def _smi(query: str) -> str:
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return ""
    try:
        done = subprocess.run([smi, query, "--format=csv,noheader,nounits"],
                              capture_output=True, text=True, timeout=_QUERY_TIMEOUT_S,
                              check=False)
    except (OSError, subprocess.SubprocessError):
        return ""
    return done.stdout if done.returncode == 0 else ""


def _names(children: list[ChildProcess]) -> dict[int, str]:
    """Each pid of pike's own (this process, each live child's process) and what it is."""
    children = [c for c in children
                if getattr(c, "request", None) is not None and getattr(c, "proc", None)]
    tasks = {c.request.task_sha256: Path(c.request.module_path).stem for c in children
             if c.request.role == "reference" and c.request.task_sha256}
    names = {}
    for child in children:
        proc = child.proc
        assert proc is not None
        task = tasks.get(child.request.task_sha256)
        what = (f"the reference of {Path(child.request.module_path).stem}"
                if child.request.role == "reference" else
                f"a candidate{f' of {task}' if task else ''}")
        names[proc.pid] = f"{what} ({child.phase}, pid {proc.pid})"
    names[os.getpid()] = f"pike itself (pid {os.getpid()})"
    return names


def _named(pid: int, names: dict[int, str]) -> str | None:
    """What `pid` is of pike's: the nearest of its ancestors (itself first) that is
    named; a child's process holds the GPU through the runner it starts (bwrap's)."""
    if pid in names:
        return names[pid]
    try:
        return next((names[p.pid] for p in psutil.Process(pid).parents() if p.pid in names),
                    None)
    except psutil.Error:
        return None


def _other(pid: int) -> str:
    try:
        return f"another process (pid {pid}, {psutil.Process(pid).name()})"
    except psutil.Error:
        return f"another process (pid {pid})"
