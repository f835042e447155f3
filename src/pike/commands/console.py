"""Where the `pike` commands print, the exit statuses they end with, and user errors said
as one line."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

import typer
from rich.console import Console
from rich.markup import escape

from pike.errors import PikeError

console = Console()
err_console = Console(stderr=True)

F = TypeVar("F", bound=Callable[..., Any])

EXIT_CANDIDATE_FAILED = 1
EXIT_USER_ERROR = 2
# pike bench or pike audit --stop-after: unfinished, by request (sysexits' EX_TEMPFAIL: try
# again later)
STOPPED_AT_TIME_LIMIT = 75


def user_errors(fn: F) -> F:
    """Print a PikeError as one line and exit 2, instead of a traceback."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except PikeError as err:
            err_console.print(f"[red]error:[/red] {escape(str(err))}", highlight=False,
                              soft_wrap=True)
            raise typer.Exit(EXIT_USER_ERROR) from None

    return wrapper  # type: ignore[return-value]
