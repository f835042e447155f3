"""A candidate's files are bounded: its folders and printed output together, any one file,
and the OS sandbox's private /tmp and /dev/shm (evaluate/disk_use.py)."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

import pytest

from pike.config import EvalConfig, LimitsConfig
from pike.evaluate import disk_use, evaluate, os_sandbox, syscall_filter
from pike.evaluate.leftovers import scratch_root
from pike.evaluate.os_sandbox import SandboxPlan
from pike.task import Task
from tests.conftest import candidate
from tests.test_os_sandbox import needs_bwrap

MIB = 2**20


def _with_disk(cfg: EvalConfig, gib: float) -> EvalConfig:
    return cfg.model_copy(update={"limits": cfg.limits.model_copy(update={"disk_gib": gib})})


def test_the_limit_follows_the_references_outputs_unless_set() -> None:
    # five trials, the shifted one, the check after timing's and one more
    assert disk_use.disk_limit_bytes(LimitsConfig(), 3 * 2**30, 5) == (
        disk_use.FIXED_BYTES + 8 * 3 * 2**30)
    assert disk_use.disk_limit_bytes(LimitsConfig(disk_gib=0.5), 3 * 2**30, 5) == 2**29
    with pytest.raises(ValueError):
        LimitsConfig(disk_gib=0)


def test_a_folder_counts_each_file_once_by_what_it_holds(tmp_path: Path) -> None:
    inside, outside = tmp_path / "inside", tmp_path / "outside"
    (inside / "deep" / "er").mkdir(parents=True)
    outside.mkdir()
    (inside / "deep" / "er" / "a").write_bytes(os.urandom(MIB))
    os.link(inside / "deep" / "er" / "a", inside / "a-again")  # one file, two names
    with open(inside / "sparse", "wb") as f:  # 1 GiB apparent, nothing written
        f.truncate(2**30)
    (outside / "big").write_bytes(os.urandom(4 * MIB))
    (inside / "link").symlink_to(outside)  # not followed
    use = disk_use.folder_use([inside])
    assert MIB <= use.bytes < MIB + 256 * 1024, use
    assert use.entries == 6  # deep, er, a, a-again, sparse, link
    assert disk_use.folder_use([inside, tmp_path / "gone"]).bytes == use.bytes


def test_a_walk_stops_past_the_most_files(tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(disk_use, "MAX_ENTRIES", 50)
    for n in range(200):
        (tmp_path / str(n)).touch()
    use = disk_use.folder_use([tmp_path])
    assert use.entries == 51
    over = disk_use.DiskWatch([tmp_path], 2**30, -1).over(0.0, timing=False)
    assert over is not None and "more than 50 files" in over.message()


def test_the_watch_counts_the_printed_output_and_reads_only_when_due(tmp_path: Path) -> None:
    with tempfile.TemporaryFile() as printed:
        watch = disk_use.DiskWatch([tmp_path], 3 * MIB, printed.fileno())
        assert watch.over(100.0, timing=False) is None
        printed.write(os.urandom(2 * MIB))
        printed.flush()
        (tmp_path / "f").write_bytes(os.urandom(2 * MIB))
        assert watch.over(100.1, timing=False) is None  # not due yet
        over = watch.over(100.0 + disk_use.EVERY_S, timing=False)
        assert over is not None and over.used_bytes >= 4 * MIB
        assert "exceeded the disk limit" in over.message() and "limit 0.00 GiB" in over.message()
        assert watch.over(100.0 + disk_use.EVERY_S + 0.5, timing=True) is None  # timing: 1 s


def test_a_candidate_filling_its_folder_is_ended_and_its_files_go(
        mlp_task: Task, fast_config: EvalConfig) -> None:
    verdict = evaluate(mlp_task, candidate("fills_its_folder"), _with_disk(fast_config, 0.05))
    assert (verdict.status, verdict.phase) == ("crashed", "check"), verdict.message
    assert "exceeded the disk limit" in verdict.message and "limit 0.05 GiB" in verdict.message
    assert not list(scratch_root().glob("pike-*/**/fill-*"))


def test_files_held_open_after_their_name_is_gone_count(tmp_path: Path) -> None:
    with tempfile.TemporaryFile(dir=tmp_path) as hidden, \
            tempfile.TemporaryFile(dir=tmp_path) as printed:
        hidden.write(os.urandom(3 * MIB))
        hidden.flush()
        printed.write(os.urandom(MIB))
        printed.flush()
        watch = disk_use.DiskWatch([tmp_path], 3 * MIB, printed.fileno(),
                                   lambda: [os.getpid()])
        over = watch.over(0.0, timing=False)
        assert over is not None and 4 * MIB <= over.used_bytes < 5 * MIB  # printed once


def test_a_folder_made_unreadable_is_read_anyway(tmp_path: Path) -> None:
    inside = tmp_path / "inside"
    inside.mkdir()
    (inside / "f").write_bytes(os.urandom(MIB))
    inside.chmod(0o300)  # written into, not listed
    use = disk_use.folder_use([tmp_path])
    assert use.bytes >= MIB and not use.hidden
    over = disk_use.DiskExceeded(0, 1, 1, ["inside, unreadable"])
    assert "inside, unreadable" in over.message()


def test_a_candidate_making_files_without_end_is_ended(
        mlp_task: Task, fast_config: EvalConfig, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(disk_use, "MAX_ENTRIES", 2000)  # read by the parent, which watches
    verdict = evaluate(mlp_task, candidate("makes_many_files"), fast_config)
    assert (verdict.status, verdict.phase) == ("crashed", "check"), verdict.message
    assert "more than 2,000 files" in verdict.message


def test_no_file_grows_past_the_limit_and_the_candidate_cannot_raise_it(
        mlp_task: Task, fast_config: EvalConfig) -> None:
    verdict = evaluate(mlp_task, candidate("raises_its_file_limit"), _with_disk(fast_config, 0.25))
    assert verdict.status == "runtime_error", verdict.message
    assert f"file limit {2**28} {2**28}; raising it: refused" in verdict.message


def test_an_honest_candidate_is_untouched_by_a_tight_limit(
        mlp_task: Task, fast_config: EvalConfig) -> None:
    verdict = evaluate(mlp_task, candidate("fused"), _with_disk(fast_config, 0.01))
    assert verdict.ok, verdict.message
    if not syscall_filter.unsupported():
        assert verdict.guards["system calls"].endswith(": on"), verdict.guards


@pytest.mark.skipif(bool(syscall_filter.unsupported()),
                    reason="the system-call filter is for Linux on x86-64 and AArch64")
def test_no_reservation_past_the_file_limit_and_no_io_uring(
        mlp_task: Task, fast_config: EvalConfig) -> None:
    verdict = evaluate(mlp_task, candidate("reserves_past_its_file_limit"),
                       _with_disk(fast_config, 0.05))
    assert verdict.status == "runtime_error", verdict.message
    assert (f"keep-size reservation: errno {errno.EOPNOTSUPP}; "
            f"io_uring: errno {errno.ENOSYS}") in verdict.message


def test_the_filter_refuses_only_what_it_names(tmp_path: Path) -> None:
    """In a process of its own (a filter cannot be removed): fallocate's KEEP_SIZE refused
    in a thread started before it and in a process started after; plain fallocate, as
    posix_fallocate calls it, bounded by RLIMIT_FSIZE instead."""
    if syscall_filter.unsupported():
        assert syscall_filter.install().startswith("off: no filter for")
        return
    script = f"""
import ctypes, os, subprocess, sys, threading
from pike.evaluate import syscall_filter
libc = ctypes.CDLL(None, use_errno=True)
def reserve(path, mode):
    with open(path, "wb") as f:
        done = libc.fallocate(f.fileno(), mode, ctypes.c_long(0), ctypes.c_long(1 << 20))
        return 0 if done == 0 else ctypes.get_errno()
started = threading.Event(); go = threading.Event(); seen = []
def early():
    started.set(); go.wait(); seen.append(reserve({str(tmp_path / "t")!r}, 1))
thread = threading.Thread(target=early); thread.start(); started.wait()
print(syscall_filter.install())
go.set(); thread.join()
print(reserve({str(tmp_path / "a")!r}, 1), reserve({str(tmp_path / "b")!r}, 0), seen[0])
child = "import ctypes; l = ctypes.CDLL(None, use_errno=True); f = open({str(tmp_path / "c")!r}, 'wb'); print(l.fallocate(f.fileno(), 1, ctypes.c_long(0), ctypes.c_long(4096)), ctypes.get_errno())"
print(subprocess.run([sys.executable, "-c", child], capture_output=True, text=True).stdout.strip())
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:3] == [
        "on", f"{errno.EOPNOTSUPP} 0 {errno.EOPNOTSUPP}", f"-1 {errno.EOPNOTSUPP}"], done.stdout
    assert (tmp_path / "b").stat().st_size == 1 << 20


@needs_bwrap
@pytest.mark.parametrize("private", ["/tmp", "/dev/shm"])
def test_the_sandboxs_private_folders_in_memory_are_bounded(
        private: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(disk_use, "PRIVATE_TMPFS_BYTES", MIB)
    done = subprocess.run(
        [*SandboxPlan().prefix(), "sh", "-c", f"head -c {3 * MIB} /dev/zero > {private}/x"],
        capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and "No space left on device" in done.stderr, done
    assert os_sandbox._bwrap_sizes_tmpfs()
    assert f"{MIB / 2**30:g} GiB each" in SandboxPlan().describe()["mounts"]


def test_a_write_past_the_file_limit_says_which_limit() -> None:
    from pike.evaluate.diagnostics import describe_exception

    try:
        raise OSError(27, "File too large")
    except OSError as err:
        said = describe_exception(err)
    assert said.startswith("OSError: [Errno 27] File too large")
    assert "eval.limits.disk_gib" in said


def test_a_channel_flooded_without_line_ends_ends_the_child(
        mlp_task: Task, fast_config: EvalConfig) -> None:
    cfg = fast_config.model_copy(update={"limits": fast_config.limits.model_copy(
        update={"check_seconds": 10.0})})
    verdicts: list[Any] = []
    judging = threading.Thread(target=lambda: verdicts.append(
        evaluate(mlp_task, candidate("floods_the_channel"), cfg)), daemon=True)
    judging.start()
    judging.join(90)  # before the cap, the parent read on for ever
    assert verdicts, "the evaluation never ended"
    verdict = verdicts[0]  # whichever comes first: the phase's limit, or the cap on a line
    assert verdict.phase == "check" and (
        verdict.status == "timeout" and "no progress for 10 s" in verdict.message
        or verdict.status == "crashed" and verdict.message.startswith("sent no valid message")
        and "no line end in its first 64 MiB" in verdict.message
    ), verdict.message


def test_the_walk_never_goes_through_a_link_nor_too_deep(tmp_path: Path) -> None:
    """The candidate runs while its folders are read: a folder swapped for a link must
    not lead the parent into host folders (read, counted, or changed), and folders
    nested past MAX_DEPTH are not read but end it, as an unreadable one does."""
    outside = tmp_path / "outside"
    (outside / "b").mkdir(parents=True)
    (outside / "b" / "big").write_bytes(os.urandom(MIB))
    (outside / "b").chmod(0o300)
    top = tmp_path / "work"
    top.mkdir()
    (top / "a").symlink_to(outside)
    use = disk_use.folder_use([top])
    assert (use.bytes, use.hidden) == (0, [])
    assert (outside / "b").stat().st_mode & 0o777 == 0o300
    deep = top.joinpath(*["d"] * (disk_use.MAX_DEPTH + 1))
    deep.mkdir(parents=True)
    (deep / "f").write_bytes(b"x")
    assert disk_use.folder_use([top]).hidden == [f"d, over {disk_use.MAX_DEPTH} folders deep"]
    over = disk_use.DiskExceeded(0, 1, 1, disk_use.folder_use([top]).hidden)
    assert "over 32 folders deep" in over.message()
