"""How well the host-memory gate's guess for a task nobody measured fits what its
reference then took: for each task of a finished bench run whose store kept its size on
the host (host_footprint), its structural bytes (task_size: inputs, outputs and weights on
the meta device, counted under the run's protocol) plus the most any *other* task's
reference took beyond its own, against the reference's measured peak; and the guess
before it (the largest any other task's reference took). Nothing runs on a GPU: the
measured peaks are the run's, the sizes are found here on the meta device. The run is
taken to have had its scratch in memory (/dev/shm) and a GPU device, as pike's level1
benches on lent GPU hosts had.

    python bench/host_estimate.py RUN_DIR TASK_FOLDER [--tag level1-h100]

Writes bench/results/host-estimate-TAG.md and .json (host, torch version, date, command).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import torch
from common import RESULTS, now, this_command, with_ext

from pike.evaluate import task_size
from pike.store import FOOTPRINT_STATE, RunStore

GIB = 2**30


def _rows(run: Path, folder: Path) -> tuple[list[dict[str, Any]], dict[str, int]]:
    with RunStore.open(run) as store:
        config = store.config().get("eval", {})
        counts = {"trials": int(config.get("trials", 5)),
                  "input_sets": int(config.get("timing", {}).get("input_sets", 2))}
        rows = []
        for task in store.tasks():
            kept = store.get_state(task["name"], FOOTPRINT_STATE)
            if not isinstance(kept, dict) or not kept.get("reference"):
                continue
            answer = task_size.on_meta(str(folder / Path(task["path"]).name))
            rows.append({"task": task["name"], "measured": kept["reference"],
                         "structural": task_size.structural_for(answer, **counts),
                         **{k: answer.get(k) for k in ("inputs", "outputs", "params",
                                                       "error")}})
    for row in rows:
        others = [r for r in rows if r is not row]
        beyond = [r["measured"] - r["structural"] for r in others if r["structural"] is not None]
        row["largest_other"] = max((r["measured"] for r in others), default=None)
        row["estimate"] = (row["structural"] + max(0, *beyond)
                           if row["structural"] is not None and beyond else None)
    return rows, counts


def _gib(n: int | None) -> str:
    return "-" if n is None else f"{n / GIB:.1f}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("run", type=Path)
    p.add_argument("folder", type=Path)
    p.add_argument("--tag", default="level1")
    args = p.parse_args()
    rows, counts = _rows(args.run, args.folder)
    sized = [r for r in rows if r["estimate"] is not None]
    under = [r["task"] for r in sized if r["estimate"] < r["measured"]]
    data = {"host": "the CPU host (sizes on the meta device; peaks as the run measured them)",
            "torch": torch.__version__, "date": now(), "command": this_command(),
            "run": str(args.run), "protocol": counts, "rows": rows,
            "under_estimates": under}
    stem = RESULTS / f"host-estimate-{args.tag}"
    with_ext(stem, ".json").write_text(json.dumps(data, indent=2) + "\n")
    over = [r["estimate"] / r["measured"] for r in sized]
    before = [r["largest_other"] / r["measured"] for r in sized if r["largest_other"]]
    lines = [f"# The host-memory gate's guess for a new task's reference ({args.tag})", "",
             f"- run: `{args.run}` (its peaks, as measured there); sizes found here, torch "
             f"{data['torch']}, {data['date']}",
             f"- command: `{data['command']}`",
             f"- protocol: {counts['trials']} trials and {counts['input_sets']} timed input "
             "sets (structural bytes as task_size.structural_bytes counts them)",
             "- estimate: structural bytes plus the most any other task's reference took "
             "beyond its own (leave-one-out); before: the largest any other task's took",
             "- the gate asks for its headroom beyond either (5% of the host's memory, at "
             "least 2 GiB)", "",
             f"**{len(sized)} tasks sized; under-estimated: {len(under)}"
             f"{' (' + ', '.join(under) + ')' if under else ''}; estimate / measured "
             f"{min(over, default=0):.2f} to {max(over, default=0):.2f}; before: "
             f"{min(before, default=0):.2f} to {max(before, default=0):.2f}**", "",
             "| task | inputs GiB | outputs GiB | structural GiB | measured GiB | estimate GiB"
             " | before GiB |", "|---|---|---|---|---|---|---|"]
    lines += [f"| {r['task']} | {_gib(r['inputs'])} | {_gib(r['outputs'])} | "
              f"{_gib(r['structural'])} | {_gib(r['measured'])} | {_gib(r['estimate'])} | "
              f"{_gib(r['largest_other'])} |" for r in rows]
    lines += [f"\n{r['task']}: no size on the meta device ({r['error']})"
              for r in rows if r.get("error")]
    with_ext(stem, ".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
