"""How far each task is from its GPU's floor: FLOPs, bytes, the floor, and eager, each
torch.compile mode and (with --offline) the offline strategy's best as multiples of it.

    python bench/floor.py TASK_FOLDER [--ids 1,4,9] [--device cuda] [--offline]
        [--modes none] [--offline-results bench/results/offline-level3-pike.json]
        [--max-candidates 16] [--max-seconds 300] [--jobs 4] [--tag level3-pike] [--resume]
    python bench/floor.py TASK_FOLDER --remerge --offline-results FILE [--tag level3-pike]
    python bench/floor.py TASK_FOLDER --recount [--tag level3-pike]

Per task: `measure_baselines` (eager and each compile mode, timed in one window; the
FLOPs and bytes counted in the reference's child), the eager profile's top three kernels
(`profile_reference`), and with --offline the offline strategy's best verdict. Results are
rewritten after every task (a run cut off keeps what it finished; --resume skips those).
`--jobs` tasks run at once in threads: children start, count and profile side by side,
while timing stays exclusive per device (the evaluator's device lock).
`--modes none --offline-results FILE` skips compiling here: the compile modes and the
offline best come from an offline benchmark's speedups over eager (ratios measured in
their own windows), applied to this run's eager time, in columns marked as such.
Writes bench/results/floor-<tag>.json and .md with device, torch version, date, command.
`--remerge --offline-results FILE` measures nothing and needs no GPU: it drops the merged
columns of the existing floor-<tag>.json and merges them again from FILE (a later offline
benchmark), keeping the measurement's rows, device, date and command.
`--recount` measures nothing either: it counts each task's FLOPs and bytes again here (on
the meta device, else the CPU) with the current pike.floor, and scales every multiple of
the floor by old floor / new floor (the measured times stay as they were).
"""

from __future__ import annotations

import argparse
import json
import platform
import re
import shutil
import time
from pathlib import Path

import torch
from common import (
    apply_modes,
    device_name,
    folder_arguments,
    geomean,
    modes_argument,
    notes_section,
    now,
    run_config,
    run_script,
    task_ids,
    this_command,
)

from pike.config import RunConfig
from pike.errors import PikeError
from pike.evaluate import measure_baselines
from pike.evaluate.judge import profile_reference
from pike.floor import count_work_cheaply, describe, floor
from pike.search import optimize
from pike.task import Task, load_tasks
from pike.threads import run_each

ROOT = Path(__file__).resolve().parent.parent


MERGED = " (offline bench)"  # a column taken from bench/offline.py's results


def merge_offline(row: dict, earlier: dict | None) -> None:
    """Multiples of the floor for the compile modes and the offline best from an offline
    benchmark's row of the same task: its speedups (each a ratio to eager in its own
    window) applied to this run's eager time."""
    eager_ms, floor_ms = row.get("modes_ms", {}).get("eager"), row.get("floor_ms")
    if not earlier or not eager_ms or not floor_ms:
        return
    # a compile entry may carry more than its speedup (an error, "filled": {...}); one
    # without a speedup (failed, timed out, never judged) adds no column
    speedups = {mode: v.get("speedup") for mode, v in (earlier.get("compile") or {}).items()
                if isinstance(v, dict)}
    speedups["offline"] = earlier.get("offline_speedup")
    for mode, speedup in speedups.items():
        if speedup:
            row["modes_x_floor"][mode + MERGED] = eager_ms / speedup / floor_ms


def one_task(task: Task, cfg: RunConfig, offline: bool, runs: Path) -> dict:
    started = time.monotonic()
    row: dict = {"task": task.name}
    try:
        base = measure_baselines(task, cfg, cfg.search.baseline_modes)
    except PikeError as err:
        return {**row, "error": f"baseline: {err}"}
    fl = base.floor
    row.update(flops=base.work.flops if base.work else None,
               bytes_min=base.work.bytes_min if base.work else None,
               floor_ms=fl.ms if fl else None, bound=fl.bound if fl else None,
               lowp_floor_ms=fl.lowp_ms if fl else None, no_floor=base.no_floor,
               work_notes=base.work.notes if base.work else [])
    row["modes_ms"] = {m.mode: m.stats.median_ms for m in base.modes if m.stats}
    row["modes_x_floor"] = ({mode: ms / fl.ms for mode, ms in row["modes_ms"].items()}
                            if fl and fl.ms > 0 else {})
    eager_ms = row["modes_ms"].get("eager")
    row["describe"] = describe(fl, eager_ms) if fl else f"no floor: {base.no_floor}"
    try:
        profile = profile_reference(task, cfg.eval)
    except PikeError as err:
        profile = None
        row["profile_error"] = str(err)
    if profile is not None:
        top = profile.top_kernels or profile.top_ops
        row["eager_top3"] = [{"name": k.name, "ms_per_call": k.ms_per_call, "share": k.share}
                             for k in top[:3]]
        row["eager_launches_per_call"] = profile.kernel_launches_per_call
    if offline:
        try:
            shutil.rmtree(runs / task.name, ignore_errors=True)  # a failed task's earlier run
            result = optimize(task, cfg, out=runs / task.name)
            v = result.best_verdict
            if v is not None and v.ok and v.runtime is not None:
                row["offline_ms"] = v.runtime.median_ms
                row["offline_speedup"] = v.speedup
                if fl and fl.ms > 0:
                    row["modes_x_floor"]["offline"] = v.runtime.median_ms / fl.ms
        except Exception as err:  # one task's failure must not end the benchmark
            row["offline_error"] = f"{type(err).__name__}: {err}"[:300]
    row["seconds"] = round(time.monotonic() - started, 1)
    return row


def offline_rows(path: Path | None) -> dict[str, dict]:
    """bench/offline.py's rows by task name (none without a file)."""
    return {r["task"]: r for r in json.loads(path.read_text())["rows"]} if path else {}


MEASURED = ("device", "device_name", "torch_version", "host", "date", "command")


def task_order(name: str) -> tuple[bool, int, str]:
    """KernelBench order: by the number a task's name starts with."""
    number = re.match(r"(\d+)_", name)
    return number is None, int(number.group(1)) if number else 0, name


def measured_here(device: str) -> dict:
    """The fields of MEASURED for a measurement made by this call on `device`."""
    return {"device": device, "device_name": device_name(device),
            "torch_version": torch.__version__, "host": platform.node(), "date": now(),
            "command": this_command()}


def summary(rows: list[dict], measured: dict, pending: list[str],
            earlier_calls: list[str]) -> dict:
    """The results file: `measured` (where, when and by what command the rows were
    measured), the rows and each mode's geomean distance to the floor."""
    modes = sorted({m for r in rows for m in r.get("modes_x_floor", {})})
    per_mode = {m: [r for r in rows if m in r.get("modes_x_floor", {})] for m in modes}
    return {
        "benchmark": "floor", **measured, "earlier_calls": earlier_calls,
        "rows": rows, "not_run": pending,
        # the distance to the floor per mode, over the tasks that have a floor
        "geomean_x_floor": {m: geomean([r["modes_x_floor"][m] for r in per_mode[m]])
                            for m in modes},
        "tasks_x_floor": {m: len(per_mode[m]) for m in modes},
        # Modes cover different tasks (a merged column only where the offline bench ran):
        # eager over each mode's own tasks is the fair comparison.
        "geomean_eager_x_floor_same_tasks": {
            m: geomean([r["modes_x_floor"]["eager"] for r in per_mode[m]
                        if "eager" in r["modes_x_floor"]]) for m in modes if m != "eager"},
    }


def remerged_row(row: dict, earlier: dict | None) -> dict:
    """The row without its merged columns, merged again from `earlier` (an offline
    benchmark's row of the task); a failed row stays as it was."""
    if "error" in row:
        return row
    kept = {m: x for m, x in row.get("modes_x_floor", {}).items() if not m.endswith(MERGED)}
    row = {**row, "modes_x_floor": kept}
    merge_offline(row, earlier)
    return row


def remerge(before: dict, offline_results: Path, command: str) -> dict:
    """A floor results file whose merged columns come from `offline_results` instead:
    the measurement (rows, device, date, command) stays; nothing is measured again."""
    earlier = offline_rows(offline_results)
    rows = [remerged_row(r, earlier.get(r["task"])) for r in before["rows"]]
    result = summary(rows, {k: before.get(k) for k in MEASURED}, before.get("not_run", []),
                     before.get("earlier_calls", []))
    result["remerged"] = {"command": command, "date": now(),
                          "offline_results": str(offline_results)}
    # anything else the measured file said (a note on how it came about) stays with it
    return {**{k: v for k, v in before.items() if k not in result}, **result}


def recounted_row(row: dict, task: Task, device_name: str) -> dict:
    """The row with FLOPs, bytes and floor counted again by this pike.floor, its measured
    times kept and their multiples of the floor rescaled; a failed row stays as it was."""
    if "error" in row or not row.get("floor_ms"):
        return row
    row = {k: v for k, v in row.items() if k != "recount_error"}  # from an earlier recount
    try:
        # real arithmetic on the GPU where there is one: some dtypes have no CPU kernels
        work = count_work_cheaply(task, "cuda" if torch.cuda.is_available() else "cpu")
    except Exception as err:  # e.g. a task that needs CUDA, recounted on a CPU machine
        return {**row, "recount_error": str(err)[:300]}
    fl = floor(work, device_name)
    if fl is None or fl.ms <= 0:
        return {**row, "recount_error": f"no floor for {device_name}"}
    # Other FLOPs mean the task built something else here than on the device (code that
    # branches on the device, say). The compute floor may differ with the same FLOPs: the
    # floor's model has learnt since some rows were written (fp32 convolutions at the TF32
    # peak, as cuDNN runs them), and a recount is how a results file takes that up.
    if work.flops != row.get("flops"):
        return {**row, "recount_error": f"counted here: {work.flops} FLOPs, on the device: "
                f"{row.get('flops')} FLOPs; count again on the device"}
    # a row keeps no dtype; a compute-bound fp32 row's floor is above its tensor-core one
    # and a half-precision row's is not: the dtype class counted here must say the same
    if row.get("bound") == "compute" and row.get("lowp_floor_ms") and fl.bound == "compute" \
            and (row["floor_ms"] > 1.01 * row["lowp_floor_ms"]) != (fl.ms > 1.01 * fl.lowp_ms):
        return {**row, "recount_error": f"counted here as {work.dtype}, which the device's "
                "floor does not match; count again on the device"}
    scale = row["floor_ms"] / fl.ms
    eager_ms = row.get("modes_ms", {}).get("eager")
    return {**row, "flops": work.flops, "bytes_min": work.bytes_min, "floor_ms": fl.ms,
            "bound": fl.bound, "lowp_floor_ms": fl.lowp_ms, "work_notes": work.notes,
            "modes_x_floor": {m: x * scale for m, x in row.get("modes_x_floor", {}).items()},
            "describe": describe(fl, eager_ms)}


def recount(before: dict, tasks: dict[str, Task], command: str) -> dict:
    """A floor results file with every row's work counted again (see recounted_row)."""
    rows = [recounted_row(r, tasks[r["task"]], before["device_name"]) if r["task"] in tasks
            else r for r in before["rows"]]
    result = summary(rows, {k: before.get(k) for k in MEASURED}, before.get("not_run", []),
                     before.get("earlier_calls", []))
    result["recounted"] = {"command": command, "date": now(),
                           "not_recounted": [r["task"] for r in rows if "recount_error" in r]}
    return {**{k: v for k, v in before.items() if k not in result}, **result}


def write_results(result: dict, json_path: Path, md_path: Path) -> None:
    json_path.write_text(json.dumps(result, indent=2))
    md_path.write_text(markdown(result))


def _remerged_line(result: dict) -> list[str]:
    lines = []
    again = result.get("remerged")
    if again:
        lines.append(f"- merged columns (\"{MERGED.strip()}\") re-merged from "
                     f"{again['offline_results']} on {again['date']} by `{again['command']}` "
                     "(no new measurement)")
    counted = result.get("recounted")
    if counted:
        lines.append(f"- FLOPs, bytes and floors counted again on {counted['date']} by "
                     f"`{counted['command']}` (pike.floor counting only what the forward "
                     "reads; measured times unchanged, multiples of the floor rescaled)")
        if counted.get("not_recounted"):
            lines.append("- not counted again (their floors may count bytes the forward "
                         f"never reads): {', '.join(counted['not_recounted'])}")
        lines += [f"- {n}" for n in counted.get("notes", [])]  # written by hand
    return lines


def _geomeans(result: dict) -> str:
    counts = result.get("tasks_x_floor", {})
    same = result.get("geomean_eager_x_floor_same_tasks", {})
    parts = []
    for mode, g in result["geomean_x_floor"].items():
        if not g:
            continue
        text = f"{mode} {g:.3g}x"
        if mode in counts:
            text += f" over {counts[mode]} tasks"
        if same.get(mode):
            text += f" (eager {same[mode]:.3g}x on those)"
        parts.append(text)
    return "; ".join(parts)


def markdown(result: dict) -> str:
    modes = list(result["geomean_x_floor"])
    lines = [f"# Distance to the floor ({result['device_name']})", "",
             f"- device: {result['device']}, torch {result['torch_version']}, "
             f"host {result['host']}", f"- date: {result['date']}",
             f"- command: `{result['command']}`",
             *[f"- earlier call: `{c}`" for c in result.get("earlier_calls", [])],
             *_remerged_line(result), "",
             "Runtime as a multiple of the floor (max of FLOPs at the task dtype's peak, an "
             "fp32 task's convolutions at the TF32 peak as cuDNN runs them, and minimum bytes "
             "at the memory bandwidth; pike.floor). Geomean over tasks with a "
             "floor: " + (_geomeans(result) or "none (no floor on this device)") + ".", "",
             "| " + " | ".join(["task", "GFLOP", "MB", "floor", "bound", *modes,
                                "eager top kernels"]) + " |", "|---" * (6 + len(modes)) + "|"]
    for r in result["rows"]:
        if "error" in r:
            why = re.sub(r"\S+\.py: ", "", r["error"])[:120]  # the path says nothing here
            lines.append(f"| {r['task']} | failed: {why} |" + " |" * (4 + len(modes)))
            continue
        floor = f"{r['floor_ms'] * 1e3:.3g} us" if r.get("floor_ms") else "-"
        gflop = f"{r['flops'] / 1e9:.3g}" if r.get("flops") is not None else "-"
        mb = f"{r['bytes_min'] / 1e6:.3g}" if r.get("bytes_min") is not None else "-"
        cells = [f"{r['modes_x_floor'][m]:.3g}x" if m in r.get("modes_x_floor", {}) else "-"
                 for m in modes]
        top = "; ".join(f"{k['name'][:40]} {k['share']:.0%}" for k in r.get("eager_top3", []))
        lines.append("| " + " | ".join([r["task"], gflop, mb, floor, r.get("bound") or "-",
                                        *cells, top or "-"]) + " |")
    if result["not_run"]:
        lines += ["", f"Not run: {', '.join(result['not_run'])}."]
    lines += notes_section(result)
    return "\n".join(lines) + "\n"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    folder_arguments(p, max_candidates=16, max_seconds=300)
    p.add_argument("--offline", action="store_true", help="also run the offline strategy")
    p.add_argument("--jobs", type=int, default=1, help="tasks at once (timing stays exclusive)")
    modes_argument(p)
    p.add_argument("--offline-results", type=Path, default=None,
                   help="bench/offline.py's JSON: add its compile and offline speedups as "
                        f"columns marked '{MERGED.strip()}' instead of compiling here")
    p.add_argument("--recount", action="store_true",
                   help="measure nothing: count FLOPs and bytes again here and rescale the "
                        "existing floor-<tag>.json's multiples of the floor (no GPU needed)")
    p.add_argument("--remerge", action="store_true",
                   help="measure nothing: merge the existing floor-<tag>.json's columns "
                        "again from --offline-results (no GPU needed)")
    args = p.parse_args()
    tag = args.tag or args.folder.name
    json_path, md_path = args.out / f"floor-{tag}.json", args.out / f"floor-{tag}.md"
    if args.recount:
        by_name = {t.name: t for t in load_tasks(args.folder, task_ids(args))}
        result = recount(json.loads(json_path.read_text()), by_name, this_command())
        write_results(result, json_path, md_path)
        print(md_path.read_text())
        return 0
    if args.remerge:
        if not args.offline_results:
            p.error("--remerge needs --offline-results")
        result = remerge(json.loads(json_path.read_text()), args.offline_results,
                         this_command())
        write_results(result, json_path, md_path)
        print(md_path.read_text())
        return 0
    cfg = run_config(args)
    apply_modes(args, cfg)
    cfg.eval.profile_calls = 5
    earlier = offline_rows(args.offline_results)
    tasks = load_tasks(args.folder, task_ids(args))
    rows: list[dict] = []
    earlier_calls: list[str] = []
    not_run_before: list[str] = []  # tasks an earlier call left out, outside this --ids
    notes: list[str] = []  # written by hand into the results file; kept
    if args.resume and json_path.exists():
        before = json.loads(json_path.read_text())
        # a failed task runs again when this call selects it; one it does not select keeps
        # its failure on record
        selected = {t.name for t in tasks}
        rows = [r for r in before["rows"] if "error" not in r or r["task"] not in selected]
        not_run_before = before.get("not_run", [])
        notes = before.get("notes", [])
        earlier_calls = [*before.get("earlier_calls", []),
                         *([before["command"]] if before.get("command") else [])]
    args.out.mkdir(parents=True, exist_ok=True)
    # the offline searches' stores and best files, kept beside the figures they give
    # (a temp dir here was left behind by every call, and took the files with it)
    runs = args.out / f"floor-{tag}-runs"
    todo = [t for t in tasks if not any(r["task"] == t.name for r in rows)]
    not_run = list(dict.fromkeys([*not_run_before, *(t.name for t in tasks)]))

    def measured(task: Task) -> dict:
        print(f"{task.name} ...", flush=True)
        row = one_task(task, cfg, args.offline, runs)
        merge_offline(row, earlier.get(task.name))
        return row

    for row in run_each(measured, todo, args.jobs, "floor-task"):
        rows.append(row)
        rows.sort(key=lambda r: task_order(r["task"]))
        print(json.dumps(row), flush=True)
        done = {r["task"] for r in rows}
        result = summary(rows, measured_here(args.device),
                         [name for name in not_run if name not in done], earlier_calls)
        write_results({**result, **({"notes": notes} if notes else {})}, json_path, md_path)
    print(md_path.read_text() if md_path.exists() else "no task ran")
    return 0


if __name__ == "__main__":
    run_script(main)
