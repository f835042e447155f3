"""The evaluation pool on a CUDA device: a mixed batch judged at once gets the verdicts
one-at-a-time evaluation gives, with builds and warm-up calls overlapping other
candidates' timing.

Run on the GPU machine with `pytest -m gpu`; skipped where CUDA is absent.
"""

from __future__ import annotations

import pytest

from pike.config import EvalConfig
from pike.evaluate.pool import LocalPool
from pike.task import Task
from tests.conftest import candidate

pytestmark = pytest.mark.gpu

MIX = {"fused": "ok", "cuda_gelu": "ok", "triton_gelu": "ok", "wrong_values": "incorrect",
       "forward_raises": "runtime_error", "cpp_compile_error": "compile_error"}


def test_a_mixed_batch_gets_each_candidates_own_verdict(mlp_task: Task,
                                                        fast_config: EvalConfig) -> None:
    cfg = fast_config.model_copy(update={"device": "cuda"})
    cfg.limits.memory_gib = 16
    names = list(MIX)
    # a marker per file, so each extension really builds in this batch
    sources = [candidate(n) + f"\n# pool gpu test {i}\n" for i, n in enumerate(names)]
    with LocalPool(cfg, workers=4) as pool:
        got = dict(pool.judge_many(mlp_task, sources))
    assert sorted(got) == list(range(len(names)))
    for i, name in enumerate(names):
        verdict = got[i]
        assert verdict.status == MIX[name], f"{name}: {verdict.message}"
        if verdict.ok:
            # timed either way; beside other work on the host (the GPU suite runs beside
            # an audit) the reference's own median may stray from its usual one, and the
            # figure is then held back as noisy rather than given
            assert verdict.device == "cuda:0"
            assert verdict.speedup or (verdict.noisy and verdict.noisy_speedup), name
            assert verdict.runtime and verdict.runtime.median_ms > 0


def test_a_pool_on_the_gpu_keeps_a_spare_child_for_its_next_candidate(
        mlp_task: Task, fast_config: EvalConfig) -> None:
    from pike.evaluate import spares
    from pike.evaluate.candidate_child import _spare_key

    cfg = fast_config.model_copy(update={"device": "cuda"})
    key = _spare_key(cfg, "cuda:0")
    with LocalPool(cfg, workers=1) as pool:
        assert pool.judge(mlp_task, candidate("fused")).status == "ok"
        assert len(spares._spares.get(key, [])) == 1  # launched as the candidate began
        spare = spares._spares[key][0]
        assert pool.judge(mlp_task, candidate("wrong_values")).status == "incorrect"
        assert spare not in spares._spares.get(key, [])  # taken by that candidate
    assert spares._spares == {}


_BUSY_ON_THE_GPU = """
import sys, time, torch
x = torch.randn(2048, 2048, device="cuda")
done = 0
while True:
    for _ in range(5):
        x = torch.tanh(x @ x)
    torch.cuda.synchronize()
    done += 1
    with open(sys.argv[1], "w") as f:
        f.write(str(done))
"""


def test_a_timer_stops_a_neighbour_busy_on_the_gpu_and_it_goes_on_after(tmp_path, monkeypatch):
    """A listed process launching CUDA work in a loop makes no progress while a timer holds
    the device, and goes on, without a CUDA error, once the window ends."""
    import subprocess
    import sys
    import time

    import psutil

    from pike.evaluate import device_lock

    monkeypatch.setenv("PIKE_LOCK_DIR", str(tmp_path / "locks"))
    counter = tmp_path / "done"
    busy = subprocess.Popen([sys.executable, "-c", _BUSY_ON_THE_GPU, str(counter)],
                            stderr=subprocess.PIPE, text=True)

    def progress() -> int:
        # a read may land between the writer's truncate and its write: read again
        for _ in range(200):
            try:
                return int(counter.read_text())
            except (OSError, ValueError):
                time.sleep(0.005)
        return 0

    def state() -> str:
        # stopped again after the window: by whom? (another thread's timer, in this test's
        # lock folder, would hold the device now)
        timed = f"a timer holds the device: {device_lock.timed_now('cuda:0')}"
        try:
            return f"the busy process is {psutil.Process(busy.pid).status()}; {timed}"
        except psutil.Error as err:
            return f"the busy process: {err}; {timed}"

    try:
        deadline = time.monotonic() + 60
        while progress() < 3 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert progress() >= 3, "the busy process did not start its GPU work"
        assert device_lock.list_child("cuda:0", busy.pid, "pause_others")
        with device_lock.hold("cuda:0", exclusive=True):
            time.sleep(0.3)  # a pass it had begun ends and is written
            at_start = progress()
            time.sleep(2.0)
            assert progress() == at_start  # no GPU work of its own during the window
            assert device_lock.stopped(busy.pid)
        after = progress()
        time.sleep(2.0)
        assert busy.poll() is None
        assert progress() > after, state()
    finally:
        busy.kill()
        _, err = busy.communicate()
    assert "Error" not in err, err[-2000:]


def test_candidates_waiting_at_once_share_a_window_on_the_gpu(
        mlp_task: Task, fast_config: EvalConfig, monkeypatch: pytest.MonkeyPatch) -> None:
    """The window's leader takes the device (the real lock, its `keep` asked once held,
    each candidate stopped while the others are timed) only once three candidates of the
    task wait for it: they are timed in one window, each with its own verdict."""
    import threading
    from contextlib import contextmanager

    from pike.evaluate import reference_cache, shared_window
    from pike.evaluate.shared_window import WindowQueue

    joined = threading.Semaphore(0)
    real_join, real_hold = WindowQueue.join, shared_window.hold

    def join(self: WindowQueue, child: object, most: int) -> object:
        found = real_join(self, child, most)  # type: ignore[arg-type]
        joined.release()
        return found

    @contextmanager
    def hold(device: str, **kwargs: object):  # type: ignore[no-untyped-def]
        for _ in range(3):
            assert joined.acquire(timeout=300)
        with real_hold(device, **kwargs):  # type: ignore[arg-type]
            yield

    monkeypatch.setattr(WindowQueue, "join", join)
    monkeypatch.setattr(shared_window, "hold", hold)
    cfg = fast_config.model_copy(update={"device": "cuda"})
    cfg.limits.memory_gib = 16
    reference_cache.close_references()
    with LocalPool(cfg, workers=3) as pool:
        got = dict(pool.judge_many(mlp_task, [candidate(n) for n in
                                              ("fused", "slower", "counts_calls")]))
    fused, slower, cheat = (got[i] for i in range(3))
    assert fused.ok and slower.ok, (fused.message, slower.message)
    assert fused.window_candidates == slower.window_candidates == 3
    assert not cheat.ok
