"""The reference's side of the child: it draws the trial inputs, saves them and records
the expected outputs, then serves timing requests for eager and each torch.compile mode,
checks a compiled mode against eager, and runs a trial again in float64 when asked.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from pike.evaluate import check, own_rounding
from pike.evaluate.child_serving import _serve_timing
from pike.evaluate.child_setup import (
    REFERENCE_MODULE,
    STEPS,
    Failure,
    _build_model,
    _draw_inputs,
    _guarded,
    _loaded_one_by_one,
    _shift_distribution,
    _sync,
    _to_device,
    import_file,
    resolve_construct_on,
)
from pike.evaluate.compiled_modes import own_copy, prebuild_mode
from pike.evaluate.diagnostics import describe_exception
from pike.evaluate.guards import rehearse_check_after
from pike.evaluate.leaf_files import read_leaves, write_leaves
from pike.evaluate.protocol import Channel, ChildRequest
from pike.evaluate.timed_calls import (
    InputRotation,
    RehearsedSamples,
    TimedOutputSamples,
    stand_in,
    values_at,
)

_save = torch.save


def run_reference(req: ChildRequest, chan: Channel, device: torch.device) -> None:
    with STEPS.span("import_task"):
        module = _guarded("task_error", "load", req.module_path,
                          lambda: import_file(req.module_path, REFERENCE_MODULE))
    for name in ("get_inputs", "get_init_inputs"):
        if not callable(getattr(module, name, None)):
            raise Failure("task_error", "load", f"`{name}` is not a function")
    init_inputs = _guarded("task_error", "load", req.module_path, module.get_init_inputs)
    if not isinstance(init_inputs, (list, tuple)):
        raise Failure("task_error", "load", "get_init_inputs() must return a list or tuple")
    inputs_dir = Path(req.inputs_dir)
    _save(list(init_inputs), inputs_dir / "init_inputs.pt")

    def trial_inputs(trial: int) -> list[Any]:
        inputs = _draw_inputs(module, req, req.trial_seeds[trial], device)
        if trial == req.trials:  # the trial of another distribution
            inputs = [_shift_distribution(x, req.shift) for x in inputs]
        return inputs

    def drawn(name: str, draw: Callable[[], list[Any]]) -> list[Any]:
        with STEPS.span("draw_inputs"):
            inputs = draw()
        with STEPS.span("save_inputs"):  # whoever loads them picks a device
            write_leaves(inputs, inputs_dir / f"{name}.pt")
        return inputs

    # The check trials' inputs are drawn and saved here, then loaded one set at a time for
    # the forward (the bytes every candidate loads); the timed calls' inputs (never seen in
    # the checks) stay on the device for the timing windows.
    for trial in range(len(req.trial_seeds)):
        drawn(f"inputs_{trial}", lambda t=trial: trial_inputs(t))
    pool = []
    for k, seed in enumerate(req.pool_seeds):
        inputs = drawn(f"pool_{k}", lambda s=seed: _draw_inputs(module, req, s, device))
        with STEPS.span("inputs_to_device"):
            pool.append(_to_device(inputs, device))
        del inputs
    drawn_prints = [_fingerprint(inputs) for inputs in pool]  # (timed_values)
    chan.send("phase", phase="init")
    with STEPS.span("build_model"):
        cls = getattr(module, "Model", None)
        if cls is not None:  # (_build_model says what is missing)
            req.construct_on = resolve_construct_on(req.construct_on, cls, list(init_inputs),
                                                    device)  # type: ignore[assignment]
        model = _build_model(req, module, list(init_inputs), device, "task_error")
    chan.send("phase", phase="check")
    outputs_dir = Path(req.outputs_dir)
    # The timed sets' outputs are not kept: read at a few sampled positions only, they are
    # computed again when a window's samples are checked (timed_values). Kept, they were
    # half of what a reference held in the scratch (28 of 56 GiB for level1's 7 and 9).
    for name, inputs in _reference_check_inputs(inputs_dir, len(req.trial_seeds), device):
        with STEPS.span("forward"), torch.no_grad():
            out = _guarded("task_error", "check", req.module_path, lambda i=inputs: model(*i))
            _sync(device)
        with STEPS.span("save_outputs"):
            write_leaves(check.flatten_output(out), outputs_dir / f"{name}.pt")
        # Small stand-ins for the outputs (same devices, dtypes and dims), so the
        # calibration's blocks sample outputs as a guarded candidate's blocks do.
        stand_ins = [stand_in(leaf) for leaf in check.flatten_output(out)[:check.SAMPLED_LEAVES]]
        del inputs, out  # before the next set loads
    # A kept reference waits, idle, through its task's search: its allocator's cache (the
    # check's peak) goes back to the card's other evaluations.
    if device.type == "cuda":
        torch.cuda.empty_cache()
    chan.send("checked", trials=req.trials, steps=STEPS.rounded(), built_on=req.construct_on)
    torch.set_float32_matmul_precision("highest")  # the task's dtype is the contract
    rotation = InputRotation(pool[:req.input_sets])  # the probe sets are the candidate's
    compiled_modes: list[str] = []
    compiled: dict[str, Callable[..., Any]] = {}
    sharing: dict[str, str | None] = {}  # why a mode shares eager's module, where it does

    def make_call(mode: str) -> Callable[[], Any]:
        fn = model
        if mode == "empty":  # calibrates what the timing loop costs around a call
            return lambda: stand_ins
        if mode.startswith("compile:"):
            # One reset, before the first mode: a reset drops every compiled frame, so one
            # before each mode made the modes built before it compile again in the window.
            if not compiled_modes:
                torch._dynamo.reset()
            compiled_modes.append(mode)
            module, sharing[mode] = own_copy(model)
            fn = compiled[mode] = torch.compile(module, mode=mode.split(":", 1)[1])
        elif mode != "eager":
            raise ValueError(f"unknown timing mode {mode!r}")
        return rotation.caller(fn)

    def failed_mode(mode: str, exc: BaseException, seq: object) -> None:
        # A failing torch.compile mode is reported and the other modes go on.
        chan.send("timed", mode=mode, error=describe_exception(exc).splitlines()[0][:500],
                  seq=seq)

    # A calibration block costs what a guarded candidate's block costs around its calls:
    # its outputs sampled, and the guards' look for patches and threads after the block.
    calibration = TimedOutputSamples(InputRotation([[]]))
    # The reference's own blocks do that work too (its samples unused): it is the control
    # that tells a loaded host from forged timings (wall_clock_check.unaccounted_wall_time), so load
    # that makes the work dearer than calibrated must stretch its blocks as it stretches
    # the candidate's. Without it a correct Triton candidate of microsecond calls, judged
    # beside a busy audit on an H200, was rejected as a forger in all three windows.
    own_work = RehearsedSamples(InputRotation([[]]))
    def mode_outcome(mode: str, atol: float, rtol: float) -> tuple[str, str]:
        """Whether a compiled mode answers as eager does on the check trials' inputs (read
        back as saved): ("checked", ""), ("incorrect", where) or ("unchecked", why). A mode
        that is not correct is no bar for a candidate to pass; one that cannot be checked
        (eager itself answers differently on a second call: state kept on the module,
        dropout in training mode) stays one, said so."""
        fn = compiled.get(mode)
        if fn is None:
            return "unchecked", "not a compiled mode"
        for trial in range(len(req.trial_seeds)):
            label = "shifted inputs" if trial == req.trials else f"trial {trial}"
            inputs = _to_device(read_leaves(inputs_dir / f"inputs_{trial}.pt", trusted=True),
                                device)
            with torch.no_grad():  # each call on its own copy, in case the forward writes
                expected = check.flatten_output(model(*_copies(inputs)))
                again = check.flatten_output(model(*_copies(inputs)))
                if _outputs_differ(expected, again, atol, rtol, device):
                    return "unchecked", f"eager answers {label} otherwise when called again"
                got = check.flatten_output(fn(*_copies(inputs)))
            # a mode that sums in another order may differ where the reference's own
            # rounding does (own_rounding): the float64 run settles those values
            problem = own_rounding.rescued(
                expected, got, lambda i=inputs: own_rounding.exact_forward(model, i),
                atol, rtol, device)
            if problem:
                return "incorrect", f"{label}, {problem}"
        return "checked", ""

    def outcome_and_sharing(mode: str, atol: float, rtol: float) -> tuple[str, str]:
        outcome, why = mode_outcome(mode, atol, rtol)
        return outcome, "; ".join(note for note in (why, sharing.get(mode)) if note)

    def prebuild(mode: str) -> None:
        if compiled_modes:  # its reset would drop the modes already built
            raise RuntimeError("a pre-build comes before every mode's own build")
        prebuild_mode(model, mode, lambda fn: rotation.caller(fn)(), device)

    def exact(trial: int) -> str:
        """Trial `trial` run again in float64 (own_rounding), its outputs written to a
        file in this child's own folder: its name. The inputs are drawn again from their
        seed, as a fresh child draws them: a renewed child's folders are gone."""
        name = f"exact_{trial}.pt"
        write_leaves(own_rounding.exact_forward(model, trial_inputs(trial)), Path(name))
        return name

    def timed_values(asked: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The model's outputs on timed input sets, computed now, at the positions asked:
        per set asked ({"set": k, "positions": [[position, ...] per leaf]}), its first
        check.SAMPLED_LEAVES leaves, each as its shape and its values at those positions
        that lie within it (a leaf that is not a tensor: its shape None). A set it does
        not have is left out."""
        answers = []
        for item in asked:
            k = int(item["set"])
            if not 0 <= k < len(pool):
                continue  # unanswered: the parent's check names the set unknown
            if _fingerprint(pool[k]) != drawn_prints[k]:
                # the task writes into its inputs (its own timed calls ran on this set):
                # drawn again from its seed, as the candidate's were loaded, untouched
                pool[k] = _to_device(_draw_inputs(module, req, req.pool_seeds[k], device),
                                     device)
            with torch.no_grad():  # on copies: this call must not change them either
                out = model(*_copies(pool[k]))
            _sync(device)
            wanted = list(item.get("positions") or [])
            leaves = []
            for index, leaf in enumerate(check.flatten_output(out)[:check.SAMPLED_LEAVES]):
                if not isinstance(leaf, torch.Tensor):
                    leaves.append({"shape": None})
                    continue
                n = leaf.numel()
                within = sorted({int(p) for p in (wanted[index] if index < len(wanted) else [])
                                 if 0 <= int(p) < n})
                with torch._C.DisableTorchFunction():
                    values = values_at(leaf, within)
                leaves.append({"shape": list(leaf.shape), "positions": within,
                               "values": values})
            answers.append({"set": k, "leaves": leaves})
            del out
        return answers

    _serve_timing(req, chan, device, make_call, failed_mode, exact=exact,
                  timed_values=timed_values,
                  after_block=lambda mode: rehearse_check_after(),
                  samples_for=lambda mode: calibration if mode == "empty" else own_work,
                  mode_outcome=outcome_and_sharing,
                  forget=lambda mode: compiled.pop(mode, None), prebuild=prebuild)


def _outputs_differ(expected: list[Any], got: list[Any], atol: float, rtol: float,
                    device: torch.device) -> str | None:
    found = next((m for m in check.compare_leaves(expected, got, 0, atol, rtol, device)
                  if m.problem), None)
    return f"output {found.output}: {found.problem}" if found else None


# Strides of the partial sums beside each tensor's whole one: a change that keeps the
# whole sum (a flip, a roll, a sort) almost always moves values into or out of these
# strided subsets, and so changes their sums; a change that keeps all three is not ruled
# out, only unlikely of an in-place write a task makes.
_PRINT_STRIDES = (7, 13)


def _wide_sum(flat: torch.Tensor, wide: torch.dtype) -> torch.Tensor:
    """`flat`'s sum in `wide`, a chunk at a time: a sum in float64 of a float32 tensor
    converts it whole first, a copy twice its size beside a level1 input of gigabytes
    (helper-70's review, 2026-12-07)."""
    if flat.numel() <= _SUM_CHUNK:
        return flat.sum(dtype=wide)
    return torch.stack([part.sum(dtype=wide) for part in flat.split(_SUM_CHUNK)]).sum()


_SUM_CHUNK = 1 << 24


def _fingerprint(inputs: list[Any]) -> list[str]:
    """What tells an input set changed in place: each tensor's sum and its sums over a few
    strided subsets (views, so no copy is made), accumulated in double precision, as text
    so that NaN equals NaN; other inputs by repr."""
    prints = []
    for x in inputs:
        if not isinstance(x, torch.Tensor):
            prints.append(repr(x))
            continue
        wide = torch.complex128 if x.is_complex() else torch.float64
        try:
            x = x.detach()
            sums = [_wide_sum(x.reshape(-1), wide)]
            if x.is_contiguous() and x.numel() > 1:
                flat = x.view(-1)
                sums += [_wide_sum(flat[start::step], wide)
                         for start, step in enumerate(_PRINT_STRIDES)]
            prints.append(repr(torch.stack(sums).tolist()))  # one sync, not three
        except RuntimeError:  # a layout without a sum (sparse, quantized): taken as kept
            prints.append("")
    return prints


def _copies(inputs: list[Any]) -> list[Any]:
    return [x.clone() if isinstance(x, torch.Tensor) else x for x in inputs]


def _reference_check_inputs(folder: Path, trials: int, device: torch.device
                            ) -> Iterator[tuple[str, list[Any]]]:
    """(outputs file name, inputs) for the reference's forward passes: each check trial's
    set read back from its saved file onto the device only when the last is done with (six
    KernelBench sets of up to 1 GiB each, all on the GPU at once, stayed in a kept
    reference's allocator cache through its task's search)."""
    names = [f"inputs_{trial}" for trial in range(trials)]
    trial = 0  # counted by hand: enumerate's reused result tuple would hold the last set
    for staged in _loaded_one_by_one(folder, names, device, "inputs_to_device"):
        yield f"outputs_{trial}", staged
        del staged  # (held here, this set would live on while the next one loads)
        trial += 1
