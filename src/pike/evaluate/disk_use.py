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

A legitimate candidate writes its trials' outputs (the parent unlinks each file once read)
and small build files: the default limit is a fixed part and every trial's outputs of the
reference and two more, so a level1 task of gigabytes of outputs keeps room. Counted too:
files the tree holds open after their last name is gone (written, then unlinked), and a
folder the parent cannot read is made readable again or ends the candidate. Not counted:
the shared build cache, where other candidates write at the same time.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from pike.config import LimitsConfig
from pike.evaluate.tree_removal import FolderWalk, entry_info, open_folder

FIXED_BYTES = 8 * 2**30
# A legitimate candidate's folders hold a handful of files; a walk of this many takes a
# few tenths of a second, which bounds what the poll costs the parent.
MAX_ENTRIES = 100_000
# Folders nested deeper are not read, and end the candidate as an unreadable one does: a
# legitimate candidate's folders go a few levels down, and the walk holds a handle per
# level (several candidates are polled at once, each handle a file descriptor).
MAX_DEPTH = 32
# How often the parent reads a child's folders: every so often, and less often while it is
# timed (each read waits for the GIL, as the memory's does: sandbox._memory_due).
EVERY_S = 0.25
TIMING_EVERY_S = 1.0
# The sandbox's private /tmp and /dev/shm each: a candidate's TMPDIR is its work folder, so
# only code that ignores it writes here (Python's multiprocessing semaphores, a tool's
# own temp files); tmpfs pages are host memory outside every RSS.
PRIVATE_TMPFS_BYTES = 2 * 2**30


def disk_limit_bytes(limits: LimitsConfig, trial_output_bytes: int, trials: int) -> int:
    """The bound on what a candidate's child writes: `limits.disk_gib` where set, else the
    fixed part and every trial's outputs at once (the child writes them without waiting
    for the parent, which reads a file at about 4 s a GB), the shifted trial's, the check
    after timing's and one more."""
    if limits.disk_gib is not None:
        return int(limits.disk_gib * 2**30)
    return FIXED_BYTES + (trials + 3) * max(0, trial_output_bytes)


@dataclass
class DiskUse:
    bytes: int  # allocated, not apparent: a sparse file counts what it holds
    entries: int  # files, folders and links seen; the walk stops past MAX_ENTRIES
    hidden: list[str] = field(default_factory=list)  # folders not read, and why
    seen: set[tuple[int, int]] = field(default_factory=set)  # (device, inode) counted


def folder_use(folders: list[Path], single_name_only: bool = False) -> DiskUse:
    """What `folders` hold, without following links, each file once however many names
    it has (`single_name_only`: only files of one name, not those linked from elsewhere);
    stops counting past `MAX_ENTRIES` entries (the caller treats that as over). A
    folder the candidate made unreadable is made readable (the parent owns it) and read;
    one that stays so, or lies deeper than MAX_DEPTH, is `hidden`.

    The candidate runs meanwhile and may swap any folder for a link: every folder is
    opened relative to its parent's handle, never through a link, so the walk stays in
    its folders (a walk by path followed a link on the way: host folders read and counted)."""
    use = DiskUse(0, 0)
    for folder in folders:
        try:
            top = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)  # ours; below it, theirs
        except FileNotFoundError:
            continue
        except OSError:
            use.hidden.append(f"{Path(folder).name}, unreadable")
            continue
        _walk(top, use, single_name_only)
    return use


def _walk(top: int, use: DiskUse, single_name_only: bool = False) -> None:
    """Count what the folder open at `top` holds into `use`; closes `top`."""
    try:
        with FolderWalk(top) as walk:
            for dir_fd, name in walk:
                if use.entries > MAX_ENTRIES:
                    break
                use.entries += 1
                info = entry_info(dir_fd, name)
                if info is None:  # gone meanwhile
                    continue
                if stat.S_ISREG(info.st_mode) and not (single_name_only and info.st_nlink > 1):
                    _count(use, info)
                elif stat.S_ISDIR(info.st_mode):
                    _enter(walk, dir_fd, name, use)
    finally:
        os.close(top)


def _enter(walk: FolderWalk, dir_fd: int, name: str, use: DiskUse) -> None:
    """Walk into the folder `name` next, or note it `hidden`. It is opened before its
    depth is weighed, so a folder the candidate swaps for a link meanwhile is passed over
    rather than reported."""
    below = open_folder(dir_fd, name, writable=False)
    if below is None:
        if (info := entry_info(dir_fd, name)) is not None and stat.S_ISDIR(info.st_mode):
            use.hidden.append(f"{name}, unreadable")  # still a folder, not swapped
    elif walk.depth >= MAX_DEPTH:
        os.close(below)
        use.hidden.append(f"{name}, over {MAX_DEPTH} folders deep")
    else:
        walk.enter(below)


def _count(use: DiskUse, info: os.stat_result) -> None:
    if (info.st_dev, info.st_ino) not in use.seen:
        use.seen.add((info.st_dev, info.st_ino))
        use.bytes += info.st_blocks * 512


def count_unlinked(use: DiskUse, pids: list[int]) -> None:
    """Add the files `pids` hold open whose last name is gone: written, then unlinked, they
    take space no folder shows (memfd files too). Processes whose descriptors this process
    may not read are passed over."""
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                info = os.stat(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if stat.S_ISREG(info.st_mode) and info.st_nlink == 0:
                _count(use, info)


@dataclass
class DiskExceeded:
    """The child's files went past the disk limit (or past MAX_ENTRIES files, or hid a
    folder from the count)."""

    used_bytes: int
    limit_bytes: int
    entries: int
    hidden: list[str] = field(default_factory=list)

    def message(self) -> str:
        if self.hidden:
            return (f"hid a folder of its own from the evaluator, which counts what it "
                    f"writes ({self.hidden[0]})")
        if self.entries > MAX_ENTRIES:
            return (f"wrote more than {MAX_ENTRIES:,} files into its folders (a candidate "
                    "needs a handful)")
        return (f"exceeded the disk limit: {self.used_bytes / 2**30:.2f} GiB written to its "
                f"folders and printed output, limit {self.limit_bytes / 2**30:.2f} GiB "
                "(eval.limits.disk_gib)")


class DiskWatch:
    """A candidate's folders and printed output, read every so often against its limit."""

    def __init__(self, folders: list[Path], limit_bytes: int, output_fd: int,
                 pids: Callable[[], list[int]] = list) -> None:
        self.folders, self.limit_bytes, self.output_fd = folders, limit_bytes, output_fd
        self.pids = pids  # the child tree's processes, for the files they hold open
        self._read_at = float("-inf")

    def over(self, now: float, timing: bool) -> DiskExceeded | None:
        """Past the limit now, where a read is due (`now`: monotonic)."""
        if now - self._read_at < (TIMING_EVERY_S if timing else EVERY_S):
            return None
        self._read_at = now
        use = folder_use(self.folders)
        try:  # the printed output: nameless, held open by the child
            _count(use, os.fstat(self.output_fd))
        except OSError:
            pass
        count_unlinked(use, self.pids())
        if use.bytes > self.limit_bytes or use.entries > MAX_ENTRIES or use.hidden:
            return DiskExceeded(use.bytes, self.limit_bytes, use.entries, use.hidden)
        return None
