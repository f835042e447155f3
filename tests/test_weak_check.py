"""A task whose reference gives the same outputs whatever its inputs is said to be one:
its check cannot tell a candidate that ignores its inputs (check.weak_check)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from pike.config import EvalConfig
from pike.evaluate import evaluate
from pike.evaluate.check import weak_check
from pike.evaluate.reference_cache import close_references
from pike.task import Task

TRIALS = 5  # then the shifted trial (index 5) and the one after timing (index 6)


def test_the_trials_outputs_say_which_trials_tell_anything() -> None:
    import torch

    def trial(value: float, n: int = 1000) -> list:
        return [torch.full((n,), value), 3]

    def weak(outputs: list) -> str | None:
        return weak_check(outputs, TRIALS, 0.01, 0.01)

    assert weak([[torch.randn(1000), 3] for _ in range(7)]) is None
    assert weak([trial(0.0)] * 5 + [trial(5.0), trial(1.0)]) is None  # the last one differs
    only_shifted = weak([trial(0.0)] * 5 + [trial(5.0), trial(0.0)])
    assert only_shifted and "all 6 trials" in only_shifted and "only the trial on shifted" \
        in only_shifted
    # within the tolerance is the same: a loss averaged over a large batch, 2.30 +- 0.003
    losses = [trial(2.30 + 0.001 * k, 1) for k in range(7)]
    every = weak(losses)
    assert every and "all 7 trials" in every and "passes every check" in every
    assert weak([[torch.full((4,), float("nan"))]] * 7)  # NaN everywhere, every time
    assert weak([trial(0.0)] * 6 + [[torch.zeros(1000), 4]]) is None  # a scalar leaf differs
    assert weak([trial(0.0)] * 6 + [[torch.zeros(999), 3]]) is None  # a shape
    assert weak([]) is None and weak([trial(0.0)] * 5) is None


def _task(tmp_path: Path, forward: str) -> Task:
    path = tmp_path / "1_Clipped.py"
    path.write_text(f"""import torch
import torch.nn as nn

class Model(nn.Module):
    def forward(self, x):
        return {forward}

def get_inputs():
    return [torch.randn(64, 128)]

def get_init_inputs():
    return []
""")
    return Task.from_file(path)


def test_a_constant_candidate_passes_a_task_whose_outputs_ignore_its_inputs_and_is_told(
        tmp_path: Path, fast_config: EvalConfig, caplog: pytest.LogCaptureFixture) -> None:
    """Level 2's 9_Matmul_Subtract_Multiply_ReLU gives 0 everywhere on its own inputs; this
    task gives 0 on the shifted ones too (their scale is at most 4, their offset 1)."""
    task = _task(tmp_path, "torch.relu(x - 100.0)")
    zeros = task.source.replace("class Model", "class ModelNew").replace(
        "torch.relu(x - 100.0)", "torch.zeros_like(x)")
    caplog.set_level(logging.WARNING, logger="pike.evaluate.reference_start")
    verdicts = []
    try:
        for _ in range(2):  # a reference started again, as after a drifting window
            verdicts.append(evaluate(task, zeros, fast_config))
            close_references()
    finally:
        close_references()
    for verdict in verdicts:
        assert verdict.status in ("ok", "rejected"), verdict.message
        assert "passes every check" in verdict.weak_check, verdict.weak_check
    # every verdict says it; the log, once a process
    said = [r for r in caplog.records if "passes every check" in r.getMessage()]
    assert len(said) == 1, [r.getMessage() for r in said]


def test_a_task_whose_outputs_follow_its_inputs_says_nothing(
        tmp_path: Path, mlp_task: Task, fast_config: EvalConfig) -> None:
    honest = mlp_task.source.replace("class Model", "class ModelNew") + \
        "\nclass Model(ModelNew):\n    pass\n"
    try:
        verdict = evaluate(mlp_task, honest, fast_config)
    finally:
        close_references()
    assert verdict.weak_check == "", verdict.weak_check
