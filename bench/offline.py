"""One command per headline: the offline optimizer over a task folder with `pike bench`,
then its best files re-judged alone with `pike audit`.

    python bench/offline.py TASK_FOLDER --tag TAG [--ids 1,4,9] [--device cuda]
        [--jobs 4] [--workers 4] [--max-seconds 120] [--max-candidates 24]
        [--redo IDS] [--fill-baselines] [--no-audit] [--results DIR] [--config FILE]
        [--stop-after SECONDS] [--audit-devices cuda:0,cuda:1]

Runs `pike bench` with the offline strategy (no LLM) into DIR/offline-TAG-run/, then
`pike audit` of that campaign's solution set (DIR/offline-TAG-run/solutions), one task at
a time (or one per GPU of --audit-devices, each task alone on its GPU), into
DIR/offline-TAG-audit/, and writes DIR/offline-TAG.md and .json: the audit's
figures (the headline: failures count 1.0x) beside the search's own, with device, torch
version, date and every call's commands. DIR is bench/results unless --results says.
--config (a RunConfig YAML file: the evaluator's protocol, the baseline modes) applies to
both; the offline budget flags override its `search.offline`.

Cut off (Ctrl-C, `timeout -s INT`, a device call's limit), the same command goes on where
it stopped: the campaign with `pike bench --resume`, the audit with `pike audit
--resume`. `--redo IDS` and `--fill-baselines` pass to `pike bench --resume`; where a
task's file in the solution set changes, the audit judges that task again (`pike audit
--resume --redo`), baselines and file, and keeps the rest.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml
from common import RESULTS, geomean

from pike.solution_set import read_set

STATE = "state.json"  # beside the campaign: the calls so far and the set the audit judges


def _stopped_line(command: str, rc: int) -> str:
    """What to do next: a cut-off run goes on when run again; an error (a usage error, a
    missing folder: exit 2) would fail again until fixed."""
    if rc in _STOPPED or rc < 0:  # a signal ended it (a second SIGTERM, the OOM killer)
        return f"{command} stopped (exit {rc}); run the same command again to go on"
    return (f"{command} failed (exit {rc}): see its message above; once that is fixed, "
            "the same command goes on")


def main() -> int:
    started = time.monotonic()
    args = _arguments()
    run_dir, audit_dir = args.results / f"offline-{args.tag}-run", args.results / f"offline-{args.tag}-audit"
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    state = _state(run_dir)
    # a redo that a stopped call already made is not made again by the same command
    redo = args.redo if args.redo and state.get("redo_made") != args.redo else None
    rc = _run(_bench_command(args, run_dir, redo), state, run_dir)
    if redo or state.get("redo_made"):
        state["redo_made"] = args.redo if rc in _STOPPED or rc < 0 else None
        _save(run_dir, state)
    if rc != 0:
        print(_stopped_line("pike bench", rc), file=sys.stderr)
        return rc
    solutions = run_dir / "solutions"
    if not args.no_audit:
        held = _files_of(solutions)
        # a --redo changed some files: the audit judges those tasks again, the rest stays
        changed = _changed_ids(state.get("audited_files"), held)
        state["audited_files"] = held
        _save(run_dir, state)
        left = (max(0.0, args.stop_after - (time.monotonic() - started))
                if args.stop_after is not None else None)
        rc = _run(_audit_command(args, solutions, audit_dir, left, changed), state, run_dir)
        if rc != 0:
            print(_stopped_line("pike audit", rc), file=sys.stderr)
            return rc
    written = write_results(args.results / f"offline-{args.tag}", run_dir,
                            None if args.no_audit else audit_dir, state)
    print(f"wrote {written}")
    return 0


def _arguments() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("folder", type=Path, help="task folder (KernelBench files)")
    p.add_argument("--tag", required=True, help="names the results: offline-TAG.md")
    p.add_argument("--ids", default=None, help="only these task ids: 1,4,9")
    p.add_argument("--device", default="cuda")
    p.add_argument("--jobs", type=int, default=4, help="tasks searched at once")
    p.add_argument("--workers", type=int, default=4, help="evaluations at once per task")
    p.add_argument("--max-seconds", type=float, default=120.0, help="search budget per task")
    p.add_argument("--max-candidates", type=int, default=24, help="candidates per task at most")
    p.add_argument("--redo", default=None, metavar="IDS", help="run these tasks again")
    p.add_argument("--fill-baselines", action="store_true",
                   help="measure again the baselines that lack a mode or failed in one")
    p.add_argument("--no-audit", action="store_true", help="the campaign only")
    p.add_argument("--results", type=Path, default=RESULTS, help="where results are written")
    p.add_argument("--config", type=Path, default=None, help="RunConfig YAML for both steps")
    p.add_argument("--audit-devices", default=None, metavar="GPUS",
                   help="GPUs the audit spreads its tasks over, one task alone on each "
                   "(pike audit --devices); a later call may name others")
    p.add_argument("--stop-after", type=float, default=None,
                   help="nothing new starts after this many seconds, in the campaign (pike "
                   "bench --stop-after) or the audit after it (pike audit --stop-after, with "
                   "what is left): a device session's limit; the same command goes on")
    return p.parse_args()


# pike bench stopped after it began: its time limit (--stop-after), or Ctrl-C / SIGTERM
_STOPPED = (75, 130)


def _bench_command(args: argparse.Namespace, run_dir: Path, redo: str | None) -> list[str]:
    base = [sys.executable, "-m", "pike", "bench"]
    limit = ["--stop-after", str(args.stop_after)] if args.stop_after is not None else []
    if (run_dir / "run.sqlite").exists():
        extra = [*(["--redo", redo] if redo else []),
                 *(["--fill-baselines"] if args.fill_baselines else [])]
        return [*base, "--resume", str(run_dir), "--jobs", str(args.jobs),
                "--workers", str(args.workers), *extra, *limit]
    if args.redo or args.fill_baselines:
        sys.exit("--redo and --fill-baselines act on a campaign that has run: run without them first")
    config = run_dir.with_name(run_dir.name + "-config.yaml")
    settings = yaml.safe_load(args.config.read_text()) if args.config else {}
    search = settings.setdefault("search", {})
    search.setdefault("offline", {}).update(max_seconds=args.max_seconds,
                                            max_candidates=args.max_candidates)
    config.write_text(yaml.safe_dump(settings))
    return [*base, str(args.folder), *(["--tasks", args.ids] if args.ids else []),
            "--strategy", "offline", "--jobs", str(args.jobs), "--workers", str(args.workers),
            "--device", args.device, "--config", str(config), "--out", str(run_dir), *limit]


def _audit_command(args: argparse.Namespace, solutions: Path, audit_dir: Path,
                   stop_after: float | None = None, changed: list[int] | None = None
                   ) -> list[str]:
    base = [sys.executable, "-m", "pike", "audit"]
    extra = ["--devices", args.audit_devices] if args.audit_devices else []
    # what the campaign left of the call's time: no audited task starts after it
    extra += ["--stop-after", f"{stop_after:.0f}"] if stop_after is not None else []
    if (audit_dir / "run.sqlite").exists():
        redo = ["--redo", ",".join(map(str, changed))] if changed else []
        return [*base, "--resume", str(audit_dir), *redo, *extra]
    # one task at a time per GPU: nothing beside a timed window but what the evaluator
    # itself runs
    return [*base, str(solutions), str(args.folder), *(["--tasks", args.ids] if args.ids else []),
            "--device", args.device, "--workers", "1", *extra, "--out", str(audit_dir),
            *(["--config", str(args.config)] if args.config else [])]


def _run(command: list[str], state: dict[str, Any], run_dir: Path) -> int:
    """Run a pike command, recorded in the state first; Ctrl-C (or SIGINT/SIGTERM from a
    time limit) reaches it as Ctrl-C, so it stops cleanly and keeps what it judged."""
    shown = " ".join(["pike", *command[3:]])
    state.setdefault("calls", []).append({"date": _now(), "command": shown})
    _save(run_dir, state)
    print(f"$ {shown}", flush=True)
    child = subprocess.Popen(command)

    def forward(signum: int, _frame: Any) -> None:
        child.send_signal(signal.SIGINT)

    before = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        return child.wait()
    finally:
        for s, handler in before.items():
            signal.signal(s, handler)


def write_results(stem: Path, run_dir: Path, audit_dir: Path | None,
                  state: dict[str, Any]) -> Path:
    """stem.json and stem.md from the campaign's summary and store and the audit's JSON."""
    summary = json.loads((run_dir / "summary.json").read_text())["tasks"]
    audited = (json.loads((audit_dir / "audit.json").read_text())
               if audit_dir is not None else None)
    rows = [_row(s, audited) for s in summary]
    data = {"benchmark": "offline", "run_dir": str(run_dir),
            "audit_dir": str(audit_dir) if audit_dir else None,
            "calls": state.get("calls", []), "rows": rows,
            "search_geomean": geomean([r["search_speedup"] or 1.0 for r in rows]),
            "audit": (audited or {}).get("aggregates"),
            "device_name": (audited or {}).get("device_name"),
            "torch_version": (audited or {}).get("torch_version"),
            "audit_date": (audited or {}).get("date")}
    stem.with_suffix(".json").write_text(json.dumps(data, indent=2))
    stem.with_suffix(".md").write_text(_markdown(stem.name, data, audit_dir))
    return stem.with_suffix(".md")


def _row(searched: dict[str, Any], audited: dict[str, Any] | None) -> dict[str, Any]:
    task = searched["task"]
    mine = next((t for t in (audited or {}).get("tasks", []) if t["task"] == task), None)
    compile_speedups = (mine or {}).get("compile_speedups") or {}
    working = [v for v in compile_speedups.values() if v]
    return {"task": task, "judged": sum((searched.get("verdicts") or {}).values()),
            "search_speedup": searched.get("speedup"), "error": searched.get("error"),
            "audit_status": (mine or {}).get("status"),
            "audit_speedup": (mine or {}).get("speedup"),
            "audit_withheld": (mine or {}).get("withheld") or "",
            # over the task's fastest compile mode, as the audit measured it
            "over_best_compile": min(working) if working else None}


def _markdown(name: str, data: dict[str, Any], audit_dir: Path | None) -> str:
    aggregates = data["audit"] or {}
    lines = [f"# {name}: the offline optimizer, then its files audited alone", ""]
    if data["device_name"]:
        lines.append(f"- audit: {data['device_name']}, torch {data['torch_version']}, "
                     f"{data['audit_date']}")
    lines += [f"- campaign: `{data['run_dir']}` (`pike show`, `pike report` read it); "
              f"its solution set: `{data['run_dir']}/solutions`",
              "- calls, in order:", *(f"  - {c['date']}: `{c['command']}`" for c in data["calls"]),
              ""]
    if aggregates:
        lines += ["**Audited (the figure to quote)**: "
                  f"{_x(aggregates.get('geomean_all'))} over eager over all "
                  f"{aggregates.get('tasks')} tasks, failures as 1.0x; "
                  f"{_x((aggregates.get('best_compile') or {}).get('geomean'))} over each task's fastest "
                  f"torch.compile mode; {aggregates.get('correct')} correct, "
                  f"{aggregates.get('failed')} failed, {aggregates.get('missing')} missing.", ""]
    lines += [f"The search's own confirmed figures (not an audit): "
              f"{_x(data['search_geomean'])} over eager.", "",
              "| task | judged | search (confirmed) | audit | audit over eager | "
              "audit over fastest compile mode |", "|---|---|---|---|---|---|"]
    for r in data["rows"]:
        lines.append(f"| {r['task']} | {r['judged']} | {_x(r['search_speedup'])} | "
                     f"{r['audit_status'] or r['error'] or '-'} | {_x(r['audit_speedup'])} | "
                     f"{_x(r['over_best_compile'])} |")
    if audit_dir is not None:
        lines += ["", f"The audit's own report: `{audit_dir}/audit.md`."]
    return "\n".join(lines) + "\n"


def _x(value: float | None) -> str:
    return f"{value:.2f}x" if value else "-"


def _files_of(solutions: Path) -> dict[str, list[str]]:
    """What the set holds (each task's file and task checksums), not when it was written."""
    return {e.task: [e.task_sha256, e.file_sha256] for e in read_set(solutions).tasks}


def _changed_ids(before: object, now: dict[str, list[str]]) -> list[int]:
    """The ids of the tasks whose entry differs from what the audit judged before (none
    where it judged nothing yet, or recorded the whole set's checksum only, as before
    2026-12-02: such an audit is resumed as it is)."""
    if not isinstance(before, dict):
        return []
    return sorted(int(task.split("_", 1)[0]) for task, entry in now.items()
                  if before.get(task) != entry and task.split("_", 1)[0].isdigit())


def _state(run_dir: Path) -> dict[str, Any]:
    path = run_dir.with_name(run_dir.name + "-" + STATE)
    return json.loads(path.read_text()) if path.exists() else {}


def _save(run_dir: Path, state: dict[str, Any]) -> None:
    run_dir.with_name(run_dir.name + "-" + STATE).write_text(json.dumps(state, indent=2))


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


if __name__ == "__main__":
    sys.exit(main())
