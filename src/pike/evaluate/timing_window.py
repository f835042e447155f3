"""Timing windows: blocks of timed calls, alternated between children.

Timing alternates short blocks between children (reference, candidate, candidate,
reference, ...). The lent GPU hosts change speed by up to 2x within seconds (measured with
bench/timing_noise.py), and eager models are bound by host dispatch, so two measurements
taken a minute apart are not comparable; blocks interleaved in one window are.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pike.config import TimingConfig
from pike.evaluate import check
from pike.evaluate.core_wait import waited_s
from pike.evaluate.driver import request
from pike.evaluate.sandbox import ChildProcess
from pike.evaluate.timed_calls import TimedOutputSamples
from pike.evaluate.verdict import Verdict

# What a block's sampler takes at most (PER_BLOCK calls and a probe); more in a child's
# reply is forged, and the reference would compute it.
SAMPLES_A_BLOCK = TimedOutputSamples.PER_BLOCK + 1


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
    withheld: str | None = None  # why its figure is withheld (slow probes, its calls unsteady)
    slow_probes: check.SlowProbes | None = None  # what the reuse check found (candidate_windows)
    core_wait_s: float | None = 0.0  # its blocks' wait for a core (core_wait); None: unknown

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


def add_timing_steps(steps: Any, shares: list[tuple[Timer, float]]) -> None:
    """Of a window's blocks after each timer's first (which warms up and is not kept in
    `blocks`): what their calls took (as reported: diagnostic only, a candidate's samples
    are its own), what they took by the parent's clock, and how long the children waited
    for a core meanwhile, each timer counted at its share (an eager timer shared by the
    candidates of one window counts a part to each). The rest of `timing` is the first
    blocks, staging and moving the children's cores."""
    steps.add("timing.calls", sum(t.calls_s() * share for t, share in shares))
    steps.add("timing.blocks", sum(t.blocks_s() * share for t, share in shares))
    steps.add("timing.core_wait", sum((t.core_wait_s or 0.0) * share for t, share in shares))


def _time_one_block(timer: Timer, min_calls: int, min_seconds: float, max_calls: int) -> None:
    warm_up = not timer.warmed
    runner = None if warm_up else _waits_counted_for(timer.child)
    waited_before = waited_s(runner)
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
            problem = (f"it sent {len(taken)} samples of one block's outputs; a block takes "
                       f"{SAMPLES_A_BLOCK} at most" if len(taken) > SAMPLES_A_BLOCK else
                       _claimed_probes_problem(claimed, taken, timer.child))
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
            waited_after = waited_s(runner)
            if timer.core_wait_s is not None:
                timer.core_wait_s = (timer.core_wait_s + waited_after - waited_before
                                     if waited_before is not None and waited_after is not None
                                     else None)
    else:
        timer.error = str(reply.get("error") or "no samples")


def _waits_counted_for(child: ChildProcess) -> int | None:
    """The pid whose wait for a core a kept block counts (core_wait): a child's on a CPU.
    None on a GPU, whose calls' waits for the host are launch gaps, not looked at there
    (candidate_windows.waited_for_cores), and for anything but a child."""
    if not isinstance(child, ChildProcess) or child.request.device != "cpu":
        return None
    return child.runner_pid()


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
