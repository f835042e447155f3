"""An offline search whose budget is spent says so at once, while its last candidates still
run, and a campaign's next task starts searching beside them instead of after them."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pike.config import RunConfig
from pike.evaluate.verdict import Verdict
from pike.search import campaign, session
from pike.search import offline as offline_search
from pike.store import RunStore
from pike.task import Task
from tests.conftest import EXAMPLES

MLP = Task.from_file(EXAMPLES / "tasks" / "1_GeluMLP.py")


@pytest.fixture
def store(tmp_path: Path) -> Iterator[RunStore]:
    """A run store holding the example MLP task, for a search of it."""
    store = RunStore.create(tmp_path / "run", {}, "test")
    store.add_task(MLP.name, str(MLP.path), MLP.sha256, MLP.source)
    yield store
    store.close()


def test_the_search_says_its_budget_is_spent_while_its_last_candidate_runs(
        store: RunStore) -> None:
    slow_may_end, judged = threading.Event(), []
    in_flight_when_spent: list[int] = []

    def judge(sources: list[str]) -> Any:
        for _ in sources:
            judged.append(1)
            if len(judged) == 2:  # the second candidate runs on past the budget
                assert slow_may_end.wait(30)
            yield 0, Verdict(status="ok", speedup=1.0 + len(judged) / 10)

    def spent() -> None:
        in_flight_when_spent.append(len(judged) - 2)  # started, less the two that ended
        slow_may_end.set()

    offline_search.OfflineSearch(store, MLP.name, MLP.source, "cuda:0", judge=judge,
                                 max_candidates=3, max_seconds=1e9, batch=2,
                                 spent=spent).run()
    # said once, when the third had ended and the second was still being judged
    assert in_flight_when_spent == [1]
    assert len([r for r in store.candidates(MLP.name) if r.verdict is not None]) == 3


def test_a_search_with_budget_left_says_nothing_until_it_runs_out(store: RunStore) -> None:
    # every set judged within the budget: the search ends without being cut, and
    # search_task frees the slot after its last verdict as before
    said: list[int] = []

    def judge(sources: list[str]) -> Any:
        for _ in sources:
            yield 0, Verdict(status="incorrect")  # nothing correct: no later rounds

    offline_search.OfflineSearch(store, MLP.name, MLP.source, "cuda:0", judge=judge,
                                 max_candidates=100, max_seconds=1e9,
                                 spent=lambda: said.append(1)).run()
    assert said == []


def test_the_next_task_searches_beside_a_spent_searchs_last_candidates(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """--jobs 1, two lanes: the first task's budget (one candidate) is spent while that
    candidate still runs; the second task's search starts then, not once it ends."""
    names = sorted(p.stem for p in (EXAMPLES / "tasks").glob("*.py"))[:2]
    second_started = threading.Event()
    last_ended_after_the_next_began: list[bool] = []
    real_search = campaign.search_task

    def judge_for(task: Task) -> Any:
        def judge(sources: list[str]) -> Any:
            for _ in sources:
                if task.name == names[0]:
                    # the first task's only candidate: it runs until the next task begins
                    last_ended_after_the_next_began.append(second_started.wait(30))
                yield 0, Verdict(status="incorrect")
        return judge

    class Pool:
        width = 2  # a lane left free beside the candidate: the search asks for another

        def judge_many(self, task: Task, sources: list[str]) -> Any:
            return judge_for(task)(sources)

        def close(self) -> None:
            pass

    def search(store: RunStore, task: Task, cfg: RunConfig, *args: Any, **kwargs: Any) -> Any:
        if task.name == names[1]:
            second_started.set()
        return real_search(store, task, cfg, *args, **kwargs)

    monkeypatch.setattr(campaign, "search_task", search)
    monkeypatch.setattr(campaign, "make_pool", lambda cfg: Pool())
    monkeypatch.setattr(campaign, "Lane", lambda pool, width: pool)
    monkeypatch.setattr(campaign, "measure_baselines", lambda task, cfg, modes, **_: (
        type("Stored", (), {"model_dump": lambda self, mode="json": {"modes": []}})()))
    monkeypatch.setattr(session, "confirm_best", lambda *a, **k: None)
    cfg = RunConfig()
    cfg.eval.device = "cpu"
    cfg.search.offline.max_candidates = 1
    result = campaign.bench(EXAMPLES / "tasks", cfg, out=tmp_path / "run", jobs=1,
                            ids=[int(n.split("_")[0]) for n in names])
    assert [o.error for o in result.outcomes] == [None, None]
    assert last_ended_after_the_next_began == [True]
