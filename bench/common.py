"""What the folder benchmarks share: their command-line options and the run config."""

from __future__ import annotations

import argparse
import datetime as dt
import math
import platform
import sys
from collections.abc import Callable
from pathlib import Path

import torch

from pike.config import CONSTRUCT_ON, RunConfig, autotunes

RESULTS = Path(__file__).resolve().parent / "results"


def folder_arguments(p: argparse.ArgumentParser, max_candidates: int,
                     max_seconds: float) -> None:
    """TASK_FOLDER, --ids, --device, the offline search's budget, --tag, --resume, --out."""
    p.add_argument("folder", type=Path)
    p.add_argument("--ids", help="only these task ids, e.g. 1,4,9")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--max-candidates", type=int, default=max_candidates)
    p.add_argument("--max-seconds", type=float, default=max_seconds)
    p.add_argument("--workers", type=int, default=1,
                   help="candidates of a task evaluated at once (the evaluation pool)")
    p.add_argument("--compile-threads", type=int, default=1,
                   help="torch.compile's workers in each evaluation child (eval.compile_threads)")
    p.add_argument("--construct-on", choices=CONSTRUCT_ON, default="cpu",
                   help="where models are built (eval.construct_on): 'device' for tasks "
                        "written to be built on the GPU, such as level5's")
    p.add_argument("--tag", default=None)
    p.add_argument("--resume", action="store_true", help="keep finished tasks of the results")
    p.add_argument("--out", type=Path, default=RESULTS)


def run_config(args: argparse.Namespace) -> RunConfig:
    cfg = RunConfig()
    cfg.eval.device = args.device
    cfg.eval.workers = args.workers
    cfg.eval.compile_threads = args.compile_threads
    cfg.eval.construct_on = args.construct_on
    cfg.search.offline.max_candidates = args.max_candidates
    cfg.search.offline.max_seconds = args.max_seconds
    return cfg


def modes_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument("--modes", default=None,
                   help="torch.compile modes to time as baselines (comma list, 'none' for "
                        "eager only; default: every mode)")


def apply_modes(args: argparse.Namespace, cfg: RunConfig) -> None:
    """--modes as the config's baselines: eager, then each compile mode named."""
    if args.modes is not None:
        modes = [] if args.modes == "none" else [m.strip() for m in args.modes.split(",")]
        cfg.search.baseline_modes = ["eager", *(f"compile:{m}" for m in modes)]


def task_ids(args: argparse.Namespace) -> list[int] | None:
    return [int(i) for i in args.ids.split(",")] if args.ids else None


def device_name(device: str) -> str:
    """The GPU's name for cuda devices, else the host's processor."""
    if device.startswith("cuda"):
        return torch.cuda.get_device_name(torch.device(device))
    return platform.processor() or "cpu"


def now() -> str:
    """The time a result is written, in UTC, to the second."""
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


def this_command() -> str:
    """The command line that wrote a result, as results files quote it."""
    return "python " + " ".join(sys.argv)


def with_ext(stem: Path, ext: str) -> Path:
    """`stem` with `ext` appended: Path.with_suffix would cut a tag with a dot ("share-0.1")
    at its last dot, and two runs' results would overwrite each other."""
    return stem.with_name(stem.name + ext)


def notes_section(data: dict) -> list[str]:
    """A results file's hand-written notes (its JSON's "notes", kept across --resume) as
    the closing lines of its markdown: a blank line, then one bullet each."""
    notes = data.get("notes") or []
    return ["", *(f"- Note: {n}" for n in notes)] if notes else []


def alone_seconds(mode: dict) -> float:
    """The part of a stored baseline mode's build that held the device alone: an
    autotuning mode's build less its pre-build (made beside other work); none for the
    other modes, built beside other work."""
    build = mode.get("build_s")
    if not autotunes(mode["mode"]) or build is None:
        return 0.0
    return build - (mode.get("prebuild_s") or 0.0)


def geomean(values: list[float | None]) -> float | None:
    kept = [v for v in values if v and v > 0 and math.isfinite(v)]
    return math.exp(sum(map(math.log, kept)) / len(kept)) if kept else None


def run_script(main: Callable[[], int | None]) -> None:
    """Run a benchmark's main; an interrupt (Ctrl-C, `timeout -s INT`) ends it with one line
    instead of a traceback: each script saves its results as it goes, and --resume (where
    the script has it) goes on from there."""
    try:
        code = main()
    except KeyboardInterrupt:
        stop_children()
        print("interrupted: what finished is saved in the results files; --resume (where "
              "the script has it) runs the rest", file=sys.stderr, flush=True)
        code = 130
    sys.exit(code or 0)


def stop_children() -> None:
    """Kill every process this one started (worker pools, evaluation children): on an
    interrupt a pool would otherwise wait for its running tasks before the script ends."""
    import psutil

    for child in psutil.Process().children(recursive=True):
        try:
            if "resource_tracker" not in " ".join(child.cmdline()):  # it ends by itself
                child.kill()
        except psutil.Error:
            pass
