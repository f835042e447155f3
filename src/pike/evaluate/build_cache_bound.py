"""A bound on the candidates' shared build cache as a whole (`eval.limits.build_cache_gib`).

Every candidate that builds a CUDA extension leaves a folder of object files and a shared
library in the shared cache (build_cache_root), and Triton and inductor leave their
kernels beside them. Each candidate's own files are bounded while it runs (disk_use.py),
but the cache is kept between evaluations, on purpose (a candidate judged again, or one
that compiles a graph another already compiled, builds nothing), so over a long search
it grew without end: some tens of MB a built candidate, tens of GB over a few thousand.

After an evaluation the parent measures the cache (at most once every `EVERY_S`) and,
past the bound, removes whole entries, least recently changed first, until it holds at
most `TRIM_TO` of the bound. An entry is a build folder or one of Triton's or inductor's
top-level entries (inductor's precompiled headers and locks excepted: every child reads
or holds them, and nothing writes them once made). What was changed in the last
`YOUNGEST_S` stays whatever the total: a running candidate may be building it (a torch
extension's load takes its build folder's lock, which changes the folder). A cache hit
that only reads (Triton's, inductor's) changes nothing, so such an entry may go while it
is in use, and costs a rebuild, never a verdict: Triton and inductor build again what
they do not find. "Changed" is the inode's change time, which a candidate cannot set
(it can set a file's modification time, to the future too).

Candidates write this folder while it is trimmed: entries are removed through folder
handles that never follow a link (tree_removal.py), each measured again just before it
goes. A file of several names is counted once. An entry holding folders nested past
MAX_DEPTH (which no tool makes, and whose size the walk does not read) goes once it is
an hour old, whatever the total; one trim reads at most MAX_WALKED files and folders.
"""

from __future__ import annotations

import logging
import math
import os
import stat
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pike.evaluate.tree_removal import (
    MAX_DEPTH,
    FolderWalk,
    entry_info,
    listing,
    open_folder,
    remove_tree,
)

if TYPE_CHECKING:
    from pike.config import EvalConfig

log = logging.getLogger(__name__)

EVERY_S = 60.0
TRIM_TO = 0.75
YOUNGEST_S = 3600.0
# files and folders one trim reads at most: a cache planted with millions would otherwise
# slow the evaluation that trims it
MAX_WALKED = 1_000_000
# shared by every candidate: their entries are counted one by one
_SHARED_FOLDERS = ("triton", "inductor")
# inductor's own, read or held by every child: never an entry
_KEPT = {("inductor", "precompiled_headers"), ("inductor", "locks")}

_lock = threading.Lock()
_monotonic = time.monotonic  # the throttle's clock (tests move it)
_last_check: dict[str, float] = {}


@dataclass
class Entry:
    folder: str  # "" (the cache's root), "triton" or "inductor"
    name: str
    bytes: int  # allocated, each inode once: what removing it gives back at most
    changed: float  # the newest change time (ctime) of anything in it; inf: not all read
    deep: bool = False  # holds folders nested past MAX_DEPTH, which no tool makes

    @property
    def label(self) -> str:
        return f"{self.folder}/{self.name}" if self.folder else self.name


def entries(root_fd: int) -> list[Entry]:
    """The removable entries of the cache open at `root_fd` and what each holds."""
    found: list[Entry] = []
    walk = _Walk(seen=set(), left=MAX_WALKED)
    for name in listing(root_fd):
        if name in _SHARED_FOLDERS:
            shared = open_folder(root_fd, name)
            if shared is not None:  # else a link or a file: an entry like any other
                try:
                    found += [_measure(shared, name, n, walk) for n in listing(shared)
                              if (name, n) not in _KEPT]
                finally:
                    os.close(shared)
                continue
        found.append(_measure(root_fd, "", name, walk))
    if walk.left <= 0:
        log.warning("the build cache holds over %d files and folders: the ones past them "
                    "were not measured, and stay", MAX_WALKED)
    return found


def trim(root_fd: int, bound_bytes: int, now: float | None = None) -> list[Entry]:
    """Remove the least recently changed entries of the cache open at `root_fd` while it
    holds more than `bound_bytes`, down to TRIM_TO of it, sparing those changed in the
    last YOUNGEST_S; returns what was removed."""
    now = time.time() if now is None else now
    found = entries(root_fd)
    removed = [e for e in found if e.deep and now - e.changed >= YOUNGEST_S
               and _remove(root_fd, e, now)]  # not a cache's: its size unknown, it goes
    found = [e for e in found if e not in removed]
    total = sum(e.bytes for e in found)
    if total <= bound_bytes:
        return removed
    for entry in sorted(found, key=lambda e: e.changed):
        if total <= TRIM_TO * bound_bytes or now - entry.changed < YOUNGEST_S:
            break
        if _remove(root_fd, entry, now):
            total -= entry.bytes
            removed.append(entry)
    if total > bound_bytes:
        log.warning("the build cache holds %.1f GiB, over its bound of %.1f GiB, all of it "
                    "changed in the last %.0f min (eval.limits.build_cache_gib)",
                    total / 2**30, bound_bytes / 2**30, YOUNGEST_S / 60)
    return removed


def trim_when_due(cfg: EvalConfig) -> None:
    """After an evaluation: `trim` the candidates' build cache where a bound is set and
    its last check is EVERY_S old. Never raises: the bound is housekeeping, not part of
    a verdict."""
    bound_gib = cfg.limits.build_cache_gib
    if bound_gib is None:
        return
    try:
        from pike.evaluate.child_launch import build_cache_root

        root = build_cache_root(cfg)
        with _lock:
            if _monotonic() - _last_check.get(str(root), -EVERY_S) < EVERY_S:
                return
            _last_check[str(root)] = _monotonic()
        root_fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
        try:
            removed = trim(root_fd, int(bound_gib * 2**30))
        finally:
            os.close(root_fd)
    except Exception as err:  # noqa: BLE001 - nothing here may end an evaluation
        log.warning("the build cache could not be trimmed: %s", err)
        return
    if removed:
        log.info("build cache %s: removed %d entries (%.1f GiB), least recently changed "
                 "first", root, len(removed), sum(e.bytes for e in removed) / 2**30)


def _remove(root_fd: int, entry: Entry, now: float) -> bool:
    """Remove `entry` unless it changed since it was measured into the last YOUNGEST_S."""
    parent = root_fd if not entry.folder else open_folder(root_fd, entry.folder)
    if parent is None:
        return False
    try:
        again = _measure(parent, entry.folder, entry.name, _Walk(set(), MAX_WALKED))
        if now - again.changed < YOUNGEST_S:
            return False
        return remove_tree(entry.name, parent)
    finally:
        if parent != root_fd:
            os.close(parent)


@dataclass
class _Walk:
    seen: set[tuple[int, int]]  # (device, inode) counted
    left: int  # stats left to this trim


def _measure(parent_fd: int, folder: str, name: str, walk: _Walk) -> Entry:
    """What `name` in `parent_fd` holds, walked through handles, never through a link.
    Folders past MAX_DEPTH are not read (the entry is `deep`); one not read to its end
    (the walk's budget spent) counts as changed now, so it stays."""
    total, newest, deep = 0, 0.0, False

    def count(dir_fd: int, child: str) -> os.stat_result | None:
        nonlocal total, newest
        walk.left -= 1
        info = entry_info(dir_fd, child)
        if info is not None:
            newest = max(newest, info.st_ctime)
            if (info.st_dev, info.st_ino) not in walk.seen:
                walk.seen.add((info.st_dev, info.st_ino))
                total += info.st_blocks * 512
        return info

    if walk.left <= 0:
        return Entry(folder, name, 0, math.inf)
    info = count(parent_fd, name)
    if info is None or not stat.S_ISDIR(info.st_mode):
        return Entry(folder, name, total, newest)
    top = open_folder(parent_fd, name, writable=False)
    if top is None:
        return Entry(folder, name, total, newest)
    try:
        with FolderWalk(top) as folders:
            for dir_fd, child in folders:
                if walk.left <= 0:
                    return Entry(folder, name, total, math.inf)
                info = count(dir_fd, child)
                if info is None or not stat.S_ISDIR(info.st_mode):
                    continue
                if folders.depth >= MAX_DEPTH:
                    deep = True
                    continue
                below = open_folder(dir_fd, child, writable=False)
                if below is not None:
                    folders.enter(below)
    finally:
        os.close(top)
    return Entry(folder, name, total, newest, deep)
