"""What sharing the reference's builds with the candidates saves: for each task file
given, its baseline (eager and one compile mode) is measured in a fresh build cache, then
the offline strategy's candidate of that mode is judged (checks only, no timing), once
with the reference's builds copied into the candidates' cache (pike's way) and once
without; the candidate's first call is where its build happens.

    python bench/shared_builds.py TASK.py [TASK.py ...] [--device cpu] [--mode compile:default]
        [--tag cpu]

Writes bench/results/shared-builds-TAG.md and .json (device, torch version, date, command).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from common import RESULTS, device_name, now, run_script, this_command, with_ext

from pike.agents.offline import render
from pike.config import EvalConfig
from pike.evaluate import evaluate
from pike.evaluate.baseline import measure_baselines
from pike.task import Task


def _judge(task: Task, device: str, mode: str, share: bool) -> dict[str, Any]:
    baseline_module = sys.modules["pike.evaluate.baseline"]
    shared = baseline_module.share_reference_builds
    with tempfile.TemporaryDirectory(prefix="pike-shared-builds-") as folder:
        cfg = EvalConfig(device=device, build_cache=Path(folder) / "build", time_candidate=False)
        if not share:
            baseline_module.share_reference_builds = lambda cfg, since=None: 0
        try:
            baseline = measure_baselines(task, cfg, modes=["eager", mode])
        finally:
            baseline_module.share_reference_builds = shared
        started = time.monotonic()
        verdict = evaluate(task, render(task.source, (mode,)), cfg)
        wall = time.monotonic() - started
    built = next(m for m in baseline.modes if m.mode == mode)
    return {"task": task.name, "shared": share, "status": verdict.status,
            "baseline_build_s": built.build_s, "candidate_wall_s": round(wall, 2),
            "load_build_warm_up_s": round(verdict.steps.get("load_build_warm_up", 0.0), 2),
            "first_call_s": round(verdict.steps.get("child.warm_up_call", 0.0), 2)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("tasks", nargs="+", type=Path)
    p.add_argument("--device", default="cpu")
    p.add_argument("--mode", default="compile:default")
    p.add_argument("--tag", default="cpu")
    args = p.parse_args()
    rows = [_judge(Task.from_file(path), args.device, args.mode, share)
            for path in args.tasks for share in (False, True)]
    data = {"device": device_name(args.device), "torch": torch.__version__, "date": now(),
            "command": this_command(), "mode": args.mode, "rows": rows}
    stem = RESULTS / f"shared-builds-{args.tag}"
    with_ext(stem, ".json").write_text(json.dumps(data, indent=2) + "\n")
    lines = [f"# The reference's builds shared with the candidates: {args.mode} ({args.tag})",
             "", f"- device: {data['device']}; torch {data['torch']}; {data['date']}",
             f"- command: `{data['command']}`",
             "- each row: a fresh build cache; the baseline (eager and the mode), then the "
             "offline candidate of the mode judged without timing; its first call is its build",
             "", "| task | builds shared | verdict | baseline's build (s) | candidate's "
             "first call (s) | its load, build and warm-up (s) | candidate wall (s) |",
             "|---|---|---|---|---|---|---|"]
    lines += [f"| {r['task']} | {'yes' if r['shared'] else 'no'} | {r['status']} | "
              f"{r['baseline_build_s']} | {r['first_call_s']} | {r['load_build_warm_up_s']} | "
              f"{r['candidate_wall_s']} |" for r in rows]
    with_ext(stem, ".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    run_script(main)
