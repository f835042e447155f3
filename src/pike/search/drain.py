"""A campaign's time limit (`pike bench --stop-after`): from its deadline on, no task,
baseline, candidate or LLM query starts; what is running ends and is recorded, and the
tasks not finished stay open for `--resume`.

A device session, a batch job or a CI slot ends at a known time. Cut off there (Ctrl-C,
SIGTERM) the evaluations in flight are lost, minutes of work each on large tasks; drained
before it, nothing is.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

_deadline: float | None = None


@contextmanager
def stop_after(seconds: float | None) -> Iterator[None]:
    """Nothing new starts once `seconds` have passed (None: no limit)."""
    global _deadline
    if seconds is None:
        yield
        return
    _deadline = time.monotonic() + seconds
    try:
        yield
    finally:
        _deadline = None


def due() -> bool:
    """The time limit has passed: start nothing new."""
    return _deadline is not None and time.monotonic() >= _deadline
