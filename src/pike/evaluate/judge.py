"""The evaluator's entry point: evaluate() a candidate.

The reference runs in one child and records inputs and expected outputs (reference.py);
each candidate runs in another child that sees only the inputs. Outputs are compared in
the parent (trial_comparison.py), where candidate code cannot reach, and the candidate is
timed beside the reference's child in one window. This module keeps the order of one
evaluation: the candidate's child begun, its trials compared (candidate_checks.py), its
windows (candidate_windows.py), its final check and its verdict (candidate_verdict.py).
"""

from __future__ import annotations

import logging
import time
from contextlib import ExitStack
from functools import partial

import torch

from pike.config import EvalConfig, RunConfig
from pike.errors import EvaluatorError
from pike.evaluate import device_holds, gpu_holders, search_bar, spares
from pike.evaluate.build_cache_bound import trim_when_due
from pike.evaluate.candidate_checks import _final_check, judged_trials, trials_against
from pike.evaluate.candidate_child import _candidate_child, _launch_candidate, _spare_key
from pike.evaluate.candidate_files import CandidateFiles, attach_reference
from pike.evaluate.candidate_limits import fitted_limit
from pike.evaluate.candidate_verdict import _attach_timings, _candidate_verdict, attach_floor
from pike.evaluate.candidate_windows import (
    _FORGED_LOOKS,
    _forged,
    _steady_window,
    _timing_window,
    looked_again_for_reuse,
    reuse_shown,
    timed_dishonestly,
    waited_for_cores,
)
from pike.evaluate.child_launch import begin_child, list_for_timers, wait_for_room
from pike.evaluate.device_lock import hold, hold_for_build, hold_for_work
from pike.evaluate.driver import (
    ChildReport,
    finish,
    request,
    run_trials,
    stage_timed_inputs,
    wait_ready,
)
from pike.evaluate.explain import explain_guards
from pike.evaluate.leftovers import remove_tree
from pike.evaluate.ncu import attach_kernel_metrics
from pike.evaluate.outputs_handoff import OutputsBuffer
from pike.evaluate.profile import ProfileSummary
from pike.evaluate.redact import mask_secrets
from pike.evaluate.reference import ReferenceRun
from pike.evaluate.reference_cache import count_work_meanwhile, release_reference, run_reference
from pike.evaluate.reference_failure import reference_failed
from pike.evaluate.sandbox import ChildProcess
from pike.evaluate.steps import measuring, span
from pike.evaluate.timing_window import Timer
from pike.evaluate.trial_comparison import TrialComparison, compare_device, compare_early
from pike.evaluate.verdict import Verdict, out_of_device_memory
from pike.evaluate.wall_clock_check import wall_clock_factor
from pike.task import Task

log = logging.getLogger(__name__)


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


def request_profile(child: ChildProcess, mode: str, calls: int) -> ProfileSummary | None:
    """The child's profile of one mode; None (logged) when the pass failed."""
    reply = request(child, "profile", "profiled", "profile", mode=mode, calls=calls)
    child.enter_phase("idle")
    if isinstance(reply, Verdict) or not reply.get("summary"):
        why = reply.message if isinstance(reply, Verdict) else reply.get("error")
        log.warning("profiling pass failed: %s", why)
        return None
    try:
        return ProfileSummary.model_validate(reply["summary"])
    except ValueError as err:  # written by the child: anything may be in it
        log.warning("profile could not be read back: %s", err)
        return None


def profile_reference(task: Task, config: EvalConfig | RunConfig | None = None
                      ) -> ProfileSummary | None:
    """Where the unchanged task's time goes (eager), from its live reference child."""
    cfg = as_eval_config(config)
    device = resolve_device(cfg.device)
    reference = run_reference(task, cfg, device, keep_child=True)
    try:
        assert reference.child is not None
        with hold(device, exclusive=False), reference.talking:
            return request_profile(reference.child, "eager", cfg.profile_calls)
    finally:
        release_reference(reference)


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
    with measuring() as clock:
        reference: ReferenceRun | None = None
        launched: spares.Launched | None = None
        try:
            # The candidate's child imports torch while the reference runs (or while it
            # waits for the device), or did so while the last candidate was judged (a
            # spare): seconds off every evaluation.
            with span("launch_child"):
                launched = _candidate_child(task, candidate_source, cfg, device)
            files, child = launched.files, launched.child
            with span("reference"):  # near zero where a live reference of the task is kept
                reference = run_reference(task, cfg, device, keep_child=cfg.time_candidate)
            if device.startswith("cuda") and cfg.time_candidate:
                count_work_meanwhile(reference)
            attach_reference(files, reference, cfg)
            child.stage = files.stage
            verdict = _judge_candidate(task, files, child, cfg, device, reference)
            if device.startswith("cuda") and out_of_device_memory(verdict):
                # the allocator names only the candidate's share: the rest, while the
                # reference still holds its own
                verdict.message = gpu_holders.said_in(verdict.message or "", device)
            if verdict.ok and verdict.runtime is not None and device.startswith("cuda"):
                with span("floor"):
                    attach_floor(verdict, reference.work())
        finally:
            if launched is not None and launched.child.proc is not None:
                finish(launched.child)  # never begun: the reference failed or pike stops
            if reference is not None:
                release_reference(reference)
            with span("remove_files"):
                if launched is not None:
                    remove_tree(launched.folder)
                trim_when_due(cfg)
        if not device.startswith("cuda"):  # on the CPU its imports would share the cores
            spares.replenish(_spare_key(cfg, device), lambda: _launch_candidate(cfg, device))
    verdict.phase_seconds["total"] = time.monotonic() - started
    verdict.steps = {**clock.rounded(), **verdict.steps, **reference.new_steps}
    reference.new_steps = {}  # reported once, by the evaluation that started it
    return mask_secrets(verdict)


def _judge_candidate(task: Task, files: CandidateFiles, child: ChildProcess, cfg: EvalConfig,
                     device: str, reference: ReferenceRun) -> Verdict:
    """Judge the candidate in its launched (not yet begun) child, which this finishes."""
    outputs_dir, build_key = files.outputs_dir, files.build_key
    report = ChildReport()
    timers: list[Timer] = []
    correctness: Verdict | None = None
    final: Verdict | None = None
    profile: ProfileSummary | None = None
    usual: float | None = None  # set when the reference's window stayed off its usual time
    withheld: str | None = None  # set when its probes were slow and its own calls unsteady
    busy: str | None = None  # set when a child waited for a core through its CPU window
    raised = 1.0  # the candidate's reported times, held to the parent's clock
    comparison: TrialComparison | None = None
    try:
        # None of the child's GPU work reaches another's timed window: with pause_others
        # (the default) the timer stops this child, listed before it begins, whatever it
        # is doing; with every_gpu_use its start, load, builds, the warm-up's lazy compiles
        # and autotuning, CUDA-graph capture and the trials hold the device shared.
        wait_for_room(child)  # before any hold: timers would wait behind it
        with ExitStack() as device_held:
            with span("wait_to_list"):  # near 0: listing waits for no timer (list_child)
                list_for_timers(child, device, cfg.device_lock)
            with span("wait_for_device"):
                device_held.enter_context(hold_for_build(device, cfg.device_lock))
            with span("start_child"):
                begin_child(child, cfg, run_limit_s=fitted_limit(reference.check_seconds)
                            if cfg.limits.fitted else None)
            with span("load_build_warm_up"):
                trials_ran = wait_ready(child, report, files.first_call_limit_s
                                        if cfg.limits.fitted else None)
            on = compare_device(device)
            comparison = trials_against(reference, outputs_dir, cfg, on)
            early = compare_early(comparison, child, device, cfg)
            if early is not None and trials_ran:  # taken trial by trial, so lent only then
                comparison.buffer = OutputsBuffer.offer(comparison.expected, on)
            with span("trials"):  # with the comparisons made while the child runs them
                trials_ran = trials_ran and run_trials(
                    child, report, on_saved=early,
                    outputs=comparison.buffer.describe() if comparison.buffer else None)
        if trials_ran:
            with span("compare"):
                correctness = judged_trials(comparison, reference, device, cfg)
            timed = correctness.ok and cfg.time_candidate and reference.child is not None
            unstaged = None
            if timed:
                with span("stage_timed_inputs"), hold_for_build(device, cfg.device_lock):
                    unstaged = stage_timed_inputs(child)
            if unstaged is not None:
                timers = [Timer(reference.child, "eager"), Timer(child, "candidate",
                                                                 failure=unstaged)]
            elif timed:
                # a search's bar ends the window of a candidate far behind its best
                timers = _timing_window(reference, child, device, cfg, warmed=False,
                                        best=partial(search_bar.current, task.sha256),
                                        share=True)
                forged = cfg.guards and _forged(reference, timers)
                looks = 1
                reused_before: str | None = None  # reuse its probes showed in such a window
                while forged and looks < _FORGED_LOOKS:
                    # A burst of host load can stretch the candidate's blocks alone; forged
                    # timings stay unaccounted in every window, honest ones do not. Each
                    # look flips the order, so a burst mid-window lands on other blocks.
                    log.info("timing blocks unaccounted for (%s); timing again", forged)
                    reused_before = reused_before or reuse_shown(timers)
                    timers = _timing_window(reference, child, device, cfg, warmed=True,
                                            flipped=looks % 2 == 1,
                                            purpose=device_holds.CANDIDATE_AGAIN)
                    looks += 1
                    forged = not any(t.failure for t in timers) and _forged(
                        reference, timers, strict=True)
                if forged:
                    forged += f" in each of {looks} timing windows"
                if forged:
                    timers[1].failure = Verdict(status="rejected", phase="timing", message=forged)
                elif cfg.guards and not any(t.failure for t in timers):
                    timers[1].failure = timed_dishonestly(reference, timers[1], cfg, timers[0])
                    if timers[1].failure is None and reused_before:
                        timers[1].failure = Verdict(status="rejected", phase="timing", message=(
                            f"{reused_before} (in a timing window whose blocks were "
                            "unaccounted for, timed again after it)"))
                    timers = looked_again_for_reuse(reference, child, device, cfg, timers)
                    withheld = timers[1].withheld
                    busy = waited_for_cores(timers, device)
                if not any(t.failure for t in timers):
                    # a hopeless candidate's figure is no search's pick, steady or not
                    if timers[1].gave_up_after is None:
                        timers, usual = _steady_window(reference, child, device, cfg, timers)
                    if cfg.guards:
                        raised = wall_clock_factor(reference.loop_cost(), timers[1], timers[0])
            if correctness.ok and cfg.guards and not any(t.failure for t in timers):
                with span("final_check"):
                    final = _final_check(child, reference, outputs_dir, cfg, device)
            if (correctness.ok and cfg.profile and not any(t.failure for t in timers)
                    and (final is None or final.ok)):
                with hold_for_work(device, cfg.device_lock):
                    profile = request_profile(child, "candidate", cfg.profile_calls)
                    attach_kernel_metrics(profile, task.path, files.source_path, device, cfg,
                                          build_key)
    except BaseException:  # an interrupt (Ctrl-C, SIGTERM): no time to ask the child
        child.unresponsive = True
        raise
    finally:
        with span("stop_child"):
            finish(child, report)
        if comparison is not None:  # freed only now: the child could write it until it ended
            comparison.return_buffer()
    if timers and timers[0].failure is not None:
        reference.close()
        raise reference_failed(task, timers[0].failure, device)
    verdict = _candidate_verdict(report, correctness, timers, final)
    verdict.trials = cfg.trials
    verdict.device = device
    verdict.device_name = report.env.get("device_name", "")
    verdict.torch_version = report.env.get("torch_version", "")
    verdict.host = report.env.get("host", "")
    if reference.request is not None:
        verdict.built_on = reference.request.construct_on
    verdict.phase_seconds = dict(child.phase_seconds)
    verdict.steps = {f"child.{name}": s for name, s in report.steps.items()}
    verdict.flags_changed = report.flags
    verdict.guards = explain_guards(cfg, report, correctness, timers, final, child)
    if verdict.ok:
        verdict.profile = profile
    _attach_timings(verdict, timers, raised)
    verdict.host_busy = busy or ""
    verdict.weak_check = reference.weak_check
    if (usual is not None or withheld) and verdict.speedup is not None:
        verdict.noisy, verdict.noisy_speedup, verdict.reference_usual_ms = (
            True, verdict.speedup, usual)
        verdict.noisy_why = withheld or ""
        verdict.speedup = None
    return verdict
