"""The offline tf32x3 transformation: large fp32 matrix products as three TF32 ones (each
operand split into its top 10 mantissa bits and the rest). On the CPU there is no TF32,
so these tests check the split's arithmetic, where it applies and where it does not, and
that results stay within tolerance; what it buys is a GPU's (bench/tf32x3.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from pike.agents.offline import applicable, compatible, named_in, render
from pike.config import EvalConfig
from pike.evaluate import evaluate
from pike.task import Task

PRODUCTS = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, features, out):
        super().__init__()
        self.linear = nn.Linear(features, out)
        self.weight = nn.Parameter(torch.randn(out, features))

    def forward(self, x, y):
        h = self.linear(x)                     # F.linear, with a bias
        h = h + torch.matmul(x, self.weight.T)  # matmul, a transposed parameter
        z = torch.bmm(y, y.transpose(1, 2))     # bmm
        return h @ self.weight, z.sum(0) @ y[0]  # the operator, twice


def get_inputs():
    return [torch.randn(48, 64), torch.randn(3, 40, 24)]


def get_init_inputs():
    return [64, 64]
"""


def _task(tmp_path: Path, source: str = PRODUCTS) -> Task:
    path = tmp_path / "1_Products.py"
    path.write_text(source)
    return Task.from_file(path)


def _built(source: str, names: tuple[str, ...] = ("tf32x3",), always: bool = True
           ) -> tuple[Any, Any, dict[str, Any]]:
    """The reference and the rendered ModelNew; `always`: split products of any size (the
    CPU tests' shapes are far below the size where splitting pays)."""
    ns: dict[str, Any] = {"__name__": "pike_offline_test"}
    exec(compile(render(source, names), "offline.py", "exec"), ns)
    if always:
        ns["_WORTH_SPLITTING"] = 0.0
    init = ns["get_init_inputs"]()
    torch.manual_seed(0)
    reference = ns["Model"](*init)
    torch.manual_seed(0)
    return reference, ns["ModelNew"](*init), ns


def test_the_halves_are_exact_and_the_high_one_fits_tf32() -> None:
    ns: dict[str, Any] = {}
    exec(compile(render(PRODUCTS, ("tf32x3",)), "offline.py", "exec"), ns)
    x = torch.randn(1000) * torch.logspace(-20, 20, 1000)
    hi, lo = ns["_halves"](x)
    assert torch.equal(hi + lo, x)  # exact: lo is what the mask cut, an fp32 number
    assert not (hi.view(torch.int32) & 8191).any()  # 10 mantissa bits, as TF32 holds
    assert (lo.abs() <= x.abs() * 2.0**-10).all()


def test_every_product_is_split_and_stays_close(tmp_path: Path) -> None:
    reference, candidate, _ = _built(PRODUCTS)
    x, y = torch.randn(48, 64), torch.randn(3, 40, 24)
    tf32_before = torch.backends.cuda.matmul.allow_tf32
    with torch.no_grad():
        expected, got = reference(x, y), candidate(x, y)
    assert candidate.tf32x3.split == 5  # linear, matmul, bmm and the operator twice
    for e, g in zip(expected, got, strict=True):
        torch.testing.assert_close(g, e, atol=1e-4, rtol=1e-4)
    assert torch.backends.cuda.matmul.allow_tf32 is tf32_before  # put back after each


def test_a_parameter_is_split_once_and_again_when_it_changes(tmp_path: Path) -> None:
    reference, candidate, _ = _built(PRODUCTS)
    x, y = torch.randn(48, 64), torch.randn(3, 40, 24)
    with torch.no_grad():
        candidate(x, y)
        kept = dict(candidate.tf32x3._weights)
        candidate(x, y)
        assert {k: v[0] for k, v in candidate.tf32x3._weights.items()} == {
            k: v[0] for k, v in kept.items()}
        for model in (reference, candidate.inner):
            model.weight.mul_(-2.0)  # in place: its version moves
        expected, got = reference(x, y), candidate(x, y)
    for e, g in zip(expected, got, strict=True):
        torch.testing.assert_close(g, e, atol=1e-4, rtol=1e-4)


def test_small_products_run_as_written(tmp_path: Path) -> None:
    reference, candidate, _ = _built(PRODUCTS, always=False)
    x, y = torch.randn(48, 64), torch.randn(3, 40, 24)
    with torch.no_grad():
        expected, got = reference(x, y), candidate(x, y)
    assert candidate.tf32x3.split == 0
    for e, g in zip(expected, got, strict=True):
        torch.testing.assert_close(g, e, atol=0, rtol=0)


def test_the_size_rule_counts_flops_per_byte() -> None:
    ns: dict[str, Any] = {}
    exec(compile(render(PRODUCTS, ("tf32x3",)), "offline.py", "exec"), ns)
    work, meta = ns["_work"], torch.device("meta")
    # KernelBench level 1's 2_Standard_matrix_multiplication: 2048 x 8192 @ 8192 x 4096
    big = work(torch.matmul, torch.empty(2048, 8192, device=meta),
               torch.empty(8192, 4096, device=meta))
    # its 7_Matmul_with_small_K_dimension_: a 4 GB output for K = 64, bound by the writes
    wide = work(torch.matmul, torch.empty(32768, 64, device=meta),
                torch.empty(64, 32768, device=meta))
    linear = work(torch.nn.functional.linear, torch.empty(4, 1024, 2048, device=meta),
                  torch.empty(2048, 2048, device=meta))
    assert big > ns["_WORTH_SPLITTING"] > wide
    assert linear == pytest.approx(2 * 4096 * 2048 * 2048 / (4 * (4 * 1024 * 2048 + 2048**2
                                                                 + 4096 * 2048)))


@pytest.mark.parametrize("call", [
    lambda x, w: torch.matmul(x.double(), w.double()),  # not fp32
    lambda x, w: torch.matmul(x[0], w),  # a 1-D operand
    lambda x, w: torch.matmul(x, w, out=torch.empty(8, 16)),  # an out= argument
    lambda x, w: torch.matmul(x.requires_grad_(), w),  # a product autograd records
    lambda x, w: torch.einsum("ij,jk->ik", x, w),  # not one of the products
], ids=["float64", "1-D", "out", "grad", "einsum"])
def test_anything_else_runs_as_written(call: Any) -> None:
    _, candidate, _ = _built(PRODUCTS)
    x, w = torch.randn(8, 12), torch.randn(12, 16)
    with candidate.tf32x3:
        out = call(x, w)
    assert candidate.tf32x3.split == 0
    expected = call(x.detach().clone(), w)
    torch.testing.assert_close(out.to(expected.dtype), expected, atol=0, rtol=0)


def test_tf32_is_put_back_when_a_product_fails() -> None:
    _, candidate, _ = _built(PRODUCTS)
    before = torch.backends.cuda.matmul.allow_tf32
    with pytest.raises(RuntimeError), candidate.tf32x3:
        torch.matmul(torch.randn(8, 12), torch.randn(13, 16))  # shapes that do not match
    assert torch.backends.cuda.matmul.allow_tf32 is before


def test_empty_and_infinite_operands_come_out_as_fp32_gives_them() -> None:
    _, candidate, _ = _built(PRODUCTS)
    a, b = torch.randn(6, 5), torch.randn(5, 4)
    a[0, 0], a[1, 1], b[2, 3] = float("inf"), float("-inf"), float("nan")
    with torch.no_grad(), candidate.tf32x3:
        empty = torch.matmul(torch.empty(0, 5), b)
        got = torch.matmul(a, b)
    assert empty.shape == (0, 4) and candidate.tf32x3.split == 2
    expected = torch.matmul(a, b)
    assert torch.equal(got.isnan(), expected.isnan()) and torch.equal(got.isinf(),
                                                                      expected.isinf())
    finite = expected.isfinite()
    torch.testing.assert_close(got[finite], expected[finite], atol=1e-5, rtol=1e-5)


def test_it_is_rendered_on_request_never_searched_and_alone_in_precision() -> None:
    # an H200 showed it failing where tf32 fails and slower than tf32 where it passes
    assert "tf32x3" not in applicable(PRODUCTS, "cuda:0")
    assert "tf32x3" not in applicable(PRODUCTS, "cpu")
    assert compatible(("tf32x3", "cuda_graph", "inference_mode"))
    for other in ("tf32", "autocast_fp16", "autocast_bf16", "compile:default"):
        assert not compatible(("tf32x3", other))
    rendered = render(PRODUCTS, ("cuda_graph", "tf32x3"))
    assert named_in(rendered) == ["cuda_graph", "tf32x3"]
    # plain TF32 is not switched on for the whole model: only around each split product
    assert "allow_tf32 = True\n        torch.backends.cudnn.allow_tf32" not in rendered


def test_the_split_candidate_passes_the_evaluator_and_changes_no_flag(
        tmp_path: Path, fast_config: EvalConfig) -> None:
    task = _task(tmp_path)
    rendered = render(task.source, ("tf32x3",))
    source = rendered.replace("_WORTH_SPLITTING = 256.0", "_WORTH_SPLITTING = 0.0")
    assert source != rendered
    verdict = evaluate(task, source, fast_config)
    assert verdict.status == "ok", verdict.message
    assert not verdict.flags_changed
