"""The parent's clock around a timing block stops when the block's answer arrives, not when
the parent's thread next gets to it (other threads, its memory watch)."""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

import pytest

from pike.evaluate import timing_window
from pike.evaluate.sandbox import ChildProcess


def _block_wall(monkeypatch: pytest.MonkeyPatch, arrived_after_start: bool) -> float:
    child = SimpleNamespace(line_ready_at=0.0, timed_calls=0, probes_timed=0)

    def request(child_: Any, *args: Any, **kwargs: Any) -> dict:
        if arrived_after_start:
            child_.line_ready_at = time.perf_counter()
        time.sleep(0.2)  # the parent's thread busy elsewhere before it reads the answer
        return {"samples": [1.0, 1.0]}

    monkeypatch.setattr(timing_window, "request", request)
    timer = timing_window.Timer(child=child, mode="candidate",  # type: ignore[arg-type]
                                warmed=True)
    timing_window._time_one_block(timer, min_calls=2, min_seconds=0.0, max_calls=2)
    return timer.blocks[-1][0]


def test_a_block_ends_when_its_answer_arrived(monkeypatch: pytest.MonkeyPatch) -> None:
    assert _block_wall(monkeypatch, arrived_after_start=True) < 0.1


def test_an_answer_time_from_before_the_request_is_not_taken(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # a stale arrival (an earlier line) would make the block look short: the wall is
    # then measured to the end, as before
    assert _block_wall(monkeypatch, arrived_after_start=False) >= 0.2


def test_the_memory_walk_runs_at_most_once_a_second_while_timing() -> None:
    child = object.__new__(ChildProcess)
    child.phase, child._memory_walked = "timing", 0.0
    assert child._memory_due(100.0)
    assert not child._memory_due(100.5)
    assert child._memory_due(101.1)
    child.phase = "check"  # every poll elsewhere
    assert child._memory_due(101.2) and child._memory_due(101.25)
