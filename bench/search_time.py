"""Where a finished (or cut off) run's evaluation time went, from its store alone.

    python bench/search_time.py RUN_DIR [--since ID] [--against OTHER_RUN_DIR]
        [--tag level2-h200] [--out bench/results]

Nothing is re-run: each verdict in the store keeps its phases (`paused`: stopped by other
evaluations' timing windows) and its steps. Per task: candidates judged, the search's wall
time (first candidate made to last verdict) and its budgeted seconds; per kind of
candidate (`build`: a torch.compile mode in its set, `cheap`: any other): median and total
seconds of each step, so a search's budget can be read against what its evaluations did.
Each task's budget is also replayed from its verdicts under both rules for stopped time
(`search/offline.py`): shared over all the search's lanes, busy or not (pike before
2026-11-29), and shared among the evaluations that ran beside it (since). The replay
counts the time some candidate of the task was in evaluation, so the gaps between device
calls of a resumed run drop out; a candidate starts at its creation, or where its
verdict's own seconds began if later (one made before an interrupt is judged anew in the
next call).
Also per task, the median seconds a candidate spent between its making and its verdict
outside the verdict's own time (`total`): held in the pool, or a first try that ran out of
memory beside others (those are steps of their own from 2026-12-03 on). Only candidates made
and judged in one device call count.
`--since ID` keeps candidates from that id on (one device call's share of a resumed run).
Each task's baselines too: every mode's speedup over eager, its build seconds and the part
of them that held the device alone (an autotuning mode's build less its pre-build, which
ran beside other work); `--against` sets them beside another run's of the same tasks, mode
by mode (is a mode's figure the same where its build was made differently?).
Where the run dir holds the logs of bench/device_calls.sh (bench-*.log), the evaluations
in progress at once in each device call, by minute: of the lanes (jobs x workers), how
many held a candidate that was judged (one in flight at a cut is not counted).
Where the run dir holds `device-holds.jsonl` (`pike bench` writes it from 2026-12-04 on:
src/pike/evaluate/device_holds.py), what held the device alone, by purpose, in all and
per device call: each such hold stopped every other evaluation on the GPU.
Results go to bench/results/search-time-<tag>.json and .md.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
from contextlib import ExitStack
from itertools import pairwise
from pathlib import Path

from common import RESULTS, alone_seconds, now, this_command, with_ext

from pike.config import autotunes
from pike.evaluate import device_holds, search_bar
from pike.evaluate.pool import POOL_STEPS
from pike.evaluate.timing_window import behind_bar
from pike.evaluate.verdict import Verdict
from pike.store import BASELINE_STATE, DONE_STATE, RunStore

# timing.calls and timing.blocks: of `timing`, the timed calls and the blocks after the
# warm-up (verdicts from 2026-12-02 on; 0 before); wait_to_list: the wait to be listed
# for timers to stop, before the child begins (in wait_for_device before 2026-12-02);
# wait_in_pool and crowded_try: the pool's, outside `total` (verdicts from 2026-12-03 on);
# stage_timed_inputs: the timed sets loaded before the window (from 2026-12-04 on; in
# `timing` before); wait_for_reference: of a window's hold, the wait for the reference's
# child (other evaluations of the task talking to it), the device held alone meanwhile
# (from 2026-12-04, late, on; in wait_for_device before)
STEPS = ("total", "paused", "reference", "wait_to_list", "wait_for_device",
         "wait_for_reference", "load_build_warm_up", "trials", "compare", "stage_timed_inputs", "timing",
         "timing.calls", "timing.blocks", "final_check", "stop_child", *POOL_STEPS)


def kind(idea: str | None) -> str:
    return "build" if idea and "compile:" in idea else "cheap"


def step_seconds(verdict: Verdict) -> dict[str, float]:
    """A verdict's total and paused seconds (its phases) and its parent-side steps."""
    phases, steps = verdict.phase_seconds, verdict.steps
    return {"total": phases.get("total", 0.0), "paused": phases.get("paused", 0.0),
            **{s: steps.get(s, 0.0) for s in STEPS[2:]}}


def collect(run_dir: Path, since: int = 0) -> dict:
    tasks: dict[str, dict] = {}
    by_kind: dict[str, dict[str, list[float]]] = {}
    calls = call_windows(run_dir)
    with RunStore.open(run_dir) as store:
        for r in store.candidates():
            if r.id < since:
                continue
            t = tasks.setdefault(r.task, {"judged": 0, "ok": 0, "unfinished": 0, "first": None,
                                          "last": None, "build_s": [], "cheap_s": [],
                                          "spans": [], "outside_s": [], "window_extra_s": []})
            t["first"] = min(filter(None, [t["first"], r.created_at]))
            if r.verdict is None:
                t["unfinished"] += 1
                continue
            t["judged"] += 1
            t["ok"] += bool(r.verdict.ok)
            t["last"] = max(filter(None, [t["last"], r.evaluated_at]))
            seconds = step_seconds(r.verdict)
            t[f"{kind(r.idea)}_s"].append(seconds["total"])
            if seconds["timing.blocks"] > 0 and (r.verdict.window_candidates or 1) == 1:
                # a window of its own's time outside its kept blocks: the first blocks (warm
                # up), moving cores and, before 2026-12-04, loading the timed sets
                t["window_extra_s"].append(seconds["timing"] - seconds["timing.blocks"])
            if r.role == "offline" and r.created_at and r.evaluated_at:
                # judged in a later device call than it was made in: it began there
                end, made = _stamp(r.evaluated_at), _stamp(r.created_at)
                start = max(made, end - seconds["total"])
                t["spans"].append((start, end, seconds["paused"] + seconds["wait_for_device"]
                                   + seconds["wait_for_reference"]))
                if _same_call(made, end, calls):
                    t["outside_s"].append(max(0.0, end - made - seconds["total"]))
            steps = by_kind.setdefault(kind(r.idea), {s: [] for s in STEPS})
            for s in STEPS:
                steps[s].append(seconds[s])
        width = int(store.config().get("eval", {}).get("workers", 1) or 1)
        for name, t in tasks.items():
            t["done"] = bool(store.get_state(name, DONE_STATE))
            t["budget_s"] = store.get_state(name, "offline_seconds")
            t["replay"] = replay_budget(t.pop("spans"), width)
    return {"tasks": tasks, "kinds": by_kind}


def _same_call(start: float, end: float, calls: list[tuple[str, float, float]]) -> bool:
    """Both moments within one device call (or the run has no call logs): a candidate made
    in one call and judged again after a cut was not waiting in between."""
    return not calls or any(a <= start and end <= b + 1 for _, a, b in calls)


def call_windows(run_dir: Path) -> list[tuple[str, float, float]]:
    """(log name, start, end) of each device call of a run driven by
    bench/device_calls.sh, from the driver's first and last time stamps in each
    bench-*.log there, in the calls' order. The stamps are UTC times of day: the first is
    taken as the one nearest the run's first verdict, each later one as the first such
    time after the stamp before it (a call across midnight, calls on later days less
    than a day apart)."""
    with RunStore.open(run_dir) as store:
        first = next((r.evaluated_at for r in store.candidates() if r.evaluated_at), None)
    if first is None:
        return []
    calls: list[tuple[str, float, float]] = []
    last: float | None = None  # the stamp before, in any call's log
    for log in sorted(run_dir.glob("bench-*.log"), key=_call_number):
        stamps = []
        for line in log.read_text().splitlines():
            if " driver: " in line and line[:2].isdigit():
                last = (_time_of_day(line[:8], near=_stamp(first), after=False) if last is None
                        else _time_of_day(line[:8], near=last, after=True))
                stamps.append(last)
        if len(stamps) >= 2:
            calls.append((log.name, stamps[0], stamps[-1]))
    return calls


def _call_number(log: Path) -> tuple[int, str]:
    digits = "".join(c for c in log.stem if c.isdigit())
    return (int(digits) if digits else 0, log.name)


def _time_of_day(clock: str, near: float, after: bool) -> float:
    """The moment at `clock` (HH:MM:SS, UTC) nearest `near`, or with `after` the first
    not before it."""
    day = dt.datetime.fromtimestamp(near, dt.UTC).date().isoformat()
    at = _stamp(f"{day}T{clock}+00:00")
    at += round((near - at) / 86400) * 86400.0
    return at + 86400.0 if after and at < near else at


def verdict_spans(run_dir: Path) -> list[tuple[float, float]]:
    """(start, end) of each judged candidate's evaluation: its verdict's time less its
    own total seconds."""
    with RunStore.open(run_dir) as store:
        return [(_stamp(r.evaluated_at) - step_seconds(r.verdict)["total"],
                 _stamp(r.evaluated_at))
                for r in store.candidates() if r.verdict is not None and r.evaluated_at]


def lanes(run_dir: Path) -> str:
    """The run's evaluation lanes as its command asked for them (jobs x workers)."""
    with RunStore.open(run_dir) as store:
        workers = int(store.config().get("eval", {}).get("workers", 1) or 1)
        command = store.command()
    words = command.split()
    jobs = int(words[words.index("--jobs") + 1]) if "--jobs" in words else 1
    return f"{jobs} jobs x {workers} workers = {jobs * workers}"


def at_once(spans: list[tuple[float, float]], calls: list[tuple[str, float, float]],
            every_s: float = 5.0) -> list[dict]:
    """Per call: the evaluations in progress, sampled every `every_s` seconds, as a mean
    over the call and per minute, and the verdicts that came in it."""
    found = []
    for name, start, end in calls:
        samples, t = [], start
        while t < end:
            samples.append(sum(1 for a, b in spans if a <= t < b))
            t += every_s
        per_minute = int(60 / every_s)
        found.append({"call": name, "seconds": end - start,
                      "verdicts": sum(1 for _, b in spans if start <= b < end),
                      "mean": statistics.fmean(samples) if samples else 0.0,
                      "by_minute": [round(statistics.fmean(samples[i:i + per_minute]), 1)
                                    for i in range(0, len(samples), per_minute)]})
    return found


def behind_best(run_dir: Path, factor: float = 1.25, rank: int = 1) -> dict[str, float]:
    """eval.timing.give_up_behind_best replayed on a run's store: in each task's verdict
    order, the windows timed in full whose candidate's fastest call already left it over
    `factor` times behind the bar, the `rank`-th best speedup of its task's verdicts
    before it (search.bar_rank; the rule decides after three rounds, on those rounds'
    fastest call, so this is close to what it cuts), their seconds in the window
    (`timing`), and the windows the rule did cut. The bar is kept as a search keeps it
    (search_bar.py) and compared as the window compares it (timing_window.behind_bar)."""
    out = {"timed": 0, "timing_s": 0.0, "behind": 0, "behind_s": 0.0, "cut": 0,
           "factor": factor, "rank": rank}
    held: set[str] = set()
    with RunStore.open(run_dir) as store, ExitStack() as bars:
        rows = [r for r in store.candidates() if r.verdict is not None and r.evaluated_at]
        for r in sorted(rows, key=lambda r: (r.evaluated_at, r.id)):
            key = f"replay:{run_dir}:{r.task}"
            if key not in held:
                bars.enter_context(search_bar.held(key, keep=rank))
                held.add(key)
            v = r.verdict
            if v.behind_best is not None:
                out["cut"] += 1
            if not (v.ok and v.speedup and v.runtime and v.reference) or v.timed_rounds:
                continue
            # a shared window's `timing` is the whole window, in each of its verdicts
            seconds = v.steps.get("timing", 0.0) / (v.window_candidates or 1)
            out["timed"] += 1
            out["timing_s"] += seconds
            fastest = v.reference.median_ms / v.runtime.min_ms if v.runtime.min_ms else 0.0
            if behind_bar(fastest, search_bar.current(key), factor):
                out["behind"] += 1
                out["behind_s"] += seconds
            if v.rankable:
                search_bar.raise_to(key, v.speedup)
    return out


def shared_windows(run_dir: Path) -> dict:
    """The verdicts timed in a window shared with other candidates of their task
    (eval.timing.share_window), by how many shared it: each one's `timing` is the whole
    window, so a window of k counts 1/k of it once per verdict, and the device time its
    verdicts took is set against what windows of their own would have taken (each a
    candidate and eager: twice the candidate's share of the calls)."""
    by_size: dict[int, int] = {}
    window_s = alone_s = 0.0
    with RunStore.open(run_dir) as store:
        for r in store.candidates():
            v = r.verdict
            if v is None or not v.window_candidates:
                continue
            k = v.window_candidates
            by_size[k] = by_size.get(k, 0) + 1
            window_s += v.steps.get("timing", 0.0) / k
            alone_s += v.steps.get("timing", 0.0) * 2 / (k + 1)
    return {"by_size": {str(k): n for k, n in sorted(by_size.items())},
            "window_s": window_s, "alone_s": alone_s}


def could_share(run_dir: Path, most: int = 4) -> dict:
    """What eval.timing.share_window could have shared in a run timed before it (its
    verdicts carry no window_candidates), estimated from the store alone: each timed
    verdict's window is put at its end (evaluated_at less its final check and stop) less
    its `timing`, and it waited for it over the `wait_for_device` before that (an upper
    bound: the step also holds the wait to be listed). In order of start, a window not
    yet taken by another leads, and takes up to `most` - 1 candidates of its task that
    were waiting as it began; each one taken saves about half its window (eager's blocks
    it no longer needs). A first-order estimate: with windows shared, everything after
    them would have moved."""
    windows = []
    with RunStore.open(run_dir) as store:
        for r in store.candidates():
            v = r.verdict
            if (v is None or not v.ok or not r.evaluated_at or v.window_candidates
                    or not v.steps.get("timing")):
                continue
            end = (_stamp(r.evaluated_at) - v.steps.get("final_check", 0.0)
                   - v.steps.get("stop_child", 0.0))
            start = end - v.steps["timing"]
            windows.append((start, start - v.steps.get("wait_for_device", 0.0), r.task,
                            r.id, v.steps["timing"]))
    windows.sort()
    taken: set[int] = set()
    led = joined = 0
    saved = total = 0.0
    for start, _, task, cid, seconds in windows:
        total += seconds
        if cid in taken:
            continue
        taken.add(cid)
        waiting = [w for w in windows if w[2] == task and w[3] not in taken
                   and w[1] <= start < w[0]][:most - 1]
        if waiting:
            led += 1
        for w in waiting:
            taken.add(w[3])
            joined += 1
            saved += w[4] / 2
    return {"windows": len(windows), "shared": led, "joined": joined,
            "timing_s": total, "saved_s": saved, "most": most}


def _ordinal(n: int) -> str:
    return {1: "1st", 2: "2nd", 3: "3rd"}.get(n, f"{n}th")


def _stamp(iso: str) -> float:
    return dt.datetime.fromisoformat(iso).timestamp()


def replay_budget(spans: list[tuple[float, float, float]], width: int) -> dict[str, float]:
    """A search's spent seconds from its candidates' (start, end, stood) alone: the time
    some candidate was in evaluation, less the stood seconds shared over `width` lanes
    (the old rule) or among the candidates in evaluation beside each (the rule now)."""
    edges = sorted({x for a, b, _ in spans for x in (a, b)})
    busy = 0.0
    for a, b in pairwise(edges):
        mid = (a + b) / 2
        busy += (b - a) * any(s <= mid < e for s, e, _ in spans)

    def beside(start: float, end: float) -> float:
        if end <= start:
            return 1.0
        area = 0.0
        for a, b in pairwise(edges):
            if start <= a and b <= end:
                area += (b - a) * sum(s <= (a + b) / 2 < e for s, e, _ in spans)
        return max(1.0, area / (end - start))

    return {"busy": busy,
            "lanes": busy - sum(stood for *_, stood in spans) / width,
            "beside": busy - sum(stood / beside(s, e) for s, e, stood in spans)}


def collect_baselines(run_dir: Path) -> dict[str, dict[str, dict]]:
    """Per task, per baseline mode: its speedup over eager, build and device-alone seconds."""
    found: dict[str, dict[str, dict]] = {}
    with RunStore.open(run_dir) as store:
        for name in (t["name"] for t in store.tasks()):
            baseline = store.get_state(name, BASELINE_STATE)
            if not isinstance(baseline, dict):
                continue
            modes = found.setdefault(name, {})
            for m in baseline.get("modes", []):
                modes[m["mode"]] = {"speedup": m.get("speedup_vs_eager"),
                                    "build_s": m.get("build_s"), "alone_s": alone_seconds(m),
                                    "error": bool(m.get("error"))}
    return found


def _wall(first: str | None, last: str | None) -> float | None:
    if not first or not last:
        return None
    return (dt.datetime.fromisoformat(last) - dt.datetime.fromisoformat(first)).total_seconds()


def held_alone(run_dir: Path, calls: list[tuple[str, float, float]]) -> dict | None:
    """From the run's device-holds ledger: per purpose, over the whole run and per device
    call, the holds, seconds held and waited; None where the run has no ledger."""
    holds = device_holds.read(run_dir / device_holds.LEDGER_NAME)
    if not holds:
        return None
    return {"all": device_holds.summarize(holds),
            "devices": sorted({str(h.get("device", "")) for h in holds}),
            "calls": [{"call": name, "seconds": end - start,
                       "purposes": device_holds.summarize(holds, start, end)}
                      for name, start, end in calls]}


def render_held_alone(held: dict) -> list[str]:
    total = sum(p["held_s"] for p in held["all"].values())
    lines = ["", "## The device held alone, by what held it", "",
             f"From the run's device-holds ledger: {total:.0f} s held alone in all"
             + (f" over {len(held['devices'])} GPUs (each one's holds apart; their shares of "
                "a call add up over them)" if len(held.get("devices", [])) > 1 else "")
             + ". Every "
             "other evaluation on the GPU stood stopped meanwhile; `waited` is the time "
             "the holders waited to take it, for shared holders (comparisons, final checks) "
             "to leave.", "",
             "| purpose | holds | held s | median s a hold | waited s | processes stopped, "
             "median | s stopping them, median |", "|---|---|---|---|---|---|---|"]
    lines += [f"| {name} | {p['holds']} | {p['held_s']:.0f} | {p['median_s']:.2f} | "
              f"{p['waited_s']:.0f} | {p['stopped']:g} | "
              + (f"{p['stopping_s']:.3f} |" if "stopping_s" in p else "- |")
              for name, p in held["all"].items()]
    if held["calls"]:
        purposes = list(held["all"])
        lines += ["", "Per device call, seconds held alone (share of the call):", "",
                  "| call | seconds | " + " | ".join(purposes) + " | all |",
                  "|---|---|" + "---|" * (len(purposes) + 1)]
        for c in held["calls"]:
            got = [c["purposes"].get(n, {}).get("held_s", 0.0) for n in purposes]
            share = sum(got) / c["seconds"] if c["seconds"] > 0 else 0.0
            lines.append(f"| {c['call']} | {c['seconds']:.0f} | "
                         + " | ".join(f"{g:.0f}" for g in got)
                         + f" | {sum(got):.0f} ({share:.0%}) |")
    return lines


def render(found: dict, command: str, date: str, run_dir: Path) -> str:
    lines = [f"# Where the evaluations' time went: {run_dir.name}", "",
             f"- command: `{command}`", f"- date: {date}", "- from the run store's verdicts "
             "alone (nothing re-run); seconds are wall seconds of the parent's steps", "",
             "## Per task", "",
             "| task | judged (ok) | unfinished | done | wall, first made to last verdict (s) "
             "| budgeted s | replayed: all lanes / beside | median s, cheap | median s, builds "
             "| median s outside its verdict | median s of a window outside its kept blocks |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, t in sorted(found["tasks"].items(), key=lambda kv: _task_number(kv[0])):
        wall = _wall(t["first"], t["last"])
        med = [f"{statistics.median(t[k]):.0f}" if t[k] else "-"
               for k in ("cheap_s", "build_s", "outside_s")]
        extra = (f"{statistics.median(t['window_extra_s']):.2f}" if t["window_extra_s"]
                 else "-")
        budget = f"{float(t['budget_s']):.0f}" if t["budget_s"] is not None else "-"
        wall_text = f"{wall:.0f}" if wall is not None else "-"
        replay = t.get("replay") or {}
        replayed = (f"{replay['lanes']:.0f} / {replay['beside']:.0f}" if replay.get("busy")
                    else "-")
        lines.append(f"| {name} | {t['judged']} ({t['ok']}) | {t['unfinished']} | "
                     f"{'yes' if t['done'] else 'no'} | {wall_text} | {budget} | {replayed} | "
                     f"{med[0]} | {med[1]} | {med[2]} | {extra} |")
    lines += ["", "## Per kind of candidate (median / total seconds of each step)", "",
              "| kind | n | " + " | ".join(STEPS) + " |", "|---|---|" + "---|" * len(STEPS)]
    for k, steps in sorted(found["kinds"].items()):
        n = len(steps["total"])
        cells = [f"{statistics.median(v):.1f} / {sum(v):.0f}" for v in
                 (steps[s] for s in STEPS)]
        lines.append(f"| {k} | {n} | " + " | ".join(cells) + " |")
    cut = found.get("behind_best")
    if cut:
        lines += ["", "## Windows behind the best", "",
                  f"Of {cut['timed']} candidates' windows timed in full ({cut['timing_s']:.0f} s), "
                  f"{cut['behind']} ({cut['behind_s']:.0f} s) had a fastest call over "
                  f"{cut['factor']} times behind the {_ordinal(cut['rank'])} best of their "
                  "task's verdicts before them: what eval.timing.give_up_behind_best would "
                  f"time for three rounds only. Cut short by it in this run: {cut['cut']}."]
    could = found.get("could_share")
    if could and could["windows"]:
        lines += ["", "## Windows that could have been shared (estimate)", "",
                  f"Of {could['windows']} candidates' windows ({could['timing_s']:.0f} s), "
                  f"{could['shared']} began while other candidates of their task waited for "
                  f"the device; shared (at most {could['most']} candidates a window), "
                  f"{could['joined']} of those waiting would have joined them, saving about "
                  f"{could['saved_s']:.0f} s of the device held alone. From the verdicts' "
                  "steps and times only (search_time.could_share): a first-order "
                  "estimate, not a measurement."]
    shared = found.get("shared_windows")
    if shared and shared["by_size"]:
        sizes = ", ".join(f"{n} in windows of {k}" for k, n in shared["by_size"].items())
        lines += ["", "## Shared windows", "",
                  f"Verdicts timed beside other candidates of their task: {sizes}. Their "
                  f"windows held the device for {shared['window_s']:.0f} s; windows of "
                  f"their own, of the same length per timer, would have taken about "
                  f"{shared['alone_s']:.0f} s."]
    if found.get("at_once"):
        lines += ["", "## Evaluations at once, per device call", "",
                  "Candidates in evaluation at once (judged ones only: one in flight at a cut "
                  "is lost), sampled every 5 s, against the run's lanes "
                  f"({found.get('lanes', '?')}):", "",
                  "| call | seconds | verdicts | mean at once | by minute |", "|---|---|---|---|---|"]
        lines += [f"| {c['call']} | {c['seconds']:.0f} | {c['verdicts']} | {c['mean']:.1f} | "
                  f"{', '.join(f'{m:g}' for m in c['by_minute'])} |" for c in found["at_once"]]
    if found.get("held_alone"):
        lines += render_held_alone(found["held_alone"])
    if found.get("baselines"):
        lines += render_baselines(found["baselines"], found.get("against"))
    return "\n".join(lines) + "\n"


def _figure(mode: dict | None) -> str:
    if mode is None:
        return "-"
    if mode["error"] or mode["speedup"] is None:
        return "failed"
    return f"{mode['speedup']:.2f}x"


def render_baselines(here: dict[str, dict[str, dict]],
                     there: dict[str, dict[str, dict]] | None) -> list[str]:
    modes = sorted({m for task in here.values() for m in task if m != "eager"})
    alone = sum(m["alone_s"] for task in here.values() for m in task.values())
    lines = ["", "## Baselines", "",
             f"{len(here)} tasks; their autotuning builds held the device alone for "
             f"{alone:.0f} s together (build less pre-build).", "",
             "| task | " + " | ".join(f"{m}: over eager, build s (alone)" for m in modes) + " |",
             "|---|" + "---|" * len(modes)]
    for name in sorted(here, key=_task_number):
        cells = []
        for m in modes:
            mode = here[name].get(m)
            cells.append("-" if mode is None else f"{_figure(mode)}, {mode['build_s'] or 0:.1f}"
                         + (f" ({mode['alone_s']:.1f})" if autotunes(m) else ""))
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    if there is None:
        return lines
    shared = [n for n in sorted(here, key=_task_number) if n in there]
    alone_there = sum(there[n][m]["alone_s"] for n in shared for m in there[n])
    alone_here = sum(here[n][m]["alone_s"] for n in shared for m in here[n])
    ratios = [here[n][m]["speedup"] / there[n][m]["speedup"] for n in shared for m in modes
              if m in here[n] and m in there[n] and here[n][m]["speedup"]
              and there[n][m]["speedup"] and not here[n][m]["error"]
              and not there[n][m]["error"]]
    lines += ["", "## Baselines beside the other run's", "",
              f"{len(shared)} tasks in both. Device-alone build seconds: {alone_here:.0f} here, "
              f"{alone_there:.0f} there. Each mode's speedup over eager here over the same "
              "mode's there: "
              + (f"median {statistics.median(ratios):.3f}, from {min(ratios):.3f} to "
                 f"{max(ratios):.3f} ({len(ratios)} modes)." if ratios else "none to compare."),
              "", "| task | " + " | ".join(f"{m}: here / there" for m in modes) + " |",
              "|---|" + "---|" * len(modes)]
    for n in shared:
        lines.append(f"| {n} | " + " | ".join(
            f"{_figure(here[n].get(m))} / {_figure(there[n].get(m))}" for m in modes) + " |")
    return lines


def _task_number(name: str) -> int:
    head = name.split("_")[0]
    return int(head) if head.isdigit() else 0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("run_dir", type=Path)
    p.add_argument("--since", type=int, default=0, help="only candidates from this id on")
    p.add_argument("--against", type=Path, help="another run of the same tasks: its "
                   "baselines beside this run's")
    p.add_argument("--bar-rank", type=int, default=1, help="replay eval.timing."
                   "give_up_behind_best with this best figure as the bar (search.bar_rank)")
    p.add_argument("--tag", default="run")
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args()
    found = collect(args.run_dir, args.since)
    found["baselines"] = collect_baselines(args.run_dir)
    found["behind_best"] = behind_best(args.run_dir, rank=args.bar_rank)
    found["shared_windows"] = shared_windows(args.run_dir)
    found["could_share"] = could_share(args.run_dir)
    calls = call_windows(args.run_dir)
    found["at_once"] = at_once(verdict_spans(args.run_dir), calls)
    found["held_alone"] = held_alone(args.run_dir, calls)
    found["lanes"] = lanes(args.run_dir)
    if args.against is not None:
        found["against"] = collect_baselines(args.against)
    date, command = now(), this_command()
    base = args.out / f"search-time-{args.tag}"
    args.out.mkdir(parents=True, exist_ok=True)
    with_ext(base, ".json").write_text(json.dumps(
        {"command": command, "date": date, "run_dir": str(args.run_dir), **found}, indent=1))
    with_ext(base, ".md").write_text(render(found, command, date, args.run_dir))
    print(with_ext(base, ".md").read_text())


if __name__ == "__main__":
    main()
