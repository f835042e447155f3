"""Each offline search of a run, replayed under this pike's search from its own verdicts.

    python bench/replay_offline.py RUN_DIR [--speed 20] [--workers N] [--tag level2-h200] [--out bench/results]

Nothing is judged again: the search (search/offline.py, as checked out) runs with a judge
that answers each transformation set the run judged with that set's stored verdict, after
its recorded wall time (made to verdict, divided by --speed, and the search's clock sped up
by as much), so its budget reads as the run's did. A set the run never judged is answered
at once as correct and 1.0x over eager, and named: where the replay asks for one, this
pike's search would have gone on where the run's stopped. Only a search made and judged
within one device call is replayed (one resumed across calls started its later part from
the store, with the gap between calls behind it), and only a finished one (not one a
call's end cut off); the others are listed as skipped. The budget column is a check of the
replay itself: the seconds the run's search counted and the replay's (the sets it never
judged add none). Not exact where a search's verdicts came within tens of milliseconds of
each other: which sets start ahead of a round then follows the order the replay's
threads see them in, and may differ by a set or two from the run's (a lower --speed
narrows it).
With --workers, each search has that many lanes instead of the run's: a what-if whose
durations are still those made beside the run's own lanes (fewer lanes, fewer timing
windows stopping the others: on a GPU the evaluations would be shorter than replayed).
Each search's replayed wall time, from its start to its last verdict, is in the run's
seconds. Results go to bench/results/replay-offline-<tag>.json and .md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Iterator
from pathlib import Path
from tempfile import TemporaryDirectory

from common import RESULTS, now, this_command, with_ext
from search_time import _same_call, _stamp, call_windows

from pike.agents.offline import named_in
from pike.evaluate.verdict import Verdict
from pike.search import baseline_modes
from pike.search import offline as offline_search
from pike.store import BASELINE_STATE, DONE_STATE, RunStore


def replay(run_dir: Path, task: str, speed: float, workers: int | None = None) -> dict:
    """`workers`: lanes of the replayed search, where not the run's own (a what-if: the
    run's recorded durations were made beside its own number of lanes)."""
    with RunStore.open(run_dir) as store:
        rows = [r for r in store.candidates(task) if r.role == "offline" and r.verdict]
        source = next(t["source"] for t in store.tasks() if t["name"] == task)
        baseline = store.get_state(task, BASELINE_STATE)
        spent_run = store.get_state(task, "offline_seconds")
        config = store.config()
    offline = config["search"]["offline"]
    recorded = {frozenset(r.idea.split(" + ")):
                (_stamp(r.evaluated_at) - _stamp(r.created_at), r.verdict) for r in rows}
    asked: list[str] = []
    made: list[float] = []  # the replay's clock at each verdict

    def judge(sources: list[str]) -> Iterator[tuple[int, Verdict]]:
        names = frozenset(named_in(sources[0]))
        seconds, verdict = recorded.get(names, (0.0, None))
        if verdict is None:
            asked.append(" + ".join(sorted(names)))
            verdict = Verdict(status="ok", speedup=1.0)
        time.sleep(seconds / speed)
        made.append(time.monotonic())
        yield 0, verdict

    real_clock = offline_search._clock
    offline_search._clock = lambda: real_clock() * speed
    try:
        began = time.monotonic()
        with (TemporaryDirectory() as tmp,
              RunStore.create(Path(tmp) / "run", {}, "replay") as again):
            again.add_task(task, "replayed", "-", source)
            offline_search.OfflineSearch(
                again, task, source, config["eval"]["device"], judge=judge,
                max_candidates=offline["max_candidates"], max_seconds=offline["max_seconds"],
                batch=workers or config["eval"]["workers"],
                compile_speedups=baseline_modes.compile_speedups(baseline),
                skip=baseline_modes.hopeless_modes(baseline),
                known_alone=baseline_modes.no_gain_modes(baseline),
                build_seconds=baseline_modes.compile_build_seconds(baseline)).run()
            replayed = len(again.candidates(task))
            spent = again.get_state(task, "offline_seconds")
    finally:
        offline_search._clock = real_clock
    return {"task": task, "judged": len(rows), "replayed": replayed, "new": asked,
            "spent_run": spent_run, "spent_replay": spent,
            "wall_replay": (max(made) - began) * speed if made else 0.0,
            "workers": workers or config["eval"]["workers"]}


def within_one_call(rows: list, calls: list[tuple[str, float, float]]) -> bool:
    """The search was made and judged in one device call of the run's logs (a run without
    them is not taken as one call)."""
    spans = [(_stamp(r.created_at), _stamp(r.evaluated_at)) for r in rows if r.evaluated_at]
    if not spans or not calls:
        return False
    return _same_call(min(s for s, _ in spans), max(e for _, e in spans), calls)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("run_dir", type=Path)
    p.add_argument("--speed", type=float, default=20.0, help="replay this many times faster")
    p.add_argument("--tag", default="run")
    p.add_argument("--out", type=Path, default=RESULTS)
    p.add_argument("--workers", type=int, default=None,
                   help="lanes per search, where not the run's (a what-if: the durations "
                        "replayed were made beside the run's own lanes)")
    args = p.parse_args()
    calls = call_windows(args.run_dir)
    with RunStore.open(args.run_dir) as store:
        tasks = {t["name"]: [r for r in store.candidates(t["name"]) if r.role == "offline"]
                 for t in store.tasks()}
        done = {t for t in tasks if store.get_state(t, DONE_STATE)}
    found, skipped = [], []
    for task, rows in tasks.items():
        if task not in done or any(r.verdict is None for r in rows) \
                or not within_one_call(rows, calls):
            skipped.append(task)
            continue
        result = replay(args.run_dir, task, args.speed, args.workers)
        found.append(result)
        print(f"{task}: judged {result['judged']}, replayed {result['replayed']}, "
              f"new {result['new']}", flush=True)
    date, command = now(), this_command()
    base = args.out / f"replay-offline-{args.tag}"
    args.out.mkdir(parents=True, exist_ok=True)
    data = {"command": command, "date": date, "run_dir": str(args.run_dir),
            "speed": args.speed, "workers": args.workers, "replayed": found,
            "skipped": skipped}
    with_ext(base, ".json").write_text(json.dumps(data, indent=1))
    with_ext(base, ".md").write_text(render(data))
    print(with_ext(base, ".md").read_text())


def render(data: dict) -> str:
    lines = [f"# Offline searches replayed from their verdicts: {Path(data['run_dir']).name}", "",
             f"- command: `{data['command']}`", f"- date: {data['date']}",
             f"- replayed {data['speed']:g} times faster; the search as checked out, each set "
             "answered with the run's verdict after its recorded wall time"]
    if data.get("workers"):
        lines.append(f"- with {data['workers']} lanes per search, not the run's: a what-if, "
                     "its verdicts' durations made beside the run's own lanes")
    lines += ["", "| task | judged in the run | replayed | sets the run never judged (asked) "
              "| budget seconds: run / replay | replayed wall, start to last verdict (s) |",
              "|---|---|---|---|---|---|"]
    for r in data["replayed"]:
        new = "; ".join(r["new"]) or "-"
        lines.append(f"| {r['task']} | {r['judged']} | {r['replayed']} | {new} | "
                     f"{r['spent_run'] or 0:.0f} / {r['spent_replay'] or 0:.0f} | "
                     f"{r.get('wall_replay', 0.0):.0f} |")
    went_on = [r for r in data["replayed"] if r["new"]]
    lines += ["", f"{len(went_on)} of {len(data['replayed'])} searches go on past where the "
              "run's stopped (a new set's replayed verdict is a placeholder: 1.0x at once, so "
              "the counts after it are not a forecast).",
              f"Median judged in the run: {statistics.median([r['judged'] for r in data['replayed']] or [0])}."]
    if data["skipped"]:
        lines += ["", "Not replayed (resumed across device calls, not finished, or not offline): "
                  + ", ".join(data["skipped"]) + "."]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
