"""The figure a search's candidate must come near to be worth a whole timing window.

On a GPU every timing window stops all other evaluations, and on the H200 level2 bench
those windows stood the searches still for 45% of their evaluations' time. A candidate
whose fastest call so far leaves it far behind the best its search has found
(`eval.timing.give_up_behind_best`) cannot become that search's best, so the rest of
its window buys nothing: the window ends after its first rounds (driver.time_interleaved)
and the verdict says so (`timed_rounds`, `behind_best`).

A search (the offline one, and the LLM ones through session.py) holds its task's bar
(`held`) and raises it as its verdicts come (`raise_to`); the evaluator reads it
(`current`) at each round of a candidate's window, so a best found while a candidate
waits for its window already counts. The bar lives in this process: evaluations a Ray
actor runs elsewhere are timed in full. Keyed by the task's source (Task.sha256):
searches of one task in one process share the best.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

_lock = threading.Lock()
_bars: dict[str, float] = {}  # task key -> the best speedup its searches found so far
_holders: dict[str, int] = {}


@contextmanager
def held(key: str, best: float | None = None) -> Iterator[None]:
    """The task's bar for the `with` block, starting at `best` (a resumed search's)."""
    with _lock:
        _holders[key] = _holders.get(key, 0) + 1
    if best:
        raise_to(key, best)
    try:
        yield
    finally:
        with _lock:
            _holders[key] -= 1
            if not _holders[key]:
                del _holders[key]
                _bars.pop(key, None)


def raise_to(key: str, speedup: float) -> None:
    """A new best of a held task; a lower figure, or a task nobody holds, changes nothing."""
    with _lock:
        if key in _holders and speedup > _bars.get(key, 0.0):
            _bars[key] = speedup


def current(key: str) -> float | None:
    """The best speedup a search of this task has found so far, or None."""
    with _lock:
        return _bars.get(key)
