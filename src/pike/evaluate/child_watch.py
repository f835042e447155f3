"""A child's memory and process limits held while pike is not waiting on it.

The receive loop (sandbox.ChildProcess._receive_one) checks them only while the parent
waits for the child's next message. Between messages a child can sit for a long time: its
answer sent, while the parent times the other side, compares outputs or waits for the
device. A thread the candidate left running goes on meanwhile, and a fork bomb or an
allocation started then had the host's process table or memory until the parent next
listened. One thread per pike process looks at every child begun and not being waited on,
once a second, and ends one over a limit with all it started (ChildProcess._end_all); the
parent hears why at its next receive, as if the loop had found it, or at its finish. A
child stopped by another evaluation's timer (device_lock) is looked at too: it holds what
it held.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from collections import defaultdict
from typing import TYPE_CHECKING

import psutil

if TYPE_CHECKING:
    from pike.evaluate.sandbox import ChildProcess

log = logging.getLogger(__name__)

EVERY_S = 1.0

_children: weakref.WeakSet[ChildProcess] = weakref.WeakSet()
_lock = threading.Lock()
_thread: threading.Thread | None = None


def watch(child: ChildProcess) -> None:
    """Look at `child` from now until `unwatch` (or until it is gone)."""
    global _thread
    with _lock:
        _children.add(child)
        if _thread is None:
            _thread = threading.Thread(target=_run, name="pike-child-watch", daemon=True)
            _thread.start()


def unwatch(child: ChildProcess) -> None:
    with _lock:
        _children.discard(child)


def watched() -> int:
    with _lock:
        return len(_children)


def _run() -> None:
    """Until no child is left to watch: the thread ends then, and `watch` starts another
    (also where this one fails, so the watch is never silently gone)."""
    global _thread
    try:
        while True:
            time.sleep(EVERY_S)
            with _lock:
                children = list(_children)
                if not children:
                    return
            trees = _trees([c.proc.pid for c in children if c.proc is not None])
            for child in children:
                proc = child.proc
                try:
                    child.check_unwaited(trees.get(proc.pid) if proc is not None else None)
                except Exception:  # one child's trouble must not end the watch of the others
                    log.exception("watching a child's limits")
    finally:
        with _lock:
            _thread = None


def _trees(roots: list[int]) -> dict[int, list[psutil.Process]]:
    """Each root's processes, itself first, from one walk of the host's process table for
    all of them: a walk reads every process's parent, and one per child each second
    would keep the parent's threads waiting for the GIL (sandbox._tree_rss says what
    that did to timed blocks)."""
    by_pid: dict[int, psutil.Process] = {}
    children: dict[int, list[psutil.Process]] = defaultdict(list)
    # no `attrs`: process_iter hands every thread the same cached Process objects, and
    # attrs replace their `info`, which another thread may be reading (a clean-clone CI
    # saw sandbox.leftover_processes find no 'name' in it)
    for p in psutil.process_iter():
        try:
            parent = p.ppid()
        except psutil.Error:
            continue
        by_pid[p.pid] = p
        children[parent].append(p)
    trees = {}
    for root in roots:
        if root not in by_pid:
            continue
        tree, below = [by_pid[root]], [root]
        while below:
            for c in children.get(below.pop(), []):
                if c.pid not in (root, 0):
                    tree.append(c)
                    below.append(c.pid)
        trees[root] = tree
    return trees
