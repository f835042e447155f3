"""The device lock: timing alone on a GPU, trials shared, timers not starved."""

from __future__ import annotations

import threading
import time

import pytest

from pike.evaluate.device_lock import hold


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


@pytest.mark.parametrize("scope", ["every_gpu_use", "timing_only"])
def test_every_step_of_an_evaluation_that_uses_the_device_holds_its_lock(monkeypatch, scope):
    """A child's launch (imports only) holds nothing; from its begin, its load, builds and
    warm-up, and the trials, hold the device shared;
    timing and the wall-clock calibration hold it alone; no hold nests in another (with the
    turnstile, a nested shared hold deadlocks against a waiting timer). With
    eval.device_lock timing_only (bench/contamination.py's control) only timing holds it."""
    from contextlib import contextmanager

    from pike.evaluate import device_lock, evaluate, judge
    from pike.task import Task
    from tests.conftest import EXAMPLES, candidate, fast_protocol

    state: dict[str, str | None] = {"held": None}
    seen: list[tuple[str, str | None]] = []

    @contextmanager
    def recording_hold(device, *, exclusive):
        assert state["held"] is None, f"a hold nested in a {state['held']} one"
        state["held"] = "exclusive" if exclusive else "shared"
        try:
            yield
        finally:
            state["held"] = None

    def watched(name, fn):
        def call(*args, **kwargs):
            seen.append((name, state["held"]))
            return fn(*args, **kwargs)
        return call

    monkeypatch.setattr(judge, "hold", recording_hold)
    monkeypatch.setattr(device_lock, "hold", recording_hold)
    steps = ("launch_child", "begin_child", "wait_ready", "run_trials", "time_interleaved",
             "calibrate")
    for name in steps:
        monkeypatch.setattr(judge, name, watched(name, getattr(judge, name)))
    judge.close_references()
    verdict = evaluate(Task.from_file(EXAMPLES / "tasks" / "1_GeluMLP.py"),
                       candidate("fused"), fast_protocol().model_copy(update={"device_lock": scope}))
    assert verdict.ok, verdict.message
    alone = {"time_interleaved", "calibrate"}
    assert {name for name, _ in seen} == set(steps)
    work = "shared" if scope == "every_gpu_use" else None
    for name, held in seen:
        # a launched child only imports until it begins: no device, so no hold
        expected = None if name == "launch_child" else "exclusive" if name in alone else work
        assert held == expected, (name, held)
