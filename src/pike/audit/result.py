"""What an audit returns: a TaskAudit per task and aggregates that never hide a failure."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field

from pike.evaluate.baseline import Baseline
from pike.evaluate.verdict import Status, TimingStats, Verdict
from pike.floor import floor
from pike.report.data import geomean
from pike.solution_set import compile_speedups

# a Verdict's status, or: no file for the task (missing), the task's reference failed (error)
AuditStatus = Status | Literal["missing", "error"]

# The quartiles of a timing this far apart, over its median, make its figure unsteady. The
# H100's level1 audit timed 12_Matmul_with_diagonal_matrices at 0.75x of eager with the
# file's calls spread 70% and every mode's over 45%; the search had timed it at 1.26x with
# a spread of 4%. Kernel-bound timings spread under 6% there, launch-bound eager up to 70%.
UNSTEADY_SPREAD = 0.25


class TrialError(BaseModel):
    """The worst error of one failing trial, over its output leaves."""

    trial: int
    label: str = Field(description="'trial N', 'shifted inputs' or 'after timing'")
    problem: str
    max_abs_error: float | None = None
    max_rel_error: float | None = None


class TaskAudit(BaseModel):
    task: str
    task_id: int | None = None
    file: str | None = Field(None, description="the solution file, relative to SOLUTIONS")
    status: AuditStatus
    phase: str | None = Field(None, description="where it failed (the failing check)")
    message: str = ""
    trials_passed: int = 0
    trials: int = 0
    seed_dependent: bool = Field(
        False, description="incorrect, yet some trials (other seeds) passed")
    max_abs_error: float | None = None
    max_rel_error: float | None = None
    trial_errors: list[TrialError] = Field(default_factory=list)
    rounding_passed: int | None = Field(
        None, description="values outside tolerance of the reference that passed by the "
        "float64 rule (Verdict.rounding_passed)")
    speedup: float | None = Field(None, description="over eager; correct files only")
    weak_check: str = Field("", description="why the check tells little for this task "
                            "(Verdict.weak_check)")
    withheld: str = Field("", description="correct, but no figure: why it was withheld "
                          "(a noisy window); the task counts 1.0x")
    compile_speedups: dict[str, float] = Field(
        default_factory=dict, description="mode -> speedup over that torch.compile mode")
    precision: list[str] = Field(default_factory=list, description="see audit/precision.py")
    transformations: list[str] = Field(
        default_factory=list, description="the offline transformations the file says it "
        "applies (its marker line), e.g. a torch.compile mode")
    claimed_speedup: float | None = Field(None, description="what the set's manifest says")
    task_changed: bool = Field(False, description="the task file differs from the manifest's")
    candidate_id: int | None = None
    built_on: str = Field("", description="where both models were built: 'cpu' or 'device' "
                          "(eval.construct_on as the task's reference settled it)")
    floor_ms: float | None = Field(None, description="the least time the task can take on "
                                   "its GPU at its own precision (pike.floor; the baseline's)")
    lowp_floor_ms: float | None = Field(None, description="the same with bf16/fp16 tensor "
                                        "cores, which a file within tolerance may use")
    times_floor: float | None = Field(None, description="the correct file's median time as a "
                                      "multiple of its floor (1.0 = at the floor): "
                                      "lowp_floor_ms where it computes in lower precision "
                                      "(`precision`), else floor_ms")
    floor_is_lowp: bool = Field(False, description="times_floor is over lowp_floor_ms")
    eager_times_floor: float | None = Field(None, description="eager's, the same way")
    spreads: dict[str, float] = Field(
        default_factory=dict, description="the timings the task's figures rest on, each "
        "one's IQR over its median: 'file' and 'eager' in the file's window, and 'baseline "
        "MODE' for each mode of the task's baseline")

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def fastest_compile_mode(self) -> str | None:
        """The torch.compile mode the file is slowest against: the task's fastest."""
        if not self.compile_speedups:
            return None
        return min(self.compile_speedups, key=lambda m: self.compile_speedups[m])

    def is_its_fastest_compile_mode(self) -> bool:
        """The file is the very torch.compile mode it is compared with (an offline file
        of that mode): a figure below 1.0x there compares two builds of the same code."""
        fastest = self.fastest_compile_mode()
        return fastest is not None and fastest in self.transformations

    def unsteady(self) -> dict[str, float]:
        """The spreads above UNSTEADY_SPREAD: figures that may move when measured again."""
        return {what: s for what, s in self.spreads.items() if s > UNSTEADY_SPREAD}

    def counted_speedup(self) -> float:
        """What the task adds to the all-task geomean: 1.0x unless correct and timed."""
        return self.speedup if self.ok and self.speedup else 1.0


class ModeGeomean(BaseModel):
    mode: str
    geomean: float = Field(description="over the tasks where the mode ran; no correct file "
                           "counts 1.0x (the user keeps torch.compile)")
    tasks: int


class FloorGeomean(BaseModel):
    geomean: float = Field(description="the correct files' median times over their floors")
    eager: float = Field(description="eager's over the same tasks' floors")
    tasks: int
    lowp_tasks: int = Field(0, description="of them, files held to the tensor-core floor")


class Aggregates(BaseModel):
    tasks: int
    correct: int = Field(description="files judged correct")
    failed: int = Field(description="files judged not correct")
    missing: int
    errors: int = Field(description="tasks whose reference failed")
    geomean_all: float = Field(description="over ALL tasks, failing and missing count 1.0x")
    geomean_correct: float | None = Field(None, description="over correct (timed) files only")
    modes: list[ModeGeomean] = Field(default_factory=list)
    best_compile: ModeGeomean | None = Field(
        None, description="over each task's fastest torch.compile mode (mode 'best')")
    below_best_compile: dict[str, float] = Field(
        default_factory=dict, description="correct files slower than their task's fastest "
        "torch.compile mode: task -> speedup over it")
    times_floor: FloorGeomean | None = Field(
        None, description="over the correct files whose task has a floor and an eager time")
    unsteady: list[str] = Field(default_factory=list, description="tasks with a timing "
                                "spread above UNSTEADY_SPREAD (TaskAudit.unsteady)")
    claimed_geomean: float | None = None
    claimed_source: str | None = None


class AuditResult(BaseModel):
    solutions: str
    tasks_dir: str
    run_dir: str
    matched_by: str
    date: str
    device: str = ""
    device_name: str = ""
    torch_version: str = ""
    host: str = ""
    protocol: str = Field("", description="the correctness protocol the files were judged by")
    tasks: list[TaskAudit]
    aggregates: Aggregates
    warnings: list[str] = Field(default_factory=list)
    open_tasks: list[str] = Field(default_factory=list, description="tasks not audited yet: "
                                  "left by a time limit (stop_after) for --resume, or judged "
                                  "in none of the runs a --combine gathered")
    combined_from: list[str] = Field(default_factory=list, description="the audit runs "
                                     "this result gathers (pike audit --combine), if any")


def task_audit(base: TaskAudit, verdict: Verdict, baseline: Baseline | None) -> TaskAudit:
    """Fill a task's audit from its file's verdict."""
    speedup = verdict.speedup if verdict.ok else None
    return base.model_copy(update={
        "status": verdict.status, "phase": verdict.phase, "message": verdict.message,
        "trials_passed": verdict.trials_passed, "trials": verdict.trials,
        "seed_dependent": not verdict.ok and 0 < verdict.trials_passed < verdict.trials,
        "max_abs_error": verdict.max_abs_error, "max_rel_error": verdict.max_rel_error,
        "trial_errors": trial_errors(verdict), "rounding_passed": verdict.rounding_passed,
        "speedup": speedup, "weak_check": verdict.weak_check, "withheld": _withheld(verdict),
        "compile_speedups": compile_speedups(speedup, baseline),
        "spreads": _spreads(verdict, baseline),
        **_floor_distances(verdict, baseline, lowp=bool(_TENSOR_CORE & set(base.precision)))})


def _spreads(verdict: Verdict, baseline: Baseline | None) -> dict[str, float]:
    if not verdict.ok:  # counted 1.0x over eager and every mode: no figure to move
        return {}
    timings: list[tuple[str, TimingStats | None]] = [
        ("file", verdict.runtime), ("eager", verdict.reference),
        *((f"baseline {m.mode}", m.stats) for m in (baseline.modes if baseline else []))]
    return {what: spread for what, t in timings
            if t is not None and (spread := t.spread()) is not None}


def _withheld(verdict: Verdict) -> str:
    """Why a correct file has no figure, or "" (a failed or timed file)."""
    if not verdict.ok or verdict.speedup is not None:
        return ""
    then = (f", {verdict.noisy_speedup:.3g}x in that window"
            if verdict.noisy_speedup is not None else "")
    if verdict.noisy_why:
        return verdict.noisy_why + then
    if verdict.noisy:
        return "the reference ran off its usual time in the window" + then
    return "it was not timed"


# the markers (audit/precision.py) of a file whose math may run on bf16/fp16 tensor cores:
# the floor those allow bounds it; fp8 has no peaks on file, and its floor is no bound
_TENSOR_CORE = {"tf32", "fp16", "bf16", "autocast"}


def _floor_distances(verdict: Verdict, baseline: Baseline | None, lowp: bool
                     ) -> dict[str, float | bool | None]:
    """How far the file and eager are from the least time the task could take on the
    card (its baseline's floor): where the audit says what holds a figure back, a task at
    2x its floor has little left and one at 30x has much. A file that computes in lower
    precision (`lowp`: TF32, fp16, bf16 detected) is held to the tensor-core floor, which
    its fp32 floor does not bound."""
    if baseline is None:
        return {}
    # worked out again from the counted work: a baseline keeps the floor of the pike that
    # measured it, and the floor's model has since learnt (TF32 convolutions)
    found = (floor(baseline.work, baseline.device_name) if baseline.work is not None
             and baseline.device_name else baseline.floor)
    if found is None or found.ms <= 0:
        return {}
    eager = baseline.eager_ms()
    runtime = verdict.runtime.median_ms if verdict.ok and verdict.runtime is not None else None
    lowp = lowp and found.lowp_ms < found.ms  # an fp16 task's two floors are one
    own = found.lowp_ms if lowp else found.ms
    return {"floor_ms": found.ms, "lowp_floor_ms": found.lowp_ms, "floor_is_lowp": lowp,
            "times_floor": runtime / own if runtime and own > 0 else None,
            "eager_times_floor": eager / found.ms if eager else None}


def trial_errors(verdict: Verdict) -> list[TrialError]:
    """The verdict's mismatches grouped by trial, each trial's worst errors."""
    by_trial: dict[int, list] = {}
    for m in verdict.mismatches:
        by_trial.setdefault(m.trial, []).append(m)
    found = []
    for trial, leaves in sorted(by_trial.items()):
        abs_errors = [m.max_abs_error for m in leaves if m.max_abs_error is not None]
        rel_errors = [m.max_rel_error for m in leaves if m.max_rel_error is not None]
        found.append(TrialError(
            trial=trial, label=_trial_label(trial, verdict.trials), problem=leaves[0].problem,
            max_abs_error=max(abs_errors) if abs_errors else None,
            max_rel_error=max(rel_errors) if rel_errors else None))
    return found


def _trial_label(trial: int, trials: int) -> str:
    if trials and trial == trials:
        return "shifted inputs (a drawn scale and shift)"
    if trials and trial == trials + 1:
        return "after timing (new values in the same tensors)"
    return f"trial {trial}"


def aggregate(tasks: list[TaskAudit], baselines: dict[str, Baseline],
              claim: tuple[float, str] | None) -> Aggregates:
    timed = [t.speedup for t in tasks if t.ok and t.speedup]
    return Aggregates(
        tasks=len(tasks), correct=sum(1 for t in tasks if t.ok),
        failed=sum(1 for t in tasks if t.status not in ("ok", "missing", "error")),
        missing=sum(1 for t in tasks if t.status == "missing"),
        errors=sum(1 for t in tasks if t.status == "error"),
        geomean_all=geomean([t.counted_speedup() for t in tasks]),
        geomean_correct=geomean(timed) if timed else None,
        modes=_mode_geomeans(tasks, baselines),
        best_compile=_best_mode_geomean(tasks, baselines),
        below_best_compile={t.task: over for t in tasks
                            if (over := _over_best_mode(t, baselines)) is not None and over < 1.0},
        times_floor=_floor_geomean(tasks),
        unsteady=[t.task for t in tasks if t.unsteady()],
        claimed_geomean=claim[0] if claim else None, claimed_source=claim[1] if claim else None)


def _floor_geomean(tasks: list[TaskAudit]) -> FloorGeomean | None:
    counted = [t for t in tasks if t.ok and t.times_floor and t.eager_times_floor]
    if not counted:
        return None
    return FloorGeomean(geomean=geomean([t.times_floor for t in counted]),
                        eager=geomean([t.eager_times_floor for t in counted]),
                        tasks=len(counted), lowp_tasks=sum(t.floor_is_lowp for t in counted))


def _working_modes(baseline: Baseline | None) -> list[str]:
    """The torch.compile modes of a task's baseline that ran and were timed."""
    return [m.mode for m in baseline.modes if m.mode != "eager" and m.speedup_vs_eager
            and not m.error] if baseline else []


def _unmeasured_without_file(task: TaskAudit, baselines: dict[str, Baseline]) -> bool:
    """A task the audit measured no baseline for because it has no file to judge (a set
    entry kept as the reference, or none): it counts 1.0x over every mode, as the user
    keeping torch.compile, rather than leaving the compile geomeans. On the H100's level1
    set, three such tasks left out raised the geomean over the fastest mode from 1.32x to
    1.43x. A task whose reference failed stays out: no compile mode of it can be
    expected to run."""
    return task.task not in baselines and task.status == "missing"


def _mode_geomeans(tasks: list[TaskAudit], baselines: dict[str, Baseline]) -> list[ModeGeomean]:
    modes: dict[str, list[float]] = {}
    for task in tasks:
        for mode in _working_modes(baselines.get(task.task)):
            modes.setdefault(mode, []).append(task.compile_speedups.get(mode, 1.0))
    unmeasured = sum(1 for t in tasks if _unmeasured_without_file(t, baselines))
    for values in modes.values():
        values += [1.0] * unmeasured
    return [ModeGeomean(mode=mode, geomean=geomean(values), tasks=len(values))
            for mode, values in modes.items()]


def _over_best_mode(task: TaskAudit, baselines: dict[str, Baseline]) -> float | None:
    """The correct file's speedup over its task's fastest working torch.compile mode."""
    working = _working_modes(baselines.get(task.task))
    over = [task.compile_speedups[m] for m in working if m in task.compile_speedups]
    return min(over) if task.ok and over else None


def _best_mode_geomean(tasks: list[TaskAudit], baselines: dict[str, Baseline]
                       ) -> ModeGeomean | None:
    values = []
    for task in tasks:
        if _working_modes(baselines.get(task.task)):
            over = _over_best_mode(task, baselines)
            values.append(over if over is not None else 1.0)
        elif _unmeasured_without_file(task, baselines):
            values.append(1.0)
    return ModeGeomean(mode="best", geomean=geomean(values), tasks=len(values)) if values else None


def relative(path: Path, folder: Path) -> str:
    try:
        return path.resolve().relative_to(folder.resolve()).as_posix()
    except ValueError:
        return str(path)
