"""The offline strategy over a folder of tasks, against eager and every torch.compile mode.

    python bench/offline.py TASK_FOLDER [--ids 1,4,9] [--device cuda] [--jobs 3] [--workers 8]
        [--max-candidates 24] [--max-seconds 900] [--start-before 120] [--tag level3-pike]
        [--resume]
        [--baselines offline|separate] [--fill-compile --resume] [--redo 43,44 --resume]

For each task the offline strategy (`pike optimize` without an LLM) runs with every
candidate judged by the evaluator. Its first round judges each transformation alone, the
torch.compile modes among them, each against eager in one window: those are the compile
baselines (`--baselines offline`, the default). `--baselines separate` times eager and the
compile modes once more with `pike baseline` first (costs a second compile of each mode).

Tasks run in `--jobs` processes at once: trials and compiles overlap, timing takes the
GPU alone (pike.evaluate.device_lock). Within a task, `--workers` candidates of a round are
evaluated at once by the evaluation pool: their compiles (torch.compile compiles in the
warm-up call, before the device lock) overlap. The first round's candidates go in the order
the offline agent ranks transformations on CUDA (graphs, then the three compile modes); the
first `--workers` start at once and a started candidate always finishes, so `--workers 4`
or more guarantees every compile baseline is judged even when the task's time budget runs
out. `--start-before S` starts no task after
S seconds, so a call with a wall-clock limit ends with whole tasks.
`--fill-compile --resume` judges again the compile baselines of finished tasks that have no
verdict of their own: modes never judged, and modes that timed out or ran out of memory
while other jobs compiled beside them (the pool's default limits); each alone per task,
with the limits of --fill-limit, the compile in its warm-up beside other tasks' compiles
while timing stays exclusive. A mode found incorrect keeps that verdict. A task that cannot be loaded or run is reported with
its error and the run goes on. Results are rewritten after every task, so a run cut off
keeps what it finished and `--resume` skips those tasks. `--redo IDS --resume` runs those
tasks again: each keeps its old row until its new one is in (a failed redo keeps it, with
`redo_error`), and a later `--resume` goes on with those not yet run again. Writes
bench/results/offline-<tag>.json and .md with device, torch version, date, command,
per-task rows and geomeans, and bench/results/offline-<tag>-set/: each finished task's
best file as a solution set (`pike audit` takes it as it is), updated task by task.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import copy
import datetime as dt
import json
import multiprocessing
import platform
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import torch
from common import (
    device_name,
    folder_arguments,
    geomean,
    now,
    run_config,
    run_script,
    stop_children,
    task_ids,
    this_command,
)

from pike.agents.offline import render
from pike.config import COMPILE_MODES, RunConfig
from pike.errors import PikeError
from pike.evaluate import BASELINE_MODES, measure_baselines
from pike.evaluate.pool import LocalPool
from pike.search import optimize
from pike.solution_set import update_set
from pike.store import RunStore
from pike.task import Task, load_tasks
from pike.threads import run_each

ROOT = Path(__file__).resolve().parent.parent


def _compile_from_offline(store: RunStore, task: str) -> dict[str, dict]:
    modes = {}
    for row in store.candidates(task):
        if row.role == "offline" and row.idea.startswith("compile:") and " + " not in row.idea:
            v = row.verdict
            modes[row.idea] = {"speedup": v.speedup if v and v.ok else None,
                               "error": None if v and v.ok else
                               (f"{v.status}: {v.message[:200]}" if v else "not judged")}
    return modes


def one_task(task: Task, cfg: RunConfig, runs: Path, baselines: str) -> dict:
    row: dict = {"task": task.name}
    started = time.monotonic()
    if baselines == "separate":
        try:
            base = measure_baselines(task, cfg, BASELINE_MODES)
        except PikeError as err:
            return {**row, "error": f"baseline: {err}"}
        row["compile"] = {m.mode: {"speedup": m.speedup_vs_eager, "error": m.error}
                          for m in base.modes if m.mode != "eager"}
    try:
        result = optimize(task, cfg, out=runs / task.name)
    except Exception as err:  # one task's failure must not end the benchmark
        return {**row, "error": f"offline: {err}", "trace": traceback.format_exc()[-1500:]}
    store = RunStore.open(runs / task.name)
    try:
        if baselines == "offline":
            row["compile"] = _compile_from_offline(store, task.name)
        best = store.best(task.name)
        reference = next((r.verdict.reference for r in store.candidates(task.name)
                          if r.verdict and r.verdict.reference), None)
    finally:
        store.close()
    row["eager_ms"] = reference.median_ms if reference else None
    v = result.best_verdict
    row.update(offline_idea=None, offline_speedup=None, offline_ms=None,
               verdicts=result.verdicts)
    if v is not None and v.ok:
        row.update(offline_speedup=v.speedup, offline_ms=v.runtime.median_ms if v.runtime else None,
                   offline_idea=best.idea if best else None)
    compare_with_compile(row)
    row["seconds"] = round(time.monotonic() - started, 1)
    return row


def compare_with_compile(row: dict) -> None:
    """The row's best compile speedup and the offline best over it, from its modes."""
    compiled = [m["speedup"] for m in row.get("compile", {}).values() if m.get("speedup")]
    row["best_compile_speedup"] = max(compiled) if compiled else None
    row.pop("offline_vs_best_compile", None)
    if row.get("offline_speedup") and row["best_compile_speedup"]:
        row["offline_vs_best_compile"] = row["offline_speedup"] / row["best_compile_speedup"]


def keep_filled(row: dict, before: dict | None) -> dict:
    """`row` (a task run again by --redo) with the compile modes that --fill-compile judged
    alone in `before` wherever the new search has no speedup of its own for them: a
    baseline judged alone stays a baseline, and counting it keeps the comparison with
    compile from getting easier by a redo."""
    if before is None or "error" in row:
        return row
    modes = row.setdefault("compile", {})
    for mode, entry in (before.get("compile") or {}).items():
        if entry.get("filled") and entry.get("speedup") and not (modes.get(mode) or {}).get(
                "speedup"):
            modes[mode] = {**entry, "kept_from_before_redo": True}
    compare_with_compile(row)
    return row


def _task_id(name: str) -> int | None:
    head = name.split("_", 1)[0]
    return int(head) if head.isdigit() else None


def _out_of_memory(error: str) -> bool:
    return "out of memory" in error or "OutOfMemor" in error


def _rejudge(entry: dict | None, compile_threads: int | None = None) -> bool:
    """A compile mode without a verdict of its own: never judged, cut by a limit, or out of
    memory beside other jobs. A wrong result is a verdict and stands. With `compile_threads`,
    a timeout that --fill-compile judged with fewer compile threads is judged again."""
    if entry is None:
        return True
    if entry.get("speedup"):
        return False
    error = entry.get("error") or ""
    # Out of memory beside other jobs, or "left processes running" (inductor's workers still
    # exiting, fixed in the evaluator since): not the mode's doing, filled or not.
    if _out_of_memory(error) or error.startswith("rejected: left processes running"):
        return True
    if entry.get("filled"):  # judged by --fill-compile already: its timeout is a verdict
        return (compile_threads is not None and error.startswith("timeout")
                and entry["filled"].get("compile_threads", 1) < compile_threads)
    return error.startswith(("timeout", "not judged", "crashed"))


def missing_modes(row: dict, compile_threads: int | None = None) -> list[str]:
    """The row's compile modes without a verdict of their own (see _rejudge)."""
    return [f"compile:{m}" for m in COMPILE_MODES
            if _rejudge(row.get("compile", {}).get(f"compile:{m}"), compile_threads)]


# Set on an interrupt of --fill-compile, before its children are killed: verdicts that
# arrive after it ("crashed", from the killed children) are not the modes' verdicts.
STOPPING = threading.Event()


def fill_compile(task: Task, row: dict, cfg: RunConfig, limit_s: float,
                 refill_timeouts: bool = False, only: list[str] | None = None) -> dict:
    """Judge the row's compile modes that have no verdict of their own (of `only`, where
    given), at once, alone per task (workers = modes), with `limit_s` for loading and for
    the checks."""
    modes = [m for m in missing_modes(row, cfg.eval.compile_threads if refill_timeouts else None)
             if only is None or m in only]
    if not modes:
        return row
    eval_cfg = cfg.eval.model_copy(deep=True)
    eval_cfg.limits.load_seconds = eval_cfg.limits.check_seconds = limit_s
    started = time.monotonic()
    pool = LocalPool(eval_cfg, workers=len(modes))
    try:
        sources = [render(task.source, (mode,)) for mode in modes]
        for i, verdict in pool.judge_many(task, sources):
            if STOPPING.is_set():  # from here on, verdicts of children the interrupt killed
                break
            row.setdefault("compile", {})[modes[i]] = {
                "speedup": verdict.speedup if verdict.ok else None,
                "error": None if verdict.ok else f"{verdict.status}: {verdict.message[:200]}",
                "filled": {"limit_s": limit_s, "date": dt.date.today().isoformat(),
                           "compile_threads": cfg.eval.compile_threads}}
    finally:
        pool.close()
    compare_with_compile(row)
    row["fill_seconds"] = round(time.monotonic() - started, 1)
    return row


def _run_one(path: str, cfg_json: str, runs: str, baselines: str) -> dict:
    # In its own process: a task that crashes the interpreter ends only its own worker.
    cfg = RunConfig.model_validate_json(cfg_json)
    return one_task(Task.from_file(Path(path)), cfg, Path(runs), baselines)


def figures(rows: list[dict]) -> dict:
    """The summary's geomeans and task counts, from the rows alone."""
    ran = [r for r in rows if "error" not in r]
    # every mode with a verdict of its own (a timeout beside other jobs is none)
    complete = [r for r in ran if not missing_modes(r)]
    return {
        # A task with no correct candidate falls back to eager: it counts 1.0x, not nothing.
        "geomean_offline_vs_eager": geomean([r.get("offline_speedup") or 1.0 for r in ran]),
        "geomean_best_compile_vs_eager": geomean([r.get("best_compile_speedup") or 1.0
                                                  for r in ran]),
        "geomean_offline_vs_best_compile": geomean(
            [(r.get("offline_speedup") or 1.0) / (r.get("best_compile_speedup") or 1.0)
             for r in ran]),
        "tasks_counted": len(ran),
        # Where the search's budget ran out before every compile mode was judged, the best
        # compile figure is a lower bound; this geomean leaves those tasks out.
        "geomean_offline_vs_best_compile_complete": geomean(
            [(r.get("offline_speedup") or 1.0) / (r.get("best_compile_speedup") or 1.0)
             for r in complete]),
        "tasks_compile_complete": len(complete),
        "tasks_failed": [r["task"] for r in rows if "error" in r],
    }


def summary(rows: list[dict], args: argparse.Namespace, runs: Path, pending: list[str]) -> dict:
    return {
        "benchmark": "offline", "device": args.device, "device_name": device_name(args.device),
        "torch_version": torch.__version__, "host": platform.node(),
        "date": now(), "command": this_command(), "runs": str(runs), "jobs": args.jobs,
        "workers": args.workers,
        "max_candidates": args.max_candidates, "max_seconds": args.max_seconds,
        "baselines": args.baselines, "rows": rows, "not_run": pending,
        "fill_compile": bool(getattr(args, "fill_compile", False)),
        **figures(rows),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    folder_arguments(p, max_candidates=24, max_seconds=900)
    p.add_argument("--jobs", type=int, default=1, help="tasks at once (timing stays exclusive)")
    p.add_argument("--baselines", choices=["offline", "separate"], default="offline")
    p.add_argument("--redo", default=None, metavar="IDS",
                   help="with --resume: run these task ids again (e.g. after a new "
                        "transformation), replacing their rows; each keeps its old row "
                        "until it ran again, and a later --resume goes on with those left")
    p.add_argument("--fill-compile", action="store_true",
                   help="with --resume: judge again the compile modes of finished tasks that "
                        "have no verdict of their own (see above); runs no offline search")
    p.add_argument("--fill-limit", type=float, default=540.0, metavar="SECONDS",
                   help="with --fill-compile: the load and check limits of each compile mode")
    p.add_argument("--refill-timeouts", action="store_true",
                   help="with --fill-compile: judge again the timeouts it judged with fewer "
                        "--compile-threads than this call's")
    p.add_argument("--fill-modes", default=None, metavar="MODES",
                   help="with --fill-compile: only these modes, comma-separated (e.g. "
                        "default,reduce-overhead); the others stay as they are")
    p.add_argument("--start-before", type=float, default=None, metavar="SECONDS",
                   help="start no task after this many seconds of the run (for calls with a "
                        "wall-clock limit; --resume runs the rest)")
    args = p.parse_args()
    cfg = run_config(args)
    tasks = load_tasks(args.folder, task_ids(args))
    tag = args.tag_name = args.tag or args.folder.name
    json_path, md_path = args.out / f"offline-{tag}.json", args.out / f"offline-{tag}.md"
    rows: list[dict] = []
    redone: dict[str, dict] = {}  # the rows --redo replaces, by task
    earlier: list[str] = []
    notes: list[str] = []  # what a reader must know, written by hand into the JSON; kept
    if args.resume and json_path.exists():
        before = json.loads(json_path.read_text())
        if before.get("device_name") != device_name(args.device):
            raise SystemExit(f"{json_path} was measured on {before.get('device_name')}: "
                             "results of two devices do not mix; use another --tag")
        # what an earlier --redo call left undone goes on, with or without --redo now
        redo = {int(i) for i in args.redo.split(",")} if args.redo else set()
        redo |= {_task_id(t) for t in before.get("redo_pending", [])}
        rows = [r for r in before["rows"] if "error" not in r and _task_id(r["task"]) not in redo]
        redone = {r["task"]: r for r in before["rows"] if _task_id(r["task"]) in redo}
        earlier = [*before.get("earlier_calls", []), before["command"]]
        notes = before.get("notes", [])
    done = {r["task"] for r in rows}
    todo = [t for t in tasks if t.name not in done]
    runs = Path(tempfile.mkdtemp(prefix="pike-offline-bench-"))
    args.out.mkdir(parents=True, exist_ok=True)

    def save() -> None:
        order = {t.name: i for i, t in enumerate(tasks)}
        # A task named by --redo keeps its old row until its new one is in, so a call cut
        # off before the task ran again loses nothing.
        ran = {r["task"] for r in rows}
        stale = [old for task, old in redone.items() if task not in ran]
        shown = sorted([*rows, *stale], key=lambda r: order.get(r["task"], len(order)))
        pending = [t.name for t in tasks if t.name not in {r["task"] for r in shown}]
        result = summary(shown, args, runs, pending)
        result["redo_pending"] = [r["task"] for r in stale]
        result["earlier_calls"] = earlier
        result["notes"] = notes
        json_path.write_text(json.dumps(result, indent=2))
        md_path.write_text(markdown(result))

    if args.fill_compile:
        if not args.resume:
            raise SystemExit("--fill-compile completes an earlier run's results: add --resume")
        return _fill(args, tasks, rows, cfg, save, md_path)

    context = multiprocessing.get_context("spawn")
    started = time.monotonic()
    queue = list(todo)

    def may_start() -> bool:
        # A call with a wall-clock limit ends with whole tasks: none starts that could not
        # finish in it; those left are `not_run`, for a later --resume.
        return bool(queue) and (args.start_before is None
                                or time.monotonic() - started < args.start_before)

    with cf.ProcessPoolExecutor(max_workers=max(1, args.jobs), mp_context=context) as pool:
        try:
            _run_queue(pool, queue, may_start, args, cfg, runs, rows, redone, save)
        except KeyboardInterrupt:
            stop_children()  # before the pool's exit waits for its running tasks
            raise
    save()
    print(md_path.read_text())
    return 0


def _run_queue(pool: cf.ProcessPoolExecutor, queue: list[Task], may_start: Callable[[], bool],
               args: argparse.Namespace, cfg: RunConfig, runs: Path, rows: list[dict],
               redone: dict[str, dict], save: Callable[[], None]) -> None:
    """Run the queued tasks, `args.jobs` at once, saving the results after each."""
    futures: dict[cf.Future, Task] = {}
    while may_start() or futures:
        while may_start() and len(futures) < max(1, args.jobs):
            task = queue.pop(0)
            futures[pool.submit(_run_one, str(task.path), cfg.model_dump_json(),
                                str(runs), args.baselines)] = task
        if not futures:
            break
        finished, _ = cf.wait(futures, return_when=cf.FIRST_COMPLETED)
        for future in finished:
            task = futures.pop(future)
            try:
                row = future.result()
            except Exception as err:  # the worker died: report the task, go on
                row = {"task": task.name, "error": f"worker: {type(err).__name__}: {err}"}
            old = redone.get(row["task"])
            if "error" in row and old is not None and "error" not in old:
                # a redo that failed (a dead worker, say) does not wipe out a good row
                row = {**old, "redo_error": row["error"]}
            else:
                keep_filled(row, old)
                row["settings"] = {"jobs": args.jobs, "workers": args.workers,
                                   "max_candidates": args.max_candidates,
                                   "max_seconds": args.max_seconds,
                                   "date": dt.date.today().isoformat(),
                                   "device_name": device_name(args.device),
                                   "torch_version": torch.__version__}
            if "error" not in row:  # the files behind the row, kept beside the results
                with RunStore.open(runs / task.name) as store:
                    update_set(store, args.out / f"offline-{args.tag_name}-set")
            rows.append(row)
            print(json.dumps({k: v for k, v in row.items() if k != "trace"}), flush=True)
            save()


def _fill(args: argparse.Namespace, tasks: list[Task], rows: list[dict], cfg: RunConfig,
          save: Callable[[], None], md_path: Path) -> int:
    by_name = {t.name: t for t in tasks}
    threads = cfg.eval.compile_threads if args.refill_timeouts else None
    only = [f"compile:{m}" for m in args.fill_modes.split(",")] if args.fill_modes else None
    unknown = set(only or []) - {f"compile:{m}" for m in COMPILE_MODES}
    if unknown:
        raise SystemExit(f"--fill-modes: unknown {', '.join(sorted(unknown))}; "
                         f"known: {', '.join(COMPILE_MODES)}")

    def wanted(row: dict) -> list[str]:
        return [m for m in missing_modes(row, threads) if only is None or m in only]

    todo = [r for r in rows if r["task"] in by_name and wanted(r)]
    # the longest first (most modes, slowest eager), so a call cut by its limit ends early
    todo.sort(key=lambda r: (-len(wanted(r)), -(r.get("eager_ms") or 1e9)))
    started = time.monotonic()
    lock = threading.Lock()

    def one(row: dict) -> str:
        if args.start_before is not None and time.monotonic() - started > args.start_before:
            return f"{row['task']}: not started (--start-before)"
        filled = copy.deepcopy(row)  # another thread's save() may be writing `row` out
        try:
            fill_compile(by_name[row["task"]], filled, cfg, args.fill_limit,
                         args.refill_timeouts, only)
        except Exception as err:  # the reference failed (out of memory beside other jobs...)
            filled["fill_error"] = f"{type(err).__name__}: {err}"[:300]
        if STOPPING.is_set():
            # The interrupt killed its children: keep the modes judged before it, not the
            # failure it caused.
            filled.pop("fill_error", None)
        with lock:
            row.clear()
            row.update(filled)
            save()
        return json.dumps({"task": row["task"], "compile": row.get("compile")})

    print(f"filling compile baselines of {len(todo)} tasks", flush=True)
    STOPPING.clear()
    try:
        for line in run_each(one, todo, args.jobs, "fill-compile"):
            print(line, flush=True)
    except KeyboardInterrupt:
        STOPPING.set()  # before run_script kills the children the fills are waiting on
        raise
    save()
    print(md_path.read_text())
    return 0


def _mode_cell(entry: dict | None) -> str:
    """A compile mode's speedup, or why it has none; * where --fill-compile judged it."""
    if entry is None:
        return "not judged"
    mark = "*" if entry.get("filled") else ""
    if entry.get("speedup"):
        return _x(entry["speedup"]) + mark
    error = entry.get("error") or "failed"
    why = "out of memory" if _out_of_memory(error) else error.split(":", 1)[0]
    return why + mark


def _over_all(result: dict) -> str:
    head = (f"Over all {result['tasks_counted']} tasks that ran (a task with no correct "
            f"candidate counts 1.0x): offline {_x(result['geomean_offline_vs_eager'])} over "
            "eager")
    compile_x = _x(result["geomean_best_compile_vs_eager"])
    offline_x = _x(result["geomean_offline_vs_best_compile"])
    if result.get("tasks_compile_complete") == result["tasks_counted"]:
        return f"{head}, best compile mode {compile_x} over eager, offline {offline_x} over it."
    return (f"{head}. Where the search's budget ran out before every compile mode was judged, "
            "the best compile figure is a lower bound (a mode not judged counts 1.0x), so "
            f"these two are bounds, not measurements: best compile {compile_x} over eager (at "
            f"least), offline over best compile {offline_x} (at most).")


def _x(value: float | None) -> str:
    return f"{value:.2f}x" if value else "-"


def markdown(result: dict) -> str:
    lines = [f"# Offline strategy vs eager and torch.compile ({result['device_name']})", "",
             f"- device: {result['device']}, torch {result['torch_version']}, "
             f"host {result['host']}", f"- date: {result['date']}",
             f"- command: `{result['command']}`",
             *[f"- earlier call: `{c}`" for c in result.get("earlier_calls", [])], "",
             f"Headline, over the {result.get('tasks_compile_complete', 0)} tasks where every "
             "torch.compile mode has a verdict of its own (a speedup, a wrong result, or no "
             "compile within the limit when judged alone): offline over the best compile mode "
             f"{_x(result.get('geomean_offline_vs_best_compile_complete'))}.", "",
             *[f"- Note: {n}" for n in result.get("notes", [])],
             *([""] if result.get("notes") else []),
             _over_all(result),
             "",
             ("Last call: `--fill-compile` (compile baselines judged again, no offline "
              f"search), tasks at once: {result['jobs']}."
              if result.get("fill_compile") else
              f"Last call: tasks at once: {result['jobs']}, candidates of a task at once: "
             f"{result.get('workers', 1)} (timing exclusive); at most "
             f"{result['max_candidates']} candidates and {result['max_seconds']:.0f} s per task; "
             f"compile baselines: {result['baselines']} (each row's own settings are in the "
              "JSON)."), "",
             "| task | eager | " + " | ".join(COMPILE_MODES) + " | offline | offline / best "
             "compile | offline best | s |", "|---" * (6 + len(COMPILE_MODES)) + "|"]
    for r in result["rows"]:
        if "error" in r:
            lines.append(f"| {r['task']} | failed: {r['error'][:100]} |"
                         + " |" * (4 + len(COMPILE_MODES)))
            continue
        eager = f"{r['eager_ms']:.4g} ms" if r.get("eager_ms") else "-"
        modes = " | ".join(_mode_cell(r["compile"].get(f"compile:{m}")) for m in COMPILE_MODES)
        lines.append(f"| {r['task']} | {eager} | {modes} | {_x(r.get('offline_speedup'))} "
                     f"| {_x(r.get('offline_vs_best_compile'))} "
                     f"| {r.get('offline_idea') or '-'} | {r.get('seconds', '-')} |")
    if result["not_run"]:
        lines += ["", f"Not run: {', '.join(result['not_run'])}."]
    if result.get("redo_pending"):
        lines += ["", f"Named by --redo but not run again yet (their rows are from an earlier "
                  f"call): {', '.join(result['redo_pending'])}."]
    filled = [e["filled"] for r in result["rows"]
              for e in (r.get("compile") or {}).values() if e.get("filled")]
    if filled:
        limits = sorted({f["limit_s"] for f in filled})
        threads = sorted({f.get("compile_threads", 1) for f in filled})
        lines += ["", "\\* judged again by `--fill-compile`: alone per task (the task's modes "
                  "side by side, timing exclusive), with load and check limits of "
                  f"{', '.join(f'{x:.0f}' for x in limits)} s instead of 300 s, and "
                  f"{' or '.join(map(str, threads))} torch.compile worker threads per "
                  "evaluation."]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    run_script(main)
