"""What a candidate's child writes, and the bound on it (`eval.limits.disk_gib`).

A candidate may write files: its folders (`work`, with its HOME and TMPDIR, and
`outputs`), its printed output, and inside the OS sandbox its private /tmp and /dev/shm.
Nothing bounded them before, so one candidate could fill the disk, or /dev/shm (host
memory that no process's RSS counts), and fail every evaluation beside it. Three bounds
now hold, each to the same figure:
- the parent adds up the candidate's folders and its printed output while it runs
  (`folder_use`, polled with its memory) and ends it past the limit, or past
  `MAX_ENTRIES` files;
- the child lowers its own RLIMIT_FSIZE to the limit before any candidate code runs, so
  no single file grows past it between two polls (a write past it fails with EFBIG;
  a program the candidate starts is killed by SIGXFSZ);
- the sandbox's private /tmp and /dev/shm are tmpfs of `PRIVATE_TMPFS_BYTES` each.

A legitimate candidate writes its trials' outputs (the parent unlinks each file once read,
so a few are there at once) and small build files: the default limit is a fixed part and
four trials' outputs of the reference, so a level1 task of gigabytes of outputs keeps room.
The shared build cache is not counted: other candidates write there at the same time.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path

from pike.config import LimitsConfig

FIXED_BYTES = 8 * 2**30
OUTPUTS_FACTOR = 4
# A legitimate candidate's folders hold a handful of files; a walk of this many takes a
# few tenths of a second, which bounds what the poll costs the parent.
MAX_ENTRIES = 100_000
# How often the parent reads a child's folders: every so often, and less often while it is
# timed (each read waits for the GIL, as the memory's does: sandbox._memory_due).
EVERY_S = 0.25
TIMING_EVERY_S = 1.0
# The sandbox's private /tmp and /dev/shm each: a candidate's TMPDIR is its work folder, so
# only code that ignores it writes here (Python's multiprocessing semaphores, a tool's
# own temp files); tmpfs pages are host memory outside every RSS.
PRIVATE_TMPFS_BYTES = 2 * 2**30


def disk_limit_bytes(limits: LimitsConfig, trial_output_bytes: int) -> int:
    """The bound on what a candidate's child writes: `limits.disk_gib` where set, else the
    fixed part and `OUTPUTS_FACTOR` times one trial's outputs of the reference."""
    if limits.disk_gib is not None:
        return int(limits.disk_gib * 2**30)
    return FIXED_BYTES + OUTPUTS_FACTOR * max(0, trial_output_bytes)


@dataclass
class DiskUse:
    bytes: int  # allocated, not apparent: a sparse file counts what it holds
    entries: int  # files, folders and links seen; the walk stops past MAX_ENTRIES


def folder_use(folders: list[Path]) -> DiskUse:
    """What `folders` hold, without following links, each file once however many names
    it has; stops counting past `MAX_ENTRIES` entries (the caller treats that as over)."""
    total = entries = 0
    seen: set[tuple[int, int]] = set()
    stack = [str(f) for f in folders]
    while stack and entries <= MAX_ENTRIES:
        try:
            with os.scandir(stack.pop()) as listing:
                for entry in listing:
                    entries += 1
                    if entries > MAX_ENTRIES:
                        break
                    try:
                        info = entry.stat(follow_symlinks=False)
                    except OSError:  # gone meanwhile
                        continue
                    if stat.S_ISDIR(info.st_mode):
                        stack.append(entry.path)
                    elif stat.S_ISREG(info.st_mode) and (info.st_dev, info.st_ino) not in seen:
                        seen.add((info.st_dev, info.st_ino))
                        total += info.st_blocks * 512
        except OSError:  # a folder removed or made unreadable meanwhile
            continue
    return DiskUse(total, entries)


def file_use(fd: int) -> int:
    """The allocated bytes of an open file (the child's printed output)."""
    try:
        return os.fstat(fd).st_blocks * 512
    except OSError:
        return 0


@dataclass
class DiskExceeded:
    """The child's files went past the disk limit (or past MAX_ENTRIES files)."""

    used_bytes: int
    limit_bytes: int
    entries: int

    def message(self) -> str:
        if self.entries > MAX_ENTRIES:
            return (f"wrote more than {MAX_ENTRIES:,} files into its folders (a candidate "
                    "needs a handful)")
        return (f"exceeded the disk limit: {self.used_bytes / 2**30:.2f} GiB written to its "
                f"folders and printed output, limit {self.limit_bytes / 2**30:.2f} GiB "
                "(eval.limits.disk_gib)")


class DiskWatch:
    """A candidate's folders and printed output, read every so often against its limit."""

    def __init__(self, folders: list[Path], limit_bytes: int, output_fd: int) -> None:
        self.folders, self.limit_bytes, self.output_fd = folders, limit_bytes, output_fd
        self._read_at = float("-inf")

    def over(self, now: float, timing: bool) -> DiskExceeded | None:
        """Past the limit now, where a read is due (`now`: monotonic)."""
        if now - self._read_at < (TIMING_EVERY_S if timing else EVERY_S):
            return None
        self._read_at = now
        use = folder_use(self.folders)
        used = use.bytes + file_use(self.output_fd)
        if used > self.limit_bytes or use.entries > MAX_ENTRIES:
            return DiskExceeded(used, self.limit_bytes, use.entries)
        return None
