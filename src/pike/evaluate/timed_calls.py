"""The timed calls' inputs and the samples of their outputs, in the child.

Timed calls take the input sets in turn, now and then a probe set never seen before
(`InputRotation`, its probes sealed in a generator a candidate cannot read); after each
call the child samples the output at positions drawn from the OS (`TimedOutputSamples`),
for the parent to compare with the reference's answers. The randomness and the frame
functions are bound at import, before any candidate code runs: a candidate reaches the
os, sys and threading modules, and a swapped function would choose for it.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any

import torch

from pike.evaluate import callbacks, check
from pike.evaluate.leaf_files import PLAIN_DTYPES

_urandom = os.urandom  # bound at import: the timed outputs' sample positions come from it

# The operators the sampler runs on an output (and the check trials' copies and their
# input check, aten::equal: a kernel that always answers "equal" would hide an input
# changed in place), whose kernels a candidate could replace with its own through
# torch.library: a kernel that computes only the positions the sampler reads defers the
# work past the clock, as a mode left in force did. Their dispatch tables are taken at
# import, before any candidate code runs, and read again before each sample (about 0.7 ms,
# outside the timed calls).
_SAMPLER_OPS = ("aten::detach", "aten::lift_fresh", "aten::index.Tensor", "aten::unbind.int",
                "aten::_to_copy", "aten::copy_", "aten::reshape", "aten::view",
                "aten::select.int", "aten::as_strided", "aten::resolve_conj",
                "aten::resolve_neg", "aten::empty.memory_format", "aten::empty_strided",
                "aten::abs", "aten::clone", "aten::to.dtype_layout", "aten::to.device",
                "aten::to.dtype", "aten::equal",
                # run inside those (torch.tensor's detach_, complex outputs' abs): a kernel
                # for aten::detach_ saw the sampled coordinates and computed only those
                # values (red team round 10, `ok` at 35x); tests/test_timed_calls.py
                # profiles the sampler for any it runs that is not listed here
                "aten::detach_", "aten::empty_like", "aten::real", "aten::view_as_real",
                "aten::to.other", "aten::lift_fresh_copy",
                # and on a CUDA output: the index's broadcast and the host copy's resize
                # (tests/gpu/test_gpu_evaluate.py profiles the sampler on a GPU)
                "aten::expand", "aten::expand_as", "aten::resize_",
                # what staging runs on every input file, the probes' among them: a kernel
                # for aten::slice.Tensor saw each set as it loaded and answered it ahead
                # (red team round 11, `ok` at 214x); compared before the timing's staging
                "aten::slice.Tensor", "aten::from_file", "aten::view.dtype")


def _dispatch_tables() -> dict[str, str]:
    tables = {}
    for name in _SAMPLER_OPS:
        try:
            tables[name] = torch._C._dispatch_dump_table(name)
        except RuntimeError:  # not an operator of this torch
            pass
    return tables


_TABLES_AT_IMPORT = _dispatch_tables()


def replaced_operator() -> str | None:
    """The first of the sampler's operators whose kernels changed since import, or None."""
    now = _dispatch_tables()
    return next((name for name, table in _TABLES_AT_IMPORT.items() if now.get(name) != table),
                None)


# The dispatch keys whose aten kernels a candidate's torch.library registration would add
# to (the watched tables above see a replaced one only among their own operators).
_KERNEL_KEYS = ("CPU", "CUDA", "AutogradCPU", "AutogradCUDA", "Autograd",
                "CompositeImplicitAutograd", "CompositeExplicitAutograd")


def _aten_registrations() -> frozenset[tuple[str, str]]:
    found = set()
    for key in _KERNEL_KEYS:
        try:
            names = torch._C._dispatch_get_registrations_for_dispatch_key(key)
        except RuntimeError:  # not a key of this torch
            continue
        found.update((key, name) for name in names if name.startswith("aten::"))
    return frozenset(found)


_REGISTRATIONS_AT_IMPORT = _aten_registrations()


def added_or_replaced_kernel() -> str | None:
    """A watched operator's kernels replaced, or any aten operator given a kernel for a key
    it had none for since import: asked before the timing's inputs are staged (about 10
    ms), where a kernel would see the probe sets as they load."""
    replaced = replaced_operator()
    if replaced is not None:
        return replaced
    added = sorted(_aten_registrations() - _REGISTRATIONS_AT_IMPORT)
    return f"{added[0][1]} (for {added[0][0]})" if added else None


def left_behind(out: Any, call: str, kernels: bool = True) -> str | None:
    """What a call (`call` names it: "a timed call") left that could defer or fake its work
    past the clock, worded to follow "the candidate tried" (None where nothing): an output
    part that is not plain, a torch function or dispatch mode in force, and with `kernels`
    a sampler operator's kernels replaced (the costly one: about 0.7 ms). Runs no
    candidate code and no torch operator a mode or a kernel could answer, so it comes
    before anything that reads the outputs."""
    odd = check.odd_output_part(out)
    if odd is not None:
        why = check.MANY_PARTS_WHY if odd == check.TOO_MANY_PARTS else check.ODD_OUTPUT_WHY
        return f"to return a {odd} from {call} ({why})"
    mode = check.mode_in_force()
    if mode is not None:
        return f"to leave a {mode} in force after {call} ({check.MODE_WHY})"
    replaced = replaced_operator() if kernels else None
    if replaced is not None:
        return (f"to replace the kernels of {replaced}, which the evaluator runs on inputs "
                "and outputs")
    return None


def stand_in(leaf: Any) -> Any:
    """A small tensor like `leaf` (device, dims, and its dtype where that is a plain one:
    a quantized or bits dtype cannot be made or indexed like this, float32 serves)."""
    if not isinstance(leaf, torch.Tensor):
        return leaf
    shape = (check.SAMPLED_POSITIONS,) + (1,) * (leaf.dim() - 1) if leaf.dim() else ()
    dtype = leaf.dtype if leaf.dtype in PLAIN_DTYPES else torch.float32
    return torch.zeros(shape, dtype=dtype, device=leaf.device)


class InputRotation:
    """Timed calls take the input sets in turn, so no call sees the inputs of the one
    before it: a stale or never-computed output cannot pass for the right one. Now and
    then (drawn after the call before) a probe set, never seen before, takes a call's
    turn: set numbers go on past the rotation's for them. The probes are sealed
    (`_sealed_probes`): a timed call that walks its stack to this rotation finds the
    sets it is timed on, not the probes it has yet to meet."""

    def __init__(self, sets: list[list[Any]], probes: list[list[Any]] | None = None,
                 taker_is_foreign: Callable[[FrameType, int], bool] = lambda frame, thread: False,
                 tampered: Callable[[str], None] = lambda what: None) -> None:
        self.sets = sets
        self.calls, self.last, self.used_probes, self.probe_next = 0, 0, 0, False
        self.probe_count = 0
        self._probes: Iterator[list[Any]] = iter(())
        # The next call is a block's untimed refill (timing.time_block), which must not
        # take the probe drawn after the last block's last timed call: it went there
        # untimed and unsampled, and with one timed call a block (calls of 50 ms and
        # more in a full window) no probe was ever timed and the reuse check never ran.
        self.refill_next = False
        self._picked: list[Any] | None = None  # the set `pick` chose for the next call
        self._tampered: Callable[[str], None] = lambda what: None
        self._callbacks: dict[str, object] = {}
        if probes:
            self.seal_probes(probes, taker_is_foreign, tampered)

    def seal_probes(self, probes: list[list[Any]],
                    taker_is_foreign: Callable[[FrameType, int], bool],
                    tampered: Callable[[str], None]) -> None:
        """Hand `probes` over to a sealed generator; the caller must drop its own
        references to them (a list the caller keeps would hold them in its frame)."""
        self.probe_count = len(probes)
        self._probes = _sealed_probes(list(probes), taker_is_foreign, tampered)
        self._tampered, self._callbacks = tampered, callbacks.snapshot()

    @property
    def last_was_probe(self) -> bool:
        return self.last >= len(self.sets)

    def caller(self, fn: Callable[..., Any]) -> Callable[[], Any]:
        """A call of `fn` on the next set. Its `pick` attribute chooses that set ahead
        (timing.time_block runs it before each timed call's clock starts); a call not
        picked for (warm-up, a block's refill) chooses its own."""
        def pick() -> None:
            self._picked = self._next_set()

        def call() -> Any:
            args, self._picked = self._picked, None
            if args is None:
                args = self._next_set()
            with torch.no_grad():
                return fn(*args)

        call.pick = pick  # type: ignore[attr-defined]
        return call

    def _next_set(self) -> list[Any]:
        # Taking a probe out of its seal checks who takes it (a walk of the frames above,
        # with an audit event): outside the timed region, else every probe call paid it. On
        # the 2-core host the fastest of a tiny task's probes took 0.040 to 0.048 ms against
        # a p90 of 0.008 ms for its other calls, and load pushed it past the reuse check's
        # margin; picked ahead, 0.018 to 0.021 ms (bench/results/probe-cost-cpu-*.md).
        # Picked just before its call, a probe is held only while no candidate code runs on
        # this thread.
        refill, self.refill_next = self.refill_next, False
        args = None
        if self.probe_next and not refill and self.used_probes < self.probe_count:
            # Nothing the interpreter calls back may run while the seal's frame is on the
            # stack: it walked f_back to it from a collector callback, a freed cycle's
            # finalizer and a signal handler (red team round 10). The collector waits; a
            # handler of the candidate's in force now ends the takes (it may be put back
            # before the phase ends, when the guards compare them again).
            installed = callbacks.changed_since(self._callbacks)
            if installed:
                self._tampered(f"{installed[0]} while the timing's probes were sealed (code "
                               "the interpreter calls back inside any frame)")
                self.probe_count = self.used_probes  # no probe is taken after it
            else:
                with callbacks.no_collection():
                    args = next(self._probes, None)  # None: the seal was broken, none left
            if args is not None:
                self.last = len(self.sets) + self.used_probes
                self.used_probes += 1
        if args is None:
            self.last = self.calls % len(self.sets)
            args = self.sets[self.last]
            self.calls += 1
        if not refill:
            self.probe_next = False
        return args


def _sealed_probes(probes: list[list[Any]], taker_is_foreign: Callable[[FrameType, int], bool],
                   tampered: Callable[[str], None]) -> Iterator[list[Any]]:
    """The probe sets one by one, held meanwhile in this generator's frame alone: its
    locals are reachable only through `gi_frame`, which the guards refuse candidate code
    for an evaluator's generator (guards.Guards._hook). Before, the rotation held them
    in a list, and a timed call that walked `f_back` to it answered every probe at its
    first call and served the rest from a memo (tests/candidates/reads_probes_by_frames:
    `ok` at 70x on the CPU). A probe goes only to the rotation's own call with no
    candidate code above it (`taker_is_foreign` says otherwise: a `next()` of the
    candidate's, or the rotation's call made from inside a timed call); any other taker
    ends the generator and the candidate's verdict is `rejected` (`tampered`)."""
    sealed_on = _get_ident()
    for index in range(len(probes)):
        if taker_is_foreign(_getframe(1), sealed_on):
            probes.clear()
            tampered("taking the timing's probe sets out of turn")
            return
        # Taken sets stay in the list: freeing the last reference to one the candidate has
        # seen ran its weakref callback inside this frame, which read the rest through
        # f_back (red team round 11, `ok` at 2,089x on the CPU).
        yield probes[index]


# taken at import: the candidate reaches the sys and threading modules, and a swapped
# sys._getframe or threading.get_ident would vouch for any taker of the sealed probes
_getframe, _get_ident = sys._getframe, threading.get_ident


def _draw_below(n: int) -> int:
    return int.from_bytes(_urandom(8), "little") % n


class TimedOutputSamples:
    """Values of timed calls' outputs at random positions, for the parent to compare with
    the reference's answers for the same inputs. Whether a call is sampled, and where,
    is drawn from the OS after the call has returned, so the candidate cannot know which
    of its timed calls will be checked."""

    RATE_PERCENT, PER_BLOCK = 50, 8

    def __init__(self, rotation: InputRotation,
                 refused: Callable[[str], None] = lambda what: None) -> None:
        self.rotation, self.taken, self.calls = rotation, [], 0
        self.refused = refused  # the guards' violations: the block ends `rejected`
        self.refused_once = False  # one violation names the cheat; a block's worth is noise
        self.probe_calls: list[int] = []
        self.block_start = 0

    def __call__(self, out: Any) -> None:
        probe = self.rotation.last_was_probe
        # probes are always sampled: a fast wrong answer must not pass either
        to_sample = probe or (len(self.taken) < self.PER_BLOCK
                              and _draw_below(100) < self.RATE_PERCENT)
        # Every timed output, sampled or not: a lazy tensor returned at once and computed
        # only when the sample reads it was `ok` at 4x to 6x on the CPU (a check of the
        # check trials' outputs alone let it through; tests/candidates/lazy_when_timed).
        # The kernels are compared only where a sample will read them.
        left = left_behind(out, "a timed call", kernels=to_sample)
        if left is not None:
            if not self.refused_once:
                self.refused(left)
            self.refused_once = True
            return
        call, self.calls = self.calls, self.calls + 1
        if probe:
            self.probe_calls.append(call - self.block_start)
        # At most one probe a block, so they spread over the window (and a burst of host
        # load cannot fall on all of them).
        self.rotation.probe_next = not self.probe_calls and _draw_below(PROBE_ONE_IN) == 0
        if not to_sample:
            return
        leaves = check.flatten_output(out)[:check.SAMPLED_LEAVES]
        with torch._C.DisableTorchFunction():  # read as plain tensors, whatever is in force
            sampled = [_sample_leaf(leaf, check.SAMPLED_POSITIONS) for leaf in leaves]
        self.taken.append({"call": call, "set": self.rotation.last, "leaves": sampled})

    def take(self) -> tuple[list[dict[str, Any]], list[int]]:
        """This block's samples, and which of its timed calls (by index) were probes."""
        taken, probes = self.taken, self.probe_calls
        self.taken, self.probe_calls, self.block_start = [], [], self.calls
        self.rotation.refill_next = True  # the next block begins with one
        return taken, probes


class RehearsedSamples(TimedOutputSamples):
    """The sampling a guarded candidate's child does between its timed calls, done by the
    reference for its cost alone: what it takes is dropped, never sent, and an output it
    cannot sample (sparse, quantized) costs no more than that; it must not fail a mode."""

    def __init__(self, rotation: InputRotation) -> None:
        super().__init__(rotation)
        self.rehearsed = 0  # sampled in this block: reported, so the work can be seen done

    def __call__(self, out: Any) -> None:
        try:
            super().__call__(out)
        except Exception:  # noqa: BLE001 - the samples are not used
            pass

    def take(self) -> tuple[None, None]:  # type: ignore[override]
        self.rehearsed = len(super().take()[0])
        return None, None


PROBE_ONE_IN = 6  # the chance that the next timed call takes a probe set


def _sample_leaf(leaf: Any, count: int) -> dict[str, Any]:
    if not isinstance(leaf, torch.Tensor):  # a repr of another type would run its code
        return {"scalar": leaf if type(leaf) in (int, float, bool) else type(leaf).__name__}
    n = leaf.numel()
    positions = [_draw_below(n) for _ in range(min(count, n))]
    return {"shape": list(leaf.shape), "dtype": str(leaf.dtype), "positions": positions,
            "values": values_at(leaf, positions)}


def values_at(leaf: torch.Tensor, positions: list[int]) -> list[float]:
    """`leaf`'s values at row-major flat `positions` (each below its numel), as floats
    (a complex value's magnitude): what a timed call's sample holds, and what the
    reference answers for the same positions (ReferenceRun.timed_answers)."""
    if not positions:
        return []
    # Coordinates by hand: torch.unravel_index cost 0.1 ms a call on the host, and this
    # runs between timed calls, in the wall time the parent checks the samples against.
    picked = (leaf.detach()[torch.tensor(_coordinates(positions, list(leaf.shape))).unbind()]
              if leaf.dim() else leaf.detach().reshape(1))
    if picked.is_complex():
        picked = picked.abs()
    return picked.to("cpu", torch.float64).tolist()


def _coordinates(positions: list[int], shape: list[int]) -> list[list[int]]:
    """Row-major flat positions as one list of indices per dimension."""
    columns: list[list[int]] = [[] for _ in shape]
    for position in positions:
        for dim in range(len(shape) - 1, -1, -1):
            position, index = divmod(position, shape[dim])
            columns[dim].append(index)
    return columns
