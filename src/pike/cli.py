"""The `pike` command line: thin, calls the public API, prints with rich.

Here: the typer app, its global options, and its commands in the order the help lists them;
what each command does lives in pike.commands."""

from __future__ import annotations

import functools
import logging
import os
import signal
import sys
from importlib.metadata import PackageNotFoundError, version
from typing import Annotated, Any

import typer
from typer.core import TyperCommand

# `name as name`: re-exported, as the tests import these from pike.cli, where they were written
from pike.commands.audit import audit_command
from pike.commands.console import console, err_console
from pike.commands.evaluate import baseline_command, eval_command
from pike.commands.interrupt import _say_how_to_go_on as _say_how_to_go_on
from pike.commands.interrupt import terminate_as_interrupt
from pike.commands.optimize import _print_result as _print_result
from pike.commands.optimize import bench_command, optimize_command
from pike.commands.runs import export_command, report_command, show_command
from pike.evaluate.leftovers import sweep_orphaned_dirs


class _Command(TyperCommand):
    """Usage lines name the arguments as the help lists them (`pike eval [OPTIONS]
    TASK CANDIDATE`): typer's own wraps required ones in braces, which reads as a set."""

    def collect_usage_pieces(self, ctx: Any) -> list[str]:
        pieces = [self.options_metavar] if self.options_metavar else []
        for param in self.get_params(ctx):
            if param.param_type_name != "argument":
                continue
            name = param.metavar or (param.name or "").upper()
            name = name if param.required else f"[{name}]"
            pieces.append(name + ("..." if param.nargs != 1 else ""))
        return pieces


app = typer.Typer(help="pike: make PyTorch inference faster, judged by a strict evaluator.",
                  no_args_is_help=True, add_completion=False)
command = functools.partial(app.command, cls=_Command)

LOG_WIDTH = 120


def _print_version(asked: bool) -> None:
    if asked:
        print(f"pike {package_version()}")
        raise typer.Exit()


def package_version() -> str:
    """The installed distribution's version (pyproject.toml's, once installed)."""
    try:
        return version("pike-torch")
    except PackageNotFoundError:  # imported from a source tree that was never installed
        return "unknown (not installed)"


@app.callback()
def main(
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="log what pike does, with "
                                          "the source location of each message")] = False,
    _version: Annotated[bool, typer.Option("--version", callback=_print_version,
                                           is_eager=True, help="print pike's version")]
    = False,
) -> None:
    # Source locations help whoever debugs pike; a user's output goes without them.
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING,
                        format="%(levelname)s %(name)s (%(filename)s:%(lineno)d): %(message)s"
                        if verbose else "%(levelname)s: %(message)s")
    # SIGTERM (`timeout`, `kill`, a scheduler) ends pike as Ctrl-C does: children killed,
    # temp dirs removed, the store left consistent, one line said.
    signal.signal(signal.SIGTERM, terminate_as_interrupt)
    for out in (console, err_console):
        if not out.is_terminal and "COLUMNS" not in os.environ:
            # a log or a pipe has no width: tables get room instead of 80 columns
            out.width = LOG_WIDTH
    sweep_orphaned_dirs()


# typer lists the commands in the order they are added
command("eval")(eval_command)
command("optimize")(optimize_command)
command("bench")(bench_command)
command("show")(show_command)
command("export")(export_command)
command("audit")(audit_command)
command("report")(report_command)
command("baseline")(baseline_command)


def run() -> None:  # pragma: no cover - console entry for `python -m pike`
    app(prog_name="pike")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(run())
