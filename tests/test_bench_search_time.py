"""bench/search_time.py: where a run's evaluation time went, read from its store alone."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest

from pike.evaluate.verdict import Verdict
from pike.store import BASELINE_STATE, RunStore
from tests.conftest import bench_script


@pytest.fixture(scope="module")
def search_time() -> ModuleType:
    return bench_script("search_time")


def _judged(store: RunStore, idea: str, total: float, paused: float,
            steps: dict[str, float]) -> int:
    cid = store.add_candidate("9_Gemm", "src", parent_id=None, role="offline", round=0,
                              branch=0, idea=idea)
    store.set_verdict(cid, Verdict(status="ok", speedup=1.0,
                                   phase_seconds={"total": total, "paused": paused},
                                   steps=steps))
    return cid


def test_steps_are_split_by_kind_and_counted_per_task(tmp_path: Path,
                                                      search_time: ModuleType) -> None:
    run = tmp_path / "run"
    store = RunStore.create(run, {}, "test")
    try:
        store.add_task("9_Gemm", "9_Gemm.py", "0" * 64, "src")
        _judged(store, "tf32", 40.0, 10.0, {"timing": 3.0, "timing.blocks": 2.0,
                                            "load_build_warm_up": 5.0})
        _judged(store, "cuda_graph", 60.0, 20.0, {"timing": 5.0})
        later = _judged(store, "autocast_fp16 + compile:default", 200.0, 120.0,
                        {"load_build_warm_up": 70.0})
        store.add_candidate("9_Gemm", "src", parent_id=None, role="offline", round=1,
                            branch=1, idea="autocast_fp16 + tf32")  # in flight
        store.set_state("9_Gemm", "offline_seconds", 130.0)
    finally:
        store.close()
    found = search_time.collect(run)
    task = found["tasks"]["9_Gemm"]
    assert (task["judged"], task["ok"], task["unfinished"]) == (3, 3, 1)
    assert task["budget_s"] == 130.0 and not task["done"]
    assert task["cheap_s"] == [40.0, 60.0] and task["build_s"] == [200.0]
    # the window's time outside its kept blocks, of verdicts whose blocks were recorded
    assert task["window_extra_s"] == [1.0]
    cheap, build = found["kinds"]["cheap"], found["kinds"]["build"]
    assert cheap["paused"] == [10.0, 20.0] and cheap["timing"] == [3.0, 5.0]
    assert cheap["load_build_warm_up"] == [5.0, 0.0] and build["paused"] == [120.0]
    text = search_time.render(found, "python bench/search_time.py run", "2026-01-01", run)
    assert "| 9_Gemm | 3 (3) | 1 | no |" in text
    assert next(line for line in text.splitlines() if line.startswith("| 9_Gemm |")
                ).endswith("| 1.00 |")
    assert "| cheap | 2 | 50.0 / 100 | 15.0 / 30 |" in text
    assert search_time.collect(run, since=later)["tasks"]["9_Gemm"]["judged"] == 1


def _baseline(store: RunStore, task: str, modes: list[dict]) -> None:
    store.set_state(task, BASELINE_STATE, {"task": task, "modes": modes})


def test_baselines_say_what_held_the_device_alone_and_compare_with_another_run(
        tmp_path: Path, search_time: ModuleType) -> None:
    runs = []
    for name, prebuild, tuned in (("here", 20.0, 2.10), ("there", None, 2.00)):
        run = tmp_path / name
        store = RunStore.create(run, {}, "test")
        try:
            store.add_task("17_Conv", "17_Conv.py", "0" * 64, "src")
            _baseline(store, "17_Conv", [
                {"mode": "eager", "speedup_vs_eager": 1.0, "build_s": 0.1},
                {"mode": "compile:default", "speedup_vs_eager": 1.9, "build_s": 3.0},
                {"mode": "compile:max-autotune-no-cudagraphs", "speedup_vs_eager": tuned,
                 "build_s": 25.0, "prebuild_s": prebuild},
                {"mode": "compile:reduce-overhead", "speedup_vs_eager": None, "build_s": 1.0,
                 "error": "incorrect"}])
        finally:
            store.close()
        runs.append(run)
    here, there = (search_time.collect_baselines(r) for r in runs)
    tuned = here["17_Conv"]["compile:max-autotune-no-cudagraphs"]
    assert tuned["alone_s"] == 5.0 and tuned["build_s"] == 25.0
    assert here["17_Conv"]["compile:default"]["alone_s"] == 0.0  # built beside others
    assert there["17_Conv"]["compile:max-autotune-no-cudagraphs"]["alone_s"] == 25.0
    text = "\n".join(search_time.render_baselines(here, there))
    assert "held the device alone for 5 s together" in text
    assert "| 17_Conv | 1.90x, 3.0 | 2.10x, 25.0 (5.0) | failed, 1.0 |" in text
    assert "Device-alone build seconds: 5 here, 25 there" in text
    # the failed mode is left out of the ratios: 1.9/1.9 and 2.1/2.0
    assert "median 1.025, from 1.000 to 1.050 (2 modes)" in text
    assert "| 17_Conv | 1.90x / 1.90x | 2.10x / 2.00x | failed / failed |" in text


def test_a_budget_is_replayed_under_both_rules_for_stopped_time(
        search_time: ModuleType) -> None:
    # Two candidates side by side for 10 s, both stopped for the same 6 s window; then one
    # alone for 10 s, stopped for 8 of them; then 100 s with none (a device call's end).
    spans = [(0.0, 10.0, 6.0), (0.0, 10.0, 6.0), (10.0, 20.0, 8.0), (120.0, 130.0, 0.0)]
    replay = search_time.replay_budget(spans, width=4)
    assert replay["busy"] == pytest.approx(30.0)
    assert replay["lanes"] == pytest.approx(30.0 - 20.0 / 4)
    assert replay["beside"] == pytest.approx(30.0 - 6.0 / 2 - 6.0 / 2 - 8.0)
    assert search_time.replay_budget([], width=4)["busy"] == 0.0


def test_windows_behind_the_best_are_replayed_in_verdict_order(
        tmp_path: Path, search_time: ModuleType) -> None:
    from pike.evaluate.verdict import TimingStats

    run = tmp_path / "run"
    store = RunStore.create(run, {}, "test")
    eager = TimingStats.from_samples([10.0, 10.0, 10.0])

    def judged(task: str, ms: list[float], **fields: object) -> None:
        cid = store.add_candidate(task, "src", parent_id=None, role="offline", round=0,
                                  branch=0, idea="x")
        runtime = TimingStats.from_samples(ms)
        store.set_verdict(cid, Verdict(status="ok", runtime=runtime, reference=eager,
                                       speedup=10.0 / runtime.median_ms,
                                       steps={"timing": 3.0}, **fields))

    try:
        for task in ("9_Gemm", "12_Gemm"):
            store.add_task(task, f"{task}.py", "0" * 64, "src")
        judged("9_Gemm", [2.0, 2.0, 2.0])  # 5x, nothing before it
        judged("9_Gemm", [1.0, 1.0, 1.0])  # 10x: the new best
        judged("9_Gemm", [9.0, 9.0, 1.0])  # 1.1x, but its fastest call 10x: not behind
        judged("9_Gemm", [5.0, 5.0, 5.0])  # 2x, 5 times behind 10x
        judged("12_Gemm", [5.0, 5.0, 5.0])  # another task's first: nothing before it
        judged("9_Gemm", [5.0] * 3, timed_rounds=3, behind_best=10.0)  # cut by the rule
        store.add_candidate("9_Gemm", "src", parent_id=None, role="offline", round=1,
                            branch=0, idea="y")  # in flight
    finally:
        store.close()
    found = search_time.behind_best(run)
    assert found == {"timed": 5, "timing_s": 15.0, "behind": 1, "behind_s": 3.0, "cut": 1,
                     "factor": 1.25, "rank": 1}
    # the 2x one against the second best before it (5x): behind; against the third
    # (1.1x, the median of the one whose fastest call was 10x): not
    assert search_time.behind_best(run, rank=2)["behind"] == 1
    assert search_time.behind_best(run, rank=3)["behind"] == 0
    text = search_time.render({"tasks": {}, "kinds": {}, "behind_best": found}, "cmd", "d", run)
    assert "Of 5 candidates' windows timed in full (15 s), 1 (3 s)" in text
    assert "Cut short by it in this run: 1." in text


def test_shared_windows_are_counted_once_per_window(tmp_path: Path,
                                                   search_time: ModuleType) -> None:
    run = tmp_path / "run"
    store = RunStore.create(run, {}, "test")
    try:
        store.add_task("9_Gemm", "9_Gemm.py", "0" * 64, "src")
        for shared in (3, 3, 3, None):  # one window of three, and one of its own
            cid = store.add_candidate("9_Gemm", "src", parent_id=None, role="offline",
                                      round=0, branch=0, idea="x")
            store.set_verdict(cid, Verdict(status="ok", steps={"timing": 4.0},
                                           window_candidates=shared))
    finally:
        store.close()
    found = search_time.shared_windows(run)
    # the window of three: eager and three candidates, 4 s; alone, three windows of two
    # timers each (2 s each at the same length per timer)
    assert found == {"by_size": {"3": 3}, "window_s": pytest.approx(4.0),
                     "alone_s": pytest.approx(6.0)}
    text = search_time.render({"tasks": {}, "kinds": {}, "shared_windows": found}, "cmd",
                              "d", run)
    assert "3 in windows of 3" in text and "about 6 s" in text


def test_windows_that_began_while_others_of_their_task_waited_could_have_been_shared(
        tmp_path: Path, search_time: ModuleType) -> None:
    import datetime as dt

    run = tmp_path / "run"
    store = RunStore.create(run, {}, "test")
    t0 = dt.datetime(2026, 12, 2, tzinfo=dt.timezone.utc)

    def judged(task: str, window_start: float, wait: float, timing: float = 4.0) -> None:
        cid = store.add_candidate(task, "src", parent_id=None, role="offline", round=0,
                                  branch=0, idea="x")
        store.set_verdict(cid, Verdict(status="ok", steps={
            "timing": timing, "wait_for_device": wait, "final_check": 1.0}))
        ended = t0 + dt.timedelta(seconds=window_start + timing + 1.0)
        with store._db() as db:  # when it was judged: its window's end and final check
            db.execute("UPDATE candidates SET evaluated_at = ? WHERE id = ?",
                       (ended.isoformat(), cid))

    try:
        for task in ("9_Gemm", "12_Gemm"):
            store.add_task(task, f"{task}.py", "0" * 64, "src")
        judged("9_Gemm", 10.0, 0.0)  # leads: the next two waited as it began
        judged("9_Gemm", 14.0, 6.0)  # waiting from 8 s
        judged("9_Gemm", 18.0, 9.0)  # waiting from 9 s
        judged("12_Gemm", 22.0, 15.0)  # another task's: never in 9's window
        judged("9_Gemm", 30.0, 1.0)  # began waiting after: alone
    finally:
        store.close()
    found = search_time.could_share(run)
    assert (found["windows"], found["shared"], found["joined"]) == (5, 1, 2)
    assert found["saved_s"] == pytest.approx(4.0) and found["timing_s"] == pytest.approx(20.0)
    assert search_time.could_share(run, most=2)["joined"] == 1
    text = search_time.render({"tasks": {}, "kinds": {}, "could_share": found}, "cmd", "d", run)
    assert "2 of those waiting would have joined them, saving about 4 s" in text


def test_evaluations_at_once_are_counted_per_device_call(tmp_path: Path,
                                                         search_time: ModuleType) -> None:
    import datetime as dt

    run = tmp_path / "run"
    store = RunStore.create(run, {"eval": {"workers": 2}}, "pike bench t --jobs 3 --workers 2")
    try:
        store.add_task("9_Gemm", "9_Gemm.py", "0" * 64, "src")
        _judged(store, "tf32", 40.0, 0.0, {})
        _judged(store, "cuda_graph", 20.0, 0.0, {})
        end = max(r.evaluated_at for r in store.candidates())
    finally:
        store.close()
    last = dt.datetime.fromisoformat(end)
    clock = [(last + dt.timedelta(seconds=s)).strftime("%H:%M:%S") for s in (-60, 1, 5, 100)]
    (run / "bench-1.log").write_text(f"{clock[0]} driver: first\nnoise\n{clock[1]} driver: rc\n")
    (run / "bench-2.log").write_text(f"{clock[2]} driver: resume\n{clock[3]} driver: rc\n")
    calls = search_time.call_windows(run)
    assert [c[0] for c in calls] == ["bench-1.log", "bench-2.log"]
    found = search_time.at_once(search_time.verdict_spans(run), calls)
    first, second = found
    assert first["verdicts"] == 2 and second["verdicts"] == 0
    # 61 s sampled every 5 s: 20 s with none, 20 with one (the 40 s one), 20 with both
    assert first["mean"] == pytest.approx((4 * 0 + 4 * 1 + 5 * 2) / 13, abs=0.2)
    assert first["by_minute"][0] < 1.5 and second["mean"] == 0.0
    assert search_time.lanes(run) == "3 jobs x 2 workers = 6"


def test_device_calls_across_midnight_are_placed_on_their_days(search_time: ModuleType) -> None:
    """The driver's stamps are times of day only: a call from 23:56 to 00:04 lasts eight
    minutes, and a call the next evening comes after it (the H200 level2 bench had one
    read as -85,905 s)."""
    import datetime as dt

    def at(text: str) -> float:
        return dt.datetime.fromisoformat(text).timestamp()

    near = at("2026-12-02T20:31:00+00:00")  # the run's first verdict
    assert search_time._time_of_day("20:30:26", near, after=False) == at(
        "2026-12-02T20:30:26+00:00")
    assert search_time._time_of_day("23:59:50", at("2026-12-03T00:01:00+00:00"),
                                    after=False) == at("2026-12-02T23:59:50+00:00")
    start = search_time._time_of_day("23:56:39", near, after=True)
    end = search_time._time_of_day("00:04:54", start, after=True)
    assert end - start == 495
    assert search_time._time_of_day("21:00:00", end, after=True) == at(
        "2026-12-03T21:00:00+00:00")


def test_time_outside_a_verdict_is_counted_only_within_one_device_call(
        tmp_path: Path, search_time: ModuleType) -> None:
    """A candidate made 30 s before its 40 s verdict began was held outside it (in the pool)
    for 30 s; one made in an earlier device call and judged anew after the cut was not."""
    import datetime as dt

    run = tmp_path / "run"
    store = RunStore.create(run, {}, "test")
    t0 = dt.datetime(2026, 12, 3, 8, 0, 0, tzinfo=dt.timezone.utc)

    def judged(made: float, ended: float) -> None:
        cid = store.add_candidate("9_Gemm", "src", parent_id=None, role="offline", round=0,
                                  branch=0, idea="tf32")
        store.set_verdict(cid, Verdict(status="ok", speedup=1.0, phase_seconds={"total": 40.0}))
        with store._db() as db:
            db.execute("UPDATE candidates SET created_at = ?, evaluated_at = ? WHERE id = ?",
                       ((t0 + dt.timedelta(seconds=made)).isoformat(),
                        (t0 + dt.timedelta(seconds=ended)).isoformat(), cid))

    try:
        store.add_task("9_Gemm", "9_Gemm.py", "0" * 64, "src")
        judged(100.0, 170.0)  # 30 s held
        judged(100.0, 140.0)  # none
        judged(10.0, 700.0)  # made in the first call, judged in the second
    finally:
        store.close()
    (run / "bench-1.log").write_text("08:00:00 driver: first\n08:05:00 driver: rc\n")
    (run / "bench-2.log").write_text("08:06:00 driver: resume\n08:15:00 driver: rc\n")
    found = search_time.collect(run)
    assert sorted(found["tasks"]["9_Gemm"]["outside_s"]) == pytest.approx([0.0, 30.0])
    text = search_time.render(found, "cmd", "d", run)
    assert "| 40 | - | 15 |" in text  # median cheap, builds, outside its verdict
