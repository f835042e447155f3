"""The `pike` command line: thin, calls the public API, prints with rich."""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import signal
import sys
from collections.abc import Callable, Iterator
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console
from rich.markup import escape
from typer.core import TyperCommand

from pike.config import CONSTRUCT_ON, RunConfig
from pike.errors import ConfigError, PikeError, TaskError
from pike.evaluate import BASELINE_MODES, Baseline, device_holds, evaluate, measure_baselines
from pike.evaluate.leftovers import end_children_and_remove_own_dirs, sweep_orphaned_dirs
from pike.preflight import check_devices, check_new_run_dir, check_run
from pike.report.progress import StatusFields, built_line, prebuild_line
from pike.report.tables import (
    baselines_heading,
    baselines_table,
    bench_table,
    floor_lines,
    guards_table,
    result_table,
    verdict_table,
)
from pike.search_flags import (
    SearchFlags,
    as_run_will,
    placement_given,
    runs_as_recorded,
    search_config,
    split_devices,
)
from pike.store import STORE_FILE
from pike.task import load_task, load_tasks


class _Command(TyperCommand):
    """Usage lines name the arguments as the help lists them (`pike eval [OPTIONS]
    TASK CANDIDATE`): typer's own wraps required ones in braces, which reads as a set."""

    def collect_usage_pieces(self, ctx: Any) -> list[str]:
        pieces = [self.options_metavar] if self.options_metavar else []
        for param in self.get_params(ctx):
            if param.param_type_name != "argument":
                continue
            name = param.metavar or (param.name or "").upper()
            name = name if param.required else f"[{name}]"
            pieces.append(name + ("..." if param.nargs != 1 else ""))
        return pieces


app = typer.Typer(help="pike: make PyTorch inference faster, judged by a strict evaluator.",
                  no_args_is_help=True, add_completion=False)
command = functools.partial(app.command, cls=_Command)
console = Console()
err_console = Console(stderr=True)

F = TypeVar("F", bound=Callable[..., Any])

ConfigOpt = Annotated[Path | None, typer.Option("--config", help="YAML file with a RunConfig")]
DeviceOpt = Annotated[str | None, typer.Option(help="cpu, cuda, cuda:1 (default: cuda:0 if any)")]
JsonOpt = Annotated[bool, typer.Option("--json", help="print JSON instead of a table")]
ConstructOnOpt = Annotated[str | None, typer.Option(
    help="where both models are built: auto (the default: on the GPU where the task's weights "
    "reach 256 MiB, else as cpu), cpu (then moved, as KernelBench does) or device (for tasks "
    "written to be built on the GPU)")]

LlmOpt = Annotated[str | None, typer.Option(
    help="optimizer model: openai:gpt-5, gemini:..., openrouter:..., http://host:port/v1#model")]
FixerOpt = Annotated[str | None, typer.Option(help="error-fixer model (default: --llm)")]
BudgetQueriesOpt = Annotated[int | None, typer.Option(
    min=1, help="LLM calls per task (default 300)")]
BudgetDollarsOpt = Annotated[float | None, typer.Option(min=0.0, help="USD per task")]
BackendOpt = Annotated[str | None, typer.Option(help="any, cuda or triton")]
SeedOfflineOpt = Annotated[bool, typer.Option(
    "--seed-offline", help="with --llm: start from the best offline candidate")]
SeedFromOpt = Annotated[Path | None, typer.Option(
    help="with --llm: a solution set; its correct files seed the first round")]
FixSeedsOpt = Annotated[bool, typer.Option(
    "--fix-seeds", help="with --seed-from: the fixer repairs the set's failing files first")]
StrategyOpt = Annotated[str | None, typer.Option(
    help="offline (no LLM; the default without --llm), branching (PIKE-B; the default with "
    "--llm) or evolve (PIKE-O)")]
PresetOpt = Annotated[str | None, typer.Option(
    help="PIKE-O preset: openevolve, mutation, serial, one-island, exploit, "
    "exploit-small-library; or 'guided': the planner and profile feedback, for either "
    "strategy")]
PlannerOpt = Annotated[bool, typer.Option(
    "--planner", help="a planner agent ranks concrete steps before each round; each query "
    "implements one (see --plan-granularity)")]
GranularityOpt = Annotated[str | None, typer.Option(
    help="what each query implements with --planner: one (step), several, free")]
WorkersOpt = Annotated[int | None, typer.Option(
    min=1, help="candidates evaluated at once (per task, with bench): builds and compiles "
    "overlap, timing stays one at a time per GPU (default 1)")]
DevicesOpt = Annotated[str | None, typer.Option(
    help="GPUs of this host to spread evaluations over: cuda:0,cuda:1 (one timing lane each)")]
ClusterOpt = Annotated[str | None, typer.Option(
    help="where evaluations run: local (default) or ray (pip install 'ray>=2.9')")]
RayAddressOpt = Annotated[str | None, typer.Option(
    help="the Ray cluster to join (implies --cluster ray; default RAY_ADDRESS or a local Ray)")]
ProfileFeedbackOpt = Annotated[bool, typer.Option(
    "--profile-feedback", help="profile correct candidates and the reference; the agents "
    "see where the time goes")]

LOG_WIDTH = 120
EXIT_CANDIDATE_FAILED = 1
EXIT_USER_ERROR = 2


def user_errors(fn: F) -> F:
    """Print a PikeError as one line and exit 2, instead of a traceback."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except PikeError as err:
            err_console.print(f"[red]error:[/red] {escape(str(err))}", highlight=False,
                              soft_wrap=True)
            raise typer.Exit(EXIT_USER_ERROR) from None

    return wrapper  # type: ignore[return-value]


def _config(path: Path | None, device: str | None, construct_on: str | None = None) -> RunConfig:
    try:
        cfg = RunConfig.load(path)
    except (OSError, UnicodeDecodeError) as err:  # a folder, unreadable, not text
        raise ConfigError(f"{path}: cannot read config file ({err})") from None
    if device:
        cfg.eval.device = device
    if construct_on is not None:
        if construct_on not in CONSTRUCT_ON:
            raise PikeError(f"--construct-on {construct_on!r}: use {' or '.join(CONSTRUCT_ON)}")
        cfg.eval.construct_on = construct_on  # type: ignore[assignment]
    return cfg


def _print_version(asked: bool) -> None:
    if asked:
        print(f"pike {package_version()}")
        raise typer.Exit()


def package_version() -> str:
    """The installed distribution's version (pyproject.toml's, once installed)."""
    try:
        return version("pike-torch")
    except PackageNotFoundError:  # imported from a source tree that was never installed
        return "unknown (not installed)"


@app.callback()
def main(
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="log what pike does, with "
                                          "the source location of each message")] = False,
    _version: Annotated[bool, typer.Option("--version", callback=_print_version,
                                           is_eager=True, help="print pike's version")]
    = False,
) -> None:
    # Source locations help whoever debugs pike; a user's output goes without them.
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING,
                        format="%(levelname)s %(name)s (%(filename)s:%(lineno)d): %(message)s"
                        if verbose else "%(levelname)s: %(message)s")
    # SIGTERM (`timeout`, `kill`, a scheduler) ends pike as Ctrl-C does: children killed,
    # temp dirs removed, the store left consistent, one line said.
    signal.signal(signal.SIGTERM, _terminate_as_interrupt)
    for out in (console, err_console):
        if not out.is_terminal and "COLUMNS" not in os.environ:
            # a log or a pipe has no width: tables get room instead of 80 columns
            out.width = LOG_WIDTH
    sweep_orphaned_dirs()


def _say_how_to_go_on(go_on: str, run_dir: Path | None) -> None:
    """The line a Ctrl-C or SIGTERM leaves: what was kept, and the command that goes on
    (none where the run's store was not made yet: there is nothing to go on with)."""
    if run_dir is not None and not (run_dir / STORE_FILE).exists():
        err_console.print("interrupted before the run store was made: nothing was recorded")
        return
    err_console.print(f"interrupted: everything judged so far is in the run store; continue "
                      f"with [bold]{escape(go_on)}[/bold]", soft_wrap=True)


@contextlib.contextmanager
def _resumable(go_on: str, run_dir: Path | None) -> Iterator[None]:
    """A Ctrl-C or SIGTERM in the block says how to go on, then ends pike at once (130);
    so does its output closed under it (1, rich's exit then; said where stderr is open).

    Worker threads (an audit's or a campaign's tasks, a pool's candidates) may be
    mid-evaluation, and Python's exit would wait for each to finish its step: a
    max-autotune build, minutes. So nothing waits for them: the store is already durable,
    their children are ended and this process's temp folders removed, and pike exits."""
    try:
        yield
    except (KeyboardInterrupt, SystemExit) as stop:
        # rich turns a write to a closed pipe into SystemExit(1), its console marked quiet
        # first: output nobody reads any more (`| head` has ended) stops the run as well.
        closed = isinstance(stop, SystemExit) and (console.quiet or err_console.quiet)
        if isinstance(stop, SystemExit) and not closed:
            raise
        # A second Ctrl-C (an impatient user, a driver's own SIGINT) or a closed pipe must
        # not cut this short: the exit that follows would wait on the worker threads.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        try:
            with contextlib.suppress(OSError, SystemExit):
                _say_how_to_go_on(go_on, run_dir)
            logging.disable(logging.CRITICAL)  # what the killed children's ends say is no news
            end_children_and_remove_own_dirs()
            with contextlib.suppress(OSError):
                sys.stdout.flush()
                sys.stderr.flush()
        finally:
            os._exit(1 if closed else 130)


def _terminate_as_interrupt(signum: int, frame: object) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a second TERM ends pike at once
    raise KeyboardInterrupt


@command("eval")
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
    cfg = _config(config, device, construct_on)
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


@command("optimize")
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
    cfg = search_config(_config(config, device, flags.construct_on), flags)
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
    with (_resumable(go_on, resume or out),
          SearchProgress(err_console, name, StatusFields.for_run(run_cfg)) as progress):
        result = optimize(the_task, cfg, out=out, resume=resume, replay=replay,
                          command="pike " + " ".join(sys.argv[1:]),
                          placement=placement_given(cfg, flags), on_event=progress)
    _print_result(result)


# pike bench --stop-after: unfinished, by request (sysexits' EX_TEMPFAIL: try again later)
STOPPED_AT_TIME_LIMIT = 75


@command("bench")
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
    cfg = search_config(_config(config, device, flags.construct_on), flags)
    ids = _ids(tasks)
    task_list = load_tasks(folder, ids) if folder else []
    names = [t.name for t in task_list]
    run_cfg, stored = as_run_will(cfg, flags, resume)
    check_run(run_cfg, out=None if resume else out, tasks=task_list)
    if resume is None and folder is not None:  # named here: an interrupted run says where
        out = out or new_run_dir(cfg.runs_dir, f"bench-{Path(folder).name}")
    with (_resumable(f"pike bench --resume {resume or out or 'RUN_DIR'}", resume or out),
          BenchProgress(err_console, names or stored, StatusFields.for_run(run_cfg)) as progress):
        result = bench(folder, cfg, ids=ids, out=out, resume=resume, jobs=jobs,
                       command="pike " + " ".join(sys.argv[1:]),
                       placement=placement_given(cfg, flags), redo=_ids(redo),
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


@command("show")
@user_errors
def show_command(
    run_dir: Annotated[Path, typer.Argument(metavar="RUN_DIR",
                                            help="a run dir of pike optimize or pike bench")],
    watch: Annotated[bool, typer.Option("--watch", help="redraw every few seconds until "
                                        "Ctrl-C")] = False,
    interval: Annotated[float, typer.Option(min=0.5, help="seconds between redraws")] = 2.0,
) -> None:
    """Budget spent, best speedup per task and the latest verdicts of a run (live with --watch)."""
    import time

    from rich.live import Live

    from pike.report.terminal import run_tables
    from pike.store import RunStore

    def snapshot() -> Any:
        with RunStore.open(run_dir) as store:
            return run_tables(store)

    if not watch:
        console.print(snapshot())
        return
    try:
        if not console.is_terminal:
            _watch_as_lines(snapshot, interval)
        with Live(snapshot(), console=console, refresh_per_second=1) as live:
            while True:
                time.sleep(interval)
                live.update(snapshot())
    except KeyboardInterrupt:
        return


def _watch_as_lines(snapshot: Callable[[], Any], interval: float) -> None:
    """`pike show --watch` into a log or a pipe, where a redrawn screen would pile up: the
    tables again, under the time, each time they change (until Ctrl-C or SIGTERM)."""
    import time

    shown = ""
    while True:
        with console.capture() as captured:
            console.print(snapshot())
        text = captured.get()
        if text != shown:
            console.print(time.strftime("%H:%M:%S"), highlight=False)
            console.out(text, end="", highlight=False)
            shown = text
        time.sleep(interval)


@command("export")
@user_errors
def export_command(
    run_dir: Annotated[Path, typer.Argument(metavar="RUN_DIR", help="a run dir")],
    task: Annotated[str | None, typer.Argument(metavar="TASK",
                                               help="task name (optional for a one-task run)")]
    = None,
    out: Annotated[Path, typer.Option(help="where to write the module")] = Path("best.py"),
    set_dir: Annotated[Path | None, typer.Option(
        "--set", help="write every task's best as a solution set (files + manifest.json) "
        "to this folder instead")] = None,
) -> None:
    """Write a task's best correct solution as a standalone module with its verdict on top,
    or (--set DIR) the whole run as a solution set that `pike audit` and --seed-from read."""
    from pike.report.export import export_best
    from pike.store import RunStore

    with RunStore.open(run_dir) as store:
        if set_dir is not None:
            if task is not None:
                raise PikeError("--set writes every task of the run: give no TASK")
            from pike.solution_set import write_set

            path = write_set(store, set_dir)
        else:
            path = export_best(store, task, out)
    console.print(f"wrote {escape(str(path))}")


@command("audit")
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
    as_json: JsonOpt = False,
    config: ConfigOpt = None,
) -> None:
    """Judge every file of a solution set with the full guards, time it against eager and
    each torch.compile mode, and give aggregates that count failures as 1.0x.

    Cut off (Ctrl-C, a time limit), --resume RUN_DIR goes on where it stopped (--workers and
    --devices may change then); with it, --redo IDS audits tasks again and
    --fill-baselines those whose baselines failed. Audits of parts of a set made apart,
    --combine RUN_DIR (once per run) gathers into one result (--tasks: of those tasks
    only, as an audit of a sample of a folder was run)."""
    from pike.audit import audit, resume_audit, to_markdown
    from pike.audit.matching import match
    from pike.audit.run import resumed_config
    from pike.report.progress import AUDIT_FIELDS, BenchProgress
    from pike.search.session import new_run_dir

    if combine:
        _combine_audits(solutions, tasks_folder, combine, out, as_json, _ids(tasks), given=[
            name for name, value in (("--device", device),
                                     ("--devices", devices), ("--workers", workers),
                                     ("--resume", resume), ("--stop-after", stop_after),
                                     ("--config", config), ("--construct-on", construct_on),
                                     ("--allow-changed-tasks", allow_changed_tasks or None),
                                     ("--redo", redo), ("--fill-baselines",
                                                        fill_baselines or None))
            if value is not None])
        return
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
        with (_resumable(f"pike audit --resume {resume}", resume),
              BenchProgress(err_console, _stored_task_names(resume), AUDIT_FIELDS) as progress):
            result = resume_audit(resume, workers=workers, devices=gpus, stop_after=stop_after,
                                  on_event=progress, redo=_ids(redo),
                                  fill_baselines=fill_baselines)
        _print_audit(result, as_json, to_markdown)
        return
    if solutions is None or tasks_folder is None:
        raise ConfigError("give SOLUTIONS and TASKS (or --resume RUN_DIR)")
    cfg = _config(config, device, construct_on)
    if workers is not None:
        cfg.eval.workers = workers
    if devices is not None:
        cfg.eval.devices = split_devices(devices)
    ids = _ids(tasks)
    task_list = load_tasks(tasks_folder, ids)
    names = [t.name for t in task_list]
    match(solutions, task_list)  # a missing folder or a bad mapping fails here, before work
    run_dir = out or new_run_dir(cfg.runs_dir, f"audit-{solutions.resolve().name}")
    check_devices(cfg.eval)
    check_new_run_dir(run_dir)
    with (_resumable(f"pike audit --resume {run_dir}", run_dir),
          BenchProgress(err_console, names, AUDIT_FIELDS) as progress):
        result = audit(solutions, tasks_folder, cfg, out=run_dir, ids=ids,
                       command="pike " + " ".join(sys.argv[1:]),
                       allow_changed_tasks=allow_changed_tasks, stop_after=stop_after,
                       on_event=progress)
    _print_audit(result, as_json, to_markdown)


def _combine_audits(solutions: Path | None, tasks_folder: Path | None, runs: list[Path],
                    out: Path | None, as_json: bool, ids: list[int] | None,
                    given: list[str]) -> None:
    from pike.audit import to_markdown
    from pike.audit.combine import combine

    if given:
        raise ConfigError(f"--combine measures nothing, it gathers what the runs judged: drop "
                          f"{', '.join(given)}")
    if solutions is None or tasks_folder is None or out is None:
        raise ConfigError("--combine needs SOLUTIONS, TASKS and --out (where the result goes)")
    result = combine(solutions, tasks_folder, runs, out=out, ids=ids)
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


@command("report")
@user_errors
def report_command(
    run_dirs: Annotated[list[Path], typer.Argument(metavar="RUN_DIR",
                                                   help="run dirs to compare side by side")],
    out: Annotated[Path, typer.Option(help="folder for the figures and index.html")]
    = Path("pike-report"),
) -> None:
    """Figures and one HTML page from run stores alone (nothing is re-run)."""
    from pike.report.build import write_report
    from pike.report.data import load_runs
    from pike.report.terminal import not_run_lines, report_summary

    runs = load_runs(run_dirs)
    page = write_report(runs, out)
    console.print(report_summary(runs))
    for line in not_run_lines(runs):
        console.print(escape(line), highlight=False, soft_wrap=True)
    console.print(f"wrote {escape(str(page))}", highlight=False, soft_wrap=True)


def _ids(tasks: str | None) -> list[int] | None:
    if not tasks:
        return None
    try:
        return [int(i) for i in tasks.split(",") if i.strip()]
    except ValueError:
        raise TaskError(f"--tasks {tasks!r}: give numeric task ids, like 1,4,9") from None


def _print_result(result: Any) -> None:
    console.print(result_table(result))


@command("baseline")
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
    cfg = _config(config, device, construct_on)
    mode_list = [m.strip() for m in modes.split(",") if m.strip()]
    unknown = [m for m in mode_list if m != "eager" and not m.startswith("compile:")]
    if unknown:
        raise PikeError(f"unknown mode {unknown[0]!r}; use eager or compile:<torch.compile mode>")
    if not mode_list:
        raise PikeError("no mode given; use eager or compile:<torch.compile mode>")
    if Path(task).is_dir():
        task_list = load_tasks(task, _ids(tasks))
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


def run() -> None:  # pragma: no cover - console entry for `python -m pike`
    app(prog_name="pike")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(run())
