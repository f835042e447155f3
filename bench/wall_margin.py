"""How far a candidate's timing blocks stretch past what it reported: the data behind the
wall-clock check's margin.

    python bench/wall_margin.py TASK_FILE... [--device cuda] [--repeats 5]
        [--candidates honest,forged-0.6,forged-0.45,forged-0.25] [--busy-threads N]
        [--tag cpu] [--out bench/results]

The parent times each block of a candidate's calls from outside its process and subtracts
the loop's own cost, which the trusted reference measures (`calibrate`), and a slack for
scheduling. What is left, over what the candidate reported, is a block's *stretch*
(`wall_clock_check._stretch`): about 1 for honest timings, `1/f` for a candidate that
reports `f` of its true time. A block counts as suspicious above the check's margin
(`WALL_MARGIN`), and a window with more than half its blocks suspicious is judged forged
unless the candidate's median stretch is within `CONTROL_FACTOR` of the reference's. The
margin can only be tightened to where honest blocks, and the reference's, do not reach.

For each task, `--repeats` evaluations of

- `honest`: the task's own module as the candidate;
- `forged-0.6`, `forged-0.45` and `forged-0.25`: the same module, whose forward scales the
  samples the timing loop already holds by 0.6 (a 1.7x claim, stretch about 1.7), 0.45
  (2.2x, about 2.2) or 0.25 (4x, about 4), through the frames above its own; only the
  wall clock can catch them.

`--busy-threads N` keeps N threads of the judging process busy in pure Python meanwhile:
the load a campaign's other tasks put on pike's own process (their searches, comparisons
and bookkeeping share its GIL), under which the parent's clock must still measure the
child's blocks and not its own waits.

The forgers reach the samples of the host's timing loop, which holds them per call; the
CUDA loop reads its events after the block, so on a GPU only the honest rows measure
anything. Every block's stretch is recorded, for the candidate and the reference timed beside it,
with the verdict. Results: bench/results/wall-margin-<tag>.json and .md, with device,
torch version, date, command.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from common import RESULTS, device_name, notes_section, now, run_script, this_command

from pike.config import EvalConfig
from pike.evaluate import candidate_windows, evaluate, wall_clock_check
from pike.evaluate.reference_cache import close_references
from pike.task import Task

FORGER = '''

class ModelNew(Model):
    def forward(self, *args):
        import sys
        out = super().forward(*args)
        frame = sys._getframe(0)
        while frame is not None:  # the nearest list of samples: this block's, on the host
            samples = frame.f_locals.get("samples")
            if isinstance(samples, list):
                done = getattr(self, "_scaled", 0) if samples else 0
                done = 0 if done > len(samples) else done  # a new block
                samples[done:] = [s * {factor} for s in samples[done:]]
                self._scaled = len(samples)
                break
            frame = frame.f_back
        return out
'''

CANDIDATES = {
    "honest": lambda task: task.source + "\n\nModelNew = Model\n",
    "forged-0.6": lambda task: task.source + FORGER.replace("{factor}", "0.6"),
    "forged-0.45": lambda task: task.source + FORGER.replace("{factor}", "0.45"),
    "forged-0.25": lambda task: task.source + FORGER.replace("{factor}", "0.25"),
}


def judged_once(task: Task, source: str, cfg: EvalConfig) -> dict:
    seen: list[dict] = []
    real = candidate_windows.unaccounted_wall_time

    def spy(cost, judged, reference, strict=False):  # type: ignore[no-untyped-def]
        seen.append({"candidate": wall_clock_check.block_stretches(cost, judged),
                     "reference": wall_clock_check.block_stretches(cost, reference),
                     "loop_per_block_ms": cost.per_block_s * 1e3,
                     "loop_per_call_us": cost.per_call_s * 1e6, "strict": strict})
        return real(cost, judged, reference, strict)

    candidate_windows.unaccounted_wall_time = spy
    try:
        verdict = evaluate(task, source, cfg)
    finally:
        candidate_windows.unaccounted_wall_time = real
    return {"status": verdict.status, "speedup": verdict.speedup,
            "wall_clock_factor": verdict.wall_clock_factor,
            "message": verdict.message[:200] if verdict.message else None, "windows": seen}


@contextmanager
def busy_threads(count: int) -> Iterator[None]:
    """`count` threads of this process looping in pure Python (they hold the GIL in turns
    with every other thread) for the `with` block."""
    stop = threading.Event()

    def spin() -> None:
        x = 0
        while not stop.is_set():
            for i in range(10_000):
                x += i * i

    threads = [threading.Thread(target=spin, name=f"busy-{i}", daemon=True)
               for i in range(count)]
    for t in threads:
        t.start()
    try:
        yield
    finally:
        stop.set()
        for t in threads:
            t.join()


def quantiles(values: list[float]) -> dict:
    finite = sorted(v for v in values if math.isfinite(v))
    if not finite:
        return {}

    def q(p: float) -> float:
        return round(finite[min(len(finite) - 1, int(p * len(finite)))], 3)

    return {"n": len(finite), "p50": q(0.5), "p90": q(0.9), "p99": q(0.99),
            "max": round(finite[-1], 3)}


def summary(rows: list[dict]) -> list[dict]:
    table = []
    for task in dict.fromkeys(r["task"] for r in rows):
        for name in dict.fromkeys(r["candidate"] for r in rows):
            mine = [r for r in rows if r["task"] == task and r["candidate"] == name]
            windows = [w for r in mine for w in r["windows"]]
            table.append({
                "task": task, "candidate": name,
                "verdicts": dict(sorted({s: sum(r["status"] == s for r in mine)
                                         for s in {r["status"] for r in mine}}.items())),
                "candidate_stretch": quantiles([s for w in windows for s in w["candidate"]]),
                "reference_stretch": quantiles([s for w in windows for s in w["reference"]]),
                "speedups": [round(r["speedup"], 3) for r in mine if r["speedup"]],
                "raised_by": [r.get("wall_clock_factor") or 1.0 for r in mine
                              if r["speedup"]],
            })
    return table


def markdown(result: dict) -> str:
    lines = [
        "# Wall-clock margin: how far timing blocks stretch past what was reported",
        "",
        f"- device: {result['device_name']} ({result['device']}), torch {result['torch_version']}",
        f"- date: {result['date']}",
        f"- command: `{result['command']}`",
        f"- threads of the judging process kept busy in pure Python meanwhile: "
        f"{result.get('busy_threads', 0)}",
        f"- repeats per candidate: {result['repeats']}; the check's margin now: a block is "
        f"suspicious when its stretch exceeds {wall_clock_check.WALL_MARGIN:g}, and a mostly "
        f"suspicious window is forged past {wall_clock_check.CONTROL_FACTOR:g}x the reference's; "
        f"below that, a figure is raised where the median stretch exceeds "
        f"{wall_clock_check.FIGURE_TOLERANCE:g}x the reference's",
        "",
        "| task | candidate | verdicts | candidate stretch p50 / p90 / p99 / max (n) "
        "| reference stretch p50 / p90 / p99 / max | speedups | times raised by |",
        "|---|---|---|---|---|---|---|",
    ]

    def cell(q: dict) -> str:
        return (f"{q['p50']} / {q['p90']} / {q['p99']} / {q['max']} ({q['n']})" if q
                else "-")

    for row in result["summary"]:
        verdicts = ", ".join(f"{k} {v}" for k, v in row["verdicts"].items())
        lines.append(f"| {row['task']} | {row['candidate']} | {verdicts} "
                     f"| {cell(row['candidate_stretch'])} | {cell(row['reference_stretch'])} "
                     f"| {', '.join(map(str, row.get('speedups', []))) or '-'} "
                     f"| {', '.join(str(x) for x in row.get('raised_by', [])) or '-'} |")
    return "\n".join([*lines, *notes_section(result)]) + "\n"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("tasks", nargs="+", type=Path)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--candidates", default=",".join(CANDIDATES),
                   help="which rows (on a GPU the forgers cannot reach the samples, so "
                        "`honest` alone measures all there is)")
    p.add_argument("--busy-threads", type=int, default=0,
                   help="threads of this process looping in pure Python while it judges")
    p.add_argument("--tag", default=None)
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args()
    tag = args.tag or args.device.split(":")[0]
    cfg = EvalConfig(device=args.device)
    rows: list[dict] = []
    args.out.mkdir(parents=True, exist_ok=True)
    for path in args.tasks:
        task = Task.from_file(path)
        for name in args.candidates.split(","):
            make = CANDIDATES[name]
            for i in range(args.repeats):
                with busy_threads(args.busy_threads):
                    judged = judged_once(task, make(task), cfg)
                row = {"task": task.name, "candidate": name, "repeat": i, **judged}
                rows.append(row)
                print(json.dumps({k: row[k] for k in ("task", "candidate", "repeat", "status",
                                                     "speedup")}), flush=True)
        close_references()
    result = {"benchmark": "wall_margin", "device": args.device,
              "device_name": device_name(args.device), "torch_version": torch.__version__,
              "date": now(), "command": this_command(), "repeats": args.repeats,
              "busy_threads": args.busy_threads,
              "summary": summary(rows), "rows": rows}
    (args.out / f"wall-margin-{tag}.json").write_text(json.dumps(result, indent=2))
    (args.out / f"wall-margin-{tag}.md").write_text(markdown(result))
    print(markdown(result))
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    run_script(main)
