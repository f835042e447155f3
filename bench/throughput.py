"""Evaluation throughput: one at a time against the pool, on a mixed batch of candidates.

    python bench/throughput.py [--device cuda] [--candidates 40] [--workers 1,4,8]
        [--fixed 6] [--size example|large] [--tag h100] [--resume] [--out bench/results]

The batch (for examples/tasks/1_GeluMLP.py on CPU; on CUDA the same model at a GPU-bound
size, `--size large`, see LARGE) mixes CUDA C++ (load_inline), Triton and plain
PyTorch candidates with failing ones (wrong values, a raising forward, a C++ compile
error); every file carries a marker unique to this run, so each extension really builds
(the build cache is keyed by source). A fixed correct candidate is spread through the
batch `--fixed` times: the CV of its measured medians under each mode's load is the timing
noise that compiles running beside the timing add.

Each `--workers` value is one mode: 1 is serial (one evaluation after another, as pike
judged before the pool), more is the local pool. For every mode: wall time, evaluations
per hour, the speedup over serial, verdict counts, whether each candidate got the same
verdict as in serial, and the fixed candidate's CV. Serial is resumable per candidate
(its wall time is the sum of its evaluations), so it may span several calls with
--resume; a pool mode runs in one go. Results are rewritten after every candidate (serial)
or mode under bench/results/throughput-<tag>.json and .md, with device, torch version,
date and command.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
from common import RESULTS, device_name, notes_section, now, run_script, this_command, with_ext

from pike.config import EvalConfig
from pike.evaluate.pool import LocalPool
from pike.task import Task

ROOT = Path(__file__).resolve().parent.parent
TASK = ROOT / "examples" / "tasks" / "1_GeluMLP.py"
# At the example's size a call takes about 0.05 ms on an H100, set by kernel launches, and
# the fixed candidate's median varied by a third between evaluations even one at a time
# (bench/results/throughput-h100-launch-bound.md), which hides whatever the pool adds. At
# this size a call is GPU-bound (about 1.5 ms).
LARGE = "batch, dim, hidden = 4096, 1024, 4096"
CANDIDATES = ROOT / "tests" / "candidates"
FIXED = "fused"


def batch_kinds(n: int, cuda: bool) -> list[str]:
    """The mix, as candidate file names: about 30% native extensions, 25% Triton, 25%
    PyTorch, 20% failing. On CPU the C++ extension stands in for CUDA and PyTorch for
    Triton."""
    native, triton = ("cuda_gelu", "triton_gelu") if cuda else ("cpp_gelu", "fused")
    failing = ["wrong_values", "forward_raises", "cpp_compile_error"]
    pattern = [native, triton, "fused", native, failing[0], triton, "fused", native,
               failing[1], "fused", triton, failing[2]]
    return [pattern[i % len(pattern)] for i in range(n)]


def sources(kinds: list[str], fixed: int, marker: str) -> list[tuple[str, str]]:
    """(kind, source) with the fixed candidate spread evenly through the batch."""
    items = [(k, (CANDIDATES / f"{k}.py").read_text()) for k in kinds]
    step = max(1, len(items) // max(1, fixed))
    for j in range(fixed):
        items.insert(min(len(items), j * (step + 1)),
                     ("fixed", (CANDIDATES / f"{FIXED}.py").read_text()))
    return [(k, f"{s}\n# throughput batch {marker}, candidate {i}\n")
            for i, (k, s) in enumerate(items)]


def cv(values: list[float]) -> float | None:
    if len(values) < 2:
        return None
    return statistics.stdev(values) / statistics.mean(values)


def summarize(mode: dict, serial: dict | None) -> dict:
    rows = mode["rows"]
    done = [r for r in rows if r is not None]
    fixed = [r["median_ms"] for r in done if r["kind"] == "fixed" and r["median_ms"]]
    # its speedups: each a ratio to the reference timed in the same window
    fixed_speedups = [r["speedup"] for r in done if r["kind"] == "fixed" and r["speedup"]]
    wall = mode["wall_s"] if mode["workers"] > 1 else sum(r["seconds"] for r in done)
    out = {"workers": mode["workers"], "candidates": len(done), "complete": len(done) == len(rows),
           "wall_s": round(wall, 1),
           "evaluations_per_hour": round(len(done) / wall * 3600, 1) if wall else None,
           "statuses": dict(sorted({s: sum(r["status"] == s for r in done)
                                    for s in {r["status"] for r in done}}.items())),
           "fixed_medians_ms": fixed, "fixed_cv": cv(fixed),
           "fixed_speedup_cv": cv(fixed_speedups),
           # honest candidates whose times the parent's clock raised
           # (wall_clock_check.FIGURE_TOLERANCE)
           "raised": [r["wall_clock_factor"] for r in done if r.get("wall_clock_factor")]}
    if serial is not None and not serial["complete"] and serial["evaluations_per_hour"] \
            and mode["workers"] > 1 and out["evaluations_per_hour"]:
        # serial was cut: compare rates, over the serial candidates judged (the batch's start)
        out["rate_over_partial_serial"] = round(
            out["evaluations_per_hour"] / serial["evaluations_per_hour"], 2)
    if serial is not None and serial["complete"]:
        same = [a["status"] == b["status"] for a, b in zip(serial["rows"], rows, strict=True)
                if a is not None and b is not None]
        out["same_verdicts_as_serial"] = f"{sum(same)}/{len(same)}"
        out["speedup_over_serial"] = round(serial["wall_s"] / wall, 2) if wall else None
    return out


def write(args: argparse.Namespace, data: dict) -> None:
    serial = next((m for m in data["modes"] if m["workers"] == 1), None)
    # the serial mode's summary, with its rows, is what the pool modes compare against
    base = summarize(serial, None) | {"rows": serial["rows"]} if serial else None
    data["summary"] = [summarize(m, base) for m in data["modes"]]
    stem = args.out / f"throughput-{args.tag}"
    args.out.mkdir(parents=True, exist_ok=True)
    with_ext(stem, ".json").write_text(json.dumps(data, indent=2))
    lines = [f"# Evaluation throughput ({data['device_name']})", "",
             f"- device: {data['device']}, torch {data['torch_version']}, host {data['host']}, "
             f"{data['cpus']} CPU cores", f"- date: {data['date']}",
             f"- command: `{data['command']}`",
             *(f"- earlier call: `{c}`" for c in data.get("earlier_commands", [])),
             f"- task: {data.get('task', '-')}",
             f"- batch: {data['candidates']} candidates ({data['mix']}), the fixed candidate "
             f"{data['fixed']} times among them", "",
             "| workers | candidates | wall | evaluations/hour | over serial | same verdicts "
             "as serial | fixed candidate CV | its speedup's CV | verdicts | figures raised |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for s in data["summary"]:
        fixed_cv, speedup_cv = (f"{100 * s[k]:.2f}%" if s.get(k) is not None else "-"
                                for k in ("fixed_cv", "fixed_speedup_cv"))
        over = (f"{s['speedup_over_serial']}x" if s.get("speedup_over_serial")
                else f"{s['rate_over_partial_serial']}x by rate (serial cut)"
                if s.get("rate_over_partial_serial") else "-")
        lines.append(f"| {s['workers']} | {s['candidates']}{'' if s['complete'] else ' (cut)'}"
                     f" | {s['wall_s']} s | {s['evaluations_per_hour']} "
                     f"| {over} "
                     f"| {s.get('same_verdicts_as_serial', '-')} | {fixed_cv} | {speedup_cv} "
                     f"| {', '.join(f'{k} {v}' for k, v in s['statuses'].items())} "
                     f"| {', '.join(map(str, s.get('raised', []))) or 'none'} |")
    lines += notes_section(data)
    with_ext(stem, ".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines), flush=True)


def row(kind: str, verdict: object, seconds: float) -> dict:
    runtime = getattr(verdict, "runtime", None)
    return {"kind": kind, "status": getattr(verdict, "status", "?"), "seconds": round(seconds, 2),
            "median_ms": runtime.median_ms if runtime is not None else None,
            "speedup": getattr(verdict, "speedup", None),
            "wall_clock_factor": getattr(verdict, "wall_clock_factor", None)}


def run_mode(task: Task, batch: list[tuple[str, str]], workers: int, cfg: EvalConfig,
             mode: dict, save: Callable[[], None]) -> None:
    texts = [s for _, s in batch]
    with tempfile.TemporaryDirectory(prefix="pike-throughput-") as cache:
        run_cfg = cfg.model_copy(update={"build_cache": Path(cache), "workers": workers})
        pool = LocalPool(run_cfg)
        started = time.monotonic()
        if workers == 1:  # one after another, each timed: resumable
            for i, (kind, source) in enumerate(batch):
                if mode["rows"][i] is not None:
                    continue
                t0 = time.monotonic()
                verdict = pool.judge(task, source)
                mode["rows"][i] = row(kind, verdict, time.monotonic() - t0)
                save()
        else:
            for i, verdict in pool.judge_many(task, texts):
                mode["rows"][i] = row(batch[i][0], verdict, time.monotonic() - started)
            mode["wall_s"] = time.monotonic() - started
            save()
        pool.close()


def bench_task(large: bool, folder: Path) -> Task:
    """1_GeluMLP at the example's size, or at LARGE's (a copy with that line changed)."""
    if not large:
        return Task.from_file(TASK)
    source = TASK.read_text()
    sizes = next(line for line in source.splitlines() if line.startswith("batch, dim, hidden"))
    path = folder / "1_GeluMLP.py"
    path.write_text(source.replace(sizes, LARGE))
    return Task.from_file(path)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--candidates", type=int, default=40)
    p.add_argument("--fixed", type=int, default=6)
    p.add_argument("--workers", default="1,8", help="modes: 1 is serial, more is the pool")
    p.add_argument("--size", choices=["example", "large"], default=None,
                   help="the size of 1_GeluMLP the batch is for (default: large on CUDA)")
    p.add_argument("--tag", default=None)
    p.add_argument("--resume", action="store_true", help="keep what the results file has")
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args()
    cuda = args.device.startswith("cuda")
    args.tag = args.tag or ("cuda" if cuda else "cpu")
    path = args.out / f"throughput-{args.tag}.json"
    command = this_command()
    if args.resume and path.exists():
        data = json.loads(path.read_text())
        data.setdefault("earlier_commands", []).append(data["command"])
        data["command"] = command
    else:
        kinds = batch_kinds(args.candidates, cuda)
        data = {"benchmark": "throughput", "device": args.device,
                "device_name": device_name(args.device), "torch_version": torch.__version__,
                "host": platform.node(), "cpus": len(os.sched_getaffinity(0)),
                "date": now(),
                "command": command, "task": f"{TASK.relative_to(ROOT)} at size "
                f"{args.size or ('large' if cuda else 'example')}",
                "candidates": args.candidates, "fixed": args.fixed,
                "mix": ", ".join(f"{k} {kinds.count(k)}" for k in sorted(set(kinds))),
                "marker": f"{time.time():.0f}", "modes": []}
    batch = sources(batch_kinds(data["candidates"], cuda), data["fixed"], data["marker"])
    cfg = EvalConfig(device=args.device)
    task = bench_task(data.get("task", "").endswith("large"), Path(tempfile.mkdtemp()))
    for workers in [int(w) for w in args.workers.split(",")]:
        mode = next((m for m in data["modes"] if m["workers"] == workers), None)
        if mode is not None and workers > 1 and mode.get("wall_s"):
            continue  # a pool mode that finished
        if mode is None or workers > 1:  # a cut pool mode starts over: its wall time is one run
            if mode is not None:
                data["modes"].remove(mode)
            mode = {"workers": workers, "rows": [None] * len(batch), "wall_s": 0.0}
            data["modes"].append(mode)
        print(f"mode: {workers} worker(s), {len(batch)} candidates", flush=True)
        run_mode(task, batch, workers, cfg, mode, lambda: write(args, data))
        write(args, data)
    return 0


if __name__ == "__main__":
    run_script(main)
