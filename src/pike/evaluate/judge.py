"""The evaluator's entry points: evaluate() a candidate, measure_baselines() of a task.

The reference runs in one child and records inputs and expected outputs; each candidate
runs in another child that sees only the inputs. Outputs are compared here, in the
parent, where candidate code cannot reach.
"""

from __future__ import annotations

import hashlib
import logging
import shutil
import signal
import tempfile
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from pike.config import EvalConfig, RunConfig
from pike.errors import EvaluatorError, TaskError
from pike.evaluate import check
from pike.evaluate.protocol import ChildRequest
from pike.evaluate.sandbox import (
    ChildExit,
    ChildProcess,
    MemoryExceeded,
    PhaseTimeout,
    scrubbed_environment,
)
from pike.evaluate.verdict import OutputMismatch, TimingStats, Verdict
from pike.task import Task

log = logging.getLogger(__name__)

_REFERENCE_CACHE_SIZE = 2


def resolve_device(device: str | None) -> str:
    if device:
        if device.startswith("cuda") and not torch.cuda.is_available():
            raise EvaluatorError(f"device {device} asked for, but CUDA is not available here")
        return "cuda:0" if device == "cuda" else device
    return "cuda:0" if torch.cuda.is_available() else "cpu"


def as_eval_config(config: EvalConfig | RunConfig | None) -> EvalConfig:
    if config is None:
        return EvalConfig()
    return config.eval if isinstance(config, RunConfig) else config


def _cache_root(cfg: EvalConfig) -> Path:
    root = cfg.build_cache or Path.home() / ".cache" / "pike" / "build"
    root.mkdir(parents=True, exist_ok=True)
    return root


@dataclass
class ChildReport:
    """What one child run produced, before it is turned into a Verdict."""

    env: dict[str, str] = field(default_factory=dict)
    failure: Verdict | None = None
    timed: dict[str, list[float] | str] = field(default_factory=dict)
    phase_seconds: dict[str, float] = field(default_factory=dict)
    leftovers: list[str] = field(default_factory=list)


def _run_child(request: ChildRequest, work_dir: Path, cfg: EvalConfig,
               on_checked: Callable[[], bool], build_key: str) -> ChildReport:
    """Drive one child through its phases; every way it can end becomes part of the report."""
    cache_root = _cache_root(cfg)
    env = scrubbed_environment(work_dir, uuid.uuid4().hex, cache_root / build_key, cache_root)
    lim = cfg.limits
    timing_limit = lim.timing_seconds * max(1, len(request.time_modes))
    phase_limits = {"setup": lim.load_seconds, "load": lim.load_seconds,
                    "init": lim.load_seconds, "check": lim.check_seconds, "timing": timing_limit}
    report = ChildReport()
    with ChildProcess(request, work_dir, env, lim, phase_limits) as child:
        while True:
            event = child.receive()
            if not isinstance(event, dict):
                report.failure = _abnormal_end(event, child.phase)
                break
            kind = event.get("event")
            if kind == "env":
                report.env = {k: str(v) for k, v in event.items() if k != "event"}
            elif kind == "failure":
                report.failure = Verdict(status=event["status"], phase=event["phase"],
                                         message=event["message"])
                break
            elif kind == "checked":
                go_on = on_checked()
                child.send("time" if go_on else "stop")
                if not go_on:
                    break
            elif kind == "timed":
                report.timed[event["mode"]] = event.get("samples") or event.get("error", "")
            elif kind == "done":
                break
        child.enter_phase("cleanup")
        child.wait_exit(timeout=5.0)
        report.leftovers = child.leftover_processes()
        report.phase_seconds = child.phase_seconds
    return report


def _abnormal_end(event: ChildExit | PhaseTimeout | MemoryExceeded, phase: str) -> Verdict:
    if isinstance(event, PhaseTimeout):
        return Verdict(status="timeout", phase=event.phase,
                       message=f"no progress for {event.limit_s:g} s in phase '{event.phase}'")
    if isinstance(event, MemoryExceeded):
        return Verdict(status="crashed", phase=phase,
                       message=f"exceeded the memory limit: {event.used_bytes / 2**30:.1f} GiB "
                               f"used, limit {event.limit_bytes / 2**30:.1f} GiB")
    code = event.returncode
    if code is not None and code < 0:
        how = f"killed by signal {signal.Signals(-code).name}"
    elif code == 0:
        how = "exited with status 0 before reporting a result (os._exit or exit in candidate code?)"
    else:
        how = f"exited with status {code}"
    tail = f"\n{event.output_tail}" if event.output_tail else ""
    return Verdict(status="crashed", phase=phase, message=f"{how} during phase '{phase}'{tail}")


@dataclass
class ReferenceRun:
    """Inputs and expected outputs of a task's trials, plus its timings, kept for reuse."""

    inputs_dir: Path
    expected: list[list[Any]]
    timed: dict[str, list[float] | str]
    env: dict[str, str]
    _tmp: Path

    def __del__(self) -> None:
        shutil.rmtree(self._tmp, ignore_errors=True)


_references: OrderedDict[str, ReferenceRun] = OrderedDict()


def run_reference(task: Task, cfg: EvalConfig, device: str, modes: list[str]) -> ReferenceRun:
    """Run (or reuse) the task's reference: trial inputs, expected outputs, timings."""
    protocol = cfg.model_dump_json(include={"trials", "seed", "model_mode", "timing"})
    key = "|".join([task.sha256, device, protocol, ",".join(modes)])
    if key in _references:
        _references.move_to_end(key)
        return _references[key]
    tmp = Path(tempfile.mkdtemp(prefix="pike-ref-"))
    inputs_dir, expected_dir, work_dir = tmp / "inputs", tmp / "expected", tmp / "work"
    for d in (inputs_dir, expected_dir, work_dir):
        d.mkdir()
    request = ChildRequest(
        role="reference", module_path=str(task.path), class_names=["Model"],
        inputs_dir=str(inputs_dir), outputs_dir=str(expected_dir), device=device,
        trials=cfg.trials, seed=cfg.seed, model_mode=cfg.model_mode, timing=cfg.timing,
        time_modes=modes, task_sha256=task.sha256,
    )
    report = _run_child(request, work_dir, cfg, on_checked=lambda: bool(modes),
                        build_key="reference")
    if report.failure is not None:
        shutil.rmtree(tmp, ignore_errors=True)
        first_line = report.failure.message.strip().splitlines()[0] if report.failure.message else ""
        raise TaskError(f"{task.path}: reference failed in phase '{report.failure.phase}': "
                        f"{first_line}")
    expected = [_load_leaves(expected_dir / f"outputs_{i}.pt") for i in range(cfg.trials)]
    shutil.rmtree(expected_dir)  # expected outputs live only in this process from here on
    run = ReferenceRun(inputs_dir, expected, report.timed, report.env, tmp)
    _references[key] = run
    while len(_references) > _REFERENCE_CACHE_SIZE:
        _references.popitem(last=False)
    return run


def _load_leaves(path: Path) -> list[Any]:
    leaves = torch.load(path, weights_only=True)
    if not isinstance(leaves, list):
        raise ValueError("outputs file does not hold a list")
    return leaves


def evaluate(task: Task, candidate_source: str,
             config: EvalConfig | RunConfig | None = None) -> Verdict:
    """Judge a candidate: correctness on fresh inputs against the reference, then timing."""
    cfg = as_eval_config(config)
    device = resolve_device(cfg.device)
    started = time.monotonic()
    try:
        compile(candidate_source, "candidate.py", "exec")
    except SyntaxError as err:
        return Verdict(status="compile_error", phase="load", device=device,
                       message=f"candidate.py:{err.lineno}: SyntaxError: {err.msg}")
    modes = ["eager"] if cfg.time_candidate else []
    reference = run_reference(task, cfg, device, modes)
    tmp = Path(tempfile.mkdtemp(prefix="pike-cand-"))
    try:
        verdict = _judge_candidate(task, candidate_source, cfg, device, reference, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    verdict.phase_seconds["total"] = time.monotonic() - started
    return verdict


def _judge_candidate(task: Task, source: str, cfg: EvalConfig, device: str,
                     reference: ReferenceRun, tmp: Path) -> Verdict:
    work_dir, outputs_dir = tmp / "work", tmp / "outputs"
    work_dir.mkdir()
    outputs_dir.mkdir()
    candidate_path = work_dir / "candidate.py"
    candidate_path.write_text(source)
    request = ChildRequest(
        role="candidate", module_path=str(candidate_path), class_names=["ModelNew", "Model"],
        inputs_dir=str(reference.inputs_dir), outputs_dir=str(outputs_dir), device=device,
        trials=cfg.trials, seed=cfg.seed, model_mode=cfg.model_mode, timing=cfg.timing,
        time_modes=["candidate"] if cfg.time_candidate else [], task_sha256=task.sha256,
        task_size=task.path.stat().st_size,
    )
    correctness: list[Verdict] = []

    def on_checked() -> bool:
        correctness.append(_compare_trials(reference.expected, outputs_dir, cfg))
        return correctness[0].ok and cfg.time_candidate

    build_key = task.sha256[:8] + "-" + _sha(source)[:16]
    report = _run_child(request, work_dir, cfg, on_checked, build_key)
    verdict = report.failure or (correctness[0] if correctness else Verdict(
        status="crashed", message="the child ended without running the trials"))
    if verdict.ok and report.leftovers:
        verdict = Verdict(status="rejected", phase="cleanup",
                          message="left processes running after it finished: "
                                  + ", ".join(report.leftovers[:5]))
    if correctness and verdict is not correctness[0]:
        for name in ("trials_passed", "max_abs_error", "max_rel_error"):
            setattr(verdict, name, getattr(correctness[0], name))
    verdict.trials = cfg.trials
    verdict.device = device
    verdict.device_name = report.env.get("device_name", "")
    verdict.torch_version = report.env.get("torch_version", "")
    verdict.host = report.env.get("host", "")
    verdict.phase_seconds = report.phase_seconds
    _attach_timings(verdict, report, reference)
    return verdict


def _attach_timings(verdict: Verdict, report: ChildReport, reference: ReferenceRun) -> None:
    ref = reference.timed.get("eager")
    if isinstance(ref, list) and ref:
        verdict.reference = TimingStats.from_samples(ref)
    if not verdict.ok:
        return
    samples = report.timed.get("candidate")
    if isinstance(samples, list) and samples:
        verdict.runtime = TimingStats.from_samples(samples)
    if verdict.runtime and verdict.reference:
        verdict.speedup = verdict.reference.median_ms / verdict.runtime.median_ms


def _compare_trials(expected: list[list[Any]], outputs_dir: Path, cfg: EvalConfig) -> Verdict:
    mismatches: list[OutputMismatch] = []
    actual_by_trial: list[list[Any]] = []
    passed = 0
    max_abs = max_rel = 0.0
    for trial, exp_leaves in enumerate(expected):
        try:
            act_leaves = _load_leaves(outputs_dir / f"outputs_{trial}.pt")
        except Exception as err:  # written by the child: anything may be in it
            return Verdict(status="incorrect", phase="check",
                           message=f"trial {trial}: outputs could not be read back ({err})")
        actual_by_trial.append(act_leaves)
        compared = _compare_leaves(exp_leaves, act_leaves, trial, cfg)
        max_abs = max([max_abs, *(c.max_abs_error or 0.0 for c in compared)])
        max_rel = max([max_rel, *(c.max_rel_error or 0.0 for c in compared)])
        trial_bad = [c for c in compared if c.problem]
        mismatches.extend(trial_bad)
        passed += not trial_bad
    errors = {"trials_passed": passed, "max_abs_error": max_abs, "max_rel_error": max_rel}
    if not mismatches:
        return Verdict(status="ok", **errors)
    first = mismatches[0]
    message = (f"{len(expected) - passed} of {len(expected)} trials failed; trial {first.trial}, "
               f"output {first.output}: {first.problem}")
    if _repeats_across_trials(expected, actual_by_trial):
        message += "; the output is identical for different inputs (a cached or constant result?)"
    return Verdict(status="incorrect", phase="check", message=message,
                   mismatches=mismatches[:20], **errors)


def _compare_leaves(expected: list[Any], actual: list[Any], trial: int,
                    cfg: EvalConfig) -> list[OutputMismatch]:
    if len(expected) != len(actual):
        return [OutputMismatch(trial=trial, output=0,
                               problem=f"returned {len(actual)} outputs, expected {len(expected)}")]
    return [check.compare_leaf(exp, act, trial, index, cfg.atol, cfg.rtol)
            for index, (exp, act) in enumerate(zip(expected, actual, strict=True))]


def _repeats_across_trials(expected: list[list[Any]], actual: list[list[Any]]) -> bool:
    def same(a: list[Any], b: list[Any]) -> bool:
        return len(a) == len(b) and all(
            isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor) and x.shape == y.shape
            and x.dtype == y.dtype and torch.equal(x, y) for x, y in zip(a, b, strict=True))

    return any(same(actual[0], actual[i]) and not same(expected[0], expected[i])
               for i in range(1, len(actual)))


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()
