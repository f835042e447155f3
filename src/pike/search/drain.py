"""A campaign's time limit (`pike bench --stop-after`): from its deadline on, no task,
baseline, candidate or LLM query starts; what is running ends and is recorded, and the
tasks not finished stay open for `--resume`.

A device session, a batch job or a CI slot ends at a known time. Cut off there (Ctrl-C,
SIGTERM) the evaluations in flight are lost, minutes of work each on large tasks; drained
before it, nothing is.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Iterator
from contextlib import contextmanager

_deadline: float | None = None
_halted: weakref.WeakSet[threading.Thread] = weakref.WeakSet()


@contextmanager
def stop_after(seconds: float | None) -> Iterator[None]:
    """Nothing new starts once `seconds` have passed (None: no limit).

    Nor, in the threads it leaves behind, after the block ends in an error: a task's error
    or Ctrl-C ends the campaign while other tasks' threads are still in an evaluation or
    an LLM call, and those must not go on to start more (budget and device time spent for
    a campaign that has ended). Only the threads alive at that moment are held, so a later
    campaign or search in the same process starts as usual.
    """
    global _deadline
    _deadline = None if seconds is None else time.monotonic() + seconds
    try:
        yield
    except BaseException:
        me = threading.current_thread()
        _halted.update(t for t in threading.enumerate() if t is not me)
        raise
    finally:
        _deadline = None


def due() -> bool:
    """The time limit has passed, or this thread outlived its campaign: start nothing new."""
    if threading.current_thread() in _halted:
        return True
    return _deadline is not None and time.monotonic() >= _deadline
