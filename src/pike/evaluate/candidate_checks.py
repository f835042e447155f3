"""Whether a candidate's outputs are right: its trials compared with the reference's
expected outputs (judged again against the reference's float64 run where only its own
rounding may explain a failure), and the final check of its outputs after timing.
"""

from __future__ import annotations

from contextlib import ExitStack
from pathlib import Path

import torch

from pike.config import EvalConfig
from pike.evaluate import own_rounding
from pike.evaluate.device_lock import hold_for_work
from pike.evaluate.driver import request
from pike.evaluate.reference import ReferenceRun
from pike.evaluate.sandbox import ChildProcess
from pike.evaluate.steps import span
from pike.evaluate.trial_comparison import (
    TrialComparison,
    compare_device,
    compare_with_room,
    file_loader,
    read_back,
    release_compare_memory,
)
from pike.evaluate.verdict import Verdict


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
            why = own_rounding.unexplained(doubtful, reference.expected[final],
                                           reference.exact_outputs(final), cfg.rtol,
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
    doubtful = own_rounding.all_doubtful(bad, expected, actual, cfg.trials + 1, cfg.atol,
                                         cfg.rtol, here)
    del actual
    release_compare_memory(on)
    if not bad:
        return Verdict(status="ok"), []
    return Verdict(status="incorrect", phase="check", mismatches=bad[:20],
                   message="after timing, new values written into the same input tensors "
                           f"gave wrong outputs (output {bad[0].output}: {bad[0].problem}); "
                           "answers cached by pointer, shape or call count are not allowed"
                   ), doubtful or []
