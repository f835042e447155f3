"""Timing noise between evaluations, with nothing else on the machine, per warm-up length.

    python bench/evaluation_noise.py [--device cuda] [--repeats 8] [--warmups 0.1,1.0]
        [--max-calls 5000] [--size example|large] [--tag h100] [--out bench/results]

bench/throughput.py measures the fixed candidate's CV while other candidates compile.
This script measures the floor under that figure: the same candidate (tests/candidates/
fused.py on examples/tasks/1_GeluMLP.py at throughput.py's GPU-bound size) evaluated
`--repeats` times one after another with no other load, for each warm-up length
(eval.timing.warmup_seconds) in turn, round robin, so a drift of the card's state over
the run falls on every setting alike. `--max-calls 1000,5000` adds the timed calls' cap
(eval.timing.max_calls) as a second setting: on a task of 0.1 ms the cap, not
min_seconds, decides how long timing takes. Per setting: the CV of the candidate's medians, of
the reference's medians and of the speedups. Results are rewritten after every
evaluation under bench/results/evaluation-noise-<tag>.json and .md, with device, torch
version, date and command.
"""

from __future__ import annotations

import argparse
import json
import platform
import tempfile
from pathlib import Path

import torch
from common import RESULTS, device_name, notes_section, now, run_script, this_command, with_ext
from throughput import CANDIDATES, FIXED, bench_task, cv

from pike.config import EvalConfig
from pike.evaluate.judge import evaluate


def summary(rows: list[dict]) -> dict:
    ok = [r for r in rows if r["status"] == "ok"]
    return {"evaluations": len(rows), "ok": len(ok),
            "candidate_cv": cv([r["median_ms"] for r in ok]),
            "reference_cv": cv([r["reference_ms"] for r in ok]),
            "speedup_cv": cv([r["speedup"] for r in ok])}


def write(out: Path, tag: str, data: dict) -> None:
    data["summary"] = {w: summary(rows) for w, rows in data["settings"].items()}
    stem = out / f"evaluation-noise-{tag}"
    out.mkdir(parents=True, exist_ok=True)
    with_ext(stem, ".json").write_text(json.dumps(data, indent=2))

    def pct(v: float | None) -> str:
        return f"{100 * v:.2f}%" if v is not None else "-"

    lines = [f"# Timing noise between evaluations ({data['device_name']})", "",
             f"- device: {data['device']}, torch {data['torch_version']}, host {data['host']}",
             f"- date: {data['date']}", f"- command: `{data['command']}`",
             f"- candidate: tests/candidates/{FIXED}.py on {data['task']}, evaluated "
             "one at a time with no other load, settings round robin", "",
             "| warm-up (s), max calls | evaluations | ok | candidate median CV | reference median CV "
             "| speedup CV | candidate medians (ms) |", "|---|---|---|---|---|---|---|"]
    for w, s in data["summary"].items():
        medians = ", ".join(f"{r['median_ms']:.3f}" for r in data["settings"][w]
                            if r["median_ms"])
        lines.append(f"| {w} | {s['evaluations']} | {s['ok']} | {pct(s['candidate_cv'])} | "
                     f"{pct(s['reference_cv'])} | {pct(s['speedup_cv'])} | {medians} |")
    lines += notes_section(data)
    with_ext(stem, ".md").write_text("\n".join(lines) + "\n")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--repeats", type=int, default=8)
    p.add_argument("--warmups", default="0.1,1.0", help="warm-up lengths in seconds")
    p.add_argument("--max-calls", default=None,
                   help="timed calls' caps to compare (comma list; default: the config's)")
    p.add_argument("--size", choices=["example", "large"], default=None,
                   help="1_GeluMLP's size (default: large on CUDA, as throughput.py)")
    p.add_argument("--tag", default=None)
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args()
    cuda = args.device.startswith("cuda")
    size = args.size or ("large" if cuda else "example")
    warmups = [float(w) for w in args.warmups.split(",")]
    caps = ([int(c) for c in args.max_calls.split(",")] if args.max_calls
            else [EvalConfig().timing.max_calls])
    settings = {f"{w}, {c}": (w, c) for w in warmups for c in caps}
    data = {"benchmark": "evaluation-noise", "device": args.device,
            "device_name": device_name(args.device), "torch_version": torch.__version__,
            "host": platform.node(), "date": now(), "command": this_command(),
            "task": f"examples/tasks/1_GeluMLP.py at size {size}",
            "settings": {name: [] for name in settings}}
    task = bench_task(size == "large", Path(tempfile.mkdtemp()))
    source = (CANDIDATES / f"{FIXED}.py").read_text()
    base = EvalConfig(device=args.device)
    for i in range(args.repeats):
        for name, (w, cap) in settings.items():
            cfg = base.model_copy(update={"timing": base.timing.model_copy(
                update={"warmup_seconds": w, "max_calls": cap})})
            verdict = evaluate(task, source, cfg)
            data["settings"][name].append({
                "status": verdict.status,
                "median_ms": verdict.runtime.median_ms if verdict.runtime else None,
                "reference_ms": verdict.reference.median_ms if verdict.reference else None,
                "speedup": verdict.speedup})
            write(args.out, args.tag or ("cuda" if cuda else "cpu"), data)
            print(f"repeat {i + 1}/{args.repeats}, warm-up {w} s, max calls {cap}: "
                  f"{verdict.status} {verdict.speedup} "
                  f"({verdict.phase_seconds.get('timing', 0):.1f} s timing)", flush=True)
    return 0


if __name__ == "__main__":
    run_script(main)
