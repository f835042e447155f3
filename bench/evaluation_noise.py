"""Timing noise between evaluations, with nothing else on the machine, per warm-up length.

    python bench/evaluation_noise.py [--device cuda] [--repeats 8] [--warmups 0.1,1.0]
        [--max-calls 5000] [--min-seconds 1.0,0.5] [--rounds 20,10]
        [--size example|large | --task FILE] [--tag h100] [--out bench/results]

bench/throughput.py measures the fixed candidate's CV while other candidates compile.
This script measures the floor under that figure: the same candidate (tests/candidates/
fused.py on examples/tasks/1_GeluMLP.py at throughput.py's GPU-bound size) evaluated
`--repeats` times one after another with no other load, for each warm-up length
(eval.timing.warmup_seconds) in turn, round robin, so a drift of the card's state over
the run falls on every setting alike. `--max-calls 1000,5000` adds the timed calls' cap
(eval.timing.max_calls) as a second setting: on a task of 0.1 ms the cap, not
min_seconds, decides how long timing takes. `--min-seconds 1.0,0.5` compares the timed run
time each side keeps timing for (eval.timing.min_seconds): on a large-input task of
milliseconds per call it decides how long the device is held alone. `--rounds 20,10` adds
the blocks each side is timed in (eval.timing.rounds): each block is a request to the
child, a few milliseconds of the window beside calls of a few milliseconds. `--task FILE` judges a
task's own module (ModelNew = Model) against it instead: its speedup should be 1.0, so how far
each verdict's figure strays from 1.0 is the noise a search's ranking sees. Per setting: the CV of the candidate's medians, of
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
from eval_overhead import identity_candidate
from throughput import CANDIDATES, FIXED, bench_task, cv

from pike.config import EvalConfig
from pike.evaluate.judge import evaluate
from pike.task import Task


def summary(rows: list[dict]) -> dict:
    ok = [r for r in rows if r["status"] == "ok"]
    return {"evaluations": len(rows), "ok": len(ok),
            "candidate_cv": cv([r["median_ms"] for r in ok]),
            "reference_cv": cv([r["reference_ms"] for r in ok]),
            "speedup_cv": cv([r["speedup"] for r in ok]),
            "candidate_spread": _mean([r.get("candidate_spread") for r in ok]),
            "reference_spread": _mean([r.get("reference_spread") for r in ok]),
            "worst_speedup_error": max((abs(r["speedup"] - 1) for r in ok), default=None),
            "timing_s": _mean([r.get("timing_s") for r in rows]),
            "window_s": _mean([r.get("window_s") for r in rows])}


def _mean(values: list) -> float | None:
    kept = [v for v in values if v is not None]
    return sum(kept) / len(kept) if kept else None


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
             f"- candidate: {data['candidate']} on {data['task']}, evaluated "
             "one at a time, settings round robin", "",
             "| warm-up (s), max calls, min seconds, rounds | evaluations | ok | candidate median "
             "CV | reference median CV | speedup CV | speedup's worst error | timing phase (s, "
             "mean) | window (s, mean) | candidate's calls spread, mean | reference's calls "
             "spread, mean | candidate medians (ms) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for w, s in data["summary"].items():
        medians = ", ".join(f"{r['median_ms']:.3f}" for r in data["settings"][w]
                            if r["median_ms"])
        timing = f"{s['timing_s']:.2f}" if s.get("timing_s") is not None else "-"
        window = f"{s['window_s']:.2f}" if s.get("window_s") is not None else "-"
        lines.append(f"| {w} | {s['evaluations']} | {s['ok']} | {pct(s['candidate_cv'])} | "
                     f"{pct(s['reference_cv'])} | {pct(s['speedup_cv'])} | "
                     f"{pct(s.get('worst_speedup_error'))} | {timing} | {window} | "
                     f"{pct(s.get('candidate_spread'))} | {pct(s.get('reference_spread'))} | "
                     f"{medians} |")
    lines += notes_section(data)
    with_ext(stem, ".md").write_text("\n".join(lines) + "\n")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--repeats", type=int, default=8)
    p.add_argument("--warmups", default="0.1,1.0", help="warm-up lengths in seconds")
    p.add_argument("--max-calls", default=None,
                   help="timed calls' caps to compare (comma list; default: the config's)")
    p.add_argument("--min-seconds", default=None,
                   help="timed run time per side to compare (comma list; default: the config's)")
    p.add_argument("--rounds", default=None,
                   help="blocks per side to compare (comma list; default: the config's)")
    p.add_argument("--size", choices=["example", "large"], default=None,
                   help="1_GeluMLP's size (default: large on CUDA, as throughput.py)")
    p.add_argument("--task", type=Path, default=None,
                   help="a task file whose own module is judged against it instead")
    p.add_argument("--candidate", type=Path, default=None,
                   help="with --task: judge this file against it instead of its own module "
                   "(its figure then need not be 1.0: read the CVs and spreads)")
    p.add_argument("--tag", default=None)
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args()
    cuda = args.device.startswith("cuda")
    size = args.size or ("large" if cuda else "example")
    warmups = [float(w) for w in args.warmups.split(",")]
    caps = ([int(c) for c in args.max_calls.split(",")] if args.max_calls
            else [EvalConfig().timing.max_calls])
    spans = ([float(m) for m in args.min_seconds.split(",")] if args.min_seconds
             else [EvalConfig().timing.min_seconds])
    blocks = ([int(r) for r in args.rounds.split(",")] if args.rounds
              else [EvalConfig().timing.rounds])
    settings = {f"{w}, {c}, {m}, {r}": (w, c, m, r)
                for w in warmups for c in caps for m in spans for r in blocks}
    if args.candidate and not args.task:
        p.error("--candidate needs --task")
    if args.task:
        task = Task.from_file(args.task)
        source, candidate, described = (identity_candidate(task), "its own module",
                                        str(args.task))
        if args.candidate:
            source, candidate = args.candidate.read_text(), str(args.candidate)
    else:
        task = bench_task(size == "large", Path(tempfile.mkdtemp()))
        source = (CANDIDATES / f"{FIXED}.py").read_text()
        candidate, described = f"tests/candidates/{FIXED}.py", f"examples/tasks/1_GeluMLP.py at size {size}"
    data = {"benchmark": "evaluation-noise", "device": args.device,
            "device_name": device_name(args.device), "torch_version": torch.__version__,
            "host": platform.node(), "date": now(), "command": this_command(),
            "task": described, "candidate": candidate,
            "settings": {name: [] for name in settings}}
    base = EvalConfig(device=args.device)
    for i in range(args.repeats):
        for name, (w, cap, span, rounds) in settings.items():
            cfg = base.model_copy(update={"timing": base.timing.model_copy(
                update={"warmup_seconds": w, "max_calls": cap, "min_seconds": span,
                        "rounds": rounds})})
            verdict = evaluate(task, source, cfg)
            timing_s = verdict.phase_seconds.get("timing")
            data["settings"][name].append({
                "status": verdict.status,
                "median_ms": verdict.runtime.median_ms if verdict.runtime else None,
                "reference_ms": verdict.reference.median_ms if verdict.reference else None,
                "speedup": verdict.speedup, "timing_s": timing_s,
                # quartiles over the median of each side's calls, as pike audit's spreads
                "candidate_spread": verdict.runtime.spread() if verdict.runtime else None,
                "reference_spread": verdict.reference.spread() if verdict.reference else None,
                # the windows' own time (the phase also holds the final check); a
                # drifting reference's windows timed again add up here
                "window_s": verdict.steps.get("timing")})
            write(args.out, args.tag or ("cuda" if cuda else "cpu"), data)
            print(f"repeat {i + 1}/{args.repeats}, warm-up {w} s, max calls {cap}, "
                  f"min seconds {span}, rounds {rounds}: {verdict.status} {verdict.speedup} "
                  f"({timing_s or 0:.1f} s timing)", flush=True)
    return 0


if __name__ == "__main__":
    run_script(main)
