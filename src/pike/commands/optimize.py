"""`pike optimize` (one task) and `pike bench` (every task of a folder, one run store): the
search, with live progress, resumable when cut off."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape

from pike.commands.console import STOPPED_AT_TIME_LIMIT, console, err_console, user_errors
from pike.commands.interrupt import resumable
from pike.commands.options import (
    BackendOpt,
    BudgetDollarsOpt,
    BudgetQueriesOpt,
    ClusterOpt,
    ConfigOpt,
    ConstructOnOpt,
    DeviceOpt,
    DevicesOpt,
    FixerOpt,
    FixSeedsOpt,
    GranularityOpt,
    LlmOpt,
    PlannerOpt,
    PresetOpt,
    ProfileFeedbackOpt,
    RayAddressOpt,
    SeedFromOpt,
    SeedOfflineOpt,
    StrategyOpt,
    WorkersOpt,
    run_config,
    task_ids,
)
from pike.errors import PikeError
from pike.evaluate import device_holds
from pike.preflight import check_run
from pike.report.progress import StatusFields
from pike.report.tables import bench_table, result_table
from pike.search_flags import (
    SearchFlags,
    as_run_will,
    placement_given,
    runs_as_recorded,
    search_config,
)
from pike.task import load_task, load_tasks


@user_errors
def optimize_command(
    task: Annotated[str | None, typer.Argument(metavar="TASK", help="task file or FOLDER/ID")]
    = None,
    llm: LlmOpt = None,
    fixer_llm: FixerOpt = None,
    budget_queries: BudgetQueriesOpt = None,
    budget_dollars: BudgetDollarsOpt = None,
    backend: BackendOpt = None,
    device: DeviceOpt = None,
    construct_on: ConstructOnOpt = None,
    out: Annotated[Path | None, typer.Option(help="run dir (default RUNS/<task>-<time>)")]
    = None,
    resume: Annotated[Path | None, typer.Option(help="continue the run in this dir")] = None,
    replay: Annotated[Path | None, typer.Option(help="re-run this run's recorded replies, "
                                                "no LLM")] = None,
    seed_offline: SeedOfflineOpt = False,
    seed_from: SeedFromOpt = None,
    fix_seeds: FixSeedsOpt = False,
    planner: PlannerOpt = False,
    plan_granularity: GranularityOpt = None,
    profile_feedback: ProfileFeedbackOpt = False,
    workers: WorkersOpt = None,
    devices: DevicesOpt = None,
    cluster: ClusterOpt = None,
    ray_address: RayAddressOpt = None,
    strategy: StrategyOpt = None,
    preset: PresetOpt = None,
    config: ConfigOpt = None,
) -> None:
    """Make TASK faster; writes best.py to the run dir.

    Without --llm: the offline strategy (program transformations judged by the evaluator).
    With --llm: the PIKE-B search with LLM agents."""
    from pike.report.progress import SearchProgress
    from pike.search import optimize
    from pike.search.session import new_run_dir

    if resume and (task or replay):
        raise PikeError("--resume continues a run as it was started: give no task or --replay")
    flags = SearchFlags(llm, fixer_llm, budget_queries, budget_dollars, backend, strategy,
                        preset, seed_offline, seed_from, fix_seeds, planner, plan_granularity,
                        profile_feedback, workers, devices, cluster, ray_address,
                        construct_on)
    runs_as_recorded("--resume" if resume else "--replay" if replay else None, flags,
                      device=device, config=config)
    cfg = search_config(run_config(config, device, flags.construct_on), flags)
    the_task = load_task(task) if task else None
    if the_task is None and resume is None and replay is None:
        raise PikeError("give a TASK to optimize (or --resume RUN_DIR / --replay RUN_DIR)")
    run_cfg, stored = as_run_will(cfg, flags, resume or replay)
    check_run(run_cfg, calls_llm=replay is None, out=None if resume else out,
              tasks=[the_task] if the_task else [])
    name = the_task.name if the_task else next(iter(stored), "run")
    if resume is None:  # named here, so that an interrupted run can say where it is
        out = out or new_run_dir(run_cfg.runs_dir, name)  # a replay's: as it recorded
    # An interrupted replay goes on by replaying again: resumed, it would call the LLM.
    go_on = (f"pike optimize --replay {replay} --out NEW_DIR" if replay is not None
             else f"pike optimize --resume {resume or out}")
    with (resumable(go_on, resume or out),
          SearchProgress(err_console, name, StatusFields.for_run(run_cfg)) as progress):
        result = optimize(the_task, cfg, out=out, resume=resume, replay=replay,
                          command="pike " + " ".join(sys.argv[1:]),
                          placement=placement_given(cfg, flags), on_event=progress)
    _print_result(result)


@user_errors
def bench_command(
    folder: Annotated[Path | None, typer.Argument(metavar="FOLDER", help="folder of task files")]
    = None,
    tasks: Annotated[str | None, typer.Option(help="only these task ids: 1,4,9")] = None,
    strategy: StrategyOpt = None,
    llm: LlmOpt = None,
    fixer_llm: FixerOpt = None,
    budget_queries: BudgetQueriesOpt = None,
    budget_dollars: BudgetDollarsOpt = None,
    backend: BackendOpt = None,
    preset: PresetOpt = None,
    seed_offline: SeedOfflineOpt = False,
    seed_from: SeedFromOpt = None,
    fix_seeds: FixSeedsOpt = False,
    planner: PlannerOpt = False,
    plan_granularity: GranularityOpt = None,
    profile_feedback: ProfileFeedbackOpt = False,
    workers: WorkersOpt = None,
    devices: DevicesOpt = None,
    cluster: ClusterOpt = None,
    ray_address: RayAddressOpt = None,
    jobs: Annotated[int, typer.Option(min=1, help="tasks at once, each with --workers "
                                      "evaluations (timing stays exclusive per GPU)")] = 1,
    device: DeviceOpt = None,
    construct_on: ConstructOnOpt = None,
    out: Annotated[Path | None, typer.Option(help="run dir (default RUNS/bench-<folder>-<time>)")]
    = None,
    resume: Annotated[Path | None, typer.Option(help="continue the campaign in this dir")]
    = None,
    redo: Annotated[str | None, typer.Option(
        help="with --resume: run these task ids again from the start, baselines, search and "
        "budget (what they recorded is dropped): 12,40")] = None,
    fill_baselines: Annotated[bool, typer.Option(
        "--fill-baselines", help="with --resume: measure again the baselines of finished "
        "tasks where a mode is missing or failed")] = False,
    stop_after: Annotated[float | None, typer.Option(
        min=0, help="start nothing new after this many seconds (a device session's or a job's "
        "time limit): what runs ends and is kept, the tasks not finished stay open for "
        "--resume, and the exit status is 75")] = None,
    config: ConfigOpt = None,
) -> None:
    """Run one strategy over every task of FOLDER, each with its own budget, in one run store.

    Baselines (eager and each torch.compile mode) are measured once per task and kept.
    After a crash or Ctrl-C, --resume RUN_DIR continues without redoing or re-spending;
    --redo IDS runs tasks again, --fill-baselines measures failed baselines again."""
    from pike.report.progress import BenchProgress
    from pike.search.campaign import bench
    from pike.search.session import new_run_dir

    if resume and folder:
        raise PikeError("--resume continues a campaign as it was started: give no FOLDER")
    if (redo or fill_baselines) and not resume:
        raise PikeError("--redo and --fill-baselines act on a campaign: give --resume RUN_DIR")
    flags = SearchFlags(llm, fixer_llm, budget_queries, budget_dollars, backend, strategy,
                        preset, seed_offline, seed_from, fix_seeds, planner, plan_granularity,
                        profile_feedback, workers, devices, cluster, ray_address,
                        construct_on)
    runs_as_recorded("--resume" if resume else None, flags, device=device, config=config,
                      tasks=tasks)
    cfg = search_config(run_config(config, device, flags.construct_on), flags)
    ids = task_ids(tasks)
    task_list = load_tasks(folder, ids) if folder else []
    names = [t.name for t in task_list]
    run_cfg, stored = as_run_will(cfg, flags, resume)
    check_run(run_cfg, out=None if resume else out, tasks=task_list)
    if resume is None and folder is not None:  # named here: an interrupted run says where
        out = out or new_run_dir(cfg.runs_dir, f"bench-{Path(folder).name}")
    with (resumable(f"pike bench --resume {resume or out or 'RUN_DIR'}", resume or out),
          BenchProgress(err_console, names or stored, StatusFields.for_run(run_cfg)) as progress):
        result = bench(folder, cfg, ids=ids, out=out, resume=resume, jobs=jobs,
                       command="pike " + " ".join(sys.argv[1:]),
                       placement=placement_given(cfg, flags), redo=task_ids(redo),
                       fill_baselines=fill_baselines, stop_after=stop_after,
                       on_event=progress)
    console.print(bench_table(result))
    held = device_holds.said_briefly(result.run_dir)
    if held:
        console.print(escape(held))
    console.print(f"report: pike report {escape(str(result.run_dir))}")
    console.print(f"solutions: {escape(str(result.run_dir / 'solutions'))} "
                  "(re-judge them alone with pike audit)")
    if result.open_tasks:
        err_console.print(f"stopped at the time limit: {len(result.open_tasks)} of "
                          f"{len(result.outcomes)} tasks not finished; continue with "
                          f"[bold]pike bench --resume {escape(str(result.run_dir))}[/bold]")
        raise typer.Exit(STOPPED_AT_TIME_LIMIT)


def _print_result(result: Any) -> None:
    console.print(result_table(result))
