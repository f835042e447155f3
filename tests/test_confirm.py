"""A confirmed best: the search's top candidates and eager timed again in one window."""

from __future__ import annotations

from pathlib import Path

from pike.config import RunConfig
from pike.evaluate.verdict import TimingStats, Verdict
from pike.search.session import confirm_best, summary_row, task_result
from pike.store import RunStore
from pike.task import Task
from tests.conftest import candidate, fast_protocol


def test_the_confirmed_best_reorders_candidates_whose_search_figures_were_swapped(
        mlp_task: Task, tmp_path: Path, build_cache: Path) -> None:
    store = RunStore.create(tmp_path / "run", {}, "test")
    store.add_task(mlp_task.name, str(mlp_task.path), mlp_task.sha256, mlp_task.source)
    stats = TimingStats.from_samples([1.0])
    ids = {}
    # The search's windows said the slow one was 3x and the fast one 1x (a drifting host).
    for name, search_speedup in (("slower", 3.0), ("fused", 1.0)):
        cid = store.add_candidate(mlp_task.name, candidate(name), parent_id=None,
                                  role="optimize", round=0, branch=0)
        store.set_verdict(cid, Verdict(status="ok", runtime=stats, reference=stats,
                                       speedup=search_speedup))
        ids[name] = cid
    assert store.best(mlp_task.name).id == ids["slower"]
    cfg = RunConfig()
    cfg.eval = fast_protocol(build_cache)
    cfg.search.confirm_top = 2
    confirm_best(store, mlp_task, cfg)
    result = task_result(store, mlp_task.name)
    assert result.best_candidate == ids["fused"]
    assert result.best_verdict is not None and result.best_verdict.confirmed
    assert result.best_verdict.search_speedup == 1.0
    assert result.best_verdict.speedup != 1.0
    # every reader of the store's best (export, solution sets, show) sees the same
    best = store.best(mlp_task.name)
    assert best.id == ids["fused"] and best.verdict.confirmed
    assert best.verdict.speedup == result.best_verdict.speedup
    # runtime, eager and speedup all from the confirming window
    assert best.verdict.runtime and best.verdict.reference
    assert abs(best.verdict.reference.median_ms / best.verdict.runtime.median_ms
               - best.verdict.speedup) < 1e-6 * best.verdict.speedup
    row = summary_row(store, result)
    assert row["confirmed"] and row["best_candidate"] == ids["fused"]
    kept = store.get_state(mlp_task.name, "confirmed")
    assert [f["candidate_id"] for f in kept["figures"]] == [ids["fused"], ids["slower"]]
    # the search-time figures stay in the store
    assert store.candidate(ids["slower"]).verdict.speedup == 3.0
    assert store.candidate(ids["fused"]).verdict.speedup == 1.0
