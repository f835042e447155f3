"""`pike eval` and `pike baseline`: the evaluator called directly on a task, no search and
no run store."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape

from pike.commands.console import (
    EXIT_CANDIDATE_FAILED,
    EXIT_USER_ERROR,
    console,
    err_console,
    user_errors,
)
from pike.commands.options import (
    ConfigOpt,
    ConstructOnOpt,
    DeviceOpt,
    JsonOpt,
    run_config,
    task_ids,
)
from pike.errors import PikeError, TaskError
from pike.evaluate import BASELINE_MODES, Baseline, evaluate, measure_baselines
from pike.preflight import check_devices
from pike.report.progress import built_line, prebuild_line
from pike.report.tables import (
    baselines_heading,
    baselines_table,
    floor_lines,
    guards_table,
    verdict_table,
)
from pike.task import load_task, load_tasks


@user_errors
def eval_command(
    task: Annotated[str, typer.Argument(metavar="TASK", help="task file, or FOLDER/ID")],
    candidate: Annotated[Path, typer.Argument(metavar="CANDIDATE",
                                              help="candidate source defining ModelNew")],
    device: DeviceOpt = None,
    construct_on: ConstructOnOpt = None,
    trials: Annotated[int | None, typer.Option(min=1, help="correctness trials (default 5)")]
    = None,
    no_timing: Annotated[bool, typer.Option("--no-timing", help="check correctness only")] = False,
    as_json: JsonOpt = False,
    explain: Annotated[bool, typer.Option("--explain", help="also print which guards ran and "
                                          "what each saw")] = False,
    profile: Annotated[bool, typer.Option("--profile", help="also profile a correct candidate "
                                          "(torch.profiler, outside the timed region)")]
    = False,
    config: ConfigOpt = None,
) -> None:
    """Judge CANDIDATE against TASK: correctness on fresh inputs, then timing. Exit 0 if ok."""
    cfg = run_config(config, device, construct_on)
    if profile:
        cfg.eval.profile = True
    if trials is not None:
        cfg.eval.trials = trials
    cfg.eval.time_candidate = not no_timing
    the_task = load_task(task)
    try:
        source = candidate.read_text()
    except (OSError, UnicodeDecodeError) as err:
        raise TaskError(f"{candidate}: cannot read candidate ({err})") from None
    check_devices(cfg.eval)
    with err_console.status(f"evaluating {candidate.name} against {the_task.name}..."):
        verdict = evaluate(the_task, source, cfg)
    if as_json:
        print(verdict.model_dump_json(indent=2))
    else:
        console.print(verdict_table(the_task.name, candidate.name, verdict))
        if verdict.message:
            console.print(verdict.message, markup=False, highlight=False, soft_wrap=True)
        if explain:
            console.print(guards_table(verdict))
        if verdict.profile is not None:
            from pike.evaluate.profile import render

            console.print(escape(render(verdict.profile, cfg.eval.profile_tokens)),
                          highlight=False)
            console.print(f"[dim]{escape(verdict.profile.ncu)}[/dim]")
    if not verdict.ok:
        raise typer.Exit(EXIT_CANDIDATE_FAILED)

@user_errors
def baseline_command(
    task: Annotated[str, typer.Argument(metavar="TASK",
                                        help="task file, FOLDER/ID, or a folder of tasks")],
    device: DeviceOpt = None,
    construct_on: ConstructOnOpt = None,
    modes: Annotated[str, typer.Option(help="comma-separated modes")] = ",".join(BASELINE_MODES),
    tasks: Annotated[str | None, typer.Option(help="only these ids of a folder: 1,4,9")] = None,
    out: Annotated[Path | None, typer.Option(help="folder for the JSON (default RUNS/baselines)")]
    = None,
    as_json: JsonOpt = False,
    config: ConfigOpt = None,
) -> None:
    """Time eager and each torch.compile mode of a task (or every task of a folder)."""
    cfg = run_config(config, device, construct_on)
    mode_list = [m.strip() for m in modes.split(",") if m.strip()]
    unknown = [m for m in mode_list if m != "eager" and not m.startswith("compile:")]
    if unknown:
        raise PikeError(f"unknown mode {unknown[0]!r}; use eager or compile:<torch.compile mode>")
    if not mode_list:
        raise PikeError("no mode given; use eager or compile:<torch.compile mode>")
    if Path(task).is_dir():
        task_list = load_tasks(task, task_ids(tasks))
    else:
        task_list = [load_task(task)]
    check_devices(cfg.eval)
    out_dir = out or cfg.runs_dir / "baselines"
    out_dir.mkdir(parents=True, exist_ok=True)
    results: list[Baseline] = []
    failures: dict[str, str] = {}
    for i, t in enumerate(task_list, 1):
        with err_console.status(f"[{i}/{len(task_list)}] timing {t.name}..."):
            try:
                result = measure_baselines(t, cfg, mode_list, on_event=_built_printer(t.name))
            except PikeError as err:  # one bad task does not stop a folder
                failures[t.name] = str(err)
                err_console.print(f"[red]{escape(t.name)}: {escape(str(err))}[/red]",
                                  highlight=False, soft_wrap=True)
                continue
        results.append(result)
        path = out_dir / f"{t.name}.json"
        path.write_text(result.model_dump_json(indent=2))
    if as_json:
        print(json.dumps({"baselines": [r.model_dump() for r in results], "failures": failures},
                         indent=2))
    else:
        _print_baselines(results, mode_list)
        err_console.print(f"wrote {len(results)} baseline file(s) to {out_dir}", markup=False,
                          highlight=False, soft_wrap=True)
    if not results:
        raise typer.Exit(EXIT_USER_ERROR)


def _built_printer(task: str) -> Callable[..., None]:
    def printed(kind: str, **data: Any) -> None:
        line = (built_line(**data) if kind == "mode_built" else
                prebuild_line(**data) if kind == "prebuild_failed" else None)
        if line is not None:
            err_console.print(f"{task}: {line}", markup=False, highlight=False,
                              soft_wrap=True)
    return printed


def _print_baselines(results: list[Baseline], modes: list[str]) -> None:
    if not results:
        return
    console.print(escape(baselines_heading(results[0])), highlight=False, soft_wrap=True)
    console.print(baselines_table(results, modes))
    for line in floor_lines(results):
        console.print(escape(line), highlight=False)
