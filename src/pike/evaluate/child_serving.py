"""The child's serving loop after its checks: it times blocks of calls, profiles them,
builds and checks compiled modes, counts the task's work, runs the float64 trial and
answers a timed input set's outputs at sampled positions, each as the parent asks, until
the parent says stop.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from pike.evaluate.diagnostics import describe_exception
from pike.evaluate.profile import profile_calls
from pike.evaluate.protocol import Channel, ChildRequest
from pike.evaluate.timed_calls import TimedOutputSamples
from pike.evaluate.timing import time_block, warm_up


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
                  timed_values: Callable[[list[dict[str, Any]]], list[dict[str, Any]]]
                  | None = None,
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
        if msg and msg.get("event") == "timed_values" and timed_values is not None:
            _serve_timed_values(timed_values, msg, chan, device)
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


def _serve_timed_values(timed_values: Callable[[list[dict[str, Any]]], list[dict[str, Any]]],
                        msg: dict, chan: Channel, device: torch.device) -> None:
    try:
        answers = timed_values(list(msg.get("sets") or []))
    except BaseException as exc:  # out of memory, say: the parent cannot check, and says so
        chan.send("timed_values", sets=None, error=describe_exception(exc).splitlines()[0][:300],
                  seq=msg.get("seq"))
        return
    finally:
        if device.type == "cuda":
            torch.cuda.empty_cache()  # the outputs' memory, back to the card
    chan.send("timed_values", sets=answers, seq=msg.get("seq"))


def _serve_work(req: ChildRequest, msg: dict, chan: Channel) -> None:
    """FLOPs and bytes of the task's forward, counted here because task code runs only in
    the reference's child; on the meta device first (no memory), and if that fails where
    the models are built (the CPU, or the device with construct_on 'device'). With
    `without_gpu`, a count that would need the device is not made (`needs_device`): it
    builds a second copy of the model there, which beside a candidate starting at the
    same time took the card's memory the candidate needed (H100, level5's
    14_llama2_decode: out of memory in the candidate's constructor)."""
    from pike.errors import TaskError
    from pike.task import Task
    from pike.work_count import count_work, count_work_cheaply

    on_device = req.construct_on == "device"
    try:
        task = Task.from_file(Path(req.module_path))
        if msg.get("without_gpu") and on_device:
            try:
                work = count_work(task, "meta", req.seed)
            except TaskError as exc:
                chan.send("work", work=None, needs_device=True, seq=msg.get("seq"),
                          error=f"not on the meta device: {exc}"[:300])
                return
        else:
            work = count_work_cheaply(task, req.device if on_device else "cpu", req.seed,
                                      on_device)
    except Exception as exc:  # the count is advisory: report why, never fail the child
        chan.send("work", work=None, error=f"{type(exc).__name__}: {exc}"[:300],
                  seq=msg.get("seq"))
        return
    finally:
        if on_device and torch.cuda.is_available():
            torch.cuda.empty_cache()  # the count's copy of the model, back to the card
    chan.send("work", work=work.model_dump(mode="json"), seq=msg.get("seq"))
