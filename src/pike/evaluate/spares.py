"""Candidate children started ahead of their candidates, for searches.

A child spends seconds importing torch and pike before it can load anything (2 s on a
CPU host, more on the GPU hosts), and a search judges one candidate after another on
each worker. A spare is a child launched with a fresh, empty candidate folder that
waits for its request (`child_launch.launch_child`): the next evaluation on that device
writes its candidate into the folder and begins it, so the imports were done while
the previous candidate was judged.

What it trusts: nothing new. A spare has run only pike's own imports; it gets its
candidate, its task's fields and its build folder at `begin`, as any child does, and
it is used once. Spares exist only while a pool asks for them (`want`; a pool whose
search sends nothing more stops asking, LocalPool.retire_spares), and are killed at exit
like every child.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pike.evaluate.driver import finish
from pike.evaluate.leftovers import at_exit_uninterrupted, remove_tree
from pike.evaluate.sandbox import ChildProcess

log = logging.getLogger(__name__)


@dataclass
class Launched:
    """A candidate child launched but not begun, with the temp folder it owns and what
    its launcher made for it (the judge's CandidateFiles)."""

    folder: Path
    child: ChildProcess
    files: Any


_spares: dict[str, list[Launched]] = {}
_lock = threading.Lock()
_wanted = 0


def want(count: int) -> None:
    """A pool of `count` workers starts (positive) or ends (negative); spares are kept
    while any pool wants them, at most one per worker and device."""
    global _wanted
    with _lock:
        _wanted = max(0, _wanted + count)
        drop = [] if _wanted else [s for kept in _spares.values() for s in kept]
        if not _wanted:
            _spares.clear()
    for spare in drop:
        _discard(spare)


def take(key: str) -> Launched | None:
    """A spare launched with settings `key`, if one waits."""
    with _lock:
        kept = _spares.get(key)
        while kept:
            spare = kept.pop()
            if spare.child.alive():
                return spare
            _discard(spare)
    return None


def replenish(key: str, launch: Callable[[], Launched]) -> None:
    """Launch a spare for the next evaluation with settings `key`, where pools want one
    and fewer wait than they have workers."""
    with _lock:
        if len(_spares.get(key, [])) >= _wanted:
            return
    try:
        spare = launch()
    except OSError as err:  # a full disk, no more processes: evaluations launch their own
        log.info("no spare child: %s", err)
        return
    with _lock:
        if _wanted and len(_spares.get(key, [])) < _wanted:
            _spares.setdefault(key, []).append(spare)
            return
    _discard(spare)


def forget_pools() -> None:
    """As if every pool had ended: no spare kept or launched until one starts."""
    global _wanted
    with _lock:
        _wanted = 0
    close_all()


def close_all() -> None:
    with _lock:
        drop = [s for kept in _spares.values() for s in kept]
        _spares.clear()
    for spare in drop:
        _discard(spare)


def _discard(spare: Launched) -> None:
    finish(spare.child)  # never begun: killed, it ran only pike's imports
    remove_tree(spare.folder)


at_exit_uninterrupted(close_all)
