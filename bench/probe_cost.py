"""What a timed probe call costs against the rotation's other calls: the figures the reuse
check compares (check.slow_probes: the fastest probe against the median call, the
window's steadiness by the reference's quartiles and the candidate's 90th percentile).

    python bench/probe_cost.py [--runs 4] [--tag cpu] [--load N] [--note TEXT] [TASK FILE]

Judges FILE (default: tests/audit_set/mixed/task_1.py, an honest file) on TASK (default:
tests/audit_set/tasks/1_Scale.py, calls of about 0.01 ms on a CPU) --runs times with the
audit tests' fast CPU protocol, and records each verdict and the timed calls the reuse
check saw; `--load N` runs N busy processes beside the runs, as a CI run loads the
host. Writes bench/results/probe-cost-TAG.json and .md with device, torch version,
date, command and the pike commit it ran.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

import torch
from common import device_name, now, run_script, this_command

import pike
from pike.config import EvalConfig, LimitsConfig, TimingConfig
from pike.evaluate import check
from pike.evaluate.judge import evaluate
from pike.task import Task, load_task

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
    p.add_argument("--load", type=int, default=0,
                   help="busy processes beside the runs, as a CI run's tests load a host")
    p.add_argument("--note", default="", help="a line for the page (what else ran, say)")
    p.add_argument("--min-seconds", type=float, default=0.02,
                   help="timing.min_seconds (the tests' fast protocol has 0.05)")
    args = p.parse_args()

    seen: list[dict] = []
    real = check.slow_probes

    def recorded(samples: list[float], probes: list[float],
                 reference: list[float] | None = None) -> check.SlowProbes | None:
        spread = (statistics.quantiles(reference, n=4)[-1] / statistics.median(reference)
                  if reference and len(reference) >= 4 else None)
        seen.append({"calls": len(samples), "median_ms": statistics.median(samples),
                     "p90_ms": statistics.quantiles(samples, n=10)[-1],
                     "probes_ms": sorted(probes), "reference_spread": spread})
        return real(samples, probes, reference)

    check.slow_probes = recorded  # the judge looks it up there
    cfg = EvalConfig(device=args.device, trials=2, timing=TimingConfig(
        warmup_calls=1, warmup_seconds=0.0, min_calls=5, min_seconds=args.min_seconds, rounds=2),
        limits=LimitsConfig(load_seconds=120, check_seconds=30, timing_seconds=60,
                            memory_gib=2))
    task, source = load_task(args.task), args.file.read_text()
    runs = []
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
            for _ in range(args.load)]
    try:
        _judge(args, task, source, cfg, seen, runs)
    finally:
        for proc in busy:
            proc.kill()
            proc.wait()
    commit = subprocess.run(["git", "-C", str(Path(pike.__file__).parent), "rev-parse",
                             "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    result = {"device": args.device, "device_name": device_name(args.device),
              "torch_version": torch.__version__, "date": now(), "command": this_command(),
              "pike": str(Path(pike.__file__).parent), "commit": commit,
              "task": str(args.task), "file": str(args.file), "note": args.note, "runs": runs}
    stem = RESULTS / f"probe-cost-{args.tag}"
    stem.with_suffix(".json").write_text(json.dumps(result, indent=1) + "\n")
    lines = [f"# Probe calls against the other timed calls ({args.tag})", "",
             f"- device: {args.device} ({result['device_name']}), torch "
             f"{result['torch_version']}, date {result['date']}",
             f"- pike: `{result['pike']}` at {commit or 'unknown'}",
             *([f"- note: {args.note}"] if args.note else []),
             f"- command: `{result['command']}`",
             f"- task `{args.task.name}`, file `{args.file.name}`", "",
             f"- busy processes beside: {args.load}; timing.min_seconds {args.min_seconds}", "",
             "| run | verdict | speedup | timed calls | median ms | p90 ms | probes ms "
             "| reference's Q3/median |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for i, r in enumerate(runs, 1):
        probes = ", ".join(f"{x:.4f}" for x in r.get("probes_ms", []))
        spread = f"{r['reference_spread']:.2f}" if r.get("reference_spread") else ""
        speedup = (f"{r['speedup']:.2f}x" if r.get("speedup") is not None
                   else "withheld" if r.get("withheld") else "")
        lines.append(f"| {i} | {r['status']} | {speedup} | {r.get('calls', '')} | "
                     f"{r.get('median_ms', 0):.4f} | {r.get('p90_ms', 0):.4f} | {probes} | "
                     f"{spread} |")
    stem.with_suffix(".md").write_text("\n".join(lines) + "\n")
    return 0


def _judge(args: argparse.Namespace, task: Task, source: str, cfg: EvalConfig,
           seen: list[dict], runs: list[dict]) -> None:
    for i in range(args.runs):
        before = len(seen)
        verdict = evaluate(task, source, cfg)
        run = {"status": verdict.status, "message": verdict.message[:300],
               "speedup": verdict.speedup, "withheld": verdict.noisy_why[:300],
               "core_wait_share": (verdict.steps.get("timing.core_wait", 0.0)
                                   / verdict.steps["timing.blocks"]
                                   if verdict.steps.get("timing.blocks") else None),
               "host_busy": verdict.host_busy,
               **(seen[before] if len(seen) > before else {})}
        runs.append(run)
        print(f"run {i + 1}: {run}", flush=True)


if __name__ == "__main__":
    run_script(main)
