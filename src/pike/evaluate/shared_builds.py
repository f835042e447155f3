"""The reference's torch.compile builds, copied one way into the candidates' build cache.

A task's baseline builds each compile mode in the reference's own child, with the device
held alone while max-autotune autotunes. A candidate that is one of those modes (the
offline strategy's `compile:*`, alone or with transformations that leave the graph as it
is) used to build and autotune the same graph again in a cache of its own, beside other
evaluations: on an H200 level2 bench such candidates spent a median 48 s and up to
minutes in their build, and an autotuning run beside other work can pick other kernels
than the baseline's. Copied, inductor's graph cache and Triton's kernels let the
candidate load the baseline's build (and its autotuning choices).

What it trusts: nothing new. The copy goes from the reference's cache (only the trusted
reference child writes there) into the candidates' (which every candidate may write
already, docs/guards.md); nothing goes the other way, so no candidate can reach what the
reference's child loads. The candidates' cache is theirs to fill with links, so this
process walks it by directory handles that never follow a link, and writes each file
under a fresh name before it renames it in place: a link planted there cannot send the
copy anywhere else, and a reader never sees half a file. Copying is only a saving: any
error leaves the candidates to build for themselves.
"""

from __future__ import annotations

import logging
import os
import secrets
import stat
import time
from pathlib import Path

from pike.config import EvalConfig
from pike.evaluate.child_launch import build_cache_root

log = logging.getLogger(__name__)

# Triton's kernels before inductor's graphs that load them; inductor's precompiled C++
# header too (CPU kernels), which sits in its cache folder
_SHARED = ("triton", "inductor")
_SKIPPED_DIRS = frozenset({"locks"})
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
_CHUNK = 1 << 20


def share_reference_builds(cfg: EvalConfig, since: float | None = None) -> int:
    """Copy into the candidates' build cache every file of the reference's inductor and
    Triton caches it lacks (with `since`, a time.time(), only those in folders changed
    since then: a baseline's own builds); returns how many were copied.

    The reference's cache keeps every task's builds of every run on the host, and a walk
    that looks at each of its files took 0.5 s per 20,000 files with nothing to copy;
    a file written into a folder changes that folder's time, so folders older than
    `since` are passed without a look at their files. Builds a baseline found in the
    reference's cache, not made anew, were copied when they were made."""
    source, target = build_cache_root(cfg, "reference"), build_cache_root(cfg, "candidate")
    started, copied = time.monotonic(), 0
    try:
        root = os.open(target, os.O_RDONLY | os.O_DIRECTORY)
    except OSError as err:
        log.debug("reference builds not shared: %s", err)
        return 0
    try:
        for part in _SHARED:
            copied += _copy_tree(source / part, source, root, since)
    finally:
        os.close(root)
    if copied:
        log.debug("shared %d files of the reference's builds with the candidates in %.1f s",
                  copied, time.monotonic() - started)
    return copied


def _copy_tree(top: Path, source_root: Path, target_root: int, since: float | None) -> int:
    copied = 0
    # os.walk never enters a link to a folder (and the reference's cache holds none)
    for folder, subfolders, files in os.walk(top):
        subfolders[:] = sorted(d for d in subfolders if d not in _SKIPPED_DIRS)
        if not files or (since is not None and _changed_at(folder) < since):
            continue
        parts = Path(folder).relative_to(source_root).parts
        into = _open_folder(target_root, parts)
        if into is None:
            continue
        try:
            # Triton's group file names the files a kernel needs: it comes last
            for name in sorted(files, key=lambda n: (n.startswith("__grp__"), n)):
                path = Path(folder, name)
                try:
                    mode = os.lstat(path).st_mode  # once: a link or a special file is passed
                except OSError:
                    continue
                if not stat.S_ISREG(mode) or _present(name, into):
                    continue
                try:
                    _copy_file(path, name, into, mode & 0o755)
                    copied += 1
                except OSError as err:
                    log.debug("not shared: %s (%s)", path, err)
        finally:
            os.close(into)
    return copied


def _open_folder(root: int, parts: tuple[str, ...]) -> int | None:
    """A handle on root/parts, made where missing, reached without following any link;
    None where a part is a link or not a folder."""
    fd = os.dup(root)
    try:
        for part in parts:
            try:
                os.mkdir(part, 0o755, dir_fd=fd)
            except FileExistsError:
                pass
            step = os.open(part, _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = step
        return fd
    except OSError as err:
        log.debug("not shared into %s: %s", "/".join(parts), err)
        os.close(fd)
        return None


def _changed_at(folder: str) -> float:
    try:
        return os.stat(folder).st_mtime
    except OSError:
        return 0.0


def _present(name: str, folder: int) -> bool:
    """Whether the candidates' folder has the name already; where it cannot be told (a
    folder a candidate left unsearchable), as if it had: nothing is copied there."""
    try:
        os.stat(name, dir_fd=folder, follow_symlinks=False)
        return True
    except FileNotFoundError:
        return False
    except OSError:
        return True


def _copy_file(path: Path, name: str, folder: int, mode: int) -> None:
    temporary = f".pike-{secrets.token_hex(6)}.part"
    out = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW,
                  mode | 0o600, dir_fd=folder)
    try:
        with os.fdopen(out, "wb") as sink, open(path, "rb") as source:
            while chunk := source.read(_CHUNK):
                sink.write(chunk)
        os.replace(temporary, name, src_dir_fd=folder, dst_dir_fd=folder)
    except BaseException:
        try:
            os.unlink(temporary, dir_fd=folder)
        except OSError:
            pass
        raise
