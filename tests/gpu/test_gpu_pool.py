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
            assert verdict.device == "cuda:0" and verdict.speedup
            assert verdict.runtime and verdict.runtime.median_ms > 0


def test_a_pool_on_the_gpu_keeps_a_spare_child_for_its_next_candidate(
        mlp_task: Task, fast_config: EvalConfig) -> None:
    from pike.evaluate import spares
    from pike.evaluate.judge import _spare_key

    cfg = fast_config.model_copy(update={"device": "cuda"})
    key = _spare_key(cfg, "cuda:0")
    with LocalPool(cfg, workers=1) as pool:
        assert pool.judge(mlp_task, candidate("fused")).status == "ok"
        assert len(spares._spares.get(key, [])) == 1  # launched as the candidate began
        spare = spares._spares[key][0]
        assert pool.judge(mlp_task, candidate("wrong_values")).status == "incorrect"
        assert spare not in spares._spares.get(key, [])  # taken by that candidate
    assert spares._spares == {}
