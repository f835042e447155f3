"""Work items in threads, where each item may spend budget or device time."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor, as_completed
from typing import TypeVar

Item = TypeVar("Item")
Result = TypeVar("Result")


def run_each(fn: Callable[[Item], Result], items: Iterable[Item], workers: int,
             name: str) -> Iterator[Result]:
    """`fn(item)` for every item, `workers` at once; results in the order they finish.

    On an error or Ctrl-C, items not started yet never start (each would spend budget or
    device time); the error propagates, and what ran is wherever `fn` recorded it.
    """
    pool = ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix=name)
    try:
        for future in as_completed([pool.submit(fn, item) for item in items]):
            yield future.result()
    except BaseException:
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown()
