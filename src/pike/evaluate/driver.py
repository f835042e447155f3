"""Driving children from the parent: start, run to the end of the trials, time, finish.

Timing alternates short blocks between children (reference, candidate, candidate,
reference, ...). The lent GPU hosts change speed by up to 2x within seconds (measured with
bench/timing_noise.py), and eager models are bound by host dispatch, so two measurements
taken a minute apart are not comparable; blocks interleaved in one window are.
"""

from __future__ import annotations

import logging
import math
import os
import secrets
import signal
import statistics
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pike.config import EvalConfig, TimingConfig
from pike.evaluate import check, device_lock, host_memory
from pike.evaluate.child_environment import child_environment, make_child_dirs
from pike.evaluate.cores import start_on_build_cores
from pike.evaluate.network_namespace import network_prefix
from pike.evaluate.os_sandbox import INSIDE_ROOT, Mount, SandboxPlan, sandbox_active
from pike.evaluate.protocol import DESCENDANTS_GRACE_S, ChildRequest, Role
from pike.evaluate.sandbox import ChildExit, ChildProcess, MemoryExceeded, PhaseTimeout
from pike.evaluate.staging import InputStage
from pike.evaluate.steps import current as step_clock
from pike.evaluate.verdict import Verdict
from pike.threads import unwinding_stop

log = logging.getLogger(__name__)


@dataclass
class ChildReport:
    """What a child said before timing: its environment, or how it failed."""

    env: dict[str, str] = field(default_factory=dict)
    failure: Verdict | None = None
    leftovers: list[str] = field(default_factory=list)
    flags: dict[str, str] = field(default_factory=dict)  # backend flags the child changed
    steps: dict[str, float] = field(default_factory=dict)  # the child's own (steps.py)
    built_on: str = ""  # a reference's: where its model was built ('cpu' or 'device')


def start_child(request: ChildRequest, work_dir: Path, cfg: EvalConfig,
                build_key: str, stage: InputStage | None = None,
                run_limit_s: float | None = None) -> ChildProcess:
    """Start a sandboxed child and hand it its request at once; the caller must `finish`
    it. `launch_child` and `begin_child` do the same in two steps."""
    child = launch_child(request, work_dir, cfg, build_key, stage)
    begin_child(child, cfg, run_limit_s)
    return child


def launch_child(request: ChildRequest, work_dir: Path, cfg: EvalConfig,
                 build_key: str, stage: InputStage | None = None) -> ChildProcess:
    """Start a sandboxed child that imports what it needs and waits: no candidate code
    runs and no device is touched before `begin_child`, so this needs no device hold.
    The caller must `finish` it (or call its __exit__).

    `request` names host paths; the child gets them as it sees them (under /pike/ in the
    OS sandbox). Its fields other than paths may still change until `begin_child`.
    A candidate's inputs come through `stage`, phase by phase."""
    cache_root = build_cache_root(cfg, request.role)
    make_child_dirs(work_dir)
    plan = _sandbox_plan(request, work_dir, cache_root, cfg)
    see = plan.inside if plan is not None else os.path.realpath
    request.module_path = see(request.module_path)
    request.inputs_dir, request.outputs_dir = see(request.inputs_dir), see(request.outputs_dir)
    if request.extensions_dir:
        request.extensions_dir = see(request.extensions_dir)
    request.writable = [see(work_dir), see(cache_root)]
    if plan is not None:
        request.writable.append("/dev/shm")  # the sandbox's own, private one
    env = child_environment(see(work_dir), uuid.uuid4().hex, see(cache_root / build_key),
                            see(cache_root), cfg.compile_threads)
    device = request.device  # as this process numbers GPUs; the child sees only its own
    _only_one_gpu(request, env)
    prefix = plan.prefix() if plan is not None else network_prefix(cfg.network_isolation)
    child = ChildProcess(request, work_dir, env, cfg.limits, _phase_limits(cfg, None),
                         prefix=prefix, sandboxed=plan is not None, stage=stage)
    child.see = see
    if plan is not None:
        child.plan_notes = plan.describe()
    child.__enter__()
    if child.proc is not None:
        start_on_build_cores(child.proc.pid, device, cfg.timing_cores)
    return child


def build_cache_root(cfg: EvalConfig, role: Role = "candidate") -> Path:
    """The build folder (compiled extensions, inductor's and Triton's caches) of children
    of `role`. Candidates share one. The reference has its own, which no candidate can
    reach: its compile modes are the baselines every figure is compared with, and what a
    cache holds (a compiled graph's Python, a kernel's binary, a precompiled header) is
    code the process that finds it there runs. The reference's sits beside the configured
    folder, not in it: a pike from before the split gives its candidates that whole
    folder."""
    base = cfg.build_cache or Path.home() / ".cache" / "pike" / "build"
    root = (base.with_name(f"{base.name}-reference") if role == "reference"
            else base / "candidates")
    root.mkdir(parents=True, exist_ok=True)
    return root


def begin_child(child: ChildProcess, cfg: EvalConfig, run_limit_s: float | None = None) -> None:
    """Hand a launched child its request: it loads, builds and runs from here (hold the
    device first where it has one). `run_limit_s` tightens the check and timing limits
    (the config's stay ceilings). A child not yet given its room on the host
    (`wait_for_room`) waits for it here."""
    wait_for_room(child)
    child.phase_limits = _phase_limits(cfg, run_limit_s)
    child.begin()


def wait_for_room(child: ChildProcess, limit_s: float | None = None) -> None:
    """Wait until the host's memory has room for the child to begin (host_memory), at
    most `limit_s` (0: count it at once, for a caller that holds the device or a lock
    others need); call it before any device hold, since timers would wait behind the
    hold meanwhile. The wait is the step `wait_for_memory`."""
    task = child.request.task_sha256 or child.request.module_path
    waited = host_memory.HOST.admit(child, task, child.request.role, limit_s)
    if waited:
        step_clock().add("wait_for_memory", waited)


def list_for_timers(child: ChildProcess, device: str, scope: str) -> None:
    """From now until `finish`, other evaluations' timers stop this child for their
    windows, where `eval.device_lock` is pause_others (device_lock.list_child); call it
    before the child begins, so no candidate code runs unlisted."""
    if child.proc is not None and device_lock.list_child(device, child.proc.pid, scope):
        child.pausable_on = device


def _phase_limits(cfg: EvalConfig, run_limit_s: float | None) -> dict[str, float]:
    lim = cfg.limits
    check_s, timing_s = lim.check_seconds, lim.timing_seconds
    if run_limit_s is not None:
        check_s, timing_s = min(check_s, run_limit_s), min(timing_s, run_limit_s)
    return {"setup": lim.load_seconds, "load": lim.load_seconds,
            "init": lim.load_seconds, "check": check_s,
            "timing": timing_s, "build": lim.build_seconds, "cleanup": 10.0,
            # advisory passes: a hang here must not hold the device for long
            "profile": lim.check_seconds, "work": lim.check_seconds,
            # one trial in float64 (own_rounding): slower than the check's trials in float32
            "exact": 2 * lim.check_seconds}


def _sandbox_plan(request: ChildRequest, work_dir: Path, cache_root: Path,
                  cfg: EvalConfig) -> SandboxPlan | None:
    """What the child sees in the OS sandbox: its own folders under /pike/ and, for the
    reference, the task file; None where the sandbox is off or unavailable."""
    if not sandbox_active(cfg.sandbox):
        return None
    module = Path(request.module_path)
    mounts = [Mount(work_dir, f"{INSIDE_ROOT}/work", writable=True),
              Mount(Path(request.outputs_dir), f"{INSIDE_ROOT}/outputs", writable=True),
              Mount(Path(request.inputs_dir), f"{INSIDE_ROOT}/inputs",
                    writable=request.role == "reference"),
              Mount(cache_root, f"{INSIDE_ROOT}/cache", writable=True)]
    if not module.resolve().is_relative_to(work_dir.resolve()):
        mounts.append(Mount(module, f"{INSIDE_ROOT}/task/{module.name}"))
    return SandboxPlan(mounts, share_network=cfg.network_isolation == "off")


def _only_one_gpu(request: ChildRequest, env: dict[str, str]) -> None:
    """The child sees only its own GPU, so no work can hide on another device."""
    if not request.device.startswith("cuda"):
        return
    index = int(request.device.partition(":")[2] or 0)
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    ids = [v.strip() for v in visible.split(",")] if visible else None
    env["CUDA_VISIBLE_DEVICES"] = ids[index] if ids and index < len(ids) else str(index)
    request.device = "cuda:0"


def wait_ready(child: ChildProcess, report: ChildReport,
               first_call_limit_s: float | None = None) -> bool:
    """Let a candidate child load, build and warm up (no lock needed); False (and
    report.failure) if it failed. `run_trials` then starts its trials.
    `first_call_limit_s` raises the limit of the warm-up call (made in phase check,
    before "ready") for a candidate that builds in it; its trials keep theirs."""
    limits = child.phase_limits
    if first_call_limit_s is not None:
        child.phase_limits = {**limits, "check": max(limits["check"], first_call_limit_s)}
    try:
        ready = _pump(child, report, "ready")
    finally:
        child.phase_limits = limits
    if ready:
        child.enter_phase("queued")  # waiting for the device: no phase limit runs
    return ready


def run_trials(child: ChildProcess, report: ChildReport,
               on_saved: Callable[[int, Any], None] | None = None,
               outputs: dict[str, Any] | None = None) -> bool:
    """Let the child run its trials (a candidate child: after `wait_ready`, which it is told
    to go on from here); False (and report.failure) if it failed. `on_saved(i, layout)` is
    called as the child says trial i's outputs are written, `layout` being where it says
    they lie in the GPU buffer lent to it (`outputs`), or None for its file: a hint of
    when and where to look, checked before anything is read."""
    if child.request.role == "candidate":
        # The wait for the device ("queued") has no limit; the trials' own starts now, or a
        # long wait would count against them.
        child.enter_phase("check")
        child.permit("check")
        child.send("go", **({"outputs": outputs} if outputs else {}))
    return _pump(child, report, "checked", on_saved)


def _pump(child: ChildProcess, report: ChildReport, until: str,
          on_saved: Callable[[int, Any], None] | None = None) -> bool:
    while True:
        event = child.receive()
        if not isinstance(event, dict):
            report.failure = abnormal_end(event, child.phase)
            return False
        kind = event.get("event")
        if kind == "env":
            report.env = {k: str(v) for k, v in event.items() if k != "event"}
        elif kind == "failure":
            report.failure = _failure(event)
            return False
        elif kind == "ready" and until == "ready":
            return True
        elif kind == "checked" and until == "checked":
            report.flags = {str(k): str(v) for k, v in (event.get("flags") or {}).items()}
            report.steps = _steps(event.get("steps"))
            report.built_on = str(event.get("built_on") or "")
            return True
        elif kind == "saved" and on_saved is not None and type(event.get("trial")) is int:
            on_saved(event["trial"], event.get("layout"))
        elif kind == "done":
            report.failure = Verdict(status="crashed", phase=child.phase,
                                     message="the child ended without running the trials")
            return False


def _steps(reported: object) -> dict[str, float]:
    # Written by the child, so only well-formed entries are kept; they inform, never judge.
    if not isinstance(reported, dict):
        return {}
    return {str(k)[:40]: float(v) for k, v in list(reported.items())[:40]
            if isinstance(v, (int, float)) and v >= 0}


def _failure(event: dict) -> Verdict:
    # The reference child says "task_error"; the caller turns that into a TaskError.
    status = "runtime_error" if event["status"] == "task_error" else event["status"]
    return Verdict(status=status, phase=event["phase"], message=event["message"])


def finish(child: ChildProcess, report: ChildReport | None = None) -> None:
    """Tell the child to stop, note processes it left behind, and kill what remains.

    A child that overran a phase limit or its memory is killed at once with its process
    group: it would not answer "stop", and waiting for it only held up the next
    evaluation. What it started outside its group still counts as left behind (an
    advisory pass such as profiling may have overrun while the verdict stays ok).
    """
    if child.proc is None:
        return
    if not child.begun:  # it ran only pike's imports: nothing of a candidate's to look for
        child.__exit__(None, None, None)
        child.proc = None
        return
    if not child.peak_rss and not child.unresponsive:
        # A child that answered every request within a poll was never measured, and the
        # host-memory gate learns a task's children's size from what it releases
        child.measure_memory()
    # Unwinding a Ctrl-C (or a SIGTERM pike turned into one): the user is waiting, and a
    # child mid-build (a max-autotune compile, a slow constructor) would not answer "stop"
    # before the grace period ran out, so it is killed at once, group and all.
    at_once = child.unresponsive or unwinding_stop()
    if child.pausable_on is not None:  # no timer stops it from here; one that has, ends
        device_lock.unlist_child(child.pausable_on, child.proc.pid)
        if not at_once:
            child.wait_unpaused()
    child.enter_phase("cleanup")  # which also books the time of the phase that ended
    if at_once:
        escaped = child.kill_group()
    elif child.sandboxed:  # what it left dies with its namespace: name it while it runs
        escaped = child.stop_watching(DESCENDANTS_GRACE_S + 4.0, DESCENDANTS_GRACE_S - 1.0)
    else:
        child.send("stop")
        child.wait_exit(timeout=DESCENDANTS_GRACE_S + 4.0)
        escaped = child.leftover_processes()
    if report is not None:
        report.leftovers = escaped
    child.__exit__(None, None, None)
    child.proc = None


def abnormal_end(event: ChildExit | PhaseTimeout | MemoryExceeded, phase: str) -> Verdict:
    if isinstance(event, PhaseTimeout):
        return Verdict(status="timeout", phase=event.phase,
                       message=f"no progress for {event.limit_s:g} s in phase '{event.phase}'")
    if isinstance(event, MemoryExceeded):
        return Verdict(status="crashed", phase=phase,
                       message=f"exceeded the memory limit: {event.used_bytes / 2**30:.1f} GiB "
                               f"used, limit {event.limit_bytes / 2**30:.1f} GiB")
    code = event.returncode
    if event.host_out_of_memory:  # said so that a crowded GPU's retry rule sees it too
        used = (f"; its processes used {event.last_rss_bytes / 2**30:.1f} GiB when last "
                "measured" if event.last_rss_bytes is not None else "")
        how = ("killed by signal SIGKILL: the host ran out of memory (the kernel's "
               f"out-of-memory killer was at work meanwhile{used})")
    elif code is not None and code < 0:
        how = f"killed by signal {signal.Signals(-code).name}"
    elif code == 0:
        how = "exited with status 0 before reporting a result (os._exit or exit in candidate code?)"
    else:
        how = f"exited with status {code}"
    tail = f"\n{event.output_tail}" if event.output_tail else ""
    return Verdict(status="crashed", phase=phase, message=f"{how} during phase '{phase}'{tail}")


@dataclass
class Timer:
    """One thing to time: a mode of a live child ('eager', 'compile:<mode>', 'candidate')."""

    child: ChildProcess
    mode: str
    samples: list[float] = field(default_factory=list)
    error: str | None = None  # the mode failed (e.g. torch.compile); others go on
    failure: Verdict | None = None  # the child failed or died while timing
    warmed: bool = False
    build_s: float | None = None  # building and warming it up before timing (baselines)
    prebuild_s: float | None = None  # of build_s, a first build beside other evaluations
    prebuild_failed: bool = False  # that first build took the child down
    checked: bool | None = None  # a baseline's compile mode matched eager; False: uncheckable
    check_note: str | None = None  # why it could not be checked
    blocks: list[tuple[float, list[float]]] = field(default_factory=list)  # (wall s, samples)
    outputs: list[dict] = field(default_factory=list)  # samples of timed calls' outputs
    probe_samples: list[float] = field(default_factory=list)  # calls on never-seen inputs
    rehearsed: int = 0  # outputs a trusted child sampled only for the cost (RehearsedSamples)
    gave_up_after: int | None = None  # rounds timed before the window gave up on it
    behind_best: float | None = None  # the search's best it was too far behind, if that was why
    shared_by: int = 1  # candidates timed in its window beside one eager (shared_window.py)
    noted: bool = False  # an eager timer whose median the reference run has kept
    usual_ms: float | None = None  # eager's: the reference's usual time as its window began

    @property
    def stopped(self) -> bool:
        return self.error is not None or self.failure is not None

    def calls_s(self) -> float:
        """What the calls of its blocks after the first (the warm-up, not kept) took, as
        reported, in seconds: a diagnostic, a candidate's samples being its own."""
        return sum(sum(samples) for _, samples in self.blocks) / 1000

    def blocks_s(self) -> float:
        """What those blocks took by the parent's clock, in seconds."""
        return sum(wall for wall, _ in self.blocks)


def request(child: ChildProcess, phase: str, answer: str, event: str,
            **fields: object) -> dict | Verdict:
    """Send one request to a live child; its answer, or a Verdict of how it failed.

    Each request carries a fresh random id that the answer must echo, so that a message
    candidate code writes into the channel on its own is recognised as forged.
    """
    seq = secrets.token_hex(8)
    child.enter_phase(phase)
    child.send(event, seq=seq, **fields)
    while True:
        reply = child.receive()
        if not isinstance(reply, dict):
            return abnormal_end(reply, phase)
        kind = reply.get("event")
        if kind == answer and reply.get("seq") != seq:
            return Verdict(status="rejected", phase=phase,
                           message="wrote a forged message into the evaluator's channel")
        if kind == answer:
            return reply
        if kind == "failure":
            return _failure(reply)
        if kind == "done":
            return Verdict(status="crashed", phase=phase,
                           message=f"the child ended in the middle of phase '{phase}'")


def stage_timed_inputs(child: ChildProcess) -> Verdict | None:
    """The candidate's timed input sets staged and loaded onto its device now, before its
    window, which then times calls only; a Verdict where that failed (the child has ended).
    Loaded at the window's first block, the sets (three rotated and four probes, up to
    1 GiB each on the level2 tasks) held the device alone while they moved: on the H200
    level2 bench its windows took 0.4 to 1.3 s more on the large-input convolutions than
    on the GEMMs beside the same timed calls. No candidate code runs for it: the sets sit
    in the runner until the first timed call, as they did. Their files are then taken
    out of the child's folder: no timed call can read a set ahead of its turn from disk
    (the four probe sets, first seen at their own calls, tell reused answers from work).
    Hold the device as a child's untimed work does (`hold_for_build`)."""
    child.permit("timing")
    reply = request(child, "timing", "timed_inputs_staged", "stage_timed_inputs",
                    mode="candidate")
    if child.stage is not None:
        child.stage.withdraw("timing")
    if isinstance(reply, Verdict):
        return reply
    if reply.get("error"):  # a child that reports a mode's failure and goes on
        return Verdict(status="runtime_error", phase="timing", message=str(reply["error"]))
    return None


def _time_one_block(timer: Timer, min_calls: int, min_seconds: float, max_calls: int) -> None:
    warm_up = not timer.warmed
    started = time.perf_counter()
    reply = request(timer.child, "timing", "timed", "time", mode=timer.mode,
                    warm_up=warm_up, min_calls=min_calls, min_seconds=min_seconds,
                    max_calls=max_calls)
    # Up to when the answer could first be read: what this thread did after that (other
    # threads holding the GIL, the memory watch) is not the child's time.
    arrived = timer.child.line_ready_at
    wall = (arrived if arrived > started else time.perf_counter()) - started
    timer.warmed = True
    if isinstance(reply, Verdict):
        timer.failure = reply
    elif reply.get("samples"):
        # Only a candidate's child runs code that could write the list; the reference's
        # modes and the loop's empty calibration calls are trusted code.
        bad = _implausible_sample(reply["samples"]) if timer.mode == "candidate" else None
        if bad is not None:
            # No call takes no time: such a sample was written into the timing loop's list
            # by code that shares the child's interpreter. Kept, enough of them make the
            # median 0 and the speedup inf, whatever the wall-clock bounds say.
            timer.failure = Verdict(status="rejected", phase="timing",
                                    message=f"reported a timed call of {bad} ms, which no "
                                            "call takes: its timing samples were rewritten")
            return
        samples = [float(x) for x in reply["samples"]]
        taken = ([o for o in reply["outputs"] if isinstance(o, dict)]
                 if isinstance(reply.get("outputs"), list) else [])
        probes = reply.get("probe_calls")  # written by the child: anything may be there
        claimed = [i for i in (probes if isinstance(probes, list) else [])
                   if type(i) is int and 0 <= i < len(samples)]
        if timer.mode == "candidate":
            problem = _claimed_probes_problem(claimed, taken, timer.child)
            if problem is not None:
                timer.failure = Verdict(status="rejected", phase="timing", message=problem)
                return
        timer.samples.extend(samples)
        timer.child.timed_calls += len(samples)
        timer.outputs.extend(taken)
        if timer.mode != "candidate" and isinstance(reply.get("rehearsed"), int):
            timer.rehearsed += reply["rehearsed"]
        for i in claimed:
            timer.probe_samples.append(samples[i])
            timer.child.probes_timed += 1
        if not warm_up:
            timer.blocks.append((wall, samples))
    else:
        timer.error = str(reply.get("error") or "no samples")


def _claimed_probes_problem(claimed: list[int], taken: list[dict], child: ChildProcess
                            ) -> str | None:
    """Why a candidate's block names probe calls it did not make (None when it made them).
    The child draws at most one probe a block and samples every probe's outputs
    (timed_calls.TimedOutputSamples), so each probe it names comes with a sample of a probe
    set's outputs, which the parent compares with the reference's answers for that set
    (check.timed_outputs_problem): only a call on the probe set's inputs gives them. The
    list of probe calls alone is the child's word: a candidate that starved the rotation
    of probes and wrote a memo hit into that list was `ok` at 150x on the CPU
    (tests/candidates/claims_probes)."""
    if not claimed:
        return None
    if len(claimed) > 1:
        return (f"its timing block names {len(claimed)} calls on never-seen inputs, where "
                "the evaluator draws at most one a block: the timing loop's records were "
                "rewritten")
    input_sets = child.request.input_sets
    if not any(type(o.get("set")) is int and o["set"] >= input_sets for o in taken):
        return ("its timing block names a call on never-seen inputs with no sample of "
                "those inputs' outputs, which every such call gives: the timing loop's "
                "records were rewritten")
    return None


# A nanosecond, in ms: below any clock's tick (CUDA events around nothing read 0.003 ms on
# an H200), and far enough above 0 that a median of such samples divides nothing to inf.
MIN_SAMPLE_MS = 1e-6


def _implausible_sample(reported: object) -> str | None:
    """The first sample no call could have taken (not a number, not finite, under a
    nanosecond), as the child sent it; None when every one is a time."""
    if not isinstance(reported, list):
        return repr(reported)[:40]
    for x in reported:
        if type(x) not in (int, float):
            return repr(x)[:40]
        try:
            value = float(x)  # JSON carries integers of any size
        except OverflowError:
            return repr(x)[:40]
        if not math.isfinite(value) or value < MIN_SAMPLE_MS:
            return repr(x)[:40]
    return None


@dataclass
class LoopCost:
    """What the timing loop costs outside the timed region: per block and per call."""

    per_block_s: float
    per_call_s: float


def calibrate(trusted: ChildProcess) -> LoopCost:
    """Time an empty call in blocks of two sizes in the (trusted) reference child; the
    difference separates the per-call cost (flush, events, sync) from the per-block cost
    (the request over the pipes, the untimed first call)."""
    walls = {}
    for calls in (0, 10, 200):  # the first only warms the loop up
        timer = Timer(trusted, "empty", warmed=calls > 0)
        started = time.perf_counter()
        _time_one_block(timer, min_calls=max(calls, 1), min_seconds=0.0,
                        max_calls=max(calls, 1))
        # measured as the blocks it is subtracted from are (to their answer's arrival)
        walls[calls] = timer.blocks[-1][0] if timer.blocks else time.perf_counter() - started
        if timer.stopped:
            return LoopCost(0.0, 0.0)
    per_call = max(0.0, (walls[200] - walls[10]) / 190)
    return LoopCost(max(0.0, walls[10] - 10 * per_call), per_call)


_SLACK_S = 0.005  # scheduling noise of one block on a busy host


# A block is suspicious when the wall time its calls cannot account for exceeds this many
# times what it reported; a window whose blocks are mostly suspicious is forged unless its
# median stretch is within CONTROL_FACTOR of the reference's (a loaded host stretches
# both). Measured by bench/wall_margin.py: honest blocks stretch at most 1.32 on a CPU
# host and 1.10 on an H200, the reference's at most 1.13 (wall-margin-cpu.md,
# wall-margin-h200.md); 3 let a candidate report a third of its time.
WALL_MARGIN = 2.0
CONTROL_FACTOR = 2.0
# Below the margin, a figure is still held to the parent's clock: a candidate whose median
# stretch is more than this times the reference's gets the time its blocks support. Honest
# medians sit at 0.94 to 1.04 beside references at 0.84 to 0.88 (same tables), so honest
# figures are untouched and an under-reporting candidate gains at most this much.
FIGURE_TOLERANCE = 1.2
# The bound on the median sample (what the figure is) is looser: how far the clock's time
# per call sits above the median depends on the spread of each one's calls, and under load
# the candidate's and the reference's spreads differ. With two busy loops on the 2-core CPU
# host an honest candidate came out at up to 2.0 times the reference's ratio (raised 1.68x
# at a tolerance of 1.2); a forger's is its true time over a microsecond.
MEDIAN_TOLERANCE = 3.0


def block_stretches(cost: LoopCost, timer: Timer) -> list[float]:
    """Each block's wall time left after the loop's cost and a slack, over what the child
    reported for it (its samples and the untimed first call)."""
    stretches = []
    for wall, samples in timer.blocks:
        reported = _reported_s(samples)
        unexplained = _calls_wall_s(cost, wall, samples)
        stretches.append(unexplained / reported if reported > 0 else math.inf)
    return stretches


def _reported_s(samples: list[float]) -> float:
    """What a block's samples (ms) say its calls took, the untimed first call counted as
    one of their mean, in seconds."""
    return (sum(samples) + statistics.fmean(samples)) / 1e3


def _calls_wall_s(cost: LoopCost, wall: float, samples: list[float]) -> float:
    """What the parent's clock leaves of a block for its calls (the untimed first one
    too): its wall time less the loop's cost and the scheduling slack."""
    return wall - cost.per_block_s - (len(samples) + 1) * cost.per_call_s - _SLACK_S


def _stretch(cost: LoopCost, timer: Timer) -> tuple[int, float]:
    """(blocks whose stretch exceeds WALL_MARGIN, median stretch)."""
    stretches = block_stretches(cost, timer)
    suspicious = sum(s > WALL_MARGIN for s in stretches)
    return suspicious, statistics.median(stretches) if stretches else 0.0


def wall_clock_factor(cost: LoopCost, judged: Timer, reference: Timer) -> float:
    """By how much the judged child's reported times must grow for its blocks to stretch no
    more than FIGURE_TOLERANCE times the reference's (at least 1): 1.0 for honest timings.

    Held two ways, since the figure is the median sample, not the blocks' sums: the blocks'
    sums against their wall times, and the median sample against the per-call time the
    clock supports. A candidate that rewrites earlier samples of a block and leaves its
    last one true keeps each block's sum near the truth while most samples, and so the
    median, are forged: on a loaded CPU host blocks of two and three calls let one through
    at 629,229x before the second bound."""
    if not judged.blocks or not reference.blocks:
        return 1.0
    _, ratio = _stretch(cost, judged)
    _, ref_ratio = _stretch(cost, reference)
    if not math.isfinite(ratio):  # blocks that reported nothing: the margin's to judge
        return 1.0
    by_sums = ratio / (FIGURE_TOLERANCE * _allowance(ref_ratio))
    # The same for the median: the clock's time per call over the median sample, against
    # the reference's (a loaded host's long tail lifts the mean above the median for both).
    # A median of 0 gives no ratio: no factor raises it (such samples are refused where
    # they arrive, in _time_one_block), and a reference's allows nothing beyond 1.
    judged_over, reference_over = (_clock_over_median(cost, judged),
                                   _clock_over_median(cost, reference))
    by_median = (0.0 if judged_over is None
                 else judged_over / (MEDIAN_TOLERANCE * _allowance(reference_over)))
    factor = max(by_sums, by_median)
    return factor if factor > 1.0 + 1e-9 else 1.0  # at the bound exactly: honest


def _allowance(reference_ratio: float | None) -> float:
    """The reference's ratio as the judged one's allowance: at least 1, and 1 where the
    reference's cannot be taken (no median, blocks that reported nothing)."""
    if reference_ratio is None or not math.isfinite(reference_ratio):
        return 1.0
    return max(reference_ratio, 1.0)


def _clock_over_median(cost: LoopCost, timer: Timer) -> float | None:
    """The median over blocks of the time per call the parent's clock leaves for the calls
    (the untimed first one too, after the loop's cost and the slack), over the median of
    the reported samples: about 1 for honest calls of little spread; None where that
    median is not a positive time."""
    median_ms = statistics.median(x for _, samples in timer.blocks for x in samples)
    clock_ms = statistics.median(max(0.0, _calls_wall_s(cost, wall, samples))
                                 / (len(samples) + 1) * 1e3 for wall, samples in timer.blocks)
    return clock_ms / median_ms if median_ms > 0 else None


def unaccounted_wall_time(cost: LoopCost, judged: Timer, reference: Timer,
                          strict: bool = False) -> str | None:
    """Why the judged child's timings cannot be true, or None when they account for the
    wall time the parent measured around each of its blocks.

    Everything in the child can be reached by the candidate's code (frames, memory), so
    its reported samples are checked against a clock the candidate cannot touch. The
    trusted reference, timed in the same window, tells an overloaded host (its blocks
    stretch too) from forged timings: the candidate's blocks must stretch far more than
    the reference's, not merely as much, before it counts as forged.
    """
    suspicious, ratio = _stretch(cost, judged)
    if not judged.blocks or suspicious <= len(judged.blocks) // 2:
        return None
    _, ref_ratio = _stretch(cost, reference)
    # `strict`: the second look after a window that was clearly forged; a load that now
    # stretches the reference too must not clear it (a forger would wait for one).
    if not strict and (ratio <= CONTROL_FACTOR * max(ref_ratio, 1.0)
                       or _within_the_reference_s_load(cost, judged, reference)):
        log.warning("wall-clock check inconclusive: the host is loaded (the reference's "
                    "timing blocks stretched too)")
        return None
    return (f"reported timings that do not account for the wall time of its timing "
            f"blocks ({suspicious} of {len(judged.blocks)} blocks took over "
            f"{WALL_MARGIN:g}x longer than the calls it reported; median stretch "
            f"{ratio:.2f} against the reference's {ref_ratio:.2f})")


def _within_the_reference_s_load(cost: LoopCost, judged: Timer, reference: Timer) -> bool:
    """Whether most of the judged child's blocks stay within the margin once CONTROL_FACTOR
    times the wall time the reference's blocks took beyond their calls (the host's load
    per block, in seconds) is taken off theirs. The ratios alone miss that load where the
    calls take microseconds: the slack taken off every block is most of it, so the
    reference's stretch reads negative (-1.77 on the 2-core CI host) while its blocks took
    nearly as long as the candidate's, which a few hundred microseconds more put over."""
    if not reference.blocks:
        return False
    load = statistics.median(max(0.0, _calls_wall_s(cost, wall, samples) + _SLACK_S
                                 - _reported_s(samples))
                             for wall, samples in reference.blocks)
    over = 0
    for wall, samples in judged.blocks:
        reported = _reported_s(samples)
        left = _calls_wall_s(cost, wall, samples) - CONTROL_FACTOR * load
        over += left > WALL_MARGIN * reported
    return over <= len(judged.blocks) // 2


def time_interleaved(timers: list[Timer], cfg: TimingConfig, flipped: bool = False,
                     stop_at_failure: bool = False, give_up: bool = False,
                     best: Callable[[], float | None] | None = None, each: bool = False,
                     before_block: Callable[[Timer], None] | None = None) -> None:
    """Time every timer in `cfg.rounds` blocks, alternating the order each round (ABBA;
    BAAB where `flipped`, so that a window timed again puts other timers mid-window).
    A failure ends the window after its round; with `stop_at_failure`, at once, so that
    timers sharing a child that died leave only the one that failed marked. With
    `give_up` (a candidate's window: the reference first, the candidate second), once
    GIVE_UP_AFTER_ROUNDS rounds and the calls the reuse check needs are in, a candidate
    `cfg.give_up_slower_than` times slower than the reference ends it, and so does one
    `cfg.give_up_behind_best` times behind `best()` (its search's best speedup so far,
    search_bar.py), marked in `Timer.gave_up_after` (and `Timer.behind_best`).

    With `each` (a window of several candidates of one task beside their reference,
    shared_window.py), timers[1:] are judged each on its own: a candidate's failure or
    give-up stops only it, and the window ends when none is left or the reference fails.
    `before_block(timer)` runs before each block (the shared window stops the candidates
    not being timed)."""
    rounds = cfg.rounds
    per_block = {"min_calls": math.ceil(cfg.min_calls / rounds),
                 "min_seconds": cfg.min_seconds / rounds,
                 "max_calls": max(1, cfg.max_calls // rounds)}
    reference, candidates = timers[0], timers[1:]
    for i in range(rounds):
        for timer in timers if (i + flipped) % 2 == 0 else reversed(timers):
            if not timer.stopped and timer.gave_up_after is None:
                if before_block is not None:
                    before_block(timer)
                if each and timer is not reference:
                    _time_own_block(timer, per_block)
                else:
                    _time_one_block(timer, **per_block)
                if stop_at_failure and timer.failure is not None:
                    return
        if (reference.failure is not None if each
                else any(t.failure is not None for t in timers)):
            return
        if give_up and GIVE_UP_AFTER_ROUNDS <= i + 1 < rounds:
            bar = best() if best is not None else None
            for candidate in candidates if each else candidates[:1]:
                if candidate.stopped or candidate.gave_up_after is not None:
                    continue
                fastest = _fastest_speedup([reference, candidate])
                if _hopeless(fastest, cfg.give_up_slower_than):
                    candidate.gave_up_after = i + 1
                elif behind_bar(fastest, bar, cfg.give_up_behind_best):
                    candidate.gave_up_after, candidate.behind_best = i + 1, bar
        if (each or give_up) and all(t.stopped or t.gave_up_after is not None
                                     for t in candidates):
            return


def _time_own_block(timer: Timer, per_block: dict[str, Any]) -> None:
    """A candidate's block in a window it shares: whatever its answer makes this thread
    raise is its own failure, not the window's (the window's leader reads every
    candidate's answers, and the others would be timed again alone)."""
    try:
        _time_one_block(timer, **per_block)
    except Exception as err:
        timer.child.unresponsive = True  # stopped without being asked
        timer.failure = Verdict(status="rejected", phase="timing",
                                message=f"answered a timing request with a message the "
                                        f"evaluator could not read ({type(err).__name__}: "
                                        f"{str(err)[:120]})")


# Rounds a window times before it may end for a hopeless candidate: enough blocks of each
# that one slow block (a burst of host load) does not decide it. It also waits for the
# candidate's calls to reach check.REUSE_MIN_SAMPLES: the first call on each input set
# can be slow for a fair reason (a CUDA graph captured per input) or an unfair one (a
# memo filling, which the reuse check must still see).
GIVE_UP_AFTER_ROUNDS = 3


def _fastest_speedup(timers: list[Timer]) -> float | None:
    """The speedup the candidate's (timers[1]) fastest call so far makes against the
    reference's (timers[0]) median: what its median could still reach, and no more. Its
    fastest call, not its median: on a loaded 2-core CI host an honest candidate faster
    than the reference had a median over three times the reference's in its first rounds,
    and a burst slows many calls but seldom every one. None before the reuse check's
    calls are in."""
    reference, candidate = timers[0], timers[1]
    if not reference.samples or len(candidate.samples) < check.REUSE_MIN_SAMPLES:
        return None
    return statistics.median(reference.samples) / min(candidate.samples)


def _hopeless(fastest: float | None, slower_than: float | None) -> bool:
    """Whether even the candidate's fastest call so far (`fastest`, _fastest_speedup) is
    over `slower_than` times the reference's median: no search would take it, and each
    further round of it holds the device alone for nothing while every other evaluation
    waits."""
    return slower_than is not None and fastest is not None and fastest * slower_than < 1


def behind_bar(fastest: float | None, bar: float | None, factor: float | None) -> bool:
    """Whether a candidate whose fastest call makes `fastest` is over `factor` times behind
    its search's `bar` (search_bar.py); bench/search_time.py replays the rule with it."""
    return (factor is not None and bool(bar) and fastest is not None
            and fastest * factor < bar)
