"""Code the interpreter calls back on its own, from inside whatever frame runs: signal
handlers (at any point between bytecodes), the garbage collector's callbacks and the
finalizers of the cycles it frees (at any allocation). Red team round 10 walked `f_back`
from both to the frame that held the timing's sealed probe sets, answered every probe
untimed and served the timed calls from a memo (`ok` at 114x and 1,891x on the CPU).

The guards compare the handlers and the collector's settings with those taken when they
were installed (`changed_since`, after each phase: a change is `rejected`), and the
evaluator collects no garbage while the probe sets are in a frame of its own
(`no_collection`), since a finalizer is ordinary code no snapshot can tell from a
library's. Torch and the evaluator install no handler and no callback in a child.
"""

from __future__ import annotations

import contextlib
import gc
import signal
from collections.abc import Iterator

# bound at import, before any candidate code: the candidate reaches these modules
_getsignal, _gc_threshold = signal.getsignal, gc.get_threshold
_gc_disable, _gc_enable, _gc_isenabled = gc.disable, gc.enable, gc.isenabled
_GC_CALLBACKS = gc.callbacks  # the collector's own list: rebinding the name leaves it
_THRESHOLDS = "changing the garbage collector's thresholds"
_SIGNALS = tuple(s for s in signal.valid_signals()
                 if s not in (signal.SIGKILL, signal.SIGSTOP))


def snapshot() -> dict[str, object]:
    """The handler of each signal, the collector's thresholds and callbacks."""
    taken: dict[str, object] = {}
    for number in _SIGNALS:
        try:
            taken[f"a handler of its own for {signal.Signals(number).name}"] = _getsignal(number)
        except (ValueError, OSError):  # a real-time signal without a name
            taken[f"a handler of its own for signal {int(number)}"] = _getsignal(number)
    taken[_THRESHOLDS] = _gc_threshold()
    taken["a garbage collector callback of its own"] = tuple(_GC_CALLBACKS)
    return taken


def changed_since(before: dict[str, object]) -> list[str]:
    """What differs from `before` (worded to follow "the candidate tried"), by identity: an
    equality test of a candidate's object would run its code."""
    now = snapshot()
    changed = []
    for what, was in before.items():
        is_now = now.get(what)
        if what == _THRESHOLDS:  # ints the collector makes
            same = is_now == was
        elif isinstance(was, tuple) and isinstance(is_now, tuple):
            same = len(was) == len(is_now) and all(a is b for a, b in zip(was, is_now, strict=True))
        else:
            same = is_now is was
        if not same:
            changed.append(what)
    return changed


@contextlib.contextmanager
def no_collection() -> Iterator[None]:
    """No garbage collection meanwhile (so no collector callback and no finalizer of a
    freed cycle runs), and as it was after."""
    collecting = _gc_isenabled()
    _gc_disable()
    try:
        yield
    finally:
        if collecting:
            _gc_enable()
