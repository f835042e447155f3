"""Children launched ahead of their candidates: a launched child runs nothing of a
candidate's until it begins, a pool's spare serves only evaluations with its settings and
each verdict stays its own candidate's, and none outlives its pool or a failed reference."""

from __future__ import annotations

import os
import time
from pathlib import Path

import psutil
import pytest

from pike.config import EvalConfig
from pike.errors import TaskError
from pike.evaluate import evaluate, spares
from pike.evaluate.candidate_child import _launch_candidate, _spare_key
from pike.evaluate.driver import finish
from pike.evaluate.pool import LocalPool
from pike.task import Task
from tests.conftest import candidate


def _runners() -> set[int]:
    found = set()
    for p in psutil.Process(os.getpid()).children(recursive=True):
        try:
            if p.cmdline()[1:3] == ["-m", "pike.evaluate.runner"]:
                found.add(p.pid)
        except psutil.Error:
            pass
    return found


def _gone(pids: set[int], timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not pids & _runners():
            return True
        time.sleep(0.1)
    return False


def test_a_launched_child_waits_for_its_request_and_dies_unbegun(
        fast_config: EvalConfig) -> None:
    launched = _launch_candidate(fast_config, "cpu")
    try:
        time.sleep(4.0)  # long enough for its imports
        assert launched.child.alive()
        assert not (launched.files.work_dir / "request.json").exists()
        assert not launched.files.source_path.exists()
        pid = launched.child.proc.pid
    finally:
        finish(launched.child)
    assert launched.child.proc is None and _gone({pid})


def test_a_pools_spare_takes_the_next_candidate_and_goes_with_the_pool(
        mlp_task: Task, fast_config: EvalConfig) -> None:
    before = _runners()
    key = _spare_key(fast_config, "cpu")
    pool = LocalPool(fast_config, workers=1)
    try:
        assert pool.judge(mlp_task, candidate("fused")).status == "ok"
        waiting = spares._spares.get(key, [])
        assert len(waiting) == 1  # launched as the evaluation ended
        spare_pid = waiting[0].child.proc.pid
        time.sleep(1.0)
        # each candidate gets its own verdict, the first from the spare's child
        assert pool.judge(mlp_task, candidate("wrong_values")).status == "incorrect"
        assert spare_pid not in _runners() or _gone({spare_pid})
        assert pool.judge(mlp_task, candidate("fused")).status == "ok"
        assert len(spares._spares.get(key, [])) == 1
    finally:
        pool.close()
    assert spares._spares == {}
    assert _gone(_runners() - before - _cached_references())


def _cached_references() -> set[int]:
    from pike.evaluate.reference_cache import _references

    pids = set()
    for run in _references.values():
        if run.child is not None and run.child.proc is not None:
            pids.add(run.child.proc.pid)  # in the OS sandbox: bwrap, the runner below it
            try:
                pids |= {p.pid for p in psutil.Process(run.child.proc.pid).children(True)}
            except psutil.Error:
                pass
    return pids


def test_a_spare_serves_only_its_own_settings(fast_config: EvalConfig) -> None:
    other = fast_config.model_copy(update={"trials": fast_config.trials + 1})
    spares.want(1)
    try:
        spares.replenish(_spare_key(fast_config, "cpu"),
                         lambda: _launch_candidate(fast_config, "cpu"))
        assert spares.take(_spare_key(other, "cpu")) is None
        launched = spares.take(_spare_key(fast_config, "cpu"))
        assert launched is not None
        assert launched.files.request.trials == fast_config.trials
        finish(launched.child)
    finally:
        spares.want(-1)
    assert spares._spares == {}


def test_a_failing_reference_leaves_no_launched_child(
        tmp_path: Path, fast_config: EvalConfig) -> None:
    broken = tmp_path / "broken.py"
    broken.write_text(
        "import torch\n\n"
        "class Model(torch.nn.Module):\n"
        "    def forward(self, x):\n"
        "        raise RuntimeError('the reference itself is broken')\n\n"
        "def get_inputs():\n    return [torch.randn(4)]\n\n"
        "def get_init_inputs():\n    return []\n")
    before = _runners()
    with pytest.raises(TaskError, match="broken"):
        evaluate(Task.from_file(broken), candidate("fused"), fast_config)
    assert _gone(_runners() - before)


def test_a_childs_build_folder_is_named_as_the_child_sees_it(
        mlp_task: Task, fast_config: EvalConfig) -> None:
    """Filled before its launch (a confirming window's candidates) or after (a spare), the
    build folder in the request is the child's view of the shared cache: in the OS sandbox
    a host path there would be outside every folder it may write to."""
    from pike.evaluate.candidate_files import candidate_folders, fill_candidate
    from pike.evaluate.child_launch import build_cache_root, launch_child
    from pike.evaluate.leftovers import make_temp_dir, remove_tree

    host = str(build_cache_root(fast_config) / "x")
    for before_launch in (True, False):
        folder = make_temp_dir("cand")
        try:
            files = candidate_folders(fast_config, "cpu", folder)
            if before_launch:
                fill_candidate(files, mlp_task, candidate("fused"), fast_config)
            child = launch_child(files.request, files.work_dir, fast_config, "x")
            if not before_launch:
                fill_candidate(files, mlp_task, candidate("fused"), fast_config, child.see)
            seen = files.request.extensions_dir
            assert seen.endswith("/" + files.build_key)
            if child.sandboxed:
                assert seen.startswith("/pike/") and not seen.startswith(host[:-1])
            else:
                assert seen == os.path.realpath(files.request.extensions_dir)
            finish(child)
        finally:
            remove_tree(folder)


def test_a_retired_pool_keeps_no_spare_and_launches_none(
        mlp_task: Task, fast_config: EvalConfig) -> None:
    key = _spare_key(fast_config, "cpu")
    pool = LocalPool(fast_config, workers=1)
    try:
        assert pool.judge(mlp_task, candidate("fused")).status == "ok"
        waiting = spares._spares.get(key, [])
        assert len(waiting) == 1
        spare_pid = waiting[0].child.proc.pid
        pool.retire_spares()  # its search sends nothing more
        assert spares._spares == {} and _gone({spare_pid})
        # a candidate still sent is judged in a child of its own, and none follows it
        assert pool.judge(mlp_task, candidate("wrong_values")).status == "incorrect"
        assert spares._spares == {}
    finally:
        pool.close()


def test_a_search_on_its_own_pool_retires_its_spares_before_its_confirming_window(
        mlp_task: Task, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from pike.config import RunConfig
    from pike.evaluate.verdict import TimingStats, Verdict
    from pike.search import session
    from pike.store import RunStore

    said: list[str] = []

    class Pool:
        width = 1

        def judge_many(self, task: Task, sources: list[str]) -> object:
            stats = TimingStats.from_samples([1.0])
            for i, _ in enumerate(sources):
                said.append("judged")
                yield i, Verdict(status="ok", runtime=stats, reference=stats, speedup=1.5)

        def retire_spares(self) -> None:
            said.append("retired")

        def close(self) -> None:
            said.append("closed")

    monkeypatch.setattr(session, "make_pool", lambda cfg: Pool())
    monkeypatch.setattr(session, "confirm_best", lambda *args: said.append("confirmed"))
    task = mlp_task
    cfg = RunConfig.model_validate({"search": {"offline": {"max_candidates": 2}}})
    store = RunStore.create(tmp_path / "run", {}, "test")
    store.add_task(task.name, str(task.path), task.sha256, task.source)
    try:
        session.search_task(store, task, cfg, None, lambda kind, **data: None)
    finally:
        store.close()
    assert said[-3:] == ["retired", "confirmed", "closed"], said
    assert said.count("judged") == 2
