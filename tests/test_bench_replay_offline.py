"""bench/replay_offline.py: a run's offline searches replayed from their own verdicts."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

from pike.agents.offline import applicable, render
from pike.evaluate.verdict import Verdict
from pike.store import DONE_STATE, RunStore
from pike.task import Task
from tests.conftest import bench_script


def test_a_search_is_replayed_where_made_in_one_call_and_asks_for_what_the_run_did_not_judge(
        tmp_path: Path, mlp_task: Task) -> None:
    replay_offline = bench_script("replay_offline")
    run = tmp_path / "run"
    config = {"eval": {"device": "cpu", "workers": 1},
              "search": {"offline": {"max_candidates": 2, "max_seconds": 1000.0}}}
    names = applicable(mlp_task.source, "cpu")
    assert len(names) >= 2
    store = RunStore.create(run, config, "test")
    try:
        store.add_task(mlp_task.name, str(mlp_task.path), mlp_task.sha256, mlp_task.source)
        # the run judged the first set, then stopped
        cid = store.add_candidate(mlp_task.name, render(mlp_task.source, (names[0],)),
                                  parent_id=None, role="offline", round=0, branch=0,
                                  idea=names[0])
        store.set_verdict(cid, Verdict(status="ok", speedup=1.2))
        store.set_state(mlp_task.name, DONE_STATE, True)
        rows = store.candidates(mlp_task.name)
    finally:
        store.close()
    clock = dt.datetime.now(dt.timezone.utc)
    (run / "bench-1.log").write_text("".join(
        f"{(clock + dt.timedelta(seconds=s)):%H:%M:%S} driver: a call\n" for s in (-60, 60)))
    calls = replay_offline.call_windows(run)
    assert replay_offline.within_one_call(rows, calls)
    assert not replay_offline.within_one_call(rows, [("bench-1.log", 0.0, 1.0)])

    found = replay_offline.replay(run, mlp_task.name, speed=50.0)
    assert (found["judged"], found["replayed"]) == (1, 2)
    assert found["new"] == [names[1]]  # this search goes on where the run's stopped
    text = replay_offline.render({"command": "c", "date": "d", "run_dir": str(run),
                                  "speed": 50.0, "replayed": [found], "skipped": ["x"]})
    assert f"| {mlp_task.name} | 1 | 2 | {names[1]} |" in text
    assert "1 of 1 searches go on" in text and "not offline): x." in text
    assert "lanes per search" not in text

    # a what-if with more lanes: both sets at once, the search's wall in the run's seconds
    wider = replay_offline.replay(run, mlp_task.name, speed=50.0, workers=2)
    assert (wider["replayed"], wider["workers"], found["workers"]) == (2, 2, 1)
    assert 0.0 <= wider["wall_replay"] and 0.0 <= found["wall_replay"]
    text = replay_offline.render({"command": "c", "date": "d", "run_dir": str(run),
                                  "speed": 50.0, "workers": 2, "replayed": [wider],
                                  "skipped": []})
    assert "with 2 lanes per search" in text
