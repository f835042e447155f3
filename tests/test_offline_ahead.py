"""The offline search starts the next round's candidates in lanes its round leaves free."""

from __future__ import annotations

import math
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from pike.agents.offline import named_in
from pike.evaluate.verdict import Verdict
from pike.search.offline import OfflineSearch
from pike.store import RunStore
from pike.task import Task
from tests.conftest import EXAMPLES

MLP = Task.from_file(EXAMPLES / "tasks" / "1_GeluMLP.py")
# each transformation's speedup alone; a set's is their product (on a GEMM task the
# compile modes are no faster than eager: partners the baseline measured, not candidates)
ALONE = {"cuda_graph": 1.1, "tf32": 2.0, "autocast_fp16": 7.0, "autocast_bf16": 6.0,
         "inference_mode": 1.0, "compile:default": 0.97}
NO_GAIN = {"compile:default": 0.97, "compile:reduce-overhead": 0.96,
           "compile:max-autotune-no-cudagraphs": 0.97}


def _idea(source: str) -> str:
    """The set a candidate file applies, named as the store names it (sorted)."""
    return " + ".join(sorted(named_in(source)))


class Lanes:
    """A judge whose evaluations of the `held` sets end only when the test lets them."""

    def __init__(self, held: set[str], alone: dict[str, float] = ALONE,
                 interrupt: str = "") -> None:
        self.alone, self.interrupt = alone, interrupt
        self.held = {idea: threading.Event() for idea in held}
        self.judged: list[str] = []
        self.changed = threading.Condition()

    def __call__(self, sources: list[str]) -> Iterator[tuple[int, Verdict]]:
        for source in sources:
            idea = _idea(source)
            with self.changed:
                self.judged.append(idea)
                self.changed.notify_all()
            if idea in self.held:
                assert self.held[idea].wait(timeout=30), f"{idea} never let go"
            if idea == self.interrupt:
                raise KeyboardInterrupt  # Ctrl-C while it is in evaluation
            speedup = math.prod(self.alone.get(n, 1.0) for n in idea.split(" + "))
            yield 0, Verdict(status="ok", speedup=speedup, phase_seconds={"total": 1.0})

    def wait_for(self, seen: Callable[[list[str]], bool]) -> None:
        with self.changed:
            assert self.changed.wait_for(lambda: seen(self.judged), timeout=30), self.judged

    def let_go(self, idea: str) -> None:
        self.held[idea].set()


def _search(tmp_path: Path, request: pytest.FixtureRequest, lanes: Lanes,
            store: RunStore | None = None, max_candidates: int = 24
            ) -> tuple[RunStore, threading.Thread, list[BaseException]]:
    if store is None:
        store = RunStore.create(tmp_path / "run", {}, "test")
        request.addfinalizer(store.close)
        store.add_task(MLP.name, str(MLP.path), MLP.sha256, MLP.source)
    errors: list[BaseException] = []

    def run() -> None:
        try:
            OfflineSearch(store, MLP.name, MLP.source, "cuda:0", judge=lanes,
                          max_candidates=max_candidates, max_seconds=1e6, batch=4,
                          known_alone=NO_GAIN).run()
        except BaseException as err:  # reported by the test
            errors.append(err)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return store, thread, errors


def _ended(store: RunStore, thread: threading.Thread, errors: list[BaseException],
           lanes: Lanes) -> dict[str, int]:
    thread.join(timeout=60)
    assert not thread.is_alive() and not errors, errors
    rows = store.candidates(MLP.name)
    assert all(r.verdict is not None for r in rows), "a candidate was left unjudged"
    assert Counter(lanes.judged).most_common(1)[0][1] == 1, "a set was judged twice"
    assert sorted(r.idea for r in rows) == sorted(lanes.judged)
    return {r.idea: r.round for r in rows}


def _fastest(store: RunStore) -> str:
    return max(store.candidates(MLP.name), key=lambda r: r.verdict.speedup).idea


def test_lanes_a_rounds_last_candidate_leaves_free_start_the_next_round(
        tmp_path: Path, request: pytest.FixtureRequest) -> None:
    # Five cheap candidates alone in four lanes: while the last runs, the three free lanes
    # take the pairs with the fastest so far (autocast_bf16 here, as autocast_fp16, the
    # round's real best, is still running). They are kept as extra candidates.
    lanes = Lanes(held={"autocast_fp16"})
    store, thread, errors = _search(tmp_path, request, lanes)
    ahead = {"autocast_bf16 + cuda_graph", "autocast_bf16 + tf32",
             "autocast_bf16 + inference_mode"}
    lanes.wait_for(lambda judged: ahead <= set(judged))
    assert "autocast_fp16" not in {r.idea for r in store.candidates(MLP.name)
                                   if r.verdict is not None}
    lanes.let_go("autocast_fp16")
    rounds = _ended(store, thread, errors, lanes)
    assert all(rounds[idea] == 1 for idea in ahead)
    # the round that came is the one of the real best, as before
    assert {"autocast_fp16 + tf32", "autocast_fp16 + cuda_graph",
            "autocast_fp16 + inference_mode"} <= set(rounds)
    assert _fastest(store).startswith("autocast_fp16 + ")


def test_a_candidate_started_ahead_is_taken_by_its_round_not_judged_again(
        tmp_path: Path, request: pytest.FixtureRequest) -> None:
    # autocast_fp16 is the fastest so far while autocast_bf16 runs on: its pairs start
    # ahead, and when round 1 comes, the one still in evaluation is waited for.
    lanes = Lanes(held={"autocast_bf16", "autocast_fp16 + tf32"})
    store, thread, errors = _search(tmp_path, request, lanes)
    lanes.wait_for(lambda judged: "autocast_fp16 + tf32" in judged)
    lanes.let_go("autocast_bf16")
    # round 1 waits for the pair it was given ahead; its fastest so far (+ cuda_graph,
    # 7.7x against 7x) has its own round started beside it meanwhile
    lanes.wait_for(lambda judged: "autocast_fp16 + cuda_graph + inference_mode" in judged)
    lanes.let_go("autocast_fp16 + tf32")
    rounds = _ended(store, thread, errors, lanes)
    assert rounds["autocast_fp16 + tf32"] == 1
    assert rounds["autocast_fp16 + cuda_graph + tf32"] == 2
    assert _fastest(store) == "autocast_fp16 + cuda_graph + tf32"


def test_the_next_round_starts_beside_a_rounds_no_gain_build(
        tmp_path: Path, request: pytest.FixtureRequest) -> None:
    # The no-gain build with the best set starts once the cheap partners are in, and runs
    # alone for minutes on a GPU: the next round (the round's fastest, 14x, beats the
    # best's 7x) goes on in the lanes beside it.
    lanes = Lanes(held={"autocast_fp16 + compile:default"})
    store, thread, errors = _search(tmp_path, request, lanes)
    lanes.wait_for(lambda judged: "autocast_fp16 + cuda_graph + tf32" in judged)
    lanes.let_go("autocast_fp16 + compile:default")
    rounds = _ended(store, thread, errors, lanes)
    assert rounds["autocast_fp16 + cuda_graph + tf32"] == 2


def test_a_round_that_does_not_improve_starts_nothing_ahead(
        tmp_path: Path, request: pytest.FixtureRequest) -> None:
    # Round 2's sets are no faster than its best (inference_mode and cuda_graph add
    # nothing more there): no round 3 starts beside its last candidate.
    build = "autocast_fp16 + compile:default + tf32"  # round 2's last candidate
    lanes = Lanes(held={build}, alone=dict(ALONE, cuda_graph=1.0))
    store, thread, errors = _search(tmp_path, request, lanes)
    lanes.wait_for(lambda judged: build in judged)
    time.sleep(0.3)  # what would start beside it starts at once
    lanes.let_go(build)
    rounds = _ended(store, thread, errors, lanes)
    assert max(rounds.values()) <= 2
    assert not any(idea.count(" + ") == 3 for idea in rounds)


def test_a_candidate_started_ahead_and_cut_off_is_judged_when_the_search_resumes(
        tmp_path: Path, request: pytest.FixtureRequest) -> None:
    # Ctrl-C while a pair started ahead (with autocast_bf16, not the round's best) is in
    # evaluation: the resumed search's rounds never reach it, and it is judged at its end.
    first = Lanes(held={"autocast_fp16"}, interrupt="autocast_bf16 + tf32")
    store, thread, errors = _search(tmp_path, request, first)
    thread.join(timeout=30)
    first.let_go("autocast_fp16")
    assert len(errors) == 1 and isinstance(errors[0], KeyboardInterrupt)
    cut = [r.idea for r in store.candidates(MLP.name) if r.verdict is None]
    assert "autocast_bf16 + tf32" in cut
    again = Lanes(held=set())
    _, thread, errors = _search(tmp_path, request, again, store=store)
    thread.join(timeout=60)
    assert not thread.is_alive() and not errors, errors
    assert all(r.verdict is not None for r in store.candidates(MLP.name))
    assert set(cut) <= set(again.judged)
    assert Counter(again.judged).most_common(1)[0][1] == 1


def test_the_builds_passed_over_run_side_by_side_where_nothing_improves(
        tmp_path: Path, request: pytest.FixtureRequest) -> None:
    # Round 1 finds nothing faster than autocast_fp16 alone, with budget left: the slower
    # no-gain builds with it take the free lanes together instead of one after the other.
    flat = dict(ALONE, tf32=1.0, cuda_graph=1.0)
    slow = "autocast_fp16 + compile:reduce-overhead"
    lanes = Lanes(held={slow}, alone=flat)
    store, thread, errors = _search(tmp_path, request, lanes)
    lanes.wait_for(lambda judged: "autocast_fp16 + compile:max-autotune-no-cudagraphs" in judged)
    lanes.let_go(slow)
    rounds = _ended(store, thread, errors, lanes)
    assert max(rounds.values()) == 1


def test_nothing_starts_ahead_that_would_leave_no_room_for_the_round_that_comes(
        tmp_path: Path, request: pytest.FixtureRequest) -> None:
    # 8 candidates in all (helper-28's review): the three pairs with autocast_bf16 ahead
    # would take the last three, and round 1 with autocast_fp16, the real best, none.
    lanes = Lanes(held={"autocast_fp16"})
    store, thread, errors = _search(tmp_path, request, lanes, max_candidates=8)
    lanes.wait_for(lambda judged: len(judged) == 5)  # round 0, autocast_fp16 held
    time.sleep(0.3)  # what would start ahead starts at once
    lanes.let_go("autocast_fp16")
    rounds = _ended(store, thread, errors, lanes)
    assert not any(idea.startswith("autocast_bf16 + ") for idea in rounds)
    assert _fastest(store) == "autocast_fp16 + tf32"
