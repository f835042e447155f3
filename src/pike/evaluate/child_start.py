"""How an evaluation child is started: from one long-lived thread, with no core dumps, its
out-of-memory score, and a signal that kills it when pike dies.
"""

from __future__ import annotations

import ctypes
import os
import queue
import resource
import signal
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from pike.evaluate.leftovers import new_work, refuse_new_work_if_ending

_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36


class _Spawner:
    """Every child is started from this one daemon thread, which lives as long as pike:
    the death signal (and bwrap's --die-with-parent) fires when the *thread* that started
    the child ends, so a child started from a pool's worker died with that worker, and a
    reference kept for later evaluations was found dead once its pool had closed. A
    daemon thread, not an executor's: those are stopped at interpreter shutdown before
    the atexit handlers that stop children in order."""

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[tuple[Callable[[], Any], Future[Any]]] = (
            queue.SimpleQueue())
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def run(self, fn: Callable[[], Any]) -> Any:
        refuse_new_work_if_ending()
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._serve, name="pike-spawn",
                                                daemon=True)
                self._thread.start()
        done: Future[Any] = Future()
        self._jobs.put((fn, done))
        return done.result()

    def _serve(self) -> None:
        while True:
            fn, done = self._jobs.get()
            try:
                with new_work():  # a child started here is one the cleanup will see
                    result = fn()
                done.set_result(result)
            except BaseException as err:  # the caller's to handle, in its own thread
                done.set_exception(err)


SPAWNER = _Spawner()


def child_setup(parent: int, oom_score_adj: int = 0,
                subreaper: bool = False) -> Callable[[], None]:
    """Run in the new child before it starts Python: no core dumps, `oom_score_adj` for
    the kernel's out-of-memory killer (child_oom_score), and killed when pike dies however
    it ends (bwrap's --die-with-parent does this in the OS sandbox; this is the same where
    there is none). If pike died before the signal was armed, stop now. `subreaper`
    (without the OS sandbox, whose PID namespace does this): what its descendants orphan
    (a double fork) becomes its own child instead of the host's init's, so it stays in
    the tree pike walks, counts against the process limit and is found there."""
    score = str(oom_score_adj).encode()  # made here: setup runs between fork and exec

    def setup() -> None:
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        if oom_score_adj:
            try:  # plain system calls only
                fd = os.open("/proc/self/oom_score_adj", os.O_WRONLY)
                try:
                    os.write(fd, score)
                finally:
                    os.close(fd)
            except OSError:  # not Linux, or /proc not mounted: the kernel's own choice
                pass
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
            if subreaper:
                libc.prctl(_PR_SET_CHILD_SUBREAPER, 1)
        except (OSError, AttributeError):  # not Linux: the parent's cleanup still runs
            return
        if os.getppid() != parent:
            os._exit(1)

    return setup
