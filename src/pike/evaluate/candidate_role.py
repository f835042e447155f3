"""The candidate's side of the child: it imports the candidate under the guards, builds
its model from the reference's init inputs, runs the check trials on inputs the parent
stages one phase at a time, and serves timing requests; it never sees the reference class
or its outputs.
"""

from __future__ import annotations

import functools
import hashlib
import os
import pickle
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from pike.evaluate import callbacks, check
from pike.evaluate.child_serving import _serve_timing
from pike.evaluate.child_setup import (
    REFERENCE_MODULE,
    STEPS,
    Failure,
    _build_model,
    _guarded,
    _loaded_one_by_one,
    _sync,
    import_file,
)
from pike.evaluate.diagnostics import describe_exception
from pike.evaluate.guards import Guards
from pike.evaluate.leaf_files import write_leaves
from pike.evaluate.outputs_handoff import OutputsSlot
from pike.evaluate.protocol import Channel, ChildRequest, timed_set_count
from pike.evaluate.timed_calls import (
    InputRotation,
    TimedOutputSamples,
    added_or_replaced_kernel,
    left_behind,
)

_load = torch.load
_globals_in = torch.serialization.get_unsafe_globals_in_checkpoint
_safe_globals = torch.serialization.safe_globals


def load_init_inputs(path: Path, candidate: Any) -> list[Any]:
    """The task's init inputs in a candidate's child, which never imports the task.

    Objects of the task's own classes (Level 5's settings dataclasses, say) come back as
    the candidate's classes of the same name, as a candidate written from the task file
    defines them; a candidate without one gets a verdict that names what it lacks.
    """
    names = [n for n in _globals_in(str(path)) if n.startswith(REFERENCE_MODULE + ".")]
    allowed, missing = [], []
    for name in names:
        found: Any = candidate
        for part in name.split(".")[1:]:
            found = getattr(found, part, None)
        if isinstance(found, type):
            allowed.append((found, name))
        else:
            missing.append(name)
    if missing:
        shown = ", ".join(n.split(".", 1)[1] for n in missing)
        raise Failure("runtime_error", "init", f"the task's get_init_inputs() returns objects "
                      f"of its own class {shown}: the candidate must define {shown} too, as "
                      "the task file does")
    try:
        with _safe_globals(allowed):
            return _load(path, weights_only=True)
    except pickle.UnpicklingError as err:  # a nested class, or another module's object
        raise Failure("runtime_error", "init", "the task's init inputs could not be loaded "
                      f"in the candidate's process: {str(err).splitlines()[-1][:300]}"
                      ) from None


def run_candidate(req: ChildRequest, chan: Channel, device: torch.device) -> None:
    guards = Guards(writable=req.writable, enabled=req.guards, module_path=req.module_path)
    guards.install()
    try:
        _run_candidate(req, chan, device, guards)
    except Failure as failure:
        if guards.violations and failure.status != "rejected":
            _reject_violations(guards, failure.phase)  # a refused attempt explains the error
        raise


def _run_candidate(req: ChildRequest, chan: Channel, device: torch.device,
                   guards: Guards) -> None:
    with _armed(guards), STEPS.span("import_candidate"):
        module = _guarded("compile_error", "load", req.module_path,
                          lambda: import_file(req.module_path, "pike_candidate"))
    _reject_violations(guards, "load")
    init_inputs = load_init_inputs(Path(req.inputs_dir) / "init_inputs.pt", module)
    chan.send("phase", phase="init")
    with _armed(guards), STEPS.span("build_model"):
        model = _build_model(req, module, init_inputs, device, "compile_error")
    _reject_violations(guards, "init")
    _reject_reference_code(req, model)
    if req.warm_up:  # the first call of the checks, on the first trial's inputs
        chan.send("phase", phase="check")
        inputs = _staged_inputs(chan, req, device, "warm_up", ["inputs_0"])[0]
        with _armed(guards), STEPS.span("warm_up_call"):
            _run_guarded_call(req, model, inputs, device)
        _reject_violations(guards, "check")
        del inputs
    # The trials wait for the parent's go: it starts their time limit only now, after
    # a wait for the device that may be long.
    chan.send("ready")
    go = chan.receive()
    if not go or go.get("event") != "go":
        return
    chan.send("phase", phase="check")
    slot = OutputsSlot.open(go.get("outputs"), device)  # the parent's GPU buffer, if lent
    names = [f"inputs_{t}" for t in range(req.trials + req.guards)]  # + the shifted one
    for trial, inputs in enumerate(_staged_one_by_one(chan, req, device, "check", names)):
        with _armed(guards), STEPS.span("forward"):
            out = _run_guarded_call(req, model, inputs, device)
        del inputs  # before the next set is loaded
        with STEPS.span("save_outputs"):
            leaves = check.flatten_output(out)
            layout = slot.put(leaves, trial, lambda t: _wait_taken(chan, t)) if slot else None
            if layout is None:  # a file the parent has read and passed on
                write_leaves(leaves, Path(req.outputs_dir) / f"outputs_{trial}.pt",
                             in_place=True)
        del out, leaves
        # the parent compares it while the next one runs
        chan.send("saved", trial=trial, **({"layout": layout} if layout is not None else {}))
    if slot is not None:
        slot.settle(lambda t: _wait_taken(chan, t))
    _reject_violations(guards, "check")
    _reject_reference_code(req, model)
    flags = {k: f"{a} -> {b}" for k, (a, b) in guards.changed_flags().items()}
    chan.send("checked", trials=req.trials, flags=flags, steps=STEPS.rounded())
    rotation = InputRotation([])

    def make_call(mode: str) -> Callable[[], Any]:
        if not rotation.sets:  # the timed inputs reach the child only now
            kernel = added_or_replaced_kernel()
            if kernel is not None:  # it would see the probe sets as they load
                raise Failure("rejected", "timing", f"the candidate tried to add or replace "
                              f"kernels of {kernel}: a kernel of its own would see the timing's "
                              "inputs as they load. Candidates may only compute their outputs.")
            # the probes sit in this frame until sealed: no collector callback or
            # finalizer may run meanwhile (callbacks.py)
            with callbacks.no_collection():
                sets = _staged_inputs(chan, req, device, "timing", [
                    f"pool_{k}" for k in range(timed_set_count(req.input_sets))])
                rotation.sets = sets[:req.input_sets]
                # the class's method, not the instance's attribute: a candidate that
                # reached the Guards in its __init__ could have shadowed it there
                # (shadows_taker)
                rotation.seal_probes(sets[req.input_sets:],
                                     functools.partial(Guards.probe_taker_is_foreign, guards),
                                     guards.violations.append)
                del sets  # nothing but the seal holds the probes now
        # the rotation picks each call's set unarmed, so the seal knows a take from inside
        # a timed call (armed) from its own
        return rotation.caller(armed_call(guards, model))

    def failed(mode: str, exc: BaseException, seq: object) -> None:
        _reject_violations(guards, "timing")
        if isinstance(exc, Failure):  # the evaluator's own verdict (a kernel before staging)
            raise exc
        raise Failure("runtime_error", "timing", describe_exception(exc, req.module_path))

    def final_check() -> None:
        # New values in the same tensors that were timed: same pointers, shapes, dtypes.
        final = _staged_inputs(chan, req, device, "final", [f"inputs_{req.trials + 1}"])[0]
        if rotation.sets:  # timed: into the tensors of the first timed set
            for dst, src in zip(rotation.sets[0], final, strict=True):
                if isinstance(dst, torch.Tensor):
                    dst.copy_(src)
            final = rotation.sets[0]
        with _armed(guards):
            out = _run_guarded_call(req, model, final, device)
        write_leaves(check.flatten_output(out), Path(req.outputs_dir) / "outputs_final.pt",
                     in_place=True)
        _reject_violations(guards, "final check")

    sampler = TimedOutputSamples(rotation, guards.violations.append) if req.guards else None
    _serve_timing(req, chan, device, make_call, failed,
                  after_block=lambda mode: _reject_violations(guards, "timing"),
                  final_check=final_check, samples_for=lambda mode: sampler)


def _wait_taken(chan: Channel, trial: int) -> None:
    reply = chan.receive()
    if not reply or reply.get("event") != "taken" or reply.get("trial") != trial:
        raise Failure("crashed", "check", "the evaluator did not take the trial's outputs")


def _staged_inputs(chan: Channel, req: ChildRequest, device: torch.device, phase: str,
                   names: list[str]) -> list[list[Any]]:
    """Input sets the parent puts within the child's reach only when this phase starts
    (it refuses a phase asked for out of turn), so none can be read ahead."""
    return list(_staged_one_by_one(chan, req, device, phase, names))


def _staged_one_by_one(chan: Channel, req: ChildRequest, device: torch.device, phase: str,
                       names: list[str]) -> Iterator[list[Any]]:
    """As _staged_inputs, each set loaded onto the device only when the last is done with:
    a KernelBench task's trials are up to 1 GiB each, and six of them held at once made
    each check hold 9 to 10 GiB of an H200 beside 16 others (out of memory)."""
    with STEPS.span("wait_for_stage"):
        chan.send("stage", phase=phase)
        reply = chan.receive()
    if not reply or reply.get("event") != "staged" or reply.get("phase") != phase:
        raise Failure("crashed", "timing" if phase == "timing" else "check",
                      f"the evaluator did not stage the {phase} inputs")
    yield from _loaded_one_by_one(Path(req.inputs_dir), names, device, "load_inputs")


class _armed:
    """Guards watch candidate code only; the evaluator's own file I/O runs unwatched."""

    def __init__(self, guards: Guards) -> None:
        self.guards = guards

    def __enter__(self) -> None:
        self.guards.armed = True

    def __exit__(self, *exc: object) -> None:
        self.guards.armed = False


def armed_call(guards: Guards, fn: Callable[..., Any]) -> Callable[..., Any]:
    def call(*args: Any) -> Any:
        guards.armed = True
        try:
            return fn(*args)
        finally:
            guards.armed = False

    return call


def _reject_violations(guards: Guards, phase: str) -> None:
    guards.check_after(phase)
    if guards.violations:
        raise Failure("rejected", phase, "the candidate tried " + "; ".join(guards.violations[:5])
                      + ". Candidates may only compute their outputs.")


def _run_guarded_call(req: ChildRequest, model: torch.nn.Module, inputs: list[Any],
                      device: torch.device) -> Any:
    tensors_in = [x for x in inputs if isinstance(x, torch.Tensor)]
    pristine = [x.clone() for x in tensors_in]
    with torch.no_grad():
        out = _guarded("runtime_error", "check", req.module_path, lambda: model(*inputs))
    left = left_behind(out, "its call")
    if left is not None:
        raise Failure("rejected", "check", f"the candidate tried {left}; return plain "
                      "torch.Tensor outputs (in lists, tuples or dicts) and leave no torch "
                      "mode or kernel of its own behind")
    _guarded("runtime_error", "check", req.module_path, lambda: _sync(device))
    aliased = check.aliased_outputs(check.tensor_leaves(out), tensors_in)
    if aliased:
        raise Failure("rejected", "check",
                      f"output {aliased[0]} shares memory with an input; return a new tensor")
    changed = check.changed_inputs(pristine, tensors_in)
    if changed:
        raise Failure("rejected", "check",
                      f"input {changed[0]} was modified in place; inputs must stay unchanged")
    return out


def _code_files(model: torch.nn.Module) -> set[str]:
    """Files that hold code the model runs: its classes' methods and every loaded module."""
    files = {getattr(m, "__file__", None) or "" for m in list(sys.modules.values())}
    for sub in model.modules():
        for cls in type(sub).__mro__:
            for attr in vars(cls).values():
                code = getattr(attr, "__code__", None)
                if code is not None:
                    files.add(code.co_filename)
    return files


def _reject_reference_code(req: ChildRequest, model: torch.nn.Module) -> None:
    """The reference module must not be reachable from candidate code, even by file path."""
    for path in _code_files(model):
        if not path or path == req.module_path or not os.path.isfile(path):
            continue
        if os.path.getsize(path) != req.task_size:
            continue  # cheap filter: hashing every loaded module would cost a second
        digest = hashlib.sha256(Path(path).read_bytes()).hexdigest()
        if digest == req.task_sha256:
            raise Failure("rejected", "load",
                          f"runs code from the reference task file ({Path(path).name}); "
                          "write the model itself")
