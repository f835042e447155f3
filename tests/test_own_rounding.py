"""A candidate closer to the exact result than the reference passes where the reference's
own float32 rounding is what the plain comparison saw; a candidate further from it than
the reference still fails, and a float64 run that computes something else rescues nothing."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from pike.config import EvalConfig
from pike.evaluate import check, evaluate, own_rounding, trial_comparison
from pike.evaluate.leaf_files import write_leaves
from pike.evaluate.reference_cache import close_references
from pike.task import Task

# A centred row sum: zero in exact arithmetic, about 0.016 at most off it in float32 at
# this scale (ref err max 0.0159 over 64 rows), so past atol=0.01 and within
# own_rounding.REFERENCE_ERROR_MAX tolerances.
TASK = '''
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return (x - x.mean(1, keepdim=True)).sum(1)


def get_inputs():
    return [200 * torch.randn(64, 4096)]


def get_init_inputs():
    return []
'''

# computes in float64 and rounds once: closer to the exact result than the reference
PRECISE = '''
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, x):
        d = x.double()
        return (d - d.mean(1, keepdim=True)).sum(1).float()
'''

# the reference's answer, 0.1 off in one value: wrong there whatever rounds how
ONE_OFF = '''
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, x):
        out = (x - x.mean(1, keepdim=True)).sum(1)
        out[0] += 0.1
        return out
'''


def _centred_sum(x: torch.Tensor) -> torch.Tensor:
    return (x - x.mean(1, keepdim=True)).sum(1)


class _Centred(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _centred_sum(x)


CPU = torch.device("cpu")


def _inputs() -> torch.Tensor:
    return 200 * torch.randn(64, 4096, generator=torch.Generator().manual_seed(0))


def _precise(x: torch.Tensor) -> torch.Tensor:
    return _centred_sum(x.double()).float()


def test_the_plain_comparison_fails_a_more_precise_answer_the_float64_run_explains() -> None:
    x = _inputs()
    expected, got = [_centred_sum(x)], [_precise(x)]
    # the premise: the reference's own error is past the tolerance somewhere
    assert check.compare_leaf(expected[0], got[0], 0, 0, 0.01, 0.01).problem
    exact = lambda: own_rounding.exact_forward(_Centred(), [x])  # noqa: E731
    assert own_rounding.rescued(expected, got, exact, 0.01, 0.01, CPU) is None
    assert exact()[0].dtype == torch.float64


def test_a_value_further_from_the_float64_result_than_the_reference_still_fails() -> None:
    x = _inputs()
    expected = [_centred_sum(x)]
    off = expected[0].clone()
    off[3] += 0.1
    exact = lambda: own_rounding.exact_forward(_Centred(), [x])  # noqa: E731
    why = own_rounding.rescued(expected, [off], exact, 0.01, 0.01, CPU)
    assert why is not None and "further from the float64 result" in why


def test_a_mode_returning_other_outputs_is_still_incorrect() -> None:
    x = _inputs()
    why = own_rounding.rescued([_centred_sum(x)], [_centred_sum(x)] * 2,
                               lambda: [_precise(x).double()], 0.01, 0.01, CPU)
    assert why == "returned 2 outputs, expected 1"


def test_a_float64_run_that_computes_something_else_rescues_nothing() -> None:
    x = _inputs()
    expected, got = [_centred_sum(x)], [_precise(x)]
    elsewhere = lambda: [_precise(x).double() + 1.0]  # noqa: E731
    why = own_rounding.rescued(expected, got, elsewhere, 0.01, 0.01, CPU)
    assert why is not None and "no check of the reference" in why


def test_only_few_finite_failing_values_are_doubtful() -> None:
    expected, some = torch.zeros(1000), torch.zeros(1000)
    some[:10] = 0.02
    found = own_rounding.doubtful_values(expected, some, 0, 0, 0.01, 0.0, CPU)
    assert found is not None and found.index.tolist() == list(range(10))
    many = torch.zeros(4 * own_rounding.DOUBTFUL_MAX)
    off = many.clone()
    off[:own_rounding.DOUBTFUL_MAX + 1] = 0.02
    assert own_rounding.doubtful_values(many, off, 0, 0, 0.01, 0.0, CPU) is None
    nan = expected.clone()
    nan[0] = float("nan")
    assert own_rounding.doubtful_values(expected, nan, 0, 0, 0.01, 0.0, CPU) is None
    most_of_it = torch.zeros(10)
    most_of_it[:6] = 0.02
    assert own_rounding.doubtful_values(torch.zeros(10), most_of_it, 0, 0, 0.01, 0.0,
                                        CPU) is None
    ints = torch.zeros(10, dtype=torch.int64)
    assert own_rounding.doubtful_values(ints, ints + 1, 0, 0, 0.01, 0.0, CPU) is None


def _comparison(tmp_path: Path, actual: list[torch.Tensor]) -> tuple[
        trial_comparison.TrialComparison, list[list[torch.Tensor]], list[torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    xs = [200 * torch.randn(64, 4096, generator=g) for _ in actual]
    expected = [[_centred_sum(x)] for x in xs]
    for t, x in enumerate(xs):
        write_leaves([actual[t] if actual[t] is not None else _precise(x)],
                     tmp_path / f"outputs_{t}.pt")
    cfg = EvalConfig(trials=len(actual), guards=False)
    return trial_comparison.TrialComparison(expected, tmp_path, cfg, CPU), expected, xs


def test_a_trial_comparison_passes_the_trials_the_reference_rounding_explains(
        tmp_path: Path) -> None:
    comparison, expected, xs = _comparison(tmp_path, [None, None])
    assert comparison.verdict().status == "incorrect"
    assert comparison.may_be_rounding()
    asked: list[int] = []

    def exact(trial: int) -> list[torch.Tensor]:
        asked.append(trial)
        return own_rounding.exact_forward(_Centred(), [xs[trial]])

    comparison.explain_by_rounding(exact)
    verdict = comparison.verdict()
    assert verdict.status == "ok", verdict.message
    assert verdict.trials_passed == 2
    assert verdict.rounding_passed and verdict.rounding_passed > 0
    assert "no further from its float64 result than the reference itself" in verdict.message
    assert asked == sorted({t for t in asked})  # each failing trial's run asked once


def test_a_trial_comparison_says_why_the_rounding_does_not_explain_a_failure(
        tmp_path: Path) -> None:
    comparison, _, _ = _comparison(tmp_path, [None])
    comparison.verdict()
    comparison.explain_by_rounding(lambda trial: "the reference has no live child to run it")
    verdict = comparison.verdict()
    assert verdict.status == "incorrect"
    assert "not the reference's own rounding: trial 0: the reference has no live" in \
        verdict.message


@pytest.fixture
def task(tmp_path: Path) -> Task:
    path = tmp_path / "centred_sum.py"
    path.write_text(TASK)
    return Task.from_file(path)


def test_the_evaluator_asks_the_references_child_for_the_float64_run(
        task: Task, fast_config: EvalConfig) -> None:
    cfg = fast_config.model_copy(update={"seed": 7})
    try:
        verdict = evaluate(task, PRECISE, cfg)
        assert verdict.status == "ok", verdict.message
        assert "float64 result" in verdict.message
        wrong = evaluate(task, ONE_OFF, cfg)
        assert wrong.status == "incorrect", wrong.message
        assert "further from the float64 result than the reference" in wrong.message
    finally:
        close_references()


@pytest.mark.gpu
def test_the_float64_run_on_a_gpu_reference(task: Task, fast_config: EvalConfig) -> None:
    """On CUDA the reference's child runs the float64 trial on the card: a value off by
    0.1 is still found wrong by it (the run happened: its words are in the verdict), and
    the more precise file passes, by the plain comparison or by the rule."""
    cfg = fast_config.model_copy(update={"device": "cuda"})
    try:
        wrong = evaluate(task, ONE_OFF, cfg)
        assert wrong.status == "incorrect", wrong.message
        assert "further from the float64 result than the reference" in wrong.message
        verdict = evaluate(task, PRECISE, cfg)
        assert verdict.status == "ok", verdict.message
    finally:
        close_references()
