"""Keep an offline benchmark's best files as a solution set (the `pike export --set` format).

    python bench/offline_set.py OFFLINE_RESULTS_JSON TASK_FOLDER OUT_DIR

bench/offline.py records each task's best transformation set by name; the offline agent
renders the same kind of `ModelNew` from those names. This writes each rendered file and a
manifest.json whose claims are the benchmark's own search-time figures, so `pike audit
OUT_DIR TASK_FOLDER` re-judges them and compares. Every task of the folder has an entry: a
task the benchmark found no correct candidate for, or never ran, is listed without a file.
The files are rendered by this checkout's offline agent, which may differ from the one the
benchmark ran; each entry's detail says so.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
from pathlib import Path

from common import run_script

from pike.agents.offline import ALL, render
from pike.evaluate.verdict import slower_than_eager
from pike.solution_set import MANIFEST, SetEntry, SolutionSet, new_manifest
from pike.task import Task, load_tasks


def rendered_best(results: dict, tasks_dir: Path) -> list[tuple[Task, dict | None, str | None]]:
    """Every task of the folder in id order, its results row (None: not run) and the
    source its best transformation set renders to (None: no correct candidate). A name
    this checkout's offline agent does not know is refused: the file would be rendered
    without it and still carry the benchmark's figure."""
    rows = {r["task"]: r for r in results["rows"]}
    found = []
    for task in load_tasks(tasks_dir):
        row = rows.get(task.name)
        idea = (row or {}).get("offline_idea")
        names = tuple(n.strip() for n in idea.split("+")) if idea else None
        unknown = sorted(set(names or ()) - set(ALL))
        if unknown:
            raise SystemExit(f"{task.name}: the offline agent here has no transformation "
                             f"{', '.join(unknown)} (the results name '{idea}')")
        found.append((task, row, render(task.source, names) if names else None))
    return found


def _entry(task: Task, row: dict | None, source: str | None, results: dict,
           origin: str) -> SetEntry:
    base = {"task": task.name, "task_sha256": task.sha256}
    if row is None:
        return SetEntry(**base, status="no_candidates", detail=f"not run in {origin}")
    if source is None:
        if row.get("error"):
            return SetEntry(**base, status="error", detail=f"{origin}: {row['error']}")
        verdicts = row.get("verdicts") or {}
        if not verdicts:
            return SetEntry(**base, status="no_candidates", detail=f"none judged in {origin}")
        counts = ", ".join(f"{n} {s}" for s, n in sorted(verdicts.items()))
        return SetEntry(**base, status="failed",
                        detail=f"no correct candidate in {origin}: {counts}")
    settings = row.get("settings") or {}
    speedup = row.get("offline_speedup")
    if slower_than_eager(speedup):  # as pike's own sets: the reference is kept
        return SetEntry(**base, status="slower", detail=(
            f"'{row['offline_idea']}' ran at {speedup:.3g}x of eager in {origin}; the "
            "reference is kept, counted 1.0x"))
    over_modes = {mode: speedup / c["speedup"] for mode, c in (row.get("compile") or {}).items()
                  if speedup and c.get("speedup")}
    return SetEntry(
        **base, file=f"{task.name}.py", file_sha256=hashlib.sha256(source.encode()).hexdigest(),
        status="ok", speedup_vs_eager=speedup, compile_speedups=over_modes,
        detail=(f"'{row['offline_idea']}', its search-time figures from {origin}, rendered "
                "again by the offline agent of this set's checkout; task_sha256 is the task "
                "file's now (the results kept none)"),
        device=results.get("device", ""),
        device_name=settings.get("device_name") or results.get("device_name", ""),
        torch_version=settings.get("torch_version") or results.get("torch_version", ""),
        date=settings.get("date") or results.get("date", ""), source_run=origin)


def write(results_path: Path, tasks_dir: Path, out: Path) -> SolutionSet:
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise SystemExit(f"{out}: not an empty folder; write the set into a new one")
    results = json.loads(results_path.read_text())
    found = rendered_best(results, tasks_dir)
    left = sorted({r["task"] for r in results["rows"]} - {task.name for task, _, _ in found})
    if left:
        print(f"not in {tasks_dir}, left out: {', '.join(left)}", file=sys.stderr)
    out.mkdir(parents=True, exist_ok=True)
    entries = []
    for task, row, source in found:
        entry = _entry(task, row, source, results, str(results_path))
        if source is not None and entry.file:
            (out / entry.file).write_bytes(source.encode())  # as its sha256 was taken
        entries.append(entry)
    manifest = new_manifest(entries, str(results_path))
    (out / MANIFEST).write_text(manifest.model_dump_json(indent=2) + "\n")
    return manifest


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("offline_results", type=Path)
    p.add_argument("folder", type=Path)
    p.add_argument("out", type=Path)
    args = p.parse_args()
    manifest = write(args.offline_results, args.folder, args.out)
    rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                         text=True, check=False).stdout.strip()
    solved = sum(e.status == "ok" for e in manifest.tasks)
    print(f"{args.out}: {solved} of {len(manifest.tasks)} tasks with a file, claimed "
          f"{manifest.claimed_geomean:.2f}x over eager (search-time), rendered at {rev or '?'}",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    run_script(main)
