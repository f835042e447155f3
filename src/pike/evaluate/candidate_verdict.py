"""A candidate's verdict from its child's report, its trials, its windows and its final
check, with the window's figures and the floor attached.
"""

from __future__ import annotations

import logging

from pike.evaluate.driver import ChildReport
from pike.evaluate.timing_window import Timer
from pike.evaluate.verdict import TimingStats, Verdict
from pike.floor import Work, floor, times_floor

log = logging.getLogger(__name__)


def attach_floor(verdict: Verdict, work: Work | None) -> None:
    """The verdict's runtime as a multiple of the least time its GPU could take."""
    found = floor(work, verdict.device_name) if work is not None else None
    if found is None or verdict.runtime is None or found.ms <= 0:
        return
    verdict.floor_ms = found.ms
    verdict.times_floor = times_floor(verdict.runtime.median_ms, found)


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
