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
    cfg["search"]["offline"] = {"max_candidates": 2}
    run_config.write_text(yaml.safe_dump(cfg))
    return tasks, run_config


def _candidates(out: Path) -> dict[str, list[int]]:
    with RunStore.open(out) as store:
        return {t: [c.id for c in store.candidates(t) if c.verdict is not None]
                for t in (FIRST, SECOND)}


def test_a_limit_already_past_starts_nothing_and_resume_does_it_all(
        two_tasks: tuple[Path, Path], tmp_path: Path) -> None:
    tasks, config = two_tasks
    out = tmp_path / "campaign"
    stopped = pike("bench", tasks, "--config", config, "--out", out, "--stop-after", "0")
    assert stopped.exit_code == 75, stopped.output
    assert "2 of 2 tasks not finished" in stopped.output and "--resume" in stopped.output
    with RunStore.open(out) as store:
        for task in (FIRST, SECOND):
            assert store.get_state(task, "baseline") is None
            assert not store.get_state(task, "done")
    assert _candidates(out) == {FIRST: [], SECOND: []}
    finished = pike("bench", "--resume", out)
    assert finished.exit_code == 0, finished.output
    assert all(_candidates(out).values())


def test_work_past_the_limit_is_kept_and_not_judged_again(
        two_tasks: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The limit passes as the first task's first verdict is recorded: that verdict is
    # kept, the search starts nothing more and skips its confirming window, the task stays
    # open, and the second task does not start.
    tasks, config = two_tasks
    real_record = offline_search.OfflineSearch._record

    def record_then_time_is_up(self: Any, cid: int, verdict: Any) -> None:
        real_record(self, cid, verdict)
        drain._deadline = 0.0  # long past (the campaign's own limit is reset as it ends)

    monkeypatch.setattr(offline_search.OfflineSearch, "_record", record_then_time_is_up)
    out = tmp_path / "campaign"
    stopped = pike("bench", tasks, "--config", config, "--out", out, "--jobs", "1",
                   "--workers", "1", "--stop-after", "3600")
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

    monkeypatch.setattr(offline_search.OfflineSearch, "_record", real_record)
    finished = pike("bench", "--resume", out, "--jobs", "1")
    assert finished.exit_code == 0, finished.output
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



def test_threads_a_failed_campaign_leaves_behind_start_nothing_more() -> None:
    # A task's error (or Ctrl-C) ends the campaign while another task's thread is still in
    # an evaluation or an LLM call: from then on that thread is told to start nothing,
    # while the failing thread and any thread started later (a new campaign, a search in
    # the same process) are not.
    import threading

    release, seen = threading.Event(), []

    def other_task() -> None:
        release.wait(30)
        seen.append(drain.due())

    with pytest.raises(RuntimeError), drain.stop_after(None):
        stray = threading.Thread(target=other_task, name="pike-bench_1")
        stray.start()
        raise RuntimeError("the first task failed")
    release.set()
    stray.join(30)
    assert seen == [True]
    assert not drain.due()
    later: list[bool] = []
    fresh = threading.Thread(target=lambda: later.append(drain.due()))
    fresh.start()
    fresh.join(30)
    assert later == [False]


def test_the_cli_says_the_other_tasks_finish_their_evaluations_after_an_error(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import threading

    from pike.errors import EvaluatorError
    from pike.search import campaign

    release = threading.Event()

    def failing_bench(*args: Any, **kwargs: Any) -> None:
        threading.Thread(target=release.wait, args=(30,), name="pike-bench_9").start()
        raise EvaluatorError("no CUDA device is visible")

    monkeypatch.setattr(campaign, "bench", failing_bench)
    try:
        result = pike("bench", GELU.parent, "--out", tmp_path / "campaign")
    finally:
        release.set()
    assert result.exit_code == 2, result.output
    assert "no CUDA device is visible" in result.output
    assert "the other tasks start nothing more" in result.output
