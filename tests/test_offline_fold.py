"""The offline fold of a sum over a linear layer's output features into a product with the
summed weights: where it applies, what it leaves alone, and that it stays within tolerance."""

from __future__ import annotations

import operator
from pathlib import Path
from typing import Any

import pytest
import torch

from pike.agents.offline import applicable, render, sums_a_linear
from pike.config import EvalConfig
from pike.evaluate import evaluate
from pike.task import Task

# KernelBench level 2's form (14_Gemm_Divide_Sum_Scaling), small
GEMM_SUM = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, input_size, hidden_size, scaling_factor):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(hidden_size, input_size))
        self.scaling_factor = scaling_factor

    def forward(self, x):
        x = torch.matmul(x, self.weight.T)
        x = x / 2
        x = torch.sum(x, dim=1, keepdim=True)
        x = x * self.scaling_factor
        return x


def get_inputs():
    return [torch.rand(16, 64)]


def get_init_inputs():
    return [64, 96, 1.5]
"""

# nn.Linear with a bias, scaled before a method-form sum over the last dimension
LINEAR_SUM = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, features, out):
        super().__init__()
        self.linear = nn.Linear(features, out)

    def forward(self, x):
        y = self.linear(x)
        y = 2.0 * y
        return torch.tanh(y.sum(DIM))


def get_inputs():
    return [torch.randn(8, 32)]


def get_init_inputs():
    return [32, 48]
"""


def _task(tmp_path: Path, source: str, name: str = "1_T") -> Task:
    path = tmp_path / f"{name}.py"
    path.write_text(source)
    return Task.from_file(path)


def _built(task: Task, names: tuple[str, ...] = ("fold_linear_sum",)) -> tuple[Any, Any]:
    ns: dict[str, Any] = {"__name__": "pike_offline_test"}
    exec(compile(render(task.source, names), "offline.py", "exec"), ns)
    init = ns["get_init_inputs"]()
    torch.manual_seed(0)
    reference = ns["Model"](*init)
    torch.manual_seed(0)
    return reference, ns["ModelNew"](*init)


@pytest.mark.parametrize(("source", "shapes"), [
    (GEMM_SUM, [(16, 64), (5, 64)]),
    (LINEAR_SUM.replace("DIM", "-1"), [(8, 32), (3, 8, 32)]),  # any leading dimensions
    (LINEAR_SUM.replace("DIM", "dim=1"), [(8, 32)]),
])
def test_a_sum_over_a_linear_layers_outputs_is_folded_and_stays_close(
        tmp_path: Path, source: str, shapes: list[tuple[int, ...]]) -> None:
    task = _task(tmp_path, source)
    assert sums_a_linear(task.source)
    reference, candidate = _built(task)
    assert candidate.sums_folded == 1
    assert not [n for n in candidate.inner.graph.nodes  # no matrix product, no layer left
                if n.op == "call_module" or n.target in (torch.matmul, operator.matmul)]
    for shape in shapes:
        x = torch.rand(*shape)
        torch.testing.assert_close(candidate(x), reference(x), atol=1e-4, rtol=1e-4)


def test_a_sum_that_is_not_over_the_last_dimension_at_a_call_runs_as_written(
        tmp_path: Path) -> None:
    task = _task(tmp_path, LINEAR_SUM.replace("DIM", "1"))
    reference, candidate = _built(task)
    assert candidate.sums_folded == 1  # dim 1 is the features' for 2-D inputs only
    x = torch.randn(3, 5, 32)  # here it is not: summed as written, over dimension 1
    torch.testing.assert_close(candidate(x), reference(x), atol=1e-5, rtol=1e-5)
    assert candidate(x).shape == (3, 48)


@pytest.mark.parametrize("change", [
    {"y = 2.0 * y": "y = torch.sigmoid(y)"},  # a nonlinearity between: no linear sum
    {"y = 2.0 * y": "y = y + 1.0"},  # a shift is not a scaling (kept exact: left alone)
    {"return torch.tanh(y.sum(DIM))": "return torch.tanh(y.sum(-1)) + y.mean()"},  # used twice
    {"y.sum(DIM)": "y.sum(-1, dtype=torch.float64).float()"},  # a sum in another dtype
    {"y.sum(DIM)": "y.sum()"},  # over everything
])
def test_anything_else_is_left_as_written(tmp_path: Path, change: dict[str, str]) -> None:
    source = LINEAR_SUM
    for old, new in change.items():
        source = source.replace(old, new)
    task = _task(tmp_path, source.replace("DIM", "-1"))
    reference, candidate = _built(task)
    assert candidate.sums_folded == 0 and candidate.inner is not None
    x = torch.randn(4, 32)
    torch.testing.assert_close(candidate(x), reference(x), atol=0, rtol=0)


def test_it_is_tried_only_where_the_source_sums_a_linear_output_and_first_on_a_gpu(
        tmp_path: Path) -> None:
    assert applicable(GEMM_SUM, "cuda:0")[0] == "fold_linear_sum"
    assert "fold_linear_sum" in applicable(GEMM_SUM, "cpu")
    sigmoid = LINEAR_SUM.replace("y = 2.0 * y", "y = torch.sigmoid(y)").replace("DIM", "-1")
    assert not sums_a_linear(sigmoid)
    assert "fold_linear_sum" not in applicable(sigmoid, "cuda:0")
    no_linear = "import torch\n\n\nclass Model(torch.nn.Module):\n    def forward(self, x):\n" \
                "        return torch.sum(torch.relu(x), dim=1)\n"
    assert not sums_a_linear(no_linear) and not sums_a_linear("def broken(:\n")


def test_it_composes_with_the_other_transformations(tmp_path: Path) -> None:
    task = _task(tmp_path, GEMM_SUM)
    reference, candidate = _built(task, ("fold_linear_sum", "inference_mode", "sdpa"))
    assert candidate.sums_folded == 1 and candidate.attentions_rewritten == 0
    x = torch.rand(16, 64)
    torch.testing.assert_close(candidate(x), reference(x), atol=1e-4, rtol=1e-4)


def test_the_folded_candidate_passes_the_evaluator(tmp_path: Path,
                                                    fast_config: EvalConfig) -> None:
    task = _task(tmp_path, GEMM_SUM)
    verdict = evaluate(task, render(task.source, ("fold_linear_sum",)), fast_config)
    assert verdict.status == "ok", verdict.message


def test_the_fold_runs_where_the_linear_layer_did_so_later_in_place_changes_do_not_reach_it(
        tmp_path: Path) -> None:
    source = LINEAR_SUM.replace("        return torch.tanh(y.sum(DIM))",
                                "        x.relu_()\n        return y.sum(-1) + x.sum(-1)")
    reference, candidate = _built(_task(tmp_path, source))
    assert candidate.sums_folded == 1
    x = torch.randn(4, 32)
    torch.testing.assert_close(candidate(x.clone()), reference(x.clone()), atol=1e-4,
                               rtol=1e-4)


# the parameter on the left, a 1-D input, integers: folded or run as written, never wrong
LEFT_PRODUCT = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(24, 16), requires_grad=False)

    def forward(self, x):
        return torch.sum(torch.matmul(self.w, x) * 3 / -2, dim=-1)


def get_inputs():
    return [torch.randn(16, 8)]


def get_init_inputs():
    return []
"""


@pytest.mark.parametrize("x", [torch.randn(16, 8), torch.randn(16)], ids=["2-D", "1-D"])
def test_a_parameter_times_the_input_folds_too(tmp_path: Path, x: torch.Tensor) -> None:
    reference, candidate = _built(_task(tmp_path, LEFT_PRODUCT))
    assert candidate.sums_folded == 1
    torch.testing.assert_close(candidate(x), reference(x), atol=1e-4, rtol=1e-4)


def test_integer_tensors_run_as_written(tmp_path: Path) -> None:
    source = LEFT_PRODUCT.replace("torch.randn(24, 16)", "torch.randint(-3, 3, (24, 16))")
    reference, candidate = _built(_task(tmp_path, source))
    x = torch.randint(-3, 3, (16, 8))
    out = candidate(x)
    assert out.dtype == reference(x).dtype and torch.equal(out, reference(x))


def test_under_autocast_the_folded_sum_is_in_fp32_as_the_sum_it_stands_for(
        tmp_path: Path) -> None:
    task = _task(tmp_path, GEMM_SUM)
    reference, candidate = _built(task, ("fold_linear_sum", "autocast_bf16"))
    x = torch.rand(16, 64)
    out = candidate(x)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, reference(x), atol=1e-4, rtol=1e-4)  # no bf16 in it
