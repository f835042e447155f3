"""Host memory an evaluation child holds in files: what it writes to a scratch in memory.

A task's reference writes every input set it draws into the scratch
(leftovers.scratch_root: /dev/shm where it has room), seven trial sets and seven timed
sets, with the trials' expected outputs, and keeps them for its task's whole search; a
candidate writes its trials' outputs there. On a tmpfs those files are host memory that
no process's RSS shows: a KernelBench level1 task of 4 GiB outputs
(7_Matmul_with_small_K_dimension_, 9_Tall_skinny_matrix_multiplication_) holds 28 GiB so
(56 GiB while the timed sets' outputs were kept too), and a `pike bench --jobs 4` on an
H200 host of 125 GiB had the kernel's out-of-memory killer take children for minutes
while the host-memory gate, counting RSS only, expected 7.6 GiB of such a reference
(bench/results/bench-level1-h200-fresh.md). host_memory counts these bytes beside RSS.

Counted: the regular files of one name under the child's evaluation folder (the
`pike-<kind>-...` folder its work folder lies in), where that folder is on a tmpfs. A
file of several names is left out: a candidate's inputs are the reference's, linked, and
the reference's own figure was read before any candidate linked them (its peak is what
the gate learns). Left out too: files unlinked while held open (the disk limit counts
those, disk_use), and the OS sandbox's private /tmp and /dev/shm (2 GiB each at most).
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

from pike.evaluate.disk_use import folder_use

_IN_MEMORY = ("tmpfs", "ramfs")


def evaluation_folder(work_dir: Path) -> Path:
    """The folder of all a child's files: the one its work folder is in, where that is a
    `pike-...` temp folder (leftovers.make_temp_dir) or a folder of one (a confirming
    window's candidates, `pike-cand-.../c<id>/work`), else the work folder itself."""
    parent = work_dir.parent
    if parent.name.startswith("pike-") or parent.parent.name.startswith("pike-"):
        return parent
    return work_dir


def _scratch(folder: Path) -> Path:
    """The folder the `pike-...` folder holding `folder` lies in (the scratch)."""
    for above in (folder, *folder.parents):
        if above.name.startswith("pike-"):
            return above.parent
    return folder.parent


def held_bytes(work_dir: Path) -> int:
    """The bytes of host memory the child's files take now (0 where they are on disk)."""
    folder = evaluation_folder(work_dir)
    if not in_memory(_scratch(folder)):
        return 0
    return folder_use([folder], single_name_only=True).bytes


@functools.lru_cache(maxsize=64)
def in_memory(folder: Path) -> bool:
    """Whether `folder` is on a file system in memory (by the mount it lies under)."""
    try:
        path = os.path.realpath(folder)
        with open("/proc/self/mounts", encoding="utf-8", errors="replace") as mounts:
            table = [line.split()[1:3] for line in mounts if len(line.split()) >= 3]
    except OSError:
        return False
    best, kind = "", ""
    for point, fstype in table:
        point = point.replace("\\040", " ")
        if (path == point or path.startswith(point.rstrip("/") + "/")) and len(point) >= len(best):
            best, kind = point, fstype
    return kind in _IN_MEMORY
