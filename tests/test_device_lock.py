"""The device lock: timing alone on a GPU, trials shared, timers not starved."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from pike.evaluate.device_lock import hold
from tests.conftest import listening_child


@pytest.fixture(autouse=True)
def _lock_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("PIKE_LOCK_DIR", str(tmp_path))


def _holder(device: str, exclusive: bool, events: list[str], name: str,
            release: threading.Event) -> threading.Thread:
    def run() -> None:
        with hold(device, exclusive=exclusive):
            events.append(f"{name} in")
            release.wait(10)
            events.append(f"{name} out")  # still holding: the next holder comes after

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def _wait_for(events: list[str], item: str, seconds: float = 5) -> None:
    deadline = time.monotonic() + seconds
    while item not in events and time.monotonic() < deadline:
        time.sleep(0.01)
    assert item in events, events


def test_trials_share_the_device():
    events: list[str] = []
    go = threading.Event()
    threads = [_holder("cuda:0", False, events, n, go) for n in ("a", "b")]
    _wait_for(events, "a in")
    _wait_for(events, "b in")
    go.set()
    for t in threads:
        t.join(5)


def test_timing_waits_for_trials_and_new_trials_wait_for_timing():
    events: list[str] = []
    release_trial, release_timer, release_late = (threading.Event() for _ in range(3))
    trial = _holder("cuda:0", False, events, "trial", release_trial)
    _wait_for(events, "trial in")
    timer = _holder("cuda:0", True, events, "timer", release_timer)
    time.sleep(0.3)
    assert "timer in" not in events  # a trial is on the device
    late = _holder("cuda:0", False, events, "late", release_late)
    time.sleep(0.3)
    assert "late in" not in events  # the waiting timer closed the turnstile
    release_trial.set()
    _wait_for(events, "timer in")
    time.sleep(0.2)
    assert "late in" not in events  # still timing: nothing else on the device
    release_timer.set()
    _wait_for(events, "late in")
    release_late.set()
    for t in (trial, timer, late):
        t.join(5)
    assert events.index("timer out") < events.index("late in")


def test_other_gpus_and_cpu_are_not_locked():
    events: list[str] = []
    hold_timer = threading.Event()
    timer = _holder("cuda:0", True, events, "timer", hold_timer)
    _wait_for(events, "timer in")
    with hold("cuda:1", exclusive=True), hold("cpu", exclusive=True):
        pass  # would block if either shared cuda:0's lock
    hold_timer.set()
    timer.join(5)


def test_visible_devices_map_to_the_physical_gpu(monkeypatch, tmp_path):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    with hold("cuda:1", exclusive=True):
        pass
    assert (tmp_path / "cuda-5.lock").exists()


@pytest.mark.parametrize("scope", ["pause_others", "every_gpu_use", "timing_only"])
def test_every_step_of_an_evaluation_that_uses_the_device_holds_its_lock(monkeypatch, scope):
    """A child's launch (imports only) holds nothing; with every_gpu_use, from its begin,
    its load, builds and warm-up, and the trials, hold the device shared; with pause_others
    (the default) they hold nothing, and the child is listed for timers to stop before it
    begins, with its own pid kept out of its windows' stops. The reference's child is
    treated alike for its start and trials (listed, then unlisted before it is timed);
    timing and the wall-clock calibration hold it alone; no hold nests in another (with
    the turnstile, a nested shared hold deadlocks against a waiting timer). With
    eval.device_lock timing_only (bench/contamination.py's control) only timing holds it."""
    from contextlib import contextmanager

    from pike.evaluate import (
        candidate_child,
        candidate_windows,
        device_lock,
        evaluate,
        judge,
        reference,
        reference_cache,
        reference_start,
        shared_window,
    )
    from pike.task import Task
    from tests.conftest import EXAMPLES, candidate, fast_protocol

    state: dict[str, str | None] = {"held": None}
    seen: list[tuple[str, str | None]] = []

    listed: list[int] = []
    kept: list[list[int]] = []
    purposes: list[str] = []  # of the exclusive holds, for the device-holds ledger

    @contextmanager
    def recording_hold(device, *, exclusive, keep=(), purpose="other"):
        assert state["held"] is None, f"a hold nested in a {state['held']} one"
        state["held"] = "exclusive" if exclusive else "shared"
        if exclusive:
            purposes.append(purpose)
        kept.append(list(keep() if callable(keep) else keep))
        try:
            yield
        finally:
            state["held"] = None

    def watched(name, fn):
        def call(*args, **kwargs):
            seen.append((name, state["held"]))
            return fn(*args, **kwargs)
        return call

    def recording_list(device, pid, scope):
        seen.append(("list_child", state["held"]))
        listed.append(pid)
        return False  # the CPU device: nothing to stop


    monkeypatch.setattr(candidate_windows, "hold", recording_hold)  # the candidate's window
    monkeypatch.setattr(reference, "hold", recording_hold)  # the reference's calibration
    monkeypatch.setattr(shared_window, "hold", recording_hold)  # a first window's
    monkeypatch.setattr(device_lock, "hold", recording_hold)
    monkeypatch.setattr(device_lock, "list_child", recording_list)
    steps = ("launch_child", "begin_child", "wait_ready", "run_trials", "stage_timed_inputs",
             "time_interleaved", "calibrate")
    # the candidate's steps, and the reference's
    for module in (judge, candidate_child, candidate_windows, reference, reference_start):
        for name in steps:
            if hasattr(module, name):
                monkeypatch.setattr(module, name, watched(name, getattr(module, name)))
    monkeypatch.setattr(shared_window, "time_interleaved",
                        watched("time_interleaved", shared_window.time_interleaved))
    reference_cache.close_references()
    verdict = evaluate(Task.from_file(EXAMPLES / "tasks" / "1_GeluMLP.py"),
                       candidate("fused"), fast_protocol().model_copy(update={"device_lock": scope}))
    assert verdict.ok, verdict.message
    alone = {"time_interleaved", "calibrate"}
    assert {name for name, _ in seen} == {*steps, "list_child"}
    names = [name for name, _ in seen]
    # each child, the reference's and then the candidate's, runs no code unlisted
    begins = [at for at, name in enumerate(names) if name == "begin_child"]
    assert len(begins) == 2 and all(names[at - 1] == "list_child" for at in begins)
    _, own = listed  # the reference's child, then the candidate's
    assert [own] in kept  # its own window does not stop it (the reference's is unlisted
    # by then: test_a_trusted_childs_untimed_work_is_listed_and_unlisted_after)
    # the wall-clock calibration runs in the window, with no hold of its own to wait for;
    # on a loaded host the window may be timed again (a second look, a steady-window
    # retry: device_holds.CANDIDATE_AGAIN), in windows of its own, never in another hold
    assert purposes[0] == "candidate window" and set(purposes[1:]) <= {
        "candidate window, again"}, purposes
    assert [name for name, _ in seen].count("calibrate") == 1 or len(purposes) > 1
    for name, held in seen:
        # a child's untimed work holds the device shared only with every_gpu_use
        work = "shared" if scope == "every_gpu_use" else None
        # a launched child only imports until it begins: no device, so no hold
        expected = (None if name in ("launch_child", "list_child") else
                    "exclusive" if name in alone else work)
        assert held == expected, (name, held)


# --- pausing: a timer stops the other listed children for its window -------------------



def _status(p) -> str:
    return p.status()


def test_a_timer_stops_every_listed_child_tree_but_its_own_and_lets_them_go_on(children):
    import psutil

    from pike.evaluate import device_lock

    other, timed = children(), children()
    for root in (other, timed):
        assert device_lock.list_child("cuda:0", root.pid, "pause_others")
    others = [other, *other.children(recursive=True)]
    with hold("cuda:0", exclusive=True, keep=[timed.pid]):
        assert all(_status(p) == psutil.STATUS_STOPPED for p in others)
        assert device_lock.stopped(other.pid) and device_lock.timed_now("cuda:0")
        assert all(_status(p) != psutil.STATUS_STOPPED
                   for p in [timed, *timed.children(recursive=True)])
        # its parent, looking, sees a timer's stop: not the child's time, left stopped
        assert device_lock.resume_unless_timed("cuda:0", other.pid)
        assert device_lock.stopped(other.pid)
    assert not any(_status(p) == psutil.STATUS_STOPPED for p in others)
    assert not device_lock.timed_now("cuda:0")
    device_lock.unlist_child("cuda:0", other.pid)
    with hold("cuda:0", exclusive=True, keep=[timed.pid]):
        assert not device_lock.stopped(other.pid)  # unlisted: no longer stopped


def test_other_scopes_list_nothing_and_a_shared_hold_stops_nothing(children):
    from pike.evaluate import device_lock

    child = children()
    assert not device_lock.list_child("cuda:0", child.pid, "every_gpu_use")
    assert not device_lock.list_child("cpu", child.pid, "pause_others")
    with hold("cuda:0", exclusive=True):
        assert not device_lock.stopped(child.pid)
    assert device_lock.list_child("cuda:0", child.pid, "pause_others")
    with hold("cuda:0", exclusive=False):
        assert not device_lock.stopped(child.pid)
        assert not device_lock.timed_now("cuda:0")


def test_a_child_listed_in_a_window_stops_itself_until_its_parent_finds_no_timer(children):
    """Listing waits for no timer (it passed the turnstile, and so waited behind every
    timer waiting then): a child listed in the middle of a window, which the window did
    not see when it began, stops its own tree at once; once the window ends its parent
    lets it go on. Listed outside a window, it runs, and the next window stops it."""
    import psutil

    from pike.evaluate import device_lock

    def stopped_tree(root: psutil.Process) -> bool:
        deadline = time.monotonic() + 2
        while time.monotonic() < deadline:
            if all(p.status() == psutil.STATUS_STOPPED
                   for p in [root, *root.children(recursive=True)]):
                return True
            time.sleep(0.01)
        return False

    child, calm = children(), children()
    events: list[str] = []
    release = threading.Event()
    timer = _holder("cuda:0", True, events, "timer", release)
    _wait_for(events, "timer in")
    started = time.monotonic()
    assert device_lock.list_child("cuda:0", child.pid, "pause_others")
    assert time.monotonic() - started < 1.0  # did not wait for the window
    assert stopped_tree(child)
    assert device_lock.resume_unless_timed("cuda:0", child.pid)  # still the window's
    release.set()
    timer.join(5)
    assert not device_lock.resume_unless_timed("cuda:0", child.pid)  # let go on
    deadline = time.monotonic() + 5
    while device_lock.stopped(child.pid) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not device_lock.stopped(child.pid)
    # listed with no window: not stopped, and the next window stops it as any listed one
    assert device_lock.list_child("cuda:0", calm.pid, "pause_others")
    assert not device_lock.stopped(calm.pid)
    with hold("cuda:0", exclusive=True):
        assert stopped_tree(calm) and stopped_tree(child)
    assert not device_lock.stopped(calm.pid)
    assert not [p for p in device_lock._listed_dir("cuda:0").iterdir()
                if p.name.endswith(".part")]  # written whole, then named
    # what a lister killed between the two leaves is dropped by the next window, once old
    folder = device_lock._listed_dir("cuda:0")
    stale, fresh = folder / ".999991.part", folder / ".999992.part"
    for part in (stale, fresh):
        part.write_text("1.0")
    os.utime(stale, (time.time() - 120, time.time() - 120))
    with hold("cuda:0", exclusive=True):
        pass
    assert not stale.exists() and fresh.exists()
    fresh.unlink()
    device_lock.unlist_child("cuda:0", child.pid)
    device_lock.unlist_child("cuda:0", calm.pid)


def test_a_parent_letting_its_child_go_on_keeps_the_next_timer_out_until_it_has(
        children, monkeypatch):
    """Between the parent's look (no timer) and its SIGCONT a waiting timer could take the
    device and stop the child first: the SIGCONT would then let it run through that
    window. The look holds the device shared until the child is let go."""
    import signal as signals

    from pike.evaluate import device_lock

    child = children()
    assert device_lock.list_child("cuda:0", child.pid, "pause_others")
    device_lock.set_stopped(device_lock.tree_of(child.pid), True)
    order: list[str] = []
    resuming = threading.Event()
    real = device_lock._signal_all

    def slow_signal(procs, sig):
        if sig == signals.SIGCONT and not resuming.is_set():
            resuming.set()
            time.sleep(0.5)  # the parent's walk, slowed by other threads
            order.append("let go")
        real(procs, sig)

    monkeypatch.setattr(device_lock, "_signal_all", slow_signal)
    parent = threading.Thread(target=lambda: order.append(
        f"timed {device_lock.resume_unless_timed('cuda:0', child.pid)}"), daemon=True)
    parent.start()
    assert resuming.wait(5)
    with hold("cuda:0", exclusive=True):
        order.append("timer in")
        deadline = time.monotonic() + 2
        while not device_lock.stopped(child.pid) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert device_lock.stopped(child.pid)  # the window stops it after the let-go
    parent.join(5)
    assert order.index("let go") < order.index("timer in") and "timed False" in order
    device_lock.unlist_child("cuda:0", child.pid)


def test_a_child_left_stopped_by_a_timer_that_died_is_let_go_by_its_parent(children):
    """A timer in another process killed with SIGKILL mid-window: its lock goes with it,
    and the child's own parent, finding it stopped with no timer, lets it go on."""
    import psutil

    from pike.evaluate import device_lock

    child = children()
    device_lock.list_child("cuda:0", child.pid, "pause_others")
    timer = subprocess.Popen([sys.executable, "-c", (
        "import time\n"
        "from pike.evaluate.device_lock import hold\n"
        "with hold('cuda:0', exclusive=True):\n"
        "    print('in', flush=True)\n"
        "    time.sleep(60)\n")], stdout=subprocess.PIPE, text=True)
    assert timer.stdout is not None and timer.stdout.readline().strip() == "in"
    assert device_lock.stopped(child.pid)
    assert device_lock.resume_unless_timed("cuda:0", child.pid)  # the timer is alive
    timer.kill()
    timer.wait()
    assert not device_lock.resume_unless_timed("cuda:0", child.pid)
    deadline = time.monotonic() + 5
    while device_lock.stopped(child.pid) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not any(p.status() == psutil.STATUS_STOPPED
                   for p in [child, *child.children(recursive=True)])


def test_the_time_a_timer_keeps_a_child_stopped_does_not_count_against_its_limit():
    from pike.evaluate import device_lock
    from pike.evaluate.sandbox import PhaseTimeout

    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        child, write_fd = listening_child(proc, limit_s=1.0)
        device_lock.list_child("cuda:0", proc.pid, "pause_others")

        def window_then_answer() -> None:
            with hold("cuda:0", exclusive=True):
                time.sleep(2.0)  # twice the child's limit
            time.sleep(0.3)
            os.write(write_fd, b'{"event": "ready"}\n')

        threading.Thread(target=window_then_answer, daemon=True).start()
        event = child.receive()
        assert not isinstance(event, PhaseTimeout), event
        assert event == {"event": "ready"}
        assert 1.5 < child.phase_seconds["paused"] < 3.0
        os.close(write_fd)
        os.close(child._from_child)

        # stopped with no timer (by itself): let go on, and its limit runs as always
        child, write_fd = listening_child(proc, limit_s=0.5)
        proc.send_signal(signal.SIGSTOP)
        event = child.receive()
        assert isinstance(event, PhaseTimeout)
        assert not device_lock.stopped(proc.pid)
        os.close(write_fd)
        os.close(child._from_child)
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.parametrize("listed", [True, False])
def test_the_final_check_holds_the_device_only_for_the_parents_part_once_listed(
        monkeypatch, listed):
    """A listed child (pause_others) is stopped by other timers: its final call and the
    file it writes need no hold, and timers no longer wait behind them. The parent's read
    back and comparison (its own GPU work) still hold the device shared. An unlisted child
    (every_gpu_use) holds it through both, as before."""
    from contextlib import contextmanager
    from pathlib import Path
    from types import SimpleNamespace

    from pike.evaluate import candidate_checks
    from pike.evaluate.verdict import Verdict
    from tests.conftest import fast_protocol

    held = {"now": False}
    seen: list[tuple[str, bool]] = []

    @contextmanager
    def shared_hold(device, scope):
        assert not held["now"], "a hold nested in another"
        held["now"] = True
        try:
            yield
        finally:
            held["now"] = False

    def child_call(child, *args, **kwargs):
        seen.append(("child", held["now"]))
        return {"event": "final_checked"}

    def compared(*args):
        seen.append(("parent", held["now"]))
        return Verdict(status="ok"), []  # and no values the reference's rounding may explain

    monkeypatch.setattr(candidate_checks, "hold_for_work", shared_hold)
    monkeypatch.setattr(candidate_checks, "request", child_call)
    monkeypatch.setattr(candidate_checks, "_final_compared", compared)
    child = SimpleNamespace(pausable_on="cuda:0" if listed else None, permit=lambda phase: None)
    verdict = candidate_checks._final_check(child, None, Path("."), fast_protocol(), "cuda:0")
    assert verdict.ok
    assert seen == [("child", not listed), ("parent", True)]


def test_a_calibration_in_a_held_window_stops_the_candidates_it_kept_running(monkeypatch):
    """The window's hold keeps its candidates running; the calibration it then makes must
    not measure beside a thread one of them left running (it would loosen the wall-clock
    check for every later candidate), so it stops them, as its own hold did, and lets
    them go on after."""
    from pike.evaluate import reference as reference_module
    from pike.evaluate.device_lock import stopped
    from pike.evaluate.wall_clock_check import LoopCost

    kept = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    seen: list[bool] = []

    def calibrate(child):
        deadline = time.monotonic() + 2  # a signal is delivered, not waited for
        while not stopped(kept.pid) and time.monotonic() < deadline:
            time.sleep(0.01)
        seen.append(stopped(kept.pid))
        return LoopCost(0.001, 0.0001)

    class Child:
        def enter_phase(self, phase):
            pass

    monkeypatch.setattr(reference_module, "calibrate", calibrate)
    reference = reference_module.ReferenceRun(Path("."), [], {}, Child(), Path("."), device="cuda:0")
    try:
        cost = reference.loop_cost(held=True, stop=[kept.pid])
        assert seen == [True]
        deadline = time.monotonic() + 2
        while stopped(kept.pid) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not stopped(kept.pid)
        assert cost == LoopCost(0.001, 0.0001)
        assert reference.loop_cost() is cost and len(seen) == 1  # kept: no second one
    finally:
        kept.kill()
        kept.wait()


def test_a_trusted_childs_untimed_work_is_listed_and_unlisted_after(tmp_path):
    """The reference's start (and a baseline's builds) run listed for timers to stop, and
    the child is off the list afterwards, also when the work fails: a window that times it
    later must not stop it."""
    from pike.evaluate.device_lock import _listed_dir
    from pike.evaluate.reference_start import beside_others

    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    child, write_fd = listening_child(proc, 10.0, pausable_on=None)
    try:
        for fails in (False, True):
            with contextlib.suppress(RuntimeError), \
                    beside_others(child, "cuda:0", "pause_others"):
                assert child.pausable_on == "cuda:0"
                assert str(proc.pid) in os.listdir(_listed_dir("cuda:0"))
                if fails:
                    raise RuntimeError("the reference failed")
            assert child.pausable_on is None
            assert str(proc.pid) not in os.listdir(_listed_dir("cuda:0"))
    finally:
        os.close(write_fd)
        proc.kill()
        proc.wait()
