"""The Ray backend on a local CPU-only Ray: the local pool's verdicts, a lost actor's
candidate queued once more, the task's own errors raised as themselves."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import closing, contextmanager
from pathlib import Path

import pytest
import torch

ray = pytest.importorskip("ray")

from pike.config import EvalConfig, LimitsConfig, TimingConfig  # noqa: E402
from pike.errors import EvaluatorError, TaskError  # noqa: E402
from pike.evaluate.pool import LocalPool, make_pool  # noqa: E402
from pike.evaluate.ray_pool import RayPool, TaskFile  # noqa: E402
from pike.task import Task  # noqa: E402
from tests.conftest import candidate  # noqa: E402
from tests.fake_openai import FakeOpenAI  # noqa: E402

GOOD, WRONG, RAISES = candidate("fused"), candidate("wrong_values"), candidate("forward_raises")
# Correct, and long enough in its constructor for an actor to be killed mid-evaluation.
SLOW = GOOD.replace("super().__init__()", "super().__init__()\n        import time\n"
                    "        time.sleep(3)")


@contextmanager
def process_state_kept() -> Iterator[None]:
    """Put back what ray.init changes in this process: environment variables (RAY_*,
    PYTHONBREAKPOINT) and SIGTERM's handler."""
    environ, sigterm = dict(os.environ), signal.getsignal(signal.SIGTERM)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(environ)
        signal.signal(signal.SIGTERM, sigterm)


@contextmanager
def local_ray(num_cpus: int = 2, num_gpus: int = 0) -> Iterator[None]:
    """A local Ray for the duration: 2 CPUs, as CI has; GPUs only as Ray counts them."""
    with process_state_kept():
        ray.init(num_cpus=num_cpus, num_gpus=num_gpus, include_dashboard=False,
                 log_to_driver=False, object_store_memory=200 * 1024**2)
        try:
            yield
        finally:
            ray.shutdown()


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[None]:
    """Two CPUs and one GPU as Ray counts it: a config with device 'cpu' gets CPU actors,
    one that leaves the device open a GPU actor (which fails to start without CUDA)."""
    with local_ray(num_gpus=1):
        yield


@pytest.fixture(scope="module")
def ray_config(build_cache: Path) -> EvalConfig:
    """conftest's fast_config for two CPU actors, with a fixed seed: the tests compare the
    Ray pool's messages with the local pool's, whose numbers match only on the same inputs."""
    return EvalConfig(
        device="cpu", trials=3, workers=2, cluster="ray", seed=42,
        timing=TimingConfig(warmup_calls=2, warmup_seconds=0.0, min_calls=5, min_seconds=0.05),
        limits=LimitsConfig(load_seconds=240, check_seconds=20, timing_seconds=60, memory_gib=2),
        build_cache=build_cache,
    )


def kill_busy_actors(pool: RayPool, times: int, killed: list[str]) -> threading.Thread:
    """From a thread: `times` times, wait for an actor to be evaluating, give it a second
    to be well inside the evaluation, and kill it."""

    def run() -> None:
        for _ in range(times):
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                busy = [lane for lane in list(pool._lanes)
                        if lane.running and lane.where not in killed]
                if busy:
                    break
                time.sleep(0.05)
            else:
                return
            time.sleep(1.0)
            killed.append(busy[0].where)
            ray.kill(busy[0].actor)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


# ---- without a cluster --------------------------------------------------------------------


def test_importing_pike_does_not_import_ray() -> None:
    code = ("import sys, pike, pike.cli, pike.evaluate.pool; "
            "assert 'ray' not in sys.modules, 'ray imported'")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_a_task_copy_keeps_its_name_and_is_checked_against_its_sha(mlp_task: Task,
                                                                   tmp_path: Path) -> None:
    sent = TaskFile.of(mlp_task)
    copy = sent.write(tmp_path)
    assert copy.path.name == mlp_task.path.name and copy.path != mlp_task.path
    assert (copy.name, copy.source, copy.sha256) == (mlp_task.name, mlp_task.source,
                                                     mlp_task.sha256)
    changed = TaskFile(sent.file_name, sent.name, sent.source + "\n# changed\n", sent.sha256)
    with pytest.raises(EvaluatorError, match="differs from the source sent"):
        changed.write(tmp_path / "other")


# ---- on a local Ray -----------------------------------------------------------------------


def test_make_pool_starts_a_ray_for_cluster_ray_and_stops_it(ray_config: EvalConfig) -> None:
    assert not ray.is_initialized()  # before the module's cluster starts
    with process_state_kept(), closing(make_pool(ray_config.model_copy(
            update={"workers": 1}))) as made:
        assert isinstance(made, RayPool) and len(made._lanes) == 1 and ray.is_initialized()
    assert not ray.is_initialized()


@pytest.fixture(scope="class")
def pool(ray_cluster: None, ray_config: EvalConfig) -> Iterator[RayPool]:
    with RayPool(ray_config) as shared:
        yield shared


class TestTwoActors:
    """One pool for these tests: its two CPU actors take the cluster's two CPUs."""

    def test_the_local_pools_verdicts(self, pool: RayPool, ray_config: EvalConfig,
                                      mlp_task: Task) -> None:
        sources = [GOOD, WRONG, RAISES]
        got = list(pool.judge_many(mlp_task, sources))
        assert sorted(i for i, _ in got) == [0, 1, 2]
        with LocalPool(ray_config.model_copy(update={"cluster": "local"})) as local:
            expected = dict(local.judge_many(mlp_task, sources))
        verdicts = dict(got)
        for i in range(3):
            assert (verdicts[i].status, verdicts[i].phase) == (
                expected[i].status, expected[i].phase), verdicts[i].message
        assert [verdicts[i].status for i in range(3)] == ["ok", "incorrect", "runtime_error"]
        assert verdicts[0].speedup and verdicts[0].runtime and verdicts[0].device == "cpu"
        assert verdicts[1].message == expected[1].message  # same check, same numbers
        assert pool.judge(mlp_task, WRONG).status == "incorrect"

    def test_a_broken_reference_raises_task_error(self, pool: RayPool, mlp_task: Task,
                                                  tmp_path: Path) -> None:
        path = tmp_path / "7_Broken.py"
        path.write_text(mlp_task.source.replace(
            "def forward(self, x):", "def forward(self, x):\n        raise ValueError('no')"))
        with pytest.raises(TaskError) as caught:
            pool.judge(Task.from_file(path), GOOD)
        assert type(caught.value) is TaskError  # not Ray's wrapper around it
        assert "7_Broken.py: reference failed" in str(caught.value)

    def test_a_killed_actors_candidate_is_judged_on_another(
            self, pool: RayPool, mlp_task: Task, caplog: pytest.LogCaptureFixture) -> None:
        killed: list[str] = []
        caplog.set_level(logging.WARNING, logger="pike.evaluate.ray_pool")
        killer = kill_busy_actors(pool, 1, killed)
        got = list(pool.judge_many(mlp_task, [SLOW, GOOD, WRONG]))
        killer.join(timeout=5)
        assert len(killed) == 1
        assert Counter(i for i, _ in got) == {0: 1, 1: 1, 2: 1}
        assert {i: v.status for i, v in got} == {0: "ok", 1: "ok", 2: "incorrect"}
        assert "queued once more" in caplog.text
        assert len(pool._lanes) == 2 and killed[0] not in {lane.where for lane in pool._lanes}

    def test_a_candidate_lost_twice_is_crashed(self, pool: RayPool, mlp_task: Task) -> None:
        killed: list[str] = []
        killer = kill_busy_actors(pool, 2, killed)
        got = list(pool.judge_many(mlp_task, [SLOW]))
        killer.join(timeout=5)
        assert len(killed) == 2
        assert [i for i, _ in got] == [0]
        verdict = got[0][1]
        assert verdict.status == "crashed"
        assert "the evaluation was lost twice" in verdict.message
        assert verdict.message.count("ActorDiedError") == 2
        assert pool.judge(mlp_task, GOOD).ok  # the actors started in their place take it


def test_optimize_with_a_ray_pool_end_to_end(ray_cluster: None, fake_llm: FakeOpenAI,
                                             run_config: Path, tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.test_pool import check_pool_end_to_end, pool_config

    check_pool_end_to_end(fake_llm, pool_config(run_config, workers=2, cluster="ray"),
                          tmp_path / "run", monkeypatch)
    assert ray.is_initialized()  # the run's pool left the Ray it did not start running


@pytest.mark.skipif(torch.cuda.is_available(), reason="the GPU actor starts where CUDA is")
def test_an_actor_that_cannot_start_is_a_clear_error(ray_cluster: None,
                                                     ray_config: EvalConfig) -> None:
    with pytest.raises(EvaluatorError, match="no evaluation actor could start") as caught:
        RayPool(ray_config.model_copy(update={"device": None}))  # a GPU actor, no CUDA here
    assert "CUDA is not available" in str(caught.value)


@pytest.mark.gpu
def test_a_gpu_actor_judges_on_the_gpu_ray_gave_it(ray_cluster: None, ray_config: EvalConfig,
                                                   mlp_task: Task) -> None:
    with RayPool(ray_config.model_copy(update={"device": None})) as on_gpu:
        assert len(on_gpu._lanes) == 1  # the cluster counts one GPU
        verdicts = dict(on_gpu.judge_many(mlp_task, [GOOD, WRONG]))
    assert verdicts[0].ok, verdicts[0].message
    assert verdicts[0].device == "cuda:0" and verdicts[0].device_name and verdicts[0].speedup
    assert verdicts[1].status == "incorrect"
