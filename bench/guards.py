"""What the anti-cheating guards cost: evaluation time with and without them.

    python bench/guards.py [--device cuda] [--repeats 5]

Evaluates a correct, fast candidate of each backend (PyTorch; on CUDA also Triton and
CUDA C++, on CPU C++) `repeats` times with the guards on and off, alternating, and
reports the median evaluation time of each and the difference. The extension build is
cached by source hash, so only the first evaluation of a C++/CUDA candidate builds.
Writes bench/results/guards-<device>.json and .md with device, torch version, date and
command.
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
from pike.task import Task

ROOT = Path(__file__).resolve().parent.parent
TASK = ROOT / "examples" / "tasks" / "1_GeluMLP.py"
CPU_CANDIDATES = {"PyTorch": "tests/candidates/fused.py", "C++": "tests/candidates/cpp_gelu.py"}
CUDA_CANDIDATES = {"PyTorch": "tests/candidates/fused.py",
                   "Triton": "tests/candidates/triton_gelu.py",
                   "CUDA C++": "tests/candidates/cuda_gelu.py"}


def one(task: Task, source: str, cfg: EvalConfig, phases: list[dict] | None = None) -> float:
    started = time.monotonic()
    verdict = evaluate(task, source, cfg)
    if not verdict.ok:
        raise SystemExit(f"candidate failed: {verdict.status}: {verdict.message[:300]}")
    if phases is not None:
        phases.append(verdict.phase_seconds)
    return time.monotonic() - started


def _phase_medians(phases: list[dict]) -> dict[str, float]:
    names = sorted({k for p in phases for k in p})
    return {k: round(statistics.median(p.get(k, 0.0) for p in phases), 3) for k in names}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--backends", default=None, help="only these, e.g. 'CUDA C++'")
    parser.add_argument("--compare", choices=["guards", "sandbox"], default="guards",
                        help="what is turned off in the second column: the in-process "
                        "guards, or the OS sandbox (bubblewrap; guards on in both)")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = parser.parse_args()
    cuda = args.device.startswith("cuda")
    task = Task.from_file(TASK)
    rows = []
    wanted = [b.strip() for b in args.backends.split(",")] if args.backends else None
    for backend, path in (CUDA_CANDIDATES if cuda else CPU_CANDIDATES).items():
        if wanted and backend not in wanted:
            continue
        source = (ROOT / path).read_text()
        if args.compare == "sandbox":
            on_cfg = EvalConfig(device=args.device, sandbox="required")
            off_cfg = EvalConfig(device=args.device, sandbox="off")
        else:
            on_cfg = EvalConfig(device=args.device)
            off_cfg = EvalConfig(device=args.device, guards=False)
        one(task, source, on_cfg)  # build once, warm the reference; not counted
        one(task, source, off_cfg)
        on, off, on_phases, off_phases = [], [], [], []
        for i in range(args.repeats):
            # Which one goes first alternates, so neither always gets the warmer host.
            if i % 2:
                off.append(one(task, source, off_cfg, off_phases))
            on.append(one(task, source, on_cfg, on_phases))
            if not i % 2:
                off.append(one(task, source, off_cfg, off_phases))
        # Where the extra time goes: the child's phases (load, check, timing, ...).
        row = {"backend": backend, "candidate": path, "with_guards_s": statistics.median(on),
               "without_guards_s": statistics.median(off), "each_on": on, "each_off": off,
               "phases_on_s": _phase_medians(on_phases),
               "phases_off_s": _phase_medians(off_phases)}
        row["extra_pct"] = 100 * (row["with_guards_s"] / row["without_guards_s"] - 1)
        # Each on/off pair ran back to back, so its ratio cancels slow drift of the host.
        row["paired_extra_pct"] = 100 * (statistics.median(
            a / b for a, b in zip(on, off, strict=True)) - 1)
        rows.append(row)
        print(json.dumps(row), flush=True)
        write(args, cuda, rows)
    return 0


def write(args: argparse.Namespace, cuda: bool, rows: list[dict]) -> None:
    """Rewritten after every backend, so a run cut off keeps what it measured."""
    device_name = torch.cuda.get_device_name(0) if cuda else platform.processor() or "cpu"
    result = {"benchmark": "guards", "device": args.device, "device_name": device_name,
              "torch_version": torch.__version__, "host": platform.node(),
              "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
              "command": "python " + " ".join(sys.argv), "rows": rows}
    what = "OS sandbox (bubblewrap)" if args.compare == "sandbox" else "in-process guards"
    lines = [f"# Cost of the evaluator's {what} ({device_name})", "",
             f"- device: {args.device}, torch {torch.__version__}, host {platform.node()}",
             f"- date: {result['date']}", f"- command: `{result['command']}`", "",
             "Median wall time of one whole evaluation (child start, load, trials, timing of "
             f"candidate and reference), {what} on and off, alternating.", "",
             "| backend | with | without | extra (medians) | extra (median of pairs) |",
             "|---|---|---|---|---|"]
    lines += [f"| {r['backend']} | {r['with_guards_s']:.2f} s | {r['without_guards_s']:.2f} s "
              f"| {r['extra_pct']:+.1f}% | {r['paired_extra_pct']:+.1f}% |" for r in rows]
    args.out.mkdir(parents=True, exist_ok=True)
    stem = f"{'sandbox' if args.compare == 'sandbox' else 'guards'}-{'cuda' if cuda else 'cpu'}"
    if args.backends:
        stem += "-" + "-".join(r["backend"].lower().replace(" ", "").replace("+", "p")
                               for r in rows)
    (args.out / f"{stem}.json").write_text(json.dumps(result, indent=2))
    (args.out / f"{stem}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines), flush=True)


if __name__ == "__main__":
    run_script(main)
