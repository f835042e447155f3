"""An audit result as a markdown page: the aggregates first, every failure spelled out."""

from __future__ import annotations

from collections import Counter

from pike.audit.result import UNSTEADY_SPREAD, AuditResult, TaskAudit

_MESSAGE_LINES = 12


def to_markdown(result: AuditResult) -> str:
    lines = [f"# pike audit of {result.solutions}", "",
             f"Tasks from `{result.tasks_dir}`, files matched by {result.matched_by}; "
             + (f"gathered from the audit runs {', '.join(f'`{r}`' for r in result.combined_from)}"
                " (nothing re-run; each task's figures from one of them)."
                if result.combined_from else f"run store `{result.run_dir}`."), "",
             f"Measured on {_device(result)}, torch {result.torch_version or '?'}, "
             f"host {result.host or '?'}, "
             + (f"gathered {result.date} (when each was measured: Warnings)"
                if result.combined_from else result.date)
             + f". Protocol: {result.protocol}.", ""]
    lines += _summary(result)
    lines += _held_back(result)
    lines += _table(result)
    lines += _failures(result.tasks)
    lines += _by_rounding(result.tasks)
    if result.warnings:
        lines += ["## Warnings", "", *(f"- {_inline(w)}" for w in result.warnings), ""]
    return "\n".join(lines)


def _device(result: AuditResult) -> str:
    if result.device_name and result.device_name != result.device:
        return f"{result.device} ({result.device_name})"
    return result.device or "?"


def _summary(result: AuditResult) -> list[str]:
    agg = result.aggregates
    failed = Counter(t.status for t in result.tasks
                     if t.status not in ("ok", "missing", "error"))
    failed_text = ", ".join(f"{n} {s}" for s, n in failed.most_common())
    lines = ["## Summary", "",
             f"- **Geomean speedup over eager, all {agg.tasks} tasks: {_x(agg.geomean_all)}** "
             "(a failing or missing file counts 1.0×)",
             f"- Geomean over the {_count(agg.correct, 'correct file')} only: "
             f"{_x(agg.geomean_correct)}" if agg.correct else
             "- No correct file: there is no geomean over correct files"]
    for mode in agg.modes:
        lines.append(f"- Geomean over torch.compile {_mode(mode.mode)}: {_x(mode.geomean)} "
                     f"({mode.tasks} tasks; no correct file counts 1.0×)")
    if agg.best_compile is not None:
        lines.append(f"- Geomean over each task's fastest torch.compile mode: "
                     f"{_x(agg.best_compile.geomean)} ({agg.best_compile.tasks} tasks; no correct "
                     "file counts 1.0×)")
    if agg.below_best_compile:
        same = {t.task for t in result.tasks if t.is_its_fastest_compile_mode()}
        slower = ", ".join(f"{task} {_x(over)}" + (" (the file is that mode, compiled again)"
                                                   if task in same else "")
                           for task, over in
                           sorted(agg.below_best_compile.items(), key=lambda kv: kv[1]))
        lines.append(f"- Correct but slower than their task's fastest torch.compile mode: {slower}")
    if agg.times_floor is not None:
        lowp = agg.times_floor.lowp_tasks
        lines.append(f"- Distance from the floor (What holds it back), geomean over the "
                     f"{_count(agg.times_floor.tasks, 'correct file')} with one: "
                     f"{_x(agg.times_floor.geomean)} their floor"
                     + (f" (the tensor-core floor for the {lowp} in lower precision)"
                        if lowp else "")
                     + f"; eager {_x(agg.times_floor.eager)} the task's floor")
    if agg.claimed_geomean is not None:
        lines.append(f"- Claimed geomean: {_x(agg.claimed_geomean)} ({_inline(agg.claimed_source or '')}); "
                     f"the measured all-task geomean is {agg.geomean_all / agg.claimed_geomean:.2f}× "
                     "the claim")
    lines.append(f"- {agg.correct} correct, {agg.failed} failed"
                 + (f" ({failed_text})" if failed_text else "")
                 + f", {agg.missing} missing, {agg.errors} with a failing reference")
    seed = [t.task for t in result.tasks if t.seed_dependent]
    if seed:
        lines.append(f"- Seed-dependent (pass some trials, fail others): {', '.join(seed)}")
    lines += _unsteady(result)
    return [*lines, ""]


def _unsteady(result: AuditResult) -> list[str]:
    tasks = [t for t in result.tasks if t.task in result.aggregates.unsteady]
    if not tasks:
        return []
    named = "; ".join(f"{t.task} (" + ", ".join(f"{what} {spread:.0%}" for what, spread
                                                 in t.unsteady().items()) + ")"
                      for t in tasks)
    ids = ",".join(str(t.task_id) for t in tasks if t.task_id is not None)
    # a combined result has no run of its own to resume: each part's run measures again
    run = "RUN" if result.combined_from else _inline(result.run_dir)
    where = " (RUN: the part's run that judged it)" if result.combined_from else ""
    again = (f"; `pike audit --resume {run} --redo {ids}`{where} measures them again"
             if ids else "")
    return [f"- Unsteady timings (quartiles more than {UNSTEADY_SPREAD:.0%} of the median "
            f"apart), whose figures may move when measured again: {named}{again}"]


# how many of the tasks with the lowest figures over eager the page names as holding it back
_LOWEST = 5


def _held_back(result: AuditResult) -> list[str]:
    """The tasks that hold the geomeans back, each with how far its file (and eager) is from
    the least time the task could take on its GPU: the tasks slower than their fastest
    torch.compile mode, and the lowest over eager."""
    below = result.aggregates.below_best_compile
    lowest = sorted(result.tasks, key=lambda t: t.counted_speedup())[:_LOWEST]
    if not below and not lowest:
        return []
    by_name = {t.task: t for t in result.tasks}
    lines = ["## What holds it back", "",
             "Each task's floor is the least time it can take on its GPU at its own precision "
             "(pike.floor: its FLOPs at the card's peak, or its minimum bytes at the card's "
             "bandwidth); \"N× floor\" is the file's median time over it (eager's in "
             "brackets), over the tensor-core floor (bf16/fp16 peaks) where the file "
             "computes in lower precision (TF32, fp16, bf16 detected).",
             ""]
    if below:
        lines += ["Slower than their task's fastest torch.compile mode:", ""]
        lines += [f"- {_held_line(by_name[name])}"
                  for name, _ in sorted(below.items(), key=lambda kv: kv[1])]
        lines.append("")
    lines += ["Lowest over eager (a failing or missing file counts 1.0×):", ""]
    lines += [f"- {_held_line(t)}" for t in lowest]
    return [*lines, ""]


def _held_line(t: TaskAudit) -> str:
    parts = [f"{t.task}: {_verdict(t)}, {_x(t.counted_speedup())} over eager"]
    mode = t.fastest_compile_mode()
    if t.ok and mode is not None:
        parts.append(f"{_x(t.compile_speedups[mode])} its fastest compile mode ({_mode(mode)})")
    parts.append(_floor_text(t, long=True))
    return ", ".join(parts)


def _floor_text(t: TaskAudit, long: bool = False) -> str:
    if t.floor_ms is None:
        return "no floor" if long else "—"
    text = (f"{_x(t.times_floor)} {'tensor-core ' if t.floor_is_lowp else ''}floor"
            if t.times_floor is not None else "file untimed") \
        + f" (eager {_x(t.eager_times_floor)})"
    if long and t.lowp_floor_ms and t.lowp_floor_ms < 0.99 * t.floor_ms:
        text += f", floor {_ms(t.floor_ms)}, {_ms(t.lowp_floor_ms)} with tensor cores"
    elif long:
        text += f", floor {_ms(t.floor_ms)}"
    return text


def _table(result: AuditResult) -> list[str]:
    modes = [m.mode for m in result.aggregates.modes]
    claimed = any(t.claimed_speedup is not None for t in result.tasks)
    floors = any(t.floor_ms is not None for t in result.tasks)
    head = ["task", "file", "verdict", "trials passed", "max abs / rel error", "vs eager",
            *(f"vs compile {_mode(m)}" for m in modes), "precision detected"]
    head += ["× floor (eager)"] if floors else []
    head += ["claimed"] if claimed else []
    lines = ["## Tasks", "", _row(head), _row(["---"] * len(head))]
    for t in result.tasks:
        cells = [t.task + (" (task changed)" if t.task_changed else ""), t.file or "—",
                 _verdict(t), f"{t.trials_passed}/{t.trials}" if t.trials else "—",
                 _errors(t), _x(t.speedup), *(_x(t.compile_speedups.get(m)) for m in modes),
                 ", ".join(t.precision) or "none"]
        cells += [_floor_text(t)] if floors else []
        cells += [_x(t.claimed_speedup)] if claimed else []
        lines.append(_row(cells))
    return [*lines, ""]


def _by_rounding(tasks: list[TaskAudit]) -> list[str]:
    """The correct files that passed only by the float64 rule, named: their figures count,
    and a reader should know what they rest on."""
    passed = [t for t in tasks if t.ok and t.rounding_passed]
    if not passed:
        return []
    return ["## Correct by the float64 rule", "",
            "Values outside tolerance of the reference, no further from a float64 run of "
            "it than the reference itself is (docs/evaluator.md, the reference's own "
            "rounding):", "",
            *(f"- {t.task}: {t.rounding_passed} values" for t in passed), ""]


def _failures(tasks: list[TaskAudit]) -> list[str]:
    failing = [t for t in tasks if not t.ok]
    if not failing:
        return []
    lines = ["## Failures", ""]
    for t in failing:
        where = f" in {t.phase}" if t.phase else ""
        lines += [f"### {t.task}: {_verdict(t)}{where}", ""]
        if t.file:
            lines += [f"File `{t.file}`, {t.trials_passed}/{t.trials} trials passed.", ""]
        message = "\n".join(t.message.strip().splitlines()[:_MESSAGE_LINES])
        if message:
            lines += ["````text", message, "````", ""]
        for e in t.trial_errors:
            lines.append(f"- {e.label}: max abs error {_num(e.max_abs_error)}, max rel error "
                         f"{_num(e.max_rel_error)}: {_inline(e.problem)}")
        lines += [""] if t.trial_errors else []
    return lines


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


def _verdict(t: TaskAudit) -> str:
    if t.seed_dependent:
        return f"{t.status} (seed-dependent: {t.trials_passed}/{t.trials} trials passed)"
    return t.status


def _errors(t: TaskAudit) -> str:
    if t.max_abs_error is None and t.max_rel_error is None:
        return "—"
    return f"{_num(t.max_abs_error)} / {_num(t.max_rel_error)}"


def _row(cells: list[str]) -> str:
    return "| " + " | ".join(_inline(c) for c in cells) + " |"


def _inline(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _mode(mode: str) -> str:
    return mode.removeprefix("compile:")


def _x(value: float | None) -> str:
    return "—" if value is None else f"{value:.3g}×"


def _ms(value: float) -> str:
    return f"{value:.3g} ms"


def _num(value: float | None) -> str:
    return "—" if value is None else f"{value:.3g}"
