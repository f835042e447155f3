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
    handles = [top]
    names = [_names(top)]
    here: list[str] = []  # the name of each open folder below top, in its parent
    try:
        return _walk(top, handles, names, here)
    finally:
        for handle in handles[1:]:
            os.close(handle)


def _walk(top: int, handles: list[int], names: list[list[str]], here: list[str]) -> bool:
    moved = False
    while handles:
        if not names[-1]:
            if len(handles) == 1:
                break
            os.close(handles.pop())
            names.pop()
            try:
                os.rmdir(here.pop(), dir_fd=handles[-1])
            except OSError:
                pass  # something in it stayed; already logged
            continue
        name = names[-1].pop()
        if _unlinked(handles[-1], name):
            continue
        folder = open_folder(handles[-1], name)
        if folder is None:
            continue
        if len(handles) >= MAX_DEPTH:
            os.close(folder)  # writable now, so it can change parent
            moved |= _move_up(handles[-1], name, top)
            continue
        handles.append(folder)
        names.append(_names(folder))
        here.append(name)
    return moved


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


def _names(folder: int) -> list[str]:
    try:
        return os.listdir(folder)
    except OSError as err:
        log.warning("could not list a folder to remove it: %s", err)
        return []
