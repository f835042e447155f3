"""A candidate's trial outputs compared with the reference's, in the parent.

Each trial is compared as soon as the child says its file is written (or its outputs are
in the GPU buffer lent to it), while the child runs the next; the verdict compares what is
left. Comparisons run on the evaluation's GPU where this process can use it, and fall back
to the host where the GPU has no room. Every file here was written by candidate code: it
is read tensor by tensor, bounded in size, and anything wrong in it is an `incorrect`
verdict, never an exception in the parent.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from contextlib import suppress
from pathlib import Path
from typing import Any

import torch

from pike.config import EvalConfig
from pike.evaluate import check, own_rounding
from pike.evaluate.device_lock import hold_for_work
from pike.evaluate.leaf_files import read_leaves
from pike.evaluate.outputs_handoff import OutputsBuffer
from pike.evaluate.sandbox import ChildProcess
from pike.evaluate.verdict import OutputMismatch, Verdict

log = logging.getLogger(__name__)


# A candidate's outputs may take this many times the reference's (another dtype, say,
# which the comparison then names) before the file is refused unread.
_OUTPUT_SIZE_FACTOR = 4


def load_leaves(path: Path, mapped: bool = False, on: torch.device | None = None,
                like: list[Any] | None = None) -> list[Any]:
    # `mapped` only for the reference's files: pages are read as comparisons touch them
    # (the timed sets' outputs are only sampled). A candidate's file is read tensor by
    # tensor, as a file it could truncate while mapped would end this process with
    # SIGBUS; onto the GPU that compares it (`on`), where there is one; at most a few
    # times the size of the expected outputs (`like`), whatever size its header claims.
    bound = None
    if like is not None:
        bound = _OUTPUT_SIZE_FACTOR * check.leaves_bytes(like) + (1 << 20)
    return read_leaves(path, trusted=mapped, device=on, max_bytes=bound)


_compare_devices: dict[str, torch.device] = {}


def compare_device(device: str) -> torch.device:
    """Where the parent compares outputs: the evaluation's GPU when this process can use
    it (chunks of gigabyte outputs in milliseconds, against seconds each on the host),
    else the host. Comparing is GPU work, so callers hold the device (shared)."""
    if device not in _compare_devices:
        found = torch.device("cpu")
        if device.startswith("cuda"):
            try:
                torch.zeros(1, device=device)
                found = torch.device(device)
            except Exception as err:  # e.g. a forked process with CUDA set up before
                log.info("comparing outputs on the host: %s", err)
        _compare_devices[device] = found
    return _compare_devices[device]


def release_compare_memory(on: torch.device) -> None:
    if on.type == "cuda":
        torch.cuda.empty_cache()  # what the chunks held goes back to the candidates


def compare_early(comparison: TrialComparison, child: ChildProcess, device: str,
                  cfg: EvalConfig) -> Callable[[int], None] | None:
    """What compares a trial the child has saved, while it runs the next. Not with
    every_gpu_use: the child's trials already hold the device shared there, and a second
    shared hold could wait behind a timer that waits for the first."""
    if cfg.device_lock == "every_gpu_use":
        return None

    def taken(trial: int) -> None:  # copied out (or refused): the child may write again
        child.send("taken", trial=trial)

    comparison.on_taken = taken

    def compare(trial: int, layout: Any) -> None:
        try:
            if 0 <= trial < len(comparison.expected):
                asked = time.monotonic()
                with hold_for_work(device, cfg.device_lock):
                    # a wait for the hold is other evaluations' timed windows, which stop
                    # this child too; its check limit is not read meanwhile, so it is told
                    child.not_its_time(time.monotonic() - asked)
                    comparison.add(trial, layout)
        finally:
            if layout is not None:  # a trial never taken (out of range, skipped) too
                comparison.answer(trial)

    return compare


class TrialComparison:
    """A candidate's trials compared with the expected outputs, each as soon as the child
    says its file is written (`add`), so the parent compares trial i while the child runs
    trial i+1; `verdict` compares whatever is left and judges all of them. What the child
    says only decides when a trial is compared, never whether: every trial is compared
    once, in the verdict at the latest."""

    def __init__(self, expected: list[list[Any]], outputs_dir: Path, cfg: EvalConfig,
                 on: torch.device, shifted_atols: list[float] | None = None) -> None:
        self.expected, self.outputs_dir, self.cfg, self.on = expected, outputs_dir, cfg, on
        self.shifted_atols = shifted_atols  # worked out here when not given
        # failing values the reference's own rounding may explain (own_rounding)
        # by trial, where every failing value of it is such a one
        self.doubtful: dict[int, list[own_rounding.Doubtful]] = {}
        self.rounding: list[tuple[int, int]] = []  # (trial, values) its rounding explained
        self.unexplained = ""
        self.compared: set[int] = set()
        self.mismatches: list[OutputMismatch] = []
        self.first: tuple[list[Any], list[Any]] | None = None  # trial 0's outputs, in short
        self.repeated: list[int] = []  # later trials whose outputs equal the first's
        self.passed = 0
        self.max_abs = self.max_rel = 0.0
        self.unreadable: Verdict | None = None
        self.buffer: OutputsBuffer | None = None  # the GPU buffer lent to the child
        self.on_taken: Callable[[int], None] | None = None  # tells the child it may write
        self._answered: set[int] = set()

    def answer(self, trial: int) -> None:
        """Tell the child, once, that trial `trial` is out of the buffer."""
        if trial not in self._answered and self.on_taken is not None:
            self._answered.add(trial)
            self.on_taken(trial)

    def add(self, trial: int, layout: Any = None) -> None:
        """Compare trial `trial` (and every earlier one not compared yet: the fingerprint
        of the first trial is taken before later ones are matched against it); `layout`:
        the child says the trial is in the lent buffer, there, not in its file."""
        for t in range(min(trial + 1, len(self.expected))):
            if t not in self.compared and self.unreadable is None:
                self.compared.add(t)
                self._one(t, layout if t == trial else None)

    def _one(self, trial: int, layout: Any = None) -> None:
        exp_leaves = self.expected[trial]
        if trial == self.cfg.trials and not check.all_finite(exp_leaves, self.on):
            return  # the reference itself overflows on shifted inputs: nothing to learn
        buffer = self.buffer
        in_buffer = layout is not None and buffer is not None  # else the file counts
        try:
            if in_buffer:
                try:
                    exp_here, act_leaves, here = read_back(
                        lambda to: buffer.take(layout, to),  # type: ignore[union-attr]
                        exp_leaves, self.on)
                finally:  # before the comparison: the child's next trial need not wait
                    self.answer(trial)
            else:
                exp_here, act_leaves, here = read_back(
                    file_loader(self.outputs_dir / f"outputs_{trial}.pt", exp_leaves),
                    exp_leaves, self.on)
        except Exception as err:  # written by the child: anything may be in it
            self.unreadable = Verdict(
                status="incorrect", phase="check",
                message=f"trial {trial}: outputs could not be read back ({err})")
            return
        if not in_buffer:
            self._pass_on(trial)
        if trial == 0:
            self.first = _fingerprint(act_leaves)
        elif _same_print(self.first, _fingerprint(act_leaves)):
            self.repeated.append(trial)
        atol: float | list[float] = self.cfg.atol
        if trial == self.cfg.trials:  # the other distribution's larger values
            if not self.shifted_atols:  # not given: on the host, as a reference run does
                self.shifted_atols = check.shifted_atols(
                    _on_host(self.expected[0]), _on_host(exp_here), self.cfg.atol)
            atol = self.shifted_atols
        compared = compare_with_room(exp_here, act_leaves, trial, self.cfg, here, atol)
        self.max_abs = max([self.max_abs, *(c.max_abs_error or 0.0 for c in compared)])
        self.max_rel = max([self.max_rel, *(c.max_rel_error or 0.0 for c in compared)])
        trial_bad = [c for c in compared if c.problem]
        doubtful = own_rounding.all_doubtful(trial_bad, exp_here, act_leaves, trial, atol,
                                             self.cfg.rtol, here)
        if doubtful:
            self.doubtful[trial] = doubtful
        del act_leaves
        self.mismatches.extend(trial_bad)
        self.passed += not trial_bad and trial < self.cfg.trials

    def may_be_rounding(self) -> bool:
        """Whether some failing trial's every failing value is a doubtful one."""
        return bool(self.doubtful)

    def explain_by_rounding(self, exact: Callable[[int], list[Any] | str]) -> None:
        """Drop the mismatches of each trial whose every failing value the reference's
        own rounding explains (own_rounding; `exact`: a trial's expected outputs in
        float64, or why there are none): such a trial passes. On the comparison's
        device: the caller holds it."""
        for trial, doubtful in sorted(self.doubtful.items()):
            why = own_rounding.unexplained(doubtful, self.expected[trial], exact(trial),
                                           self.cfg.rtol, self.on)
            if why:
                self.unexplained = self.unexplained or f"trial {trial}: {why}"
                continue
            self.mismatches = [m for m in self.mismatches if m.trial != trial]
            self.rounding.append((trial, sum(d.index.numel() for d in doubtful)))
            self.passed += trial < self.cfg.trials
        self.doubtful = {}  # judged: a second call finds nothing left to explain

    def _pass_on(self, trial: int) -> None:
        """Give a read trial's file to one the child writes later, which it writes over in
        place: on /dev/shm that skips making and zeroing fresh pages, a third of writing a
        gigabyte of outputs. The first later name the child has not begun, from two trials
        on (it may be writing the next one already), the check after timing's last: a
        link never replaces a file. Only the child's own bytes move: it wrote the file and
        may write anything into the next one anyway."""
        later = [f"outputs_{t}.pt" for t in range(trial + 2, len(self.expected))]
        if self.cfg.guards:
            later.append("outputs_final.pt")
        read = self.outputs_dir / f"outputs_{trial}.pt"
        given: Path | None = None
        for name in later:
            try:
                os.link(read, self.outputs_dir / name, follow_symlinks=False)
                given = self.outputs_dir / name
            except FileExistsError:
                continue  # begun by the child, or given a file already
            except OSError:
                pass  # the child's folder: it may have moved things
            break
        try:
            read.unlink()
        except OSError:
            if given is not None:  # a file of two names is refused when read: keep one
                with suppress(OSError):
                    given.unlink()

    def return_buffer(self) -> None:
        """Free the lent buffer, once its child has ended."""
        if self.buffer is not None:
            log.info("%d trials handed over in GPU memory", self.buffer.handed)
            self.buffer.close()
            self.buffer = None

    def verdict(self) -> Verdict:
        self.add(len(self.expected) - 1)
        if self.unreadable is not None:
            return self.unreadable
        errors = {"trials_passed": self.passed, "max_abs_error": self.max_abs,
                  "max_rel_error": self.max_rel}
        if not self.mismatches:
            return Verdict(status="ok", message=self._rounding_note(), **errors,
                           rounding_passed=sum(n for _, n in self.rounding) or None)
        mismatches = sorted(self.mismatches, key=lambda m: m.trial)
        first_bad = mismatches[0]
        which = (f"trial {first_bad.trial}" if first_bad.trial < self.cfg.trials else
                 "the trial with inputs of another distribution (a drawn scale and shift)")
        failed = len({m.trial for m in mismatches})
        message = (f"{failed} of {len(self.expected)} trials failed; {which}, "
                   f"output {first_bad.output}: {first_bad.problem}")
        # identical outputs for inputs whose expected outputs differ: a cached answer
        if any(not _same_leaves(self.expected[0], self.expected[t]) for t in self.repeated):
            message += ("; the output is identical for different inputs (a cached or "
                        "constant result?)")
        if self.unexplained:
            message += f"; not the reference's own rounding: {self.unexplained}"
        return Verdict(status="incorrect", phase="check", message=message,
                       mismatches=mismatches[:20], **errors)

    def _rounding_note(self) -> str:
        if not self.rounding:
            return ""
        values = sum(n for _, n in self.rounding)
        trials = ", ".join(str(t) for t, _ in self.rounding)
        return (f"{values} values (trials {trials}) outside tolerance of the reference are "
                "no further from its float64 result than the reference itself is")


_HOST = torch.device("cpu")


def read_back(load: Callable[[torch.device], list[Any]], expected: list[Any],
              on: torch.device) -> tuple[list[Any], list[Any], torch.device]:
    """A candidate's outputs of one trial (`load(onto)`), with the expected ones and where
    to compare them: on `on`, or on the host where the GPU has no room left for the
    parent. Other evaluations' memory on a shared GPU is not the candidate's fault (on an
    H200, 16 of them at once left a comparison 16 MB short and gave correct candidates
    `incorrect`)."""
    try:
        return expected, load(on), on
    except torch.OutOfMemoryError as err:
        return _on_host(expected, err), load(_HOST), _HOST


def file_loader(path: Path, expected: list[Any]) -> Callable[[torch.device], list[Any]]:
    return lambda onto: load_leaves(path, on=onto, like=expected)


def compare_with_room(expected: list[Any], actual: list[Any], trial: int, cfg: EvalConfig,
                      on: torch.device, atol: float | list[float] | None = None
                      ) -> list[OutputMismatch]:
    """`check.compare_leaves` on `on` (at cfg.atol unless `atol` says otherwise), or on
    the host where the GPU runs out of room for it."""
    try:
        return _compare_leaves(expected, actual, trial, cfg, on, atol)
    except torch.OutOfMemoryError as err:
        return _compare_leaves(_on_host(expected, err), _on_host(actual), trial, cfg, _HOST,
                               atol)


def _compare_leaves(expected: list[Any], actual: list[Any], trial: int, cfg: EvalConfig,
                    on: torch.device, atol: float | list[float] | None = None
                    ) -> list[OutputMismatch]:
    return check.compare_leaves(expected, actual, trial, cfg.atol if atol is None else atol,
                                cfg.rtol, on)


def _on_host(leaves: list[Any], err: BaseException | None = None) -> list[Any]:
    if err is not None:
        log.info("comparing a trial on the host: the GPU has no room (%s)",
                 str(err).splitlines()[0][:120])
        torch.cuda.empty_cache()  # what a failed chunk held
    return [x.cpu() if isinstance(x, torch.Tensor) else x for x in leaves]


_PRINTED_VALUES = 4096


def _fingerprint(leaves: list[Any]) -> tuple[list[Any], list[Any]] | None:
    """Enough of a trial's outputs to tell them from another trial's, without keeping a
    gigabyte output on the GPU for the whole check: each tensor's shape, and its values
    at evenly spread positions (all of them where it has few). Only a failure message's
    hint ("identical for different inputs") rests on it, never a verdict; None where the
    values cannot be picked (a dtype torch cannot index, from a candidate's file)."""
    def spread(leaf: torch.Tensor) -> torch.Tensor:
        flat = leaf.detach().reshape(-1)  # read back from a flat file: contiguous, a view
        n = flat.numel()
        if n <= _PRINTED_VALUES:
            return flat.clone()
        # integer steps: float32 positions round past the end above 2**24 elements
        steps = torch.arange(_PRINTED_VALUES, device=flat.device)
        return flat[steps * (n - 1) // (_PRINTED_VALUES - 1)]

    try:
        return ([tuple(x.shape) if isinstance(x, torch.Tensor) else None for x in leaves],
                [spread(x) if isinstance(x, torch.Tensor) else x for x in leaves])
    except (RuntimeError, NotImplementedError, TypeError, IndexError):
        return None


def _same_print(a: tuple[list[Any], list[Any]] | None,
                b: tuple[list[Any], list[Any]] | None) -> bool:
    return a is not None and b is not None and a[0] == b[0] and _same_leaves(a[1], b[1])


def _same_leaves(a: list[Any], b: list[Any]) -> bool:
    try:
        return len(a) == len(b) and all(
            isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor) and x.shape == y.shape
            and x.dtype == y.dtype and torch.equal(x, y.to(x.device))
            for x, y in zip(a, b, strict=True))
    except (RuntimeError, NotImplementedError, TypeError):  # a dtype torch cannot compare
        return False
