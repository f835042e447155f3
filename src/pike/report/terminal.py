"""`pike show`: a run's state in the terminal, read from its store (live while it runs)."""

from __future__ import annotations

from rich.console import Group
from rich.markup import escape
from rich.table import Table

from pike.report.data import (
    RunData,
    describe_strategy,
    final_geomean,
    outcome_counts,
    stored_baseline,
)
from pike.store import DONE_STATE, ERROR_STATE, CandidateRow, RunStore

RECENT = 10


def _x(value: float | None) -> str:
    return f"{value:.2f}x" if value else "-"


def _best(best: CandidateRow | None) -> str:
    """The best's speedup; a confirmed one says so, with the search's figure beside it."""
    verdict = best.verdict if best else None
    if verdict is None:
        return "-"
    if verdict.confirmed:
        return f"{_x(verdict.speedup)} (search {_x(verdict.search_speedup)})"
    return _x(verdict.speedup)


def _best_compile(store: RunStore, task: str) -> str:
    baseline = stored_baseline(store, task)
    speedups = [m.speedup_vs_eager for m in baseline.modes
                if m.mode.startswith("compile:") and m.speedup_vs_eager] if baseline else []
    return _x(max(speedups)) if speedups else "-"


def run_tables(store: RunStore) -> Group:
    """Per task: budget spent, best speedup, best compile mode, verdicts; then recent verdicts."""
    strategy, model = describe_strategy(store.config())
    tasks = Table(title=f"{escape(str(store.path.parent))}: strategy {escape(strategy)}, "
                  f"LLM {escape(model or 'none')}", title_justify="left")
    tasks.add_column("task", no_wrap=True)  # names are what a user scans for
    for column in ("state", "queries", "dollars", "best", "best compile", "candidates", "ok",
                   "failed"):
        tasks.add_column(column, justify="left" if column == "state" else "right")
    all_rows = []
    confirmed: list[CandidateRow | None] = []
    for task in store.tasks():
        name = task["name"]
        rows = store.candidates(name)
        all_rows += rows
        judged = [r for r in rows if r.verdict is not None]
        ok = [r for r in judged if r.verdict.ok]
        best = store.best(name)
        confirmed.append(best)
        queries, dollars = store.spent(name)
        error = store.get_state(name, ERROR_STATE)
        # a search that ended has its top confirmed (`pike optimize` marks nothing else)
        finished = store.get_state(name, DONE_STATE) or store.get_state(name, "confirmed")
        state = ("[red]error[/red]" if error else "done" if finished
                 else "running" if rows else "waiting")
        tasks.add_row(escape(name), state, str(queries), f"${dollars:.2f}", _best(best),
                      _best_compile(store, name), str(len(rows)),
                      str(len(ok)), str(len(judged) - len(ok)))
    if any(b and b.verdict and b.verdict.confirmed for b in confirmed):
        tasks.caption = ("best: confirmed, timed again beside eager in one window at the end "
                         "of the search; the search's own figure in brackets")
        tasks.caption_justify = "left"
    recent = Table(title="recent verdicts", title_justify="left")
    for column in ("id", "task", "role", "round", "status", "speedup", "message"):
        recent.add_column(column)
    judged = sorted((r for r in all_rows if r.verdict is not None), key=lambda r: r.id)
    for r in judged[-RECENT:]:
        v = r.verdict
        status = f"[green]{v.status}[/green]" if v.ok else f"[red]{v.status}[/red]"
        message = (v.message.splitlines() or [""])[0][:80]
        recent.add_row(str(r.id), escape(r.task), r.role, str(r.round), status,
                       _x(v.speedup if v.ok else None), escape(message))
    return Group(tasks, recent)


def report_summary(runs: list[RunData]) -> Table:
    """`pike report`'s table in the terminal: per run, what became of its tasks, with the
    ones never judged named, so that "not run" is not read as "nothing found"."""
    table = Table(title="runs", title_justify="left")
    for column in ("run", "tasks", "solved", "no correct", "not run", "geomean"):
        table.add_column(column, justify="left" if column == "run" else "right")
    for run in runs:
        counts = outcome_counts(run)
        table.add_row(escape(run.label), str(len(run.tasks)), str(counts["solved"]),
                      str(counts["no_correct"]), str(counts["not_run"]),
                      f"{final_geomean(run):.3g}x")
    return table


def not_run_lines(runs: list[RunData]) -> list[str]:
    """One plain line per task a run never judged, with the reason."""
    return [f"not run in {run.label}: {task.name} ({task.not_run_reason()})"
            for run in runs for task in run.tasks if task.outcome() == "not_run"]
