"""What the evaluator returns: a Verdict per candidate, TimingStats per timed module."""

from __future__ import annotations

import re
import statistics
from typing import Literal

from pydantic import BaseModel, Field

from pike.evaluate.profile import ProfileSummary

Status = Literal[
    "ok", "compile_error", "runtime_error", "incorrect", "timeout", "crashed", "rejected"
]
# The last three are a live child's advisory requests (a profile, the reference's work
# count and float64 run): a child that ends in one is reported there, not as a
# validation error of this model.
Phase = Literal["setup", "load", "init", "check", "timing", "build", "cleanup", "profile",
                "work", "exact"]


class TimingStats(BaseModel):
    """Per-call times in milliseconds."""

    median_ms: float
    q1_ms: float
    q3_ms: float
    min_ms: float
    mean_ms: float
    count: int

    @classmethod
    def from_samples(cls, samples_ms: list[float]) -> TimingStats:
        ordered = sorted(samples_ms)
        if len(ordered) >= 2:
            q1, _, q3 = statistics.quantiles(ordered, n=4, method="inclusive")
        else:
            q1 = q3 = ordered[0]
        return cls(
            median_ms=statistics.median(ordered),
            q1_ms=q1,
            q3_ms=q3,
            min_ms=ordered[0],
            mean_ms=statistics.fmean(ordered),
            count=len(ordered),
        )

    def spread(self) -> float | None:
        """The quartiles' distance over the median (how steady the calls were); None
        without a median."""
        return (self.q3_ms - self.q1_ms) / self.median_ms if self.median_ms > 0 else None


class OutputMismatch(BaseModel):
    """One output leaf of one trial that did not match the reference."""

    trial: int
    output: int = Field(description="index of the output leaf (flattened)")
    problem: str
    expected_shape: list[int] | None = None
    actual_shape: list[int] | None = None
    max_abs_error: float | None = None
    max_rel_error: float | None = None
    mismatched: int | None = Field(None, description="elements outside tolerance")
    total: int | None = None


class Verdict(BaseModel):
    """The judgement of one candidate against its task's reference."""

    status: Status
    message: str = ""
    phase: Phase | None = Field(None, description="the phase where the candidate failed")
    trials_passed: int = 0
    trials: int = 0
    max_abs_error: float | None = None
    max_rel_error: float | None = None
    mismatches: list[OutputMismatch] = Field(default_factory=list)
    rounding_passed: int | None = Field(
        None, description="values of the trials outside tolerance of the reference that "
        "passed by the float64 rule: no further from a float64 run than the reference "
        "itself (own_rounding)")
    runtime: TimingStats | None = None
    reference: TimingStats | None = None
    speedup: float | None = None
    # The reference's time in this verdict's window was off the run's usual time even when
    # timed again: the speedup is withheld (no search takes it as its best) and both
    # figures are kept.
    # Set on a search's best: `speedup` comes from the window that confirmed it (timed
    # again beside the other top candidates and eager); the search's own figure is kept.
    confirmed: bool = False
    search_speedup: float | None = None
    noisy: bool = False
    noisy_speedup: float | None = None
    reference_usual_ms: float | None = None
    weak_check: str = Field(
        "", description="why the correctness check tells little for this task: the "
        "reference's outputs were the same within the tolerance for every trial "
        "(check.weak_check)")
    host_busy: str = Field(
        "", description="on a CPU: the reference or the candidate waited for a core for a "
        "quarter of its timed blocks' time or more (the kernel's count), and by how much: "
        "the speedup measured the host's load too (candidate_windows.waited_for_cores)")
    noisy_why: str = Field(
        "", description="why the figure is withheld where it is not the reference's drift: "
        "its calls on never-seen inputs were slow in a window where its own calls were not "
        "steady though the reference's were (check.slow_probes)")
    wall_clock_factor: float | None = Field(
        None, description="the candidate's reported times were multiplied by this: its "
        "timing blocks took longer by the parent's clock than it reported, beyond what the "
        "reference's blocks did (wall_clock_check.FIGURE_TOLERANCE)")
    timed_rounds: int | None = Field(
        None, description="the timing window ended after this many of its rounds: the "
        "candidate was over `timing.give_up_slower_than` times slower than the reference, "
        "or (`behind_best`) over `timing.give_up_behind_best` times behind its search's "
        "best; too few calls for every timing guard, so no search takes it as its best")
    behind_best: float | None = Field(
        None, description="where the window ended because the candidate could not be its "
        "search's best: that best's speedup at the time")
    window_candidates: int | None = Field(
        None, description="its window timed this many candidates of the task (itself "
        "included) beside one eager, each against eager (`timing.share_window`); None: "
        "a window of its own")
    device: str = ""
    device_name: str = ""
    torch_version: str = ""
    host: str = ""
    built_on: str = Field(
        "", description="where both models were built: 'cpu' or 'device' (eval.construct_on "
        "as the task's reference settled it; '' in verdicts from before 2026-12-03)")
    flags_changed: dict[str, str] = Field(
        default_factory=dict, description="backend flags the candidate changed (TF32, ...)")
    guards: dict[str, str] = Field(
        default_factory=dict, description="each guard that ran and what it saw (--explain)")
    phase_seconds: dict[str, float] = Field(
        default_factory=dict, description="wall time of each evaluator phase"
    )
    steps: dict[str, float] = Field(
        default_factory=dict, description="where the evaluation's wall time went (seconds): "
        "the parent's steps, and the candidate child's as reported by it (`child.`)")
    floor_ms: float | None = Field(
        None, description="the least time the task can take on this GPU (pike.floor)")
    times_floor: float | None = Field(None, description="runtime as a multiple of the floor")
    profile: ProfileSummary | None = Field(
        None, description="where the time goes (EvalConfig.profile); informs prompts only")

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def rankable(self) -> bool:
        """Correct, and a figure a search may take for its best: not `noisy` (the reference
        drifted in its window) and not cut short (`timed_rounds`: too few calls for every
        timing guard). store.best asks the same in SQL."""
        return self.ok and not self.noisy and self.timed_rounds is None

    @property
    def comparable(self) -> bool:
        """Correct, not `noisy`, and timed in full or cut short only for being behind its
        search's best (`behind_best`): a figure to order candidates by (the offline
        search's partners, the compile mode beside the confirming window), though only a
        rankable one is taken for a best. One cut short as over three times slower than
        the reference is not."""
        return (self.ok and not self.noisy
                and (self.timed_rounds is None or self.behind_best is not None))


# CUDA's libraries say it in their own words when they cannot allocate their workspace:
# cuBLAS's handle (CUBLAS_STATUS_ALLOC_FAILED from cublasCreate) failed a level2 reference
# with 16 evaluations on an H200, and the task with it
_OUT_OF_MEMORY = re.compile(r"out of memory|\b(CUBLAS|CUDNN|CUSOLVER|CUSPARSE)_STATUS_ALLOC_FAILED"
                            r"|\bCUFFT_ALLOC_FAILED", re.IGNORECASE)


def slower_than_eager(speedup: float | None) -> bool:
    """A correct candidate's figure below eager: a user keeps the reference rather than
    it, so a solution set (pike's, or bench/offline_set.py's) has no file for it and
    counts 1.0x in its claim (the run's own summary and report keep the figure the search
    found, marked)."""
    return speedup is not None and speedup < 1.0


def says_out_of_memory(message: str | None) -> bool:
    """The failure's message says the GPU had no memory left (its own use or its
    neighbours': on a GPU shared by several evaluations the two read the same)."""
    return bool(_OUT_OF_MEMORY.search(message or ""))


def out_of_device_memory(verdict: Verdict) -> bool:
    """The candidate failed because the GPU had no memory left (its own or its neighbours'),
    or the host's out-of-memory killer took its child (sandbox.ChildExit)."""
    return (verdict.status in ("runtime_error", "crashed")
            and says_out_of_memory(verdict.message))
