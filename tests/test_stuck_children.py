"""Children that overran a limit: killed at once, what escaped their group still named,
and a wait for the device that never counts against the trials."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psutil
import pytest

from pike.evaluate.child_environment import MARKER_VARIABLE
from pike.evaluate.driver import ChildReport, finish, run_trials
from pike.evaluate.sandbox import ChildProcess


def _bare_child(script: str, tmp_path: Path, phase: str = "check") -> ChildProcess:
    """A ChildProcess around `python -c script`, in its own session as the evaluator starts
    children, with the evaluator's channel pipes but none of its start-up."""
    child = ChildProcess.__new__(ChildProcess)
    child.begun = True  # running its script: as far as finish() goes, begun
    from_child, child_writes = os.pipe()
    child.env = {**os.environ, MARKER_VARIABLE: uuid.uuid4().hex}
    child.proc = subprocess.Popen([sys.executable, "-c", script.replace("FD", str(child_writes))],
                                  env=child.env, pass_fds=(child_writes,),
                                  start_new_session=True)
    os.close(child_writes)
    child._from_child, child._buffer, child._chan = from_child, b"", None
    child.phase_limits = {"load": 1.0, "check": 1.0}
    child.phase, child.phase_started, child.phase_seconds = phase, time.monotonic(), {}
    child.memory_limit = 1 << 40
    child.unresponsive = False
    child.stage, child.sandboxed, child.plan_notes = None, False, {}
    child._log = None
    child.send = lambda event, **fields: None  # type: ignore[method-assign]
    return child


def test_a_stuck_child_is_killed_with_its_group_and_what_escaped_is_named(
        tmp_path: Path) -> None:
    child = _bare_child(
        "import subprocess, time\n"
        "subprocess.Popen(['sleep', '300'])\n"                           # in its group
        "subprocess.Popen(['sleep', '301'], start_new_session=True)\n"   # escaped
        "time.sleep(300)\n", tmp_path)
    time.sleep(1.0)  # both sleeps started
    child.unresponsive = True  # as after a phase limit or a memory overrun
    report = ChildReport()
    started = time.monotonic()
    finish(child, report)
    assert time.monotonic() - started < 5  # no wait for a "stop" it cannot answer
    assert len(report.leftovers) == 1 and report.leftovers[0].startswith("sleep")
    marker = child.env[MARKER_VARIABLE]
    deadline = time.monotonic() + 5  # SIGKILL is delivered, not awaited: give it a moment
    while (alive := [p for p in psutil.process_iter() if _marked(p, marker)]) and \
            time.monotonic() < deadline:
        time.sleep(0.05)
    assert alive == []  # and everything was killed


def _marked(p: psutil.Process, marker: str) -> bool:
    try:
        return p.environ().get(MARKER_VARIABLE) == marker and p.status() != "zombie"
    except psutil.Error:
        return False


def test_a_long_wait_for_the_device_does_not_time_out_the_trials(tmp_path: Path) -> None:
    child = _bare_child(
        "import os, time\n"
        "time.sleep(0.3)\n"
        "os.write(FD, b'{\"event\": \"checked\", \"flags\": {}}\\n')\n"
        "time.sleep(5)\n", tmp_path, phase="queued")
    child.request = type("Request", (), {"role": "candidate"})()
    child.phase_started -= 10  # it waited 10 s for the device; its phases allow 1 s
    report = ChildReport()
    try:
        assert run_trials(child, report), report.failure
    finally:
        child.proc.kill()
        child.proc.wait()


def test_a_child_that_cannot_start_leaves_no_descriptor_open(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Its pipes and its output file are closed when the start itself fails."""
    from pike.evaluate import child_start, sandbox

    child = sandbox.ChildProcess.__new__(sandbox.ChildProcess)
    child.work_dir, child.request, child.sandboxed = tmp_path, None, False
    child.prefix, child.env, child._log = [], {}, None

    def cannot(*args: object, **kwargs: object) -> None:
        raise OSError("no such interpreter")

    monkeypatch.setattr(child_start.SPAWNER, "run", cannot)
    before = sorted(os.listdir("/proc/self/fd"))
    with pytest.raises(OSError, match="no such interpreter"):
        child.__enter__()
    assert sorted(os.listdir("/proc/self/fd")) == before
    assert child._log.closed


def test_the_tree_is_found_once_a_second_and_its_memory_read_every_poll(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Finding a child's tree walks every process on the host: at most once a period,
    while each process found is read every poll; one started since is counted from the
    next walk, and a tree that is gone reads as nothing."""
    from pike.evaluate import sandbox

    child = _bare_child(
        "import subprocess, sys, time\n"
        "time.sleep(0.5)\n"
        "subprocess.Popen(['sleep', '30'])\n"  # a process started after the first walk
        "time.sleep(30)\n", tmp_path)
    walks = []
    real_children = psutil.Process.children

    def children(self, recursive=False):
        walks.append(time.monotonic())
        return real_children(self, recursive=recursive)

    monkeypatch.setattr(psutil.Process, "children", children)
    monkeypatch.setattr(sandbox, "_TREE_EVERY_S", 1.5)
    try:
        first = child.measure_memory()
        assert first > 0 and len(walks) == 1
        time.sleep(0.8)  # the sleep has started, the period has not passed
        assert [p.pid for p in child._tree] == [child.proc.pid]
        assert child.measure_memory() > 0 and len(walks) == 1  # read, not walked
        time.sleep(0.8)
        grown = child.measure_memory()
        assert len(walks) == 2 and len(child._tree) == 2  # walked again: the sleep found
        assert grown > first
        for p in child._tree:
            p.kill()
        child.proc.wait()
        psutil.wait_procs(child._tree, timeout=5)
        assert child.measure_memory() == 0  # gone: nothing, and no error
    finally:
        child.unresponsive = True
        finish(child, ChildReport())
