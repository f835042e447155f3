"""No child outlives pike, however pike ends, and nothing it leaves in the temp folder
outlives the next pike to start; a hung candidate gets its verdict within a minute."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest
import yaml

from pike.config import EvalConfig, LimitsConfig, TimingConfig
from pike.evaluate import evaluate, leftovers
from pike.evaluate.leftovers import make_temp_dir, sweep_orphaned_dirs
from pike.store import ERROR_STATE, RunStore
from pike.task import Task
from tests.conftest import CANDIDATES, EXAMPLES, candidate, judged_in

MLP = EXAMPLES / "tasks" / "1_GeluMLP.py"
# A short timing protocol: these tests are about how pike ends, not about its figures, and
# the default one (a second of timed calls in 20 rounds, each side) only made them wait.
FAST_TIMING = {"warmup_calls": 1, "warmup_seconds": 0.0, "min_calls": 5, "min_seconds": 0.02,
               "rounds": 2}


def _runners_under(pid: int) -> list[psutil.Process]:
    try:
        tree = psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []
    return [p for p in tree if _cmdline(p)[1:3] == ["-m", "pike.evaluate.runner"]]


def _cmdline(p: psutil.Process) -> list[str]:
    try:
        return p.cmdline()
    except psutil.Error:
        return []


@pytest.mark.parametrize("sandbox", ["auto", "off"])
@pytest.mark.parametrize("how", [signal.SIGTERM, signal.SIGKILL])
def test_killing_pike_eval_leaves_no_process_and_no_temp_dir(
        tmp_path: Path, build_cache: Path, how: signal.Signals, sandbox: str) -> None:
    temp = tmp_path / "tmp"
    temp.mkdir()
    config = tmp_path / "pike.yaml"
    config.write_text(yaml.safe_dump({"eval": {"sandbox": sandbox, "trials": 2,
                                               "build_cache": str(build_cache),
                                               "timing": FAST_TIMING}}))
    env = {**os.environ, "TMPDIR": str(temp)}
    pike = subprocess.Popen([sys.executable, "-m", "pike", "eval", str(MLP),
                             str(CANDIDATES / "infinite_loop.py"), "--device", "cpu",
                             "--config", str(config)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while len(_runners_under(pike.pid)) < 2 and time.monotonic() < deadline:
        time.sleep(0.2)  # the reference's child and the looping candidate's
    children = [p for p in psutil.Process(pike.pid).children(recursive=True)]
    assert len(_runners_under(pike.pid)) == 2, pike.stderr.read() if pike.poll() else ""
    # The candidate's child is launched before the reference ends; its request is written
    # when it begins, and then it loops in its first call.
    while not list(temp.glob("pike-cand-*/work/request.json")) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert list(temp.glob("pike-cand-*/work/request.json")), "the candidate never began"
    time.sleep(2.0)
    pike.send_signal(how)
    _, err = pike.communicate(timeout=60)
    gone, alive = psutil.wait_procs(children, timeout=10)
    assert alive == [], [(_cmdline(p), p.status()) for p in alive]
    left = sorted(p.name for p in temp.iterdir() if p.name.startswith("pike-"))
    if how == signal.SIGTERM:
        assert pike.returncode != 0 and "Traceback" not in err, err
        assert left == []
    else:  # a killed pike cannot clean up: the next one to start does
        assert left, "the killed pike's temp dirs should be there to sweep"
        subprocess.run([sys.executable, "-m", "pike", "eval", str(tmp_path / "missing.py"),
                        str(CANDIDATES / "fused.py")], env=env, capture_output=True)
        assert sorted(p.name for p in temp.iterdir() if p.name.startswith("pike-")) == []


@pytest.mark.parametrize("command", ["optimize", "audit", "bench"])
def test_a_run_cut_off_by_sigterm_says_how_to_go_on_and_leaves_nothing_running(
        tmp_path: Path, build_cache: Path, command: str) -> None:
    """A user's `timeout` or `kill` mid-run: no child left, no temp dir, and the last line
    names the run dir to resume (which that command then accepts). The audit's file loops
    forever, so it is cut off mid-evaluation; the search is cut off once a candidate of it
    is judged, with its next ones in flight. A campaign exits at once, its worker threads
    mid-evaluation, so it ends its children and removes its own temp dirs itself: left for
    the next pike to sweep, a large task's inputs would hold gigabytes of /dev/shm."""
    temp, out = tmp_path / "tmp", tmp_path / "run"
    temp.mkdir()
    config = tmp_path / "pike.yaml"
    config.write_text(yaml.safe_dump({
        "eval": {"sandbox": "off", "trials": 2, "build_cache": str(build_cache),
                 "timing": FAST_TIMING},
        "search": {"baseline_modes": ["eager"]}}))
    if command == "audit":
        solutions = tmp_path / "set"
        solutions.mkdir()
        (solutions / MLP.name).write_text((CANDIDATES / "infinite_loop.py").read_text())
        args = ["audit", str(solutions), str(MLP.parent), "--tasks", "1"]
        started = lambda: bool(list(temp.glob("pike-cand-*/**/request.json")))  # noqa: E731
    else:
        args = (["optimize", str(MLP)] if command == "optimize"
                else ["bench", str(MLP.parent), "--tasks", "1"]) + ["--device", "cpu"]
        started = lambda: bool(judged_in(out))  # noqa: E731
    pike = subprocess.Popen([sys.executable, "-m", "pike", *args, "--config", str(config),
                             "--out", str(out)], env={**os.environ, "TMPDIR": str(temp)},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 180
    while not started() and time.monotonic() < deadline:
        assert pike.poll() is None, pike.communicate()[1]
        time.sleep(0.2)
    children = psutil.Process(pike.pid).children(recursive=True)
    pike.send_signal(signal.SIGTERM)
    _, err = pike.communicate(timeout=60)
    _, alive = psutil.wait_procs(children, timeout=10)
    assert alive == [], [(_cmdline(p), p.status()) for p in alive]
    assert pike.returncode == 130 and "Traceback" not in err, err
    assert f"pike {command} --resume {out}" in " ".join(err.split()), err
    assert sorted(p.name for p in temp.iterdir() if p.name.startswith("pike-")) == []


SLOW_TASK = """import time
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        if {slow}:
            time.sleep(300)  # a build that takes minutes: a max-autotune compile, say

    def forward(self, x):
        return x * 2


def get_inputs():
    return [torch.randn(8, 8)]


def get_init_inputs():
    return []
"""


@pytest.mark.parametrize("command, workers, how, output", [
    ("audit", 1, signal.SIGINT, "open"), ("audit", 2, signal.SIGTERM, "open"),
    ("optimize", 2, signal.SIGINT, "open"), ("audit", 2, signal.SIGINT, "closed")])
def test_a_run_cut_off_mid_build_ends_within_seconds_and_records_no_failure(
        tmp_path: Path, build_cache: Path, command: str, workers: int,
        how: signal.Signals, output: str) -> None:
    """Ctrl-C (or a device call's `timeout`) while children build: they are busy and would
    not answer a polite "stop", and with work in worker threads Python's exit (and a pool's
    close) would wait for each to finish its step. Measured before, on references building:
    14 s with one worker (the grace period, waited out), and still running after 60 s with
    two (a real max-autotune build outlived its call's SIGINT on an H200). The search's
    candidates build in a pool's threads. What was cut off is not recorded as failed.
    With its output closed (`| head`, a closed terminal), pike's last words fail, and
    the cleanup must still happen."""
    tasks, temp, out = tmp_path / "tasks", tmp_path / "tmp", tmp_path / "run"
    tasks.mkdir()
    temp.mkdir()
    config = tmp_path / "pike.yaml"
    config.write_text(yaml.safe_dump({
        "eval": {"sandbox": "off", "trials": 2, "build_cache": str(build_cache),
                 "timing": FAST_TIMING},
        "search": {"baseline_modes": ["eager"]}}))
    common = ["--device", "cpu", "--workers", str(workers), "--config", str(config),
              "--out", str(out)]
    if command == "audit":  # the references build for minutes
        solutions = tmp_path / "set"
        solutions.mkdir()
        for i in (1, 2):
            (tasks / f"{i}_Slow.py").write_text(SLOW_TASK.format(slow="True"))
            (solutions / f"task_{i}.py").write_text(
                "import torch.nn as nn\n\n\nclass ModelNew(nn.Module):\n"
                "    def forward(self, x):\n        return x * 2\n")
        args = ["audit", str(solutions), str(tasks), *common]
        ready = lambda: len(_runners_under(pike.pid)) >= workers  # noqa: E731
    else:  # the reference is quick; each candidate (its module has a ModelNew) builds long
        (tasks / "1_Slow.py").write_text(SLOW_TASK.format(slow='"ModelNew" in globals()'))
        args = ["optimize", str(tasks / "1_Slow.py"), *common]
        ready = lambda: len(list(temp.glob("pike-cand-*/work/request.json"))) >= 2  # noqa: E731
    pike = subprocess.Popen([sys.executable, "-m", "pike", *args],
                            env={**os.environ, "TMPDIR": str(temp)},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not ready() and time.monotonic() < deadline:
        assert pike.poll() is None, pike.communicate()[1]
        time.sleep(0.2)
    time.sleep(3.0)  # each child is in its model's constructor
    children = psutil.Process(pike.pid).children(recursive=True)
    if output == "closed":
        pike.stdout.close()
        pike.stderr.close()
    signalled = time.monotonic()
    pike.send_signal(how)
    if output == "closed":
        pike.wait(timeout=120)
        err = ""
    else:
        _, err = pike.communicate(timeout=120)
    took = time.monotonic() - signalled
    _, alive = psutil.wait_procs(children, timeout=10)
    assert alive == [], [(_cmdline(p), p.status()) for p in alive]
    assert pike.returncode == 130 and "Traceback" not in err, err
    assert took < 10, f"{took:.1f} s from the signal to pike's exit"
    if output == "open":
        assert f"pike {command} --resume {out}" in " ".join(err.split()), err
    assert sorted(p.name for p in temp.iterdir() if p.name.startswith("pike-")) == []
    with RunStore.open(out) as store:
        names = [row["name"] for row in store.tasks()]
        assert [store.get_state(name, ERROR_STATE) for name in names] == [None] * len(names)
        assert [r.verdict for name in names for r in store.candidates(name)
                if r.verdict is not None and r.verdict.status != "ok"] == []


def test_the_sweep_keeps_the_dirs_of_live_pikes(tmp_path: Path) -> None:
    mine = make_temp_dir("cand")
    try:
        dead = tmp_path / "pike-ref-999999-12345-abc"
        (dead / "inputs").mkdir(parents=True)
        (dead / "inputs" / "x.pt").write_text("")
        (dead / "inputs").chmod(0o555)
        other = tmp_path / "not-pike-999999-1-x"
        other.mkdir()
        live = tmp_path / mine.name
        live.mkdir()
        # the owner's start in clock ticks since boot: a folder naming this pid with
        # another start is a dead run's whose pid came back; an older pike's names hold
        # whole seconds since the epoch, understood as before
        ticks = int(mine.name.split("-")[3].removeprefix("t"))
        recycled = tmp_path / f"pike-cand-{os.getpid()}-t{ticks + 1}-abc"
        recycled.mkdir()
        older = tmp_path / f"pike-cand-{os.getpid()}-{int(psutil.Process().create_time())}-abc"
        older.mkdir()
        assert sorted(sweep_orphaned_dirs(str(tmp_path))) == sorted([dead.name, recycled.name])
        assert not dead.exists() and other.exists() and live.exists()
        assert not recycled.exists() and older.exists()
    finally:
        mine.rmdir()


def test_the_ending_cleanup_leaves_no_folder_a_worker_thread_was_making_or_filling(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Worker threads run on while pike ends: one that had passed the "ending?" check could
    make its folder after the cleanup's last look, and one still writing into a folder made
    its removal fail (a `pike-cand-*` left after an interrupted optimize in CI)."""
    monkeypatch.setattr(leftovers, "_ENDING", threading.Event())
    monkeypatch.setattr(leftovers, "_kill_children", lambda wait_s: None)  # pytest's own
    monkeypatch.setattr(leftovers, "scratch_root", lambda: tmp_path)
    monkeypatch.setattr(leftovers, "_roots", lambda: [str(tmp_path)])
    started = threading.Event()

    def busy_worker() -> None:
        with contextlib.suppress(KeyboardInterrupt):
            while True:  # new folders as fast as it can, each filled for a while
                folder = leftovers.make_temp_dir("cand")
                started.set()
                for i in range(200):
                    with contextlib.suppress(OSError):  # the cleanup took it meanwhile
                        (folder / f"{i}.txt").write_text("x")
                leftovers.refuse_new_work_if_ending()

    workers = [threading.Thread(target=busy_worker) for _ in range(4)]
    for worker in workers:
        worker.start()
    started.wait(10)
    time.sleep(0.05)
    leftovers.end_children_and_remove_own_dirs(wait_s=2.0)
    for worker in workers:
        worker.join(10)
    assert [p.name for p in tmp_path.iterdir()] == []


def test_a_hung_candidate_on_a_small_task_times_out_within_a_minute(
        mlp_task: Task, build_cache: Path) -> None:
    cfg = EvalConfig(device="cpu", trials=2, build_cache=build_cache,
                     timing=TimingConfig(**FAST_TIMING),
                     limits=LimitsConfig())  # the default ceilings: 300 s to check
    evaluate(mlp_task, candidate("fused"), cfg)  # the reference is measured and cached
    started = time.monotonic()
    verdict = evaluate(mlp_task, candidate("infinite_loop"), cfg)
    assert verdict.status == "timeout", verdict.message
    assert time.monotonic() - started < 60
    # the limit follows the reference's own check (30 s at least; more on a loaded host)
    limit = re.search(r"no progress for ([\d.]+) s", verdict.message)
    assert limit and 30 <= float(limit[1]) < 60, verdict.message


def test_a_kept_reference_outlives_the_thread_that_started_it(
        mlp_task: Task, fast_config: EvalConfig) -> None:
    # The death signal fires when the thread that started a child ends: a reference kept
    # for later candidates, started by a pool's worker, died with that worker.
    import threading

    from pike.evaluate.reference_cache import release_reference, run_reference
    started = {}

    def start() -> None:
        started["ref"] = run_reference(mlp_task, fast_config, "cpu", keep_child=True,
                                       cache=False)

    worker = threading.Thread(target=start)
    worker.start()
    worker.join()
    reference = started["ref"]
    try:
        time.sleep(1.0)
        assert reference.child is not None and reference.child.alive()
        assert reference.usable()
    finally:
        release_reference(reference)
        reference.close()


@pytest.mark.parametrize("step", ["load_leaves", "run_trials", "_make_read_only"])
def test_a_reference_cut_short_leaves_no_child_or_folder(
        mlp_task: Task, fast_config: EvalConfig, monkeypatch: pytest.MonkeyPatch,
        step: str) -> None:
    from pike.evaluate import reference_cache, reference_start

    folders: list[Path] = []

    def recorded(kind: str) -> Path:
        folders.append(make_temp_dir(kind))
        return folders[-1]

    def unreadable(*args: object, **kwargs: object) -> None:
        raise OSError("No space left on device")

    launched: list[int] = []
    launch = reference_start.launch_child

    def recorded_launch(*args: object, **kwargs: object) -> object:
        child = launch(*args, **kwargs)
        launched.append(child.proc.pid)
        return child

    monkeypatch.setattr(reference_start, "make_temp_dir", recorded)
    monkeypatch.setattr(reference_start, step, unreadable)
    monkeypatch.setattr(reference_start, "launch_child", recorded_launch)
    with pytest.raises(OSError, match="No space left"):
        reference_cache.run_reference(mlp_task, fast_config, "cpu", keep_child=True, cache=False)
    assert folders and not any(f.exists() for f in folders)
    # its own child (other tests' kept children may share this process)
    assert len(launched) == 1
    deadline = time.monotonic() + 10
    while psutil.pid_exists(launched[0]) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not psutil.pid_exists(launched[0]) or psutil.Process(launched[0]).status() == \
        psutil.STATUS_ZOMBIE


_SLOW_CLEANUP = """
import sys, time
from pathlib import Path
from pike.evaluate.leftovers import at_exit_uninterrupted
marks = Path(sys.argv[1])

def cleanup(folder):  # as a large task's inputs take seconds to remove
    (marks / "began").write_text("")
    time.sleep(1.5)
    (marks / folder).write_text("")

at_exit_uninterrupted(cleanup, "done")
"""


def test_ctrl_c_during_the_exit_cleanup_neither_stops_it_nor_prints_a_traceback(
        tmp_path: Path) -> None:
    """A time limit's SIGINT that comes after pike stopped on its own, while its atexit
    handlers remove the references' folders (seen on the H200 level2 bench)."""
    proc = subprocess.Popen([sys.executable, "-c", _SLOW_CLEANUP, str(tmp_path)],
                            stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not (tmp_path / "began").exists():
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.02)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert (tmp_path / "done").exists()
    assert "KeyboardInterrupt" not in err and "Traceback" not in err
    assert proc.returncode == 0


_FORKS = '''import os
import time

import torch.nn as nn
import torch.nn.functional as F


class ModelNew(nn.Module):
    """Forks children that only sleep (a fork bomb's first generations, bounded)."""

    def __init__(self, dim, hidden):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(dim, hidden), nn.Linear(hidden, dim)
        for _ in range(COUNT):
FORK
        time.sleep(20)  # long enough for the parent's walk of the tree to see them

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x), approximate="tanh"))
'''


_SINGLE_FORKS = _FORKS.replace("FORK\n", """\
            if os.fork() == 0:
                time.sleep(120)
                os._exit(0)
""")
# each fork forks again and exits: the sleepers are orphans, which leave the tree unless
# something in it takes them (the sandbox's init; without it, the runner as subreaper)
_DOUBLE_FORKS = _FORKS.replace("FORK\n", """\
            first = os.fork()
            if first == 0:
                if os.fork() == 0:
                    time.sleep(120)
                os._exit(0)
            os.waitpid(first, 0)
""")


@pytest.mark.parametrize("sandbox", ["auto", "off"])
@pytest.mark.parametrize("source", [_SINGLE_FORKS, _DOUBLE_FORKS], ids=["forks", "double_forks"])
def test_a_candidate_starting_too_many_processes_is_ended_and_leaves_none(
        mlp_task: Task, build_cache: Path, monkeypatch: pytest.MonkeyPatch,
        sandbox: str, source: str) -> None:
    from pike.evaluate import child_ends
    monkeypatch.setattr(child_ends, "MAX_PROCESSES", 24)  # 40 forks: a small bomb
    cfg = EvalConfig(device="cpu", trials=2, build_cache=build_cache, sandbox=sandbox,
                     timing=TimingConfig(**FAST_TIMING))
    before = {p.pid for p in psutil.process_iter()}
    started = time.monotonic()
    verdict = evaluate(mlp_task, source.replace("COUNT", "40"), cfg)
    assert verdict.status == "rejected", verdict.message
    assert re.search(r"started \d+ processes, over the limit of 24", verdict.message or "")
    assert time.monotonic() - started < 20  # ended on sight, not at the phase's limit
    time.sleep(1)
    # the forks: runners whose parent is a runner (the next evaluation's spare child is
    # a runner too, under pike or its bwrap), among this process's own: another test
    # file's evaluation beside it (xdist) has its own, and a reference there sizing its
    # task forks a runner for it (task_size) that a CI run took for a sleeper here
    runners = {p.pid: p for p in psutil.Process().children(recursive=True)
               if p.pid not in before and _cmdline(p)[1:3] == ["-m", "pike.evaluate.runner"]}
    sleepers = [pid for pid, p in runners.items() if p.ppid() in runners]
    assert not sleepers, sleepers


def test_the_process_limit_grows_with_a_child_s_compile_workers() -> None:
    from pike.evaluate import child_ends
    base = child_ends.MAX_PROCESSES
    assert base >= 512
    assert child_ends.process_limit({}) == base
    assert child_ends.process_limit({"TORCHINDUCTOR_COMPILE_THREADS": "1"}) == base
    # 256 workers on a host of few cores: each with room for a compiler's processes
    assert child_ends.process_limit({"TORCHINDUCTOR_COMPILE_THREADS": "256"}) == base + 1020
    assert child_ends.process_limit({"TORCHINDUCTOR_COMPILE_THREADS": "x"}) == base


def test_a_task_starting_too_many_processes_fails_as_the_task_s_own(
        tmp_path: Path, build_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from pike.errors import TaskError
    from pike.evaluate import child_ends
    monkeypatch.setattr(child_ends, "MAX_PROCESSES", 24)
    path = tmp_path / "1_ForksInInit.py"
    path.write_text(_SINGLE_FORKS.replace("class ModelNew(", "class Model(").replace("COUNT", "40")
                    + "\n\ndef get_inputs():\n    import torch\n    return [torch.randn(4, 8)]"
                    "\n\n\ndef get_init_inputs():\n    return [8, 16]\n")
    cfg = EvalConfig(device="cpu", trials=2, build_cache=build_cache,
                     timing=TimingConfig(**FAST_TIMING))
    with pytest.raises(TaskError, match=r"the task's code started \d+ processes"):
        evaluate(Task.from_file(path), candidate("fused"), cfg)
