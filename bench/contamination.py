"""Timing under load: does a busy evaluation pool still give honest figures and the right best?

    python bench/contamination.py TASK_FILE [--workers 8] [--candidates 16]
        [--modes locked,unlocked] [--tag h100] [--out bench/results]

One offline search of TASK_FILE (its transformations include torch.compile's
max-autotune and reduce-overhead modes and CUDA graphs) per mode, with `--workers`
evaluations at once:

- `locked`: pike as it is (`eval.device_lock: pause_others`: a timed window stops every
  other candidate's child, drifting windows are timed again);
- `shared`: the lock before pausing (`eval.device_lock: every_gpu_use`: a child's start,
  load, builds, warm-up and trials hold the device shared, so a timer waits for them);
- `unlocked`: the control, with `eval.device_lock: timing_only` and
  `eval.timing.max_reference_drift: None` (only timing holds the device, no drift check);
- `serial`: pike as it is with one worker: no neighbours at all, so its spread is what the
  card and the reference child do on their own, the floor the pool's spread is read against.

For each mode: the reference's median in every verdict (the spread max/min is what
neighbours did to the windows), noisy verdicts, the search's best and the confirmed best.
Then every candidate correct in any mode is timed again alone, in exclusive windows of
`--alone-group` candidates interleaved with eager (`pike.evaluate.confirm`), with no other
evaluation running: the fastest there is the right answer, and each mode's confirmed best
is checked against it.
Results: bench/results/contamination-<tag>.json and .md (device, torch, date, command);
the runs stay under bench/results/contamination-<tag>-runs/ for audit.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import tempfile
import time
from pathlib import Path

import torch
from common import RESULTS, device_name, notes_section, now, run_script, this_command, with_ext

from pike.config import RunConfig
from pike.evaluate.confirm import confirm
from pike.evaluate.reference_cache import close_references
from pike.search.session import optimize
from pike.store import RunStore
from pike.task import Task

# The confirmed best is right when it is the alone-fastest or within this share of it:
# two candidates closer than that are the same speed to any later measurement.
SAME_SPEED = 0.02


def mode_config(mode: str, args: argparse.Namespace) -> RunConfig:
    cfg = RunConfig()
    cfg.eval.device = args.device
    cfg.eval.workers = 1 if mode == "serial" else args.workers
    cfg.search.offline.max_candidates = args.candidates
    cfg.search.offline.max_seconds = args.max_seconds
    if mode == "shared":
        cfg.eval.device_lock = "every_gpu_use"
    if args.fresh_cache:  # no mode finds the compiles of the one before it in the cache
        cfg.eval.build_cache = Path(tempfile.mkdtemp(prefix=f"pike-cache-{mode}-"))
    if mode == "unlocked":
        cfg.eval.device_lock = "timing_only"
        cfg.eval.timing.max_reference_drift = None
    return cfg


def run_mode(task: Task, mode: str, args: argparse.Namespace, runs: Path) -> dict:
    close_references()  # each mode starts its own reference
    started = time.monotonic()
    cfg = mode_config(mode, args)
    result = optimize(task, cfg, out=runs / mode)
    wall = time.monotonic() - started
    store = RunStore.open(result.run_dir)
    rows = [c for c in store.candidates(task.name) if c.verdict is not None]
    best = store.best(task.name)
    store.close()
    reference_ms = [c.verdict.reference.median_ms for c in rows
                    if c.verdict and c.verdict.reference is not None]
    correct = [c for c in rows if c.verdict and c.verdict.ok]
    search_best = max(correct, key=lambda c: c.verdict.search_speedup or c.verdict.speedup or 0.0,
                      default=None) if correct else None
    return {
        "mode": mode, "workers": cfg.eval.workers, "wall_s": round(wall, 1),
        "run_dir": str(result.run_dir),
        "verdicts": len(rows), "correct": len(correct),
        "noisy": sum(bool(c.verdict and c.verdict.noisy) for c in rows),
        # each verdict's wall time, and the part its child spent stopped for others' windows
        "eval_s": [round(c.verdict.phase_seconds.get("total", 0.0), 2) for c in rows if c.verdict],
        "paused_s": [round(c.verdict.phase_seconds.get("paused", 0.0), 2) for c in rows
                     if c.verdict],
        "reference_ms": [round(x, 4) for x in reference_ms],
        "reference_spread": round(max(reference_ms) / min(reference_ms), 4) if reference_ms else None,
        "candidates": [{"id": c.id, "idea": c.idea, "status": c.verdict.status if c.verdict else None,
                        "runtime_ms": c.verdict.runtime.median_ms if c.verdict and c.verdict.runtime else None,
                        "reference_ms": c.verdict.reference.median_ms if c.verdict and c.verdict.reference else None,
                        "speedup": c.verdict.speedup if c.verdict else None,
                        "noisy": bool(c.verdict and c.verdict.noisy)} for c in rows],
        "search_best": _named(search_best, search=True),
        "confirmed_best": _named(best) if best is not None and best.verdict and best.verdict.confirmed else None,
        "sources": {c.idea or str(c.id): c.source for c in correct},
    }


def _named(row: object, search: bool = False) -> dict | None:
    if row is None:
        return None
    verdict = row.verdict  # type: ignore[attr-defined]
    speedup = verdict.search_speedup if search and verdict.search_speedup else verdict.speedup
    return {"id": row.id, "idea": row.idea or str(row.id), "speedup": speedup}  # type: ignore[attr-defined]


def alone(task: Task, modes: list[dict], args: argparse.Namespace) -> list[dict]:
    """Every correct candidate of any mode, timed again with no other evaluation running:
    in exclusive windows of `--alone-group` candidates each, interleaved with eager (all
    of a large task's children at once would not fit the GPU), readied `--workers` at a
    time. Each speedup is against its own window's eager."""
    sources: dict[str, str] = {}
    for m in modes:
        sources.update(m["sources"])
    ideas = sorted(sources)
    cfg = mode_config("locked", args).eval.model_copy(update={"workers": args.workers})
    close_references()
    found = []
    for at in range(0, len(ideas), args.alone_group):
        group = ideas[at:at + args.alone_group]
        print(f"alone: candidates {at + 1}..{at + len(group)} of {len(ideas)}", flush=True)
        for c in confirm(task, {at + i: sources[idea] for i, idea in enumerate(group)}, cfg):
            found.append({"idea": ideas[c.candidate_id], "runtime_ms": c.runtime_ms,
                          "reference_ms": c.reference_ms, "speedup": c.speedup,
                          "error": c.error, "window": at // args.alone_group + 1})
    found.sort(key=lambda a: (a["speedup"] is None, -(a["speedup"] or 0.0)))
    return found


def judge_modes(modes: list[dict], timed_alone: list[dict]) -> None:
    fastest = next((a for a in timed_alone if a["speedup"]), None)
    for m in modes:
        pick = m["confirmed_best"] or m["search_best"]
        m["alone_fastest"] = fastest["idea"] if fastest else None
        if pick is None or fastest is None:
            m["best_is_alone_fastest"] = None
            continue
        mine = next((a for a in timed_alone if a["idea"] == pick["idea"]), None)
        m["best_alone_speedup"] = mine["speedup"] if mine else None
        m["best_is_alone_fastest"] = bool(
            mine and mine["speedup"] and mine["speedup"] >= (1 - SAME_SPEED) * fastest["speedup"])
        search = m["search_best"]
        mine = next((a for a in timed_alone if search and a["idea"] == search["idea"]), None)
        m["search_best_is_alone_fastest"] = bool(
            mine and mine["speedup"] and mine["speedup"] >= (1 - SAME_SPEED) * fastest["speedup"])


def markdown(data: dict) -> str:
    lines = [f"# Timing under load ({data['device_name']})", "",
             f"- device: {data['device']}, torch {data['torch_version']}, host {data['host']}",
             f"- date: {data['date']}", f"- command: `{data['command']}`",
             *(f"- earlier call: `{c}`" for c in data.get("earlier_commands", [])),
             f"- task: {data['task']}; {data['workers']} workers, up to {data['candidates']} "
             "offline candidates per mode", "",
             "| mode | wall | verdicts (correct) | evaluation s, median (max) | stopped s, total "
             "| reference median min..max | spread | noisy "
             "| search's best | confirmed best | its speedup alone | = alone fastest |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for m in data["modes"]:
        ref = m["reference_ms"]
        span = f"{min(ref):.3f}..{max(ref):.3f} ms" if ref else "-"
        search, conf = m["search_best"], m["confirmed_best"]
        lines.append(
            f"| {m['mode']} ({m.get('workers', data['workers'])} w) | {m['wall_s']} s | {m['verdicts']} ({m['correct']}) "
            f"| {_seconds(m.get('eval_s'))} | {sum(m.get('paused_s') or [0]):.1f} | {span} "
            f"| {m['reference_spread']} | {m['noisy']} "
            f"| {_pick(search)} | {_pick(conf)} "
            f"| {_x(m.get('best_alone_speedup'))} | {m.get('best_is_alone_fastest')} |")
    lines += ["", "Timed alone afterwards (exclusive windows, each interleaved with eager; "
              "a speedup is against its window's eager):", "",
              "| candidate | window | runtime | eager | speedup |", "|---|---|---|---|---|"]
    for a in data["alone"]:
        lines.append(f"| {a['idea']} | {a.get('window', 1)} | {_ms(a['runtime_ms'])} "
                     f"| {_ms(a['reference_ms'])} "
                     f"| {_x(a['speedup'])}{' ' + a['error'][:60] if a['error'] else ''} |")
    lines += notes_section(data)
    return "\n".join(lines) + "\n"


def _seconds(values: list[float] | None) -> str:
    return f"{statistics.median(values):.1f} ({max(values):.1f})" if values else "-"


def _pick(named: dict | None) -> str:
    return f"{named['idea']} {_x(named['speedup'])}" if named else "-"


def _x(value: float | None) -> str:
    return f"{value:.2f}x" if value else "-"


def _ms(value: float | None) -> str:
    return f"{value:.3f} ms" if value else "-"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("task", type=Path)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--workers", type=int, default=8)
    p.add_argument("--candidates", type=int, default=16)
    p.add_argument("--max-seconds", type=float, default=1800.0)
    p.add_argument("--modes", default="locked,unlocked")
    p.add_argument("--tag", default=None)
    p.add_argument("--resume", action="store_true",
                   help="keep the modes the results file has; run the rest, then the alone window")
    p.add_argument("--alone-group", type=int, default=6,
                   help="candidates per exclusive window when timed alone")
    p.add_argument("--fresh-cache", action="store_true",
                   help="each mode compiles into an empty build cache of its own (inductor, "
                        "Triton, extensions): otherwise a later mode reuses the compiles "
                        "of an earlier one and looks faster")
    p.add_argument("--skip-alone", action="store_true",
                   help="run the modes only (the alone window in a later --resume call)")
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args()
    args.tag = args.tag or ("cuda" if args.device.startswith("cuda") else "cpu")
    task = Task.from_file(args.task)
    stem = args.out / f"contamination-{args.tag}"
    runs = args.out / f"contamination-{args.tag}-runs"
    args.out.mkdir(parents=True, exist_ok=True)
    data = {"device": args.device, "device_name": device_name(args.device),
            "torch_version": torch.__version__, "host": platform.node(), "date": now(),
            "command": this_command(), "task": task.name, "workers": args.workers,
            "candidates": args.candidates, "modes": [], "alone": []}
    if args.resume and with_ext(stem, ".json").exists():
        before = json.loads(with_ext(stem, ".json").read_text())
        data["modes"] = before["modes"]
        data["earlier_commands"] = [*before.get("earlier_commands", []), before["command"]]
        if before.get("notes"):  # written by hand
            data["notes"] = before["notes"]

    def save() -> None:  # the candidates' sources are kept too: the alone window needs them
        with_ext(stem, ".json").write_text(json.dumps(data, indent=2))
        with_ext(stem, ".md").write_text(markdown(data))

    done = {m["mode"] for m in data["modes"]}
    for mode in [m for m in args.modes.split(",") if m not in done]:
        data["modes"].append(run_mode(task, mode, args, runs))
        save()
        print(f"{mode}: {data['modes'][-1]['wall_s']} s, reference spread "
              f"{data['modes'][-1]['reference_spread']}", flush=True)
    if args.skip_alone:
        return 0
    data["alone"] = alone(task, data["modes"], args)
    judge_modes(data["modes"], data["alone"])
    save()
    print(markdown(data), flush=True)
    print("reference medians per mode:", {m["mode"]: statistics.median(m["reference_ms"])
                                          for m in data["modes"] if m["reference_ms"]})
    return 0


if __name__ == "__main__":
    run_script(main)
