"""The device-holds ledger: every exclusive hold, what it was for, when it was asked for,
taken and let go; `pike bench` keeps one in its run dir, bench/search_time.py reads it."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import ModuleType

import pytest

from pike.evaluate import device_holds
from pike.evaluate.device_lock import hold, list_child, stopped, unlist_child
from pike.search import campaign
from pike.store import RunStore
from tests.conftest import EXAMPLES, bench_script


@pytest.fixture(autouse=True)
def _lock_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("PIKE_LOCK_DIR", str(tmp_path / "locks"))


def test_an_exclusive_hold_is_recorded_with_its_purpose_and_times(tmp_path: Path) -> None:
    ledger = tmp_path / "holds.jsonl"
    with device_holds.recording(ledger):
        before = time.time()
        with hold("cuda:0", exclusive=True, purpose=device_holds.CONFIRMING_WINDOW):
            time.sleep(0.05)
        with hold("cuda:0", exclusive=False):  # shared: trials, comparisons
            pass
        with hold("cpu", exclusive=True, purpose=device_holds.CANDIDATE_WINDOW):
            pass  # nothing is held off CUDA
    with hold("cuda:0", exclusive=True, purpose=device_holds.BASELINE):
        pass  # no longer recording
    (only,) = device_holds.read(ledger)
    assert only["purpose"] == "confirming window" and only["device"] == "cuda:0"
    assert before <= only["asked"] <= only["held"] < only["released"]
    assert only["released"] - only["held"] >= 0.04
    assert only["stopped"] == 0


def test_a_hold_counts_the_processes_it_stopped_and_its_wait(tmp_path: Path) -> None:
    """A listed child is stopped for the hold and let go after it; a hold that waited
    behind a shared holder says how long."""
    ledger = tmp_path / "holds.jsonl"
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    release = threading.Event()

    def trial() -> None:
        with hold("cuda:0", exclusive=False):
            release.wait(5)

    sharing = threading.Thread(target=trial, daemon=True)
    try:
        assert list_child("cuda:0", sleeper.pid, "pause_others")
        sharing.start()
        time.sleep(0.1)
        threading.Timer(0.3, release.set).start()
        with device_holds.recording(ledger):
            with hold("cuda:0", exclusive=True, purpose=device_holds.CANDIDATE_WINDOW):
                was_stopped = stopped(sleeper.pid)
        assert was_stopped and not stopped(sleeper.pid)
        (only,) = device_holds.read(ledger)
        assert only["stopped"] == 1
        assert only["held"] - only["asked"] >= 0.15  # behind the trial's shared hold
        # stopping it (a scan of the host's processes, the signal, a settle) is in the hold
        assert 0.0 < only["stopping_s"] <= only["released"] - only["held"]
        assert device_holds.summarize([only])["candidate window"]["stopping_s"] \
            == only["stopping_s"]
    finally:
        release.set()
        unlist_child("cuda:0", sleeper.pid)
        sleeper.kill()
        sleeper.wait()
        sharing.join(5)


def test_a_torn_line_is_left_out_and_purposes_are_summed(tmp_path: Path) -> None:
    ledger = tmp_path / "holds.jsonl"
    rows = [("candidate window", 0.0, 1.0, 2.0), ("candidate window", 3.0, 3.5, 4.5),
            ("baseline builds and window", 5.0, 5.0, 15.0), ("confirming window", 20, 22, 30)]
    ledger.write_text("".join(json.dumps({"purpose": p, "asked": a, "held": h, "released": r,
                                          "stopped": 3}) + "\n" for p, a, h, r in rows)
                      + '{"purpose": "candid')  # killed mid-write
    holds = device_holds.read(ledger)
    assert len(holds) == 4
    found = device_holds.summarize(holds)
    assert list(found) == ["baseline builds and window", "confirming window",
                           "candidate window"]  # most held first
    window = found["candidate window"]
    assert (window["holds"], window["held_s"], window["waited_s"]) == (2, 2.0, 1.5)
    assert window["median_s"] == 1.0 and window["stopped"] == 3
    assert "stopping_s" not in window  # older ledgers do not say
    early = device_holds.summarize(holds, start=0.0, end=10.0)  # by when each was taken
    assert set(early) == {"candidate window", "baseline builds and window"}
    assert device_holds.read(tmp_path / "none.jsonl") == []


def test_a_bench_records_its_holds_in_its_run_dir_and_a_resume_adds_to_them(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def run_all(store, tasks, *args, **kwargs):  # a hold where the searches would be
        with hold("cuda:0", exclusive=True, purpose=device_holds.CANDIDATE_WINDOW):
            pass
        return []

    monkeypatch.setattr(campaign, "_run_all", run_all)
    monkeypatch.setattr(campaign, "_write_outputs", lambda store, outcomes: None)
    run = tmp_path / "run"
    campaign.bench(EXAMPLES / "tasks", ids=[1], out=run)
    campaign.bench(None, resume=run)
    holds = device_holds.read(run / device_holds.LEDGER_NAME)
    assert [h["purpose"] for h in holds] == ["candidate window"] * 2
    with hold("cuda:0", exclusive=True):  # after the bench: not its ledger's
        pass
    assert len(device_holds.read(run / device_holds.LEDGER_NAME)) == 2


@pytest.fixture(scope="module")
def search_time() -> ModuleType:
    return bench_script("search_time")


def test_search_time_shows_what_held_the_device_alone_per_call(
        tmp_path: Path, search_time: ModuleType) -> None:
    run = tmp_path / "run"
    RunStore.create(run, {}, "test").close()
    rows = [("candidate window", 99.0, 100.0, 101.0), ("candidate window", 150, 150, 151),
            ("baseline builds and window", 110.0, 110.0, 122.0),
            ("confirming window", 210.0, 210.0, 218.0)]
    (run / device_holds.LEDGER_NAME).write_text("".join(
        json.dumps({"purpose": p, "asked": a, "held": h, "released": r, "stopped": 5}) + "\n"
        for p, a, h, r in rows))
    calls = [("bench-1.log", 90.0, 190.0), ("bench-2.log", 200.0, 300.0)]
    held = search_time.held_alone(run, calls)
    assert held["all"]["candidate window"]["held_s"] == 2.0
    assert held["calls"][1]["purposes"] == {"confirming window": pytest.approx({
        "holds": 1, "held_s": 8.0, "median_s": 8.0, "waited_s": 0.0, "stopped": 5})}
    text = "\n".join(search_time.render_held_alone(held))
    assert "22 s held alone in all" in text
    assert "| baseline builds and window | 1 | 12 | 12.00 | 0 | 5 |" in text
    assert "| call | seconds | baseline builds and window | confirming window | candidate window | all |" in text
    assert "| bench-1.log | 100 | 12 | 0 | 2 | 14 (14%) |" in text
    assert "| bench-2.log | 100 | 0 | 8 | 0 | 8 (8%) |" in text
    assert search_time.held_alone(tmp_path, calls) is None  # no ledger: no section


def test_a_bench_says_in_one_line_what_held_the_device_alone(tmp_path: Path) -> None:
    assert device_holds.said_briefly(tmp_path) is None  # no ledger (the CPU): nothing said
    rows = [("candidate window", 0.0, 1.0, 3.0), ("baseline builds and window", 5, 5, 17)]
    (tmp_path / device_holds.LEDGER_NAME).write_text("".join(
        json.dumps({"purpose": p, "asked": a, "held": h, "released": r, "stopped": 2}) + "\n"
        for p, a, h, r in rows))
    line = device_holds.said_briefly(tmp_path)
    assert line is not None and line.startswith("device held alone: 14 s over the run's calls")
    assert "(baseline builds and window 12 s, candidate window 2 s)" in line


def test_pike_bench_prints_the_line_where_its_run_has_a_ledger(
        tmp_path: Path, run_config: Path) -> None:
    from tests.test_optimize import pike

    tasks = tmp_path / "tasks"
    tasks.mkdir()
    (tasks / "1_GeluMLP.py").write_text((EXAMPLES / "tasks" / "1_GeluMLP.py").read_text())
    out = tmp_path / "campaign"
    first = pike("bench", tasks, "--config", run_config, "--out", out, "--stop-after", "0")
    assert first.exit_code == 75, first.output
    assert "device held alone" not in first.output  # the CPU holds nothing alone
    (out / device_holds.LEDGER_NAME).write_text(json.dumps(
        {"purpose": "confirming window", "asked": 1.0, "held": 2.0, "released": 9.0}) + "\n")
    again = pike("bench", "--resume", out, "--stop-after", "0")
    assert again.exit_code == 75, again.output
    assert "device held alone: 7 s over the run's calls (confirming window 7 s)" in again.output
