"""`pike bench --stop-after`: past the time limit nothing new starts, what ran is kept, the
unfinished tasks stay open, and --resume finishes them without judging anything again."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from pike.search import drain
from pike.search import offline as offline_search
from pike.search.ledger import Ledger
from pike.store import RunStore
from tests.conftest import EXAMPLES
from tests.test_optimize import pike

GELU = EXAMPLES / "tasks" / "1_GeluMLP.py"
FIRST, SECOND = "1_GeluMLP", "2_GeluMLPAgain"


@pytest.fixture
def two_tasks(tmp_path: Path, run_config: Path) -> tuple[Path, Path]:
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    shutil.copy(GELU, tasks / f"{FIRST}.py")
    shutil.copy(GELU, tasks / f"{SECOND}.py")
    cfg = yaml.safe_load(run_config.read_text())
    cfg["search"]["baseline_modes"] = ["eager"]
    cfg["search"]["offline"] = {"max_candidates": 1}  # inference mode: no compile on CPU
    run_config.write_text(yaml.safe_dump(cfg))
    return tasks, run_config


def _candidates(out: Path) -> dict[str, list[int]]:
    with RunStore.open(out) as store:
        return {t: [c.id for c in store.candidates(t) if c.verdict is not None]
                for t in (FIRST, SECOND)}


def test_work_past_the_limit_is_kept_and_not_judged_again(
        two_tasks: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A limit already past starts nothing, not even a baseline.
    tasks, config = two_tasks
    cfg = yaml.safe_load(config.read_text())
    cfg["search"]["offline"] = {"max_candidates": 2}  # one judged before the limit, one after
    config.write_text(yaml.safe_dump(cfg))
    out = tmp_path / "campaign"
    stopped = pike("bench", tasks, "--config", config, "--out", out, "--jobs", "1",
                   "--workers", "1", "--stop-after", "0")
    assert stopped.exit_code == 75, stopped.output
    assert "2 of 2 tasks not finished" in stopped.output and "--resume" in stopped.output
    with RunStore.open(out) as store:
        for task in (FIRST, SECOND):
            assert store.get_state(task, "baseline") is None
            assert not store.get_state(task, "done")
    assert _candidates(out) == {FIRST: [], SECOND: []}

    # Resumed, the limit passes as the first task's first verdict is recorded: that
    # verdict is kept, the search starts nothing more and skips its confirming window, the
    # task stays open, and the second task does not start.
    real_record = offline_search.OfflineSearch._record

    def record_then_time_is_up(self: Any, cid: int, verdict: Any, *rest: Any) -> None:
        real_record(self, cid, verdict, *rest)
        drain._deadline = 0.0  # long past (the campaign's own limit is reset as it ends)

    monkeypatch.setattr(offline_search.OfflineSearch, "_record", record_then_time_is_up)
    stopped = pike("bench", "--resume", out, "--jobs", "1", "--stop-after", "3600")
    assert stopped.exit_code == 75, stopped.output
    assert "2 of 2 tasks not finished" in stopped.output
    assert drain._deadline is None  # the limit ended with the campaign
    with RunStore.open(out) as store:
        before = {c.id: c.verdict for c in store.candidates(FIRST) if c.verdict is not None}
        assert len(before) == 1 and not store.candidates(SECOND)
        assert store.get_state(FIRST, "confirmed") is None
        assert not store.get_state(FIRST, "done") and not store.get_state(SECOND, "done")
        assert store.get_state(SECOND, "baseline") is not None  # measured before any search

    # A call that starts nothing still shows what the calls before it judged.
    again = pike("bench", "--resume", out, "--stop-after", "0")
    assert again.exit_code == 75, again.output
    line = next(x for x in again.output.splitlines() if f"] {FIRST}:" in x)
    status = next(iter(before.values())).status
    assert f"verdicts: {status} 1" in line, again.output

    # and the resume does the rest
    monkeypatch.setattr(offline_search.OfflineSearch, "_record", real_record)
    finished = pike("bench", "--resume", out, "--jobs", "1")
    assert finished.exit_code == 0, finished.output
    assert all(_candidates(out).values())
    with RunStore.open(out) as store:
        after = {c.id: c.verdict for c in store.candidates(FIRST) if c.verdict is not None}
        assert {i: after[i] for i in before} == before  # kept as it was, not judged again
        assert len(after) == 2  # and the search went on to its budget
        assert store.get_state(FIRST, "done") and store.get_state(SECOND, "done")
        assert [c for c in store.candidates(SECOND) if c.verdict is not None]


def test_past_the_limit_no_candidate_or_query_starts(tmp_path: Path,
                                                     request: pytest.FixtureRequest) -> None:
    from pike.evaluate.verdict import Verdict
    from pike.task import Task

    task = Task.from_file(GELU)
    store = RunStore.create(tmp_path / "run", {}, "test")
    request.addfinalizer(store.close)
    store.add_task(task.name, str(task.path), task.sha256, task.source)
    judged: list[int] = []

    def judge(sources: list[str]) -> Any:
        for _ in sources:
            judged.append(1)
            if len(judged) == 2:
                drain._deadline = 0.0
            yield 0, Verdict(status="ok", speedup=1.0)

    try:
        offline_search.OfflineSearch(store, task.name, task.source, "cuda:0", judge=judge,
                                     max_candidates=8, max_seconds=1e9).run()
        assert len(judged) == 2
        ledger = Ledger(store, task.name, budget_queries=100, budget_dollars=None)
        assert not ledger.has_room() and ledger.reserve(0.01) is None
    finally:
        drain._deadline = None
    assert ledger.has_room()




def test_a_failed_campaigns_other_threads_start_nothing_more_and_are_waited_for() -> None:
    # A task's error ends the campaign while another task's thread is still in an
    # evaluation: that thread is told to start nothing more, and the error leaves only
    # once it has ended (what it finishes is recorded while the store is open). Threads
    # outside the campaign, and later campaigns, are not held.
    import threading
    import time

    from pike.threads import run_each

    seen: list[bool] = []

    def work(item: str) -> None:
        if item == "fail":
            time.sleep(0.2)
            raise RuntimeError("the first task failed")
        deadline = time.monotonic() + 10
        while not drain.due() and time.monotonic() < deadline:
            time.sleep(0.01)
        seen.append(drain.due())

    outside: list[bool] = []
    with pytest.raises(RuntimeError), drain.stop_after(None):
        for _ in run_each(work, ["wait", "fail"], 2, "pike-bench",
                          stop=lambda err: drain.halt()):
            pass
    assert seen == [True]  # halted, and waited for before the error left
    assert not any(t.name.startswith("pike-bench") for t in threading.enumerate())
    assert not drain.due()
    other = threading.Thread(target=lambda: outside.append(drain.due()))
    other.start()
    other.join(30)
    with drain.stop_after(None):
        assert not drain.due() and outside == [False]


def test_an_error_in_one_task_leaves_the_others_work_recorded(
        two_tasks: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    # The first task's search fails on the host (not the task's fault, so the campaign
    # ends) once the second's has judged a candidate: the second's thread finishes the
    # evaluation it is in, which is recorded, and starts no more, though its budget
    # allows four; the error leaves bench() only then.
    import threading

    from pike.config import RunConfig
    from pike.errors import EvaluatorError
    from pike.search import campaign

    tasks, config = two_tasks
    cfg = RunConfig.load(config)
    cfg.search.offline.max_candidates = 4
    cfg.eval.workers = 1
    judged = threading.Event()
    real_record, real_search = offline_search.OfflineSearch._record, campaign.search_task

    def record(self: Any, cid: int, verdict: Any, *rest: Any) -> None:
        real_record(self, cid, verdict, *rest)
        judged.set()

    def search(store: Any, task: Any, *args: Any, **kwargs: Any) -> Any:
        if task.name == FIRST:
            assert judged.wait(120)
            raise EvaluatorError("the GPU fell off the bus")
        return real_search(store, task, *args, **kwargs)

    monkeypatch.setattr(offline_search.OfflineSearch, "_record", record)
    monkeypatch.setattr(campaign, "search_task", search)
    out = tmp_path / "campaign"
    with pytest.raises(EvaluatorError, match="fell off"):
        campaign.bench(tasks, cfg, out=out, jobs=2)
    assert not any(t.name.startswith("pike-bench") for t in threading.enumerate())
    assert "the other tasks start nothing more" in caplog.text
    with RunStore.open(out) as store:
        second = store.candidates(SECOND)
        assert 1 <= len(second) <= 2  # the one judged, and the one in flight at the error
        assert all(c.verdict is not None for c in second)  # in flight, yet recorded
        assert not store.get_state(SECOND, "done")


@pytest.mark.parametrize("ending", [KeyboardInterrupt, SystemExit])
def test_an_ending_raised_in_one_thread_waits_for_no_other(ending: type[BaseException]) -> None:
    # A Ctrl-C, or rich's SystemExit when a worker's status line meets a closed pipe: the
    # process is ending, and the command line ends the children; waiting here for the
    # other thread's build (minutes on a GPU) would hold that exit.
    import threading
    import time

    from pike.threads import run_each

    release = threading.Event()

    def work(item: str) -> None:
        if item == "end":
            raise ending
        release.wait(30)

    started = time.monotonic()
    with pytest.raises(ending):
        for _ in run_each(work, ["build", "end"], 2, "pike-ending"):
            pass
    took = time.monotonic() - started
    release.set()
    assert took < 10, f"waited {took:.1f} s for the other thread"
