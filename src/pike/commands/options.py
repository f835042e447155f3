"""The options several `pike` commands share, and how they make the RunConfig and the task
ids a command runs with."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from pike.config import CONSTRUCT_ON, RunConfig
from pike.errors import ConfigError, PikeError, TaskError

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


def run_config(path: Path | None, device: str | None,
               construct_on: str | None = None) -> RunConfig:
    """The --config file's RunConfig, with --device and --construct-on applied."""
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


def task_ids(tasks: str | None) -> list[int] | None:
    """--tasks 1,4,9 as ids; None (every task) where none are given."""
    if not tasks:
        return None
    try:
        return [int(i) for i in tasks.split(",") if i.strip()]
    except ValueError:
        raise TaskError(f"--tasks {tasks!r}: give numeric task ids, like 1,4,9") from None
