"""What a timed probe call costs against the rotation's other calls: the figures the reuse
check compares (the fastest probe against the 90th percentile of the other calls).

    python bench/probe_cost.py [--runs 4] [--tag cpu] [TASK FILE]

Judges FILE (default: tests/audit_set/mixed/task_1.py, an honest file) on TASK (default:
tests/audit_set/tasks/1_Scale.py, calls of about 0.01 ms on a CPU) --runs times with the
audit tests' fast CPU protocol, and records each verdict and the timed calls the reuse
check saw. Writes bench/results/probe-cost-TAG.json and .md with device, torch version,
date, command and the pike commit it ran.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
from pathlib import Path

import torch
from common import device_name, now, run_script, this_command

import pike
from pike.config import EvalConfig, LimitsConfig, TimingConfig
from pike.evaluate import check
from pike.evaluate.judge import evaluate
from pike.task import load_task

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("task", nargs="?", type=Path,
                   default=ROOT / "tests" / "audit_set" / "tasks" / "1_Scale.py")
    p.add_argument("file", nargs="?", type=Path,
                   default=ROOT / "tests" / "audit_set" / "mixed" / "task_1.py")
    p.add_argument("--runs", type=int, default=4)
    p.add_argument("--device", default="cpu")
    p.add_argument("--tag", default="cpu")
    args = p.parse_args()

    seen: list[dict] = []
    real = check.reused_answers_problem

    def recorded(samples: list[float], probes: list[float],
                 reference: list[float] | None = None) -> str | None:
        seen.append({"calls": len(samples), "median_ms": statistics.median(samples),
                     "p90_ms": statistics.quantiles(samples, n=10)[-1],
                     "probes_ms": sorted(probes)})
        return real(samples, probes, reference)

    check.reused_answers_problem = recorded  # the judge looks it up there
    cfg = EvalConfig(device=args.device, trials=2, timing=TimingConfig(
        warmup_calls=1, warmup_seconds=0.0, min_calls=5, min_seconds=0.02, rounds=2),
        limits=LimitsConfig(load_seconds=120, check_seconds=30, timing_seconds=60,
                            memory_gib=2))
    task, source = load_task(args.task), args.file.read_text()
    runs = []
    for i in range(args.runs):
        before = len(seen)
        verdict = evaluate(task, source, cfg)
        run = {"status": verdict.status, "message": verdict.message[:300],
               **(seen[before] if len(seen) > before else {})}
        runs.append(run)
        print(f"run {i + 1}: {run}", flush=True)
    commit = subprocess.run(["git", "-C", str(Path(pike.__file__).parent), "rev-parse",
                             "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    result = {"device": args.device, "device_name": device_name(args.device),
              "torch_version": torch.__version__, "date": now(), "command": this_command(),
              "pike": str(Path(pike.__file__).parent), "commit": commit,
              "task": str(args.task), "file": str(args.file), "runs": runs}
    stem = RESULTS / f"probe-cost-{args.tag}"
    stem.with_suffix(".json").write_text(json.dumps(result, indent=1) + "\n")
    lines = [f"# Probe calls against the other timed calls ({args.tag})", "",
             f"- device: {args.device} ({result['device_name']}), torch "
             f"{result['torch_version']}, date {result['date']}",
             f"- pike: `{result['pike']}` at {commit or 'unknown'}",
             f"- command: `{result['command']}`",
             f"- task `{args.task.name}`, file `{args.file.name}`", "",
             "| run | verdict | timed calls | median ms | p90 ms | probes ms |",
             "| --- | --- | --- | --- | --- | --- |"]
    for i, r in enumerate(runs, 1):
        probes = ", ".join(f"{x:.4f}" for x in r.get("probes_ms", []))
        lines.append(f"| {i} | {r['status']} | {r.get('calls', '')} | "
                     f"{r.get('median_ms', 0):.4f} | {r.get('p90_ms', 0):.4f} | {probes} |")
    stem.with_suffix(".md").write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    run_script(main)
