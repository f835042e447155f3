"""Driving children from the parent: start, run to the end of the trials, time, finish.

Timing alternates short blocks between children (reference, candidate, candidate,
reference, ...). The lent GPU hosts change speed by up to 2x within seconds (measured with
bench/timing_noise.py), and eager models are bound by host dispatch, so two measurements
taken a minute apart are not comparable; blocks interleaved in one window are.
"""

from __future__ import annotations

import math
import signal
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from pike.config import EvalConfig, TimingConfig
from pike.evaluate.protocol import ChildRequest
from pike.evaluate.sandbox import (
    ChildExit,
    ChildProcess,
    MemoryExceeded,
    PhaseTimeout,
    scrubbed_environment,
)
from pike.evaluate.verdict import Verdict


@dataclass
class ChildReport:
    """What a child said before timing: its environment, or how it failed."""

    env: dict[str, str] = field(default_factory=dict)
    failure: Verdict | None = None
    leftovers: list[str] = field(default_factory=list)


def start_child(request: ChildRequest, work_dir: Path, cfg: EvalConfig,
                build_key: str) -> ChildProcess:
    """Start a sandboxed child; the caller must `finish` it (or call its __exit__)."""
    cache_root = cfg.build_cache or Path.home() / ".cache" / "pike" / "build"
    cache_root.mkdir(parents=True, exist_ok=True)
    env = scrubbed_environment(work_dir, uuid.uuid4().hex, cache_root / build_key, cache_root)
    lim = cfg.limits
    phase_limits = {"setup": lim.load_seconds, "load": lim.load_seconds,
                    "init": lim.load_seconds, "check": lim.check_seconds,
                    "timing": lim.timing_seconds, "cleanup": 10.0}
    child = ChildProcess(request, work_dir, env, lim, phase_limits)
    return child.__enter__()


def run_trials(child: ChildProcess, report: ChildReport) -> bool:
    """Let the child load, build and run its trials; False (and report.failure) if it failed."""
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
        elif kind == "checked":
            return True
        elif kind == "done":
            report.failure = Verdict(status="crashed", phase=child.phase,
                                     message="the child ended without running the trials")
            return False


def _failure(event: dict) -> Verdict:
    # The reference child says "task_error"; the caller turns that into a TaskError.
    status = "runtime_error" if event["status"] == "task_error" else event["status"]
    return Verdict(status=status, phase=event["phase"], message=event["message"])


def finish(child: ChildProcess, report: ChildReport | None = None) -> None:
    """Tell the child to stop, note processes it left behind, and kill what remains."""
    if child.proc is None:
        return
    child.send("stop")
    child.enter_phase("cleanup")
    child.wait_exit(timeout=5.0)
    if report is not None:
        report.leftovers = child.leftover_processes()
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
    if code is not None and code < 0:
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

    @property
    def stopped(self) -> bool:
        return self.error is not None or self.failure is not None


def _time_one_block(timer: Timer, min_calls: int, min_seconds: float, max_calls: int) -> None:
    child = timer.child
    child.enter_phase("timing")
    child.send("time", mode=timer.mode, warm_up=not timer.warmed, min_calls=min_calls,
               min_seconds=min_seconds, max_calls=max_calls)
    timer.warmed = True
    while True:
        event = child.receive()
        if not isinstance(event, dict):
            timer.failure = abnormal_end(event, "timing")
            return
        kind = event.get("event")
        if kind == "timed":
            if event.get("samples"):
                timer.samples.extend(float(x) for x in event["samples"])
            else:
                timer.error = str(event.get("error") or "no samples")
            return
        if kind == "failure":
            timer.failure = _failure(event)
            return
        if kind == "done":
            timer.failure = Verdict(status="crashed", phase="timing",
                                    message="the child ended in the middle of timing")
            return


def time_interleaved(timers: list[Timer], cfg: TimingConfig) -> None:
    """Time every timer in `cfg.rounds` blocks, alternating the order each round (ABBA)."""
    rounds = cfg.rounds
    per_block = {"min_calls": math.ceil(cfg.min_calls / rounds),
                 "min_seconds": cfg.min_seconds / rounds,
                 "max_calls": max(1, cfg.max_calls // rounds)}
    for i in range(rounds):
        for timer in timers if i % 2 == 0 else reversed(timers):
            if not timer.stopped:
                _time_one_block(timer, **per_block)
        if any(t.failure is not None for t in timers):
            return
