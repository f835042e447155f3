"""`build_report()`: the report of one or more finished (or live) runs, from their stores
alone; nothing is run again."""

from __future__ import annotations

from pathlib import Path

from pike.errors import ConfigError
from pike.report.data import RunData, load_runs
from pike.report.figures import write_figures
from pike.report.html import write_page
from pike.report.solutions import write_solutions


def build_report(run_dirs: list[Path], out: Path) -> Path:
    """Write figures, solution files and index.html under `out`; return the page's path."""
    if not run_dirs:
        raise ConfigError("no run to report: give at least one run folder")
    return write_report(load_runs([Path(d) for d in run_dirs]), out)


def write_report(runs: list[RunData], out: Path) -> Path:
    """The report of runs already loaded (`load_runs`), written under `out`."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    figures = write_figures(runs, out / "figures")
    rows = write_solutions(runs, out)
    return write_page(runs, figures, rows, out)
