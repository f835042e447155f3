"""How a `pike` command ends on Ctrl-C, SIGTERM or its output closed: at once, with the
line that says how to go on."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

from rich.markup import escape

from pike.commands.console import console, err_console
from pike.evaluate.leftovers import end_children_and_remove_own_dirs
from pike.store import STORE_FILE


def _say_how_to_go_on(go_on: str, run_dir: Path | None) -> None:
    """The line a Ctrl-C or SIGTERM leaves: what was kept, and the command that goes on
    (none where the run's store was not made yet: there is nothing to go on with)."""
    if run_dir is not None and not (run_dir / STORE_FILE).exists():
        err_console.print("interrupted before the run store was made: nothing was recorded")
        return
    err_console.print(f"interrupted: everything judged so far is in the run store; continue "
                      f"with [bold]{escape(go_on)}[/bold]", soft_wrap=True)


@contextlib.contextmanager
def resumable(go_on: str, run_dir: Path | None) -> Iterator[None]:
    """A Ctrl-C or SIGTERM in the block says how to go on, then ends pike at once (130);
    so does its output closed under it (1, rich's exit then; said where stderr is open).

    Worker threads (an audit's or a campaign's tasks, a pool's candidates) may be
    mid-evaluation, and Python's exit would wait for each to finish its step: a
    max-autotune build, minutes. So nothing waits for them: the store is already durable,
    their children are ended and this process's temp folders removed, and pike exits."""
    try:
        yield
    except (KeyboardInterrupt, SystemExit) as stop:
        # rich turns a write to a closed pipe into SystemExit(1), its console marked quiet
        # first: output nobody reads any more (`| head` has ended) stops the run as well.
        closed = isinstance(stop, SystemExit) and (console.quiet or err_console.quiet)
        if isinstance(stop, SystemExit) and not closed:
            raise
        # A second Ctrl-C (an impatient user, a driver's own SIGINT) or a closed pipe must
        # not cut this short: the exit that follows would wait on the worker threads.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        try:
            with contextlib.suppress(OSError, SystemExit):
                _say_how_to_go_on(go_on, run_dir)
            logging.disable(logging.CRITICAL)  # what the killed children's ends say is no news
            end_children_and_remove_own_dirs()
            with contextlib.suppress(OSError):
                sys.stdout.flush()
                sys.stderr.flush()
        finally:
            os._exit(1 if closed else 130)


def terminate_as_interrupt(signum: int, frame: object) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a second TERM ends pike at once
    raise KeyboardInterrupt
