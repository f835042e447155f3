"""bench/offline.py, run as a user runs it: `pike bench` with the offline strategy, then
`pike audit` of its solution set; cut off with Ctrl-C, the same command goes on."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType

import psutil
import pytest
import yaml

from pike.solution_set import read_set

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples" / "tasks"


def _command(results: Path, config: Path, *extra: str) -> list[str]:
    return [sys.executable, "bench/offline.py", str(EXAMPLES), "--tag", "t", "--ids", "1",
            "--device", "cpu", "--jobs", "1", "--workers", "1", "--max-seconds", "60",
            "--max-candidates", "1", "--results", str(results), "--config", str(config),
            *extra]


def _config(tmp_path: Path, build_cache: Path) -> Path:
    path = tmp_path / "protocol.yaml"
    path.write_text(yaml.safe_dump({
        "eval": {"trials": 2, "build_cache": str(build_cache),
                 "timing": {"warmup_calls": 1, "warmup_seconds": 0.0, "min_calls": 5,
                            "min_seconds": 0.02, "rounds": 2},
                 "limits": {"load_seconds": 120, "check_seconds": 30, "timing_seconds": 60}},
        "search": {"baseline_modes": ["eager"]}}))
    return path


def _pikes_of(run_dir: Path) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        if any(str(run_dir) in part for part in proc.info["cmdline"] or []):
            found.append(proc)
    return found


def test_a_headline_that_fails_on_a_users_error_says_so_not_to_run_it_again(
        tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "bench/offline.py", str(tmp_path / "no-such-folder"),
                           "--tag", "t", "--device", "cpu", "--results", str(tmp_path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert "no such task folder" in done.stderr
    assert "pike bench failed (exit 2)" in done.stderr
    assert "run the same command again" not in done.stderr


@pytest.mark.slow
def test_a_cut_off_headline_goes_on_with_the_same_command_and_ends_audited(
        tmp_path: Path, build_cache: Path) -> None:
    results, config = tmp_path / "results", _config(tmp_path, build_cache)
    run_dir = results / "offline-t-run"
    driver = subprocess.Popen(_command(results, config), cwd=ROOT, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 180
    while not (run_dir / "run.sqlite").exists():  # Ctrl-C once the campaign has started
        assert driver.poll() is None and time.monotonic() < deadline, driver.stderr.read()
        time.sleep(0.2)
    time.sleep(1.0)
    driver.send_signal(signal.SIGINT)
    assert driver.wait(timeout=120) != 0
    assert "run the same command again" in driver.stderr.read()
    assert not _pikes_of(run_dir)  # the campaign's pike ended with it
    assert not (results / "offline-t.md").exists()

    done = subprocess.run(_command(results, config), cwd=ROOT, capture_output=True, text=True,
                          timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    data = json.loads((results / "offline-t.json").read_text())
    commands = [c["command"] for c in data["calls"]]
    assert commands[0].startswith("pike bench ") and "--out" in commands[0]
    assert commands[1].startswith(f"pike bench --resume {run_dir}")
    assert commands[2].startswith("pike audit ") and "--workers 1" in commands[2]
    [row] = data["rows"]
    assert row["task"] == "1_GeluMLP" and row["judged"] >= 1
    entry = read_set(run_dir / "solutions").entry("1_GeluMLP")
    if entry.file is None:  # on the loaded 2-core host: its best below eager (the set
        # keeps the reference), or its one correct candidate's figure withheld as noisy (a
        # clean-clone CI run: "no correct, timed candidate among 1: 1 ok")
        assert entry.status in ("slower", "failed"), entry
        assert row["audit_status"] == "missing" and data["audit"]["correct"] == 0, row
    else:
        assert row["audit_status"] == "ok"
        # on the loaded 2-core host a window may be noisy: then the audit says why it has
        # no figure (a clean-clone CI run saw one), never a silent gap
        assert row["audit_speedup"] > 0 if row["audit_speedup"] is not None \
            else row["audit_withheld"], row
        assert data["audit"]["correct"] == 1
    assert data["audit"]["tasks"] == 1
    markdown = (results / "offline-t.md").read_text()
    assert "Audited (the figure to quote)" in markdown and "pike audit" in markdown

    # run again: nothing left to judge; the audit, already done, is resumed, not redone
    again = subprocess.run(_command(results, config), cwd=ROOT, capture_output=True,
                           text=True, timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    calls = json.loads((results / "offline-t.json").read_text())["calls"]
    assert calls[-1]["command"].startswith("pike audit --resume")
    assert json.loads((results / "offline-t.json").read_text())["rows"] == data["rows"]


def test_redo_needs_a_campaign_that_has_run(tmp_path: Path) -> None:
    done = subprocess.run(_command(tmp_path, tmp_path / "none.yaml", "--redo", "1"), cwd=ROOT,
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
    assert done.returncode != 0 and "run without them first" in done.stderr


def test_a_redo_made_by_a_stopped_call_is_not_made_again_by_the_same_command(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # "Run the same command again" after a time limit must go on with the redone tasks,
    # not drop what they judged since and start them over once more.
    driver = _driver(monkeypatch)
    run_dir = tmp_path / "offline-t-run"
    run_dir.mkdir()
    (run_dir / "run.sqlite").write_bytes(b"")  # a campaign that has run
    commands: list[list[str]] = []
    codes = iter([75, 75])
    monkeypatch.setattr(driver, "_run", lambda command, state, where: (
        commands.append(command), next(codes))[1])
    argv = ["bench/offline.py", str(tmp_path / "tasks"), "--tag", "t", "--results",
            str(tmp_path), "--redo", "4", "--stop-after", "60", "--no-audit"]
    monkeypatch.setattr(sys, "argv", argv)
    assert driver.main() == 75
    assert driver.main() == 75
    assert "--redo" in commands[0] and "--redo" not in commands[1]
    assert all(c[c.index("--stop-after") + 1] == "60.0" for c in commands)


def _driver(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    import importlib.util

    monkeypatch.syspath_prepend(str(ROOT / "bench"))  # the script imports its `common`
    spec = importlib.util.spec_from_file_location("offline_driver", ROOT / "bench" / "offline.py")
    assert spec is not None and spec.loader is not None
    driver = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(driver)
    return driver


def test_the_audit_spreads_over_the_gpus_named_first_call_and_resumed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    driver = _driver(monkeypatch)
    argv = ["bench/offline.py", str(tmp_path / "tasks"), "--tag", "t",
            "--audit-devices", "cuda:0,cuda:1"]
    monkeypatch.setattr(sys, "argv", argv)
    args = driver._arguments()
    audit_dir = tmp_path / "audit"
    first = driver._audit_command(args, tmp_path / "set", audit_dir)
    assert first[first.index("--devices") + 1] == "cuda:0,cuda:1"
    assert first[first.index("--workers") + 1] == "1"  # one task per GPU at a time
    audit_dir.mkdir()
    (audit_dir / "run.sqlite").write_bytes(b"")  # an audit that has begun
    resumed = driver._audit_command(args, tmp_path / "set", audit_dir)
    assert resumed[4:7] == ["--resume", str(audit_dir), "--devices"]
    monkeypatch.setattr(sys, "argv", argv[:4])
    assert "--devices" not in driver._audit_command(driver._arguments(), tmp_path / "set",
                                                     audit_dir)
    # the audit gets what the campaign left of --stop-after
    limited = driver._audit_command(args, tmp_path / "set", audit_dir, 120.4)
    assert limited[limited.index("--stop-after") + 1] == "120"


def test_a_redo_that_changes_files_has_the_audit_judge_those_tasks_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    driver = _driver(monkeypatch)
    before = {"4_Conv": ["t4", "f4"], "12_Gemm": ["t12", "f12"]}
    now = {"4_Conv": ["t4", "f4-new"], "12_Gemm": ["t12", "f12"], "30_New": ["t30", "f30"]}
    assert driver._changed_ids(before, now) == [4, 30]
    assert driver._changed_ids(None, now) == []  # nothing audited yet
    assert driver._changed_ids("a whole-set checksum", now) == []  # an older state
    monkeypatch.setattr(sys, "argv", ["offline.py", str(tmp_path), "--tag", "t"])
    args = driver._arguments()
    audit_dir = tmp_path / "audit"
    audit_dir.mkdir()
    (audit_dir / "run.sqlite").write_bytes(b"")
    resumed = driver._audit_command(args, tmp_path / "set", audit_dir, None, [4, 30])
    assert resumed[4:8] == ["--resume", str(audit_dir), "--redo", "4,30"]
    assert "--redo" not in driver._audit_command(args, tmp_path / "set", audit_dir)
