"""The figure a search's candidate must come near to be worth a whole timing window.

On a GPU every timing window stops all other evaluations, and on the H200 level2 bench
those windows stood the searches still for 45% of their evaluations' time. A candidate
whose fastest call so far leaves it far behind the bar of its search
(`eval.timing.give_up_behind_best`) cannot become that search's best, nor one of the
candidates its confirming window times again, so the rest of its window buys nothing:
the window ends after its first rounds (timing_window.time_interleaved) and the verdict says so
(`timed_rounds`, `behind_best`). The bar is the `keep`-th best figure so far
(`search.bar_rank`, 1: the best). The confirming window always times the top few again,
because a search window can misjudge them; with the bar at the `search.confirm_top`-th,
a candidate that could still be among them is timed in full, at the cost of cutting far
fewer (config.py says how many on the H200 level2 bench).

A search (the offline one, and the LLM ones through session.py) holds its task's bar
(`held`) and raises it as its verdicts come (`raise_to`); the evaluator reads it
(`current`) at each round of a candidate's window, so a figure found while a candidate
waits for its window already counts. The bar lives in this process: evaluations a Ray
actor runs elsewhere are timed in full. Keyed by the task's source (Task.sha256):
searches of one task in one process share it.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

_lock = threading.Lock()
_figures: dict[str, list[float]] = {}  # task key -> its best speedups so far, highest first
_keep: dict[str, int] = {}  # task key -> how many of them the bar is the last of
_holders: dict[str, int] = {}


@contextmanager
def held(key: str, figures: Iterable[float] = (), keep: int = 1) -> Iterator[None]:
    """The task's bar for the `with` block, the `keep`-th best of the search-time
    speedups given (a resumed search's) and of those raised later."""
    with _lock:
        _holders[key] = _holders.get(key, 0) + 1
        _keep[key] = max(_keep.get(key, 1), keep, 1)
        _figures.setdefault(key, [])
    for speedup in figures:
        raise_to(key, speedup)
    try:
        yield
    finally:
        with _lock:
            _holders[key] -= 1
            if not _holders[key]:
                for table in (_holders, _keep, _figures):
                    table.pop(key, None)


def raise_to(key: str, speedup: float | None) -> None:
    """A new figure of a held task (a rankable verdict's speedup); one below the kept
    ones, or of a task nobody holds, changes nothing."""
    with _lock:
        if key not in _holders or not speedup or speedup <= 0:
            return
        kept = _figures[key]
        kept.append(speedup)
        kept.sort(reverse=True)
        del kept[_keep[key]:]


def current(key: str) -> float | None:
    """The bar: the `keep`-th best speedup a search of this task has found so far, or
    None while it has fewer (or nobody holds it)."""
    with _lock:
        kept = _figures.get(key) or []
        return kept[-1] if key in _keep and len(kept) >= _keep[key] else None
