"""Talking to a started child from the parent: its trials, single requests, and its end.

Starting one is child_launch.py; timing windows, timing_window.py; the check of reported
times against the parent's clock, wall_clock_check.py.
"""

from __future__ import annotations

import secrets
import signal
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pike.evaluate import device_lock
from pike.evaluate.child_ends import ChildExit, MemoryExceeded, PhaseTimeout, TooManyProcesses
from pike.evaluate.disk_use import DiskExceeded
from pike.evaluate.protocol import DESCENDANTS_GRACE_S
from pike.evaluate.sandbox import ChildProcess
from pike.evaluate.verdict import Verdict
from pike.threads import unwinding_stop


@dataclass
class ChildReport:
    """What a child said before timing: its environment, or how it failed."""

    env: dict[str, str] = field(default_factory=dict)
    failure: Verdict | None = None
    leftovers: list[str] = field(default_factory=list)
    flags: dict[str, str] = field(default_factory=dict)  # backend flags the child changed
    steps: dict[str, float] = field(default_factory=dict)  # the child's own (steps.py)
    built_on: str = ""  # a reference's: where its model was built ('cpu' or 'device')


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
        if child.ended_by is not None and report.failure is None:
            # ended by child_watch after its last message: no receive came to say so
            report.failure = abnormal_end(child.ended_by, child.ended_in)
    child.__exit__(None, None, None)
    child.proc = None


def abnormal_end(event: ChildExit | PhaseTimeout | MemoryExceeded | TooManyProcesses
                 | DiskExceeded, phase: str) -> Verdict:
    if isinstance(event, DiskExceeded):
        return Verdict(status="crashed", phase=phase, message=event.message())
    if isinstance(event, PhaseTimeout):
        return Verdict(status="timeout", phase=event.phase,
                       message=f"no progress for {event.limit_s:g} s in phase '{event.phase}'")
    if isinstance(event, TooManyProcesses):
        said = f"started {event.count} processes, over the limit of {event.limit}"
        if event.role == "reference":  # the task's own code: a failure, not an attack
            return Verdict(status="crashed", phase=phase, message=f"the task's code {said}")
        # no inference needs them: a fork bomb, most likely
        return Verdict(status="rejected", phase=phase, message=f"{said} (a fork bomb?); ended")
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
    elif code is None:  # still running: what it sent is the problem (the tail says what)
        how = "sent no valid message"
    elif code == 0:
        how = "exited with status 0 before reporting a result (os._exit or exit in candidate code?)"
    else:
        how = f"exited with status {code}"
    tail = f"\n{event.output_tail}" if event.output_tail else ""
    return Verdict(status="crashed", phase=phase, message=f"{how} during phase '{phase}'{tail}")


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
