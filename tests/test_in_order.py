"""threads.InOrder: the places of `pike bench`'s slots go to the waiters by rank."""

from __future__ import annotations

import threading
import time

from pike.threads import InOrder


def _waiting(slots: InOrder, count: int) -> None:
    for _ in range(200):
        if len(slots._waiting) == count:
            return
        time.sleep(0.01)
    raise AssertionError(f"{count} waiters never lined up")


def test_a_freed_place_goes_to_the_lowest_rank_waiting_not_to_the_first_to_ask() -> None:
    slots = InOrder(1)
    slots.acquire(0)
    got: list[int] = []
    threads = []
    for n, rank in enumerate([5, 2, 9, 3], 1):  # asked for in this order
        def take(rank: int = rank) -> None:
            slots.acquire(rank)
            got.append(rank)
            time.sleep(0.02)  # the place held a moment before it is freed again
            slots.release()
        threads.append(threading.Thread(target=take))
        threads[-1].start()
        _waiting(slots, n)
    slots.release()
    for t in threads:
        t.join(5)
    assert got == [2, 3, 5, 9]


def test_a_waiter_takes_a_free_place_without_waiting_for_a_rank_that_has_not_asked() -> None:
    slots = InOrder(2)
    slots.acquire(7)
    done = threading.Event()

    def take() -> None:
        slots.acquire(8)
        done.set()

    threading.Thread(target=take, daemon=True).start()
    assert done.wait(2)
    # with both places held, the next waits; freed, it goes on
    third = threading.Event()

    def take_third() -> None:
        slots.acquire(1)
        third.set()

    threading.Thread(target=take_third, daemon=True).start()
    assert not third.wait(0.2)
    slots.release()
    assert third.wait(2)


def test_a_waiter_interrupted_leaves_the_line() -> None:
    slots = InOrder(1)
    slots.acquire(0)
    original = slots._changed.wait
    calls = [0]

    def wait_then_fail(timeout: float | None = None) -> bool:
        calls[0] += 1
        raise KeyboardInterrupt

    slots._changed.wait = wait_then_fail  # type: ignore[method-assign]
    try:
        slots.acquire(1)
    except KeyboardInterrupt:
        pass
    slots._changed.wait = original  # type: ignore[method-assign]
    assert calls[0] == 1 and slots._waiting == []
    slots.release()
    slots.acquire(2)  # not stuck behind the rank that left
