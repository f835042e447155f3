"""What a benchmark's baseline phase costs, with and without pre-built autotuning modes.

    python bench/baseline_phase.py TASK_FOLDER --ids 9,12,17,23 [--jobs 4]
        [--settings off,on] [--device cuda] [--modes ...] [--tag h200] [--out bench/results]

`pike bench` measures every task's baselines (eager and each torch.compile mode) before
any search, `--jobs` tasks at once. A max-autotune build holds the device alone, stopping
every other evaluation, because it measures kernels; `eval.prebuild_autotune` compiles it
once beside the others first, so that its build alone mostly measures. For each setting
of `--settings` (off, on) this script measures the same tasks' baselines that way, in a
fresh build cache of its own (so neither setting finds the other's kernels), and writes:
the phase's wall time, each task's wall time, each mode's build seconds and the part of it
with the device held alone, and each mode's median, beside the other setting's (the
honesty check: a pre-build must not leave the mode's own build slower kernels). Results
are rewritten after every setting under bench/results/baseline-phase-<tag>.json and .md,
with device, torch version, date and command.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch
from common import (
    RESULTS,
    alone_seconds,
    apply_modes,
    device_name,
    notes_section,
    now,
    run_script,
    task_ids,
    this_command,
    with_ext,
)

from pike.config import RunConfig, autotunes
from pike.evaluate import measure_baselines
from pike.evaluate.device_slots import DeviceSlots
from pike.evaluate.leftovers import end_children_and_remove_own_dirs, make_temp_dir, remove_tree
from pike.task import Task, load_tasks
from pike.threads import run_each


def measure_phase(tasks: list[Task], cfg: RunConfig, jobs: int) -> dict[str, Any]:
    """Every task's baselines, `jobs` at once, as `pike bench` measures them."""
    slots = DeviceSlots(cfg, jobs)

    def one(task: Task) -> dict[str, Any]:
        started = time.perf_counter()
        with slots.take() as on_gpu:
            try:
                baseline = measure_baselines(task, on_gpu, cfg.search.baseline_modes)
            except Exception as err:  # a task whose reference fails is a row, not the end
                return {"task": task.name, "error": str(err).splitlines()[0][:200],
                        "wall_s": round(time.perf_counter() - started, 1), "modes": []}
        modes = [{"mode": m.mode, "build_s": m.build_s, "prebuild_s": m.prebuild_s,
                  "median_ms": m.stats.median_ms if m.stats else None, "error": m.error}
                 for m in baseline.modes]
        return {"task": task.name, "wall_s": round(time.perf_counter() - started, 1),
                "modes": modes}

    started = time.perf_counter()
    finished = {row["task"]: row for row in run_each(one, tasks, slots.at_once,
                                                      "baseline-phase")}
    return {"wall_s": round(time.perf_counter() - started, 1),
            "tasks": [finished[t.name] for t in tasks]}


def render(data: dict[str, Any]) -> str:
    lines = [f"# Baseline phase, pre-built autotuning modes ({data['device_name']})", "",
             f"- device: {data['device']}, torch {data['torch_version']}",
             f"- date: {data['date']}", f"- command: `{data['command']}`",
             f"- {len(data['task_names'])} tasks, {data['jobs']} at once; modes: "
             f"{', '.join(data['modes'])}; each setting in a fresh build cache", "",
             "| setting | phase wall (s) | autotuning builds, device alone (s) | their "
             "pre-builds (s) | errors |", "|---|---|---|---|---|"]
    for setting, run in data["settings"].items():
        modes = [m for t in run["tasks"] for m in t["modes"]]
        alone = sum(alone_seconds(m) for m in modes)
        pre = sum(m["prebuild_s"] or 0.0 for m in modes)
        errors = sum(1 for m in modes if m["error"]) + sum(1 for t in run["tasks"]
                                                            if t.get("error"))
        lines.append(f"| {setting} | {run['wall_s']:.1f} | {alone:.1f} | {pre:.1f} | "
                     f"{errors} |")
    lines += ["", "## Per task and mode (build s, of it device alone; median ms)", ""]
    settings = list(data["settings"])
    lines += ["| task | mode | " + " | ".join(settings) + " |",
              "|---|---|" + "---|" * len(settings)]
    for name in data["task_names"]:
        for mode in data["modes"]:
            cells = []
            for setting in settings:
                row = next((t for t in data["settings"][setting]["tasks"]
                            if t["task"] == name), None)
                found = next((m for m in (row or {}).get("modes", []) if m["mode"] == mode),
                             None)
                cells.append(_cell(found, row))
            lines.append(f"| {name} | {mode} | " + " | ".join(cells) + " |")
    return "\n".join(lines + notes_section(data)) + "\n"


def _cell(mode: dict[str, Any] | None, row: dict[str, Any] | None) -> str:
    if mode is None:
        return (row or {}).get("error", "-")[:60] or "-"
    if mode["error"]:
        return f"error: {mode['error'][:50]}"
    build = f"{mode['build_s']:.1f}" if mode["build_s"] is not None else "-"
    alone = f" ({alone_seconds(mode):.1f})" if autotunes(mode["mode"]) else ""
    median = f"{mode['median_ms']:.3f} ms" if mode["median_ms"] is not None else "-"
    return f"{build}{alone}; {median}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("folder", type=Path)
    p.add_argument("--ids", help="only these task ids, e.g. 9,12,17")
    p.add_argument("--jobs", type=int, default=4, help="tasks' baselines at once")
    p.add_argument("--settings", default="off,on",
                   help="eval.prebuild_autotune values to measure, in this order")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--modes", default=None, help="torch.compile modes (comma list; "
                   "default: every mode)")
    p.add_argument("--tag", default=None)
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args()
    tasks = load_tasks(args.folder, task_ids(args))
    cfg = RunConfig()
    cfg.eval.device = args.device
    apply_modes(args, cfg)
    stem = args.out / ("baseline-phase" + (f"-{args.tag}" if args.tag else ""))
    data: dict[str, Any] = {
        "benchmark": "baseline_phase", "device": args.device,
        "device_name": device_name(args.device), "torch_version": torch.__version__,
        "date": now(), "command": this_command(), "jobs": args.jobs,
        "task_names": [t.name for t in tasks], "modes": cfg.search.baseline_modes,
        "settings": {}}
    args.out.mkdir(parents=True, exist_ok=True)
    for setting in [s.strip() for s in args.settings.split(",") if s.strip()]:
        cache = make_temp_dir("cache")
        try:
            run_cfg = cfg.model_copy(deep=True)
            run_cfg.eval.prebuild_autotune = setting  # type: ignore[assignment]
            # the reference's cache sits beside the build cache: both inside the temp dir
            run_cfg.eval.build_cache = cache / "build"
            print(f"setting {setting}: {len(tasks)} tasks, {args.jobs} at once", flush=True)
            data["settings"][setting] = measure_phase(tasks, run_cfg, args.jobs)
        except KeyboardInterrupt:
            # The worker threads may be mid-build: nothing waits for them. Their children
            # end, this process's temp folders (the caches too) go, and the script exits.
            end_children_and_remove_own_dirs()
            print("interrupted: the settings measured before are in the results files",
                  file=sys.stderr, flush=True)
            os._exit(130)
        remove_tree(cache)
        data["date"] = now()
        with_ext(stem, ".json").write_text(json.dumps(data, indent=1))
        with_ext(stem, ".md").write_text(render(data))
        print(f"setting {setting}: phase {data['settings'][setting]['wall_s']:.1f} s",
              flush=True)


if __name__ == "__main__":
    run_script(main)
