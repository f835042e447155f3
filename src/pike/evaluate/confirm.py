"""A confirmed best: the top candidates of a search and eager, timed again in one window.

Each verdict of a search was timed in a window of its own, minutes apart from the others,
beside whatever else the host and the GPU were doing then. At the end of a search the few
best correct candidates are loaded again and timed with the reference's eager model in
one exclusive window, interleaved block by block, so their order and their speedups come
from one state of the host. The search-time figures stay in the store beside these.

Their trials run again on inputs the search never drew (a reference of its own, with a
fresh draw) and are compared: a file right on the search's draws and wrong on others is a
verdict here, before it becomes the task's best.
"""

from __future__ import annotations

import statistics
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from pydantic import BaseModel

from pike.config import EvalConfig
from pike.evaluate import device_holds
from pike.evaluate.candidate_checks import judged_trials, trials_against
from pike.evaluate.candidate_files import candidate_files
from pike.evaluate.candidate_windows import timed_dishonestly
from pike.evaluate.child_launch import begin_child, launch_child, list_for_timers, wait_for_room
from pike.evaluate.cores import timing_cores
from pike.evaluate.device_lock import hold, hold_for_build
from pike.evaluate.driver import ChildReport, finish, run_trials, stage_timed_inputs, wait_ready
from pike.evaluate.judge import resolve_device
from pike.evaluate.leftovers import make_temp_dir, remove_tree
from pike.evaluate.reference import ReferenceRun
from pike.evaluate.reference_cache import run_reference
from pike.evaluate.sandbox import ChildProcess
from pike.evaluate.timing_window import Timer, time_interleaved
from pike.evaluate.trial_comparison import compare_device
from pike.evaluate.verdict import Verdict
from pike.evaluate.wall_clock_check import unaccounted_wall_time, wall_clock_factor
from pike.task import Task


class Confirmation(BaseModel):
    """One candidate's figures in the confirming window (None where it failed there)."""

    candidate_id: int
    runtime_ms: float | None = None
    reference_ms: float | None = None
    speedup: float | None = None
    error: str = ""
    # the status a guard gave it here (its timed calls' outputs or probes): not a crash
    # another window could undo, but the candidate's verdict (confirm_best.confirm_best)
    caught: str = ""
    caught_in: str = "timing"  # the phase it was caught in: "check" for its trials' outputs
    # as Verdict.wall_clock_factor: its times were multiplied by this (None: not raised).
    # On the H200 level2 bench (bench-level2-h200-ledger) this window gave
    # 17_Conv2d_InstanceNorm_Divide's max-autotune candidates 1.40 to 1.68x where they were
    # 2.04 to 2.10x alone and in the search; kept so such a figure says whether this was it
    wall_clock_factor: float | None = None
    # timed in a window of its own beside eager, after it ran out of memory beside the
    # others (search/confirm_best.py): its figure is from another state of the host
    alone: bool = False


def confirm(task: Task, sources: dict[int, str], config: EvalConfig) -> list[Confirmation]:
    """Time `sources` (candidate id -> source) and eager in one exclusive window; the
    confirmations, fastest first (failures last)."""
    device = resolve_device(config.device)
    # Not the search's cached reference: its trial inputs are those every candidate was
    # judged on. On the H200 audit of a level-2 set (audit-level2-h200-stopper-set.md), a
    # file that passed the search's six trials (14_Gemm_Divide_Sum_Scaling, a sum folded
    # into the weights, claimed 19.7x) had 1 of 1,024 outputs out of tolerance in 1 of the
    # audit's trials, and counted 1.0x there.
    reference = run_reference(task, fresh_draw(config), device, keep_child=True, cache=False)
    tmp = make_temp_dir("cand")
    children: dict[int, ChildProcess] = {}
    failed: list[Confirmation] = []
    try:
        # load, build, warm up and check each again; several at once (`workers`), as the
        # search did: compiles take most of this
        with hold_for_build(device, config.device_lock), ThreadPoolExecutor(
                max_workers=max(1, min(len(sources), config.workers)),
                thread_name_prefix="pike-confirm") as ready:
            started = {cid: ready.submit(_ready_child, task, cid, source, config, device,
                                         reference, tmp) for cid, source in sources.items()}
            for cid, future in started.items():
                try:
                    child, problem = future.result()
                except Exception as err:  # one candidate's trouble is not the window's
                    child, problem = None, _short(f"could not be readied: {err}")
                if child is not None:
                    children[cid] = child
                else:
                    failed.append(Confirmation(candidate_id=cid, error=problem))
        for cid, child in list(children.items()):
            wrong = _checked_again(reference, tmp / f"c{cid}" / "outputs", config, device)
            if not wrong.ok:
                finish(children.pop(cid))
                failed.append(Confirmation(
                    candidate_id=cid, caught=wrong.status, caught_in="check",
                    error=_short(f"on inputs the search never drew: {wrong.message}")))
                continue
            with hold_for_build(device, config.device_lock):  # before the window, as a
                unstaged = stage_timed_inputs(child)          # search's are
            if unstaged is not None:
                finish(children.pop(cid))
                failed.append(Confirmation(candidate_id=cid, error=_short(
                    unstaged.message or "its timed inputs did not load")))
        timed = [c.proc.pid for c in children.values() if c.proc is not None]
        with hold(device, exclusive=True, keep=timed,
                  purpose=device_holds.CONFIRMING_WINDOW), reference.talking:
            # read under `talking`: a drifting window elsewhere may renew the child
            assert reference.child is not None
            timers = [Timer(reference.child, "eager"),
                      *(Timer(child, "candidate") for child in children.values())]
            pids = [t.child.proc.pid for t in timers if t.child.proc is not None]
            with timing_cores(pids, device, config.timing_cores):
                time_interleaved(timers, config.timing)
            reference.child.enter_phase("idle")
            if config.guards:  # the wall-clock check's figure, while the device is held
                reference.calibrate_in_window(timers[0], timed)
        cost = reference.loop_cost() if config.guards else None
        for child in children.values():  # their memory, before the reference's answers
            finish(child)
        # Its timed calls' sampled outputs and probes checked as there, before the
        # reference's child goes (it answers for the timed sets): a candidate that tells
        # this window's longer blocks from a screening window's must not be honest there
        # and reuse its answers here.
        dishonest = {cid: timed_dishonestly(reference, timer, config, timers[0])
                     for cid, timer in zip(children, timers[1:], strict=True)
                     if config.guards and timer.failure is None and timer.samples
                     and timers[0].samples}
    finally:
        for child in children.values():
            finish(child)
        reference.close()  # its own, not the cache's
        remove_tree(tmp)
    eager = statistics.median(timers[0].samples) if timers[0].samples else None
    found = []
    for cid, timer in zip(children, timers[1:], strict=True):
        if timer.failure is not None or not timer.samples or eager is None:
            why = timer.failure.message if timer.failure else (timer.error or "not timed")
            found.append(Confirmation(candidate_id=cid, error=_short(why)))
            continue
        # First: a wrong output says so whatever the host's load, where the wall-clock
        # check below may fail an honest candidate's window on a loaded host (which
        # confirm_best.confirm_best times once more).
        wrong_timed = dishonest.get(cid)
        if wrong_timed is not None:
            found.append(Confirmation(candidate_id=cid, error=_short(wrong_timed.message),
                                      caught=wrong_timed.status))
            continue
        if timer.withheld:  # no figure to confirm with, nor proof of reuse
            found.append(Confirmation(candidate_id=cid, error=_short(timer.withheld)))
            continue
        # held to the parent's clock as in the search's windows: a candidate can tell
        # this window from those no better than they from each other
        forged = cost and unaccounted_wall_time(cost, timer, timers[0])
        if forged:
            found.append(Confirmation(candidate_id=cid, error=_short(forged)))
            continue
        raised = wall_clock_factor(cost, timer, timers[0]) if cost else 1.0
        ms = statistics.median(timer.samples) * raised
        found.append(Confirmation(candidate_id=cid, runtime_ms=ms, reference_ms=eager,
                                  speedup=eager / ms,
                                  wall_clock_factor=round(raised, 4) if raised > 1.0 else None))
    found.sort(key=fastest_first)
    return found + failed


def fastest_first(found: Confirmation) -> tuple[bool, float, int]:
    """The order of a window's confirmations: fastest first, failures last."""
    return found.speedup is None, -(found.speedup or 0.0), found.candidate_id


# Added to a fixed `eval.seed` for the confirming window's draw: its trials are drawn from
# seed + 1 + i and its timed sets from seed + 1001 + k (reference_start.draw_protocol), far below.
_FRESH_SEED_STEP = 1_000_003


def fresh_draw(cfg: EvalConfig) -> EvalConfig:
    """The settings a reference drawing inputs no search under `cfg` drew is made with:
    the same where the draw is random; another seed where `eval.seed` fixes it."""
    if cfg.seed is None:
        return cfg
    return cfg.model_copy(update={"seed": cfg.seed + _FRESH_SEED_STEP})


def _checked_again(reference: ReferenceRun, outputs_dir: Path, cfg: EvalConfig,
                   device: str) -> Verdict:
    """The child's trials, just run on `reference`'s inputs, compared as a search's are."""
    comparison = trials_against(reference, outputs_dir, cfg, compare_device(device))
    return judged_trials(comparison, reference, device, cfg)


def _ready_child(task: Task, cid: int, source: str, cfg: EvalConfig, device: str,
                 reference: ReferenceRun, tmp: Path) -> tuple[ChildProcess | None, str]:
    """A candidate's child through its load, warm-up and trials, ready to be timed."""
    files = candidate_files(task, source, cfg, device, reference, tmp / f"c{cid}")
    child = launch_child(files.request, files.work_dir, cfg, files.build_key, files.stage)
    report = ChildReport()
    try:
        list_for_timers(child, device, cfg.device_lock)
        # counted at once: the caller may hold the device shared, and the search's own
        # children, which took this memory, have just ended
        wait_for_room(child, 0.0)
        begin_child(child, cfg)
        if wait_ready(child, report) and run_trials(child, report):
            return child, ""
    except BaseException:
        finish(child)
        raise
    finish(child)
    return None, _short(report.failure.message if report.failure else "did not get ready")


def _short(message: str, keep: int = 300) -> str:
    """The failure's first line and its last characters: a child's message is its exit
    and its stderr, whose last line names the error (a GPU out of memory, which
    confirm_best.confirm_best times once more) after a traceback and any warnings."""
    if len(message) <= keep:
        return message
    first = message.splitlines()[0][:keep // 3]
    return f"{first}\n...\n{message[-(keep - len(first) - 5):]}"
