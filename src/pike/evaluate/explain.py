"""What each guard checked and saw, for `pike eval --explain` and the run store."""

from __future__ import annotations

from pike.config import EvalConfig
from pike.evaluate.driver import ChildReport
from pike.evaluate.network_namespace import network_isolation
from pike.evaluate.os_sandbox import sandbox_status
from pike.evaluate.sandbox import ChildProcess
from pike.evaluate.timing_window import Timer
from pike.evaluate.verdict import Verdict
from pike.evaluate.wall_clock_check import FIGURE_TOLERANCE, WALL_MARGIN


def explain_guards(cfg: EvalConfig, report: ChildReport, correctness: Verdict | None,
                   timers: list[Timer], final: Verdict | None,
                   child: ChildProcess) -> dict[str, str]:
    checked = correctness is not None
    if not cfg.guards:
        return {"guards": "off (EvalConfig.guards is false): only the basic checks ran",
                "leftover processes": ", ".join(report.leftovers) or "none"}
    notes = {
        "process sandbox": "own session and temp dir, fake HOME, an allow-listed "
                           "environment (no secrets, no real home), network: "
                           + ("own namespace (the OS sandbox's)" if child.plan_notes
                              else network_isolation(cfg.network_isolation)),
        **(child.plan_notes or {"os sandbox": sandbox_status(cfg.sandbox)}),
        "system calls": "a seccomp filter refuses fallocate's KEEP_SIZE, io_uring and other "
                        "ABIs' calls (syscall_filter.py): "
                        + report.env.get("syscall_filter", "not reported by the child"),
        "audit hook": "refuses network, writes outside the work and build dirs, patching "
                      "timer/tensor classes, gc object walks, evaluator frame access",
        "reference code": "the task file is not importable from the candidate's code"
                          if checked else "not reached",
        "fresh inputs": f"{cfg.trials} trials, each with inputs from its own seed ("
                        + ("drawn from the OS's randomness" if cfg.seed is None else
                           f"fixed by eval.seed {cfg.seed}: predictable") + "); each phase's "
                        "inputs reach the candidate only when the phase starts"
                        if checked else "not reached",
        "other distribution": "one trial with floating inputs of a drawn scale and shift"
                              if checked else "not reached",
        "timed outputs": (f"timed calls rotate over {cfg.timing.input_sets} input sets unseen "
                          "in the trials; a random half of them (up to 8 a block) have their "
                          "outputs sampled at random positions and compared with the "
                          "reference's" + _shared(timers) + _cut_short(timers))
                         if timers else "not timed",
        "aliasing and mutation": "outputs must not share memory with inputs; inputs unchanged"
                                 if checked else "not reached",
        "cached answers": "outputs must change when inputs change" if checked else "not reached",
        "after timing": _after_timing(final),
        "wall clock": f"pike's own clock around each timing block must account for the "
                      f"calls the child reported: mostly over {WALL_MARGIN:g}x is rejected; "
                      f"over {FIGURE_TOLERANCE:g}x the reference's stretch, the candidate's "
                      "times are raised to what the clock supports" if timers else "not timed",
        "side streams": "each call's time ends after a device-wide synchronize when work ran "
                        "past the end event" if timers else "not timed",
        "backend flags": ", ".join(f"{k}: {v}" for k, v in report.flags.items())
                         or "unchanged (TF32, cudnn, default dtype, determinism)",
        "leftover processes": ", ".join(report.leftovers) or "none",
    }
    if report.failure is not None and report.failure.status == "rejected":
        notes["rejected"] = report.failure.message
    return notes


def _after_timing(final: Verdict | None) -> str:
    if final is None:
        return "not reached"
    if final.ok:
        return "new values in the timed input tensors gave correct outputs"
    return final.message


def _shared(timers: list[Timer]) -> str:
    shared = timers[1].shared_by if len(timers) > 1 else 1
    if shared <= 1:
        return ""
    return (f"; its window timed {shared} candidates of the task beside one eager, each "
            "against eager and each stopped while the others were timed")


def _cut_short(timers: list[Timer]) -> str:
    rounds = timers[1].gave_up_after if len(timers) > 1 else None
    if rounds is None:
        return ""
    return (f"; the window ended after {rounds} rounds ({why_cut_short(timers[1].behind_best)}"
            "), too few calls for the checks that need many (every sample missing, answers "
            "reused), so no search takes this verdict as its best")


def why_cut_short(behind_best: float | None) -> str:
    """Why a candidate's window ended early, in words (a verdict's `behind_best`)."""
    if behind_best is None:
        return "over eval.timing.give_up_slower_than times slower than the reference"
    return (f"over eval.timing.give_up_behind_best times behind its search's best, "
            f"{behind_best:.2f}x")
