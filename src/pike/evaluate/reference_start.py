"""Making a task's reference run: the seeds and the distribution it is drawn with, its
child started beside other evaluations, its trials run and its expected outputs loaded.
"""

from __future__ import annotations

import functools
import logging
import random
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pike.config import CONSTRUCT_ON, EvalConfig
from pike.errors import EvaluatorError
from pike.evaluate import check
from pike.evaluate.child_launch import begin_child, launch_child, list_for_timers, wait_for_room
from pike.evaluate.device_lock import hold_for_build, unlist_child
from pike.evaluate.driver import ChildReport, finish, run_trials
from pike.evaluate.leftovers import make_temp_dir
from pike.evaluate.protocol import EXTRA_TRIALS, ChildRequest, ShiftSpec, timed_set_count
from pike.evaluate.reference import ReferenceRun
from pike.evaluate.reference_failure import reference_failed
from pike.evaluate.sandbox import ChildProcess
from pike.evaluate.steps import span
from pike.evaluate.trial_comparison import load_leaves
from pike.evaluate.verdict import Verdict
from pike.task import Task
from pike.threads import unwinding_stop

log = logging.getLogger(__name__)


@functools.cache
def _warn_weak_check(task: str, sha256: str, why: str) -> None:
    """Once a process and task: a reference started again (a drifting window, a confirming
    window's fresh draw) finds the same, and every verdict says it."""
    log.warning("%s: %s", task, why)


# The settings a reference and its candidates must share, sent to both children; a cached
# reference is reused only where they (and the limits and seed) are the same.
_CHILD_PROTOCOL = ("trials", "model_mode", "construct_on", "timing")


def child_protocol(cfg: EvalConfig) -> dict[str, Any]:
    return {**{name: getattr(cfg, name) for name in _CHILD_PROTOCOL},
            "input_sets": cfg.timing.input_sets}


@dataclass
class DrawnProtocol:
    """The seeds and the other distribution of one reference run: from the OS's
    randomness (eval.seed None), or all from eval.seed, reproducibly."""

    weights: int
    trials: list[int]
    timed: list[int]
    shift: ShiftSpec


def draw_protocol(cfg: EvalConfig) -> DrawnProtocol:
    count = cfg.trials + EXTRA_TRIALS
    if cfg.seed is not None:  # as before drawn seeds: trial i from seed + 1 + i
        seed = cfg.seed
        return DrawnProtocol(seed, [seed + 1 + i for i in range(count)],
                             [seed + 1001 + k for k in range(timed_set_count(cfg.timing.input_sets))],
                             ShiftSpec(kind="affine", scale=3.0, offset=0.5, seed=seed))
    rng = random.SystemRandom()

    def draw() -> int:
        return rng.randrange(2**62)

    # A larger scale than randn's always (shortcuts that assume |x| < 4 fail), a shift of
    # the mean, and one of two shapes.
    shift = ShiftSpec(kind=rng.choice(["affine", "uniform"]), scale=rng.uniform(2.5, 4.0),
                      offset=rng.uniform(-1.0, 1.0), seed=draw())
    return DrawnProtocol(draw(), [draw() for _ in range(count)],
                         [draw() for _ in range(timed_set_count(cfg.timing.input_sets))], shift)


def _start_reference(task: Task, cfg: EvalConfig, device: str, keep_child: bool
                     ) -> ReferenceRun:
    run = _reference_attempt(task, cfg, device, keep_child)
    if isinstance(run, ReferenceRun):
        return run
    raise reference_failed(task, run, device)


def _reference_attempt(task: Task, cfg: EvalConfig, device: str, keep_child: bool
                       ) -> ReferenceRun | Verdict | None:
    """The reference run, or the failure that ended it (None: no failure was reported).
    Whatever ends it early (an error, Ctrl-C) leaves no child and no folder behind."""
    tmp = make_temp_dir("ref")
    child: ChildProcess | None = None
    run: ReferenceRun | None = None
    try:
        inputs_dir, expected_dir, work_dir = tmp / "inputs", tmp / "expected", tmp / "work"
        for d in (inputs_dir, expected_dir, work_dir):
            d.mkdir()
        drawn = draw_protocol(cfg)
        request = ChildRequest(
            role="reference", module_path=str(task.path), class_names=["Model"],
            inputs_dir=str(inputs_dir), outputs_dir=str(expected_dir), device=device,
            **child_protocol(cfg), seed=drawn.weights, task_sha256=task.sha256,
            trial_seeds=drawn.trials, pool_seeds=drawn.timed, shift=drawn.shift,
        )
        pristine = request.model_copy(deep=True)  # start_child rewrites paths to the child's view
        report = ChildReport()
        ok = False
        try:
            # Its imports need no device; from "begin" on, loading and building use the GPU
            # too (a CUDA context, a prefill). Beside other evaluations, as a candidate's
            # trials are: listed for their timers to stop (pause_others), so no timer waits
            # for it; it draws and saves every input set and expected output, files of
            # hundreds of MB on the level2 tasks, seconds of mostly host work that a shared
            # hold made every timer (and every comparison behind them) wait out.
            child = launch_child(request, work_dir, cfg, build_key="reference")
            wait_for_room(child)
            with beside_others(child, device, cfg.device_lock):
                begin_child(child, cfg)
                ok = run_trials(child, report)
            if ok:  # all it wrote, before it is released or its expected outputs go
                child.read_files()
        finally:
            if child is not None and not (ok and keep_child):
                finish(child)
        if not ok:
            return report.failure
        with span("load_expected"):
            expected = [load_leaves(expected_dir / f"outputs_{i}.pt", mapped=True)
                        for i in range(cfg.trials + EXTRA_TRIALS)]
        _make_read_only(inputs_dir)
        shutil.rmtree(expected_dir)  # expected outputs live only in this process from here on
        assert child is not None
        child.enter_phase("idle")
        # construct_on 'auto', as the child settled it: its candidates, and a child that
        # replaces it, build where it built (the same seed gives the same weights only there)
        if report.built_on in CONSTRUCT_ON and report.built_on != "auto":
            pristine.construct_on = report.built_on  # type: ignore[assignment]
        elif pristine.construct_on == "auto":  # a candidate cannot guess it: none is judged
            raise EvaluatorError(f"{task.name}: the reference's child did not say where it "
                                 f"built the model ({report.built_on!r})")
        run = ReferenceRun(inputs_dir, expected, report.env, child if keep_child else None, tmp,
                           seed=drawn.weights, device=device,
                           check_seconds=child.phase_seconds.get("check", 0.0),
                           request=pristine, cfg=cfg,
                           new_steps={f"reference.{k}": v for k, v in report.steps.items()},
                           weak_check=check.weak_check(expected, cfg.trials, cfg.atol,
                                                       cfg.rtol) or "")
        if run.weak_check:
            _warn_weak_check(task.name, task.sha256, run.weak_check)
        return run
    finally:
        if run is None:  # failed or cut short: the run owns neither child nor folder
            try:
                if child is not None and child.proc is not None:
                    child.unresponsive = True  # killed, not asked: it may be mid-request
                    finish(child)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)


def pid_of(child: ChildProcess | None) -> int | None:
    return child.proc.pid if child is not None and child.proc is not None else None


def _make_read_only(folder: Path) -> None:
    """Later candidates read these inputs: no candidate may change them."""
    for path in folder.iterdir():
        path.chmod(0o444)
    folder.chmod(0o555)


@contextmanager
def beside_others(child: ChildProcess, device: str, scope: str) -> Iterator[None]:
    """A trusted child's untimed GPU work (the reference's start and trials, a baseline's
    builds) beside other evaluations: listed for their timers to stop, then unlisted, so
    that the windows it is timed in later do not stop it; the device held shared instead
    where `eval.device_lock` is every_gpu_use."""
    list_for_timers(child, device, scope)  # as a candidate's child is: before any hold
    try:
        with hold_for_build(device, scope):
            yield
    finally:
        if child.pausable_on is not None and child.proc is not None:
            # as `finish` does: off the list first, so no new timer stops it; then a child
            # a timer has stopped (or one stopped on being listed mid-window, never asked
            # anything since) is waited out, or it would stay stopped with no one looking
            unlist_child(device, child.proc.pid)
            if not unwinding_stop():  # a Ctrl-C: the child is killed next, not waited for
                child.wait_unpaused()
            child.pausable_on = None
