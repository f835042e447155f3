"""Where each level stands against #26's goals, from its committed audit: the audited
geomeans against the goal, and per task how far it pulls the figure below the goal, what
holds it back and how far its file and eager are from the task's floor.

    python bench/goal_gap.py [--audit LEVEL=AUDIT_JSON ...] [--out DIR]

Reads audits only (`pike audit` writes audit.json): nothing is measured again. Without
--audit it reads the audits the README's headline rows quote. Writes DIR/goal-gap.md and
.json (DIR: bench/results), with the date and command.

A task's share of a goal's gap: the amount its figure lies below the goal on the log
scale, over the sum of that amount for every task below the goal. A task without a
correct file counts 1.0x over eager and over its fastest compile mode, as the audit
counts it; a task with no compile mode that ran correctly stays out of that geomean.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from common import RESULTS, geomean, now, run_script, this_command, with_ext

from pike.audit import AuditResult
from pike.audit.result import TaskAudit

# issue #26's goals for the audited figures on the H100: over eager and over each task's
# fastest torch.compile mode (geomeans over the level's tasks)
GOALS: dict[str, dict[str, float]] = {
    "level3-pike": {"eager": 3.0, "compile": 1.8},
    "level5": {"eager": 2.6},
    "level2": {"compile": 1.25},
    "level1": {"compile": 1.25},
}
AUDITS = {
    "level3-pike": RESULTS / "audit-level3-pike-set-h200-all.json",
    "level5": RESULTS / "audit-level5-set-h100.json",
    "level2": RESULTS / "audit-level2-h100-spread-set.json",
    "level1": RESULTS / "audit-level1-h100-set-combined" / "audit.json",
}
NEAR_FLOOR = 1.5  # a file within this of its floor has little left at its precision


def over_fastest_mode(task: TaskAudit) -> float | None:
    """The task's figure over its fastest compile mode, as the audit counts it."""
    if task.ok:
        mode = task.fastest_compile_mode()
        return task.compile_speedups[mode] if mode else None
    return 1.0 if task.status == "missing" else None


def holds_back(task: TaskAudit) -> str:
    if task.status == "missing":
        return f"no file: {task.message}" if task.message else "no file"
    if not task.ok:
        return f"{task.status}: {task.message}"[:200]
    said = []
    mode = task.fastest_compile_mode()
    if mode and task.compile_speedups[mode] < 1.0:
        again = " (the file is that mode, built again)" if task.is_its_fastest_compile_mode() else ""
        said.append(f"below {mode.removeprefix('compile:')}{again}")
    if task.times_floor is not None and task.times_floor <= NEAR_FLOOR:
        said.append(f"within {NEAR_FLOOR}x of its floor: little left at this precision")
    if task.unsteady():
        said.append("unsteady timings")
    if not mode:
        said.append("no compile mode ran correctly to compare with")
    if not said and task.times_floor is not None:
        said.append(f"{task.times_floor:.3g}x its floor: room left")
    return "; ".join(said)


def level_gap(level: str, path: Path) -> dict:
    result = AuditResult.model_validate_json(path.read_text())
    agg = result.aggregates
    audited = {"eager": agg.geomean_all,
               "compile": agg.best_compile.geomean if agg.best_compile else None}
    figures = {"eager": {t.task: t.counted_speedup() for t in result.tasks},
               "compile": {t.task: v for t in result.tasks
                           if (v := over_fastest_mode(t)) is not None}}
    goals = []
    for what, goal in GOALS[level].items():
        values = figures[what]
        below = {name: math.log(goal / v) for name, v in values.items() if v < goal}
        total = sum(below.values())
        goals.append({"over": what, "goal": goal, "audited": audited[what],
                      "recomputed": geomean(list(values.values())), "met": (audited[what] or 0) >= goal,
                      "tasks": len(values),
                      "share": {name: d / total for name, d in below.items()} if total else {}})
    rows = [{"task": t.task, "status": t.status, "over_eager": t.counted_speedup(),
             "over_fastest_mode": over_fastest_mode(t), "fastest_mode": t.fastest_compile_mode(),
             "times_floor": t.times_floor, "eager_times_floor": t.eager_times_floor,
             "floor_is_lowp": t.floor_is_lowp, "holds_back": holds_back(t)}
            for t in result.tasks]
    return {"level": level, "audit": _shown(path), "device": result.device_name,
            "torch_version": result.torch_version, "date": result.date, "goals": goals,
            "below_fastest_mode": list(agg.below_best_compile), "tasks": rows}


def _shown(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(RESULTS.resolve().parent.parent))
    except ValueError:
        return str(path)


def _x(v: float | None) -> str:
    return f"{v:.3g}x" if v is not None else "-"


def markdown(data: dict) -> str:
    lines = ["# #26's goals against the committed audits", "",
             f"- written {data['date']} by `{data['command']}` (reads the audits, measures "
             "nothing)", "- goals (issue #26, audited figures on the H100): "
             + "; ".join(f"{lv}: " + ", ".join(f"{g}x over {w}" for w, g in gs.items())
                         for lv, gs in GOALS.items()), ""]
    for lv in data["levels"]:
        lines += [f"## {lv['level']}", "",
                  f"Audit: `{lv['audit']}` ({lv['device']}, torch {lv['torch_version']}, "
                  f"{lv['date']}).", ""]
        for g in lv["goals"]:
            state = "met" if g["met"] else "**not met**"
            lines.append(f"- over {g['over']}: audited **{_x(g['audited'])}** against "
                         f"{g['goal']}x, {state} ({g['tasks']} tasks)")
        if "compile" in GOALS[lv["level"]]:
            lines.append(f"- files below their fastest compile mode: "
                         f"{len(lv['below_fastest_mode'])} ({', '.join(lv['below_fastest_mode']) or 'none'})")
        shares = {g["over"]: g["share"] for g in lv["goals"]}
        lines += ["", "| task | verdict | over eager | over fastest compile mode | share of "
                  "the gap | file × floor (eager) | what holds it back |",
                  "| --- | --- | --- | --- | --- | --- | --- |"]
        order = sorted(lv["tasks"], key=lambda r: -max(
            [s.get(r["task"], 0.0) for s in shares.values()] or [0.0]))
        for r in order:
            share = ", ".join(f"{w} {100 * s[r['task']]:.0f}%" for w, s in shares.items()
                              if r["task"] in s) or "-"
            floor = (f"{r['times_floor']:.3g}{' tensor-core' if r['floor_is_lowp'] else ''}"
                     if r["times_floor"] is not None else "-")
            if r["eager_times_floor"] is not None:
                floor += f" ({r['eager_times_floor']:.3g})"
            mode = (f"{_x(r['over_fastest_mode'])}"
                    + (f" ({r['fastest_mode'].removeprefix('compile:')})" if r["fastest_mode"] else ""))
            lines.append(f"| {r['task']} | {r['status']} | {_x(r['over_eager'])} | {mode} | "
                         f"{share} | {floor} | {r['holds_back']} |")
        lines.append("")
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--audit", action="append", default=[], metavar="LEVEL=AUDIT_JSON",
                   help=f"an audit to read for a level ({', '.join(GOALS)}); default: "
                   "the README's")
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args()
    audits = dict(AUDITS)
    for item in args.audit:
        level, _, path = item.partition("=")
        if level not in GOALS or not path:
            p.error(f"--audit {item}: LEVEL=AUDIT_JSON, LEVEL one of {', '.join(GOALS)}")
        audits[level] = Path(path)
    data = {"benchmark": "goal-gap", "date": now(), "command": this_command(),
            "levels": [level_gap(level, path) for level, path in audits.items()]}
    stem = args.out / "goal-gap"
    args.out.mkdir(parents=True, exist_ok=True)
    with_ext(stem, ".json").write_text(json.dumps(data, indent=2))
    with_ext(stem, ".md").write_text(markdown(data))
    for lv in data["levels"]:
        for g in lv["goals"]:
            print(f"{lv['level']}: over {g['over']} {_x(g['audited'])} against {g['goal']}x "
                  f"({'met' if g['met'] else 'not met'})")
    return 0


if __name__ == "__main__":
    run_script(main)
