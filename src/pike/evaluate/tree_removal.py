"""Removing a folder that candidate code wrote, from the trusted parent.

The folder is the candidate's (its work folder, an entry of the shared build cache), so
what is inside is chosen by the code being judged, and in the build cache other
candidates may still be changing it. shutil.rmtree with a handler that made folders
writable again (until 2026-12-06) was turned against the parent three ways, on a host
where pike does not run as root: the handler's chmod followed a link planted in a
read-only folder and made the link's target (a user's key, say) mode 0755; a folder
made unreadable raised TypeError from the handler, and 1,100 nested folders raised
RecursionError, each out of the evaluation that was removing them.

Here every folder is opened relative to its parent's handle with O_NOFOLLOW, so no link
is followed whatever is swapped in meanwhile; a folder is made readable and writable
through a handle to it alone (never by a name a link could stand in for); the walk is a
loop, not a recursion, and folders deeper than MAX_DEPTH are moved up to the top before
they are emptied, so the open handles stay few. Nothing raises: what cannot be removed
is logged and the answer says whether the folder is gone.
"""

from __future__ import annotations

import errno
import logging
import os
import secrets
import stat
from collections.abc import Callable, Iterator
from pathlib import Path

log = logging.getLogger(__name__)

MAX_DEPTH = 64  # open folder handles at once in one walk
_FOLDER = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
# Linux's O_PATH: a handle to a folder its mode keeps us from reading (elsewhere such a
# folder is left, and logged)
_FOLDER_HANDLE = getattr(os, "O_PATH", os.O_RDONLY) | os.O_DIRECTORY | os.O_NOFOLLOW
_MAX_PASSES = 100_000  # each moves at least MAX_DEPTH - 1 levels up


def remove_tree(path: Path | str, dir_fd: int | None = None) -> bool:
    """Remove `path` (a name in the folder open at `dir_fd`, or a path of ours) and all
    below it without following a link; True where it is gone. Never raises."""
    name = os.fspath(path)
    if dir_fd is None:
        if name in ("", ".", ".."):  # not a folder's name: "" would be the current folder
            log.warning("remove_tree: refused to remove %r", name)
            return False
        parent, name = os.path.split(os.path.abspath(name))
        try:
            parent_fd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY)
        except (OSError, ValueError):
            return False
        try:
            return remove_tree(name, parent_fd)
        finally:
            os.close(parent_fd)
    if name in ("", ".", "..") or "/" in name or "\0" in name:
        log.warning("remove_tree: refused to remove %r", name)
        return False
    if _unlinked(dir_fd, name):
        return True
    folder = open_folder(dir_fd, name)
    if folder is None:
        return False
    try:
        for _ in range(_MAX_PASSES):
            if not _empty_once(folder):
                break
    except Exception as err:  # noqa: BLE001 - e.g. MemoryError listing a huge folder
        log.warning("could not empty %s: %s", name, err)
    finally:
        os.close(folder)
    try:
        os.rmdir(name, dir_fd=dir_fd)
    except FileNotFoundError:
        pass
    except OSError as err:
        log.warning("could not remove %s: %s", name, err)
        return False
    return True


def open_folder(dir_fd: int, name: str, writable: bool = True) -> int | None:
    """A handle to the folder `name` in `dir_fd`, never through a link, made readable (and
    with `writable`, writable) by its owner (us) through that handle; None where it is not
    a folder or cannot be opened."""
    try:
        folder = os.open(name, _FOLDER, dir_fd=dir_fd)
    except PermissionError:  # made unreadable: change it through a handle to it alone
        try:
            handle = os.open(name, _FOLDER_HANDLE, dir_fd=dir_fd)
        except OSError:
            return None
        try:
            os.chmod(f"/proc/self/fd/{handle}", 0o700)
            folder = os.open(f"/proc/self/fd/{handle}", os.O_RDONLY | os.O_DIRECTORY)
        except OSError as err:
            log.warning("could not open the folder %s to remove it: %s", name, err)
            return None
        finally:
            os.close(handle)
    except OSError:  # a link (ELOOP), gone, or not a folder
        return None
    if not writable:
        return folder
    try:
        if os.fstat(folder).st_mode & 0o700 != 0o700:
            os.fchmod(folder, 0o700)
    except OSError:
        pass  # not ours: what it holds is removed where it can be
    return folder


def _unlinked(dir_fd: int, name: str) -> bool:
    """Remove `name` where it is not a folder (a link included); False for a folder."""
    try:
        os.unlink(name, dir_fd=dir_fd)
    except FileNotFoundError:
        return True
    except IsADirectoryError:
        return False
    except OSError as err:
        try:
            if stat.S_ISDIR(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode):
                return False
        except OSError:
            pass
        log.warning("could not remove %s: %s", name, err)
    return True  # gone, or nothing more to try: its folder's rmdir says it stayed


def _empty_once(top: int) -> bool:
    """One walk emptying the folder open at `top`; True where it moved folders deeper
    than MAX_DEPTH up into `top`, which another walk then empties."""
    moved = False

    def emptied(parent: int, name: str) -> None:
        try:
            os.rmdir(name, dir_fd=parent)
        except OSError:
            pass  # something in it stayed; already logged

    with FolderWalk(top, on_leave=emptied, quiet=False) as walk:
        for dir_fd, name in walk:
            if _unlinked(dir_fd, name):
                continue
            folder = open_folder(dir_fd, name)
            if folder is None:
                continue
            if walk.depth >= MAX_DEPTH:
                os.close(folder)  # writable now, so it can change parent
                moved |= _move_up(dir_fd, name, top)
                continue
            walk.enter(folder, name)
    return moved


class FolderWalk:
    """The entries below the folder open at `top`, as (folder handle, name), depth first,
    each folder entered only through a handle its caller opened (`enter`), so a walk
    never goes through a link whatever the candidate swaps in meanwhile. The disk poll,
    the build cache's measure and removal share it; each decides what to open, and how
    deep (`depth`: the folders open, `top` counted). `top` stays open; every handle
    entered is closed once its folder is read, or when the walk ends.

    `on_leave(parent handle, name)` runs once an entered folder is read to its end."""

    def __init__(self, top: int, on_leave: Callable[[int, str], None] | None = None,
                 quiet: bool = True) -> None:
        self._handles, self._names, self._here = [top], [listing(top, quiet)], []
        self._on_leave, self._quiet = on_leave, quiet

    @property
    def depth(self) -> int:
        return len(self._handles)

    def enter(self, folder: int, name: str = "") -> None:
        """Read the folder open at `folder` (named `name` in the last entry's folder)
        next; the walk closes `folder`."""
        self._handles.append(folder)
        self._names.append(listing(folder, self._quiet))
        self._here.append(name)

    def __iter__(self) -> Iterator[tuple[int, str]]:
        while self._handles:
            if not self._names[-1]:
                if len(self._handles) == 1:
                    return
                os.close(self._handles.pop())
                self._names.pop()
                name = self._here.pop()
                if self._on_leave is not None:
                    self._on_leave(self._handles[-1], name)
                continue
            yield self._handles[-1], self._names[-1].pop()

    def __enter__(self) -> FolderWalk:
        return self

    def __exit__(self, *_: object) -> None:
        for handle in self._handles[1:]:
            os.close(handle)
        del self._handles[1:]


def listing(folder: int, quiet: bool = True) -> list[str]:
    """The names in the folder open at `folder`; none where it cannot be read (logged
    unless `quiet`)."""
    try:
        return os.listdir(folder)
    except OSError as err:
        if not quiet:
            log.warning("could not list a folder to remove it: %s", err)
        return []


def entry_info(dir_fd: int, name: str) -> os.stat_result | None:
    """`name` in the folder open at `dir_fd` itself (a link, not what it names); None
    where it is gone."""
    try:
        return os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except OSError:
        return None


def _move_up(dir_fd: int, name: str, top: int) -> bool:
    """Move the folder `name` into `top`, under a name nobody could have planted."""
    for _ in range(5):
        try:
            os.rename(name, f".pike-deep-{secrets.token_hex(8)}", src_dir_fd=dir_fd,
                      dst_dir_fd=top)
            return True
        except OSError as err:
            if err.errno not in (errno.EEXIST, errno.ENOTEMPTY, errno.ENOTDIR, errno.EISDIR):
                log.warning("could not move %s up to remove it: %s", name, err)
                return False
    return False
