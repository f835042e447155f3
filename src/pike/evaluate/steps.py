"""Where an evaluation's wall time goes, step by step.

The verdict's phases say how long the child spent loading, checking and timing; the steps
split that further (drawing inputs, moving them between processes, forward passes,
comparing, waiting for the device) in the parent and in each child, so the cost of an
evaluation can be measured against the work it does (bench/eval_overhead.py).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager


class StepClock:
    """Wall time summed by step name; a step may run many times."""

    def __init__(self) -> None:
        self.spans: dict[str, float] = {}

    @contextmanager
    def span(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.add(name, time.perf_counter() - start)

    def add(self, name: str, seconds: float) -> None:
        self.spans[name] = self.spans.get(name, 0.0) + seconds

    def merge(self, spans: dict[str, float], prefix: str = "") -> None:
        for name, seconds in spans.items():
            self.add(prefix + name, float(seconds))

    def rounded(self) -> dict[str, float]:
        return {name: round(s, 4) for name, s in self.spans.items()}


# The evaluation running on this thread (the pool runs one per thread) records its steps
# here, so helpers deep in the judge need no clock passed down to them.
_local = threading.local()


def current() -> StepClock:
    clock = getattr(_local, "clock", None)
    if clock is None:
        clock = _local.clock = StepClock()
    return clock


@contextmanager
def measuring() -> Iterator[StepClock]:
    """A fresh clock for this thread's evaluation; the one before comes back after."""
    before = getattr(_local, "clock", None)
    _local.clock = StepClock()
    try:
        yield _local.clock
    finally:
        _local.clock = before


def span(name: str) -> contextlib.AbstractContextManager[None]:
    return current().span(name)
