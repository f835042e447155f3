"""`pike bench`'s order: a task's search starts once its own baselines are in; on GPUs the
next tasks' baselines are measured meanwhile (their device-alone parts stop the searches'
candidates, whose budgets leave that time out), on the CPU every baseline comes first."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from pike.config import RunConfig
from pike.errors import TaskError
from pike.search import campaign
from pike.search.session import OptimizeResult
from pike.store import RunStore
from pike.task import Task
from tests.conftest import EXAMPLES

TASKS = EXAMPLES / "tasks"


class _Stored:
    def model_dump(self, mode: str = "json") -> dict[str, Any]:
        return {"modes": [{"mode": "eager", "stats": {"median_ms": 1.0}}]}


def _fakes(monkeypatch: pytest.MonkeyPatch, failing: str = "") -> list[tuple[str, str]]:
    steps: list[tuple[str, str]] = []
    lock = threading.Lock()

    def measure(task: Task, cfg: Any, modes: Any, **_: Any) -> _Stored:
        with lock:
            steps.append(("baseline", task.name))
        if task.name == failing:
            raise TaskError("the reference failed")
        return _Stored()

    def search(store: RunStore, task: Task, cfg: Any, replay: Any, event: Any,
               evaluations: Any, **_: Any) -> OptimizeResult:
        with lock:
            steps.append(("search", task.name))
        return _nothing_found(store, task)

    monkeypatch.setattr(campaign, "measure_baselines", measure)
    monkeypatch.setattr(campaign, "search_task", search)
    return steps


def _nothing_found(store: RunStore, task: Task) -> OptimizeResult:
    return OptimizeResult(run_dir=store.path.parent, task=task.name, best_source=None,
                          best_verdict=None, queries=0, dollars=0.0, verdicts={})


def _campaign_config(monkeypatch: pytest.MonkeyPatch, measure: Callable[..., _Stored],
                     device: str | None = None, devices: list[str] | None = None
                     ) -> RunConfig:
    """A campaign whose baselines are `measure` and whose searches are faked (no
    evaluation pool: on GPUs this host may not have), on `device` or `devices`."""
    monkeypatch.setattr(campaign, "measure_baselines", measure)
    monkeypatch.setattr(campaign, "make_pool", lambda cfg: SimpleNamespace(close=lambda: None))
    cfg = RunConfig()
    cfg.eval.device, cfg.eval.devices = device, devices or []
    return cfg


def test_on_the_cpu_every_baseline_is_measured_before_any_search(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Nothing holds the CPU alone: a search beside a baseline would be in its timings."""
    steps = _fakes(monkeypatch)
    phases: list[tuple[str, str]] = []
    cfg = RunConfig()
    cfg.eval.device = "cpu"
    result = campaign.bench(TASKS, cfg, out=tmp_path / "run", jobs=2,
                            on_event=lambda kind, **d: phases.append((d["task"], d.get("phase", kind))))
    names = [o.task for o in result.outcomes]
    assert len(names) == 3
    assert [s for s, _ in steps] == ["baseline"] * 3 + ["search"] * 3
    assert sorted(n for s, n in steps if s == "search") == sorted(names)
    for name in names:  # each task waits for a search slot once measured
        mine = [p for t, p in phases if t == name]
        assert mine[:3] == ["baseline", "waiting", "search"]
    with RunStore.open(tmp_path / "run") as store:
        assert all(store.get_state(n, "baseline") for n in names)

    # resumed: measured baselines are kept, nothing is measured again
    steps.clear()
    with RunStore.open(tmp_path / "run") as store:
        store.set_state(names[0], "done", None)
    campaign.bench(None, resume=tmp_path / "run", jobs=2)
    assert steps == [("search", names[0])]


def test_on_a_gpu_a_search_starts_once_its_own_baselines_are_in(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The next task's baselines are measured while the first task searches: the second
    baseline to start waits (up to 10 s) for the first search to start, which never
    happens if every baseline must come first."""
    steps = _fakes(monkeypatch)
    names = sorted(p.stem for p in TASKS.glob("*.py"))
    first_search = threading.Event()
    lock = threading.Lock()
    running = {"baseline": 0, "search": 0}
    most = {"baseline": 0, "search": 0}

    def busy(kind: str, name: str, work: Any) -> Any:
        with lock:
            steps.append((kind, name))
            running[kind] += 1
            most[kind] = max(most[kind], running[kind])
        try:
            return work()
        finally:
            with lock:
                running[kind] -= 1

    started = [0]

    def measure(task: Task, cfg: Any, modes: Any, **_: Any) -> _Stored:
        def work() -> _Stored:
            with lock:
                started[0] += 1
                later = started[0] > 1
            if later:
                assert first_search.wait(10), "a baseline waited for every search"
            return _Stored()
        return busy("baseline", task.name, work)

    def search(store: RunStore, task: Task, cfg: Any, replay: Any, event: Any,
               evaluations: Any, **_: Any) -> OptimizeResult:
        def work() -> OptimizeResult:
            first_search.set()
            with lock:
                measured = ("baseline", task.name) in steps
            assert measured, f"{task.name} searched before its baselines were in"
            return _nothing_found(store, task)
        return busy("search", task.name, work)

    monkeypatch.setattr(campaign, "search_task", search)
    cfg = _campaign_config(monkeypatch, measure, device="cuda")
    result = campaign.bench(TASKS, cfg, out=tmp_path / "run", jobs=1)
    assert all(o.error is None for o in result.outcomes)
    assert steps[0][0] == "baseline"
    assert sorted(n for k, n in steps if k == "search") == names
    assert most == {"baseline": 1, "search": 1}  # one GPU, --jobs 1: one of each at once


def test_a_task_whose_reference_fails_in_its_baseline_is_done_with_its_error(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    failing = "2_ConvBlock"
    steps = _fakes(monkeypatch, failing=failing)
    done: list[dict[str, Any]] = []
    result = campaign.bench(TASKS, RunConfig(), out=tmp_path / "run", jobs=1,
                            on_event=lambda kind, **d: done.append(d) if (
                                kind == "task_done" and d["task"] == failing) else None)
    assert ("search", failing) not in steps
    # the display's last word on it is the failure, not a plain "done"
    assert done and all(d.get("error") == "the reference failed" for d in done)
    outcome = next(o for o in result.outcomes if o.task == failing)
    assert outcome.error == "the reference failed"
    assert all(o.error is None for o in result.outcomes if o.task != failing)
    with RunStore.open(tmp_path / "run") as store:
        assert store.get_state(failing, "done") is True
        assert store.get_state(failing, "baseline") is None


def test_with_several_gpus_each_tasks_baselines_are_measured_on_one_all_at_once(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """`--devices`: the baseline phase is not one task after another on the first GPU."""
    import time
    _fakes(monkeypatch)
    where: dict[str, str] = {}
    at_once: list[int] = []
    running = [0]
    lock = threading.Lock()

    def measure(task: Task, cfg: RunConfig, modes: Any, **_: Any) -> _Stored:
        with lock:
            where[task.name] = cfg.eval.device or ""
            running[0] += 1
            at_once.append(running[0])
        time.sleep(0.1)
        with lock:
            running[0] -= 1
        return _Stored()

    cfg = _campaign_config(monkeypatch, measure, devices=["cuda:0", "cuda:1"])
    campaign.bench(TASKS, cfg, out=tmp_path / "run", jobs=1)
    assert set(where.values()) == {"cuda:0", "cuda:1"} and len(where) == 3
    assert max(at_once) == 2  # one per GPU, though the campaign runs one task at a time


@pytest.mark.parametrize(("jobs", "device", "devices", "asked", "expected"), [
    (2, "cuda", [], "auto", "on"),  # two tasks' baselines on one GPU: each build alone
    (1, "cuda", [], "auto", "on"),  # stops the other, and the searches beside them
    (1, None, ["cuda:0", "cuda:1"], "auto", "on"),  # one per GPU, searches beside
    (3, None, ["cuda:0", "cuda:1"], "auto", "on"),
    (2, "cpu", [], "auto", "off"),  # no device lock on the CPU: nothing waits
    (2, "cuda", [], "off", "off"),  # what the user set stands
    (1, "cpu", [], "on", "on"),
])
def test_autotuning_modes_are_pre_built_where_baselines_share_a_gpu(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, jobs: int, device: str | None,
        devices: list[str], asked: str, expected: str) -> None:
    _fakes(monkeypatch)
    seen: list[str] = []

    def measure(task: Task, cfg: RunConfig, modes: Any, **_: Any) -> _Stored:
        seen.append(cfg.eval.prebuild_autotune)
        return _Stored()

    cfg = _campaign_config(monkeypatch, measure, device, devices)
    cfg.eval.prebuild_autotune = asked  # type: ignore[assignment]
    campaign.bench(TASKS, cfg, out=tmp_path / "run", jobs=jobs)
    assert seen == [expected] * 3


def test_filled_baselines_are_measured_as_the_first_ones_were(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """--fill-baselines takes a device slot: on the card that measured the task before,
    with `eval.prebuild_autotune: auto` settled as for the first measurement (it was
    left unsettled there, and meant no pre-build, whoever else was building)."""
    _fakes(monkeypatch)
    seen: list[tuple[str | None, str]] = []
    # the first two measurements stay in flight together, so both cards are taken (one
    # that returns at once let a loaded CI host give all three to cuda:0 in turn)
    both, first_pass = threading.Barrier(2), True

    def measure(task: Task, cfg: RunConfig, modes: Any, **_: Any) -> _Stored:
        seen.append((cfg.eval.device, cfg.eval.prebuild_autotune))
        if first_pass and len(seen) <= 2:
            with contextlib.suppress(threading.BrokenBarrierError):
                both.wait(timeout=10)
        return _Stored()  # eager only: every compile mode is a gap to fill

    cfg = _campaign_config(monkeypatch, measure, devices=["cuda:0", "cuda:1"])
    campaign.bench(TASKS, cfg, out=tmp_path / "run", jobs=3)
    assert {a for _, a in seen} == {"on"} and {d for d, _ in seen} == {"cuda:0", "cuda:1"}
    with RunStore.open(tmp_path / "run") as store:  # say each was measured on cuda:1
        for name in (p.stem for p in TASKS.glob("*.py")):
            store.set_state(name, "baseline", {"device": "cuda:1", "modes": []})
    seen.clear()
    first_pass = False
    campaign.bench(None, resume=tmp_path / "run", jobs=1, fill_baselines=True)
    assert seen == [("cuda:1", "on")] * 3


def test_a_reference_out_of_gpu_memory_beside_the_searches_is_measured_again_after_them(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A baseline now shares the GPU with the searches' children: its reference running
    out of memory there does not fail the task (as it would alone); the task is measured
    again once the other searches have ended, and searched."""
    from pike.evaluate.reference_failure import ReferenceOutOfMemory

    steps = _fakes(monkeypatch)
    crowded = sorted(p.stem for p in TASKS.glob("*.py"))[0]
    tries = [0]

    def measure(task: Task, cfg: RunConfig, modes: Any, **_: Any) -> _Stored:
        steps.append(("baseline", task.name))
        if task.name == crowded:
            tries[0] += 1
            if tries[0] == 1:
                raise ReferenceOutOfMemory("the reference ran out of GPU memory")
        return _Stored()

    cfg = _campaign_config(monkeypatch, measure, device="cuda")
    result = campaign.bench(TASKS, cfg, out=tmp_path / "run", jobs=1)
    assert all(o.error is None for o in result.outcomes)
    assert [o.task for o in result.outcomes] == sorted(p.stem for p in TASKS.glob("*.py"))
    searched = [n for k, n in steps if k == "search"]
    assert searched[-1] == crowded and len(searched) == 3  # after every other search
    assert steps[-2:] == [("baseline", crowded), ("search", crowded)] and tries[0] == 2
    with RunStore.open(tmp_path / "run") as store:
        assert store.get_state(crowded, "baseline") and not store.get_state(crowded, "error")


def test_a_search_whose_reference_runs_out_of_memory_beside_others_goes_on_after_them(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The level1 bench on an H200: the host's out-of-memory killer took a search's
    reference twice beside the other tasks' children, and the task failed. It now waits
    for the others to end and searches then, from what it had judged."""
    from pike.evaluate.reference_failure import ReferenceOutOfMemory

    steps = _fakes(monkeypatch)
    crowded = sorted(p.stem for p in TASKS.glob("*.py"))[0]
    tries = [0]

    def search(store: RunStore, task: Task, cfg: Any, replay: Any, event: Any,
               evaluations: Any, **_: Any) -> OptimizeResult:
        steps.append(("search", task.name))
        if task.name == crowded:
            tries[0] += 1
            if tries[0] == 1:
                raise ReferenceOutOfMemory("reference failed in phase 'check': killed by "
                                           "signal SIGKILL during phase 'check'")
        return _nothing_found(store, task)

    monkeypatch.setattr(campaign, "search_task", search)
    result = campaign.bench(TASKS, RunConfig(), out=tmp_path / "run", jobs=1)
    assert all(o.error is None for o in result.outcomes)
    searched = [n for k, n in steps if k == "search"]
    assert searched[0] == crowded and searched[-1] == crowded and len(searched) == 4
    with RunStore.open(tmp_path / "run") as store:
        assert store.get_state(crowded, "done") and not store.get_state(crowded, "error")


def test_a_search_whose_reference_runs_out_of_memory_with_nothing_beside_fails(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from pike.evaluate.reference_failure import ReferenceOutOfMemory

    _fakes(monkeypatch)
    crowded = sorted(p.stem for p in TASKS.glob("*.py"))[0]

    def search(store: RunStore, task: Task, *_: Any, **__: Any) -> OptimizeResult:
        if task.name == crowded:
            raise ReferenceOutOfMemory("reference failed: killed by signal SIGKILL")
        return _nothing_found(store, task)

    monkeypatch.setattr(campaign, "search_task", search)
    result = campaign.bench(TASKS, RunConfig(), out=tmp_path / "run", jobs=1)
    failed = [o for o in result.outcomes if o.error]
    assert [o.task for o in failed] == [crowded] and "SIGKILL" in failed[0].error


def test_a_resumed_campaign_tries_again_the_tasks_that_failed_for_memory_only(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from pike.evaluate.reference_failure import ReferenceOutOfMemory

    steps = _fakes(monkeypatch)
    names = sorted(p.stem for p in TASKS.glob("*.py"))
    fail = {names[0]: ReferenceOutOfMemory(
                f"{names[0]}.py: reference failed in phase 'check': killed by signal "
                "SIGKILL: the host ran out of memory"),
            names[1]: TaskError(f"{names[1]}.py: reference failed in phase 'load': "
                                "ValueError: bad shape")}

    def search(store: RunStore, task: Task, *_: Any, **__: Any) -> OptimizeResult:
        steps.append(("search", task.name))
        if task.name in fail:
            raise fail[task.name]
        return _nothing_found(store, task)

    monkeypatch.setattr(campaign, "search_task", search)
    monkeypatch.setattr(campaign, "_one_task", _alone(campaign._one_task))
    campaign.bench(TASKS, RunConfig(), out=tmp_path / "run", jobs=1)
    fail.clear()
    steps.clear()
    result = campaign.bench(None, resume=tmp_path / "run", jobs=1)
    assert [n for k, n in steps if k == "search"] == [names[0]]
    errors = {o.task: o.error for o in result.outcomes}
    assert errors[names[0]] is None and "bad shape" in errors[names[1]]


def _alone(one_task: Callable[..., Any]) -> Callable[..., Any]:
    """Every task as if nothing were beside it: a memory failure fails it at once."""
    def alone(*args: Any, **kwargs: Any) -> Any:
        return one_task(*args[:6], **{**kwargs, "beside_others": False})
    return alone


def test_the_next_task_searches_beside_a_tasks_confirming_window(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """--jobs 1: once a search has judged its last candidate, its confirming window (a
    minute on the H200, outside the pool) no longer holds the slot the next one waits for."""
    _fakes(monkeypatch)
    names = sorted(p.stem for p in TASKS.glob("*.py"))
    next_started = threading.Event()
    confirmed_beside: list[bool] = []

    def search(store: RunStore, task: Task, *_: Any, searched: Any = None,
               **__: Any) -> OptimizeResult:
        if task.name == names[0]:
            searched()  # the last candidate judged; its confirming window now
            confirmed_beside.append(next_started.wait(10))
        else:
            next_started.set()
        return _nothing_found(store, task)

    monkeypatch.setattr(campaign, "search_task", search)
    result = campaign.bench(TASKS, RunConfig(), out=tmp_path / "run", jobs=1)
    assert confirmed_beside == [True]
    assert all(o.error is None for o in result.outcomes)


def test_every_task_begun_at_once_keeps_its_live_reference(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Searching, confirming beside the next searches, and measured ahead: the reference
    cache keeps one live reference child for each task that can be in any of these at once
    (at jobs + 1 the H200 level2 bench closed the idle ones of tasks between their
    baselines and their searches, and each search's first candidates waited for it)."""
    _fakes(monkeypatch)
    kept: list[int] = []
    monkeypatch.setattr(campaign, "keep_references", kept.append)
    cfg = _campaign_config(monkeypatch, lambda task, cfg, modes, **_: _Stored(), device="cuda")
    result = campaign.bench(TASKS, cfg, out=tmp_path / "run", jobs=2)
    assert all(o.error is None for o in result.outcomes)
    jobs, confirming, measuring_ahead = 2, 2, 1
    assert kept and max(kept) >= jobs + confirming + measuring_ahead + 1


@pytest.mark.parametrize("device", ["cuda", "cpu"])
def test_on_a_gpu_each_search_s_reference_is_made_while_it_waits_for_a_slot(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, device: str) -> None:
    """Its first candidates would wait for it (8 to 25 s on the H200 level2 bench); on the
    CPU, where every baseline comes first, one per task at once would crowd the host."""
    _fakes(monkeypatch)
    made: list[tuple[str, float, bool]] = []
    released: list[object] = []

    def run_reference(task: Task, cfg: Any, on: str, *, keep_child: bool) -> object:
        made.append((task.name, cfg.timing.min_seconds, keep_child))
        return task.name

    monkeypatch.setattr(campaign, "run_reference", run_reference)
    monkeypatch.setattr(campaign, "release_reference", released.append)
    monkeypatch.setattr(campaign, "resolve_device", lambda d: "cuda:0")
    cfg = _campaign_config(monkeypatch, lambda task, cfg, modes, **_: _Stored(), device=device)
    result = campaign.bench(TASKS, cfg, out=tmp_path / "run", jobs=2)
    assert all(o.error is None for o in result.outcomes)
    names = sorted(o.task for o in result.outcomes)
    if device == "cpu":
        assert made == []
        return
    for _ in range(100):  # made in background threads
        if len(released) == len(names):
            break
        threading.Event().wait(0.05)
    # with the search's own protocol (its screening windows), a live child kept
    assert sorted(made) == [(n, cfg.search.screen_seconds, True) for n in names]
    assert sorted(released) == names  # and left in the cache for the search


def _references_made(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The tasks a reference is made ahead for (in background threads), as they come."""
    made: list[str] = []
    monkeypatch.setattr(campaign, "run_reference",
                        lambda task, *_, **__: made.append(task.name) or task.name)
    monkeypatch.setattr(campaign, "release_reference", lambda ref: None)
    monkeypatch.setattr(campaign, "resolve_device", lambda d: "cuda:0")
    return made


def _forget_first_call_s(made: list[str], count: int) -> None:
    """Once the first call's `count` references are in (background threads), none."""
    for _ in range(100):
        if len(made) == count:
            break
        threading.Event().wait(0.05)
    made.clear()


def test_a_resumed_campaign_s_done_tasks_take_no_slot_and_make_no_reference(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Through the slots, each resumed call on the H200 level2 bench made a reference
    ahead for every done task, and two done tasks waited five minutes for a search slot.
    Here, --jobs 1: the open task's search holds the only slot until the done ones are
    reported, and no reference is made for them."""
    steps = _fakes(monkeypatch)
    names = sorted(p.stem for p in TASKS.glob("*.py"))
    cfg = _campaign_config(monkeypatch, lambda task, cfg, modes, **_: _Stored(), device="cuda")
    made = _references_made(monkeypatch)
    campaign.bench(TASKS, cfg, out=tmp_path / "run", jobs=1)
    with RunStore.open(tmp_path / "run") as store:
        store.clear_state(names[0], campaign.DONE_STATE)
    _forget_first_call_s(made, len(names))
    steps.clear()
    done_reported = threading.Event()
    reported: list[str] = []

    def on_event(kind: str, **data: Any) -> None:
        if kind == "task_done":
            reported.append(data["task"])
            if len(reported) == len(names) - 1:
                done_reported.set()

    def search(store: RunStore, task: Task, *_: Any, **__: Any) -> OptimizeResult:
        steps.append(("search", task.name))
        steps.append(("done ones reported meanwhile", str(done_reported.wait(10))))
        return _nothing_found(store, task)

    monkeypatch.setattr(campaign, "search_task", search)
    result = campaign.bench(None, resume=tmp_path / "run", jobs=1, on_event=on_event)
    assert all(o.error is None for o in result.outcomes)
    assert steps == [("search", names[0]), ("done ones reported meanwhile", "True")]
    assert sorted(reported[:len(names) - 1]) == names[1:]
    threading.Event().wait(0.2)  # a reference made ahead would start in the background
    assert made == [names[0]]


def test_filling_a_done_task_s_baselines_makes_no_reference_for_a_search(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """--fill-baselines takes a done task through the slots again; it searches nothing."""
    _fakes(monkeypatch)
    measured: list[str] = []

    def measure(task: Task, cfg: Any, modes: Any, **_: Any) -> _Stored:
        measured.append(task.name)
        return _Stored()

    cfg = _campaign_config(monkeypatch, measure, device="cuda")
    made = _references_made(monkeypatch)
    campaign.bench(TASKS, cfg, out=tmp_path / "run", jobs=2)
    names = sorted(p.stem for p in TASKS.glob("*.py"))
    _forget_first_call_s(made, len(names))
    measured.clear()
    campaign.bench(None, resume=tmp_path / "run", jobs=2, fill_baselines=True)
    assert sorted(measured) == names  # each baseline lacks the compile modes: filled
    threading.Event().wait(0.2)
    assert made == []


def test_a_campaign_cut_off_writes_the_summary_of_what_its_store_holds(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A Ctrl-C mid-run: summary.json says what is done and what is open, not nothing (or
    an earlier call's, left in place)."""
    import json

    _fakes(monkeypatch)
    names = sorted(p.stem for p in TASKS.glob("*.py"))

    def search(store: RunStore, task: Task, *_: Any, **__: Any) -> OptimizeResult:
        if task.name == names[1]:
            raise KeyboardInterrupt
        return _nothing_found(store, task)

    monkeypatch.setattr(campaign, "search_task", search)
    cfg = RunConfig()
    cfg.eval.device = "cpu"
    with pytest.raises(KeyboardInterrupt):
        campaign.bench(TASKS, cfg, out=tmp_path / "run", jobs=1)
    rows = json.loads((tmp_path / "run" / "summary.json").read_text())["tasks"]
    done = {r["task"]: r["done"] for r in rows}
    # (the last task's thread may take the freed slot and search before the summary)
    assert sorted(done) == names and done[names[0]] and not done[names[1]]
    assert (tmp_path / "run" / campaign.SOLUTIONS).is_dir()


def test_a_bench_task_cut_in_its_baselines_keeps_the_modes_that_failed(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from pike.evaluate.baseline import BaselineStopped

    task = Task.from_file(TASKS / "1_GeluMLP.py")
    asked: list[dict[str, Any]] = []

    def measure(task: Task, cfg: Any, modes: Any, on_event: Any = None,
                failed_before: Any = None, **_: Any) -> Any:
        asked.append(dict(failed_before or {}))
        on_event("mode_built", mode="compile:max-autotune-no-cudagraphs", build_s=300.0,
                 error="no progress for 300 s in phase 'build'")
        raise BaselineStopped("cut")

    monkeypatch.setattr(campaign, "measure_baselines", measure)
    from pike.search import failed_modes

    with RunStore.create(tmp_path / "run", {}, "test") as store:
        store.add_task(task.name, str(task.path), task.sha256, task.source)
        for _ in range(2):  # the same call measures it again whole (beside other work)
            assert campaign._measure_baseline(store, task, RunConfig(), lambda *a, **k: None)
        monkeypatch.setattr(failed_modes, "_THIS_CALL", "a later call")
        assert campaign._measure_baseline(store, task, RunConfig(), lambda *a, **k: None)
    assert asked[0] == asked[1] == {}
    assert list(asked[2]) == ["compile:max-autotune-no-cudagraphs"]
