"""The search options `pike optimize` and `pike bench` share: the flags as given, the run
config they make over the config file, and the config a resumed or replayed run will use."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from pike.config import RunConfig
from pike.errors import PikeError
from pike.evaluate.pool import PLACEMENT


@dataclass
class SearchFlags:
    """The search options `optimize` and `bench` share, as given on the command line."""

    llm: str | None
    fixer_llm: str | None
    budget_queries: int | None
    budget_dollars: float | None
    backend: str | None
    strategy: str | None
    preset: str | None
    seed_offline: bool
    seed_from: Path | None
    fix_seeds: bool
    planner: bool
    plan_granularity: str | None
    profile_feedback: bool
    workers: int | None = None
    devices: str | None = None
    cluster: str | None = None
    ray_address: str | None = None
    construct_on: str | None = None


def runs_as_recorded(mode: str | None, flags: SearchFlags, **options: Any) -> None:
    """--resume and --replay run with the recorded config; a search option given with them
    would be silently ignored, so it is an error."""
    if mode is None:
        return
    given = [name for name, value in {**asdict(flags), **options}.items()
             if value not in (None, False) and name not in PLACEMENT]
    if given:
        names = ", ".join("--" + n.replace("_", "-") for n in given)
        raise PikeError(f"{mode} runs with the config the run was started with; drop {names}")


def placement_given(cfg: RunConfig, flags: SearchFlags) -> dict[str, Any] | None:
    """The pool options given on this command line, for a resumed or replayed run (which
    otherwise runs with its recorded config)."""
    given = {name for name in PLACEMENT if getattr(flags, name) is not None}
    if "ray_address" in given:
        given.add("cluster")  # joining a cluster means the Ray backend
    return {name: getattr(cfg.eval, name) for name in sorted(given)} or None


def as_run_will(cfg: RunConfig, flags: SearchFlags,
                recorded: Path | None) -> tuple[RunConfig, list[str]]:
    """The config a run will use, and the tasks it recorded: a resumed or replayed run
    keeps its recorded config, with this command line's placement over it."""
    if recorded is None:
        return cfg, []
    from pike.store import RunStore

    with RunStore.open(recorded) as store:
        kept = RunConfig.model_validate(store.config())
        names = [t["name"] for t in store.tasks()]
    given = placement_given(cfg, flags)
    if given:
        kept.eval = kept.eval.model_copy(update=given)
    return kept, names


def split_devices(devices: str) -> list[str]:
    """--devices cuda:0,cuda:1 as a list."""
    found = [d.strip() for d in devices.split(",") if d.strip()]
    if not found:
        raise PikeError(f"--devices {devices!r} names no device: give e.g. cuda:0,cuda:1")
    return found


def _pool_flags(cfg: RunConfig, flags: SearchFlags) -> None:
    """Where and how many evaluations run at once."""
    if flags.workers is not None:
        cfg.eval.workers = flags.workers
    if flags.devices is not None:
        cfg.eval.devices = split_devices(flags.devices)
    if flags.ray_address is not None:
        cfg.eval.ray_address = flags.ray_address
        cfg.eval.cluster = "ray"
    if flags.cluster is not None:
        if flags.cluster not in ("local", "ray"):
            raise PikeError(f"--cluster {flags.cluster!r}: use local or ray")
        if flags.cluster == "local" and flags.ray_address is not None:
            raise PikeError("--ray-address joins a Ray cluster: drop --cluster local")
        cfg.eval.cluster = flags.cluster  # type: ignore[assignment]
    if cfg.eval.cluster == "ray" and cfg.eval.devices:
        raise PikeError("--devices picks GPUs of this host; on Ray every GPU of the cluster "
                        "gets an actor: drop --devices")


def search_config(cfg: RunConfig, flags: SearchFlags) -> RunConfig:
    """The run config of `optimize` and `bench`: the flags over `cfg` (the file's)."""
    # the 'guided' preset stands for two flags: these three may change below
    preset, planner, profile_feedback = flags.preset, flags.planner, flags.profile_feedback
    if flags.llm is not None:
        cfg.llm.model = flags.llm
    if flags.fixer_llm is not None:
        cfg.llm.fixer = flags.fixer_llm
    if flags.seed_offline:
        cfg.search.seed_offline = True
    if flags.seed_from is not None:
        if not flags.seed_from.is_dir():
            raise PikeError(f"--seed-from {flags.seed_from}: not a folder of solution files")
        cfg.search.seed_from = flags.seed_from.resolve()
    if flags.fix_seeds:
        if cfg.search.seed_from is None:
            raise PikeError("--fix-seeds repairs the files of --seed-from SOLUTIONS: add it")
        cfg.search.fix_seeds = True
    if cfg.search.seed_from is not None and not cfg.llm.model:
        raise PikeError("--seed-from seeds an LLM search: add --llm SPEC")
    if flags.strategy is not None:
        if flags.strategy not in ("offline", "branching", "evolve"):
            raise PikeError(f"--strategy {flags.strategy!r}: use offline, branching or evolve")
        if flags.strategy == "offline" and cfg.llm.model:
            raise PikeError("--strategy offline uses no LLM: drop --llm")
        if flags.strategy != "offline":
            if not cfg.llm.model:
                raise PikeError(f"--strategy {flags.strategy} needs a model: add --llm SPEC")
            cfg.search.strategy = flags.strategy  # type: ignore[assignment]
    if preset == "guided":  # the profiler-grounded agents, on whichever strategy
        planner = profile_feedback = True
        preset = None
    if planner or profile_feedback:
        if not cfg.llm.model:
            raise PikeError("--planner and --profile-feedback guide LLM agents: add --llm SPEC")
        cfg.search.planner = cfg.search.planner or planner
        cfg.eval.profile = cfg.eval.profile or profile_feedback
    if flags.plan_granularity is not None:
        if not cfg.search.planner:
            raise PikeError("--plan-granularity shapes the planner's steps: add --planner")
        if flags.plan_granularity not in ("one", "several", "free"):
            raise PikeError(f"--plan-granularity {flags.plan_granularity!r}: use one, several "
                            "or free")
        cfg.search.plan_granularity = flags.plan_granularity  # type: ignore[assignment]
    if preset is not None:
        from pike.search.presets import preset as evolve_preset

        if not cfg.llm.model:
            raise PikeError("--preset sets up the evolve strategy, which needs --llm SPEC")
        cfg.search.strategy = "evolve"
        cfg.search.evolve = evolve_preset(preset, cfg.search.evolve)
    _pool_flags(cfg, flags)
    if flags.budget_queries is not None:
        cfg.search.budget_queries = flags.budget_queries
    if flags.budget_dollars is not None:
        cfg.search.budget_dollars = flags.budget_dollars
    if flags.backend is not None:
        if flags.backend not in ("any", "cuda", "triton"):
            raise PikeError(f"--backend {flags.backend!r}: use any, cuda or triton")
        cfg.search.backend = flags.backend  # type: ignore[assignment]
    return cfg
