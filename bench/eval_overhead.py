"""What one evaluation costs, step by step, against the work it does.

    python bench/eval_overhead.py TASK_FILE... [--device cuda] [--pool 4] [--cli]
        [--tag h100-before] [--out bench/results]

For each task the candidate is the task's own module (`ModelNew = Model`): nothing to
build, so every second above the forward passes is the evaluator's. Each task is judged

- `cold`: alone, with no live reference (the reference is drawn, run and kept first);
- `warm`: alone again, the reference kept from `cold` (what every later candidate of a
  search paid before spare children);
- `spare`: warm, with a spare child (launched while the previous candidate was judged, as
  in a search's pool, then given a few seconds) taking the candidate;
- `pool`: `--pool` copies at once through the evaluation pool (wall time of the batch);
- `cli` (with --cli): `pike eval TASK CAND --json` in a new process, as a user runs it.

Every row holds the wall time, the verdict's phases and its steps (verdict.steps: the
parent's, the candidate child's `child.*` and, where the evaluation started the reference,
its child's `reference.*`), and `unaccounted`: wall time no step covers. Results go to
bench/results/eval-overhead-<tag>.json and .md, with device, torch version, date, command.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
from common import RESULTS, device_name, now, run_script, this_command, with_ext

from pike.config import EvalConfig
from pike.evaluate import evaluate, spares
from pike.evaluate.pool import LocalPool
from pike.evaluate.reference_cache import close_references
from pike.evaluate.verdict import Verdict
from pike.task import Task

# The parent's top-level steps: they do not overlap, so their sum against the wall time
# shows what no step covers. (Child and reference steps happen inside them.)
TOP_STEPS = ("launch_child", "reference", "wait_to_list", "wait_for_device", "start_child",
             "load_build_warm_up", "trials",
             "compare", "timing", "calibrate_timing_loop", "final_check", "stop_child", "floor", "remove_files")


def identity_candidate(task: Task) -> str:
    return task.source + "\n\nModelNew = Model\n"


def input_megabytes(task: Task) -> float:
    """The size of one call's inputs, as get_inputs() draws them (on the CPU)."""
    namespace: dict = {"__name__": "pike_bench_task"}
    exec(compile(task.source, str(task.path), "exec"), namespace)
    inputs = namespace["get_inputs"]()
    return sum(x.numel() * x.element_size() for x in inputs if isinstance(x, torch.Tensor)) / 2**20


# What a search's pool leaves between two candidates at least (an LLM call, the next
# candidate's own steps); on a GPU the spare starts with the last candidate, long before.
SPARE_HEAD_START_S = 3.0


def row(mode: str, verdict: Verdict, wall: float) -> dict:
    steps = dict(verdict.steps)
    covered = sum(steps.get(name, 0.0) for name in TOP_STEPS)
    return {"mode": mode, "status": verdict.status, "message": verdict.message[:200],
            "wall_s": round(wall, 2),
            "phases": {k: round(v, 2) for k, v in verdict.phase_seconds.items()},
            "steps": {k: round(v, 3) for k, v in steps.items()},
            "unaccounted_s": round(max(0.0, verdict.phase_seconds.get("total", wall) - covered), 2),
            "median_ms": verdict.runtime.median_ms if verdict.runtime else None,
            "reference_ms": verdict.reference.median_ms if verdict.reference else None}


def cli_row(task: Task, source: str, device: str) -> dict:
    with tempfile.TemporaryDirectory(prefix="pike-bench-") as folder:
        cand = Path(folder) / "candidate.py"
        cand.write_text(source)
        started = time.monotonic()
        done = subprocess.run([sys.executable, "-m", "pike", "eval", str(task.path), str(cand),
                               "--json", "--device", device], capture_output=True, text=True)
        wall = time.monotonic() - started
    try:
        verdict = Verdict.model_validate(json.loads(done.stdout))
    except ValueError:
        return {"mode": "cli", "status": f"exit {done.returncode}", "wall_s": round(wall, 2),
                "message": done.stderr[-300:], "phases": {}, "steps": {}}
    return row("cli", verdict, wall)


def bench_task(task: Task, cfg: EvalConfig, pool_size: int, cli: bool, result: dict,
               save: Callable[[], None]) -> None:
    """Judge `task` in each mode, adding a row to `result` and saving after each."""
    source = identity_candidate(task)
    close_references()  # cold means cold: no reference kept from an earlier task
    for mode in ("cold", "warm", "spare"):
        if mode == "spare":  # as in a search: the child was launched during the last one
            spares.want(1)
            evaluate(task, source, cfg)  # launches the spare (on the CPU: as it ends)
            time.sleep(SPARE_HEAD_START_S)
        started = time.monotonic()
        verdict = evaluate(task, source, cfg)
        result["rows"].append(row(mode, verdict, time.monotonic() - started))
        save()
        print(f"{task.name} {mode}: {result['rows'][-1]['wall_s']} s, {verdict.status}",
              flush=True)
    spares.want(-1)
    if pool_size > 1:
        pool = LocalPool(cfg.model_copy(update={"workers": pool_size}))
        started = time.monotonic()
        verdicts = [v for _, v in pool.judge_many(task, [source] * pool_size)]
        wall = time.monotonic() - started
        pool.close()
        rows = [row(f"pool {pool_size}", v, wall) for v in verdicts]
        result["rows"].append({**rows[0], "pool_walls": [r["phases"].get("total") for r in rows],
                               "pool_statuses": [r["status"] for r in rows]})
        save()
        print(f"{task.name} pool {pool_size}: {round(wall, 2)} s", flush=True)
    close_references()
    if cli:
        result["rows"].append(cli_row(task, source, cfg.device or "cpu"))
        save()
        print(f"{task.name} cli: {result['rows'][-1]['wall_s']} s", flush=True)


def _cell(value: float | None) -> str:
    return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:g}"


def markdown(data: dict) -> str:
    lines = [f"# Evaluation overhead ({data['device_name']})", "",
             f"- device: {data['device']}, torch {data['torch_version']}, host {data['host']}",
             f"- date: {data['date']}", f"- command: `{data['command']}`",
             "- candidate: the task's own module (`ModelNew = Model`); wall = the call's "
             "wall time (for `pool N`: the batch's); unaccounted = total minus the parent's "
             "top-level steps", ""]
    def order(step: str) -> tuple[int, int, str]:
        group = 0 if "." not in step else 1 if step.startswith("child.") else 2
        return group, TOP_STEPS.index(step) if step in TOP_STEPS else len(TOP_STEPS), step

    steps = sorted({s for t in data["tasks"] for r in t["rows"] for s in r["steps"]}, key=order)
    for t in data["tasks"]:
        lines += [f"## {t['task']} (inputs {t['input_mb']} MB per call)", "",
                  "| step | " + " | ".join(r["mode"] for r in t["rows"]) + " |",
                  "|---|" + "---|" * len(t["rows"])]
        lines.append("| **wall** | " + " | ".join(f"**{r['wall_s']}**" for r in t["rows"]) + " |")
        lines.append("| status | " + " | ".join(r["status"] for r in t["rows"]) + " |")
        for phase in ("setup", "load", "init", "check", "queued", "timing", "total"):
            lines.append(f"| phase {phase} | " + " | ".join(
                _cell(r["phases"].get(phase)) for r in t["rows"]) + " |")
        for step in steps:
            if any(step in r["steps"] for r in t["rows"]):
                lines.append(f"| {step} | " + " | ".join(
                    _cell(r["steps"].get(step)) for r in t["rows"]) + " |")
        lines.append("| unaccounted | " + " | ".join(
            _cell(r.get("unaccounted_s")) for r in t["rows"]) + " |")
        lines.append("")
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("tasks", nargs="+", type=Path)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--pool", type=int, default=4, help="copies judged at once (1: no pool row)")
    p.add_argument("--cli", action="store_true", help="also time `pike eval` as a new process")
    p.add_argument("--tag", default=None)
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args()
    args.tag = args.tag or ("cuda" if args.device.startswith("cuda") else "cpu")
    cfg = EvalConfig(device=args.device)
    data = {"device": args.device, "device_name": device_name(args.device),
            "torch_version": torch.__version__, "host": platform.node(), "date": now(),
            "command": this_command(), "tasks": []}
    stem = args.out / f"eval-overhead-{args.tag}"
    args.out.mkdir(parents=True, exist_ok=True)

    def save() -> None:
        with_ext(stem, ".json").write_text(json.dumps(data, indent=2))
        with_ext(stem, ".md").write_text(markdown(data))

    for path in args.tasks:
        task = Task.from_file(path)
        data["tasks"].append({"task": task.name, "input_mb": round(input_megabytes(task), 1),
                              "rows": []})
        bench_task(task, cfg, args.pool, args.cli, data["tasks"][-1], save)
    print(markdown(data), flush=True)
    return 0


if __name__ == "__main__":
    run_script(main)
