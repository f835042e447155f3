"""A task's reference run: its trial inputs and expected outputs, drawn once, and the live
child that times eager beside each candidate. Runs are cached by task and protocol, made
outside the cache's lock (several tasks at once), run once more after running out of
memory beside other evaluations, and closed at exit. The evaluator (judge.py) and the
baselines (baseline.py) build on it.
"""

from __future__ import annotations

import json
import logging
import random
import shutil
import statistics
import threading
import time
from collections import OrderedDict
from collections.abc import Collection, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from pike.config import CONSTRUCT_ON, EvalConfig
from pike.errors import EvaluatorError, TaskError
from pike.evaluate import check, device_holds, host_memory, own_rounding
from pike.evaluate.child_launch import begin_child, launch_child, list_for_timers, wait_for_room
from pike.evaluate.device_lock import (
    hold,
    hold_for_build,
    hold_for_work,
    set_stopped,
    tree_of,
    unlist_child,
)
from pike.evaluate.driver import ChildReport, finish, request, run_trials
from pike.evaluate.leftovers import (
    at_exit_uninterrupted,
    make_temp_dir,
    refuse_new_work_if_ending,
    remove_tree,
)
from pike.evaluate.protocol import EXTRA_TRIALS, ChildRequest, ShiftSpec, timed_set_count
from pike.evaluate.sandbox import ChildProcess
from pike.evaluate.shared_window import WindowQueue
from pike.evaluate.steps import current as current_steps
from pike.evaluate.steps import measuring, span
from pike.evaluate.timing_window import Timer
from pike.evaluate.trial_comparison import compare_device, load_leaves
from pike.evaluate.verdict import Verdict, says_out_of_memory
from pike.evaluate.wall_clock_check import LoopCost, calibrate
from pike.floor import Work
from pike.task import Task
from pike.threads import unwinding_stop

log = logging.getLogger(__name__)

_REFERENCE_CACHE_SIZE = 2
_TURN_WAIT_S = 0.05  # between looks at a busy reference's `talking` (talking_in_turn)

@dataclass
class ReferenceRun:
    """A task's trial inputs and expected outputs, and (when timing) its live child.

    The reference child stays alive between evaluations so that each candidate is timed
    in blocks alternating with blocks of the reference, in the same window of time.
    """

    inputs_dir: Path
    expected: list[list[Any]]
    env: dict[str, str]
    child: ChildProcess | None
    _tmp: Path
    seed: int = 0  # of the weights: the candidate builds its model with it too
    device: str = "cpu"
    check_seconds: float = 0.0  # the reference's own check phase: candidates' limits follow
    window_ms: list[float] = field(default_factory=list)  # its eager median, window by window
    timed_expected: list[list[Any]] = field(default_factory=list)  # per timed input set
    # What the child was started with, so a fresh one can replace it (same seeds, same
    # inputs) when it stays off its usual time; the replacements' folders go with close().
    request: ChildRequest | None = None
    cfg: EvalConfig | None = None
    renewals: int = 0
    new_steps: dict[str, float] = field(default_factory=dict)  # its child's, until reported
    _spare_tmps: list[Path] = field(default_factory=list)

    _on_device: list[list[Any]] | None = None  # `expected`, copied to the GPU that compares
    _kept_bytes: int = 0  # what that copy counts against _KEPT_SHARE, on _kept_on
    _kept_on: str = ""
    _loop_cost: tuple[ChildProcess, LoopCost] | None = None  # and the child it is of
    _work: Work | None = None
    _work_asked: bool = False
    _work_counted: bool = False  # the count's answer is in (or it failed): read freely
    _shifted_atols: dict[float, list[float]] = field(default_factory=dict)  # by atol
    _exact: dict[int, list[Any] | str] = field(default_factory=dict)  # or why there is none
    # per output, the most its expected values were seen off their float64 run
    own_error: dict[int, float] = field(default_factory=dict)
    users: int = 0  # evaluations using it now; the cache evicts only unused ones
    # Evaluations of one task in a pool share this child: one request at a time.
    talking: threading.RLock = field(default_factory=threading.RLock)
    windows: WindowQueue = field(default_factory=WindowQueue)  # candidates waiting to be timed

    def shifted_atols(self, trials: int, atol: float) -> list[float]:
        """The shifted trial's absolute tolerance per output (check.shifted_atols), from
        its expected outputs and trial 0's, worked out once per run (on the host: the
        outputs are read from their mapped files, and no GPU memory is asked for)."""
        if atol not in self._shifted_atols and len(self.expected) > trials:
            self._shifted_atols[atol] = check.shifted_atols(self.expected[0],
                                                            self.expected[trials], atol)
        return self._shifted_atols.get(atol, [])

    def usual_ms(self) -> float | None:
        """The reference's usual time in this run: the median of its windows so far."""
        return statistics.median(self.window_ms) if self.window_ms else None

    # Lock order everywhere: the device lock first, then `talking`.
    def loop_cost(self, held: bool = False, stop: Collection[int] = ()) -> LoopCost:
        """The reference child's own timing-loop cost, measured once per child. Kept, it is
        returned without the device: each evaluation asks twice, and taking the device
        exclusively for a kept figure made it wait behind other windows (1.2 s median,
        up to 15 s, on an H200 level2 bench) and stopped every other child meanwhile.
        `held`: the caller holds the device alone and `talking` (a window just timed):
        measured there, with no hold of its own to wait for (on an H200 level2 bench the
        calibrations' own holds waited 274 s in all, 11 s each, in the searches' time).
        `stop`: the pids the window kept running (the candidates it timed), stopped for
        the calibration as its own hold stopped every listed child: a thread a candidate
        left running would inflate the figure, and with it loosen the wall-clock check
        for every candidate judged against this child."""
        kept = self._loop_cost
        if kept is not None and (kept[0] is self.child or self.child is None):
            return kept[1]  # (a closed run keeps its last child's figure)
        # the calibration runs timing blocks (L2 flushes, events): timing, so exclusive
        with (nullcontext() if held else
              hold(self.device, exclusive=True, purpose=device_holds.CALIBRATION)), \
                self.talking:
            if self._loop_cost is None or self._loop_cost[0] is not self.child:
                assert self.child is not None
                trees = [p for pid in stop for p in tree_of(pid)]
                set_stopped(trees, True)
                try:
                    self._loop_cost = (self.child, calibrate(self.child))
                finally:
                    set_stopped(trees, False)
                self.child.enter_phase("idle")
            return self._loop_cost[1]

    def calibrate_in_window(self, eager: Timer, timed: Collection[int]) -> None:
        """In a window that has just timed this child (`eager`, its timer there), before
        it lets the device go: the loop cost, the candidates it timed (`timed`, pids)
        stopped for it. Not where the reference failed in the window."""
        if eager.failure is None:
            self.loop_cost(held=True, stop=timed)

    def work(self) -> Work | None:
        """The task's FLOPs and minimum bytes, counted once in the reference's child."""
        # The count runs on the meta device, or falls back to where the models are built:
        # only that fallback with construct_on 'device' uses the GPU. Holding it always
        # made a cold evaluation's timing wait seconds for a count that used no GPU.
        # Counted, it is read without the locks: `talking` is held through every window of
        # the task, and the shared hold waits behind every timer; on the H200 level2 bench
        # 55 of 128 verdicts held their lane 1 to 53 s (454 s in all) to attach the floor.
        if self._work_counted:
            return self._work
        on_gpu = self.request is not None and self.request.construct_on == "device"
        with hold(self.device, exclusive=False) if on_gpu else nullcontext(), self.talking:
            if not self._work_asked and self.child is not None:
                self._work_asked = True
                try:
                    reply = request(self.child, "work", "work", "work")
                    self.child.enter_phase("idle")
                    if isinstance(reply, dict) and reply.get("work"):
                        self._work = Work.model_validate(reply["work"])
                    else:
                        why = (reply.message if isinstance(reply, Verdict)
                               else reply.get("error"))
                        log.info("no work count for the floor: %s", why)
                finally:
                    self._work_counted = True
            return self._work

    @contextmanager
    def talking_in_turn(self, scope: str) -> Iterator[None]:
        """The device held shared and `talking`, for untimed work with the live child,
        taken in the lock order but never waiting for `talking` with the device held: a
        baseline's builds hold `talking` for minutes with no hold of the device, and a
        shared hold kept meanwhile would stop every other evaluation's windows."""
        while True:
            with hold_for_work(self.device, scope):
                if self.talking.acquire(blocking=False):
                    try:
                        yield
                        return
                    finally:
                        self.talking.release()
            time.sleep(_TURN_WAIT_S)

    def exact_outputs(self, trial: int) -> list[Any] | str:
        """Trial `trial`'s expected outputs computed again in float64 by the live child
        (own_rounding), once per trial; or why there are none. The caller is in
        `talking_in_turn`: the child's float64 run is GPU work."""
        if trial not in self._exact:
            exact = self._exact[trial] = self._run_exact(trial)
            if not isinstance(exact, str) and self.cfg is not None:
                found = own_rounding.own_errors(self.expected[trial], exact, self.cfg.atol,
                                                compare_device(self.device))
                for index, error in found.items():
                    self.own_error[index] = max(self.own_error.get(index, 0.0), error)
        return self._exact[trial]

    def _run_exact(self, trial: int) -> list[Any] | str:
        child = self.child
        if child is None or not self.usable():
            return "the reference has no live child to run it"
        reply = request(child, "exact", "exact", "exact", trial=trial)
        child.enter_phase("idle")
        if isinstance(reply, Verdict):
            return reply.message
        if not reply.get("file"):
            return str(reply.get("error") or "the float64 run failed")
        try:  # the reference's child wrote it: the task's own code, as `expected`
            return load_leaves(child.work_dir / Path(str(reply["file"])).name, mapped=True)
        except Exception as err:
            return f"its outputs could not be read ({err})"

    def usable(self) -> bool:
        # A child that overran a request's limit (work count, profile) may still be stuck.
        return self.child is None or (self.child.alive() and not self.child.unresponsive)

    def renew_child(self) -> bool:
        """Replace the live child by a fresh one drawn from the same seeds (a child can sit
        in a slower state: a convolution algorithm picked while memory was short, a
        fragmented allocator); False where it cannot be done. The caller holds `talking`
        and the device exclusively, so no window sees the swap."""
        if self.child is None or self.request is None or self.cfg is None:
            return False
        tmp = make_temp_dir("ref")
        self._spare_tmps.append(tmp)
        request = self.request.model_copy(update={
            "inputs_dir": str(tmp / "inputs"), "outputs_dir": str(tmp / "expected")})
        for d in (tmp / "inputs", tmp / "expected", tmp / "work"):
            d.mkdir()
        report = ChildReport()
        fresh = launch_child(request, tmp / "work", self.cfg, build_key="reference")
        try:
            wait_for_room(fresh, 0.0)  # the caller holds the device alone: no wait here
            begin_child(fresh, self.cfg)
            ready = run_trials(fresh, report)
        except BaseException:
            finish(fresh)
            raise
        if not ready:
            finish(fresh)
            log.info("no fresh reference child: %s", report.failure)
            return False
        shutil.rmtree(tmp / "inputs")  # the fresh child keeps its inputs in memory; the
        shutil.rmtree(tmp / "expected")  # expected outputs stay the first child's
        fresh.enter_phase("idle")
        old, self.child = self.child, fresh
        finish(old)
        self._loop_cost, self.renewals = None, self.renewals + 1
        return True

    def expected_on(self, on: torch.device) -> list[list[Any]]:
        """The expected outputs where comparisons run. On a GPU they are copied there at the
        first comparison and kept, while every reference's kept copies together stay within
        _KEPT_SHARE of its memory: each candidate's comparison then reads them from device
        memory, not from the mapped file through the bus. Otherwise the mapped ones."""
        if on.type != "cuda":
            return self.expected
        with _kept_lock:
            if self._on_device is None:
                self._on_device, self._kept_bytes = _copy_within_share(self.expected, on)
                self._kept_on = str(on)
            return self._on_device

    def close(self) -> None:
        # once: the candidates of a shared window whose eager failed all close it at once
        with _closing:
            child, self.child = self.child, None
        if child is not None:
            finish(child)
        with _kept_lock:
            if self._kept_bytes:
                _kept[self._kept_on] -= self._kept_bytes
                self._on_device, self._kept_bytes = None, 0
                torch.cuda.empty_cache()
        for tmp in (self._tmp, *self._spare_tmps):
            if not tmp.exists():
                continue
            try:  # the inputs are read-only, and a child's caches may hold such files too
                remove_tree(tmp)
            except OSError as err:  # at exit: the next pike's sweep removes what is left
                log.info("could not remove %s: %s", tmp, err)

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # interpreter shutdown: the child dies with its session anyway
            pass


# The expected outputs kept on a GPU by this process, all references together, may take
# this share of its memory: the rest is the candidates'. A task whose outputs do not fit
# is compared from its mapped files, as before.
_KEPT_SHARE = 0.1
_kept: dict[str, int] = {}  # bytes kept, by device
_kept_lock = threading.Lock()


def _copy_within_share(expected: list[list[Any]], on: torch.device
                       ) -> tuple[list[list[Any]], int]:
    """`expected` copied onto `on` and the bytes that took, where the share allows and the
    copy succeeds; else `expected` itself and 0. Called under _kept_lock."""
    key = str(on)
    size = sum(x.nbytes for leaves in expected for x in leaves if isinstance(x, torch.Tensor))
    share = _KEPT_SHARE * torch.cuda.get_device_properties(on).total_memory
    if size == 0 or _kept.get(key, 0) + size > share:
        return expected, 0
    try:
        copied = [[x.to(on) if isinstance(x, torch.Tensor) else x for x in leaves]
                  for leaves in expected]
    except torch.cuda.OutOfMemoryError:
        torch.cuda.empty_cache()
        return expected, 0
    _kept[key] = _kept.get(key, 0) + size
    return copied, size


_references: OrderedDict[str, ReferenceRun] = OrderedDict()
_references_lock = threading.Lock()  # evaluations of several tasks run in threads (bench)
# Reference runs being made, by cache key (_Making: done once the run is in the cache or
# has failed). Each is made outside the lock, so several tasks' references are made at once.
_making: dict[str, _Making] = {}
_exiting = False  # close_references(at_once): a run made after it is closed at once


def close_references(at_once: bool = False) -> None:
    """Stop every cached reference child (also run at interpreter exit)."""
    global _exiting
    with _references_lock:
        _exiting = _exiting or at_once
        while _references:
            run = _references.popitem()[1]
            if at_once and run.child is not None:
                run.child.unresponsive = True  # killed, not asked: it may be mid-request
            run.close()


at_exit_uninterrupted(close_references, at_once=True)  # at exit, no waiting for answers


# The settings a reference and its candidates must share, sent to both children; a cached
# reference is reused only where they (and the limits and seed) are the same.
_CHILD_PROTOCOL = ("trials", "model_mode", "construct_on", "timing")


def child_protocol(cfg: EvalConfig) -> dict[str, Any]:
    return {**{name: getattr(cfg, name) for name in _CHILD_PROTOCOL},
            "input_sets": cfg.timing.input_sets}


@dataclass
class DrawnProtocol:
    """The seeds and the other distribution of one reference run: from the OS's
    randomness (eval.seed None), or all from eval.seed, reproducibly."""

    weights: int
    trials: list[int]
    timed: list[int]
    shift: ShiftSpec


def draw_protocol(cfg: EvalConfig) -> DrawnProtocol:
    count = cfg.trials + EXTRA_TRIALS
    if cfg.seed is not None:  # as before drawn seeds: trial i from seed + 1 + i
        seed = cfg.seed
        return DrawnProtocol(seed, [seed + 1 + i for i in range(count)],
                             [seed + 1001 + k for k in range(timed_set_count(cfg.timing.input_sets))],
                             ShiftSpec(kind="affine", scale=3.0, offset=0.5, seed=seed))
    rng = random.SystemRandom()

    def draw() -> int:
        return rng.randrange(2**62)

    # A larger scale than randn's always (shortcuts that assume |x| < 4 fail), a shift of
    # the mean, and one of two shapes.
    shift = ShiftSpec(kind=rng.choice(["affine", "uniform"]), scale=rng.uniform(2.5, 4.0),
                      offset=rng.uniform(-1.0, 1.0), seed=draw())
    return DrawnProtocol(draw(), [draw() for _ in range(count)],
                         [draw() for _ in range(timed_set_count(cfg.timing.input_sets))], shift)


def run_reference(task: Task, cfg: EvalConfig, device: str, *, keep_child: bool,
                  cache: bool = True) -> ReferenceRun:
    """Run (or reuse) the task's reference: trial inputs, expected outputs, a live child.
    One that ran out of GPU memory runs once more, after a wait outside the cache's lock."""
    try:
        return _run_or_reuse(task, cfg, device, keep_child, cache)
    except ReferenceOutOfMemory:
        refuse_new_work_if_ending()  # pike's own exit killed it: no wait, no second run
        log.warning("%s: the reference ran out of memory (the GPU's, or the host's); run "
                    "once more in %.0f s (other evaluations may have held it)", task.name,
                    _OUT_OF_MEMORY_WAIT_S)
    _wait(_OUT_OF_MEMORY_WAIT_S)
    return _run_or_reuse(task, cfg, device, keep_child, cache)


def _reference_protocol(cfg: EvalConfig) -> str:
    """What a reference run is made with, as its cache key: timing too, since the child
    times the reference with the settings it was started with, less `min_seconds`, which
    each block's request carries, and `rounds`, which the child never reads (the parent's
    timing_window.time_interleaved does): a search's screening windows (search.screen_seconds,
    screen_rounds) and its confirming window time the same reference child. Other fields
    only the parent reads stay in the key: needless there, but harmless."""
    protocol = cfg.model_dump(mode="json",
                              include={*_CHILD_PROTOCOL, "limits", "seed", "sandbox"})
    protocol["timing"].pop("min_seconds", None)
    protocol["timing"].pop("rounds", None)
    return json.dumps(protocol, sort_keys=True)


def _run_or_reuse(task: Task, cfg: EvalConfig, device: str, keep_child: bool,
                  cache: bool) -> ReferenceRun:
    key = "|".join([task.sha256, device, _reference_protocol(cfg), str(keep_child)])
    if not cache:
        return _start_reference(task, cfg, device, keep_child)
    mine: _Making | None = None
    try:
        while True:
            with _references_lock:
                cached = _references.get(key)
                if cached is not None and cached.usable():
                    _references.move_to_end(key)
                    cached.users += 1
                    return cached
                making = _making.get(key)
                if making is None:
                    if cached is not None:
                        _references.pop(key).close()
                    # idle ones beyond the cache's size go first, so the new child finds
                    # their memory free
                    idle = [k for k, run in _references.items() if run.users == 0]
                    for old in idle[:max(0, len(_references) + len(_making) + 1
                                         - _REFERENCE_CACHE_SIZE)]:
                        _references.pop(old).close()
                    mine = _making[key] = _Making()
                    break
            # Made by another evaluation of the task: in the cache once it is set. Its
            # failure is this one's too (one out of memory is tried again by each caller's
            # run_reference, after its wait); where it was interrupted, this one tries.
            making.done.wait()
            if isinstance(making.error, TaskError):
                raise making.error
        # Made outside the lock: under it, on the H200 level2 bench, the references of the
        # tasks a resumed run took up again were made one after another, and the first
        # candidates of the last ones waited 100 s each. Outside it, a reference waits for
        # host memory as a candidate does (under it, it was counted at once: a wait there
        # would have held every task's evaluations).
        run = _made_reference(task, cfg, device, keep_child)
        with _references_lock:
            _references[key] = run
            run.users += 1
            if _exiting:  # close_references(at_once) ran meanwhile: pike is ending
                _references.pop(key).close()
                raise KeyboardInterrupt("pike is ending")
        return run
    except BaseException as err:
        if mine is not None:
            mine.error = err
        raise
    finally:
        if mine is not None:
            with _references_lock:
                if _making.get(key) is mine:
                    del _making[key]
            mine.done.set()


class _Making:
    """A reference run being made: `done` once it is in the cache or has failed (`error`)."""

    def __init__(self) -> None:
        self.done = threading.Event()
        self.error: BaseException | None = None


def _made_reference(task: Task, cfg: EvalConfig, device: str, keep_child: bool
                    ) -> ReferenceRun:
    """`_start_reference`, its steps added to the evaluation's that asked, its wait for
    host memory as `reference.wait_for_memory`: the evaluation's `reference` step already
    holds it, and a budget that leaves both out would count it twice."""
    spans: dict[str, float] = {}
    try:
        with measuring() as made:
            spans = made.spans  # filled as the reference is made
            return _start_reference(task, cfg, device, keep_child)
    finally:
        waited = spans.pop("wait_for_memory", 0.0)
        clock = current_steps()  # the asking evaluation's again
        clock.merge(spans)
        if waited:
            clock.add("reference.wait_for_memory", waited)


def _close_an_idle_reference() -> bool:
    """Close the least recently used cached reference no evaluation uses (a child waiting
    for host memory asks); whether there was one. Kept ones are kept for speed only: with
    one per task begun, idle ones held room a reference or candidate waited for."""
    with _references_lock:
        key = next((k for k, run in _references.items() if run.users == 0), None)
        if key is None:
            return False
        run = _references.pop(key)
    log.info("an idle reference child closed: a child waits for host memory")
    run.close()  # outside the lock: it waits for the child to end
    return True


host_memory.HOST.reclaim_with(_close_an_idle_reference)


def keep_references(count: int) -> None:
    """Keep at least `count` idle reference children alive (one per concurrent task)."""
    global _REFERENCE_CACHE_SIZE
    _REFERENCE_CACHE_SIZE = max(_REFERENCE_CACHE_SIZE, count)


def release_reference(run: ReferenceRun) -> None:
    with _references_lock:
        run.users = max(0, run.users - 1)


def count_work_meanwhile(reference: ReferenceRun) -> None:
    """Count the task's work (for the floor) in the reference's child while the candidate's
    child starts: a first count takes seconds, and the reference's child is idle then.
    The run is held (`users`) until the count ends, so no cache evicts it meanwhile."""
    if reference._work_asked or reference.child is None:
        return
    with _references_lock:
        reference.users += 1

    def count() -> None:
        try:
            reference.work()
        except Exception as err:  # a child closed at exit: the floor is advisory
            log.debug("work count in the background failed: %s", err)
        finally:
            release_reference(reference)

    threading.Thread(target=count, name="pike-work-count", daemon=True).start()


# A reference that ran out of GPU memory beside other evaluations (a campaign's other
# tasks, their candidates) runs once more after this wait: their memory is not the task's
# fault, and one that needs more than the card runs out again and fails its task.
_OUT_OF_MEMORY_WAIT_S = 15.0
_wait = time.sleep


class ReferenceOutOfMemory(TaskError):
    """The reference ran out of GPU memory, or was killed by a SIGKILL pike did not send
    (run_reference runs it once more)."""


def _start_reference(task: Task, cfg: EvalConfig, device: str, keep_child: bool
                     ) -> ReferenceRun:
    run = _reference_attempt(task, cfg, device, keep_child)
    if isinstance(run, ReferenceRun):
        return run
    raise reference_failed(task, run, device)


def _killed_from_outside(failure: Verdict) -> bool:
    """The task's own module (trusted) ended by a SIGKILL that pike did not send (its
    limits' kills read otherwise): on the level1 bench on an H200 that was the host's
    out-of-memory killer each time, named so or not (the host's kill count had not moved
    since the child was last seen alive), and the task failed for its neighbours'
    memory."""
    return failure.status == "crashed" and (failure.message or "").startswith(_KILLED)


_KILLED = "killed by signal SIGKILL"


def failed_for_memory(error: str) -> bool:
    """Whether a task's stored error is its reference ended by memory (ReferenceOutOfMemory's
    message), not by the task: a resumed campaign tries such a task again."""
    return "reference failed" in error and (_KILLED in error or says_out_of_memory(error))


def _reference_attempt(task: Task, cfg: EvalConfig, device: str, keep_child: bool
                       ) -> ReferenceRun | Verdict | None:
    """The reference run, or the failure that ended it (None: no failure was reported).
    Whatever ends it early (an error, Ctrl-C) leaves no child and no folder behind."""
    tmp = make_temp_dir("ref")
    child: ChildProcess | None = None
    run: ReferenceRun | None = None
    try:
        inputs_dir, expected_dir, work_dir = tmp / "inputs", tmp / "expected", tmp / "work"
        for d in (inputs_dir, expected_dir, work_dir):
            d.mkdir()
        drawn = draw_protocol(cfg)
        request = ChildRequest(
            role="reference", module_path=str(task.path), class_names=["Model"],
            inputs_dir=str(inputs_dir), outputs_dir=str(expected_dir), device=device,
            **child_protocol(cfg), seed=drawn.weights, task_sha256=task.sha256,
            trial_seeds=drawn.trials, pool_seeds=drawn.timed, shift=drawn.shift,
        )
        pristine = request.model_copy(deep=True)  # start_child rewrites paths to the child's view
        report = ChildReport()
        ok = False
        try:
            # Its imports need no device; from "begin" on, loading and building use the GPU
            # too (a CUDA context, a prefill). Beside other evaluations, as a candidate's
            # trials are: listed for their timers to stop (pause_others), so no timer waits
            # for it; it draws and saves every input set and expected output, files of
            # hundreds of MB on the level2 tasks, seconds of mostly host work that a shared
            # hold made every timer (and every comparison behind them) wait out.
            child = launch_child(request, work_dir, cfg, build_key="reference")
            wait_for_room(child)
            with beside_others(child, device, cfg.device_lock):
                begin_child(child, cfg)
                ok = run_trials(child, report)
        finally:
            if child is not None and not (ok and keep_child):
                finish(child)
        if not ok:
            return report.failure
        with span("load_expected"):
            expected = [load_leaves(expected_dir / f"outputs_{i}.pt", mapped=True)
                        for i in range(cfg.trials + EXTRA_TRIALS)]
            timed = [load_leaves(expected_dir / f"pool_{k}.pt", mapped=True)
                     for k in range(timed_set_count(cfg.timing.input_sets))]
        _make_read_only(inputs_dir)
        shutil.rmtree(expected_dir)  # expected outputs live only in this process from here on
        assert child is not None
        child.enter_phase("idle")
        # construct_on 'auto', as the child settled it: its candidates, and a child that
        # replaces it, build where it built (the same seed gives the same weights only there)
        if report.built_on in CONSTRUCT_ON and report.built_on != "auto":
            pristine.construct_on = report.built_on  # type: ignore[assignment]
        elif pristine.construct_on == "auto":  # a candidate cannot guess it: none is judged
            raise EvaluatorError(f"{task.name}: the reference's child did not say where it "
                                 f"built the model ({report.built_on!r})")
        run = ReferenceRun(inputs_dir, expected, report.env, child if keep_child else None, tmp,
                           seed=drawn.weights, device=device, timed_expected=timed,
                           check_seconds=child.phase_seconds.get("check", 0.0),
                           request=pristine, cfg=cfg,
                           new_steps={f"reference.{k}": v for k, v in report.steps.items()})
        return run
    finally:
        if run is None:  # failed or cut short: the run owns neither child nor folder
            try:
                if child is not None and child.proc is not None:
                    child.unresponsive = True  # killed, not asked: it may be mid-request
                    finish(child)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)


def pid_of(child: ChildProcess | None) -> int | None:
    return child.proc.pid if child is not None and child.proc is not None else None


def _make_read_only(folder: Path) -> None:
    """Later candidates read these inputs: no candidate may change them."""
    for path in folder.iterdir():
        path.chmod(0o444)
    folder.chmod(0o555)


def reference_failed(task: Task, failure: Verdict | None, device: str = "") -> TaskError:
    """The task's error; ReferenceOutOfMemory where memory, not the task, ended it (the
    GPU's, said so on `device`, or a SIGKILL from outside), which a campaign tries again
    once the other tasks' children are gone."""
    message = failure.message.strip() if failure and failure.message else "no message"
    phase = failure.phase if failure else "?"
    text = f"{task.path}: reference failed in phase '{phase}': {message.splitlines()[0]}"
    if failure is not None and (device.startswith("cuda") and says_out_of_memory(message)
                                or _killed_from_outside(failure)):
        return ReferenceOutOfMemory(text)
    return TaskError(text)


@contextmanager
def beside_others(child: ChildProcess, device: str, scope: str) -> Iterator[None]:
    """A trusted child's untimed GPU work (the reference's start and trials, a baseline's
    builds) beside other evaluations: listed for their timers to stop, then unlisted, so
    that the windows it is timed in later do not stop it; the device held shared instead
    where `eval.device_lock` is every_gpu_use."""
    list_for_timers(child, device, scope)  # as a candidate's child is: before any hold
    try:
        with hold_for_build(device, scope):
            yield
    finally:
        if child.pausable_on is not None and child.proc is not None:
            # as `finish` does: off the list first, so no new timer stops it; then a child
            # a timer has stopped (or one stopped on being listed mid-window, never asked
            # anything since) is waited out, or it would stay stopped with no one looking
            unlist_child(device, child.proc.pid)
            if not unwinding_stop():  # a Ctrl-C: the child is killed next, not waited for
                child.wait_unpaused()
            child.pausable_on = None



_closing = threading.Lock()  # ReferenceRun.close: once
