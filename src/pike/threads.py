"""Work items in threads, where each item may spend budget or device time."""

from __future__ import annotations

import contextvars
import heapq
import sys
import threading
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor, as_completed
from typing import TypeVar

Item = TypeVar("Item")
Result = TypeVar("Result")


def unwinding_stop() -> bool:
    """Whether this thread is unwinding a Ctrl-C (or a SIGTERM pike turned into one) or
    an exit (rich's, on output closed under it), as seen from a `finally` or an
    `__exit__`: the process is ending, so cleanups that would wait on a busy child or a
    worker thread end it at once instead."""
    return isinstance(sys.exc_info()[1], (KeyboardInterrupt, SystemExit))


def run_each(fn: Callable[[Item], Result], items: Iterable[Item], workers: int,
             name: str, stop: Callable[[BaseException], None] | None = None
             ) -> Iterator[Result]:
    """`fn(item)` for every item, `workers` at once, each in a copy of the caller's context
    (so a campaign's drain reaches its threads); results in the order they finish.

    On an error, items not started yet never start (each would spend budget or device
    time), `stop` tells the running ones to start nothing more, and they are waited for,
    so that what they finish is recorded before the caller closes its store; then the
    error propagates. On Ctrl-C (or an exit: rich's, on output closed, raised in a worker
    as it printed) nothing is waited for.
    """
    pool = ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix=name)
    try:
        futures = [pool.submit(contextvars.copy_context().run, fn, item) for item in items]
        for future in as_completed(futures):
            yield future.result()
    except BaseException as err:
        if stop is not None:
            stop(err)
        pool.shutdown(wait=not unwinding_stop(), cancel_futures=True)
        raise
    pool.shutdown()


class InOrder:
    """A semaphore of `count` places whose waiters get them by rank, lowest first, not
    by whoever asks at the moment one is freed (a plain semaphore's waiter, woken, can
    lose the place to a thread that just arrived). A waiter does not hold a place for
    a rank that has not asked yet. `pike bench` ranks by the task's place in its list:
    in a resumed call on the H200 level2 bench, a search with 4 s of its budget left
    waited five minutes while tasks after it in the list searched and measured."""

    def __init__(self, count: int) -> None:
        self._free = count
        self._waiting: list[int] = []  # a heap of ranks
        self._changed = threading.Condition()

    def acquire(self, rank: int) -> None:
        with self._changed:
            heapq.heappush(self._waiting, rank)
            try:
                while not (self._free > 0 and self._waiting[0] == rank):
                    self._changed.wait()
            except BaseException:  # an interrupt while waiting: out of the line
                self._waiting.remove(rank)
                heapq.heapify(self._waiting)
                self._changed.notify_all()
                raise
            heapq.heappop(self._waiting)
            self._free -= 1
            self._changed.notify_all()  # the next in line, where another place is free

    def release(self) -> None:
        with self._changed:
            self._free += 1
            self._changed.notify_all()
