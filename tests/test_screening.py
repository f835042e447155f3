"""A search's candidates are timed in shorter windows (search.screen_seconds, in
search.screen_rounds blocks) than the confirming window that times its best again in full,
from which the figures come."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from pike.config import EvalConfig, RunConfig
from pike.evaluate import confirm as confirming
from pike.evaluate.verdict import TimingStats, Verdict
from pike.search import campaign, session
from pike.store import RunStore
from pike.task import Task, load_task
from tests.conftest import EXAMPLES


def test_a_search_times_its_candidates_for_the_screening_seconds_only() -> None:
    cfg = RunConfig()
    full = cfg.eval.timing.min_seconds
    screened = cfg.search_eval()
    assert screened.timing.min_seconds == cfg.search.screen_seconds < full
    assert screened.timing.rounds == cfg.search.screen_rounds < cfg.eval.timing.rounds
    # the rest of the protocol is the same, and the run's own config is left as it was
    assert screened.model_dump(exclude={"timing"}) == cfg.eval.model_dump(exclude={"timing"})
    assert screened.timing.model_dump(exclude={"min_seconds", "rounds"}) == \
        cfg.eval.timing.model_dump(exclude={"min_seconds", "rounds"})
    assert cfg.eval.timing.min_seconds == full
    assert cfg.eval.timing.rounds == RunConfig().eval.timing.rounds


@pytest.mark.parametrize("rounds", [None, 40])
def test_screening_rounds_never_exceed_the_protocol_s(rounds: int | None) -> None:
    """None asks for eval's rounds; more rounds than eval's are not taken either: a short
    window in more blocks would only add requests to it."""
    cfg = RunConfig()
    cfg.search.screen_rounds = rounds
    screened = cfg.search_eval()
    assert screened.timing.min_seconds == cfg.search.screen_seconds
    assert screened.timing.rounds == cfg.eval.timing.rounds


@pytest.mark.parametrize("change", [
    {"confirm_top": 0},  # no confirming window: the search's figures are the result
    {"screen_seconds": None},  # asked for the full protocol
    {"screen_seconds": 2.0},  # longer than the protocol's windows: never lengthened
])
def test_the_full_protocol_where_no_confirming_window_or_no_screening(
        change: dict[str, Any]) -> None:
    cfg = RunConfig()
    cfg.search = cfg.search.model_copy(update=change)
    assert cfg.search_eval() == cfg.eval


class _Pool:
    """Judges every candidate ok, each a little faster than the one before."""

    def __init__(self, cfg: EvalConfig) -> None:
        self.cfg, self.judged = cfg, 0
        self.width = 1

    def judge(self, task: Task, source: str) -> Verdict:
        self.judged += 1
        stats = TimingStats.from_samples([1.0])
        return Verdict(status="ok", runtime=stats, reference=stats,
                       speedup=1.0 + self.judged / 100)

    def judge_many(self, task: Task, sources: list[str]) -> Any:
        for i, source in enumerate(sources):
            yield i, self.judge(task, source)

    def retire_spares(self) -> None:
        pass

    def close(self) -> None:
        pass


@pytest.fixture
def seen(monkeypatch: pytest.MonkeyPatch) -> dict[str, list[EvalConfig]]:
    """The configs the search's pool and its confirming window were given."""
    seen: dict[str, list[EvalConfig]] = {"pool": [], "confirm": []}
    pools: list[_Pool] = []

    def make_pool(cfg: EvalConfig) -> _Pool:
        seen["pool"].append(cfg)
        pools.append(_Pool(cfg))
        return pools[-1]

    def confirm(task: Task, sources: dict[int, str], config: EvalConfig) -> list[Any]:
        seen["confirm"].append(config)
        return [confirming.Confirmation(candidate_id=cid, runtime_ms=1.0, reference_ms=2.0,
                                        speedup=2.0) for cid in sources]

    for module in (session, campaign):
        monkeypatch.setattr(module, "make_pool", make_pool)
    monkeypatch.setattr(confirming, "confirm", confirm)
    seen["pools"] = pools  # type: ignore[assignment]
    return seen


def _config() -> RunConfig:
    cfg = RunConfig()
    cfg.eval.device = "cpu"
    cfg.search.offline.max_candidates = 3
    return cfg


def test_pike_optimize_screens_candidates_and_confirms_in_full(
        seen: dict[str, Any], tmp_path: Path) -> None:
    task = load_task(EXAMPLES / "tasks" / "1_GeluMLP.py")
    cfg = _config()
    store = RunStore.create(tmp_path / "run", cfg.model_dump(mode="json"), "test")
    store.add_task(task.name, str(task.path), task.sha256, task.source)
    result = session.search_task(store, task, cfg, None, lambda kind, **data: None)
    _screened_then_confirmed(seen, cfg)
    assert result.best_verdict is not None and result.best_verdict.confirmed
    assert result.best_verdict.speedup == 2.0  # the confirming window's figure


def test_pike_bench_screens_candidates_and_confirms_in_full(
        seen: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(campaign, "measure_baselines", lambda task, cfg, modes, **_: (
        SimpleNamespace(model_dump=lambda mode="json": {"modes": []})))
    cfg = _config()
    result = campaign.bench(EXAMPLES / "tasks", cfg, ids=[1], out=tmp_path / "run")
    assert [o.error for o in result.outcomes] == [None]
    _screened_then_confirmed(seen, cfg)


def _screened_then_confirmed(seen: dict[str, Any], cfg: RunConfig) -> None:
    assert len(seen["pool"]) == 1 and seen["pools"][0].judged >= 2
    assert seen["pool"][0].timing.min_seconds == cfg.search.screen_seconds
    assert seen["pool"][0].timing.rounds == cfg.search.screen_rounds
    assert len(seen["confirm"]) == 1
    assert seen["confirm"][0].timing.min_seconds == cfg.eval.timing.min_seconds
    assert seen["confirm"][0].timing.rounds == cfg.eval.timing.rounds


def test_the_confirming_window_reuses_the_searchs_reference_child(
        mlp_task: Task, build_cache: Path) -> None:
    """Only each block's request carries min_seconds, and only the parent reads rounds:
    the screening windows' reference child serves the confirming window too, not a
    second one made for it."""
    from pike.evaluate import reference_cache
    from tests.conftest import fast_protocol

    full = fast_protocol(build_cache)
    cfg = RunConfig(eval=full)
    cfg.search.screen_seconds = full.timing.min_seconds / 2
    screened = cfg.search_eval()
    assert screened.timing.min_seconds != full.timing.min_seconds
    assert screened.timing.rounds != full.timing.rounds
    first = reference_cache.run_reference(mlp_task, screened, "cpu", keep_child=True)
    try:
        again = reference_cache.run_reference(mlp_task, full, "cpu", keep_child=True)
        reference_cache.release_reference(again)
        assert again is first
        # anything else of the protocol the child keeps still makes a reference of its own
        other = full.model_copy(update={"timing": full.timing.model_copy(
            update={"warmup_calls": full.timing.warmup_calls + 1})})
        assert reference_cache._reference_protocol(other) != reference_cache._reference_protocol(full)
        assert reference_cache._reference_protocol(full.model_copy(update={"trials": 2})) != \
            reference_cache._reference_protocol(full)
    finally:
        reference_cache.release_reference(first)
        reference_cache.close_references()
