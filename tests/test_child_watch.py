"""A child's limits held while its parent is not waiting on it (evaluate/child_watch.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import types
from collections.abc import Iterator
from typing import Any

import psutil
import pytest

from pike.evaluate import child_ends, child_watch
from pike.evaluate.child_ends import MemoryExceeded, TooManyProcesses
from pike.evaluate.sandbox import _kill_each, _marked_processes
from tests.conftest import listening_child

_BOMB = "sleep 0.5; for i in $(seq 40); do sleep 60 & done; wait"
_ALLOCATES = ("import time; time.sleep(0.5); held = bytearray(300 * 2**20); "
              "held[::4096] = b'x' * len(held[::4096]); time.sleep(60)")


@pytest.fixture(autouse=True)
def _quick_watch(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    from pike.evaluate.reference_cache import close_references

    monkeypatch.setattr(child_watch, "EVERY_S", 0.2)
    monkeypatch.setattr(child_ends, "MAX_PROCESSES", 24)
    close_references()  # a reference an earlier test kept is watched too
    yield
    close_references()


@pytest.fixture
def started() -> Iterator[Any]:
    """Children as a parent holds them between messages: begun, nobody in `receive`."""
    made: list[Any] = []

    def start(argv: list[str], memory_limit: int = 2**40, env: dict[str, str] | None = None
              ) -> Any:
        proc = subprocess.Popen(argv, start_new_session=True, env={**os.environ, **(env or {})})
        child, _ = listening_child(proc, 60.0, pausable_on=None)
        child.begun, child.memory_limit, child.env = True, memory_limit, env or {}
        child._chan = None  # (finish closes it)
        child.request = types.SimpleNamespace(role="candidate")
        made.append(child)
        return child

    yield start
    for child in made:
        child_watch.unwatch(child)
        if child.proc is not None:  # (finish ends it and drops it)
            child._kill_own_group()
            child.proc.wait(5)


def _ended(child: Any, within_s: float = 15.0) -> object:
    deadline = time.monotonic() + within_s
    while child.ended_by is None and time.monotonic() < deadline:
        time.sleep(0.05)
    return child.ended_by


def test_a_fork_bomb_between_messages_is_ended_and_the_next_receive_says_so(started: Any) -> None:
    child = started(["/bin/sh", "-c", _BOMB])
    child_watch.watch(child)
    ended = _ended(child)
    assert isinstance(ended, TooManyProcesses), ended
    assert ended.limit == 24 and ended.count > 24 and ended.role == "candidate"
    assert child.proc.wait(5) is not None and child.unresponsive
    assert child.receive() is ended  # the parent hears it as its own loop would have
    time.sleep(0.5)
    assert not [p for p in psutil.process_iter(["ppid"]) if p.info["ppid"] == child.proc.pid]


def test_a_bomb_outside_the_group_and_after_the_child_ended_is_ended_too(started: Any) -> None:
    # each sleeper in a session of its own, and the child's own process gone: what it left
    # is found by its marker, counted and ended
    from pike.evaluate.child_environment import MARKER_VARIABLE
    from pike.evaluate.driver import ChildReport, finish

    marker = {MARKER_VARIABLE: f"watch-test-{os.getpid()}-{time.monotonic_ns()}"}
    child = started(["/bin/sh", "-c", "sleep 0.5; for i in $(seq 40); do setsid sleep 60 & "
                     "done; exit 0"], env=marker)
    child_watch.watch(child)
    ended = _ended(child)
    assert isinstance(ended, TooManyProcesses) and ended.count > 24, ended
    time.sleep(0.5)
    left = _marked_processes(marker)
    assert not left, left
    # ended after its last message, no receive to come: the report says it all the same
    report = ChildReport()
    finish(child, report)
    assert report.failure is not None and report.failure.status == "rejected"
    assert "over the limit of 24" in (report.failure.message or "")


def test_memory_taken_between_messages_is_ended(started: Any) -> None:
    child = started([sys.executable, "-c", _ALLOCATES], memory_limit=150 * 2**20)
    child_watch.watch(child)
    ended = _ended(child)
    assert isinstance(ended, MemoryExceeded), ended
    assert ended.used_bytes > ended.limit_bytes == 150 * 2**20
    assert child.proc.wait(5) is not None


def test_a_child_being_waited_on_is_left_to_its_own_loop(started: Any) -> None:
    child = started(["/bin/sh", "-c", _BOMB])
    child._waited = True
    child_watch.watch(child)
    time.sleep(2.0)
    assert child.ended_by is None and child.proc.poll() is None
    child._waited = False  # the wait over with the bomb still there: ended at the next look
    assert isinstance(_ended(child), TooManyProcesses)


def test_an_unbegun_child_is_not_looked_at_and_the_watch_ends_with_its_last_child(
        started: Any) -> None:
    child = started(["/bin/sh", "-c", _BOMB])
    child.begun = False  # a spare child: no code of anyone's runs in it yet
    child_watch.watch(child)
    time.sleep(1.5)
    assert child.ended_by is None
    child_watch.unwatch(child)
    deadline = time.monotonic() + 5
    while child_watch._thread is not None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert child_watch._thread is None and child_watch.watched() == 0


def test_an_evaluation_s_children_are_watched_from_their_begin_to_their_end(
        mlp_task: Any, fast_config: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from pike.evaluate import evaluate
    from pike.evaluate.reference_cache import close_references
    from tests.conftest import candidate

    roles: list[str] = []
    watch = child_watch.watch

    def recording(child: Any) -> None:
        roles.append(child.request.role)
        watch(child)

    monkeypatch.setattr(child_watch, "watch", recording)
    verdict = evaluate(mlp_task, candidate("fused"), fast_config)
    assert verdict.status == "ok", verdict.message
    assert {"reference", "candidate"} <= set(roles)
    # the candidate's ended with its evaluation; the reference is kept for the next one
    # (reference_cache), and watched while it idles, until it is closed
    assert [c.request.role for c in child_watch._children] == ["reference"]
    close_references()
    assert child_watch.watched() == 0


def test_naming_leftovers_is_safe_beside_a_thread_walking_the_processes(
        started: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    # psutil.process_iter hands every thread the same cached Process objects, and `attrs`
    # replace their `info`: the watch's walk beside a child's end once made
    # leftover_processes fail with KeyError 'name' (a clean-clone CI, three tests). Here
    # the other thread's walk is played at once: each process's `info` replaced as soon
    # as it is handed out.
    from pike.evaluate.child_environment import MARKER_VARIABLE

    marker = {MARKER_VARIABLE: f"watch-test-{os.getpid()}-{time.monotonic_ns()}"}
    child = started(["/bin/sh", "-c", "for i in 1 2 3; do setsid sleep 30 & done; wait"],
                    env=marker)
    time.sleep(0.5)
    walk = psutil.process_iter

    def beside_another_walk(*args: Any, **kwargs: Any) -> Iterator[psutil.Process]:
        for p in walk(*args, **kwargs):
            yield p
            p.info = {"ppid": 0}

    monkeypatch.setattr(psutil, "process_iter", beside_another_walk)
    try:
        left = child.leftover_processes()
    finally:
        monkeypatch.undo()
        _kill_each(_marked_processes(marker))
    assert len(left) == 3 and all(name.startswith("sleep (pid ") for name in left), left
