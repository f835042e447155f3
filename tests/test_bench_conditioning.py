"""bench/conditioning.py: a task whose outputs a part in a million moves past the tolerance."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import EXAMPLES, bench_script


def test_a_sum_that_cancels_is_ill_conditioned_and_the_mlp_is_not(tmp_path: Path) -> None:
    conditioning = bench_script("conditioning")
    # a sum of terms near 1e4 less what they were shifted by: float32's rounding of the
    # terms (about 1e-3 each) adds up past the tolerance in every row, as level3-pike 24's
    # chained two-sample batch norms do by another road
    task = tmp_path / "7_ShiftedSum.py"
    task.write_text("""import torch
import torch.nn as nn

class Model(nn.Module):
    def forward(self, x):
        return (x + 1e4).sum(-1) - 1e4 * x.shape[-1]

def get_inputs():
    return [torch.randn(64, 4096)]

def get_init_inputs():
    return []
""")
    ill = conditioning._row(task)
    assert ill["ill_conditioned"] and ill["vs_float64_share"] > 0.5, ill
    mlp = conditioning._row(EXAMPLES / "tasks" / "1_GeluMLP.py")
    assert not mlp["ill_conditioned"] and mlp["vs_float64_worst"] < 0.01, mlp
    assert not mlp["same_on_another_draw"] and not ill["same_on_another_draw"]
