"""A campaign's solution set as its search measured it: each task's claimed speedup over
eager and over the fastest torch.compile mode of the task's own baseline, and their
geomeans. Not an audit: these are the figures `pike audit SET TASKS --workers 1` is to
check, written down so the audit has something to be compared against.

    python bench/set_claims.py RUN_DIR --tag TAG [--set RUN_DIR/solutions] [--out DIR]

RUN_DIR is a `pike bench` run folder (its run.sqlite holds each task's baseline); the set
is RUN_DIR/solutions unless --set names another (`pike export RUN_DIR --set` writes one
under today's rules). Writes DIR/set-claims-TAG.md and .json (DIR: bench/results).
A task with no file (no correct candidate, or its best slower than eager: the reference
kept) counts 1.0x over eager and eager's ratio to the fastest mode over that mode.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from pathlib import Path

from common import RESULTS, geomean

from pike.report.data import stored_baseline
from pike.solution_set import compile_speedups, read_set
from pike.store import RunStore


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("run_dir", type=Path)
    p.add_argument("--tag", required=True)
    p.add_argument("--set", type=Path, default=None)
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args()
    folder = args.set or args.run_dir / "solutions"
    found = read_set(folder)
    rows = []
    with RunStore.open(args.run_dir) as store:
        for entry in found.tasks:
            # eager's speedup over each working mode: the set's rule for a file's
            eager_over = compile_speedups(1.0, stored_baseline(store, entry.task))
            fastest = min(eager_over, key=eager_over.__getitem__) if eager_over else None
            over_eager = entry.speedup_vs_eager if entry.status == "ok" else 1.0
            rows.append({
                "task": entry.task, "status": entry.status, "file": entry.file,
                "over_eager": over_eager, "fastest_mode": fastest,
                "fastest_mode_over_eager": 1.0 / eager_over[fastest] if fastest else None,
                "over_fastest_mode": over_eager * eager_over[fastest] if fastest else None,
                "detail": entry.detail, "device_name": entry.device_name,
                "torch_version": entry.torch_version})
    with_mode = [r["over_fastest_mode"] for r in rows if r["over_fastest_mode"]]
    data = {"set": str(folder), "run_dir": str(args.run_dir),
            "command": "python " + " ".join(sys.argv),
            "written": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            "device_name": next((r["device_name"] for r in rows if r["device_name"]), ""),
            "torch_version": next((r["torch_version"] for r in rows if r["torch_version"]), ""),
            "tasks": len(rows), "geomean_over_eager": geomean([r["over_eager"] for r in rows]),
            "geomean_over_fastest_mode": geomean(with_mode) if with_mode else None,
            "tasks_with_a_mode": len(with_mode),
            "below_fastest_mode": [r["task"] for r in rows
                                   if r["over_fastest_mode"] and r["over_fastest_mode"] < 1.0],
            "rows": rows}
    stem = args.out / f"set-claims-{args.tag}"
    stem.with_suffix(".json").write_text(json.dumps(data, indent=2) + "\n")
    stem.with_suffix(".md").write_text(_markdown(data))
    print(f"wrote {stem.with_suffix('.md')}")
    return 0


def _markdown(d: dict) -> str:
    lines = [f"# The search's own figures for `{d['set']}` (not an audit)", "",
             f"- measured on {d['device_name'] or '?'}, torch {d['torch_version'] or '?'}, by "
             f"the search that wrote the set (`{d['run_dir']}`); page written {d['written']}",
             f"- command: `{d['command']}`", "",
             f"**{d['geomean_over_eager']:.3g}x over eager** over all {d['tasks']} tasks (a task "
             "without a file counts 1.0x); "
             + (f"**{d['geomean_over_fastest_mode']:.3g}x over each task's fastest "
                f"torch.compile mode** ({d['tasks_with_a_mode']} tasks with a working mode). "
                if d["geomean_over_fastest_mode"] else "")
             + f"Below their fastest mode: {', '.join(d['below_fastest_mode']) or 'none'}.", "",
             "| task | set entry | over eager | fastest compile mode (over eager) | over that mode |",
             "|---|---|---|---|---|"]
    for r in d["rows"]:
        mode = (f"{r['fastest_mode']} ({r['fastest_mode_over_eager']:.3g}x)"
                if r["fastest_mode"] else "-")
        over = f"{r['over_fastest_mode']:.3g}x" if r["over_fastest_mode"] else "-"
        status = r["status"] + (f": {r['detail']}" if r["detail"] else "")
        lines.append(f"| {r['task']} | {status} | {r['over_eager']:.3g}x | {mode} | {over} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
