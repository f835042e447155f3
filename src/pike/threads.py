"""Work items in threads, where each item may spend budget or device time."""

from __future__ import annotations

import contextvars
import sys
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
