"""A confirmed best: the search's top candidates and eager timed again in one window."""

from __future__ import annotations

from pathlib import Path

import pytest

from pike.config import RunConfig
from pike.evaluate.verdict import TimingStats, Verdict
from pike.search.confirm_best import confirm_best
from pike.search.session import summary_row, task_result
from pike.store import RunStore
from pike.task import Task
from tests.conftest import candidate, clock_rule_spy, fast_protocol


@pytest.fixture(autouse=True)
def _room_for_every_candidate(monkeypatch: pytest.MonkeyPatch) -> None:
    """The window's size by the host's memory is tested in test_host_memory; here every
    candidate fits, whatever earlier tests measured of these tasks on a small host."""
    from pike.evaluate import host_memory
    monkeypatch.setattr(host_memory.HOST, "room_for", lambda _task, count: count)


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


@pytest.mark.timing  # the forger's raise (about 1.25 alone) fell to 1.08 beside another test process
def test_the_confirming_window_holds_figures_to_the_parents_clock(
        mlp_task: Task, build_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A candidate that under-reports its times in the search's windows does so here too;
    # this window must not hand it the figure its clock-checked verdict was denied.
    from pike.evaluate import confirm as confirming
    seen = clock_rule_spy(monkeypatch, confirming)  # (its stretch, the reference's, factor)
    cfg = fast_protocol(build_cache)
    cfg.timing.min_seconds, cfg.timing.min_calls = 0.5, 100
    found = {c.candidate_id: c for c in confirming.confirm(
        mlp_task, {1: candidate("fused"), 2: candidate("under_reports")}, cfg)}
    assert found[1].speedup is not None, found[1].error
    if found[2].speedup is None:  # a loaded host can push its blocks past the margin
        assert "do not account for the wall time" in found[2].error
        return
    # the clock sees it stretched past the reference; whether and how much it is raised
    # rests on the reference's own stretch in the window, which load widens (test_guards'
    # twin of this test saw 1.06 and 1.0 in clean-clone CIs): the rule's figure is kept
    factors = [factor for _, _, factor in seen]
    assert len(seen) == 2 and seen[1][0] > seen[1][1], seen
    # the raise is kept with the figure, and only where there was one
    assert found[2].wall_clock_factor == (round(factors[1], 4) if factors[1] > 1.0 else None)
    assert found[1].wall_clock_factor == (round(factors[0], 4) if factors[0] > 1.0 else None)


def test_the_confirming_window_takes_every_candidate_near_the_best() -> None:
    from types import SimpleNamespace

    from pike.config import SearchConfig
    from pike.search.confirm_best import confirm_candidates

    def row(cid: int, speedup: float | None, status: str = "ok") -> SimpleNamespace:
        return SimpleNamespace(id=cid, role="optimize",
                               verdict=Verdict(status=status, speedup=speedup))

    # as on the H200 (contamination-h200-alone.md): the search's fourth, 16% below its
    # best, was the fastest alone
    rows = [row(1, 0.93), row(2, 3.27), row(3, 2.75), row(4, 3.16), row(5, None, "incorrect"),
            row(6, 3.04), row(7, 2.54), row(8, 2.60)]
    picked = [r.id for r in confirm_candidates(rows, SearchConfig())]
    assert picked == [2, 4, 6, 3]  # the top 3, and 2.75 is within 20% of 3.27
    assert [r.id for r in confirm_candidates(rows, SearchConfig(confirm_within=0.0))] == [2, 4, 6]
    assert [r.id for r in confirm_candidates(
        rows, SearchConfig(confirm_within=0.3, confirm_max=4))] == [2, 4, 6, 3]
    assert confirm_candidates(rows, SearchConfig(confirm_top=0)) == []


def test_the_fastest_compile_mode_joins_the_confirming_window_whatever_its_search_figure(
        mlp_task: Task, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # a compile mode's figure in a loaded search window can be far below its figure alone
    # (level3-pike audited alone: 17 offline files below their task's fastest mode)
    from pike.evaluate import confirm as confirm_module
    from pike.search.baseline_modes import fastest_mode
    from pike.store import BASELINE_STATE

    baseline = {"modes": [
        {"mode": "eager", "speedup_vs_eager": 1.0},
        {"mode": "compile:default", "speedup_vs_eager": 1.9, "checked": True},
        {"mode": "compile:reduce-overhead", "speedup_vs_eager": 2.4, "checked": True},
        {"mode": "compile:max-autotune-no-cudagraphs", "speedup_vs_eager": 3.0,
         "checked": False},  # not shown correct: not the floor
        {"mode": "compile:max-autotune", "speedup_vs_eager": 5.0, "checked": True,
         "error": "timeout"}]}
    assert fastest_mode(baseline) == "compile:reduce-overhead"
    assert fastest_mode(None) is None and fastest_mode({"modes": "junk"}) is None

    store = RunStore.create(tmp_path / "run", {}, "test")
    store.add_task(mlp_task.name, str(mlp_task.path), mlp_task.sha256, mlp_task.source)
    store.set_state(mlp_task.name, BASELINE_STATE, baseline)
    stats = TimingStats.from_samples([1.0])
    ids = {}
    # the search's best 2.0x; the mode alone measured 1.2x in its window, cut short
    for idea, speedup, cut in (("cuda_graph", 2.0, None), ("tf32", 1.9, None),
                               ("inference_mode", 1.8, None),
                               ("compile:reduce-overhead", 1.2, 2.0)):
        cid = store.add_candidate(mlp_task.name, f"# {idea}", parent_id=None,
                                  role="offline", round=0, branch=0, idea=idea)
        store.set_verdict(cid, Verdict(status="ok", runtime=stats, reference=stats,
                                       speedup=speedup, timed_rounds=3 if cut else None,
                                       behind_best=cut))
        ids[idea] = cid
    timed: list[list[int]] = []

    def window(task: Task, sources: dict[int, str], config: object) -> list:
        timed.append(list(sources))
        # alone in one window with the others, the mode is the fastest
        return sorted((confirm_module.Confirmation(
            candidate_id=cid, runtime_ms=1.0 / (2.6 if cid == ids["compile:reduce-overhead"]
                                                else 2.0), reference_ms=1.0,
            speedup=2.6 if cid == ids["compile:reduce-overhead"] else 2.0)
            for cid in sources), key=lambda c: -(c.speedup or 0))

    monkeypatch.setattr(confirm_module, "confirm", window)
    cfg = RunConfig()
    cfg.search.confirm_within = 0.0  # the top three only, and the mode beside them
    confirm_best(store, mlp_task, cfg)
    assert timed == [[ids["cuda_graph"], ids["tf32"], ids["inference_mode"],
                      ids["compile:reduce-overhead"]]]
    best = store.best(mlp_task.name)
    assert best.id == ids["compile:reduce-overhead"] and best.verdict.speedup == 2.6
    # timed in full in that window: no longer a cut-short verdict
    assert best.verdict.confirmed and best.verdict.timed_rounds is None
    assert best.verdict.rankable


def test_only_pikes_own_correct_rendering_of_the_mode_joins_it() -> None:
    from types import SimpleNamespace

    from pike.config import SearchConfig
    from pike.search.confirm_best import confirm_candidates

    def row(cid: int, speedup: float, idea: str = "", role: str = "offline",
            **fields: object) -> SimpleNamespace:
        return SimpleNamespace(id=cid, role=role, idea=idea,
                               verdict=Verdict(status="ok", speedup=speedup, **fields))

    mode = "compile:default"
    rows = [row(1, 3.0), row(2, 2.9), row(3, 2.8), row(4, 1.0, idea=mode)]
    assert [r.id for r in confirm_candidates(rows, SearchConfig(), mode)] == [1, 2, 3, 4]
    assert [r.id for r in confirm_candidates(rows, SearchConfig())] == [1, 2, 3]
    # an LLM's file of the same idea, a noisy or a failed verdict: not the floor
    for other in (row(4, 1.0, idea=mode, role="optimize"), row(4, 1.0, idea=mode, noisy=True),
                  SimpleNamespace(id=4, role="offline", idea=mode,
                                  verdict=Verdict(status="incorrect"))):
        assert [r.id for r in confirm_candidates([*rows[:3], other], SearchConfig(),
                                                 mode)] == [1, 2, 3]
    # already among the chosen: once
    rows = [row(1, 3.0, idea=mode), row(2, 2.9)]
    assert [r.id for r in confirm_candidates(rows, SearchConfig(), mode)] == [1, 2]


@pytest.mark.timing  # the honest candidate's fresh-input calls stretched 15x beside another
# test process (a clean-clone CI at cc83a5b withheld its figure); alone they pass
@pytest.mark.parametrize(("name", "words"), [
    ("stale_by_frames", "timed call"),  # answers stale outputs when a timing frame calls it
    ("memo_by_values", "reused, not computed"),  # answers inputs it has seen from a memo
])
def test_the_confirming_window_checks_the_timed_calls_as_a_search_s_window_does(
        mlp_task: Task, build_cache: Path, name: str, words: str) -> None:
    """Its blocks are longer than a screening window's, so a candidate can tell the two
    apart: one honest in the search's windows and reusing its answers here must get no
    confirmed figure."""
    from pike.evaluate import confirm as confirming
    found = {c.candidate_id: c for c in confirming.confirm(
        mlp_task, {1: candidate("fused"), 2: candidate(name)}, fast_protocol(build_cache))}
    assert found[1].speedup is not None, found[1].error
    assert found[2].speedup is None and words in found[2].error, found[2]


def _judged_ok(tmp_path: Path, task: Task, speedups: dict[str, float]
               ) -> tuple[RunStore, list[int]]:
    """A run store in which the search judged these candidates `ok` at these figures."""
    store = RunStore.create(tmp_path / "run", {}, "test")
    store.add_task(task.name, str(task.path), task.sha256, task.source)
    stats = TimingStats.from_samples([1.0])
    ids = []
    for branch, (name, speedup) in enumerate(speedups.items()):
        cid = store.add_candidate(task.name, candidate(name), parent_id=None, role="optimize",
                                  round=0, branch=branch)
        store.set_verdict(cid, Verdict(status="ok", runtime=stats, reference=stats,
                                       speedup=speedup))
        ids.append(cid)
    return store, ids


def test_a_candidate_caught_in_the_confirming_window_is_never_the_task_s_best(
        mlp_task: Task, tmp_path: Path, build_cache: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Its figure taken away is not enough: with no other candidate confirmed, the best
    falls back to the search's own figures, where it was the fastest. The guard's verdict
    replaces its search window's `ok`, and no second window is timed for it."""
    from pike.evaluate import confirm as confirming
    windows: list[list[int]] = []
    caught_in: list[list[tuple[str, str]]] = []  # each window's (caught, error) of failures
    real = confirming.confirm

    def counted(task: Task, sources: dict[int, str], config: object) -> list[object]:
        windows.append(sorted(sources))
        found = real(task, sources, config)  # type: ignore[arg-type]
        caught_in.append([(c.caught, c.error[:120]) for c in found if c.caught or c.error])
        return found

    monkeypatch.setattr(confirming, "confirm", counted)
    store, [cid] = _judged_ok(tmp_path, mlp_task, {"stale_by_frames": 3.0})
    assert store.best(mlp_task.name).id == cid
    cfg = RunConfig()
    cfg.eval = fast_protocol(build_cache)
    confirm_best(store, mlp_task, cfg)
    # A loaded host may stretch the first window's blocks (the wall-clock check fails
    # it, a failure no guard caught), and that window is timed once more; once a guard
    # has caught it, never.
    assert windows in ([[cid]], [[cid], [cid]]), windows
    assert [c for c, _ in caught_in[-1]] == ["incorrect"], caught_in
    assert not any(c for window in caught_in[:-1] for c, _ in window), caught_in
    caught = store.candidate(cid).verdict
    assert caught.status == "incorrect" and caught.phase == "timing"
    assert caught.message.startswith("in the confirming window: timed call")
    assert caught.speedup is None and not caught.rankable
    assert store.best(mlp_task.name) is None
    assert task_result(store, mlp_task.name).best_candidate is None


def test_the_confirming_window_loads_timed_inputs_before_it_and_drops_who_cannot(
        mlp_task: Task, build_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from pike.evaluate import confirm as confirming
    from pike.evaluate import driver

    seen: list[bool] = []

    def staged(child: object) -> Verdict | None:
        if not seen:  # the first candidate's sets do not fit beside the others
            seen.append(True)
            return Verdict(status="runtime_error", phase="timing",
                           message="torch.OutOfMemoryError: CUDA out of memory")
        seen.append(True)
        return driver.stage_timed_inputs(child)  # type: ignore[arg-type]

    monkeypatch.setattr(confirming, "stage_timed_inputs", staged)
    found = {c.candidate_id: c for c in confirming.confirm(
        mlp_task, {1: candidate("fused"), 2: candidate("fused")}, fast_protocol(build_cache))}
    assert len(seen) == 2
    assert found[1].speedup is None and "out of memory" in found[1].error
    assert found[2].speedup is not None, found[2].error


def test_the_confirming_window_judges_the_trials_again_on_inputs_the_search_never_drew(
        mlp_task: Task, tmp_path: Path, build_cache: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A file the search judged correct on its draws and wrong on others (a replayed
    answer stands in for it here) is caught by its trials in the window, gets that verdict
    in the store and is not the task's best; the window's reference is its own, drawn
    afresh, never the search's cached one."""
    from pike.evaluate import confirm as confirming

    asked: list[tuple[int | None, bool]] = []
    real = confirming.run_reference

    def recorded(task: Task, cfg: object, device: str, *, keep_child: bool,
                 cache: bool = True) -> object:
        asked.append((cfg.seed, cache))  # type: ignore[attr-defined]
        return real(task, cfg, device, keep_child=keep_child, cache=cache)  # type: ignore[arg-type]

    monkeypatch.setattr(confirming, "run_reference", recorded)
    store, [wrong, honest] = _judged_ok(tmp_path, mlp_task, {"cached": 3.0, "fused": 2.0})
    cfg = RunConfig()
    cfg.eval = fast_protocol(build_cache).model_copy(update={"seed": 7})
    confirm_best(store, mlp_task, cfg)
    assert asked == [(7 + confirming._FRESH_SEED_STEP, False)]
    caught = store.candidate(wrong).verdict
    assert caught.status == "incorrect" and caught.phase == "check", caught
    assert caught.message.startswith("in the confirming window: on inputs the search never")
    assert "identical for different inputs" in caught.message
    assert store.best(mlp_task.name).id == honest


def test_a_fresh_draw_shares_no_seed_with_the_search_s() -> None:
    from pike.config import EvalConfig
    from pike.evaluate.confirm import fresh_draw
    from pike.evaluate.reference_start import draw_protocol

    fixed = EvalConfig(seed=11, trials=50)
    search, confirming = draw_protocol(fixed), draw_protocol(fresh_draw(fixed))
    seeds = {search.weights, *search.trials, *search.timed}
    assert seeds.isdisjoint({confirming.weights, *confirming.trials, *confirming.timed})
    assert fresh_draw(fixed).model_copy(update={"seed": 11}) == fixed  # nothing else moved
    drawn = EvalConfig()  # eval.seed None: each reference run draws from the OS anyway
    assert fresh_draw(drawn) is drawn


def _window_of(figures: dict[int, object], windows: list[list[int]]):
    """A stand-in for the confirming window: each candidate's figure (a speedup, or an
    error) by how many candidates the window holds."""
    from pike.evaluate.confirm import Confirmation

    def window(task: Task, sources: dict[int, str], config: object) -> list[Confirmation]:
        windows.append(sorted(sources))
        found = []
        for cid in sources:
            figure = figures[cid](len(sources)) if callable(figures[cid]) else figures[cid]
            found.append(Confirmation(candidate_id=cid, error=figure) if isinstance(figure, str)
                         else Confirmation(candidate_id=cid, runtime_ms=1.0 / figure,
                                           reference_ms=1.0, speedup=figure))
        return sorted(found, key=lambda c: (c.speedup is None, -(c.speedup or 0.0)))
    return window


_HOST_OOM = ("killed by signal SIGKILL: the host ran out of memory (the kernel's "
             "out-of-memory killer was at work meanwhile) during phase 'check'")


def test_a_candidate_that_ran_out_of_memory_beside_others_is_timed_alone(
        mlp_task: Task, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """On the H100's level1 bench a 1.18x file was killed by the host's OOM killer in
    the crowded window (twice) and a 0.59x one became the task's best."""
    from pike.evaluate import confirm as confirming
    store, [fast, slow] = _judged_ok(tmp_path, mlp_task, {"fused": 2.0, "slower": 1.0})
    windows: list[list[int]] = []
    figures = {fast: lambda held: _HOST_OOM if held > 1 else 1.8, slow: 0.6}
    monkeypatch.setattr(confirming, "confirm", _window_of(figures, windows))
    confirm_best(store, mlp_task, RunConfig())
    assert windows == [[fast, slow], [fast, slow], [fast]]
    best = store.best(mlp_task.name)
    assert best.id == fast and best.verdict.confirmed and best.verdict.speedup == 1.8
    assert best.verdict.search_speedup == 2.0


def test_a_candidate_out_of_memory_even_alone_leaves_the_search_s_figures(
        mlp_task: Task, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from pike.evaluate import confirm as confirming
    store, [fast, slow] = _judged_ok(tmp_path, mlp_task, {"fused": 2.0, "slower": 1.0})
    windows: list[list[int]] = []
    gpu_oom = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"
    monkeypatch.setattr(confirming, "confirm",
                        _window_of({fast: gpu_oom, slow: 0.6}, windows))
    confirm_best(store, mlp_task, RunConfig())
    assert windows == [[fast, slow], [fast, slow], [fast]]  # alone once, not again
    best = store.best(mlp_task.name)
    assert best.id == fast and not best.verdict.confirmed and best.verdict.speedup == 2.0
    # below the confirmed best's search figure, it would not have mattered
    store2, [a, b] = _judged_ok(tmp_path / "2", mlp_task, {"fused": 2.0, "slower": 1.0})
    windows.clear()
    monkeypatch.setattr(confirming, "confirm", _window_of({a: 1.9, b: gpu_oom}, windows))
    confirm_best(store2, mlp_task, RunConfig())
    assert windows == [[a, b], [a, b]]  # the usual one more window for memory, no more
    assert store2.best(mlp_task.name).verdict.confirmed


def test_a_failure_other_than_memory_is_not_timed_alone(
        mlp_task: Task, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from pike.evaluate import confirm as confirming
    store, [fast, slow] = _judged_ok(tmp_path, mlp_task, {"fused": 2.0, "slower": 1.0})
    windows: list[list[int]] = []
    monkeypatch.setattr(confirming, "confirm", _window_of(
        {fast: "child crashed: SIGSEGV in its timed calls", slow: 0.9}, windows))
    confirm_best(store, mlp_task, RunConfig())
    assert windows == [[fast, slow], [fast, slow]]
    best = store.best(mlp_task.name)
    assert best.id == slow and best.verdict.confirmed and best.verdict.speedup == 0.9


def test_a_crash_above_a_candidate_out_of_memory_is_never_the_best(
        mlp_task: Task, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """helper-71's case: the crash hid the memory failure below it from the window alone,
    and the store, setting the window aside for that failure, took the crash's search
    figure for the best."""
    from pike.evaluate import confirm as confirming
    store, [crash, short, third] = _judged_ok(
        tmp_path, mlp_task, {"fused": 3.0, "slower": 2.8, "stale_by_frames": 2.7})
    windows: list[list[int]] = []
    figures = {crash: "child crashed: SIGSEGV", short: _HOST_OOM, third: 1.5}
    monkeypatch.setattr(confirming, "confirm", _window_of(figures, windows))
    confirm_best(store, mlp_task, RunConfig())
    assert windows == [[crash, short, third], [crash, short, third], [short]]
    best = store.best(mlp_task.name)  # out of memory alone too: the search's figures,
    assert best.id == short and not best.verdict.confirmed  # but not the crash's
    assert best.verdict.speedup == 2.8


def test_a_window_alone_whose_reference_fails_keeps_the_crowded_window_s_figures(
        mlp_task: Task, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from pike.errors import TaskError
    from pike.evaluate import confirm as confirming
    store, [fast, slow] = _judged_ok(tmp_path, mlp_task, {"fused": 2.0, "slower": 1.0})
    windows: list[list[int]] = []
    crowded = _window_of({fast: _HOST_OOM, slow: 0.6}, windows)

    def window(task: Task, sources: dict[int, str], config: object) -> list:
        if len(sources) == 1:
            windows.append(sorted(sources))
            raise TaskError("the reference ran out of GPU memory")
        return crowded(task, sources, config)

    monkeypatch.setattr(confirming, "confirm", window)
    confirm_best(store, mlp_task, RunConfig())
    assert windows == [[fast, slow], [fast, slow], [fast]]
    kept = store.get_state(mlp_task.name, "confirmed")
    assert [f["candidate_id"] for f in kept["figures"]] == [slow, fast]
    best = store.best(mlp_task.name)
    assert best.id == fast and not best.verdict.confirmed


def test_a_candidate_timed_alone_says_so_and_a_caught_one_is_no_memory_failure(
        mlp_task: Task, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from pike.evaluate import confirm as confirming
    store, [fast, slow] = _judged_ok(tmp_path, mlp_task, {"fused": 2.0, "slower": 1.0})
    figures = {fast: lambda held: _HOST_OOM if held > 1 else 1.8, slow: 0.6}
    monkeypatch.setattr(confirming, "confirm", _window_of(figures, []))
    confirm_best(store, mlp_task, RunConfig())
    kept = {f["candidate_id"]: f for f in store.get_state(mlp_task.name, "confirmed")["figures"]}
    assert kept[fast]["alone"] and not kept[slow]["alone"]
    # a guard's catch whose message names memory is the candidate's verdict, not the
    # window's want of memory: the confirmed best stands
    store.set_state(mlp_task.name, "confirmed", {"candidates": [fast, slow], "figures": [
        {"candidate_id": slow, "speedup": 0.6, "runtime_ms": 1 / 0.6, "reference_ms": 1.0},
        {"candidate_id": fast, "speedup": None, "caught": "incorrect",
         "error": "timed call answered from a memo: out of memory otherwise"}]})
    best = store.best(mlp_task.name)
    assert best.id == slow and best.verdict.confirmed


def test_a_window_that_timed_none_leaves_every_search_figure_standing(
        mlp_task: Task, tmp_path: Path) -> None:
    """Level1's 98_KLDivLoss: three 'not timed' beside four out of GPU memory. No window
    timed anything there, so none of its failures says anything of one candidate."""
    store, [top, second] = _judged_ok(tmp_path, mlp_task, {"fused": 4.9, "slower": 4.8})
    store.set_state(mlp_task.name, "confirmed", {"candidates": [top, second], "figures": [
        {"candidate_id": top, "speedup": None, "error": "not timed"},
        {"candidate_id": second, "speedup": None,
         "error": "torch.OutOfMemoryError: CUDA out of memory."}]})
    best = store.best(mlp_task.name)
    assert best.id == top and not best.verdict.confirmed
