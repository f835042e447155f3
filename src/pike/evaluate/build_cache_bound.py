"""A bound on the candidates' shared build cache as a whole (`eval.limits.build_cache_gib`).

Every candidate that builds a CUDA extension leaves a folder of object files and a shared
library in the shared cache (build_cache_root), and Triton and inductor leave their
kernels beside them. Each candidate's own files are bounded while it runs (disk_use.py),
but the cache is kept between evaluations, on purpose (a candidate judged again, or one
that compiles a graph another already compiled, builds nothing), so over a long search
it grew without end: some tens of MB a built candidate, tens of GB over a few thousand.

After an evaluation the parent measures the cache (at most once every `EVERY_S`) and,
past the bound, removes whole entries, least recently written first, until it holds at
most `TRIM_TO` of the bound. An entry is a build folder or one of Triton's or inductor's
top-level entries. What was written in the last `YOUNGEST_S` stays whatever the total: a
running candidate may be reading or building it. What goes costs a rebuild if needed
again, never a verdict.
"""

from __future__ import annotations

import logging
import os
import stat
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from pike.evaluate.leftovers import remove_tree

log = logging.getLogger(__name__)

EVERY_S = 60.0
TRIM_TO = 0.75
YOUNGEST_S = 3600.0
# shared by every candidate: their entries are counted one by one
_SHARED_FOLDERS = ("triton", "inductor")

_lock = threading.Lock()
_last_check: dict[str, float] = {}


@dataclass
class Entry:
    path: Path
    bytes: int  # allocated: what removing it gives back
    written: float  # the newest modification time of anything in it


def entries(root: Path) -> list[Entry]:
    """The cache's removable entries and what each holds, without following links."""
    found: list[Entry] = []
    for child in _listing(root):
        if child.name in _SHARED_FOLDERS and child.is_dir() and not child.is_symlink():
            found += [_measure(grandchild) for grandchild in _listing(child)]
        else:
            found.append(_measure(child))
    return found


def trim(root: Path, bound_bytes: int, now: float | None = None) -> list[Entry]:
    """Remove the oldest entries of `root` while it holds more than `bound_bytes`, down to
    TRIM_TO of it, sparing those written in the last YOUNGEST_S; returns what was removed."""
    now = time.time() if now is None else now
    found = entries(root)
    total = sum(e.bytes for e in found)
    if total <= bound_bytes:
        return []
    removed: list[Entry] = []
    for entry in sorted(found, key=lambda e: e.written):
        if total <= TRIM_TO * bound_bytes or now - entry.written < YOUNGEST_S:
            break
        try:
            if entry.path.is_dir() and not entry.path.is_symlink():
                remove_tree(entry.path)
            else:
                entry.path.unlink()
        except OSError as err:  # another pike removed it, or it is in use: next time
            log.info("build cache: could not remove %s: %s", entry.path, err)
            continue
        total -= entry.bytes
        removed.append(entry)
    if total > bound_bytes:
        log.warning("build cache %s holds %.1f GiB, over its bound of %.1f GiB, all of it "
                    "written in the last %.0f min (eval.limits.build_cache_gib)", root,
                    total / 2**30, bound_bytes / 2**30, YOUNGEST_S / 60)
    return removed


def trim_when_due(root: Path, bound_gib: float | None) -> None:
    """After an evaluation: `trim` where a bound is set and the last check of this root
    is EVERY_S old. Never raises: the bound is housekeeping, not part of a verdict."""
    if bound_gib is None:
        return
    key = str(root)
    with _lock:
        if time.monotonic() - _last_check.get(key, -EVERY_S) < EVERY_S:
            return
        _last_check[key] = time.monotonic()
    try:
        removed = trim(root, int(bound_gib * 2**30))
    except OSError as err:
        log.warning("build cache %s: could not measure it: %s", root, err)
        return
    if removed:
        log.info("build cache %s: removed %d entries (%.1f GiB), least recently written "
                 "first", root, len(removed), sum(e.bytes for e in removed) / 2**30)


def _listing(folder: Path) -> list[Path]:
    try:
        return [Path(e.path) for e in os.scandir(folder)]
    except OSError:
        return []


def _measure(path: Path) -> Entry:
    total, newest = 0, 0.0
    stack = [str(path)]
    while stack:
        current = stack.pop()
        try:
            info = os.lstat(current)
        except OSError:
            continue
        total += info.st_blocks * 512
        newest = max(newest, info.st_mtime)
        if stat.S_ISDIR(info.st_mode):
            try:
                stack += [e.path for e in os.scandir(current)]
            except OSError:
                continue
    return Entry(path, total, newest)
