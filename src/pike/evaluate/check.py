"""Correctness: output comparison (parent side) and the minimum guards (child side).

The comparison runs in the parent, on outputs the child saved, so a candidate cannot
change how it is judged. The guards that must see live tensors (aliasing, input
mutation) run in the child with functions bound before the candidate was imported.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._device import DeviceContext

from pike.evaluate.verdict import OutputMismatch

_equal = torch.equal
_Tensor = torch.Tensor


def flatten_output(obj: Any) -> list[Any]:
    """Leaves of a (possibly nested) output: tensors and plain scalars, in a fixed order."""
    if isinstance(obj, _Tensor):
        return [obj]
    if isinstance(obj, (list, tuple)):
        return [leaf for item in obj for leaf in flatten_output(item)]
    if isinstance(obj, dict):
        return [leaf for key in sorted(obj, key=str) for leaf in flatten_output(obj[key])]
    return [obj]


def tensor_leaves(obj: Any) -> list[torch.Tensor]:
    return [leaf for leaf in flatten_output(obj) if isinstance(leaf, _Tensor)]


MODE_WHY = ("a mode left in force sees the evaluator's own reads of the outputs, and can "
            "do the work only there")
ODD_OUTPUT_WHY = ("a tensor subclass, or a container walked by its own code, can defer or "
                  "fake its work past the timed call")
MANY_PARTS_WHY = "each of the evaluator's walks of the output would take as many steps"
# A container's own iteration and indexing: flatten_output runs these on every output, so
# a subclass that overrides them would run candidate code outside the timed call.
_PLAIN_ACCESS = {list: (list.__iter__, list.__getitem__), tuple: (tuple.__iter__, tuple.__getitem__),
                 dict: (dict.__iter__, dict.__getitem__)}


# Parts an output may have: a handful in any task, but lists that share themselves (31
# levels of [L, L]) make 2^31 parts from a few objects, and every walk of them would run
# to the phase's limit.
MAX_OUTPUT_PARTS = 10_000
TOO_MANY_PARTS = f"nest of over {MAX_OUTPUT_PARTS:,} parts"  # odd_output_part's answer


def odd_output_part(obj: Any) -> str | None:
    """The type of the first part of an output that is not plain (None where every part
    is): a tensor subclass, which can answer what the evaluator asks of it from stored
    metadata and compute only when a value is read, past the timed call; a list, tuple
    or dict whose type changes how it is walked; a dict key other than a str or an int;
    nesting past 32 levels; or more than MAX_OUTPUT_PARTS parts in all ("nest of over
    ... parts"). Reads nothing through candidate code."""
    parts = 0

    def odd(obj: Any, depth: int) -> str | None:
        nonlocal parts
        parts += 1
        if parts > MAX_OUTPUT_PARTS:
            return TOO_MANY_PARTS
        kind = type(obj)
        if kind is _Tensor:
            return None
        if isinstance(obj, _Tensor) or depth > 32:
            return kind.__name__
        for base, access in _PLAIN_ACCESS.items():
            if isinstance(obj, base):
                # a metaclass's own lookup could name the built-in methods while the
                # type's slots run its code (helper-59: `ok` at up to 174x): subclasses of
                # plain types only, and their methods looked up where no metaclass answers
                if kind is not base and (type(kind) is not type
                                         or (kind.__iter__, kind.__getitem__) != access):
                    return kind.__name__
                if base is dict:
                    keys = list(dict.keys(obj))
                    odd_key = next((type(k).__name__ for k in keys
                                    if type(k) not in (str, int)), None)
                    if odd_key:  # before any lookup, which would hash the key
                        return odd_key
                    items = [dict.__getitem__(obj, k) for k in keys]
                else:
                    items = list(base.__iter__(obj))
                for item in items:
                    found = odd(item, depth + 1)
                    if found is not None:
                        return found
                return None
        return None

    return odd(obj, 0)


def mode_in_force() -> str | None:
    """The type of a torch function or dispatch mode left in force (None where there is
    none but torch's own default-device context, which `torch.set_default_device`
    leaves): a mode pushed by candidate code and never popped sees the evaluator's own
    torch calls on the outputs, and filled a plain tensor only where the sampler read it
    (helper-59: `ok` at 42x on the CPU)."""
    stacks = ((torch._C._len_torch_function_stack, torch._C._get_function_stack_at),
              (torch._C._len_torch_dispatch_stack, torch._C._get_dispatch_stack_at))
    for length, at in stacks:
        for index in range(length()):
            mode = at(index)
            if type(mode) is not DeviceContext:
                return type(mode).__name__
    return None


def leaves_bytes(leaves: list[Any]) -> int:
    """The bytes the tensors among `leaves` take."""
    return sum(x.nbytes for x in leaves if isinstance(x, _Tensor))


def _storage_span(t: torch.Tensor) -> tuple[int, int]:
    storage = t.untyped_storage()
    start = storage.data_ptr()
    return start, start + storage.nbytes()


def aliased_outputs(outputs: list[torch.Tensor], inputs: list[torch.Tensor]) -> list[int]:
    """Indices of outputs whose memory overlaps the memory of any input."""
    spans = [_storage_span(t) for t in inputs if t.untyped_storage().nbytes() > 0]
    hits = []
    for i, out in enumerate(outputs):
        if out.untyped_storage().nbytes() == 0:
            continue
        lo, hi = _storage_span(out)
        if any(lo < in_hi and in_lo < hi for in_lo, in_hi in spans):
            hits.append(i)
    return hits


def changed_inputs(before: list[torch.Tensor], after: list[torch.Tensor]) -> list[int]:
    """Indices of inputs whose values differ from the copy taken before the call."""
    return [
        i
        for i, (b, a) in enumerate(zip(before, after, strict=True))
        if b.shape != a.shape or b.dtype != a.dtype or not _equal(b, a.to(b.device))
    ]


def _shape(value: Any) -> list[int] | None:
    return list(value.shape) if isinstance(value, _Tensor) else None


def compare_leaf(
    expected: Any, actual: Any, trial: int, index: int, atol: float, rtol: float,
    on: torch.device | None = None,
) -> OutputMismatch:
    """How `actual` differs from `expected`; `problem` is empty when within tolerance.
    Values are compared on `on` (the evaluation's GPU, where the parent can use it) in
    chunks, so outputs of gigabytes neither take a minute on the host nor fill memory."""
    mismatch = OutputMismatch(
        trial=trial, output=index, problem="", expected_shape=_shape(expected),
        actual_shape=_shape(actual),
    )
    if not isinstance(expected, _Tensor):
        if isinstance(actual, _Tensor) or not _scalars_close(expected, actual, atol, rtol):
            mismatch.problem = f"expected {expected!r}, got {_describe(actual)}"
        return mismatch
    if not isinstance(actual, _Tensor):
        mismatch.problem = f"expected a tensor, got {_describe(actual)}"
        return mismatch
    if expected.shape != actual.shape:
        mismatch.problem = f"shape {list(actual.shape)} != expected {list(expected.shape)}"
        return mismatch
    if expected.dtype != actual.dtype:
        mismatch.problem = f"dtype {actual.dtype} != expected {expected.dtype}"
        return mismatch
    return _compare_values(expected, actual, mismatch, atol, rtol, on or torch.device("cpu"))


def compare_leaves(expected: list[Any], actual: list[Any], trial: int,
                   atol: float | Sequence[float], rtol: float,
                   on: torch.device | None = None) -> list[OutputMismatch]:
    """`compare_leaf` for each output of one trial (`atol` one for all, or one per output);
    one mismatch where the counts differ."""
    if len(expected) != len(actual):
        return [OutputMismatch(trial=trial, output=0,
                               problem=f"returned {len(actual)} outputs, expected {len(expected)}")]
    atols = [atol] * len(expected) if isinstance(atol, (int, float)) else list(atol)
    return [compare_leaf(exp, act, trial, index, atols[index], rtol, on)
            for index, (exp, act) in enumerate(zip(expected, actual, strict=True))]


# The most the shifted trial's absolute tolerance grows (shifted_atols): its inputs are
# drawn at 2.5 to 4 times randn's scale, so its outputs are rarely more than that larger.
SHIFT_ATOL_MAX = 10.0


def shifted_atols(own: list[Any], shifted: list[Any], atol: float) -> list[float]:
    """The absolute tolerance for each output of the trial with inputs of another
    distribution: `atol` times how much larger that output's expected values are than in
    a trial of the task's own inputs (mean magnitude; at least 1, at most SHIFT_ATOL_MAX).
    Rounding errors grow with the values computed: on the H200 a TF32 GEMM within 0.005 on
    the task's inputs missed atol=0.01 by 1 value in 8 million on inputs three times
    larger, and whether a search kept its 8x depended on the scale drawn. A shortcut that
    assumes randn inputs is off by about the outputs themselves, far beyond this."""
    atols = []
    for mine, theirs in zip(own, shifted, strict=False):
        usual, larger = _magnitude(mine), _magnitude(theirs)
        factor = (1.0 if not usual or larger is None
                  else min(max(larger / usual, 1.0), SHIFT_ATOL_MAX))
        atols.append(atol * factor)
    return atols + [atol] * (len(shifted) - len(atols))


def _magnitude(value: Any) -> float | None:
    """The mean absolute value of a floating tensor's finite values (None for anything
    else, or where none is finite), where the tensor lies, chunk by chunk (a chunk's
    temporaries stay within twice its size)."""
    if not isinstance(value, _Tensor) or not value.is_floating_point() or value.numel() == 0:
        return None
    total, count = 0.0, 0
    flat = value.detach().reshape(-1)
    for start in range(0, flat.numel(), COMPARE_CHUNK):
        chunk = flat[start:start + COMPARE_CHUNK]
        finite = torch.isfinite(chunk)
        total += float(torch.where(finite, chunk.abs(), 0).sum(dtype=torch.float64))
        count += int(finite.sum())
    return total / count if count else None


# Values compared at once: the float64 temporaries of a chunk stay near a gigabyte.
COMPARE_CHUNK = 1 << 24


def chunks(expected: torch.Tensor, actual: torch.Tensor, on: torch.device,
            dtype: torch.dtype | None = None) -> Any:
    """Two tensors' values side by side, COMPARE_CHUNK at a time, flat, on `on` (as
    `dtype`, where given)."""
    exp, act = expected.detach().reshape(-1), actual.detach().reshape(-1)
    for start in range(0, exp.numel(), COMPARE_CHUNK):
        stop = start + COMPARE_CHUNK
        e, a = exp[start:stop].to(on), act[start:stop].to(on)
        yield (e, a) if dtype is None else (e.to(dtype), a.to(dtype))


def _compare_values(
    expected: torch.Tensor, actual: torch.Tensor, mismatch: OutputMismatch, atol: float,
    rtol: float, on: torch.device,
) -> OutputMismatch:
    total = expected.numel()
    if not (expected.is_floating_point() or expected.is_complex()):
        n_bad = sum(int((e != a).sum()) for e, a in chunks(expected, actual, on))
        if n_bad == 0:
            return mismatch
        mismatch.problem = f"{n_bad} of {total} values differ"
        mismatch.mismatched, mismatch.total = n_bad, total
        return mismatch
    wide = torch.complex128 if expected.is_complex() else torch.float64
    n_bad = nan_problem = inf_problem = 0
    max_abs, max_rel = 0.0, 0.0
    for exp, act in chunks(expected, actual, on, wide):
        exp_nan, act_nan = torch.isnan(exp), torch.isnan(act)
        finite = torch.isfinite(exp) & torch.isfinite(act)
        inf_same = ~finite & ~exp_nan & ~act_nan & (exp == act)
        nan_same = exp_nan & act_nan
        diff = torch.where(finite, (exp - act).abs(), torch.zeros_like(exp.real))
        within = finite & (diff <= atol + rtol * exp.abs())
        ok = within | inf_same | nan_same
        rel = diff / exp.abs().clamp_min(max(atol, 1e-12))  # near zero, relative error means little
        max_abs = max(max_abs, float(diff.max()) if diff.numel() else 0.0)
        if bool(finite.any()):
            max_rel = max(max_rel, float(rel[finite].max()))
        n_bad += int((~ok).sum())
        nan_problem += int((exp_nan ^ act_nan).sum())
        inf_problem += int((~finite & ~nan_same & ~inf_same & ~(exp_nan ^ act_nan)).sum())
    mismatch.max_abs_error, mismatch.max_rel_error = max_abs, max_rel
    if n_bad == 0:
        return mismatch
    mismatch.mismatched, mismatch.total = n_bad, total
    detail = f"{n_bad} of {total} values outside atol={atol:g}, rtol={rtol:g}"
    if nan_problem or inf_problem:
        detail += f" ({nan_problem} NaN and {inf_problem} Inf mismatches)"
    mismatch.problem = detail + f"; max abs error {mismatch.max_abs_error:.3g}"
    return mismatch


def all_finite(leaves: list[Any], on: torch.device | None = None) -> bool:
    """No NaN or Inf in any floating-point leaf (checked chunk by chunk on `on`)."""
    on = on or torch.device("cpu")
    for x in leaves:
        if isinstance(x, _Tensor) and (x.is_floating_point() or x.is_complex()):
            flat = x.detach().reshape(-1)
            for start in range(0, flat.numel(), COMPARE_CHUNK):
                if not bool(torch.isfinite(flat[start:start + COMPARE_CHUNK].to(on)).all()):
                    return False
    return True


def _scalars_close(expected: Any, actual: Any, atol: float, rtol: float) -> bool:
    if isinstance(expected, bool) or not isinstance(expected, (int, float)):
        return expected == actual
    if not isinstance(actual, (int, float)) or isinstance(actual, bool):
        return False
    if math.isnan(expected) or math.isnan(actual):
        return math.isnan(expected) and math.isnan(actual)
    return abs(expected - actual) <= atol + rtol * abs(expected)


def _describe(value: Any) -> str:
    if isinstance(value, _Tensor):
        return f"a tensor of shape {list(value.shape)}"
    return f"{type(value).__name__} {value!r}"[:80]


# What the child samples of each timed call it picks (timed_calls.TimedOutputSamples).
SAMPLED_LEAVES, SAMPLED_POSITIONS = 8, 16


@dataclass(frozen=True)
class SampledLeaf:
    """One output of the reference on a timed input set, as far as a window's samples
    read it: its shape and its values (a complex value's magnitude) at the positions
    sampled."""

    shape: list[int]
    values: dict[int, float]

    @classmethod
    def of(cls, answer: dict[str, Any]) -> SampledLeaf | None:
        """From the reference child's answer (None: the leaf is no tensor)."""
        if answer.get("shape") is None:
            return None
        positions, values = answer["positions"], answer["values"]
        if len(positions) != len(values):
            raise ValueError("positions and values differ in number")
        return cls([int(d) for d in answer["shape"]],
                   {int(p): float(v) for p, v in zip(positions, values, strict=True)})

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


def timed_outputs_problem(answers: dict[int, list[SampledLeaf | None]],
                          taken: list[dict[str, Any]], timed_calls: int, atol: float,
                          rtol: float, own_error: dict[int, float] | None = None) -> str | None:
    """Why the sampled outputs of timed calls are not the reference's for the same inputs
    (None when they are). The child sampled them at positions it drew after each call;
    `answers` holds the reference's outputs per input set at those positions
    (ReferenceRun.timed_answers). `own_error`: per
    output, how far the reference's own rounding was seen to take it from a float64 run
    (own_rounding), allowed beside `atol`."""
    if timed_calls >= 20 and not taken:
        return (f"none of its {timed_calls} timed calls' outputs came back to be checked "
                "(half are sampled, at random)")
    for item in taken:
        k, call = item.get("set"), item.get("call")
        if not isinstance(k, int) or k not in answers:
            return f"timed call {call}: reported for an unknown input set"
        expected = answers[k]
        leaves = item.get("leaves") or []
        if len(leaves) != len(expected):
            return (f"timed call {call} returned {len(leaves)} outputs, "
                    f"expected {len(expected)}")
        for index, (exp, got) in enumerate(zip(expected, leaves, strict=True)):
            problem = _sampled_leaf_problem(exp, got, atol + (own_error or {}).get(index, 0.0),
                                            rtol)
            if problem:
                return (f"timed call {call}, output {index}: {problem}; timed outputs must "
                        "be the model's answers for the inputs of each call")
    return None


def _sampled_leaf_problem(expected: SampledLeaf | None, got: Any, atol: float,
                          rtol: float) -> str | None:
    if expected is None:
        return None  # plain scalars are compared in the trials
    if not isinstance(got, dict) or got.get("shape") != expected.shape:
        shape = got.get("shape") if isinstance(got, dict) else None
        return f"shape {shape} != expected {expected.shape}"
    positions, values = got.get("positions") or [], got.get("values") or []
    n = expected.numel
    if (len(positions) != min(SAMPLED_POSITIONS, n) or len(values) != len(positions)
            or not all(isinstance(p, int) and p in expected.values for p in positions)):
        return "the sample of its values is malformed"
    if not positions:
        return None
    exp = torch.tensor([expected.values[p] for p in positions], dtype=torch.float64)
    try:
        act = torch.tensor([float(v) for v in values], dtype=torch.float64)
    except (TypeError, ValueError):
        return "the sample of its values is malformed"
    close = torch.isclose(act, exp, rtol=rtol, atol=atol, equal_nan=True)
    if bool(close.all()):
        return None
    worst = float((act - exp).abs().nan_to_num(math.inf).max())
    return (f"{int((~close).sum())} of {len(positions)} sampled values differ from the "
            f"reference's (max abs error {worst:.3g})")


@dataclass(frozen=True)
class SlowProbes:
    """Every timed call on an input set never seen before (a probe) took far longer than
    the median call. `reused`: that is answers reused (`rejected`): the window was steady,
    or the probes were slow beyond even its tail; else only the candidate's own calls were
    unsteady, and the figure is withheld. `slower`: what was seen, without what it means
    (a second window's message names it)."""

    slower: str
    conclusion: str
    reused: bool

    @property
    def message(self) -> str:
        return self.slower + self.conclusion


def slow_probes(samples: list[float], probe_samples: list[float],
                reference_samples: list[float] | None = None) -> SlowProbes | None:
    """Whether the timings show answers reused rather than computed: the fastest probe (so
    that a burst of host load on one probe does not look like reuse) against the median
    call. Against the 90th percentile, a memo that computed about one hit in eight
    honestly lifted that tail to an honest call's time while its median stayed fast, and
    was `ok` at 8x on the CPU (tests/candidates/memo_shapes_its_tail); against the median
    a memo must make half its calls take a third of an honest one's, so what it can fake
    is bounded by _REUSE_RATIO.

    A window on a loaded host, though, has a tail of calls the scheduler held up, and with
    at most protocol.PROBE_SETS probes all of them may fall there: on the 2-core host with
    two busy processes beside it an honest candidate's probes took up to 32x its median,
    in windows whose reference's calls were steady by their quartiles
    (bench/results/probe-cost-centred-load2.md). So slow probes are reuse where the
    window was steady (the reference's calls, beyond the candidate's reach, and the
    candidate's own, up to their 90th percentile), or where the fastest probe took far
    longer than even 90% of the other calls. Where only the candidate's own calls were
    not steady, the figure is withheld: a memo that lifts its own tail to pass gains no
    figure by it. Where the reference's were not, the host was loaded, and the tail is
    the bar (a memo that shapes its tail may pass there, among figures the load makes
    loose anyway: `host_busy`). A window that shows reuse is timed once more on the
    probe sets left (candidate_windows.looked_again_for_reuse), for two such windows by
    chance are rarer than one."""
    if len(probe_samples) < 2 or len(samples) < REUSE_MIN_SAMPLES:
        return None
    typical = statistics.median(samples)
    fastest_probe = min(probe_samples)
    if fastest_probe <= _REUSE_RATIO * typical + _REUSE_SLACK_MS:
        return None
    reference_steady = bool(reference_samples) and len(reference_samples) >= REUSE_MIN_SAMPLES \
        and _steady(statistics.quantiles(reference_samples, n=4)[-1],
                    statistics.median(reference_samples))
    tail = statistics.quantiles(samples, n=10)[-1]
    slower = (f"every timed call on inputs it had not seen before took over "
              f"{fastest_probe / typical:.1f}x as long as the median call "
              f"({fastest_probe:.3g} ms vs {typical:.3g} ms)")
    reused = ": answers for inputs seen before are reused, not computed"
    if reference_steady and _steady(tail, typical):
        return SlowProbes(slower, reused, reused=True)
    if fastest_probe > _REUSE_RATIO * tail + _REUSE_SLACK_MS:  # beyond even the slow tail
        return SlowProbes(f"{slower}, and {fastest_probe / tail:.1f}x as long as 90% of the "
                          "others", reused, reused=True)
    if not reference_steady:  # the host's load, seen in the reference: the tail is the bar
        return None
    return SlowProbes(slower, ", in a window where its own calls were not steady though the "
                      "reference's were: the figure is withheld", reused=False)


# the reference's calls in a window are steady where their third quartile is within this
# of their median (a few percent on a quiet host; 15x on the 2-core host beside a CI run),
# the candidate's where their 90th percentile is; each with _REUSE_SLACK_MS, for calls of
# microseconds whose tail is the clock's
STEADY_SPREAD = 1.5


def _steady(quantile: float, median: float) -> bool:
    return quantile <= STEADY_SPREAD * median + _REUSE_SLACK_MS


def withheld_probes_problem(timed_calls: int, probes_timed: int) -> str | None:
    """Why a child's timed calls (over all its windows: a window timed again after a burst
    of load finds the probes used in the first) show its probes withheld: the child draws
    a probe for the next call after each timed one (one in timed_calls.PROBE_ONE_IN), so in
    WITHHELD_MIN_CALLS timed calls or more an honest child takes at least two (of
    protocol.PROBE_SETS, more than two). A candidate that set its
    rotation's probe count to 0 (or closed the seal) was timed on the rotation's sets
    alone, and with under two probe samples the reuse check never ran
    (tests/candidates/starves_probes: `ok` at about 70x on the CPU before)."""
    if probes_timed >= 2 or timed_calls < WITHHELD_MIN_CALLS:
        return None
    return (f"only {probes_timed} of its {timed_calls} timed calls took inputs never seen "
            "before, where an honest child's would take two or more but for a chance under "
            "one in a million: the probes were withheld from its timing")


# The fewest timed calls in which fewer than two probes cannot be chance: with one draw
# in 6 after each call but the first (timed_calls.PROBE_ONE_IN), none or one of n - 1 draws
# has (5/6)^(n-1) + (n-1)/6 * (5/6)^(n-2) < 1e-6 from n = 94 (tests/test_guards.py holds
# the two together)
WITHHELD_MIN_CALLS = 94

_REUSE_RATIO, _REUSE_SLACK_MS = 3.0, 0.05
# timed calls the reuse check needs; a window never gives up on a candidate before it has
# them (timing_window.time_interleaved), so a memo that looks slow while it fills is still caught
REUSE_MIN_SAMPLES = 8



def weak_check(expected: list[list[Any]], trials: int, atol: float, rtol: float) -> str | None:
    """Why the check tells little for this task, or None: the reference's outputs were the
    same within the tolerance for every trial on the task's own inputs (the configured
    `trials` and the one after timing), so a candidate that answers one constant passes
    them all. Level 2's 9_Matmul_Subtract_Multiply_ReLU is such a task: its linear layer's
    outputs stay below the value it subtracts, and the ReLU makes every output 0 on its
    own inputs (bench/results/conditioning-level2-sample.md); a loss averaged over a large
    batch, the same to within 1% for every draw, is another. Only the shifted trial, whose
    inputs are larger, can tell such a candidate, where its outputs differ; where they do
    not either, nothing does. `expected`: each trial's output leaves, in trial order."""
    own = [expected[i] for i in (*range(trials), trials + 1) if i < len(expected)]
    if len(expected) < trials + 2 or len(own) < 2:
        return None
    if not all(outputs_alike(own[0], other, atol, rtol) for other in own[1:]):
        return None
    if not outputs_alike(own[0], expected[trials], atol, rtol):
        return (f"the reference gave the same outputs (within the tolerance) for all "
                f"{len(own)} trials on the task's own inputs: only the trial on shifted "
                "inputs tells a candidate that answers a constant")
    return (f"the reference gave the same outputs (within the tolerance) for all "
            f"{len(own) + 1} trials, the shifted one too: a candidate that answers a "
            "constant passes every check")


def outputs_alike(first: list[Any], other: list[Any], atol: float, rtol: float) -> bool:
    """Two trials' output leaves are the same within the tolerance (NaN as NaN), looked at
    a chunk at a time and left at the first difference: for a task whose outputs follow
    its inputs that is the first chunk of the first output."""
    if len(first) != len(other):
        return False
    for a, b in zip(first, other, strict=True):
        if not (isinstance(a, _Tensor) and isinstance(b, _Tensor)):
            if isinstance(a, _Tensor) or isinstance(b, _Tensor) or not _scalars_close(
                    a, b, atol, rtol):
                return False
            continue
        if a.shape != b.shape or a.dtype != b.dtype:
            return False
        inexact = a.is_floating_point() or a.is_complex()
        for x, y in chunks(a, b, torch.device("cpu")):
            same = (torch.isclose(y, x, rtol=rtol, atol=atol, equal_nan=True).all() if inexact
                    else torch.equal(x, y))
            if not bool(same):
                return False
    return True
