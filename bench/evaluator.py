"""Evaluator overhead and repeatability.

For each (task, candidate) pair, evaluate the same candidate N times in one process (the
reference is run once and reused, as in a search) and report:
  - overhead per evaluation, excluding the extension build and the timed calls themselves
    (process start, imports, construction, correctness trials, warm-up, comparison);
  - repeatability: coefficient of variation of the candidate's median across evaluations.

    python bench/evaluator.py --device cuda --repeats 10 [--kernelbench DIR --ids 4,9]

Writes bench/results/evaluator-<device>.json and .md with device, torch version, date and
the command.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

from pike.config import EvalConfig
from pike.evaluate import evaluate
from pike.task import Task, load_tasks

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE_PAIRS = [
    ("examples/tasks/1_GeluMLP.py", "tests/candidates/fused.py"),
    ("examples/tasks/3_CausalAttention.py", "examples/candidates/3_CausalAttention_sdpa.py"),
]
GPU_PAIRS = [
    ("examples/tasks/1_GeluMLP.py", "tests/candidates/cuda_gelu.py"),
    ("examples/tasks/1_GeluMLP.py", "tests/candidates/triton_gelu.py"),
]


def pairs(args: argparse.Namespace, cuda: bool) -> list[tuple[Task, str, str]]:
    chosen = [(Task.from_file(ROOT / t), (ROOT / c).read_text(), Path(c).stem)
              for t, c in EXAMPLE_PAIRS + (GPU_PAIRS if cuda else [])]
    if args.kernelbench:
        ids = [int(i) for i in args.ids.split(",")] if args.ids else None
        for task in load_tasks(args.kernelbench, ids):
            chosen.append((task, task.source, "unchanged reference"))
    return chosen


def measure(task: Task, source: str, cfg: EvalConfig, repeats: int) -> dict:
    medians, overheads, totals, setups = [], [], [], []
    status = "ok"
    for _ in range(repeats):
        started = time.monotonic()
        verdict = evaluate(task, source, cfg)
        total = time.monotonic() - started
        if not verdict.ok or verdict.runtime is None:
            status = f"{verdict.status}: {verdict.message[:200]}"
            break
        timed_s = verdict.runtime.mean_ms * verdict.runtime.count / 1e3
        overheads.append(total - verdict.phase_seconds.get("load", 0.0) - timed_s)
        totals.append(total)
        setups.append(verdict.phase_seconds.get("setup", 0.0))
        medians.append(verdict.runtime.median_ms)
        speedup = verdict.speedup
        ref_ms = verdict.reference.median_ms if verdict.reference else None
    if status != "ok":
        return {"status": status}
    cv = statistics.stdev(medians) / statistics.fmean(medians) if len(medians) > 1 else 0.0
    return {
        "status": "ok", "evaluations": len(medians),
        "candidate_median_ms": statistics.median(medians), "median_ms_each": medians,
        "cv_of_medians": cv, "reference_median_ms": ref_ms, "speedup_last": speedup,
        "overhead_s_median": statistics.median(overheads),
        "process_start_s_median": statistics.median(setups),
        "evaluation_s_median": statistics.median(totals),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--kernelbench", type=Path, help="a KernelBench task folder (optional)")
    parser.add_argument("--ids", help="task ids of that folder, e.g. 4,9")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = parser.parse_args()
    cfg = EvalConfig(device=args.device)
    cuda = args.device.startswith("cuda")
    device_name = torch.cuda.get_device_name(0) if cuda else platform.processor() or "cpu"
    rows = []
    for task, source, label in pairs(args, cuda):
        print(f"{task.name} / {label}: {args.repeats} evaluations...", flush=True)
        row = {"task": task.name, "candidate": label, **measure(task, source, cfg, args.repeats)}
        rows.append(row)
        print(json.dumps({k: v for k, v in row.items() if k != "median_ms_each"}), flush=True)
    result = {
        "benchmark": "evaluator", "device": args.device, "device_name": device_name,
        "torch_version": torch.__version__, "host": platform.node(),
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "command": "python " + " ".join(sys.argv), "protocol": cfg.model_dump(mode="json"),
        "rows": rows,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    stem = f"evaluator-{'cuda' if cuda else 'cpu'}"
    (args.out / f"{stem}.json").write_text(json.dumps(result, indent=2))
    (args.out / f"{stem}.md").write_text(markdown(result))
    print(markdown(result))
    return 0


def markdown(result: dict) -> str:
    lines = [
        f"# Evaluator overhead and repeatability ({result['device_name']})",
        "",
        f"- device: {result['device']} ({result['device_name']}), torch "
        f"{result['torch_version']}, host {result['host']}",
        f"- date: {result['date']}",
        f"- command: `{result['command']}`",
        "",
        "| task | candidate | evals | candidate median | CV of medians | reference median "
        "| speedup | overhead/eval (no build, no timed calls) | process start |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in result["rows"]:
        if r["status"] != "ok":
            lines.append(f"| {r['task']} | {r['candidate']} | failed: {r['status'][:80]} "
                         "| | | | | | |")
            continue
        lines.append(
            f"| {r['task']} | {r['candidate']} | {r['evaluations']} "
            f"| {r['candidate_median_ms']:.4g} ms | {100 * r['cv_of_medians']:.2f}% "
            f"| {r['reference_median_ms']:.4g} ms | {r['speedup_last']:.2f}x "
            f"| {r['overhead_s_median']:.2f} s | {r['process_start_s_median']:.2f} s |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
