"""Whether the reference's own rounding explains a candidate's few values out of tolerance.

The expected outputs are the task's model run in its own dtype (float32, as a rule), and
they carry that dtype's rounding error. Where an output is a sum whose terms cancel, that
error can exceed `atol` by itself: on an H200, 14_Gemm_Divide_Sum_Scaling's reference and
a candidate summing in another order were each about 0.02 off the float64 result against
an atol of 0.01, so the candidate failed 1 value in 1,024 in one trial in five. Judging
such a value against the reference alone judges the reference's rounding, not the file.

So where a trial's only failures are a few such values, the reference's child runs the
trial again in float64 (the "exact" outputs) and each failing value is judged against
that: it passes where it is within the tolerance of the exact value plus the
reference's own distance from it, i.e. where the candidate is no further from the exact
result than the reference is, beyond what the tolerance allows anyway. The exact run is
trusted only where it agrees with the reference everywhere within
`REFERENCE_ERROR_MAX` times the tolerance; a model that computes something else in
float64 (a dtype test in its forward, a buffer the cast missed) then rescues nothing, and
a value can never pass further than (1 + REFERENCE_ERROR_MAX) tolerances from the exact.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from pike.evaluate import check
from pike.evaluate.verdict import OutputMismatch

# Failing values that may be judged against the exact outputs, per output of a trial: at
# most this many (their indices and values are kept on the host meanwhile), and at most
# half the output's values. A wrong answer fails nearly all (a cached one 97% on the
# example MLP); rounding, the values near zero where terms cancel (1 in 1,024 on the
# H200's task 14; 18 in 64 where every output is such a sum).
DOUBTFUL_MAX = 1 << 16

# The most the reference may be off its exact outputs, in tolerances, for the exact run to
# be trusted with a rescue.
REFERENCE_ERROR_MAX = 3.0


@dataclass
class Doubtful:
    """One output's values of one trial that failed the comparison: their flat indices
    and the expected and the candidate's values there (float64, on the host)."""

    trial: int
    output: int
    atol: float
    index: torch.Tensor
    expected: torch.Tensor
    actual: torch.Tensor


def doubtful_values(expected: Any, actual: Any, trial: int, output: int, atol: float,
                    rtol: float, on: torch.device) -> Doubtful | None:
    """The values of one output outside tolerance, where at most DOUBTFUL_MAX of them are
    (and at most half) and each is finite on both sides (a NaN or an Inf is no
    rounding); else None."""
    if not (isinstance(expected, torch.Tensor) and isinstance(actual, torch.Tensor)
            and expected.is_floating_point() and expected.shape == actual.shape
            and expected.dtype == actual.dtype):
        return None
    most = min(DOUBTFUL_MAX, expected.numel() // 2)
    indices, exp_vals, act_vals = [], [], []
    found, start = 0, 0
    for exp, act in check.chunks(expected, actual, on, torch.float64):
        if not bool((torch.isfinite(exp) & torch.isfinite(act)).all()):
            return None
        bad = ((exp - act).abs() > atol + rtol * exp.abs()).nonzero().flatten()
        found += bad.numel()
        if found > most:
            return None
        indices.append(bad.cpu() + start)
        exp_vals.append(exp[bad].cpu())
        act_vals.append(act[bad].cpu())
        start += exp.numel()
    if not found:
        return None
    return Doubtful(trial, output, atol, torch.cat(indices), torch.cat(exp_vals),
                    torch.cat(act_vals))


def all_doubtful(bad: list[OutputMismatch], expected: list[Any], actual: list[Any],
                 trial: int, atol: float | list[float], rtol: float, on: torch.device
                 ) -> list[Doubtful] | None:
    """The doubtful values of each failing output (`bad`) of one trial, where every one
    of them is doubtful (the rounding can only explain a trial whole); else None."""
    found = []
    for mismatch in bad:
        if (mismatch.mismatched or 0) > DOUBTFUL_MAX:
            return None  # a wrong answer: not worth another pass over its values
        one = doubtful_values(expected[mismatch.output], actual[mismatch.output], trial,
                              mismatch.output, atol[mismatch.output]
                              if isinstance(atol, list) else atol, rtol, on)
        if one is None:
            return None
        found.append(one)
    return found or None


def unexplained(doubtful: list[Doubtful], expected: list[Any], exact: list[Any] | str,
                rtol: float, on: torch.device) -> str | None:
    """None where the reference's own rounding explains every doubtful value of one
    trial (see the module's text); else why not, in a few words (`exact`, a string:
    why there is no float64 run)."""
    if isinstance(exact, str):
        return exact
    for d in doubtful:
        if d.output >= len(exact) or d.output >= len(expected):
            return "the float64 run returned fewer outputs"
        ref, truth = expected[d.output], exact[d.output]
        if not isinstance(truth, torch.Tensor) or truth.shape != ref.shape:
            return f"the float64 run's output {d.output} has another shape"
        off = _reference_off(ref, truth, d.atol, rtol, on)
        if off:
            return f"the float64 run is no check of the reference: {off}"
        exact_vals = truth.detach().reshape(-1)[d.index.to(truth.device)].to(
            "cpu", torch.float64)
        allowed = d.atol + rtol * exact_vals.abs() + (d.expected - exact_vals).abs()
        over = int(((d.actual - exact_vals).abs() > allowed).sum())
        if over:
            return (f"{over} of output {d.output}'s {d.index.numel()} failing values are "
                    "further from the float64 result than the reference is")
    return None


def _reference_off(expected: Any, exact: torch.Tensor, atol: float, rtol: float,
                   on: torch.device) -> str | None:
    """Where the reference is off its exact outputs by more than REFERENCE_ERROR_MAX
    tolerances anywhere: how many values are."""
    count = 0
    for exp, truth in check.chunks(expected, exact, on, torch.float64):
        finite = torch.isfinite(exp) & torch.isfinite(truth)
        far = finite & ((exp - truth).abs() > REFERENCE_ERROR_MAX * (atol + rtol * truth.abs()))
        lost = torch.isfinite(exp) & ~torch.isfinite(truth)
        count += int((far | lost).sum())
    if count:
        return (f"{count} of its values differ from the float64 result by over "
                f"{REFERENCE_ERROR_MAX:g} tolerances")
    return None


def own_errors(expected: list[Any], exact: list[Any], atol: float,
               on: torch.device) -> dict[int, float]:
    """How far the reference is off its float64 run, at most, per floating output
    (at most REFERENCE_ERROR_MAX times `atol`: a larger one is no rounding): the
    allowance beside the tolerance where few sampled values of a timed call are checked
    (check.timed_outputs_problem), as the trials' failing values get it one by one."""
    found = {}
    for index, (exp, truth) in enumerate(zip(expected, exact, strict=False)):
        if (isinstance(exp, torch.Tensor) and isinstance(truth, torch.Tensor)
                and exp.is_floating_point() and exp.shape == truth.shape):
            largest = 0.0
            for e, t in check.chunks(exp, truth, on, torch.float64):
                finite = torch.isfinite(e) & torch.isfinite(t)
                if bool(finite.any()):
                    largest = max(largest, float((e - t)[finite].abs().max()))
            found[index] = min(largest, REFERENCE_ERROR_MAX * atol)
    return found


def wide(value: Any) -> Any:
    """A floating tensor as float64 (complex as complex128); anything else as it is."""
    if isinstance(value, torch.Tensor):
        if value.is_complex():
            return value.to(torch.complex128)
        if value.is_floating_point():
            return value.to(torch.float64)
    return value


def exact_forward(model: torch.nn.Module, inputs: list[Any]) -> list[Any]:
    """The model's outputs in float64: a copy of it with every floating parameter and
    buffer cast (the model itself is timed and compiled elsewhere, and keeps its own),
    on the inputs cast likewise. Runs in the reference's child only: task code."""
    double = copy.deepcopy(model).to(torch.float64)
    with torch.no_grad():
        out = double(*[wide(x) for x in inputs])
    return [wide(leaf) for leaf in check.flatten_output(out)]


def rescued(expected: list[Any], got: list[Any], exact: Callable[[], list[Any]],
            atol: float, rtol: float, on: torch.device) -> str | None:
    """For the reference's child, where it checks a compiled mode: None where every output
    of `got` is within tolerance of `expected` or explained by the reference's own
    rounding (the float64 outputs from `exact`, run only if needed); else why not."""
    if len(expected) != len(got):
        return f"returned {len(got)} outputs, expected {len(expected)}"
    doubtful = []
    for index, (exp, act) in enumerate(zip(expected, got, strict=True)):
        mismatch = check.compare_leaf(exp, act, 0, index, atol, rtol, on)
        if not mismatch.problem:
            continue
        found = doubtful_values(exp, act, 0, index, atol, rtol, on)
        if found is None:
            return f"output {index}: {mismatch.problem}"
        doubtful.append(found)
    if not doubtful:
        return None
    why = unexplained(doubtful, expected, exact(), rtol, on)
    if why:
        return f"output {doubtful[0].output}: values outside tolerance, and {why}"
    return None
