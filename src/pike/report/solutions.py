"""The best solution of each task in each run, as files next to the report: its source
(.py), its unified diff from the task's reference (.diff), and an HTML page showing both.

Solutions are untrusted code: the HTML page shows them through an autoescaping template,
and the .py and .diff files are plain text that the report only links to.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, replace
from pathlib import Path

from pike.report.data import (
    Outcome,
    RunData,
    TaskRun,
    lines_of_code,
    reference_ms,
    speedup,
    task_names,
)
from pike.report.html import render
from pike.store import CandidateRow
from pike.task import safe_file_stems


@dataclass(frozen=True)
class SolutionRow:
    """One line of the report's table: a task in a run, and its best correct candidate."""

    task: str
    run: str
    run_index: int
    candidates: int
    queries: int
    dollars: float
    outcome: Outcome = "not_run"
    not_run: str = ""  # why the task was never judged (outcome "not_run")
    candidate_id: int | None = None
    role: str = ""
    round: int | None = None
    speedup: float | None = None  # the confirmed figure where the best was confirmed
    confirmed: bool = False
    search_speedup: float | None = None  # the search's own figure beside a confirmed one
    runtime_ms: float | None = None
    reference_ms: float | None = None
    lines: int | None = None
    flags: str = ""
    source_href: str = ""  # relative to the report's folder
    diff_href: str = ""
    page_href: str = ""


def write_solutions(runs: list[RunData], out: Path) -> list[SolutionRow]:
    """Write the best solution of every (task, run) under out/solutions; one row each,
    tasks in the order first seen, runs in the order given."""
    folder = out / "solutions"
    folder.mkdir(parents=True, exist_ok=True)
    names = _file_names(task_names(runs))
    rows = []
    for task in task_names(runs):
        for index, run in enumerate(runs):
            found = run.task(task)
            if found is not None:
                rows.append(_row(found, run, index, folder, f"run{index + 1}-{names[task]}"))
    return rows


def _row(task: TaskRun, run: RunData, index: int, folder: Path, stem: str) -> SolutionRow:
    outcome = task.outcome()
    base = SolutionRow(task=task.name, run=run.label, run_index=index,
                       candidates=len(task.searched()), queries=task.queries,
                       dollars=task.dollars, outcome=outcome,
                       not_run=task.not_run_reason() if outcome == "not_run" else "")
    best = task.best()
    if outcome != "solved" or best is None or best.verdict is None:
        return base
    verdict = best.verdict
    links = _write_files(task, run, best, folder, stem)
    return replace(
        base, **links, candidate_id=best.id, role=best.role, round=best.round,
        speedup=speedup(best), confirmed=verdict.confirmed,
        search_speedup=verdict.search_speedup if verdict.confirmed else None,
        runtime_ms=verdict.runtime.median_ms if verdict.runtime else None,
        reference_ms=reference_ms(verdict), lines=lines_of_code(best.source),
        flags=", ".join(f"{k}={v}" for k, v in sorted(verdict.flags_changed.items())))


def _write_files(task: TaskRun, run: RunData, best: CandidateRow, folder: Path,
                 stem: str) -> dict[str, str]:
    diff = unified_diff(task.reference, best.source, f"{task.name} (reference)",
                        f"{task.name} ({run.label}, candidate {best.id})")
    (folder / f"{stem}.py").write_text(best.source)
    (folder / f"{stem}.diff").write_text(diff)
    page = render("solution.html.j2", task=task.name, run=run.label, candidate=best.id,
                  source=best.source, diff_lines=[(_diff_class(line), line)
                                                  for line in diff.splitlines()])
    (folder / f"{stem}.html").write_text(page)
    return {"source_href": f"solutions/{stem}.py", "diff_href": f"solutions/{stem}.diff",
            "page_href": f"solutions/{stem}.html"}


def unified_diff(reference: str, solution: str, from_name: str, to_name: str) -> str:
    lines = difflib.unified_diff(_lines(reference), _lines(solution), fromfile=from_name,
                                 tofile=to_name)
    return "".join(lines)


def _lines(text: str) -> list[str]:
    # a last line without its newline would run into the next diff line
    return [line if line.endswith("\n") else line + "\n" for line in text.splitlines(True)]


def _diff_class(line: str) -> str:
    if line.startswith(("+++", "---")):
        return "file"
    if line.startswith("@@"):
        return "hunk"
    return {"+": "add", "-": "del"}.get(line[:1], "")


def _file_names(tasks: list[str]) -> dict[str, str]:
    return safe_file_stems(tasks)
