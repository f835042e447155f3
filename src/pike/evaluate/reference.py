"""A task's reference run: its trial inputs and expected outputs, drawn once, and the live
child that times eager beside each candidate (ReferenceRun), with the expected outputs it
keeps on the GPU that compares. Runs are made in reference_start.py, cached, run once more
after running out of memory and closed at exit in reference_cache.py; the evaluator
(judge.py) and the baselines (baseline.py) build on them.
"""

from __future__ import annotations

import logging
import shutil
import statistics
import threading
import time
from collections.abc import Collection, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from pike.config import EvalConfig
from pike.evaluate import check, device_holds, own_rounding
from pike.evaluate.child_launch import begin_child, launch_child, wait_for_room
from pike.evaluate.device_lock import hold, hold_for_work, set_stopped, tree_of
from pike.evaluate.driver import ChildReport, finish, request, run_trials
from pike.evaluate.leftovers import make_temp_dir, remove_tree
from pike.evaluate.protocol import ChildRequest
from pike.evaluate.sandbox import ChildProcess
from pike.evaluate.shared_window import WindowQueue
from pike.evaluate.timing_window import Timer
from pike.evaluate.trial_comparison import compare_device, load_leaves
from pike.evaluate.verdict import Verdict, says_out_of_memory
from pike.evaluate.wall_clock_check import LoopCost, calibrate
from pike.floor import Work

log = logging.getLogger(__name__)

_TURN_WAIT_S = 0.05  # between looks at a busy reference's `talking` (talking_in_turn)
# Positions of one leaf of one timed set a window's samples may have answered: an honest
# window samples at most eight calls a block (timed_calls.TimedOutputSamples), 16
# positions each, in tens of blocks.
_MOST_ASKED = 1 << 16
_ANSWER_AGAIN_S = 10.0
_wait_to_ask_again = time.sleep

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
    # What the child was started with, so a fresh one can replace it (same seeds, same
    # inputs) when it stays off its usual time; the replacements' folders go with close().
    request: ChildRequest | None = None
    cfg: EvalConfig | None = None
    renewals: int = 0
    new_steps: dict[str, float] = field(default_factory=dict)  # its child's, until reported
    weak_check: str = ""  # why its check tells little (check.weak_check), said in verdicts
    _spare_tmps: list[Path] = field(default_factory=list)

    _on_device: list[list[Any]] | None = None  # `expected`, copied to the GPU that compares
    _kept_bytes: int = 0  # what that copy counts against _KEPT_SHARE, on _kept_on
    _kept_on: str = ""
    _loop_cost: tuple[ChildProcess, LoopCost] | None = None  # and the child it is of
    _work: Work | None = None
    _work_asked: bool = False
    _work_counted: bool = False  # the count's answer is in (or it failed): read freely
    _work_needs_gpu: bool = False  # the meta device could not count it: no count beside
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

    def work(self, without_gpu: bool = False) -> Work | None:
        """The task's FLOPs and minimum bytes, counted once in the reference's child.
        `without_gpu`: only where the count needs no GPU memory (on the meta device, or
        the CPU); one that would build the model again on the GPU is left to a later
        call (the verdict's floor, once the candidate's child has ended)."""
        # The count runs on the meta device, or falls back to where the models are built:
        # only that fallback with construct_on 'device' uses the GPU. Holding it always
        # made a cold evaluation's timing wait seconds for a count that used no GPU.
        # Counted, it is read without the locks: `talking` is held through every window of
        # the task, and the shared hold waits behind every timer; on the H200 level2 bench
        # 55 of 128 verdicts held their lane 1 to 53 s (454 s in all) to attach the floor.
        if self._work_counted:
            return self._work
        on_gpu = (not without_gpu and self.request is not None
                  and self.request.construct_on == "device")
        with hold(self.device, exclusive=False) if on_gpu else nullcontext(), self.talking:
            if not self._work_asked and self.child is not None:
                self._work_asked = True
                counted = True
                try:
                    reply = request(self.child, "work", "work", "work", without_gpu=without_gpu)
                    self.child.enter_phase("idle")
                    if isinstance(reply, dict) and reply.get("work"):
                        self._work = Work.model_validate(reply["work"])
                    elif isinstance(reply, dict) and reply.get("needs_device"):
                        counted = self._work_asked = False  # by a later call, on the GPU
                        self._work_needs_gpu = True
                    else:
                        why = (reply.message if isinstance(reply, Verdict)
                               else reply.get("error"))
                        log.info("no work count for the floor: %s", why)
                finally:
                    self._work_counted = counted
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

    def timed_answers(self, taken: list[dict[str, Any]], scope: str
                      ) -> dict[int, list[check.SampledLeaf | None]] | str:
        """The reference's outputs for the timed input sets a window's samples (`taken`,
        as timed_calls.TimedOutputSamples sent them) came from, at the positions sampled:
        computed again by the live child now, not kept since its check (a task's outputs
        can be GBs each, and only these few values of them are read). Per set, per leaf;
        or why there are none. Takes the device shared and `talking` (talking_in_turn)."""
        # The samples come from the candidate's child: what it may make the reference
        # compute is bounded as an honest window's samples are (each a leaf's
        # SAMPLED_POSITIONS; a sample beyond that, or beyond _MOST_ASKED of a set's leaf,
        # goes unanswered, and check.timed_outputs_problem finds it malformed).
        wanted: dict[int, dict[int, set[int]]] = {}
        for item in taken:
            k = item.get("set")
            if not isinstance(k, int) or isinstance(k, bool):
                continue  # check.timed_outputs_problem names it
            per_leaf = wanted.setdefault(k, {})
            for index, leaf in enumerate((item.get("leaves") or [])[:check.SAMPLED_LEAVES]):
                positions = leaf.get("positions") if isinstance(leaf, dict) else None
                asked = per_leaf.setdefault(index, set())
                if (isinstance(positions, list) and len(positions) <= check.SAMPLED_POSITIONS
                        and len(asked) + len(positions) <= _MOST_ASKED):
                    asked.update(p for p in positions
                                 if isinstance(p, int) and not isinstance(p, bool))
        if not wanted:
            return {}
        asked = [{"set": k, "positions": [sorted(per_leaf.get(i, ())) for i in
                                          range(max(per_leaf, default=-1) + 1)]}
                 for k, per_leaf in sorted(wanted.items())]
        with self.talking_in_turn(scope):
            reply = self._ask("timed_values", sets=asked)
        if says_out_of_memory(reply if isinstance(reply, str) else str(reply.get("error"))):
            # the card full of other evaluations' memory (on the H100 level1 bench, four
            # tasks of three workers each): asked once more, its turn let go meanwhile
            log.info("the reference ran out of memory answering for a window's samples; "
                     "asked once more in %.0f s", _ANSWER_AGAIN_S)
            _wait_to_ask_again(_ANSWER_AGAIN_S)
            with self.talking_in_turn(scope):
                reply = self._ask("timed_values", sets=asked)
        if isinstance(reply, str):
            return reply
        if not isinstance(reply.get("sets"), list):
            return str(reply.get("error") or "the reference did not answer")
        try:
            return {int(answer["set"]): [check.SampledLeaf.of(leaf) for leaf in answer["leaves"]]
                    for answer in reply["sets"]}
        except (KeyError, TypeError, ValueError) as err:
            return f"the reference's answer could not be read ({err})"

    def _ask(self, event: str, **fields: object) -> dict | str:
        """The live child's answer to one request (its phase, answer and event all named
        `event`), or why there is none. The caller holds `talking`."""
        child = self.child
        if child is None or not self.usable():
            return "the reference has no live child to run it"
        reply = request(child, event, event, event, **fields)
        child.enter_phase("idle")
        return reply.message if isinstance(reply, Verdict) else reply

    def _run_exact(self, trial: int) -> list[Any] | str:
        reply = self._ask("exact", trial=trial)
        if isinstance(reply, str):
            return reply
        child = self.child
        assert child is not None
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
        fresh.read_files()  # what it held at most, for the host-memory gate
        shutil.rmtree(tmp / "inputs")  # the fresh child keeps its inputs in memory; the
        shutil.rmtree(tmp / "expected")  # expected outputs stay the first child's
        fresh.enter_phase("idle")
        old, self.child = self.child, fresh
        finish(old)
        self._loop_cost, self.renewals = None, self.renewals + 1
        return True

    def trial_output_bytes(self) -> int:
        """The most bytes one trial's expected outputs take (what a candidate writes a
        trial of: its disk limit follows it)."""
        return max((check.leaves_bytes(leaves) for leaves in self.expected), default=0)

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
    size = sum(check.leaves_bytes(leaves) for leaves in expected)
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


_closing = threading.Lock()  # ReferenceRun.close: once
