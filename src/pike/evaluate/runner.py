"""What runs inside the child process: load a module, construct it, run trials, time it.

Run as `python -m pike.evaluate.runner REQUEST_JSON WRITE_FD READ_FD`; the request file is
written, and "begin" said on READ_FD, once the parent is ready for the child. The reference role
draws the trial inputs and records the expected outputs; the candidate role never sees the
reference class or its outputs, only the inputs and the constructor arguments.
"""

from __future__ import annotations

import contextlib
import copy
import faulthandler
import functools
import getpass
import hashlib
import importlib.util
import os
import pickle
import platform
import re
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from pike.config import BUILD_ON_DEVICE_BYTES
from pike.evaluate import check, own_rounding
from pike.evaluate.compiled_modes import own_copy, prebuild_mode
from pike.evaluate.device_identity import identity
from pike.evaluate.diagnostics import describe_exception
from pike.evaluate.guards import Guards, rehearse_check_after
from pike.evaluate.leaf_files import read_leaves, write_leaves
from pike.evaluate.outputs_handoff import OutputsSlot
from pike.evaluate.profile import profile_calls
from pike.evaluate.protocol import (
    DESCENDANTS_GRACE_S,
    Channel,
    ChildRequest,
    ShiftSpec,
    timed_set_count,
)
from pike.evaluate.steps import StepClock
from pike.evaluate.timed_calls import (
    InputRotation,
    RehearsedSamples,
    TimedOutputSamples,
    stand_in,
)
from pike.evaluate.timing import time_block, warm_up

_save = torch.save
# The evaluator's own files live for one evaluation in its own folders; a checksum of
# every gigabyte written costs time and protects nothing a candidate could not redo.
if hasattr(torch.serialization, "set_crc32_options"):  # torch 2.5 and later
    torch.serialization.set_crc32_options(False)
_load = torch.load
STEPS = StepClock()  # this child's steps, sent to the parent with its trials' end
_manual_seed = torch.manual_seed
_globals_in = torch.serialization.get_unsafe_globals_in_checkpoint
_safe_globals = torch.serialization.safe_globals
REFERENCE_MODULE = "pike_reference"


class Failure(Exception):
    """Ends the child with a verdict-worthy failure."""

    def __init__(self, status: str, phase: str, message: str) -> None:
        super().__init__(message)
        self.status, self.phase, self.message = status, phase, message


def import_file(path: str, name: str) -> Any:
    """The module at `path`, registered as `name` (pickling and dataclasses need it there)."""
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


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


def trial_seed(seed: int, trial: int) -> int:
    """The seed trial `trial` draws its inputs with (the weights take `seed` itself)."""
    return seed + 1 + trial


def _guarded(status: str, phase: str, path: str, fn: Callable[[], Any]) -> Any:
    try:
        return fn()
    except Failure:
        raise
    except BaseException as exc:  # candidate code may raise anything, SystemExit included
        raise Failure(status, phase, describe_exception(exc, path)) from None


def _to_device(values: list[Any], device: torch.device) -> list[Any]:
    return [v.to(device) if isinstance(v, torch.Tensor) else v for v in values]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def built_on(device: torch.device, construct_on: str) -> contextlib.AbstractContextManager:
    """Where a model's constructor makes its tensors: the device itself, under
    torch.device (construct_on 'device'), or the CPU's defaults, to be moved after."""
    return torch.device(device) if construct_on == "device" else contextlib.nullcontext()


def resolve_construct_on(construct_on: str, cls: Callable[..., Any], init_inputs: list[Any],
                         device: torch.device) -> str:
    """'cpu' or 'device': for 'auto', 'device' where the device is a GPU and the model,
    built first on the meta device (no memory, no arithmetic), holds at least
    BUILD_ON_DEVICE_BYTES; a constructor the meta device cannot run is built on the CPU,
    as KernelBench builds every task."""
    if construct_on != "auto":
        return construct_on
    if device.type == "cpu":
        return "cpu"
    dtype = torch.get_default_dtype()
    try:
        # its own copy of the arguments, and the defaults put back: what this extra run of
        # the constructor changes must not reach the real build (which candidates mirror)
        with torch.device("meta"):
            shell = cls(*copy.deepcopy(init_inputs))
        size = sum(t.numel() * t.element_size() for t in [*shell.parameters(), *shell.buffers()])
    except Exception:  # the constructor reads values; lazy modules (no size yet); no module
        return "cpu"
    finally:
        torch.set_default_dtype(dtype)
    return "device" if size >= BUILD_ON_DEVICE_BYTES else "cpu"


def _build_model(req: ChildRequest, module: Any, init_inputs: list[Any], device: torch.device,
                 status: str) -> torch.nn.Module:
    cls = next((getattr(module, n) for n in req.class_names if hasattr(module, n)), None)
    if cls is None:
        raise Failure(status, "load", f"defines none of {', '.join(req.class_names)}")

    def construct() -> torch.nn.Module:
        _manual_seed(req.seed)
        with built_on(device, req.construct_on):
            model = cls(*init_inputs)
        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"{type(model).__name__} is not a torch.nn.Module")
        model = model.to(device)
        return model.eval() if req.model_mode == "eval" else model

    return _guarded("task_error" if req.role == "reference" else "runtime_error", "init",
                    req.module_path, construct)


def _draw_inputs(module: Any, req: ChildRequest, seed: int,
                 device: torch.device | None = None) -> list[Any]:
    """get_inputs() under `seed`: where a device is given, with it as the default device,
    so a KernelBench task's hundreds of megabytes are drawn by the GPU instead of the host
    (seconds each); a get_inputs() that cannot run there is drawn on the host instead."""
    if device is not None and device.type != "cpu":
        try:
            with torch.device(device):
                return _draw_inputs(module, req, seed)
        except Failure:
            pass
    _manual_seed(seed)
    inputs = _guarded("task_error", "load", req.module_path, module.get_inputs)
    if not isinstance(inputs, (list, tuple)):
        raise Failure("task_error", "load", "get_inputs() must return a list or tuple")
    return list(inputs)


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

    def drawn(name: str, seed: int, shifted: bool = False) -> list[Any]:
        with STEPS.span("draw_inputs"):
            inputs = _draw_inputs(module, req, seed, device)
            if shifted:
                inputs = [_shift_distribution(x, req.shift) for x in inputs]
        with STEPS.span("save_inputs"):  # whoever loads them picks a device
            write_leaves(inputs, inputs_dir / f"{name}.pt")
        return inputs

    # The check trials' inputs are drawn and saved here, then loaded one set at a time for
    # the forward (the bytes every candidate loads); the timed calls' inputs (never seen in
    # the checks) stay on the device for the timing windows.
    for trial, seed in enumerate(req.trial_seeds):
        drawn(f"inputs_{trial}", seed, shifted=trial == req.trials)
    pool = []
    for k, seed in enumerate(req.pool_seeds):
        inputs = drawn(f"pool_{k}", seed)
        with STEPS.span("inputs_to_device"):
            pool.append(_to_device(inputs, device))
        del inputs
    chan.send("phase", phase="init")
    with STEPS.span("build_model"):
        cls = getattr(module, "Model", None)
        if cls is not None:  # (_build_model says what is missing)
            req.construct_on = resolve_construct_on(req.construct_on, cls, list(init_inputs),
                                                    device)  # type: ignore[assignment]
        model = _build_model(req, module, list(init_inputs), device, "task_error")
    chan.send("phase", phase="check")
    outputs_dir = Path(req.outputs_dir)
    for name, inputs in _reference_check_inputs(inputs_dir, len(req.trial_seeds), pool, device):
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
    # that tells a loaded host from forged timings (driver.unaccounted_wall_time), so load
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
        inputs = _draw_inputs(module, req, req.trial_seeds[trial], device)
        if trial == req.trials:
            inputs = [_shift_distribution(x, req.shift) for x in inputs]
        name = f"exact_{trial}.pt"
        write_leaves(own_rounding.exact_forward(model, inputs), Path(name))
        return name

    _serve_timing(req, chan, device, make_call, failed_mode, exact=exact,
                  after_block=lambda mode: rehearse_check_after(),
                  samples_for=lambda mode: calibration if mode == "empty" else own_work,
                  mode_outcome=outcome_and_sharing,
                  forget=lambda mode: compiled.pop(mode, None), prebuild=prebuild)


def _outputs_differ(expected: list[Any], got: list[Any], atol: float, rtol: float,
                    device: torch.device) -> str | None:
    found = next((m for m in check.compare_leaves(expected, got, 0, atol, rtol, device)
                  if m.problem), None)
    return f"output {found.output}: {found.problem}" if found else None


def _copies(inputs: list[Any]) -> list[Any]:
    return [x.clone() if isinstance(x, torch.Tensor) else x for x in inputs]


def _reference_check_inputs(folder: Path, trials: int, pool: list[list[Any]],
                            device: torch.device) -> Iterator[tuple[str, list[Any]]]:
    """(outputs file name, inputs) for the reference's forward passes: each check trial's
    set read back from its saved file onto the device only when the last is done with (six
    KernelBench sets of up to 1 GiB each, all on the GPU at once, stayed in a kept
    reference's allocator cache through its task's search), then the timing pool's."""
    names = [f"inputs_{trial}" for trial in range(trials)]
    trial = 0  # counted by hand: enumerate's reused result tuple would hold the last set
    for staged in _loaded_one_by_one(folder, names, device, "inputs_to_device"):
        yield f"outputs_{trial}", staged
        del staged  # (held here, this set would live on while the next one loads)
        trial += 1
    for k, inputs in enumerate(pool):
        yield f"pool_{k}", inputs


def _loaded_one_by_one(folder: Path, names: list[str], device: torch.device,
                       step: str) -> Iterator[list[Any]]:
    """Each named input set of `folder` read onto the device (timed as `step`) only when
    the caller is done with the last."""
    for name in names:
        with STEPS.span(step):
            loaded = _to_device(read_leaves(folder / f"{name}.pt", trusted=True), device)
        yield loaded
        del loaded  # (held here, the last set would live on while the next one loads)


def _shift_distribution(value: Any, spec: ShiftSpec | None) -> Any:
    if spec is None or not (isinstance(value, torch.Tensor) and value.is_floating_point()):
        return value
    if spec.kind == "affine":
        return value * spec.scale + spec.offset
    noise = torch.rand(value.shape, device=value.device,
                       generator=torch.Generator(value.device).manual_seed(spec.seed))
    # uniform over three times the scale: as wide as the affine shape's bulk, no tails
    return ((noise * 2 - 1) * 3 * spec.scale + spec.offset).to(value.dtype)


def _serve_timing(req: ChildRequest, chan: Channel, device: torch.device,
                  make_call: Callable[[str], Callable[[], Any]],
                  failed_mode: Callable[[str, BaseException, object], None],
                  after_block: Callable[[str], None] = lambda mode: None,
                  final_check: Callable[[], None] = lambda: None,
                  samples_for: Callable[[str], TimedOutputSamples | None] = lambda mode: None,
                  mode_outcome: Callable[[str, float, float], tuple[str, str]] | None = None,
                  forget: Callable[[str], object] = lambda mode: None,
                  prebuild: Callable[[str], None] | None = None,
                  exact: Callable[[int], str] | None = None,
                  ) -> None:
    """Time blocks of calls as the parent asks, one block per request, until it says stop.

    The parent alternates blocks between this child and another one, so that both are
    timed under the same state of the host. A mode that fails its build or its check is
    forgotten (`forget`), so its compiled module is not kept while the others are timed.
    """
    calls: dict[str, Callable[[], Any]] = {}
    while True:
        msg = chan.receive()
        if msg and msg.get("event") == "final":
            final_check()
            chan.send("final_checked", seq=msg.get("seq"))
            continue
        if msg and msg.get("event") == "profile":
            _serve_profile(msg, chan, device, calls, make_call)
            continue
        if msg and msg.get("event") == "work" and req.role == "reference":
            _serve_work(req, msg, chan)
            continue
        if msg and msg.get("event") == "exact" and exact is not None:
            _serve_exact(exact, msg, chan, device)
            continue
        if msg and msg.get("event") == "prebuild" and prebuild is not None:
            try:
                prebuild(str(msg["mode"]))
            except BaseException as exc:  # the mode's own build fails or not, and says why
                chan.send("prebuilt", error=describe_exception(exc).splitlines()[0][:500],
                          seq=msg.get("seq"))
                continue
            chan.send("prebuilt", seq=msg.get("seq"))
            continue
        if msg and msg.get("event") == "stage_timed_inputs":  # before the window: no timing
            mode = str(msg["mode"])
            try:
                calls[mode] = calls.get(mode) or make_call(mode)
            except BaseException as exc:  # the sets did not load (out of memory): as in a block
                failed_mode(mode, exc, msg.get("seq"))  # a candidate's child ends here
                chan.send("timed_inputs_staged", mode=mode, seq=msg.get("seq"),
                          error=describe_exception(exc).splitlines()[0][:500])
                continue
            chan.send("timed_inputs_staged", mode=mode, seq=msg.get("seq"))
            continue
        if msg and msg.get("event") == "prepare":  # build a mode and warm it up, untimed
            mode = str(msg["mode"])
            try:
                calls[mode] = calls.get(mode) or make_call(mode)
                warm_up(calls[mode], device, req.timing)
            except BaseException as exc:  # a torch.compile mode may fail: reported, not raised
                calls.pop(mode, None)
                forget(mode)
                chan.send("prepared", mode=mode, error=describe_exception(exc).splitlines()[0][:500],
                          seq=msg.get("seq"))
                continue
            tolerance = msg.get("check")
            outcome, why = "", ""
            if mode_outcome is not None and isinstance(tolerance, dict):
                try:
                    outcome, why = mode_outcome(mode, float(tolerance["atol"]),
                                                float(tolerance["rtol"]))
                except BaseException as exc:  # a check that cannot run keeps the mode timed
                    outcome, why = "unchecked", "the check could not run: " + \
                        describe_exception(exc).splitlines()[0][:300]
            if outcome == "incorrect":
                calls.pop(mode, None)
                forget(mode)
                chan.send("prepared", mode=mode, error=f"incorrect: {why}"[:500],
                          seq=msg.get("seq"))
                continue
            chan.send("prepared", mode=mode, checked=outcome or None, why=why or None,
                      seq=msg.get("seq"))
            continue
        if not msg or msg.get("event") != "time":
            return
        mode = str(msg["mode"])
        samples_of_outputs = samples_for(mode)
        try:
            if mode not in calls:
                calls[mode] = make_call(mode)
            samples = time_block(calls[mode], device, req.timing, warm_up=bool(msg["warm_up"]),
                                 min_calls=int(msg["min_calls"]),
                                 min_seconds=float(msg["min_seconds"]),
                                 max_calls=int(msg["max_calls"]), after=samples_of_outputs)
        except BaseException as exc:  # candidate code may raise anything
            failed_mode(mode, exc, msg.get("seq"))
            continue
        after_block(mode)
        outputs, probes = samples_of_outputs.take() if samples_of_outputs else (None, None)
        chan.send("timed", mode=mode, samples=samples, outputs=outputs, probe_calls=probes,
                  rehearsed=getattr(samples_of_outputs, "rehearsed", None), seq=msg.get("seq"))


def _serve_profile(msg: dict, chan: Channel, device: torch.device,
                   calls: dict[str, Callable[[], Any]],
                   make_call: Callable[[str], Callable[[], Any]]) -> None:
    mode = str(msg["mode"])
    try:
        if mode not in calls:
            calls[mode] = make_call(mode)
        summary = profile_calls(calls[mode], device, int(msg["calls"]))
    except BaseException as exc:  # a profile informs; its failure must not end the child
        chan.send("profiled", summary=None, error=f"{type(exc).__name__}: {exc}"[:300],
                  seq=msg.get("seq"))
        return
    chan.send("profiled", summary=summary.model_dump(mode="json"), seq=msg.get("seq"))


def _serve_exact(exact: Callable[[int], str], msg: dict, chan: Channel,
                 device: torch.device) -> None:
    try:
        name = exact(int(msg["trial"]))
    except BaseException as exc:  # no float64 run (out of memory, an op without it): said
        chan.send("exact", file=None, error=describe_exception(exc).splitlines()[0][:300],
                  seq=msg.get("seq"))
        return
    finally:
        if device.type == "cuda":
            torch.cuda.empty_cache()  # the float64 copy's memory, back to the card
    chan.send("exact", file=name, seq=msg.get("seq"))


def _serve_work(req: ChildRequest, msg: dict, chan: Channel) -> None:
    """FLOPs and bytes of the task's forward, counted here because task code runs only in
    the reference's child; on the meta device first (no memory), and if that fails where
    the models are built (the CPU, or the device with construct_on 'device')."""
    from pike.floor import count_work_cheaply
    from pike.task import Task

    on_device = req.construct_on == "device"
    try:
        work = count_work_cheaply(Task.from_file(Path(req.module_path)),
                                  req.device if on_device else "cpu", req.seed, on_device)
    except Exception as exc:  # the count is advisory: report why, never fail the child
        chan.send("work", work=None, error=f"{type(exc).__name__}: {exc}"[:300],
                  seq=msg.get("seq"))
        return
    chan.send("work", work=work.model_dump(mode="json"), seq=msg.get("seq"))


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
            sets = _staged_inputs(chan, req, device, "timing", [
                f"pool_{k}" for k in range(timed_set_count(req.input_sets))])
            rotation.sets = sets[:req.input_sets]
            # the class's method, not the instance's attribute: a candidate that reached
            # the Guards in its __init__ could have shadowed it there (shadows_taker)
            rotation.seal_probes(sets[req.input_sets:],
                                 functools.partial(Guards.probe_taker_is_foreign, guards),
                                 guards.violations.append)
            del sets  # nothing but the seal holds the probes now
        # the rotation picks each call's set unarmed, so the seal knows a take from inside
        # a timed call (armed) from its own
        return rotation.caller(armed_call(guards, model))

    def failed(mode: str, exc: BaseException, seq: object) -> None:
        _reject_violations(guards, "timing")
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

    sampler = TimedOutputSamples(rotation) if req.guards else None
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
    _guarded("runtime_error", "check", req.module_path, lambda: _sync(device))
    aliased = check.aliased_outputs(check.tensor_leaves(out), tensors_in)
    if aliased:
        raise Failure("rejected", "check",
                      f"output {aliased[0]} shares memory with an input; return a new tensor")
    changed = check.changed_inputs(pristine, tensors_in)
    if changed:
        raise Failure("rejected", "check",
                      f"input {changed[0]} was modified in place; inputs must stay unchanged")
    odd = [type(t).__name__ for t in check.tensor_leaves(out) if type(t) is not torch.Tensor]
    if odd:
        raise Failure("rejected", "check",
                      f"returns a {odd[0]} (a tensor subclass, which can defer or fake its "
                      "work); return plain torch.Tensor outputs")
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


def _device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return platform.processor() or platform.machine()


def main(argv: list[str]) -> int:
    faulthandler.enable()
    chan = Channel(int(argv[1]), int(argv[2]))
    # Started ahead of its request (the imports above take seconds): the parent writes
    # the request and says "begin" when the reference is ready and the device is held.
    first = chan.receive()
    if first is None or first.get("event") != "begin":
        os._exit(0)  # not needed after all: nothing was loaded, nothing to report
    req = ChildRequest.model_validate_json(Path(argv[0]).read_text())
    if req.extensions_dir:  # known only now to a child started ahead of its candidate
        os.environ["TORCH_EXTENSIONS_DIR"] = req.extensions_dir
    _share_precompiled_headers()
    # Said outright in every child, as the reference's says it before its timed modes:
    # inductor's graph cache keys on how it was set ('ieee' said, 'none' left alone), so a
    # candidate left at 'none' never found the baseline's build (shared_builds). The
    # candidate may change it; its verdict lists the change.
    torch.set_float32_matmul_precision("highest")
    device = torch.device(req.device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    chan.send("env", device_name=_device_name(device), torch_version=torch.__version__,
              host=platform.node(), device_id=identity(str(device)))
    chan.send("phase", phase="load")
    try:
        (run_reference if req.role == "reference" else run_candidate)(req, chan, device)
    except Failure as failure:
        chan.send("failure", status=failure.status, phase=failure.phase, message=failure.message)
    else:
        chan.send("done")
    _stop_compile_workers()
    _wait_for_descendants(DESCENDANTS_GRACE_S)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # skip interpreter teardown: candidate atexit hooks and threads are not ours


def inductor_temp_dir() -> Path:
    """Where inductor keeps what it means to outlive a cache reset (its precompiled
    headers): torchinductor_<user> in the temp dir. Worked out as torch does, since
    importing torch's own function takes 2 s (tests compare the two)."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = f"uid_{os.getuid()}"
    safe = re.sub(r'[\\/:*?"<>|]', "_", user)
    return Path(tempfile.gettempdir()) / f"torchinductor_{safe}"


def _share_precompiled_headers() -> None:
    """Inductor precompiles a C++ header for its CPU kernels and keeps it under the temp
    dir, which is each child's own: every child that compiled for the CPU built the same
    header again (10 s and more). A link from there into inductor's cache in the shared
    build cache lets one build serve every child: no new trust, as that cache is already
    shared (docs/guards.md). Only a saving: nothing fails without it."""
    cache = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if not cache:
        return
    shared, local = Path(cache) / "precompiled_headers", inductor_temp_dir() / "precompiled_headers"
    try:
        shared.mkdir(parents=True, exist_ok=True)
        local.parent.mkdir(parents=True, exist_ok=True)
        if not local.exists():
            local.symlink_to(shared, target_is_directory=True)
    except OSError as err:
        print(f"pike: precompiled headers not shared ({err})", file=sys.stderr)


def _wait_for_descendants(grace_s: float) -> None:
    """Give the processes this child started (inductor's compile workers and their own
    pool, which stop asynchronously after shutdown) a moment to end, so a worker that is
    still exiting is not taken for a process left behind. Nothing is killed here: what
    outlives the grace is the parent's to report and kill."""
    try:
        import psutil

        psutil.wait_procs(psutil.Process().children(recursive=True), timeout=grace_s)
    except Exception:  # best effort: the parent still checks and cleans up
        pass


def _stop_compile_workers() -> None:
    """Inductor's pool of compile workers (eval.compile_threads > 1): the child skips the
    interpreter's teardown, which would otherwise stop it; a worker still running after
    the child would count as a process left behind."""
    if os.environ.get("TORCHINDUCTOR_COMPILE_THREADS", "1") == "1":
        return
    if "torch._inductor.async_compile" not in sys.modules:
        return  # nothing compiled
    try:
        sys.modules["torch._inductor.async_compile"].shutdown_compile_workers()
    except Exception:  # a candidate may have broken it; the parent still kills what is left
        pass


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
