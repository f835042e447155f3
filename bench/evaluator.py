"""Evaluator overhead and repeatability.

For each (task, candidate) pair, evaluate the same candidate N times in one process (the
reference is run once and reused, as in a search) and report:
  - overhead per evaluation, excluding the extension build and the timed calls themselves
    (process start, imports, construction, correctness trials, warm-up, comparison);
  - repeatability: coefficient of variation (CV) of the candidate's median across
    evaluations, of the reference's median (timed in the same evaluation, in blocks
    alternating with the candidate's) and of the speedup;
  - the host's own drift: CV of a fixed pure-Python loop timed before each evaluation.
For KernelBench tasks on CUDA it evaluates the unchanged model twice over: eager (bound
by host dispatch) and replayed from a CUDA graph (bound by the GPU).

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
from common import run_script

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


# A GPU-bound candidate for any task: the unchanged model replayed from a CUDA graph. Eager
# models on the lent hosts are bound by host dispatch, whose speed drifts with the host;
# this separates the evaluator's own noise from the host's.
GRAPH_WRAPPER = """

class ModelNew(torch.nn.Module):
    def __init__(self, *args):
        super().__init__()
        self.inner = Model(*args)
        self._graph = None

    def _capture(self, inputs):
        self._static_in = [x.clone() if isinstance(x, torch.Tensor) else x for x in inputs]
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                self.inner(*self._static_in)
        torch.cuda.current_stream().wait_stream(side)
        self._graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self._graph):
            self._static_out = self.inner(*self._static_in)
        self._shapes = [x.shape for x in inputs if isinstance(x, torch.Tensor)]

    def forward(self, *inputs):
        shapes = [x.shape for x in inputs if isinstance(x, torch.Tensor)]
        if self._graph is None or shapes != self._shapes:
            self._capture(inputs)
        for dst, src in zip(self._static_in, inputs):
            if isinstance(dst, torch.Tensor):
                dst.copy_(src)
        self._graph.replay()
        return self._static_out.clone()
"""


def pairs(args: argparse.Namespace, cuda: bool) -> list[tuple[Task, str, str]]:
    examples = [] if args.skip_examples else EXAMPLE_PAIRS + (GPU_PAIRS if cuda else [])
    chosen = [(Task.from_file(ROOT / t), (ROOT / c).read_text(), Path(c).stem)
              for t, c in examples]
    if args.kernelbench:
        ids = [int(i) for i in args.ids.split(",")] if args.ids else None
        for task in load_tasks(args.kernelbench, ids):
            chosen.append((task, task.source, "unchanged reference (eager)"))
            if cuda:
                chosen.append((task, task.source + GRAPH_WRAPPER, "reference in a CUDA graph"))
    return chosen


def host_speed_ms() -> float:
    """Median time of a fixed pure-Python loop: how fast the host runs right now."""
    def loop() -> float:
        t0 = time.perf_counter()
        total = 0
        for i in range(100_000):
            total += i
        return (time.perf_counter() - t0) * 1e3

    return statistics.median(loop() for _ in range(10))


def _cv(values: list[float]) -> float:
    return statistics.stdev(values) / statistics.fmean(values) if len(values) > 1 else 0.0


def measure(task: Task, source: str, cfg: EvalConfig, repeats: int) -> dict:
    medians, ref_medians, speedups, overheads, totals, setups, host = [], [], [], [], [], [], []
    for _ in range(repeats):
        host.append(host_speed_ms())
        started = time.monotonic()
        verdict = evaluate(task, source, cfg)
        total = time.monotonic() - started
        if not verdict.ok or verdict.runtime is None or verdict.reference is None:
            return {"status": f"{verdict.status}: {verdict.message[:300]}"}
        timed_s = sum(t.mean_ms * t.count for t in (verdict.runtime, verdict.reference)) / 1e3
        overheads.append(total - verdict.phase_seconds.get("load", 0.0) - timed_s)
        totals.append(total)
        setups.append(verdict.phase_seconds.get("setup", 0.0))
        medians.append(verdict.runtime.median_ms)
        ref_medians.append(verdict.reference.median_ms)
        speedups.append(verdict.speedup or 0.0)
    return {
        "status": "ok", "evaluations": len(medians),
        "candidate_median_ms": statistics.median(medians), "median_ms_each": medians,
        "cv_of_medians": _cv(medians),
        "reference_median_ms": statistics.median(ref_medians),
        "cv_of_reference_medians": _cv(ref_medians),
        "speedup_median": statistics.median(speedups), "speedup_each": speedups,
        "cv_of_speedups": _cv(speedups),
        "host_loop_ms_each": host, "cv_of_host_loop": _cv(host),
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
    parser.add_argument("--skip-examples", action="store_true",
                        help="only the KernelBench tasks")
    parser.add_argument("--tag", default="", help="suffix of the result file names")
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
    stem = f"evaluator-{'cuda' if cuda else 'cpu'}{'-' + args.tag if args.tag else ''}"
    (args.out / f"{stem}.json").write_text(json.dumps(result, indent=2))
    (args.out / f"{stem}.md").write_text(markdown(result))
    print(markdown(result))
    return 0


def markdown(result: dict) -> str:
    lines = [
        f"# Evaluator overhead and repeatability ({result['device_name']})",
        "",
        "CV: coefficient of variation across evaluations of the same candidate, each in fresh "
        "child processes. The host loop column is the drift of the host CPU itself.",
        "",
        f"- device: {result['device']} ({result['device_name']}), torch "
        f"{result['torch_version']}, host {result['host']}",
        f"- date: {result['date']}",
        f"- command: `{result['command']}`",
        "",
        "| task | candidate | evals | candidate median | CV of medians | reference median "
        "| CV of reference medians | speedup | CV of speedups | CV of host loop "
        "| overhead/eval (no build, no timed calls) | process start |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in result["rows"]:
        if r["status"] != "ok":
            lines.append(f"| {r['task']} | {r['candidate']} | failed: {r['status'][:80]} "
                         "| | | | | | | | | |")
            continue
        lines.append(
            f"| {r['task']} | {r['candidate']} | {r['evaluations']} "
            f"| {r['candidate_median_ms']:.4g} ms | {100 * r['cv_of_medians']:.2f}% "
            f"| {r['reference_median_ms']:.4g} ms | {100 * r['cv_of_reference_medians']:.2f}% "
            f"| {r['speedup_median']:.2f}x | {100 * r['cv_of_speedups']:.2f}% "
            f"| {100 * r['cv_of_host_loop']:.1f}% "
            f"| {r['overhead_s_median']:.2f} s | {r['process_start_s_median']:.2f} s |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    run_script(main)
