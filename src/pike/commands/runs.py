"""`pike show`, `pike export` and `pike report`: what a run store holds, read back; nothing
is judged or run again."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape

from pike.commands.console import console, user_errors
from pike.errors import PikeError


@user_errors
def show_command(
    run_dir: Annotated[Path, typer.Argument(metavar="RUN_DIR",
                                            help="a run dir of pike optimize or pike bench")],
    watch: Annotated[bool, typer.Option("--watch", help="redraw every few seconds until "
                                        "Ctrl-C")] = False,
    interval: Annotated[float, typer.Option(min=0.5, help="seconds between redraws")] = 2.0,
) -> None:
    """Budget spent, best speedup per task and the latest verdicts of a run (live with --watch)."""
    import time

    from rich.live import Live

    from pike.report.terminal import run_tables
    from pike.store import RunStore

    def snapshot() -> Any:
        with RunStore.open(run_dir) as store:
            return run_tables(store)

    if not watch:
        console.print(snapshot())
        return
    try:
        if not console.is_terminal:
            _watch_as_lines(snapshot, interval)
        with Live(snapshot(), console=console, refresh_per_second=1) as live:
            while True:
                time.sleep(interval)
                live.update(snapshot())
    except KeyboardInterrupt:
        return


def _watch_as_lines(snapshot: Callable[[], Any], interval: float) -> None:
    """`pike show --watch` into a log or a pipe, where a redrawn screen would pile up: the
    tables again, under the time, each time they change (until Ctrl-C or SIGTERM)."""
    import time

    shown = ""
    while True:
        with console.capture() as captured:
            console.print(snapshot())
        text = captured.get()
        if text != shown:
            console.print(time.strftime("%H:%M:%S"), highlight=False)
            console.out(text, end="", highlight=False)
            shown = text
        time.sleep(interval)


@user_errors
def export_command(
    run_dir: Annotated[Path, typer.Argument(metavar="RUN_DIR", help="a run dir")],
    task: Annotated[str | None, typer.Argument(metavar="TASK",
                                               help="task name (optional for a one-task run)")]
    = None,
    out: Annotated[Path, typer.Option(help="where to write the module")] = Path("best.py"),
    set_dir: Annotated[Path | None, typer.Option(
        "--set", help="write every task's best as a solution set (files + manifest.json) "
        "to this folder instead")] = None,
) -> None:
    """Write a task's best correct solution as a standalone module with its verdict on top,
    or (--set DIR) the whole run as a solution set that `pike audit` and --seed-from read."""
    from pike.report.export import export_best
    from pike.store import RunStore

    with RunStore.open(run_dir) as store:
        if set_dir is not None:
            if task is not None:
                raise PikeError("--set writes every task of the run: give no TASK")
            from pike.solution_set import write_set

            path = write_set(store, set_dir)
        else:
            path = export_best(store, task, out)
    console.print(f"wrote {escape(str(path))}")


@user_errors
def report_command(
    run_dirs: Annotated[list[Path], typer.Argument(metavar="RUN_DIR",
                                                   help="run dirs to compare side by side")],
    out: Annotated[Path, typer.Option(help="folder for the figures and index.html")]
    = Path("pike-report"),
) -> None:
    """Figures and one HTML page from run stores alone (nothing is re-run)."""
    from pike.report.build import write_report
    from pike.report.data import load_runs
    from pike.report.terminal import not_run_lines, report_summary

    runs = load_runs(run_dirs)
    page = write_report(runs, out)
    console.print(report_summary(runs))
    for line in not_run_lines(runs):
        console.print(escape(line), highlight=False, soft_wrap=True)
    console.print(f"wrote {escape(str(page))}", highlight=False, soft_wrap=True)
