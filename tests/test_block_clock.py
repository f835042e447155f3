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


def test_a_block_counts_its_child_s_wait_for_a_core(monkeypatch: pytest.MonkeyPatch) -> None:
    """The kernel's count of the child's wait for a core, read around each block after the
    first: 0.3 s waited in a block is 0.3 s; a count the kernel does not give is unknown
    from then on; a window that waited for a quarter of its blocks' time or more on a
    CPU says so in its verdict."""
    from pike.evaluate import candidate_windows

    counts = iter([1.0, 1.3, 2.0, 2.0, 5.0, None])
    monkeypatch.setattr(timing_window, "waited_s", lambda pid: next(counts))
    monkeypatch.setattr(timing_window, "request", lambda *a, **k: {"samples": [1.0, 1.0]})
    child = ChildProcess.__new__(ChildProcess)  # a child whose runner's pid is known
    child.line_ready_at, child.timed_calls, child.probes_timed = 0.0, 0, 0
    child._runner = 4242
    child.request = SimpleNamespace(device="cpu")  # type: ignore[assignment]
    timer = timing_window.Timer(child=child, mode="eager", warmed=True)  # type: ignore[arg-type]
    timing_window._time_one_block(timer, min_calls=2, min_seconds=0.0, max_calls=2)
    assert timer.core_wait_s == pytest.approx(0.3)
    timing_window._time_one_block(timer, min_calls=2, min_seconds=0.0, max_calls=2)
    assert timer.core_wait_s == pytest.approx(0.3)
    busy = candidate_windows.waited_for_cores([timer, timer], "cpu")
    assert busy is None or "waited for a core" in busy  # depends on the blocks' wall
    timer.blocks = [(1.0, [1.0])]  # 0.3 s of 1 s
    assert "the reference waited for a core 30%" in candidate_windows.waited_for_cores(
        [timer, timing_window.Timer(child=child, mode="candidate")], "cpu")  # type: ignore[arg-type]
    assert candidate_windows.waited_for_cores([timer, timer], "cuda:0") is None
    timer.core_wait_s = 0.1
    assert candidate_windows.waited_for_cores([timer, timer], "cpu") is None
    timing_window._time_one_block(timer, min_calls=2, min_seconds=0.0, max_calls=2)
    assert timer.core_wait_s is None  # the kernel stopped saying: unknown, not 0
    assert candidate_windows.waited_for_cores([timer, timer], "cpu") is None


def test_core_waits_are_read_for_kept_blocks_on_a_cpu_only(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The warm-up block's count is thrown away, and a GPU's calls' waits for the host are
    launch gaps: neither reads the kernel's count."""
    reads: list[int | None] = []
    monkeypatch.setattr(timing_window, "waited_s", lambda pid: reads.append(pid) or 1.0)
    monkeypatch.setattr(timing_window, "request", lambda *a, **k: {"samples": [1.0, 1.0]})
    child = ChildProcess.__new__(ChildProcess)
    child.line_ready_at, child.timed_calls, child.probes_timed = 0.0, 0, 0
    child._runner = 4242
    for device in ("cuda:0", "cpu"):
        child.request = SimpleNamespace(device=device)  # type: ignore[assignment]
        timer = timing_window.Timer(child=child, mode="eager")
        timing_window._time_one_block(timer, min_calls=2, min_seconds=0.0, max_calls=2)
        assert set(reads) == {None}  # the warm-up: no child's count read
        reads.clear()
        timing_window._time_one_block(timer, min_calls=2, min_seconds=0.0, max_calls=2)
        assert reads == ([None, None] if device == "cuda:0" else [4242, 4242])
        reads.clear()


def test_the_kernel_says_how_long_this_process_waited_for_a_core() -> None:
    import os
    import sys

    from pike.evaluate.core_wait import waited_s

    if not sys.platform.startswith("linux"):
        pytest.skip("Linux's scheduler statistics")
    first = waited_s(os.getpid())
    assert first is not None and first >= 0.0
    assert waited_s(os.getpid()) >= first
    assert waited_s(None) is None and waited_s(2**22 + 12345) is None
