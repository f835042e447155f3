"""The report's figures, drawn with matplotlib and saved as PNG and SVG.

Figures are built as `matplotlib.figure.Figure` objects, never through pyplot, so that
drawing a report neither needs a display nor changes the backend of the caller's process.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from matplotlib.artist import Artist
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.patches import Patch
from matplotlib.ticker import FuncFormatter, LogLocator, MaxNLocator

from pike.report.data import (
    PENDING,
    STATUSES,
    Axis,
    RunData,
    baseline_of,
    fixer_success,
    lines_of_code,
    outcomes_by_round,
    progress,
    round_label,
    speedup,
    task_names,
)

_RUN_COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b",
               "#e377c2", "#bcbd22", "#7f7f7f"]
_MODE_COLORS = ["#4d4d4d", "#878787", "#bababa", "#e0e0e0"]  # greys: the runs stand out
_STATUS_COLORS = {
    "ok": "#2ca02c", "incorrect": "#ff7f0e", "compile_error": "#d62728",
    "runtime_error": "#9467bd", "timeout": "#8c564b", "crashed": "#e377c2",
    "rejected": "#17becf", PENDING: "#c7c7c7",
}
_STATUS_NAMES = {"ok": "ok (correct)", "compile_error": "compile/load error",
                 "runtime_error": "runtime error", "crashed": "crashed (child died)",
                 "rejected": "rejected (guard)", PENDING: "not judged yet"}
_SPEEDUP_LABEL = "speedup over eager (×, higher is faster)"
_WIDE_RANGE = 20.0  # beyond this max/min ratio, speedups go on a log axis
_VALUE_LABELS_UP_TO = 40  # bars; more and their value labels would crowd
_MAX_ROUND_TICKS = 12


@dataclass(frozen=True)
class FigureFile:
    name: str
    title: str
    png: Path
    svg: Path


def run_color(index: int) -> str:
    return _RUN_COLORS[index % len(_RUN_COLORS)]


def write_figures(runs: list[RunData], out_dir: Path) -> list[FigureFile]:
    """Draw every figure of the report into out_dir, each as PNG and SVG."""
    out_dir.mkdir(parents=True, exist_ok=True)
    drawings: list[tuple[str, Callable[[list[RunData]], Figure]]] = [
        ("speedup_vs_queries", lambda r: progress_figure(r, "queries")),
        ("speedup_vs_dollars", lambda r: progress_figure(r, "dollars")),
        ("speedup_per_task", per_task_figure),
        ("outcomes_per_round", outcomes_figure),
        ("speedup_vs_lines", lines_figure),
    ]
    files = []
    for name, draw in drawings:
        fig = draw(runs)
        png, svg = out_dir / f"{name}.png", out_dir / f"{name}.svg"
        fig.savefig(png, dpi=150)
        # no date in the SVG, so that the same stores give the same files
        fig.savefig(svg, metadata={"Date": None})
        files.append(FigureFile(name, fig.get_suptitle() or name, png, svg))
    return files


def _figure(width: float, height: float, title: str) -> Figure:
    fig = Figure(figsize=(width, height), layout="constrained")
    fig.suptitle(title, fontsize=12)
    return fig


def _times(value: float, _pos: object = None) -> str:
    return f"{value:.3g}×"


def _speedup_scale(ax: Axes, values: list[float], axis: str) -> None:
    """A log scale when speedups span a wide range, so that a 50x task does not flatten the
    rest; linear otherwise, which reads more easily."""
    positive = [v for v in values if v > 0]
    target = ax.xaxis if axis == "x" else ax.yaxis
    if positive and max(positive) / min(positive) > _WIDE_RANGE:
        (ax.set_xscale if axis == "x" else ax.set_yscale)("log")
        # ticks at 1-2-5 steps: plain decades leave a 0.3x-8x range with one label
        target.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    target.set_major_formatter(FuncFormatter(_times))
    target.set_minor_formatter(FuncFormatter(lambda v, p: ""))


def _note(ax: Axes, text: str) -> None:
    ax.text(0.5, 0.5, text, transform=ax.transAxes, ha="center", va="center", color="#555555")


# -- 1, 2: geomean speedup against budget -------------------------------------------------


def progress_figure(runs: list[RunData], axis: Axis) -> Figure:
    what = "LLM queries" if axis == "queries" else "LLM spend"
    fig = _figure(8, 4.8, f"Geomean speedup over eager vs {what} per task")
    ax = fig.add_subplot()
    values = [1.0]
    drawn = 0
    for index, run in enumerate(runs):
        if axis == "dollars" and not _has_costs(run):
            continue  # its calls have no price: a curve at $0 would look free
        drawn += 1
        points = progress(run, axis)
        xs, ys = [p[0] for p in points], [p[1] for p in points]
        values += ys
        ax.plot(xs, ys, drawstyle="steps-post", color=run_color(index), linewidth=1.8,
                label=f"{run.label} ({len(run.tasks)} tasks)")
        # over the spine: an offline run is a single point at 0 queries
        ax.plot(xs[-1:], ys[-1:], "o", color=run_color(index), markersize=6, clip_on=False,
                zorder=3)
    ax.axhline(1.0, color="black", linestyle="--", linewidth=1, label="eager (reference)")
    ax.set_xlabel("LLM queries per task (calls)" if axis == "queries"
                  else "LLM spend per task (USD)")
    ax.set_ylabel("geomean speedup over eager (×)")
    if axis == "dollars":
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, p: f"${v:,.2f}"))
    else:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlim(left=0)
    _speedup_scale(ax, values, "y")
    ax.grid(True, alpha=0.3)
    if not drawn:
        _note(ax, "no run recorded LLM costs")
    fig.legend(loc="outside lower center", ncols=1, fontsize=8, frameon=False)
    return fig


def _has_costs(run: RunData) -> bool:
    """A run with no LLM call (offline) is drawn at $0; one whose calls all lack a cost
    is not drawn at all."""
    queries = sum(t.queries for t in run.tasks)
    return queries == 0 or any(t.dollars > 0 for t in run.tasks)


# -- 3: best speedup per task, each run and each torch.compile mode ------------------------


def per_task_figure(runs: list[RunData]) -> Figure:
    tasks = task_names(runs)
    modes = _compile_modes(runs, tasks)
    series = len(runs) + len(modes)
    bar = 0.8 / max(series, 1)
    fig = _figure(9, max(3.5, 1.6 + len(tasks) * (0.3 + 0.22 * series)),
                  "Best correct speedup per task: each run and torch.compile, vs eager")
    ax = fig.add_subplot()
    label_values = len(tasks) * series <= _VALUE_LABELS_UP_TO
    legend: list[Artist] = []
    values = [1.0]
    for s, run in enumerate(runs):
        slots = [i - 0.4 + bar * (s + 0.5) for i in range(len(tasks))]
        got = [_best_speedup(run, name) for name in tasks]
        values += [v for v in got if v]
        _bars(ax, slots, got, bar, run_color(s), label_values)
        _fallback_bars(ax, run, tasks, slots, bar, run_color(s))
        legend.append(Patch(color=run_color(s), label=run.label))
    for m, mode in enumerate(modes):
        slots = [i - 0.4 + bar * (len(runs) + m + 0.5) for i in range(len(tasks))]
        got = [_mode_speedup(runs, name, mode) for name in tasks]
        values += [v for v in got if v]
        color = _MODE_COLORS[m % len(_MODE_COLORS)]
        _bars(ax, slots, got, bar, color, label_values)
        legend.append(Patch(color=color, label=f"torch.compile {mode.removeprefix('compile:')}"))
    legend.append(Patch(fill=False, hatch="///", edgecolor="#777777",
                        label="no correct candidate (1.0× fallback)"))
    legend.append(Patch(fill=False, linestyle=":", edgecolor="#777777",
                        label="not run: never judged (cut off, skipped, failed reference)"))
    legend.append(ax.axvline(1.0, color="black", linestyle="--", linewidth=1,
                             label="eager (reference)"))
    ax.set_yticks(range(len(tasks)), tasks, fontsize=8)
    ax.set_ylim(len(tasks) - 0.5, -0.5)  # first task on top
    ax.set_xlabel(_SPEEDUP_LABEL)
    ax.set_ylabel("task")
    _speedup_scale(ax, values, "x")
    ax.grid(True, axis="x", alpha=0.3)
    fig.legend(handles=legend, loc="outside lower center", ncols=2, fontsize=8, frameon=False)
    return fig


def _best_speedup(run: RunData, task: str) -> float | None:
    found = run.task(task)
    best = found.best() if found and found.outcome() == "solved" else None
    return speedup(best) if best else None


def _fallback_bars(ax: Axes, run: RunData, tasks: list[str], slots: list[float],
                   height: float, color: str) -> None:
    """At 1.0x, where the run has no correct candidate: hatched where it judged some and
    none passed, a dotted outline labelled "not run" where it judged none."""
    outcomes = {name: found.outcome() for name in tasks if (found := run.task(name))}
    no_correct = [y for y, name in zip(slots, tasks, strict=True)
                  if outcomes.get(name) == "no_correct"]
    not_run = [y for y, name in zip(slots, tasks, strict=True)
               if outcomes.get(name) == "not_run"]
    ax.barh(no_correct, [1.0] * len(no_correct), height=height, fill=False, hatch="///",
            edgecolor=color, linewidth=0.6)
    ax.barh(not_run, [1.0] * len(not_run), height=height, fill=False, linestyle=":",
            edgecolor=color, linewidth=1.0)
    for y in not_run:
        ax.annotate("not run", (1.0, y), xytext=(3, 0), textcoords="offset points",
                    va="center", fontsize=7, color="#8a6d00", style="italic")


def _compile_modes(runs: list[RunData], tasks: list[str]) -> list[str]:
    """The torch.compile modes that ran in some task's baseline."""
    modes: dict[str, None] = {}
    for name in tasks:
        found = baseline_of(runs, name)
        if found is not None:
            modes.update((m.mode, None) for m in found[0].modes
                         if m.mode != "eager" and m.speedup_vs_eager and not m.error)
    return list(modes)


def _mode_speedup(runs: list[RunData], task: str, mode: str) -> float | None:
    found = baseline_of(runs, task)
    if found is None:
        return None
    timing = next((m for m in found[0].modes if m.mode == mode), None)
    return timing.speedup_vs_eager if timing and not timing.error else None


def _bars(ax: Axes, ys: list[float], values: list[float | None], height: float, color: str,
          label_values: bool) -> None:
    drawn = [(y, v) for y, v in zip(ys, values, strict=True) if v is not None]
    ax.barh([y for y, _ in drawn], [v for _, v in drawn], height=height, color=color,
            edgecolor="white", linewidth=0.5)
    if label_values:
        for y, v in drawn:
            ax.annotate(_times(v), (v, y), xytext=(3, 0), textcoords="offset points",
                        va="center", fontsize=7)


# -- 4: verdicts per round ------------------------------------------------------------------


def outcomes_figure(runs: list[RunData]) -> Figure:
    fig = _figure(9, 0.9 + 2.6 * max(len(runs), 1), "Candidate outcomes per search round")
    axes = fig.subplots(max(len(runs), 1), 1, squeeze=False)[:, 0]
    shown: set[str] = set()
    for ax, run in zip(axes, runs, strict=False):
        shown |= _outcome_bars(ax, run)
    handles = [_status_patch(s) for s in (*STATUSES, PENDING) if s in shown]
    if handles:
        fig.legend(handles=handles, loc="outside right upper", fontsize=8, frameon=False,
                   title="verdict", title_fontsize=8)
    return fig


def _outcome_bars(ax: Axes, run: RunData) -> set[str]:
    counts = outcomes_by_round(run)
    fixed, fixes = fixer_success(run)
    rate = f"{fixed}/{fixes} correct ({fixed / fixes:.0%})" if fixes else "no attempts"
    ax.set_title(f"{run.label}\nerror fixer: {rate}", fontsize=9)
    ax.set_xlabel("search round")
    ax.set_ylabel("candidates (count)")
    if not counts:
        _note(ax, "no candidates")
        ax.set_xticks([])
        ax.set_yticks([])
        return set()
    keys = list(counts)
    bottom = [0] * len(keys)
    shown = set()
    for status in (*STATUSES, PENDING):
        heights = [counts[k][status] for k in keys]
        if any(heights):
            shown.add(status)
            ax.bar(range(len(keys)), heights, bottom=bottom, color=_status_color(status),
                   width=0.8)
            bottom = [b + h for b, h in zip(bottom, heights, strict=True)]
    ticks = range(0, len(keys), math.ceil(len(keys) / _MAX_ROUND_TICKS))
    ax.set_xticks(ticks, [round_label(keys[i]) for i in ticks])
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    # a run of one or two rounds keeps bars of a normal width
    ax.set_xlim(-0.6, max(len(keys), 3) - 0.4)
    ax.grid(True, axis="y", alpha=0.3)
    return shown


def _status_patch(status: str) -> Patch:
    return Patch(color=_status_color(status), label=_STATUS_NAMES.get(status, status))


def _status_color(status: str) -> str:
    return _STATUS_COLORS.get(status, "#444444")  # a status added to verdict.py later


# -- 5: speedup against size ----------------------------------------------------------------


def lines_figure(runs: list[RunData]) -> Figure:
    fig = _figure(8, 4.8, "Speedup vs solution size (correct candidates)")
    ax = fig.add_subplot()
    markers = "osD^v<>p*h"
    values = [1.0]
    for index, run in enumerate(runs):
        points = [(lines_of_code(c.source), speedup(c)) for t in run.tasks for c in t.correct()]
        values += [p[1] for p in points]
        ax.scatter([p[0] for p in points], [p[1] for p in points], s=22, alpha=0.7,
                   color=run_color(index), marker=markers[index % len(markers)],
                   label=f"{run.label} ({len(points)} correct)")
    ax.axhline(1.0, color="black", linestyle="--", linewidth=1, label="eager (reference)")
    ax.set_xlabel("lines of code (non-blank, non-comment lines)")
    ax.set_ylabel(_SPEEDUP_LABEL)
    ax.set_xlim(left=0)
    _speedup_scale(ax, values, "y")
    ax.grid(True, alpha=0.3)
    if len(values) == 1:
        _note(ax, "no correct candidate in any run")
    fig.legend(loc="outside lower center", ncols=1, fontsize=8, frameon=False)
    return fig
