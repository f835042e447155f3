"""The tables the commands print: a verdict and the guards it ran, a search's result, a
campaign's rows, baselines. Built here, printed by cli.py (nothing below the CLI prints)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.markup import escape
from rich.table import Table

from pike.evaluate import Baseline, Verdict
from pike.evaluate.explain import why_cut_short
from pike.evaluate.verdict import slower_than_eager
from pike.report.data import reference_ms

if TYPE_CHECKING:
    from pike.search.campaign import CampaignResult
    from pike.search.session import OptimizeResult


def ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.4g} ms"


def verdict_table(task: str, candidate: str, v: Verdict) -> Table:
    """`pike eval`'s table: status, trials, errors, both medians, the speedup, where."""
    colour = "green" if v.ok else "red"
    table = Table(title=f"{candidate} vs {task}", show_header=False, title_justify="left")
    table.add_column(style="bold")
    table.add_column()
    table.add_row("status", f"[{colour}]{v.status}[/{colour}]"
                  + (f" (phase {v.phase})" if v.phase else ""))
    table.add_row("trials passed", f"{v.trials_passed} of {v.trials}")
    if v.max_abs_error is not None:
        table.add_row("max abs / rel error", f"{v.max_abs_error:.3g} / {v.max_rel_error:.3g}")
    if v.runtime:
        table.add_row("candidate", f"{ms(v.runtime.median_ms)} median "
                      f"(IQR {ms(v.runtime.q1_ms)}-{ms(v.runtime.q3_ms)}, n={v.runtime.count})")
    if v.reference:
        table.add_row("reference (eager)", f"{ms(v.reference.median_ms)} median "
                      f"(n={v.reference.count})")
    if v.speedup is not None:
        table.add_row("speedup", f"[bold]{v.speedup:.2f}x[/bold]" + (
            f" (timed in {v.timed_rounds} rounds: {why_cut_short(v.behind_best)}; the "
            "rest of the window was not spent on it)"
            if v.timed_rounds else ""))
    if v.noisy and v.noisy_speedup is not None and v.reference_usual_ms is not None:
        table.add_row("speedup", f"[yellow]noisy[/yellow]: {v.noisy_speedup:.2f}x, withheld "
                      f"(the reference ran off its usual {ms(v.reference_usual_ms)} in this "
                      "window, timed three times)")
    elif v.noisy and v.noisy_speedup is not None and v.noisy_why:
        table.add_row("speedup", f"[yellow]noisy[/yellow]: {v.noisy_speedup:.2f}x, withheld "
                      f"({escape(v.noisy_why)})")
    if v.host_busy:
        table.add_row("host", f"[yellow]busy[/yellow]: {escape(v.host_busy)}")
    if v.weak_check:
        table.add_row("check", f"[yellow]weak[/yellow]: {escape(v.weak_check)}")
    if v.floor_ms is not None and v.times_floor is not None:
        table.add_row("floor", f"{ms(v.floor_ms)} on this GPU: the candidate is "
                      f"{v.times_floor:.3g}x the floor")
    table.add_row("device", f"{v.device} {v.device_name}, torch {v.torch_version}, host {v.host}")
    if v.flags_changed:
        table.add_row("flags changed", escape(", ".join(f"{k} {x}" for k, x in
                                                        v.flags_changed.items())))
    return table


def guards_table(v: Verdict) -> Table:
    """`pike eval --explain`: which guards ran and what each saw."""
    table = Table(title="guards", title_justify="left")
    table.add_column("guard", style="bold")
    table.add_column("what it saw")
    for name, saw in v.guards.items():
        table.add_row(escape(name), escape(saw))
    if v.flags_changed:
        table.add_row("precision", escape("the candidate changed backend flags; its numbers "
                                          "hold only with them: " + ", ".join(v.flags_changed)))
    return table


def result_table(result: OptimizeResult) -> Table:
    """`pike optimize`'s closing table: the best (confirmed where it was), spend, verdicts."""
    v = result.best_verdict
    table = Table(title=f"pike optimize: {result.task}", show_header=False, title_justify="left")
    table.add_column(style="bold")
    table.add_column()
    table.add_row("run dir", escape(str(result.run_dir)))
    if v is not None and v.runtime is not None:
        slower = slower_than_eager(v.speedup)
        colour = "yellow" if slower else "green"
        table.add_row("best", f"[{colour}]{v.speedup or 0:.2f}x[/{colour}] over eager "
                      f"({ms(v.runtime.median_ms)} vs {ms(reference_ms(v))})")
        if v.confirmed and v.search_speedup:
            table.add_row("confirmed", f"timed again beside eager in one window; "
                          f"{v.search_speedup:.2f}x in the search")
        table.add_row("solution", escape(str(result.run_dir / "best.py")))
        if slower:
            table.add_row("advice", "[yellow]no candidate beat eager: keep your own module"
                          "[/yellow] (best.py is the fastest correct candidate, kept for "
                          "inspection)")
    else:
        table.add_row("best", "[red]no correct candidate[/red]")
    table.add_row("spent", f"{result.queries} queries, ${result.dollars:.2f}")
    table.add_row("verdicts", ", ".join(f"{k} {n}" for k, n in sorted(result.verdicts.items()))
                  or "none")
    if result.replay_exhausted:
        table.add_row("replay", "the recorded run ended here")
    return table


def bench_table(result: CampaignResult) -> Table:
    """`pike bench`'s closing table: one row per task."""
    table = Table(title=f"pike bench: {escape(str(result.run_dir))}", title_justify="left")
    # "judged": the candidates the task's budget bought (its search's evaluations)
    for column in ("task", "best", "judged", "queries", "dollars", "verdicts"):
        table.add_column(column)
    for outcome in result.outcomes:
        r = outcome.result
        if r is None:
            table.add_row(escape(outcome.task), f"[red]failed[/red]: {escape(outcome.error or '')}",
                          "", "", "", "")
            continue
        v = r.best_verdict
        best = f"{v.speedup:.2f}x" if v and v.speedup else "-"
        if v and v.confirmed and v.search_speedup:
            best += f" confirmed (search {v.search_speedup:.2f}x)"
        table.add_row(escape(r.task), best, str(sum(r.verdicts.values())), str(r.queries),
                      f"${r.dollars:.2f}",
                      ", ".join(f"{k} {n}" for k, n in sorted(r.verdicts.items())))
    return table


def baselines_heading(first: Baseline) -> str:
    """Where the baselines were measured; a line of its own, since as the title of a narrow
    table it would be wrapped to the table's width."""
    return (f"baselines on {first.device} {first.device_name}, torch {first.torch_version}, "
            f"host {first.host} (median; speedup vs eager)")


def baselines_table(results: list[Baseline], modes: list[str]) -> Table:
    table = Table()
    table.add_column("task")
    for mode in modes:
        table.add_column(mode, justify="right")
    for r in results:
        cells = []
        for m in r.modes:
            if m.stats is None:
                cells.append(f"[red]failed[/red]: {escape((m.error or '')[:40])}")
            else:
                ratio = f" ({m.speedup_vs_eager:.2f}x)" if m.mode != "eager" else ""
                cells.append(ms(m.stats.median_ms) + ratio)
        table.add_row(r.task, *cells)
    return table


def floor_lines(results: list[Baseline]) -> list[str]:
    """Per task: its floor, and eager and each mode as a multiple of it (plain text)."""
    from pike.floor import describe

    lines = []
    for r in results:
        eager = r.eager_ms()
        line = describe(r.floor, eager) if r.floor else f"no floor: {r.no_floor}"
        if r.floor is not None and r.floor.ms > 0:
            line += "".join(f"; {m.mode} is {m.stats.median_ms / r.floor.ms:.3g}x the floor"
                            for m in r.modes if m.mode != "eager" and m.stats)
        lines.append(f"{r.task}: {line}")
    return lines
