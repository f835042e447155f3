"""What a task's reference writes to the evaluator's scratch: every input set and expected
output it draws, counted on the meta device (no memory taken, no GPU needed).

    python bench/staging_bytes.py TASK_FOLDER [--ids 2,7,9] [--tag level1-sample]

Per task: one input set's bytes, one call's output bytes, and the reference's files with
today's protocol (`eval.trials` + the shifted and after-timing trials, each an input set
and its expected outputs; the timed calls' `eval.timing.input_sets` and the probe sets,
an input set each: their outputs are computed again when a window's samples are
checked), beside what it wrote up to pike 70c9566 (the timed sets' outputs too). The
scratch is /dev/shm where it has room: these bytes are host memory that no process's RSS
shows, held for the task's whole search (pike.evaluate.held_files).
Writes bench/results/staging-bytes-<tag>.json and .md with the date and command.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import torch
from common import now, run_script, this_command

from pike.config import EvalConfig
from pike.errors import TaskError
from pike.evaluate.protocol import EXTRA_TRIALS, timed_set_count
from pike.task import Task
from pike.work_count import io_bytes

RESULTS = Path(__file__).parent / "results"
_GIB = 2**30


def measure(path: Path) -> dict[str, Any]:
    """One input set's and one call's output bytes of the task file at `path`."""
    try:
        inputs, outputs = io_bytes(Task.from_file(path))
    except TaskError as exc:  # a task the meta device cannot run: said, not guessed
        return {"task": path.stem, "error": str(exc)[:160]}
    return {"task": path.stem, "input_bytes": inputs, "output_bytes": outputs}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("folder", type=Path)
    p.add_argument("--ids", default=None, help="only these task ids: 2,7,9")
    p.add_argument("--tag", required=True, help="names the results: staging-bytes-TAG")
    args = p.parse_args()
    ids = {int(i) for i in args.ids.split(",")} if args.ids else None
    cfg = EvalConfig()
    outputs = cfg.trials + EXTRA_TRIALS
    sets = outputs + timed_set_count(cfg.timing.input_sets)
    files = sorted((f for f in args.folder.glob("*.py") if f.stem.split("_")[0].isdigit()),
                   key=lambda f: int(f.stem.split("_")[0]))
    rows = [measure(f) for f in files if ids is None or int(f.stem.split("_")[0]) in ids]
    for row in rows:
        if "error" not in row:
            row["reference_files_bytes"] = (sets * row["input_bytes"]
                                            + outputs * row["output_bytes"])
            row["until_70c9566_bytes"] = sets * (row["input_bytes"] + row["output_bytes"])
    data = {"date": now(), "command": this_command(), "torch": torch.__version__,
            "sets": sets, "expected_outputs": outputs, "trials": cfg.trials,
            "input_sets": cfg.timing.input_sets, "tasks": rows}
    stem = RESULTS / f"staging-bytes-{args.tag}"
    stem.with_suffix(".json").write_text(json.dumps(data, indent=1) + "\n")
    lines = [f"# What each task's reference writes to the scratch ({args.tag})", "",
             f"- date: {data['date']}; torch {data['torch']} (meta device: sizes only)",
             f"- command: `{data['command']}`",
             f"- protocol: {cfg.trials} trials + {EXTRA_TRIALS} (shifted, after timing), "
             f"{cfg.timing.input_sets} timed input sets + probes: {sets} input sets and "
             f"{outputs} expected outputs per reference (up to pike 70c9566: {sets} of "
             "each, the timed sets' outputs kept too)", "",
             "| task | one input set | one output | the reference's files | up to 70c9566 |",
             "| --- | --- | --- | --- | --- |"]
    for row in rows:
        if "error" in row:
            lines.append(f"| {row['task']} | {row['error']} | | | |")
        else:
            lines.append(f"| {row['task']} | {row['input_bytes'] / _GIB:.2f} GiB | "
                         f"{row['output_bytes'] / _GIB:.2f} GiB | "
                         f"{row['reference_files_bytes'] / _GIB:.1f} GiB | "
                         f"{row['until_70c9566_bytes'] / _GIB:.1f} GiB |")
    stem.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    run_script(main)
