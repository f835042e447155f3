"""The trial with inputs of another distribution: its absolute tolerance grows with its
outputs' magnitude, so honest rounding passes whatever scale is drawn and shortcuts that
assume randn inputs still fail."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from pike.config import EvalConfig
from pike.evaluate import check, judge, trial_comparison
from pike.evaluate.leaf_files import write_leaves

TRIALS = 2  # trial 2 is the shifted one


def _judged(tmp_path: Path, expected: list[list[torch.Tensor]],
            actual: list[list[torch.Tensor]]) -> judge.Verdict:
    for t, leaves in enumerate(actual):
        write_leaves(leaves, tmp_path / f"outputs_{t}.pt")
    return trial_comparison.TrialComparison(expected, tmp_path, EvalConfig(trials=TRIALS),
                                            torch.device("cpu")).verdict()


def _expected(scale: float) -> list[list[torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    own = [[torch.randn(64, 64, generator=g)] for _ in range(TRIALS)]
    return [*own, [scale * torch.randn(64, 64, generator=g) + 0.3]]


def test_the_shifted_trials_tolerance_follows_its_outputs_magnitude() -> None:
    own, shifted = [torch.randn(1000)], [3.0 * torch.randn(1000)]
    (atol,) = check.shifted_atols(own, shifted, 0.01)
    assert 0.025 < atol < 0.035
    # never below the configured one, never beyond the cap, only floating outputs
    assert check.shifted_atols(own, [0.1 * own[0]], 0.01) == [0.01]
    assert check.shifted_atols(own, [1e6 * own[0]], 0.01) == [0.01 * check.SHIFT_ATOL_MAX]
    ints = [torch.arange(10)]
    assert check.shifted_atols(ints, [7 * ints[0]], 0.01) == [0.01]
    assert check.shifted_atols([torch.zeros(4)], [torch.ones(4)], 0.01) == [0.01]


def test_rounding_that_grows_with_the_values_passes_on_the_shifted_trial_only(
        tmp_path: Path) -> None:
    expected = _expected(scale=3.0)
    # an error of 0.02 on values near zero: rounding of values three times larger
    off = [[leaf + 0.02 * torch.sign(torch.randn_like(leaf)) for leaf in trial]
           for trial in expected]
    verdict = _judged(tmp_path, expected, [expected[0], expected[1], off[2]])
    assert verdict.status == "ok", verdict.message
    # the same error on the task's own inputs is outside its tolerance
    verdict = _judged(tmp_path, expected, [off[0], expected[1], expected[2]])
    assert verdict.status == "incorrect"
    assert "trial 0" in verdict.message


@pytest.mark.parametrize("cut", [7.0, 4.0])
def test_a_shortcut_that_assumes_randn_values_still_fails_the_shifted_trial(
        tmp_path: Path, cut: float) -> None:
    expected = _expected(scale=3.0)
    clipped = [leaf.clamp(-cut, cut) for leaf in expected[2]]
    verdict = _judged(tmp_path, expected, [expected[0], expected[1], clipped])
    assert verdict.status == "incorrect"
    assert "another distribution" in verdict.message


def test_a_reference_run_works_its_tolerance_out_once_for_every_candidate(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    expected = _expected(scale=3.0)
    run = judge.ReferenceRun(inputs_dir=tmp_path, expected=expected, env={}, child=None,
                             _tmp=tmp_path)
    worked: list[int] = []
    real = check.shifted_atols
    monkeypatch.setattr(check, "shifted_atols",
                        lambda *a: worked.append(1) or real(*a))  # type: ignore[func-returns-value]
    first = run.shifted_atols(TRIALS, 0.01)
    assert run.shifted_atols(TRIALS, 0.01) == first and worked == [1]
    assert 0.025 < first[0] < 0.035
    # what a comparison is given it uses, and works out nothing itself
    off = [leaf + 0.02 for leaf in expected[2]]
    for t, leaves in enumerate([expected[0], expected[1], off]):
        write_leaves(leaves, tmp_path / f"outputs_{t}.pt")
    verdict = trial_comparison.TrialComparison(expected, tmp_path, EvalConfig(trials=TRIALS),
                                               torch.device("cpu"), first).verdict()
    assert verdict.status == "ok", verdict.message
    assert worked == [1]
