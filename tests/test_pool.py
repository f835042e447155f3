"""The evaluation pool: batches judged at once, builds before the device lock, a lost worker's
candidate queued once more, one verdict per candidate into the store."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml

from pike.config import EvalConfig
from pike.errors import TaskError
from pike.evaluate import baseline as baseline_module
from pike.evaluate import (
    candidate_windows,
    device_lock,
    reference_cache,
    reference_start,
    shared_window,
)
from pike.evaluate import judge as judge_module
from pike.evaluate import pool as pool_module
from pike.evaluate import reference as reference_module
from pike.evaluate.pool import Lane, LocalPool, requeue_once
from pike.evaluate.verdict import Verdict
from pike.search.offline import OfflineSearch
from pike.store import RunStore
from pike.task import Task
from tests.conftest import CANDIDATES
from tests.fake_openai import FakeOpenAI
from tests.test_optimize import MLP, Scripted, pike, spec

GOOD = (CANDIDATES / "fused.py").read_text()
WRONG = (CANDIDATES / "wrong_values.py").read_text()
RAISES = (CANDIDATES / "forward_raises.py").read_text()


def ok(speedup: float = 1.5) -> Verdict:
    return Verdict(status="ok", trials=2, trials_passed=2, speedup=speedup)


# ---- requeue_once -------------------------------------------------------------------------


def test_a_lost_worker_gets_one_more_try_then_a_crashed_verdict() -> None:
    tries: list[int] = []

    def lost_once(n: int) -> Verdict:
        tries.append(n)
        if n == 0:
            raise OSError("worker process vanished")
        return ok()

    assert requeue_once(lost_once, lambda err: True).status == "ok" and tries == [0, 1]

    def always_lost(n: int) -> Verdict:
        raise ConnectionError(f"node {n} died")

    verdict = requeue_once(always_lost, lambda err: True)
    assert verdict.status == "crashed"
    assert "lost twice" in verdict.message and "node 0 died" in verdict.message
    assert "node 1 died" in verdict.message


def test_errors_that_are_not_lost_workers_propagate() -> None:
    def broken_task(n: int) -> Verdict:
        raise TaskError("the reference fails")

    with pytest.raises(TaskError):
        requeue_once(broken_task, lambda err: not isinstance(err, TaskError))


# ---- LocalPool with a stand-in evaluator ------------------------------------------------


def test_the_pool_runs_a_batch_at_once_and_yields_each_candidate_once(mlp_task: Task) -> None:
    together = threading.Barrier(3, timeout=20)  # breaks unless three run at the same time

    def evaluator(task: Task, source: str, cfg: EvalConfig) -> Verdict:
        together.wait()
        return ok(float(source))

    with LocalPool(EvalConfig(device="cpu"), workers=3, evaluator=evaluator) as pool:
        got = list(pool.judge_many(mlp_task, ["1", "2", "3"]))
    assert sorted(i for i, _ in got) == [0, 1, 2]
    assert {i: v.speedup for i, v in got} == {0: 1.0, 1: 2.0, 2: 3.0}


def test_tasks_sharing_a_pool_each_get_their_own_lane(mlp_task: Task) -> None:
    """pike bench --jobs 2 --workers 2: each task has two candidates in evaluation at once,
    never more, so neither task's batch waits behind the other's while its budget runs."""
    other = dataclasses.replace(mlp_task, name="2_Other")
    together = threading.Barrier(4, timeout=20)  # breaks unless both tasks run two each
    in_flight: Counter[str] = Counter()
    most: Counter[str] = Counter()
    lock = threading.Lock()

    def evaluator(task: Task, source: str, cfg: EvalConfig) -> Verdict:
        with lock:
            in_flight[task.name] += 1
            most[task.name] = max(most[task.name], in_flight[task.name])
        if source in ("1", "2"):
            together.wait()
        with lock:
            in_flight[task.name] -= 1
        return ok(float(source))

    with LocalPool(EvalConfig(device="cpu"), workers=4, evaluator=evaluator) as pool:
        lanes = {t.name: Lane(pool, 2) for t in (mlp_task, other)}
        got: dict[str, list[tuple[int, Verdict]]] = {}

        def run(task: Task) -> None:
            got[task.name] = list(lanes[task.name].judge_many(task, ["1", "2", "3", "4"]))

        threads = [threading.Thread(target=run, args=(t,)) for t in (mlp_task, other)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
    assert {name: sorted(i for i, _ in pairs) for name, pairs in got.items()} == {
        mlp_task.name: [0, 1, 2, 3], "2_Other": [0, 1, 2, 3]}
    assert most == {mlp_task.name: 2, "2_Other": 2}
    assert lanes[mlp_task.name].width == 2


def test_a_lost_evaluation_is_retried_on_another_device(mlp_task: Task,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pool_module, "resolve_device", lambda d: d)  # no GPU here
    seen: list[str] = []

    def evaluator(task: Task, source: str, cfg: EvalConfig) -> Verdict:
        seen.append(str(cfg.device))
        if len(seen) == 1:
            raise OSError("the evaluation's host process died")
        return ok()

    pool = LocalPool(EvalConfig(device="cpu"), workers=1, devices=["cuda:0", "cuda:1"],
                     evaluator=evaluator)
    assert pool.judge(mlp_task, GOOD).ok
    assert seen[0] != seen[1]  # the second try went to the other lane
    assert pool._busy == {"cuda:0": 0, "cuda:1": 0}


def test_a_candidate_out_of_gpu_memory_beside_others_is_judged_once_more(
        mlp_task: Task, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    """Two at once on one GPU: the first to finish ran out of memory while the other was
    on the card, so it is judged again; alone, an out-of-memory verdict stands."""
    monkeypatch.setattr(pool_module, "resolve_device", lambda d: d)
    together = threading.Barrier(2, timeout=20)
    tries: Counter[str] = Counter()
    oom = Verdict(status="runtime_error", phase="check",
                  message="torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 256 MiB")

    def evaluator(task: Task, source: str, cfg: EvalConfig) -> Verdict:
        tries[source] += 1
        if tries[source] == 1 and source in ("crowded", "other"):
            together.wait()  # both on the GPU at once
            if source == "crowded":
                return oom
            time.sleep(0.5)  # still on the card when "crowded" ends
            return ok()
        return oom if source == "alone" else ok()

    with LocalPool(EvalConfig(device="cpu"), workers=2, devices=["cuda:0"],
                   evaluator=evaluator) as pool:
        got = dict(pool.judge_many(mlp_task, ["crowded", "other"]))
        alone = pool.judge(mlp_task, "alone")
    assert got[0].ok and got[1].ok
    assert tries == {"crowded": 2, "other": 1, "alone": 1}
    assert alone.status == "runtime_error"
    # the log says which task, in which phase, and what ran out (the GPU here)
    said = [r.getMessage() for r in caplog.records if "judged once more" in r.getMessage()]
    assert said and mlp_task.name in said[0] and "phase check" in said[0]
    assert "CUDA out of memory. Tried to allocate 256 MiB" in said[0]


def test_the_second_try_after_running_out_beside_others_waits_for_room(
        mlp_task: Task, monkeypatch: pytest.MonkeyPatch) -> None:
    """Four on one GPU, one runs out of memory: its second try starts only once at most two
    (half the pool) are left beside it, a candidate that comes meanwhile waits behind it
    rather than taking the room, and while the second try runs no more than two are beside
    it."""
    monkeypatch.setattr(pool_module, "resolve_device", lambda d: d)
    on_card: list[str] = []
    seen_beside: dict[str, list[str]] = {}
    starts: list[str] = []
    held = {name: threading.Event() for name in ("a", "b", "c", "crowded")}
    together = threading.Barrier(4, timeout=20)
    tries: Counter[str] = Counter()
    lock = threading.Lock()
    oom = Verdict(status="runtime_error", phase="check",
                  message="torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1 GiB")

    def evaluator(task: Task, source: str, cfg: EvalConfig) -> Verdict:
        with lock:
            tries[source] += 1
            seen_beside[f"{source}{tries[source]}"] = list(on_card)
            on_card.append(source)
            starts.append(f"{source}{tries[source]}")
        try:
            if source == "crowded" and tries[source] == 1:
                together.wait()
                time.sleep(0.1)
                return oom
            if source in held:
                if source != "crowded":
                    together.wait()
                held[source].wait(timeout=20)
            return ok()
        finally:
            with lock:
                on_card.remove(source)

    def until(check: Any) -> None:
        deadline = time.monotonic() + 20
        while not check():
            assert time.monotonic() < deadline
            time.sleep(0.02)

    with LocalPool(EvalConfig(device="cpu"), workers=5, devices=["cuda:0"],
                   evaluator=evaluator) as pool:
        batch = pool._executor.submit(lambda: dict(pool.judge_many(
            mlp_task, ["crowded", "a", "b", "c"])))
        until(lambda: pool._draining["cuda:0"] == 1)  # the second try waits for room
        late = pool._executor.submit(pool.judge, mlp_task, "late")
        time.sleep(0.3)
        assert tries["crowded"] == 1 and tries["late"] == 0  # neither started beside three
        held["a"].set()
        until(lambda: tries["crowded"] == 2)
        time.sleep(0.3)
        assert tries["late"] == 0  # the second try runs beside b and c: its room is full
        held["b"].set()
        until(lambda: tries["late"] == 1)  # now one left beside it, and room for one more
        assert sorted(seen_beside["late1"]) == ["c", "crowded"]
        for event in held.values():
            event.set()
        got = batch.result(timeout=20)
        late_verdict = late.result(timeout=20)
        assert late_verdict.ok
    assert all(v.ok for v in got.values())
    # the time each was held back, and the first try that ran out beside others, are steps
    # of their verdicts (outside their own time): a search's budget leaves them out
    assert late_verdict.steps["wait_in_pool"] >= 0.25  # behind the second try's room
    assert set(pool_module.POOL_STEPS) <= set(got[0].steps)  # the names offline._stood reads
    # the first try (0.1 s) and the wait for room (0.3 s at least) apart
    assert 0.1 <= got[0].steps["crowded_try"] < 0.3 <= got[0].steps["wait_in_pool"]
    assert all("wait_in_pool" not in got[i].steps and "crowded_try" not in got[i].steps
               for i in (1, 2, 3))
    assert sorted(seen_beside["crowded2"]) == ["b", "c"]  # two beside it: half of five
    assert starts.index("late1") > starts.index("crowded2")  # the newcomer came after it
    assert pool._capped["cuda:0"] == [] and pool._busy["cuda:0"] == 0


def test_a_first_try_counts_as_the_candidates_own_where_the_second_runs_out_too(
        mlp_task: Task, monkeypatch: pytest.MonkeyPatch) -> None:
    """Out of memory beside another, then again with room: the candidate needs more than
    the card, so its first try is its own time (no `crowded_try` step) and the verdict
    stands."""
    monkeypatch.setattr(pool_module, "resolve_device", lambda d: d)
    together = threading.Barrier(2, timeout=20)
    tries: Counter[str] = Counter()
    oom = Verdict(status="runtime_error", phase="check",
                  message="torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 200 GiB")

    def evaluator(task: Task, source: str, cfg: EvalConfig) -> Verdict:
        tries[source] += 1
        if tries[source] == 1:
            together.wait()
            time.sleep(0.2 if source == "other" else 0.05)  # "other" still on the card
        return oom if source == "huge" else ok()

    with LocalPool(EvalConfig(device="cpu"), workers=2, devices=["cuda:0"],
                   evaluator=evaluator) as pool:
        got = dict(pool.judge_many(mlp_task, ["huge", "other"]))
    assert tries == {"huge": 2, "other": 1}
    assert got[0].status == "runtime_error" and "crowded_try" not in got[0].steps


def test_the_room_of_a_second_try_is_half_of_its_devices_share(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pool_module, "resolve_device", lambda d: d)
    pool = LocalPool(EvalConfig(device="cpu"), workers=15, devices=["cuda:0", "cuda:1"],
                     evaluator=lambda *a: ok())
    try:  # 15 over 2 GPUs: up to 8 on one, so a second try has at most 4 beside it
        assert pool._per_device() == 8
    finally:
        pool.close()


def test_a_candidate_waiting_for_room_stops_waiting_when_pike_ends(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from pike.evaluate import leftovers
    ending = threading.Event()
    monkeypatch.setattr(leftovers, "_ENDING", ending)
    monkeypatch.setattr(pool_module, "resolve_device", lambda d: d)
    with LocalPool(EvalConfig(device="cpu"), workers=2, devices=["cuda:0"],
                   evaluator=lambda *a: ok()) as pool:
        pool._take(avoid=[])  # one on the card that never ends
        outcomes: list[str] = []

        def wait(beside: int | None) -> None:
            try:
                pool._take(avoid=[], beside=beside)
                outcomes.append("started")
            except KeyboardInterrupt:
                outcomes.append("stopped")

        waiting = [threading.Thread(target=wait, args=(0,))]  # room: none beside
        waiting[0].start()
        while not pool._draining["cuda:0"]:
            time.sleep(0.01)
        waiting.append(threading.Thread(target=wait, args=(None,)))  # held back behind it
        waiting[1].start()
        time.sleep(0.2)
        assert outcomes == []
        ending.set()  # as end_children_and_remove_own_dirs does on Ctrl-C
        for thread in waiting:
            thread.join(timeout=5)
        assert outcomes == ["stopped", "stopped"]
        assert pool._busy["cuda:0"] == 1 and pool._draining["cuda:0"] == 0


def test_the_least_busy_gpu_gets_the_next_candidate(mlp_task: Task,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pool_module, "resolve_device", lambda d: d)
    together = threading.Barrier(4, timeout=20)
    lanes: list[str] = []

    def evaluator(task: Task, source: str, cfg: EvalConfig) -> Verdict:
        lanes.append(str(cfg.device))
        together.wait()
        return ok()

    with LocalPool(EvalConfig(device="cpu"), workers=4, devices=["cuda:0", "cuda:1"],
                   evaluator=evaluator) as pool:
        assert len(list(pool.judge_many(mlp_task, ["a", "b", "c", "d"]))) == 4
    assert Counter(lanes) == {"cuda:0": 2, "cuda:1": 2}


def test_the_offline_search_judges_each_round_as_one_batch(mlp_task: Task,
                                                           tmp_path: Path) -> None:
    together = threading.Barrier(2, timeout=20)
    calls: list[str] = []

    def evaluator(task: Task, source: str, cfg: EvalConfig) -> Verdict:
        calls.append(source)
        if len(calls) <= 2:  # round 1 on CPU: inference_mode and compile:default, at once
            together.wait()
        return ok(2.0 if "inference_mode" in source else 1.2)

    store = RunStore.create(tmp_path / "run", {}, "test")
    store.add_task(mlp_task.name, str(mlp_task.path), mlp_task.sha256, mlp_task.source)
    with LocalPool(EvalConfig(device="cpu"), workers=2, evaluator=evaluator) as pool:
        OfflineSearch(store, mlp_task.name, mlp_task.source, "cpu",
                      judge=lambda sources: pool.judge_many(mlp_task, sources),
                      max_candidates=4, max_seconds=120, batch=2).run()
    rows = store.candidates(mlp_task.name)
    assert [r.idea for r in rows] == ["inference_mode", "compile:default",
                                      "compile:default + inference_mode"]
    assert all(r.verdict is not None and r.verdict.ok for r in rows)


def test_the_offline_search_starts_the_next_candidate_as_soon_as_one_ends(
        mlp_task: Task, tmp_path: Path) -> None:
    """Two lanes, three candidates: the first is slow (a long compile) and ends only once
    the third has been judged, which needs the second's lane to take it at once; judged
    in fixed batches of two, the third would wait for the first, which waits for it."""
    third_judged = threading.Event()
    first_saw_third: list[bool] = []
    order: list[int] = []
    lock = threading.Lock()

    def evaluator(task: Task, source: str, cfg: EvalConfig) -> Verdict:
        with lock:
            order.append(len(order) + 1)
            mine = order[-1]
        if mine == 1:
            first_saw_third.append(third_judged.wait(10))
        if mine == 3:
            third_judged.set()
        return ok(1.0 + mine / 10)

    store = RunStore.create(tmp_path / "run", {}, "test")
    store.add_task(mlp_task.name, str(mlp_task.path), mlp_task.sha256, mlp_task.source)
    with LocalPool(EvalConfig(device="cpu"), workers=2, evaluator=evaluator) as pool:
        search = OfflineSearch(store, mlp_task.name, mlp_task.source, "cuda",
                               judge=lambda sources: pool.judge_many(mlp_task, sources),
                               max_candidates=10, max_seconds=120, batch=2)
        sets = [("tf32",), ("inference_mode",), ("channels_last",)]
        results = search._try(sets, 0)
    assert first_saw_third == [True], "the third candidate waited behind the first"
    assert all(results[s] is not None and results[s].ok for s in sets)
    rows = store.candidates(mlp_task.name)
    assert [r.idea for r in rows] == ["tf32", "inference_mode", "channels_last"]
    assert [r.branch for r in rows] == [0, 1, 2]


# ---- the real evaluator -------------------------------------------------------------------


@pytest.mark.parametrize("scope", ["pause_others", "every_gpu_use"])
def test_the_candidate_holds_the_device_from_its_start(mlp_task: Task, fast_config: EvalConfig,
                                                         monkeypatch: pytest.MonkeyPatch,
                                                         scope: str) -> None:
    """With every_gpu_use the candidate's start, load, build and warm-up call hold the
    device shared with its trials (one hold); with pause_others (the default) they hold
    nothing, since timers stop the listed child instead; timing holds it alone."""
    order: list[str] = []
    real_hold, real_ready = candidate_windows.hold, judge_module.wait_ready

    @contextmanager
    def hold(device: str, *, exclusive: bool, keep: Any = (),
             purpose: str = "other") -> Iterator[None]:
        order.append("exclusive" if exclusive else "shared")
        with real_hold(device, exclusive=exclusive, keep=keep, purpose=purpose):
            yield

    def wait_ready(child: Any, report: Any, *args: Any) -> bool:
        ready = real_ready(child, report, *args)
        order.append(f"ready:{child.phase}")
        return ready

    monkeypatch.setattr(candidate_windows, "hold", hold)  # the candidate's window
    monkeypatch.setattr(reference_module, "hold", hold)  # the reference's calibration
    monkeypatch.setattr(device_lock, "hold", hold)  # the shared holds go through it
    monkeypatch.setattr(shared_window, "hold", hold)  # and a first window
    monkeypatch.setattr(judge_module, "wait_ready", wait_ready)
    reference_cache.close_references()
    verdict = judge_module.evaluate(mlp_task, GOOD, fast_config.model_copy(
        update={"device_lock": scope}))
    assert verdict.ok, verdict.message
    # the reference's start and trials and the candidate's start to trials (shared, ready
    # within it, with every_gpu_use; with pause_others no hold, their children listed for
    # timers to stop), comparing its outputs (shared: on a GPU it is GPU work; with
    # pause_others each trial as the child saves it, then what is left), then timing
    # (alone: the window, and in it the wall-clock calibration), its timed sets loaded
    # just before it as the rest of its untimed work is
    untimed = ["shared"] if scope == "every_gpu_use" else []
    trials = fast_config.trials + 1  # and the shifted one
    comparing = ["shared"] * (1 if scope == "every_gpu_use" else trials + 1)
    expected = [*untimed, *untimed, "ready:queued", *comparing, *untimed, "exclusive"]
    assert order[:len(expected)] == expected, order
    assert "queued" in verdict.phase_seconds


def test_a_candidate_that_fails_in_its_warm_up_call_gets_the_checks_verdict(
        mlp_task: Task, fast_config: EvalConfig) -> None:
    verdict = judge_module.evaluate(mlp_task, RAISES, fast_config)
    assert (verdict.status, verdict.phase) == ("runtime_error", "check")
    cold = judge_module.evaluate(mlp_task, RAISES, fast_config.model_copy(
        update={"warm_up": False}))
    assert (cold.status, cold.phase) == (verdict.status, verdict.phase)


# ---- end to end: pike optimize with a pool ------------------------------------------------


def pool_config(run_config: Path, **pool: Any) -> Path:
    data = yaml.safe_load(run_config.read_text())
    data["eval"].update(pool)
    data["search"]["branching"].update(branches=3, max_fix_attempts=0)
    run_config.write_text(yaml.safe_dump(data))
    return run_config


def check_pool_end_to_end(fake_llm: FakeOpenAI, config: Path, out: Path,
                          monkeypatch: pytest.MonkeyPatch) -> None:
    """A search whose rounds go through the pool: the right verdict for each candidate,
    each written to the store exactly once. Shared with the Ray backend's test."""
    writes: Counter[int] = Counter()
    real = RunStore.set_verdict

    def counted(self: RunStore, candidate_id: int, verdict: Verdict) -> None:
        writes[candidate_id] += 1
        real(self, candidate_id, verdict)

    monkeypatch.setattr(RunStore, "set_verdict", counted)
    fake_llm.handler = Scripted(optimize=[GOOD, WRONG, RAISES])
    result = pike("optimize", MLP, "--llm", spec(fake_llm), "--budget-queries", "7",
                  "--config", config, "--out", out)
    assert result.exit_code == 0, result.output
    rows = RunStore.open(out).candidates("1_GeluMLP")
    assert len(rows) == 6 and all(r.verdict is not None for r in rows)
    assert set(writes) == {r.id for r in rows} and set(writes.values()) == {1}
    by_source = {r.source.strip(): r.verdict.status for r in rows}  # type: ignore[union-attr]
    assert by_source[GOOD.strip()] == "ok"
    assert by_source[WRONG.strip()] == "incorrect"
    assert by_source[RAISES.strip()] == "runtime_error"
    assert (out / "best.py").read_text().strip() == GOOD.strip()


def test_optimize_with_a_local_pool_end_to_end(fake_llm: FakeOpenAI, run_config: Path,
                                               tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    check_pool_end_to_end(fake_llm, pool_config(run_config, workers=3), tmp_path / "run",
                          monkeypatch)


# ---- timing cores -------------------------------------------------------------------------


def test_each_gpu_gets_its_own_timing_cores_and_builds_get_the_rest(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from pike.evaluate import cores

    monkeypatch.setattr(cores, "_host_cores", lambda: tuple(range(8)))
    lanes, build = cores.split(2, gpus=2)  # type: ignore[misc]
    assert lanes == [{0, 1}, {2, 3}] and build == {4, 5, 6, 7}
    assert cores.split(4, gpus=2) is None  # no cores left for builds
    assert cores.split(0, gpus=2) is None and cores.split(2, gpus=0) is None


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="Linux only")
def test_a_timed_child_moves_onto_the_timing_cores_and_back(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from pike.evaluate import cores

    host = tuple(sorted(os.sched_getaffinity(0)))
    if len(host) < 2:
        pytest.skip("needs two cores")
    monkeypatch.setattr(cores, "_host_cores", lambda: host[:2])
    monkeypatch.setattr(cores, "_gpus", lambda: 1)
    monkeypatch.setattr(cores, "_MIN_BUILD_CORES", 1)
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        cores.start_on_build_cores(child.pid, "cuda:0", 1)
        assert os.sched_getaffinity(child.pid) == {host[1]}
        with cores.timing_cores([child.pid, None], "cuda:0", 1):
            assert os.sched_getaffinity(child.pid) == {host[0]}
        assert os.sched_getaffinity(child.pid) == {host[1]}
        cores.start_on_build_cores(child.pid, "cpu", 1)  # CPU evaluations: nothing moves
        assert os.sched_getaffinity(child.pid) == {host[1]}
    finally:
        child.kill()
        child.wait()


def test_a_resumed_run_may_take_a_new_pool_but_keeps_its_search_options(
        fake_llm: FakeOpenAI, run_config: Path, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    fake_llm.handler = Scripted(optimize=[GOOD])
    out = tmp_path / "run"
    first = pike("optimize", MLP, "--llm", spec(fake_llm), "--budget-queries", "2",
                 "--config", run_config, "--out", out)
    assert first.exit_code == 0, first.output
    widths: list[int] = []
    real = LocalPool.__init__

    def seen(self: LocalPool, cfg: EvalConfig, *args: Any, **kwargs: Any) -> None:
        real(self, cfg, *args, **kwargs)
        widths.append(self.width)

    monkeypatch.setattr(LocalPool, "__init__", seen)
    again = pike("optimize", "--resume", out, "--workers", "2")
    assert again.exit_code == 0, again.output
    assert widths == [2]
    refused = pike("optimize", "--resume", out, "--workers", "2", "--budget-queries", "9")
    assert refused.exit_code != 0 and "drop --budget-queries" in refused.output


def test_baseline_modes_that_measure_nothing_build_beside_others(
        mlp_task: Task, fast_config: EvalConfig, monkeypatch: pytest.MonkeyPatch) -> None:
    """A task's baselines hold the device alone only where they must: max-autotune's build
    (it measures kernels) and the timing; eager and the other compile modes are built
    before, as a candidate's build is, their child listed for other timers to stop."""
    order: list[str] = []
    real_hold = baseline_module.hold

    @contextmanager
    def hold(device: str, *, exclusive: bool, keep: Any = (),
             purpose: str = "other") -> Iterator[None]:
        order.append("exclusive" if exclusive else "shared")
        with real_hold(device, exclusive=exclusive, keep=keep, purpose=purpose):
            yield
        order.append("released")

    def prepare(timer: Any, cfg: Any, on_built: Any = None) -> None:
        order.append(f"build {timer.mode}")

    def prebuild(timer: Any) -> None:
        order.append(f"prebuild {timer.mode}")

    def timing(timers: list, cfg: Any, **options: Any) -> None:
        order.append("timing")

    listed: list[int] = []
    monkeypatch.setattr(baseline_module, "hold", hold)
    monkeypatch.setattr(baseline_module, "_prepare", prepare)
    monkeypatch.setattr(baseline_module, "_prebuild", prebuild)
    monkeypatch.setattr(baseline_module, "time_interleaved", timing)
    monkeypatch.setattr(reference_start, "list_for_timers",
                        lambda child, device, scope: listed.append(child.proc.pid))
    modes = ["eager", "compile:default", "compile:max-autotune-no-cudagraphs",
             "compile:reduce-overhead"]
    alone = ["exclusive", "build compile:max-autotune-no-cudagraphs", "timing", "released"]
    cfg = fast_config.model_copy(update={"device_lock": "pause_others",
                                         "prebuild_autotune": "on"})
    reference = reference_cache.run_reference(mlp_task, cfg, "cpu", keep_child=True, cache=False)
    try:
        baseline_module.time_reference_modes(mlp_task, reference, modes, cfg, "cpu")
        # max-autotune is compiled once beside the others first, before any other mode
        # (its pre-build resets the compiled frames), so its build alone mostly measures
        assert order == ["prebuild compile:max-autotune-no-cudagraphs", "build eager",
                         "build compile:default", "build compile:reduce-overhead", *alone]
        order.clear()
        baseline_module.time_reference_modes(  # auto, as no DeviceSlots settled it: off
            mlp_task, reference, modes, cfg.model_copy(update={"prebuild_autotune": "auto"}),
            "cpu")
    finally:
        reference.close()
    assert order == ["build eager", "build compile:default", "build compile:reduce-overhead",
                     *alone]
    # the reference child: for its start and trials, then for those builds (once a call)
    assert len(listed) == 3


def test_a_mode_that_takes_the_shared_child_down_mid_window_is_the_one_blamed(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The modes of a baseline share one child: once it dies, every later request fails.
    In a reversed round (ABBA) eager came after the culprit and was marked too, and the
    whole task became an error; the window now stops at the first failed block."""
    from pike.config import TimingConfig
    from pike.evaluate import timing_window
    from pike.evaluate.timing_window import Timer, time_interleaved
    from pike.evaluate.verdict import Verdict

    dead: list[bool] = []

    def block(timer: Timer, **sizes: Any) -> None:
        if dead or (timer.mode == "compile:default" and len(timer.samples) >= 1):
            dead.append(True)
            timer.failure = Verdict(status="crashed", phase="timing", message="SIGSEGV")
            return
        timer.samples.append(1.0)

    monkeypatch.setattr(timing_window, "_time_one_block", block)
    for stop, blamed in ((False, ["eager", "compile:default"]), (True, ["compile:default"])):
        dead.clear()
        timers = [Timer(None, "eager"), Timer(None, "compile:default")]  # type: ignore[arg-type]
        # rounds: eager, compile | compile (it dies here), eager (the child is gone) ...
        time_interleaved(timers, TimingConfig(rounds=6, min_calls=6, min_seconds=0.0),
                         stop_at_failure=stop)
        assert [t.mode for t in timers if t.failure] == blamed
