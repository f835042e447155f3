"""The evaluator's entry point: evaluate() a candidate.

The reference runs in one child and records inputs and expected outputs (reference.py);
each candidate runs in another child that sees only the inputs. Outputs are compared in
the parent (trial_comparison.py), where candidate code cannot reach, and the candidate is
timed beside the reference's child in one window.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import statistics
import threading
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import torch

from pike.config import EvalConfig, RunConfig
from pike.errors import EvaluatorError
from pike.evaluate import check, device_holds, own_rounding, search_bar, spares
from pike.evaluate.child_environment import passed_to_child
from pike.evaluate.child_launch import (
    begin_child,
    build_cache_root,
    launch_child,
    list_for_timers,
    wait_for_room,
)
from pike.evaluate.cores import timing_cores
from pike.evaluate.device_lock import (
    hold,
    hold_for_build,
    hold_for_work,
)
from pike.evaluate.driver import (
    ChildReport,
    finish,
    request,
    run_trials,
    stage_timed_inputs,
    wait_ready,
)
from pike.evaluate.explain import explain_guards
from pike.evaluate.leftovers import (
    make_temp_dir,
    remove_tree,
)
from pike.evaluate.ncu import attach_kernel_metrics
from pike.evaluate.os_sandbox import sandbox_problem
from pike.evaluate.outputs_handoff import OutputsBuffer
from pike.evaluate.profile import ProfileSummary
from pike.evaluate.protocol import ChildRequest, timed_set_count
from pike.evaluate.redact import mask_secrets
from pike.evaluate.reference import (
    ReferenceRun,
    child_protocol,
    count_work_meanwhile,
    pid_of,
    reference_failed,
    release_reference,
    run_reference,
)
from pike.evaluate.sandbox import ChildProcess
from pike.evaluate.shared_window import timed_together
from pike.evaluate.staging import InputStage
from pike.evaluate.steps import current as current_steps
from pike.evaluate.steps import measuring, span
from pike.evaluate.timing_window import Timer, time_interleaved
from pike.evaluate.trial_comparison import (
    TrialComparison,
    compare_device,
    compare_early,
    compare_with_room,
    file_loader,
    read_back,
    release_compare_memory,
)
from pike.evaluate.verdict import TimingStats, Verdict
from pike.evaluate.wall_clock_check import unaccounted_wall_time, wall_clock_factor
from pike.floor import Work, floor, times_floor
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


# A candidate may take this many times the reference's own check phase to check or to
# time a block before it is judged `timeout`, but never less than the floor: a hung
# candidate on a small task gets its verdict within a minute, a large task keeps room.
_LIMIT_TIMES_REFERENCE, _LIMIT_FLOOR_S = 50.0, 30.0


def fitted_limit(reference_check_s: float) -> float:
    """The check and timing limits of a candidate (the config's limits stay ceilings)."""
    return max(_LIMIT_FLOOR_S, _LIMIT_TIMES_REFERENCE * reference_check_s)


# Candidates that build in their first call: torch.compile (its graphs, max-autotune's
# autotuning, CUDA-graph capture) and Triton kernels (JIT-compiled, autotuned at first
# launch). Beside other evaluations on an H200, max-autotune candidates whose reference
# checks in under a second were judged `timeout` at the fitted 30 s in their first call.
# Not load_inline: it builds at import, under the load phase's limit, and a CUDA
# candidate whose kernel hangs keeps getting its verdict in 30 s.
_BUILDS_IN_FIRST_CALL = re.compile(
    r"\btorch\.compile\b|\btorch\._dynamo\b|@triton\."
    r"|^\s*(?:import|from)\s+[\w., ]*\btriton\b|^\s*from\s+torch\s+import\s+[\w, ]*\bcompile\b",
    re.MULTILINE)


def first_call_limit(source: str, cfg: EvalConfig) -> float | None:
    """The limit of a candidate's warm-up call where its source builds there (a torch.compile
    mode's build, as its baseline has, `limits.build_seconds`); None: the fitted check limit.
    A hung candidate that names them only waits longer for its verdict: init alone has more."""
    return cfg.limits.build_seconds if _BUILDS_IN_FIRST_CALL.search(source) else None


def _input_stage(reference: ReferenceRun, folder: Path, cfg: EvalConfig) -> InputStage:
    trials = [f"inputs_{t}.pt" for t in range(cfg.trials + cfg.guards)]
    stage = InputStage(reference.inputs_dir, folder, {
        "warm_up": trials[:1], "check": trials,
        "timing": [f"pool_{k}.pt" for k in range(timed_set_count(cfg.timing.input_sets))],
        "final": [f"inputs_{cfg.trials + 1}.pt"]})
    if cfg.warm_up:
        stage.permitted.add("warm_up")
    return stage


def attach_floor(verdict: Verdict, work: Work | None) -> None:
    """The verdict's runtime as a multiple of the least time its GPU could take."""
    found = floor(work, verdict.device_name) if work is not None else None
    if found is None or verdict.runtime is None or found.ms <= 0:
        return
    verdict.floor_ms = found.ms
    verdict.times_floor = times_floor(verdict.runtime.median_ms, found)


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
        if not device.startswith("cuda"):  # on the CPU its imports would share the cores
            spares.replenish(_spare_key(cfg, device), lambda: _launch_candidate(cfg, device))
    verdict.phase_seconds["total"] = time.monotonic() - started
    verdict.steps = {**clock.rounded(), **verdict.steps, **reference.new_steps}
    reference.new_steps = {}  # reported once, by the evaluation that started it
    return mask_secrets(verdict)


@dataclass
class CandidateFiles:
    """A candidate's folders under its temp dir, its child's request and its build key;
    `stage` once the reference is known (`attach_reference`)."""

    work_dir: Path
    outputs_dir: Path
    source_path: Path
    request: ChildRequest
    build_key: str
    stage: InputStage | None = None
    # the warm-up call's limit where the candidate builds there (`first_call_limit`), read
    # from the source as written: the child can change its file once it has begun
    first_call_limit_s: float | None = None


def candidate_files(task: Task, source: str, cfg: EvalConfig, device: str,
                    reference: ReferenceRun, folder: Path) -> CandidateFiles:
    """Write a candidate's source into `folder`/work and make its outputs and staged
    inputs folders; the request its child is started with."""
    files = candidate_folders(cfg, device, folder)
    fill_candidate(files, task, source, cfg)
    attach_reference(files, reference, cfg)
    return files


def trials_against(reference: ReferenceRun, outputs_dir: Path, cfg: EvalConfig,
                   on: torch.device) -> TrialComparison:
    """A comparison of the trials a candidate's child writes into `outputs_dir` with the
    outputs `reference` expects for the same inputs (the shifted trial's with its own
    tolerance), on `on`."""
    return TrialComparison(reference.expected_on(on)[:cfg.trials + cfg.guards], outputs_dir,
                           cfg, on, reference.shifted_atols(cfg.trials, cfg.atol))


def judged_trials(comparison: TrialComparison, reference: ReferenceRun, device: str,
                  cfg: EvalConfig) -> Verdict:
    """The comparison's verdict on a candidate's trials, all run; where a trial failed
    only by values the reference's own rounding may explain, judged again against the
    reference's float64 run of that trial (own_rounding)."""
    with hold_for_work(device, cfg.device_lock):
        try:
            verdict = comparison.verdict()
        finally:
            release_compare_memory(comparison.on)
    if verdict.ok or not comparison.may_be_rounding():
        return verdict
    with span("own_rounding"), reference.talking_in_turn(cfg.device_lock):
        try:
            comparison.explain_by_rounding(reference.exact_outputs)
            return comparison.verdict()
        finally:
            release_compare_memory(comparison.on)


def candidate_folders(cfg: EvalConfig, device: str, folder: Path) -> CandidateFiles:
    """A candidate's folders and a request with its paths: enough to launch its child,
    before the candidate (`fill_candidate`) and the reference (`attach_reference`) are
    known."""
    work_dir, outputs_dir, inputs_dir = folder / "work", folder / "outputs", folder / "inputs"
    work_dir.mkdir(parents=True)
    outputs_dir.mkdir()
    inputs_dir.mkdir()
    request = ChildRequest(
        role="candidate", module_path=str(work_dir / "candidate.py"),
        class_names=["ModelNew", "Model"], inputs_dir=str(inputs_dir),
        outputs_dir=str(outputs_dir), device=device, **child_protocol(cfg), seed=0,
        guards=cfg.guards, warm_up=cfg.warm_up,
    )
    return CandidateFiles(work_dir, outputs_dir, work_dir / "candidate.py", request, "")


def fill_candidate(files: CandidateFiles, task: Task, source: str, cfg: EvalConfig,
                   see: Callable[[str], str] = str) -> None:
    """The candidate's part: its source, its task's fingerprint and its build folder
    (`see`: a host path as its child sees it, for a child already launched; one not yet
    launched gets its paths mapped by `launch_child`)."""
    files.source_path.write_text(source)
    files.first_call_limit_s = first_call_limit(source, cfg)
    files.build_key = task.sha256[:8] + "-" + _sha(source)[:16]
    files.request.task_sha256, files.request.task_size = task.sha256, task.path.stat().st_size
    files.request.extensions_dir = see(str(build_cache_root(cfg) / files.build_key))


def attach_reference(files: CandidateFiles, reference: ReferenceRun, cfg: EvalConfig) -> None:
    """The reference's part of a candidate's request: its weights seed, and the stage its
    inputs come through."""
    files.request.seed = reference.seed
    if reference.request is not None:
        files.request.construct_on = reference.request.construct_on
    files.stage = _input_stage(reference, files.work_dir.parent / "inputs", cfg)


def _candidate_child(task: Task, source: str, cfg: EvalConfig, device: str) -> spares.Launched:
    """A launched child for this candidate: a waiting spare, or a new one."""
    key = _spare_key(cfg, device)
    launched = spares.take(key) or _launch_candidate(cfg, device)
    if device.startswith("cuda"):  # its imports run on the build cores, beside this one
        spares.replenish(key, lambda: _launch_candidate(cfg, device))
    fill_candidate(launched.files, task, source, cfg, launched.child.see)
    return launched


def _launch_candidate(cfg: EvalConfig, device: str) -> spares.Launched:
    folder = make_temp_dir("cand")
    try:
        files = candidate_folders(cfg, device, folder)
        child = launch_child(files.request, files.work_dir, cfg, build_key="pending")
    except BaseException:
        remove_tree(folder)
        raise
    return spares.Launched(folder, child, files)


def _spare_key(cfg: EvalConfig, device: str) -> str:
    """Spares serve evaluations with the same settings on the same device, and the same
    environment as their launch gave them (the variables a child is passed, whether the
    OS sandbox works)."""
    passed = sorted((k, v) for k, v in os.environ.items() if passed_to_child(k))
    return "|".join([device, cfg.model_dump_json(exclude={"device"}),
                     str(sandbox_problem()), _sha(repr(passed))])


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
                while forged and looks < _FORGED_LOOKS:
                    # A burst of host load can stretch the candidate's blocks alone; forged
                    # timings stay unaccounted in every window, honest ones do not. Each
                    # look flips the order, so a burst mid-window lands on other blocks.
                    log.info("timing blocks unaccounted for (%s); timing again", forged)
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
                    timers[1].failure = timed_dishonestly(reference, timers[1], cfg)
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
    if usual is not None and verdict.speedup is not None:
        verdict.noisy, verdict.noisy_speedup, verdict.reference_usual_ms = (
            True, verdict.speedup, usual)
        verdict.speedup = None
    return verdict


_noting = threading.Lock()


def _usual(reference: ReferenceRun, timers: list[Timer]) -> float | None:
    """The reference's usual time a window is held to: as it was when the window began
    (a shared window's candidates each check the same eager, and the first to keep its
    median must not move the others' bar), else as it is now."""
    return timers[0].usual_ms if timers[0].usual_ms is not None else reference.usual_ms()


def _window_drift(reference: ReferenceRun, timers: list[Timer]) -> float:
    usual = _usual(reference, timers)
    if usual is None or not timers[0].samples:
        return 0.0
    return abs(statistics.median(timers[0].samples) / usual - 1.0)


def _drift_limit(cfg_limit: float, timers: list[Timer]) -> float:
    """The drift a window may show: the configured share, or twice the spread (IQR over
    median) of the reference's own calls in it where that is wider. Launch-bound tasks of
    a few microseconds spread by 40% within one window on the H100; a window can only be
    said to be off by more than its own calls vary."""
    samples = timers[0].samples
    if len(samples) < 4:
        return cfg_limit
    q1, median, q3 = statistics.quantiles(samples, n=4)
    return max(cfg_limit, 2 * (q3 - q1) / median) if median > 0 else cfg_limit


def _steady_window(reference: ReferenceRun, child: ChildProcess, device: str, cfg: EvalConfig,
                   timers: list[Timer]) -> tuple[list[Timer], float | None]:
    """The window again while the reference's median in it is off its usual time in this
    run by more than `timing.max_reference_drift` (a neighbour's GPU work, a slower
    reference state or the card's own drift reached it): twice with the same reference
    child, then once with a fresh one. Returns the last window and, when it is still off,
    the usual time it was off from."""
    limit = cfg.timing.max_reference_drift
    if limit is None or not device.startswith("cuda"):
        return timers, None

    def off(window: list[Timer]) -> bool:
        return _window_drift(reference, window) > _drift_limit(limit, window)

    tries = 0
    while off(timers) and tries <= _DRIFT_RETRIES:
        log.info("reference off its usual time by %.0f%%: timing again",
                 100 * _window_drift(reference, timers))
        renew = tries == _DRIFT_RETRIES  # the same child stayed off: a fresh one
        if renew and reference.renewals >= _MAX_RENEWALS:
            break
        retry = _timing_window(reference, child, device, cfg, warmed=True, renew=renew,
                               purpose=device_holds.CANDIDATE_AGAIN)
        if any(t.failure for t in retry):
            break
        timers, tries = retry, tries + 1
    usual = _usual(reference, timers) if off(timers) else None
    with _noting:  # a shared window's eager is kept once, not once per candidate
        if timers[0].samples and not timers[0].noted:
            timers[0].noted = True
            reference.window_ms.append(statistics.median(timers[0].samples))
    return timers, usual


# Windows a candidate's timings must fail the wall-clock check in before it is rejected:
# on a loaded 2-core host an honest candidate's blocks stretched alone in two windows in a
# row (CI, 10 ms blocks); a forger's fail in every one, so more looks cost it nothing.
_FORGED_LOOKS = 3
_DRIFT_RETRIES = 2  # with the same reference child, before a fresh one
_MAX_RENEWALS = 3  # fresh reference children per reference run: a card that drifts stays noisy


def _final_check(child: ChildProcess, reference: ReferenceRun, outputs_dir: Path,
                 cfg: EvalConfig, device: str) -> Verdict:
    """New values in the timed input tensors must give new, correct outputs. A child
    listed for timers (pause_others) runs its call and writes its outputs with no hold:
    another evaluation's timer stops it, as in its trials. Only the parent's own GPU work
    (reading the outputs back, comparing) holds the device shared then. Holding it shared
    through the child's part too (its call, and a file of up to a gigabyte on the level2
    tasks) kept every timer waiting for it, and every comparison behind those timers."""
    listed = child.pausable_on is not None
    with ExitStack() as held:  # one hold: from the child's call, or only for the parent's
        if not listed:
            held.enter_context(hold_for_work(device, cfg.device_lock))
        child.permit("final")
        reply = request(child, "check", "final_checked", "final")
        if isinstance(reply, Verdict):
            return reply
        if listed:
            held.enter_context(hold_for_work(device, cfg.device_lock))
        verdict, doubtful = _final_compared(reference, outputs_dir, cfg)
    if doubtful:  # the hold let go first: talking_in_turn takes its own
        final = len(reference.expected) - 1
        with span("own_rounding"), reference.talking_in_turn(cfg.device_lock):
            exact = reference.exact_outputs(final)
            why = exact if isinstance(exact, str) else own_rounding.unexplained(
                doubtful, reference.expected[final], exact, cfg.rtol,
                compare_device(reference.device))
        if not why:
            return Verdict(status="ok")
        verdict.message += f"; not the reference's own rounding: {why}"
    return verdict


def _final_compared(reference: ReferenceRun, outputs_dir: Path, cfg: EvalConfig
                    ) -> tuple[Verdict, list[own_rounding.Doubtful]]:
    """The verdict on the outputs after timing, and where it failed only by values the
    reference's own rounding may explain, those values (else none)."""
    on = compare_device(reference.device)
    final_expected = reference.expected_on(on)[-1]
    try:
        expected, actual, here = read_back(
            file_loader(outputs_dir / "outputs_final.pt", final_expected), final_expected, on)
    except Exception as err:  # written by the child: anything may be in it
        return Verdict(status="incorrect", phase="check",
                       message=f"outputs after timing could not be read back ({err})"), []
    bad = [c for c in compare_with_room(expected, actual, cfg.trials + 1, cfg, here)
           if c.problem]
    found = [own_rounding.doubtful_values(expected[c.output], actual[c.output],
                                          cfg.trials + 1, c.output, cfg.atol, cfg.rtol, here)
             for c in bad]
    del actual
    release_compare_memory(on)
    if not bad:
        return Verdict(status="ok"), []
    doubtful = [d for d in found if d is not None]
    return Verdict(status="incorrect", phase="check", mismatches=bad[:20],
                   message="after timing, new values written into the same input tensors "
                           f"gave wrong outputs (output {bad[0].output}: {bad[0].problem}); "
                           "answers cached by pointer, shape or call count are not allowed"
                   ), doubtful if len(doubtful) == len(bad) else []


def _timing_window(reference: ReferenceRun, child: ChildProcess, device: str,
                   cfg: EvalConfig, warmed: bool, renew: bool = False,
                   flipped: bool = False,
                   best: Callable[[], float | None] | None = None,
                   share: bool = False,
                   purpose: str = device_holds.CANDIDATE_WINDOW) -> list[Timer]:
    """Eager and the candidate, interleaved, with the device to themselves (and the
    reference's child renewed first where `renew`); `best`: the search's best speedup so
    far, which a candidate far behind ends the window for (search_bar.py). With `share`
    (a candidate's first window), the window may be shared with the candidates of the
    same reference waiting for the device with it (shared_window.py)."""
    if share and cfg.timing.share_window > 1:
        shared = timed_together(reference, child, device, cfg, best, pid_of)
        if shared is not None:
            return shared
    child.permit("timing")
    with ExitStack() as alone:
        with span("wait_for_device"):
            alone.enter_context(hold(device, exclusive=True, keep=[pid_of(child) or -1],
                                     purpose=purpose))
        with span("wait_for_reference"):  # the device held alone meanwhile
            alone.enter_context(reference.talking)
        # The reference's child is read under `talking`: another evaluation may renew it.
        if renew:
            with span("renew_reference"):
                warmed = warmed and not reference.renew_child()
        assert reference.child is not None
        timers = [Timer(reference.child, "eager", warmed=warmed,
                        usual_ms=reference.usual_ms()),
                  Timer(child, "candidate", warmed=warmed)]
        with (span("timing"),
              timing_cores([pid_of(reference.child), pid_of(child)], device, cfg.timing_cores)):
            # only where a window stops every other evaluation: a GPU's
            time_interleaved(timers, cfg.timing, flipped, give_up=device.startswith("cuda"),
                             best=best)
        # Of the blocks after each timer's first (which warms up and is not kept in
        # `blocks`): what their calls took (as reported: diagnostic only, a candidate's
        # samples are its own) and what they took by this clock. The rest of `timing` is
        # the first blocks, staging and moving the children's cores.
        steps = current_steps()
        steps.add("timing.calls", sum(t.calls_s() for t in timers))
        steps.add("timing.blocks", sum(t.blocks_s() for t in timers))
        reference.child.enter_phase("idle")
        if cfg.guards:  # the wall-clock check's figure, measured while the device is held
            with span("calibrate_timing_loop"):
                reference.calibrate_in_window(timers[0], [pid_of(child) or -1])
    return timers


def timed_dishonestly(reference: ReferenceRun, timer: Timer, cfg: EvalConfig) -> Verdict | None:
    """The verdict on timed calls whose sampled outputs are wrong (incorrect), or whose
    times show answers reused for inputs seen before (rejected); None when neither."""
    wrong = check.timed_outputs_problem(reference.timed_expected, timer.outputs,
                                        len(timer.samples), cfg.atol, cfg.rtol,
                                        reference.own_error)
    if wrong:
        return Verdict(status="incorrect", phase="timing", message=wrong)
    reused = (check.reused_answers_problem(timer.samples, timer.probe_samples)
              or check.withheld_probes_problem(timer.child.timed_calls,
                                               timer.child.probes_timed))
    return Verdict(status="rejected", phase="timing", message=reused) if reused else None


def _forged(reference: ReferenceRun, timers: list[Timer], strict: bool = False) -> str | None:
    """Why the candidate's reported timings cannot be true, or None."""
    if timers[1].failure is not None:
        return None
    with span("calibrate_timing_loop"):  # once per reference run; then it is kept
        cost = reference.loop_cost()
    return unaccounted_wall_time(cost, timers[1], timers[0], strict)


def _candidate_verdict(report: ChildReport, correctness: Verdict | None,
                       timers: list[Timer], final: Verdict | None) -> Verdict:
    candidate_timer = timers[1] if timers else None
    failed_final = final if final is not None and not final.ok else None
    verdict = (report.failure or (candidate_timer and candidate_timer.failure) or failed_final
               or correctness
               or Verdict(status="crashed", message="the child ended without running the trials"))
    if verdict.ok and report.leftovers:
        verdict = Verdict(status="rejected", phase="cleanup",
                          message="left processes running after it finished: "
                                  + ", ".join(report.leftovers[:5]))
    if correctness is not None and verdict is not correctness:
        for name in ("trials_passed", "max_abs_error", "max_rel_error"):
            setattr(verdict, name, getattr(correctness, name))
    return verdict


def _attach_timings(verdict: Verdict, timers: list[Timer], raised: float = 1.0) -> None:
    """The window's figures; the candidate's times multiplied by `raised` where its blocks
    took longer by the parent's clock than it reported (wall_clock_check.wall_clock_factor)."""
    if not timers:
        return
    reference, candidate = timers
    if reference.samples:
        verdict.reference = TimingStats.from_samples(reference.samples)
    if verdict.ok and candidate.samples:
        if raised > 1.0:
            log.warning("the candidate's timing blocks took %.2fx longer than it reported, "
                        "beyond what the reference's did: its times are raised to match",
                        raised)
            verdict.wall_clock_factor = round(raised, 4)
        verdict.runtime = TimingStats.from_samples([s * raised for s in candidate.samples])
    if verdict.runtime and verdict.reference:
        verdict.speedup = verdict.reference.median_ms / verdict.runtime.median_ms
    if verdict.ok:
        verdict.timed_rounds = candidate.gave_up_after
        verdict.behind_best = candidate.behind_best
    if candidate.shared_by > 1:
        verdict.window_candidates = candidate.shared_by


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()
