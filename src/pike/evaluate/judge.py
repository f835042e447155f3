"""The evaluator's entry points: evaluate() a candidate, measure_baselines() of a task.

The reference runs in one child and records inputs and expected outputs; each candidate
runs in another child that sees only the inputs. Outputs are compared here, in the
parent, where candidate code cannot reach.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
import re
import shutil
import statistics
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Collection, Iterator
from contextlib import ExitStack, contextmanager, nullcontext
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import torch

from pike.config import CONSTRUCT_ON, EvalConfig, RunConfig, autotunes
from pike.errors import EvaluatorError, TaskError
from pike.evaluate import check, device_holds, host_memory, search_bar, spares
from pike.evaluate.cores import timing_cores
from pike.evaluate.device_lock import (
    hold,
    hold_for_build,
    hold_for_work,
    set_stopped,
    tree_of,
    unlist_child,
)
from pike.evaluate.driver import (
    ChildReport,
    LoopCost,
    Timer,
    begin_child,
    build_cache_root,
    calibrate,
    finish,
    launch_child,
    list_for_timers,
    request,
    run_trials,
    stage_timed_inputs,
    time_interleaved,
    unaccounted_wall_time,
    wait_for_room,
    wait_ready,
    wall_clock_factor,
)
from pike.evaluate.explain import explain_guards
from pike.evaluate.leftovers import (
    at_exit_uninterrupted,
    make_temp_dir,
    refuse_new_work_if_ending,
    remove_tree,
)
from pike.evaluate.ncu import attach_kernel_metrics
from pike.evaluate.os_sandbox import sandbox_problem
from pike.evaluate.outputs_handoff import OutputsBuffer
from pike.evaluate.profile import ProfileSummary
from pike.evaluate.protocol import EXTRA_TRIALS, ChildRequest, ShiftSpec, timed_set_count
from pike.evaluate.redact import mask_secrets
from pike.evaluate.sandbox import ChildProcess, passed_to_child
from pike.evaluate.shared_window import WindowQueue, timed_together
from pike.evaluate.staging import InputStage
from pike.evaluate.steps import current as current_steps
from pike.evaluate.steps import measuring, span
from pike.evaluate.trial_comparison import (
    TrialComparison,
    compare_device,
    compare_early,
    compare_with_room,
    file_loader,
    load_leaves,
    read_back,
    release_compare_memory,
)
from pike.evaluate.verdict import TimingStats, Verdict, says_out_of_memory
from pike.floor import Work, floor, times_floor
from pike.task import Task
from pike.threads import unwinding_stop

log = logging.getLogger(__name__)

_REFERENCE_CACHE_SIZE = 2


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


def _child_protocol(cfg: EvalConfig) -> dict[str, Any]:
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
    driver.time_interleaved does): a search's screening windows (search.screen_seconds,
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
    raise _reference_failed(task, run, device)


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
            **_child_protocol(cfg), seed=drawn.weights, task_sha256=task.sha256,
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
            with _beside_others(child, device, cfg.device_lock):
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


def _pid(child: ChildProcess | None) -> int | None:
    return child.proc.pid if child is not None and child.proc is not None else None


def _make_read_only(folder: Path) -> None:
    """Later candidates read these inputs: no candidate may change them."""
    for path in folder.iterdir():
        path.chmod(0o444)
    folder.chmod(0o555)


def _reference_failed(task: Task, failure: Verdict | None, device: str = "") -> TaskError:
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


def time_reference_modes(task: Task, reference: ReferenceRun, modes: list[str],
                         cfg: EvalConfig, device: str,
                         on_built: Callable[[Timer], None] | None = None,
                         no_prebuild: Collection[str] = ()) -> list[Timer]:
    """Time the reference's modes (eager, torch.compile ...) alternating with each other.
    on_built(timer) after each mode's build: a large model's max-autotune build can take
    minutes, and the user should see which mode it is. `no_prebuild`: autotuning modes
    built alone only (their pre-build took a child down before)."""
    assert reference.child is not None
    timers = [Timer(reference.child, mode) for mode in modes]
    # Each mode is built (a torch.compile mode compiles, max-autotune also autotunes)
    # before the child moves onto the timing cores: on the build cores, with the compile
    # workers the child was started with. Modes that measure nothing while they build go
    # first, beside other evaluations, as a candidate's build does: the child listed, so
    # other timers stop it (pause_others), or the device held shared (every_gpu_use).
    # A build that takes the child down (or past its limit) ends the building: the mode
    # whose build it was is the only one marked failed, and the others wait for a new child.
    # An autotuning mode is built once first, beside the others as well, and thrown away:
    # its build with the device held alone then finds its kernels compiled and mostly
    # measures them (on an H200, the level2 baselines' max-autotune builds held the device
    # alone for 343 of 566 s, every other evaluation stopped, mostly compiling).
    with _beside_others(reference.child, device, cfg.device_lock), reference.talking:
        for timer in timers:
            if cfg.prebuild_autotune == "on" and autotunes(timer.mode) \
                    and timer.mode not in no_prebuild:
                _prebuild(timer)
        for timer in timers:
            if not autotunes(timer.mode) and not any(t.failure for t in timers):
                _prepare(timer, cfg, on_built)
    with hold(device, exclusive=True, purpose=device_holds.BASELINE), reference.talking:
        # autotuning measures kernels: alone on the device, as timing is
        for timer in timers:
            if autotunes(timer.mode) and not any(t.failure for t in timers):
                _prepare(timer, cfg, on_built)
        if not any(t.failure for t in timers):
            with timing_cores([_pid(reference.child)], device, cfg.timing_cores):
                time_interleaved(timers, cfg.timing, stop_at_failure=True)
            reference.child.enter_phase("idle")
    broken = next((t for t in timers if t.failure), None)
    if broken is not None:
        reference.close()
        if broken.mode != "eager":
            raise ModeFailed(task, broken)
        raise _reference_failed(task, broken.failure, device)
    return timers


class ModeFailed(TaskError):
    """A torch.compile mode took the reference's child down (its build ran past the phase's
    limit, crashed or ran out of memory): the mode failed, not necessarily the reference."""

    def __init__(self, task: Task, timer: Timer) -> None:
        super().__init__(str(_reference_failed(task, timer.failure)))
        assert timer.failure is not None
        self.mode = timer.mode
        self.build_s = timer.build_s
        self.prebuild_s = timer.prebuild_s
        self.in_prebuild = timer.prebuild_failed
        first_line = (timer.failure.message or "no message").strip().splitlines() or [""]
        self.reason = f"{timer.failure.status} in phase '{timer.failure.phase}': {first_line[0]}"


@contextmanager
def _beside_others(child: ChildProcess, device: str, scope: str) -> Iterator[None]:
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


def _prebuild(timer: Timer) -> None:
    """Compile a mode of a live child once, untimed, its results thrown away (runner:
    prebuild). How long it took counts in the mode's build_s; an error is the mode's own
    build's to report. A child that died here ends this child's building as any build's
    end does (ModeFailed), marked, so that the mode is built again without a pre-build
    (measure_baselines): a pre-build may only save time, never fail a mode."""
    if timer.stopped:
        return
    started = time.perf_counter()
    reply = request(timer.child, "build", "prebuilt", "prebuild", mode=timer.mode)
    timer.prebuild_s = time.perf_counter() - started
    if isinstance(reply, Verdict):
        timer.failure, timer.prebuild_failed = reply, True
        timer.build_s = timer.prebuild_s
    elif reply.get("error"):
        log.info("the pre-build of %s failed (its own build says why): %s", timer.mode,
                 reply["error"])


def _prepare(timer: Timer, cfg: EvalConfig,
             on_built: Callable[[Timer], None] | None = None) -> None:
    """Build one mode of a live child and warm it up, untimed; how long it took is kept.
    A torch.compile mode's outputs on the check trials are compared with eager's there:
    a mode that is wrong for the task (it happens: a scan compiled past the tolerance) is
    reported as failing, not kept as the bar a candidate is measured against."""
    if timer.stopped:
        return
    started = time.perf_counter()
    check_with = ({"atol": cfg.atol, "rtol": cfg.rtol} if timer.mode.startswith("compile:")
                  else None)
    reply = request(timer.child, "build", "prepared", "prepare", mode=timer.mode,
                    check=check_with)
    timer.build_s = time.perf_counter() - started + (timer.prebuild_s or 0.0)
    if isinstance(reply, Verdict):
        timer.failure = reply
    elif reply.get("error"):
        timer.error = str(reply["error"])
    else:
        timer.checked = {"checked": True, "unchecked": False}.get(str(reply.get("checked")))
        timer.check_note = str(reply["why"]) if reply.get("why") else None
    if on_built is not None:
        try:
            on_built(timer)
        except Exception:  # a display's failure must not cost a build of minutes
            log.exception("reporting the build of %s failed", timer.mode)


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
                _count_work_meanwhile(reference)
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


def _count_work_meanwhile(reference: ReferenceRun) -> None:
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
        outputs_dir=str(outputs_dir), device=device, **_child_protocol(cfg), seed=0,
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
            comparison = TrialComparison(reference.expected_on(on)[:cfg.trials + cfg.guards],
                                         outputs_dir, cfg, on,
                                         reference.shifted_atols(cfg.trials, cfg.atol))
            early = compare_early(comparison, child, device, cfg)
            if early is not None and trials_ran:  # taken trial by trial, so lent only then
                comparison.buffer = OutputsBuffer.offer(comparison.expected, on)
            with span("trials"):  # with the comparisons made while the child runs them
                trials_ran = trials_ran and run_trials(
                    child, report, on_saved=early,
                    outputs=comparison.buffer.describe() if comparison.buffer else None)
        if trials_ran:
            with span("compare"), hold_for_work(device, cfg.device_lock):
                correctness = comparison.verdict()
                release_compare_memory(on)
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
        raise _reference_failed(task, timers[0].failure, device)
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
_closing = threading.Lock()


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
        return _final_compared(reference, outputs_dir, cfg)


def _final_compared(reference: ReferenceRun, outputs_dir: Path, cfg: EvalConfig) -> Verdict:
    on = compare_device(reference.device)
    final_expected = reference.expected_on(on)[-1]
    try:
        expected, actual, here = read_back(
            file_loader(outputs_dir / "outputs_final.pt", final_expected), final_expected, on)
    except Exception as err:  # written by the child: anything may be in it
        return Verdict(status="incorrect", phase="check",
                       message=f"outputs after timing could not be read back ({err})")
    bad = [c for c in compare_with_room(expected, actual, cfg.trials + 1, cfg, here)
           if c.problem]
    del actual
    release_compare_memory(on)
    if not bad:
        return Verdict(status="ok")
    return Verdict(status="incorrect", phase="check", mismatches=bad[:20],
                   message="after timing, new values written into the same input tensors "
                           f"gave wrong outputs (output {bad[0].output}: {bad[0].problem}); "
                           "answers cached by pointer, shape or call count are not allowed")


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
        shared = timed_together(reference, child, device, cfg, best, _pid)
        if shared is not None:
            return shared
    child.permit("timing")
    with ExitStack() as alone:
        with span("wait_for_device"):
            alone.enter_context(hold(device, exclusive=True, keep=[_pid(child) or -1],
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
              timing_cores([_pid(reference.child), _pid(child)], device, cfg.timing_cores)):
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
                reference.calibrate_in_window(timers[0], [_pid(child) or -1])
    return timers


def timed_dishonestly(reference: ReferenceRun, timer: Timer, cfg: EvalConfig) -> Verdict | None:
    """The verdict on timed calls whose sampled outputs are wrong (incorrect), or whose
    times show answers reused for inputs seen before (rejected); None when neither."""
    wrong = check.timed_outputs_problem(reference.timed_expected, timer.outputs,
                                        len(timer.samples), cfg.atol, cfg.rtol)
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
    took longer by the parent's clock than it reported (driver.wall_clock_factor)."""
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
