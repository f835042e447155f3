"""The offline benchmark's best candidates judged again one at a time, nothing beside them.

    python bench/retime_offline.py OFFLINE_RESULTS TASK_FOLDER --ids 15,27 [--tag level3-pike]

bench/offline.py runs tasks and candidates side by side (timing exclusive, compiles and
trials not), and its eager times differed markedly from a quieter run of the same tasks
(bench/results/floor-level3-pike.md). This re-renders each chosen task's best
transformation set and judges it alone with the evaluator's default protocol, so the two
speedups can be compared. Writes bench/results/retime-<tag>.json and .md (device, torch
version, date, command), rewritten after every task.
"""

from __future__ import annotations

import argparse
import json
import platform
from pathlib import Path

import torch
from common import RESULTS, device_name, now, run_script, task_ids, this_command, with_ext

from pike.agents.offline import render
from pike.config import EvalConfig
from pike.evaluate import evaluate
from pike.task import load_tasks


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("offline_results", type=Path)
    p.add_argument("folder", type=Path)
    p.add_argument("--ids", required=True, help="task ids, e.g. 15,27")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--tag", default=None)
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args()
    before = json.loads(args.offline_results.read_text())
    if before.get("device_name") and before["device_name"] != device_name(args.device):
        raise SystemExit(f"{args.offline_results} was measured on {before['device_name']}, "
                         f"not {device_name(args.device)}: ratios of two devices do not "
                         "compare")
    rows_before = {r["task"]: r for r in before["rows"]}
    result = {"benchmark": "retime_offline", "device": args.device,
              "device_name": device_name(args.device), "torch_version": torch.__version__,
              "host": platform.node(), "date": now(), "command": this_command(), "rows": []}
    stem = args.out / f"retime-{args.tag or args.folder.name}"
    args.out.mkdir(parents=True, exist_ok=True)
    for task in load_tasks(args.folder, task_ids(args)):
        before = rows_before.get(task.name, {})
        idea = before.get("offline_idea")
        if not idea:
            continue
        verdict = evaluate(task, render(task.source, tuple(idea.split(" + "))),
                           EvalConfig(device=args.device))
        result["rows"].append({
            "task": task.name, "idea": idea, "status": verdict.status,
            "speedup_alone": verdict.speedup, "speedup_in_bench": before.get("offline_speedup"),
            "eager_ms_alone": verdict.reference.median_ms if verdict.reference else None,
            "eager_ms_in_bench": before.get("eager_ms"), "message": verdict.message[:300]})
        with_ext(stem, ".json").write_text(json.dumps(result, indent=2))
        with_ext(stem, ".md").write_text(markdown(result))
        print(json.dumps(result["rows"][-1]), flush=True)
    return 0


def _num(value: float | None, unit: str) -> str:
    return f"{value:.3g}{unit}" if value else "-"


def markdown(result: dict) -> str:
    lines = [f"# Offline best judged again alone ({result['device_name']})", "",
             f"- device: {result['device']}, torch {result['torch_version']}, "
             f"host {result['host']}", f"- date: {result['date']}",
             f"- command: `{result['command']}`", "",
             "| task | best | verdict | speedup alone | in the bench | eager alone | "
             "eager in the bench |", "|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        lines.append(f"| {r['task']} | {r['idea']} | {r['status']} "
                     f"| {_num(r['speedup_alone'], 'x')} | {_num(r['speedup_in_bench'], 'x')} "
                     f"| {_num(r['eager_ms_alone'], ' ms')} "
                     f"| {_num(r['eager_ms_in_bench'], ' ms')} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    run_script(main)
