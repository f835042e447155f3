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
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

from pike.threads import unwinding_stop

_deadline: float | None = None
# The campaign this thread works for, as its threads see it (threads.run_each carries the
# caller's context into each item): set once the campaign ends in an error.
_halt: ContextVar[threading.Event | None] = ContextVar("pike_campaign_halt", default=None)
# Set with the halt where Ctrl-C (or a SIGTERM pike turned into one) ended the campaign:
# its evaluation children are being killed, unlike after another task's error, where
# they finish what they are in.
_interrupt: ContextVar[threading.Event | None] = ContextVar("pike_campaign_interrupt",
                                                            default=None)


@contextmanager
def stop_after(seconds: float | None) -> Iterator[None]:
    """Nothing new starts once `seconds` have passed (None: no limit), nor, in this
    campaign's threads, once the block ends in an error or `halt()` is called.

    A task's error or Ctrl-C ends the campaign while other tasks' threads are still in an
    evaluation or an LLM call; those must not go on to start more (budget and device time
    spent for a campaign that has ended). The halt is the campaign's own: a later campaign,
    or a search on another thread of the same process, starts as usual.
    """
    global _deadline
    halted, interrupted = threading.Event(), threading.Event()
    tokens = _halt.set(halted), _interrupt.set(interrupted)
    if seconds is not None:
        _deadline = time.monotonic() + seconds
    try:
        yield
    except BaseException:
        halt(interrupted=unwinding_stop())
        raise
    finally:
        _halt.reset(tokens[0])
        _interrupt.reset(tokens[1])
        if seconds is not None:
            _deadline = None


def halt(interrupted: bool = False) -> None:
    """This campaign starts nothing more (its threads finish what they are in).
    `interrupted` (a Ctrl-C): its children are being killed too."""
    for var, on in ((_halt, True), (_interrupt, interrupted)):
        event = var.get()
        if on and event is not None:
            event.set()


def halted() -> bool:
    """This thread's campaign has ended, in an error or Ctrl-C (not by its time limit)."""
    halt_event = _halt.get()
    return halt_event is not None and halt_event.is_set()


def interrupted() -> bool:
    """This thread's campaign was ended by Ctrl-C: its evaluation children are being
    killed, so a failure seen now may be that kill, not the work's own."""
    event = _interrupt.get()
    return event is not None and event.is_set()


def due() -> bool:
    """The time limit has passed, or this thread's campaign has ended: start nothing new."""
    return halted() or (_deadline is not None and time.monotonic() >= _deadline)
