"""The kernel's out-of-memory killer takes an evaluation's child before pike, and a child
it took says so.

On a lent two-GPU H200 host a level1 `pike bench` (bench/results/bench-level1-h200-partial.md)
was killed twice by a SIGKILL nothing in pike sends, minutes in: every evaluation in
flight was lost with it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from pike.config import EvalConfig
from pike.evaluate import oom_killer, sandbox
from pike.evaluate.child_start import child_setup
from pike.evaluate.driver import abnormal_end, finish
from pike.evaluate.oom_killer import OOM_SCORE_ADJ, child_oom_score, host_oom_kills
from pike.evaluate.reference_cache import run_reference
from pike.evaluate.sandbox import ChildExit, ChildProcess
from pike.evaluate.verdict import out_of_device_memory
from pike.task import Task
from tests.conftest import candidate, listening_child

linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux /proc")


def _adj(pid: int) -> int:
    return int(Path(f"/proc/{pid}/oom_score_adj").read_text())


@linux
def test_the_child_setup_raises_the_childs_score_and_leaves_the_parents() -> None:
    mine = _adj(os.getpid())
    proc = subprocess.Popen(["sleep", "30"], preexec_fn=child_setup(os.getpid(), 700))
    try:
        assert _adj(proc.pid) == 700 and _adj(os.getpid()) == mine
    finally:
        proc.kill()
        proc.wait()


@linux
def test_candidates_and_references_start_first_in_line_candidates_before_references(
        mlp_task: Task, fast_config: EvalConfig) -> None:
    from pike.evaluate.candidate_files import candidate_folders, fill_candidate
    from pike.evaluate.child_launch import launch_child
    from pike.evaluate.leftovers import make_temp_dir, remove_tree

    assert OOM_SCORE_ADJ["candidate"] > OOM_SCORE_ADJ["reference"] > 0
    folder = make_temp_dir("cand")
    try:
        files = candidate_folders(fast_config, "cpu", folder)
        fill_candidate(files, mlp_task, candidate("fused"), fast_config)
        child = launch_child(files.request, files.work_dir, fast_config, "x")
        assert child.proc is not None
        # bwrap's (or the child's, without the OS sandbox), and the Python runner's in it
        assert _adj(child.proc.pid) == OOM_SCORE_ADJ["candidate"]
        top = psutil.Process(child.proc.pid)
        runners = [p for p in [top, *top.children(recursive=True)]
                   if "pike.evaluate.runner" in " ".join(p.cmdline())]
        assert runners and all(_adj(p.pid) == OOM_SCORE_ADJ["candidate"] for p in runners)
        finish(child)
    finally:
        remove_tree(folder)
    reference = run_reference(mlp_task, fast_config, "cpu", keep_child=True, cache=False)
    try:
        assert reference.child is not None and reference.child.proc is not None
        assert _adj(reference.child.proc.pid) == OOM_SCORE_ADJ["reference"]
    finally:
        reference.close()


def test_the_hosts_oom_kills_are_read_from_vmstat(tmp_path: Path) -> None:
    vmstat = tmp_path / "vmstat"
    vmstat.write_text("nr_free_pages 12\noom_kill 7\npgfault 3\n")
    assert host_oom_kills(str(vmstat)) == 7
    vmstat.write_text("nr_free_pages 12\n")  # before Linux 4.13
    assert host_oom_kills(str(vmstat)) is None
    assert host_oom_kills(str(tmp_path / "none")) is None


@pytest.mark.parametrize(("own", "candidate", "reference"), [(0, 1000, 500), (800, 1000, 800)])
def test_no_child_starts_below_pikes_own_score(monkeypatch: pytest.MonkeyPatch, own: int,
                                               candidate: int, reference: int) -> None:
    monkeypatch.setattr(oom_killer, "_own_oom_score", lambda: own)
    assert (child_oom_score("candidate"), child_oom_score("reference")) == (candidate, reference)


@pytest.mark.parametrize("rose", [True, False])
def test_a_child_found_killed_says_whether_the_oom_killer_was_at_work_since_it_was_seen(
        monkeypatch: pytest.MonkeyPatch, rose: bool) -> None:
    import time

    count = [5]
    monkeypatch.setattr(oom_killer, "host_oom_kills", lambda: count[0])
    proc = subprocess.Popen(["sleep", "30"])
    child, _ = listening_child(proc, limit_s=30.0, pausable_on=None)
    child._see_oom_count(time.monotonic())  # seen alive, at 5
    child._last_rss = 3 * 2**30
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    count[0] += 1 if rose else 0
    event = child._receive_one()
    assert isinstance(event, ChildExit) and event.returncode == -signal.SIGKILL
    assert event.host_out_of_memory is rose and event.last_rss_bytes == 3 * 2**30
    verdict = abnormal_end(event, "check")
    assert ("host ran out of memory" in verdict.message) is rose
    assert ("3.0 GiB" in verdict.message) is rose


@pytest.mark.parametrize(("code", "at_start", "now", "killed"), [
    (-signal.SIGKILL, 3, 4, True),
    (-signal.SIGKILL, 3, 3, False),  # a SIGKILL with no OOM kill on the host meanwhile
    (-signal.SIGTERM, 3, 4, False),  # not the killer's signal
    (1, 3, 4, False),
    (-signal.SIGKILL, None, 4, False),  # the count is not kept here
])
def test_a_child_is_taken_for_the_oom_killers_only_where_both_signs_agree(
        monkeypatch: pytest.MonkeyPatch, code: int, at_start: int | None, now: int,
        killed: bool) -> None:
    child = ChildProcess.__new__(ChildProcess)
    child._oom_kills_seen = at_start
    monkeypatch.setattr(oom_killer, "host_oom_kills", lambda: now)
    assert child._killed_by_the_oom_killer(code) is killed


def test_a_child_the_oom_killer_took_is_a_crash_that_says_out_of_memory() -> None:
    taken = abnormal_end(ChildExit(-signal.SIGKILL, "", host_out_of_memory=True), "check")
    assert taken.status == "crashed" and "out of memory" in (taken.message or "")
    assert out_of_device_memory(taken)  # so a crowded GPU's pool judges it once more
    killed = abnormal_end(ChildExit(-signal.SIGKILL, ""), "check")
    assert killed.message.startswith("killed by signal SIGKILL during phase 'check'")
    assert not out_of_device_memory(killed)


def test_a_tree_gone_before_its_death_is_seen_keeps_its_last_real_measurement(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # The killer takes the runner; bwrap lives a moment longer, and a walk then finds no
    # tree: that 0 is no measurement, and the message said "used 0.0 GiB" (level1 bench).
    proc = subprocess.Popen(["sleep", "30"])
    child, _ = listening_child(proc, limit_s=30.0, pausable_on=None)
    walks = [3 * 2**30, 0]
    monkeypatch.setattr(child, "_tree_rss", lambda: walks.pop(0) if walks else 0)
    monkeypatch.setattr(sandbox, "_POLL_SECONDS", 0.01)
    ticks = iter(range(1000))
    monkeypatch.setattr(child, "_memory_due", lambda now: next(ticks) < 2)

    def killed_after_two_walks(timeout: float) -> bool:
        if not walks and proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
        return False

    monkeypatch.setattr(child, "_read_some", killed_after_two_walks)
    event = child._receive_one()
    assert isinstance(event, ChildExit) and event.last_rss_bytes == 3 * 2**30
    assert child.peak_rss == 3 * 2**30


@pytest.mark.parametrize(("status", "message", "device", "memory"), [
    ("crashed", "killed by signal SIGKILL during phase 'check'", "cpu", True),
    ("crashed", "killed by signal SIGKILL: the host ran out of memory (the kernel's ...)",
     "cuda:0", True),
    ("crashed", "RuntimeError: CUDA out of memory. Tried to allocate 2 GiB", "cuda:0", True),
    ("crashed", "RuntimeError: CUDA out of memory. Tried to allocate 2 GiB", "cpu", False),
    ("crashed", "exceeded the memory limit: 9.0 GiB used, limit 8.0 GiB", "cuda:0", False),
    ("timeout", "no progress for 300 s in phase 'check'", "cuda:0", False),
    ("crashed", "killed by signal SIGSEGV during phase 'load'", "cuda:0", False),
    ("crashed", "ValueError: bad shape", "cuda:0", False),
])
def test_a_reference_ended_by_memory_is_told_apart_from_the_tasks_own_failure(
        status: str, message: str, device: str, memory: bool) -> None:
    from pike.evaluate.reference_failure import ReferenceOutOfMemory, reference_failed
    from pike.evaluate.verdict import Verdict
    from pike.task import Task
    from tests.conftest import EXAMPLES

    task = Task.from_file(EXAMPLES / "tasks" / "1_GeluMLP.py")
    err = reference_failed(task, Verdict(status=status, phase="check", message=message),
                            device)
    assert isinstance(err, ReferenceOutOfMemory) is memory
    assert message.splitlines()[0] in str(err)
