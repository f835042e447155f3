"""The report page: one index.html linking its figures and solution files by relative
paths, so the folder can be copied and opened offline. Every piece of text from a run
(task names, commands, labels, solutions) goes through an autoescaping template."""

from __future__ import annotations

import datetime as dt
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import jinja2

from pike.report.data import (
    RunData,
    baseline_of,
    final_geomean,
    fixer_success,
    outcome_counts,
    task_names,
)
from pike.report.figures import FigureFile, run_color

if TYPE_CHECKING:
    from pike.report.solutions import SolutionRow

_CAPTIONS = {
    "speedup_vs_queries": (
        "Geomean over each run's tasks of the best correct speedup found within N LLM queries "
        "on each task, as each candidate measured in its search (search-time figures, not the "
        "confirmed ones). A task with no correct candidate yet counts 1.0× (the reference is "
        "kept). Offline candidates (no LLM) count at 0 queries; every recorded call counts, "
        "failed ones and brainstormer calls too."),
    "speedup_vs_dollars": (
        "The same, against the dollars spent on LLM calls per task (the cost each call "
        "recorded)."),
    "speedup_per_task": (
        "Best correct speedup of each run on each task (the confirmed figure where the "
        "search's best was timed again in one window), and each torch.compile mode of the "
        "task's recorded baseline, all against eager on the host that measured them. A hatched "
        "bar marks a task a run judged without finding a correct candidate; a dotted outline "
        "marked \"not run\" a task it never judged (cut off, skipped, or a failing "
        "reference). Both count 1.0×."),
    "outcomes_per_round": (
        "Verdicts of the candidates of each search round, over all tasks of a run, with the "
        "error fixer's success rate: fix candidates that came out correct over all judged fix "
        "candidates."),
    "speedup_vs_lines": (
        "Speedup of every correct candidate against its size in non-blank, non-comment lines "
        "(source of embedded CUDA or Triton kernels included)."),
}


@dataclass(frozen=True)
class RunSummary:
    label: str
    color: str
    run_dir: str
    command: str
    created_at: str
    device: str
    torch_version: str
    host: str
    policy: str
    tasks: int
    solved: int
    no_correct: int
    not_run: int
    geomean: float
    queries: int
    dollars: float
    fixer: str


def _templates() -> jinja2.Environment:
    return jinja2.Environment(loader=jinja2.PackageLoader("pike.report", "templates"),
                              autoescape=True, undefined=jinja2.StrictUndefined)


def render(template: str, **context: Any) -> str:
    return _templates().get_template(template).render(**context)


def write_page(runs: list[RunData], figures: list[FigureFile], rows: list[SolutionRow],
               out: Path) -> Path:
    page = out / "index.html"
    figure_links = [{"name": f.name, "title": f.title, "caption": _CAPTIONS.get(f.name, ""),
                     "png": f.png.relative_to(out).as_posix(),
                     "svg": f.svg.relative_to(out).as_posix()} for f in figures]
    page.write_text(render(
        "index.html.j2", runs=[summarize(r, i) for i, r in enumerate(runs)],
        figures=figure_links, groups=_by_task(rows), notes=notes(runs),
        colors=[run_color(i) for i in range(len(runs))],
        generated_at=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")))
    return page


def _by_task(rows: list[SolutionRow]) -> list[tuple[str, list[SolutionRow]]]:
    groups: dict[str, list[SolutionRow]] = {}
    for row in rows:
        groups.setdefault(row.task, []).append(row)
    return list(groups.items())


def summarize(run: RunData, index: int) -> RunSummary:
    env = run.environment
    fixed, fixes = fixer_success(run)
    outcomes = outcome_counts(run)
    return RunSummary(
        label=run.label, color=run_color(index), run_dir=str(run.run_dir), command=run.command,
        created_at=_when(run.created_at), device=env.describe_device(),
        torch_version=env.torch_version or "unknown", host=env.host or "unknown",
        policy=_policy(run.config), tasks=len(run.tasks),
        solved=outcomes["solved"], no_correct=outcomes["no_correct"],
        not_run=outcomes["not_run"],
        geomean=final_geomean(run), queries=sum(t.queries for t in run.tasks),
        dollars=sum(t.dollars for t in run.tasks),
        fixer=f"{fixed}/{fixes} ({fixed / fixes:.0%})" if fixes else "no attempts")


def _policy(config: dict) -> str:
    """The correctness protocol the verdicts were judged under, as far as the config says."""
    ev = config.get("eval") or {}
    if not ev:
        return "not recorded"
    return (f"{ev.get('trials', '?')} trials, atol {ev.get('atol', '?')}, "
            f"rtol {ev.get('rtol', '?')}, model {ev.get('model_mode', '?')}")


def notes(runs: list[RunData]) -> list[str]:
    """What a reader must know to read the figures right: gaps in what the stores hold."""
    found: list[str] = []
    tasks = task_names(runs)
    missing = [t for t in tasks if baseline_of(runs, t) is None]
    if missing:
        found.append(f"No torch.compile baseline recorded for {_list(missing)}: the per-task "
                     "figure shows only the runs' bars there.")
    failed: dict[tuple[str, str], list[str]] = {}
    for task in tasks:
        located = baseline_of(runs, task)
        if located is not None:
            baseline, run = located
            for mode in baseline.modes:
                if mode.error:
                    failed.setdefault((mode.mode, run.label), []).append(task)
    for (mode, label), where in failed.items():
        found.append(f"torch.compile {mode.removeprefix('compile:')} failed in the baseline of "
                     f"{_list(where)} (measured by {label}); no bar drawn.")
    for run in runs:
        found += _run_notes(run)
    devices = {(r.environment.describe_device(), r.environment.torch_version) for r in runs}
    if len(devices) > 1:
        found.append("The runs were measured on different devices or torch versions: each "
                     "speedup is a ratio from its own host; compare ratios, not times.")
    return found


def _run_notes(run: RunData) -> list[str]:
    found = []
    uncosted = sum(t.uncosted_calls for t in run.tasks)
    queries = sum(t.queries for t in run.tasks)
    if uncosted and uncosted == queries:
        found.append(f"{run.label}: no LLM call has a recorded cost; the run is left out of "
                     "the dollars figure.")
    elif uncosted:
        found.append(f"{run.label}: {uncosted} of {queries} LLM calls have no recorded cost; "
                     "its dollars are a lower bound.")
    pending = Counter(c.verdict is None for t in run.tasks for c in t.searched())[True]
    if pending:
        found.append(f"{run.label}: {_count(pending, 'candidate')} not judged yet "
                     "in the outcomes figure; the run may be live or was stopped.")
    not_run = [t.name for t in run.tasks if t.outcome() == "not_run"]
    if not_run:
        found.append(f"{run.label}: {_count(len(not_run), 'task')} not run ({_list(not_run)}): "
                     "never judged, so nothing was found or ruled out there; they count 1.0× "
                     "like a task with no correct candidate, and the table says why.")
    confirmed = sum(1 for t in run.tasks if t.confirmed is not None)
    if confirmed:
        found.append(f"{run.label}: the best of {_count(confirmed, 'task')} was timed again "
                     "beside eager in one window at the end of its search (confirmed); the "
                     "bars, the table and the geomean use that figure, the budget curves the "
                     "search's own.")
    if not run.tasks:
        found.append(f"{run.label}: the run store holds no task.")
    return found


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


def _when(iso: str) -> str:
    """An ISO timestamp to the second, in the zone it was recorded in (UTC for pike)."""
    try:
        moment = dt.datetime.fromisoformat(iso)
    except ValueError:
        return iso
    zone = moment.tzname() or ""
    return moment.strftime("%Y-%m-%d %H:%M:%S") + (f" {zone}" if zone else "")


def _list(names: list[str], most: int = 8) -> str:
    shown = ", ".join(names[:most])
    return shown + (f" and {len(names) - most} more" if len(names) > most else "")
