"""The process stopper: trees walked and signalled by a helper process, or in the parent
where the helper cannot be had; a pid that names another process by now is never
signalled."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from pike.evaluate import device_lock, process_stopper


def _family(kids: int = 2) -> subprocess.Popen:
    """A process with `kids` children of its own, as a runner with its compile workers."""
    script = (f"import subprocess, sys, time\n"
              f"kids = [subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])"
              f" for _ in range({kids})]\n"
              "print('up', flush=True)\n"
              "time.sleep(60)\n")
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE)
    assert proc.stdout is not None and proc.stdout.readline() == b"up\n"
    return proc


def _end(proc: subprocess.Popen) -> None:
    for p in psutil.Process(proc.pid).children(recursive=True):
        p.kill()
    proc.kill()
    proc.wait()


def _state(pid: int) -> str:
    return psutil.Process(pid).status()


def _until(check, seconds: float = 3.0) -> bool:
    deadline = time.monotonic() + seconds
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


@pytest.fixture
def family():
    proc = _family()
    yield proc
    _end(proc)


def test_a_tree_is_stopped_and_let_go_by_the_helper(family: subprocess.Popen) -> None:
    tree = device_lock.tree_of(family.pid)
    assert {pid for pid, _ in tree} == {family.pid, *(c.pid for c in
                                                      psutil.Process(family.pid).children())}
    helper = process_stopper._helper._proc
    assert helper is not None and helper.poll() is None and helper.pid != os.getpid()
    stopped = device_lock._stop_trees([family.pid])
    assert sorted(stopped) == sorted(tree)
    assert _until(lambda: all(_state(pid) == psutil.STATUS_STOPPED for pid, _ in tree))
    assert all(device_lock.stopped(pid) for pid, _ in tree)  # one stat read, as psutil says
    device_lock.set_stopped(stopped, False)
    assert _until(lambda: all(_state(pid) != psutil.STATUS_STOPPED for pid, _ in tree))
    assert not any(device_lock.stopped(pid) for pid, _ in tree)
    assert not device_lock.stopped(999_999_999)


def test_a_process_started_since_is_not_signalled(family: subprocess.Popen) -> None:
    """(pid, start ticks) names a process: the same pid with another start is another one."""
    ((pid, ticks),) = [p for p in device_lock.tree_of(family.pid) if p[0] == family.pid]
    device_lock.set_stopped([(pid, ticks + 1)], True)
    time.sleep(0.2)
    assert _state(pid) != psutil.STATUS_STOPPED
    assert device_lock.tree_of(999_999_999) == []  # no such process: nothing, no error


def test_listed_children_are_stopped_and_stale_entries_dropped(
        family: subprocess.Popen, tmp_path: Path) -> None:
    folder = tmp_path / "children"
    folder.mkdir()
    (folder / str(family.pid)).write_text(str(device_lock._started(family.pid)))
    (folder / "999999999").write_text("12.5")  # a child that has ended
    (folder / str(os.getpid())).write_text("12.5")  # a pid reused: another start
    kept = _family(0)
    (folder / str(kept.pid)).write_text(str(device_lock._started(kept.pid)))
    try:
        stopped = device_lock._stop_listed(folder, {kept.pid})
        assert {pid for pid, _ in stopped} == {pid for pid, _ in device_lock.tree_of(family.pid)}
        assert sorted(p.name for p in folder.iterdir()) == sorted([str(family.pid),
                                                                    str(kept.pid)])
        assert _state(kept.pid) != psutil.STATUS_STOPPED
        device_lock.set_stopped(stopped, False)
    finally:
        _end(kept)


def test_a_helper_that_died_or_hangs_is_replaced_and_the_work_still_done(
        family: subprocess.Popen, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(process_stopper, "_REPLY_S", 0.5)
    device_lock.tree_of(family.pid)
    helper = process_stopper._helper._proc
    assert helper is not None
    helper.kill()  # died between two requests: a new one starts
    helper.wait()
    assert device_lock.tree_of(family.pid)
    hung = process_stopper._helper._proc
    assert hung is not None and hung.pid != helper.pid
    os.kill(hung.pid, signal.SIGSTOP)  # stuck: no reply in time, the parent does it
    assert family.pid in {pid for pid, _ in device_lock.tree_of(family.pid)}
    assert hung.poll() is not None  # killed and reaped, not left behind
    assert device_lock.tree_of(family.pid)  # and a fresh one serves the next


def test_the_helper_ends_with_its_parent(tmp_path: Path) -> None:
    """However the parent ends (kill -9 here), the helper does not outlive it."""
    script = textwrap.dedent("""
        import os, time
        from pike.evaluate import process_stopper
        process_stopper.call("trees", roots=[os.getpid()])
        print(process_stopper._helper._proc.pid, flush=True)
        time.sleep(60)
    """)
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE)
    assert parent.stdout is not None
    helper = int(parent.stdout.readline())
    assert psutil.pid_exists(helper)
    parent.kill()
    parent.wait()
    assert _until(lambda: not psutil.pid_exists(helper)
                  or psutil.Process(helper).status() == psutil.STATUS_ZOMBIE)


def test_the_helper_ignores_ctrl_c_and_says_what_it_cannot_do() -> None:
    """Ctrl-C reaches the whole foreground group: the parent's to handle, not the
    helper's. A request it cannot serve is answered with the error, and the parent does
    the work."""
    helper = subprocess.Popen([sys.executable, "-I", "-S", process_stopper.__file__],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert helper.stdin is not None and helper.stdout is not None
        time.sleep(0.3)
        helper.send_signal(signal.SIGINT)
        helper.stdin.write(b'{"id": 1, "op": "nothing", "args": {}}\n')
        helper.stdin.flush()
        assert b"KeyError" in helper.stdout.readline()
        helper.stdin.write(b'{"id": 2, "op": "trees", "args": {"roots": [1]}}\n')
        helper.stdin.flush()
        reply = helper.stdout.readline()
        assert b'"result"' in reply and b'"id": 2' in reply
        helper.stdin.close()
        assert helper.wait(5) == 0
    finally:
        helper.kill()


def test_a_reply_left_unread_is_not_taken_for_the_next_ones(
        family: subprocess.Popen, monkeypatch: pytest.MonkeyPatch) -> None:
    """A caller interrupted between its request and the reply (Ctrl-C in the main thread)
    leaves that reply in the pipe: the next call must get its own answer, not that one (a
    hold given another call's list would let go of the wrong processes, or of none)."""
    real_select = process_stopper.select.select
    calls = []

    def interrupted(*args: object) -> object:
        calls.append(1)
        if len(calls) == 1:
            time.sleep(0.3)  # the reply arrives meanwhile, and stays unread
            raise KeyboardInterrupt
        return real_select(*args)

    device_lock.tree_of(family.pid)
    helper = process_stopper.helper_pid()
    monkeypatch.setattr(process_stopper.select, "select", interrupted)
    with pytest.raises(KeyboardInterrupt):
        process_stopper.call("trees", roots=[999_999_999])  # answered with []
    assert process_stopper.helper_pid() is None  # ended with what it had not said yet
    stopped = device_lock._stop_trees([family.pid])
    assert process_stopper.helper_pid() not in (None, helper)
    try:
        assert {pid for pid, _ in stopped} == {pid for pid, _ in device_lock.tree_of(family.pid)}
        assert _until(lambda: _state(family.pid) == psutil.STATUS_STOPPED)
    finally:
        device_lock.set_stopped(stopped, False)
    assert _until(lambda: _state(family.pid) != psutil.STATUS_STOPPED)


def test_an_entry_names_its_child_by_start_ticks_and_older_entries_are_understood(
        family: subprocess.Popen, tmp_path: Path) -> None:
    """An entry holds its child's start in clock ticks since boot (`t<ticks>`), which a
    step of the wall clock does not move; an older pike's entry (seconds since the epoch,
    as psutil says a start) still names its child; one with another start is dropped."""
    folder = tmp_path / "children"
    folder.mkdir()
    written = device_lock._started(family.pid)
    assert written == f"t{process_stopper.start_ticks(family.pid)}"
    (folder / str(family.pid)).write_text(written)
    older = _family(0)
    (folder / str(older.pid)).write_text(str(psutil.Process(older.pid).create_time()))
    moved = _family(0)
    (folder / str(moved.pid)).write_text(f"t{process_stopper.start_ticks(moved.pid) + 1}")
    try:
        stopped = device_lock._stop_listed(folder, set())
        try:
            assert {pid for pid, _ in stopped} == {
                *(pid for pid, _ in device_lock.tree_of(family.pid)), older.pid}
            assert sorted(p.name for p in folder.iterdir()) == sorted([str(family.pid),
                                                                        str(older.pid)])
        finally:
            device_lock.set_stopped(stopped, False)
    finally:
        _end(older)
        _end(moved)


def test_a_reply_to_no_request_of_this_caller_is_dropped_and_a_garbled_one_fails_at_once(
        family: subprocess.Popen, monkeypatch: pytest.MonkeyPatch) -> None:
    """Replies carry their request's number: one to another request is not taken for this
    one's, and the helper's answer to a line it could not read fails the call at once (the
    parent does the work), not after the reply timeout."""
    monkeypatch.setattr(process_stopper, "_REPLY_S", 10.0)
    tree = {pid for pid, _ in device_lock.tree_of(family.pid)}
    proc = process_stopper._helper._proc
    assert proc is not None and proc.stdin is not None
    proc.stdin.write(b'{"id": -1, "op": "trees", "args": {"roots": []}}\n')  # no one's
    proc.stdin.flush()
    assert {pid for pid, _ in device_lock.tree_of(family.pid)} == tree
    proc.stdin.write(b'{"id": 7, "op": "tre')  # cut short: the next request joins it
    proc.stdin.flush()
    started = time.monotonic()
    assert {pid for pid, _ in device_lock.tree_of(family.pid)} == tree
    assert time.monotonic() - started < 5.0
