"""`pike audit`: every file of a solution set judged with the full guards and timed against
the baselines; resumed, redone in part, or gathered from audits run apart."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape

from pike.commands.console import STOPPED_AT_TIME_LIMIT, console, err_console, user_errors
from pike.commands.interrupt import resumable
from pike.commands.options import (
    ConfigOpt,
    ConstructOnOpt,
    DeviceOpt,
    JsonOpt,
    run_config,
    task_ids,
)
from pike.errors import ConfigError
from pike.preflight import check_devices, check_new_run_dir
from pike.search_flags import split_devices


@user_errors
def audit_command(
    solutions: Annotated[Path | None, typer.Argument(
        metavar="SOLUTIONS", help="folder of solution files (task_10.py, 10_*.py, a "
        "mapping.yaml, or a pike set)")] = None,
    tasks_folder: Annotated[Path | None, typer.Argument(
        metavar="TASKS", help="folder of task files")] = None,
    tasks: Annotated[str | None, typer.Option(help="only these task ids: 1,4,9")] = None,
    device: DeviceOpt = None,
    construct_on: ConstructOnOpt = None,
    workers: Annotated[int | None, typer.Option(
        min=1, help="tasks audited at once (timing stays one at a time per GPU)")] = None,
    devices: Annotated[str | None, typer.Option(
        help="GPUs of this host to spread the tasks over: cuda:0,cuda:1 (each task measured "
        "on one; at least one task per GPU at once); with --resume, for this call")] = None,
    out: Annotated[Path | None, typer.Option(help="run dir (default RUNS/audit-<set>-<time>)")]
    = None,
    allow_changed_tasks: Annotated[bool, typer.Option(
        "--allow-changed-tasks", help="audit a pike set even where a task file changed since "
        "the set was written (marked in the result)")] = False,
    resume: Annotated[Path | None, typer.Option(
        help="go on with the audit in this run dir: what it judged is kept")] = None,
    redo: Annotated[str | None, typer.Option(
        help="with --resume: audit these task ids again from the start, baselines and file "
        "(what they recorded is dropped): 12,40")] = None,
    fill_baselines: Annotated[bool, typer.Option(
        "--fill-baselines", help="with --resume: audit again, baselines and file, the "
        "finished tasks whose baselines lack a mode or failed in one")] = False,
    stop_after: Annotated[float | None, typer.Option(
        min=0, help="start no task's work after this many seconds (a device session's "
        "limit): the tasks in flight finish, the rest stay for --resume, and the exit "
        "status is 75")] = None,
    combine: Annotated[list[Path] | None, typer.Option(
        metavar="RUN_DIR", help="gather audit runs of SOLUTIONS over TASKS (each judged some "
        "of the tasks: other hosts, other device sessions) into one result in --out, "
        "nothing re-run; once per run")] = None,
    later_wins: Annotated[bool, typer.Option(
        "--later-wins", help="with --combine: a task judged in two of the runs is taken from "
        "the one named later (judged again with --redo after a verdict found wrong), and "
        "the result says so; without it, refused")] = False,
    as_json: JsonOpt = False,
    config: ConfigOpt = None,
) -> None:
    """Judge every file of a solution set with the full guards, time it against eager and
    each torch.compile mode, and give aggregates that count failures as 1.0x.

    Cut off (Ctrl-C, a time limit), --resume RUN_DIR goes on where it stopped (--workers and
    --devices may change then); with it, --redo IDS audits tasks again and
    --fill-baselines those whose baselines failed. Audits of parts of a set made apart,
    --combine RUN_DIR (once per run) gathers into one result (--tasks: of those tasks
    only, as an audit of a sample of a folder was run; --later-wins: a task two runs
    judged is taken from the one named later)."""
    from pike.audit import audit, resume_audit, to_markdown
    from pike.audit.run import audited_tasks, resumed_config
    from pike.report.progress import AUDIT_FIELDS, BenchProgress
    from pike.search.session import new_run_dir

    if combine:
        _combine_audits(solutions, tasks_folder, combine, out, as_json, task_ids(tasks),
                        later_wins, given=[
            name for name, value in (("--device", device),
                                     ("--devices", devices), ("--workers", workers),
                                     ("--resume", resume), ("--stop-after", stop_after),
                                     ("--config", config), ("--construct-on", construct_on),
                                     ("--allow-changed-tasks", allow_changed_tasks or None),
                                     ("--redo", redo), ("--fill-baselines",
                                                        fill_baselines or None))
            if value is not None])
        return
    if later_wins:
        raise ConfigError("--later-wins chooses between runs gathered with --combine")
    if (redo or fill_baselines) and resume is None:
        raise ConfigError("--redo and --fill-baselines act on an audit run: give --resume "
                          "RUN_DIR")
    if resume is not None:
        given = [name for name, value in (("SOLUTIONS", solutions), ("TASKS", tasks_folder),
                                          ("--tasks", tasks), ("--out", out),
                                          ("--config", config), ("--device", device))
                 if value is not None]
        if given:
            raise ConfigError(f"--resume goes on with the audit as it was asked: drop "
                              f"{', '.join(given)}")
        gpus = split_devices(devices) if devices is not None else None
        # the recorded GPUs too: one missing on this host would fail every task left
        check_devices(resumed_config(resume, workers, gpus).eval)
        with (resumable(f"pike audit --resume {resume}", resume),
              BenchProgress(err_console, _stored_task_names(resume), AUDIT_FIELDS) as progress):
            result = resume_audit(resume, workers=workers, devices=gpus, stop_after=stop_after,
                                  on_event=progress, redo=task_ids(redo),
                                  fill_baselines=fill_baselines)
        _print_audit(result, as_json, to_markdown)
        return
    if solutions is None or tasks_folder is None:
        raise ConfigError("give SOLUTIONS and TASKS (or --resume RUN_DIR)")
    cfg = run_config(config, device, construct_on)
    if workers is not None:
        cfg.eval.workers = workers
    if devices is not None:
        cfg.eval.devices = split_devices(devices)
    ids = task_ids(tasks)
    # a missing folder or a bad mapping fails here, before work
    names = [t.name for t in audited_tasks(solutions, tasks_folder, ids).tasks]
    run_dir = out or new_run_dir(cfg.runs_dir, f"audit-{solutions.resolve().name}")
    check_devices(cfg.eval)
    check_new_run_dir(run_dir)
    with (resumable(f"pike audit --resume {run_dir}", run_dir),
          BenchProgress(err_console, names, AUDIT_FIELDS) as progress):
        result = audit(solutions, tasks_folder, cfg, out=run_dir, ids=ids,
                       command="pike " + " ".join(sys.argv[1:]),
                       allow_changed_tasks=allow_changed_tasks, stop_after=stop_after,
                       on_event=progress)
    _print_audit(result, as_json, to_markdown)


def _combine_audits(solutions: Path | None, tasks_folder: Path | None, runs: list[Path],
                    out: Path | None, as_json: bool, ids: list[int] | None,
                    later_wins: bool, given: list[str]) -> None:
    from pike.audit import to_markdown
    from pike.audit.combine import combine

    if given:
        raise ConfigError(f"--combine measures nothing, it gathers what the runs judged: drop "
                          f"{', '.join(given)}")
    if solutions is None or tasks_folder is None or out is None:
        raise ConfigError("--combine needs SOLUTIONS, TASKS and --out (where the result goes)")
    result = combine(solutions, tasks_folder, runs, out=out, ids=ids, later_wins=later_wins)
    if as_json:
        print(result.model_dump_json(indent=2))
    else:
        console.print(escape(to_markdown(result)), highlight=False, soft_wrap=True)
        console.print(f"result: {escape(str(out / 'audit.md'))}")
    if result.open_tasks:  # not a time limit's stop: the exit status stays 0
        err_console.print(f"{len(result.open_tasks)} tasks not audited in any of the runs: "
                          f"{', '.join(result.open_tasks)}")


def _stored_task_names(run_dir: Path) -> list[str]:
    from pike.store import RunStore

    with RunStore.open(run_dir) as store:
        return [t["name"] for t in store.tasks()]


def _print_audit(result: Any, as_json: bool, to_markdown: Callable[[Any], str]) -> None:
    run_dir = escape(str(result.run_dir))
    if as_json:
        print(result.model_dump_json(indent=2))
    else:
        console.print(escape(to_markdown(result)), highlight=False, soft_wrap=True)
        console.print(f"run store: {run_dir} (pike report {run_dir}; cut off: "
                      f"pike audit --resume {run_dir})")
    if result.open_tasks:
        err_console.print(f"stopped at the time limit: {len(result.open_tasks)} tasks not "
                          f"audited; continue with [bold]pike audit --resume {run_dir}[/bold]")
        raise typer.Exit(STOPPED_AT_TIME_LIMIT)
