"""Baselines of a task: eager and torch.compile modes, timed under the evaluator's protocol."""

from __future__ import annotations

import datetime as dt
import logging
import time
from collections.abc import Callable, Collection

from pydantic import BaseModel, Field

from pike.config import COMPILE_MODES, EvalConfig, RunConfig, autotunes
from pike.errors import TaskError
from pike.evaluate import device_holds
from pike.evaluate.cores import build_cores, timing_cores
from pike.evaluate.device_lock import hold
from pike.evaluate.driver import request
from pike.evaluate.judge import as_eval_config, resolve_device
from pike.evaluate.pool import one_line
from pike.evaluate.reference import ReferenceRun
from pike.evaluate.reference_cache import (  # the wait: a baseline's second pass waits as a reference's
    _OUT_OF_MEMORY_WAIT_S,
    run_reference,
)
from pike.evaluate.reference_failure import reference_failed
from pike.evaluate.reference_start import beside_others, pid_of
from pike.evaluate.shared_builds import share_reference_builds
from pike.evaluate.timing_window import Timer, time_interleaved
from pike.evaluate.verdict import TimingStats, Verdict, says_out_of_memory
from pike.floor import Floor, Work, floor, no_floor_reason
from pike.task import Task

log = logging.getLogger(__name__)

BASELINE_MODES = ["eager", *(f"compile:{m}" for m in COMPILE_MODES)]
# How long a failed mode waits to see whether the caller was stopped: Ctrl-C reaches the
# children and the caller's threads at once, and the failure can come first.
_STOP_GRACE_S = 1.0
# A folder's time and this process's clock may disagree by a file system's tick: builds
# share from folders changed up to this long before the baseline began.
_CLOCK_SLACK_S = 5.0


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
    with beside_others(reference.child, device, cfg.device_lock), reference.talking:
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
            with timing_cores([pid_of(reference.child)], device, cfg.timing_cores):
                time_interleaved(timers, cfg.timing, stop_at_failure=True)
            reference.child.enter_phase("idle")
    broken = next((t for t in timers if t.failure), None)
    if broken is not None:
        reference.close()
        if broken.mode != "eager":
            raise ModeFailed(task, broken)
        raise reference_failed(task, broken.failure, device)
    return timers


class ModeFailed(TaskError):
    """A torch.compile mode took the reference's child down (its build ran past the phase's
    limit, crashed or ran out of memory): the mode failed, not necessarily the reference."""

    def __init__(self, task: Task, timer: Timer) -> None:
        super().__init__(str(reference_failed(task, timer.failure)))
        assert timer.failure is not None
        self.mode = timer.mode
        self.build_s = timer.build_s
        self.prebuild_s = timer.prebuild_s
        self.in_prebuild = timer.prebuild_failed
        first_line = (timer.failure.message or "no message").strip().splitlines() or [""]
        self.reason = f"{timer.failure.status} in phase '{timer.failure.phase}': {first_line[0]}"


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


class BaselineStopped(Exception):
    """The caller was interrupted (Ctrl-C, or a SIGTERM as one) while a mode failed: the
    failure may be that stop killing its child, so nothing of this baseline is a result."""


class ModeTiming(BaseModel):
    mode: str
    stats: TimingStats | None = None
    error: str | None = None
    speedup_vs_eager: float | None = None
    build_s: float | None = Field(None, description="building and warming the mode up before "
                                  "its timing (a torch.compile mode's compile and autotuning, "
                                  "and its check against eager)")
    prebuild_s: float | None = Field(None, description="of build_s, a first build of an "
                                     "autotuning mode beside other evaluations "
                                     "(eval.prebuild_autotune); the rest held the device alone")
    checked: bool | None = Field(None, description="a compile mode's outputs were compared "
                                 "with eager's on the check trials and matched (a mode that "
                                 "did not is an error); False: it could not be checked "
                                 "(check_note); None: eager, or measured before the check")
    check_note: str | None = Field(None, description="why a mode could not be checked, and "
                                   "where it shares eager's module instead of its own copy "
                                   "(too big, or not copyable), that it does")


class Baseline(BaseModel):
    """How fast the unchanged task runs in each mode, measured in one run on one host."""

    task: str
    task_path: str
    task_sha256: str
    device: str
    device_name: str
    device_id: str = Field("", description="the physical device (a CUDA UUID, a CPU host's "
                           "boot id; device_identity): '' where unknown or measured before "
                           "pike recorded it")
    torch_version: str
    host: str
    date: str
    modes: list[ModeTiming]
    work: Work | None = None
    floor: Floor | None = None
    no_floor: str | None = Field(None, description="why there is no floor (CPU, unknown GPU)")

    def eager_ms(self) -> float | None:
        """Eager's median time, where eager was timed."""
        return next((m.stats.median_ms for m in self.modes if m.mode == "eager" and m.stats),
                    None)


def measure_baselines(task: Task, config: EvalConfig | RunConfig | None = None,
                      modes: list[str] | None = None,
                      on_event: Callable[..., None] | None = None,
                      stopped: Callable[[], bool] | None = None,
                      failed_before: dict[str, ModeTiming] | None = None) -> Baseline:
    """Time the reference in each mode; a mode that fails to compile is reported, not raised.
    on_event("mode_built", mode=, build_s=, error=) as each mode is built, before the
    timed window; on_event("prebuild_failed", mode=, error=) where an autotuning mode's
    pre-build took the child down (it is built again alone). `stopped`: whether the caller
    has been stopped; a mode failing then raises BaselineStopped instead of being recorded
    as failed or built again. On a GPU, a baseline where a mode ran out of memory (the
    device's, which other evaluations may hold) is measured once more, whole.
    `failed_before`: modes that failed in an earlier call of the same run (a build past
    its limit), kept failed and not built again: a resumed audit of a task whose modes
    each take minutes to fail would otherwise start over in every call and never end."""
    cfg = as_eval_config(config)
    device = resolve_device(cfg.device)
    modes = modes or BASELINE_MODES
    began = time.time()
    if device.startswith("cuda") and any(m.startswith("compile:") for m in modes):
        # The modes compile while the device is held alone, so no other evaluation's
        # build runs meanwhile: this child may have every build core for its compile
        # workers (at one, max-autotune's compile held the GPU for minutes).
        cfg = cfg.model_copy(update={"compile_threads": max(
            cfg.compile_threads, build_cores(device, cfg.timing_cores))})
    was_stopped = _StopCheck(stopped)
    no_prebuild: set[str] = set()  # autotuning modes whose pre-build took a child down
    results, reference, work = _measure_modes(task, cfg, device, modes, on_event, was_stopped,
                                              no_prebuild, carried=failed_before)
    short = [r.mode for r in results if says_out_of_memory(r.error)]
    if device.startswith("cuda") and short:
        results, reference, work = _measured_again(task, cfg, device, modes, on_event,
                                                   stopped, no_prebuild,
                                                   (results, reference, work), short)
        was_stopped = _StopCheck(stopped)
    if any(r.error for r in results) and was_stopped():
        raise BaselineStopped(f"{task.name}: stopped while its modes were measured")
    if any(r.mode.startswith("compile:") and not r.error for r in results):
        try:  # a candidate of the same graph loads them; only a saving, so never fatal
            share_reference_builds(cfg, since=began - _CLOCK_SLACK_S)
        except Exception as err:  # noqa: BLE001 - whatever a candidate left in its cache
            log.warning("%s: the baseline's builds were not shared with the candidates (%s)",
                        task.name, one_line(str(err)))
    eager = next((r.stats for r in results if r.mode == "eager" and r.stats), None)
    for r in results:
        if eager and r.stats:
            r.speedup_vs_eager = eager.median_ms / r.stats.median_ms
    device_name = reference.env.get("device_name", "")
    floor_name = device_name if device.startswith("cuda") else "cpu"
    return Baseline(
        task=task.name, task_path=str(task.path), task_sha256=task.sha256, device=device,
        device_name=device_name, device_id=reference.env.get("device_id", ""),
        torch_version=reference.env.get("torch_version", ""), host=reference.env.get("host", ""),
        date=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), modes=results,
        work=work, floor=floor(work, floor_name) if work else None,
        no_floor=(no_floor_reason(work, floor_name) if work else "the FLOPs could not be counted"),
    )


_Pass = tuple[list[ModeTiming], ReferenceRun, Work | None]


def _measured_again(task: Task, cfg: EvalConfig, device: str, modes: list[str],
                    on_event: Callable[..., None] | None,
                    stopped: Callable[[], bool] | None, no_prebuild: set[str],
                    first: _Pass, short: list[str]) -> _Pass:
    """A baseline where `short` modes ran out of GPU memory, measured once more, whole
    (every mode beside the same eager), after a wait: the GPU is shared with other
    evaluations (a campaign's searches, an audit's other tasks), whose memory a mode's
    build or window may find taken. On an H200 level1 bench a reduce-overhead mode failed
    so in 0.5 s beside four searches. The modes that failed otherwise keep their failure
    unbuilt; the second pass is kept only where it fails fewer modes, and where it cannot
    run at all (its reference out of memory too) the first stands."""
    if stopped_meanwhile(stopped, _OUT_OF_MEMORY_WAIT_S):
        raise BaselineStopped(f"{task.name}: stopped while its modes were measured")
    log.warning("%s: baseline %s ran out of GPU memory; its modes are measured once more",
                task.name, ", ".join(short))
    own_failures = {r.mode: r for r in first[0] if r.error and r.mode not in short}
    try:
        again = _measure_modes(task, cfg, device, modes, on_event, _StopCheck(stopped),
                               no_prebuild, carried=own_failures, again=True)
    except TaskError as err:
        log.warning("%s: the baseline's second pass failed (%s); the first stands",
                    task.name, one_line(err))
        return first
    failures = sum(1 for r in again[0] if r.error)
    return again if failures < sum(1 for r in first[0] if r.error) else first


def _measure_modes(task: Task, cfg: EvalConfig, device: str, modes: list[str],
                   on_event: Callable[..., None] | None, was_stopped: _StopCheck,
                   no_prebuild: set[str], carried: dict[str, ModeTiming] | None = None,
                   again: bool = False) -> _Pass:
    """Every mode's timing (or failure) in `modes`' order, the reference run they were
    measured in (closed) and the task's work. `carried`: failures of an earlier pass or
    call, kept without building those modes again; `again`: this is a second pass (its
    builds are shown as such); `no_prebuild` is added to as pre-builds take children
    down."""
    # A compile mode that takes the child down (a max-autotune build past the phase's
    # limit, a crash) fails alone: the others are measured again in a new child without it.
    # Eager failing is the reference failing (TaskError).
    failed: dict[str, ModeTiming] = {m: t for m, t in (carried or {}).items() if m in modes}
    carried_modes = set(failed)  # failed before this pass: its builds are no repeats
    while True:
        reference = run_reference(task, cfg, device, keep_child=True, cache=False)
        try:
            work = reference.work()
            timers = time_reference_modes(task, reference,
                                          [m for m in modes if m not in failed], cfg, device,
                                          _built_reporter(on_event,
                                                          again=again or bool(
                                                              set(failed) - carried_modes
                                                              or no_prebuild),
                                                          stopped=was_stopped),
                                          no_prebuild=no_prebuild)
            break
        except ModeFailed as err:
            if was_stopped():
                raise BaselineStopped(f"{task.name}: stopped while building {err.mode}") from err
            if err.in_prebuild and err.mode not in no_prebuild:
                if on_event is not None:  # said as the builds are: only where asked
                    on_event("prebuild_failed", mode=err.mode, error=err.reason)
                no_prebuild.add(err.mode)
                continue
            failed[err.mode] = ModeTiming(mode=err.mode, error=err.reason,
                                          build_s=_rounded(err.build_s),
                                          prebuild_s=_rounded(err.prebuild_s))
        finally:
            reference.close()
    timed = {t.mode: ModeTiming(mode=t.mode, stats=TimingStats.from_samples(t.samples),
                                build_s=_rounded(t.build_s), prebuild_s=_rounded(t.prebuild_s),
                                checked=t.checked, check_note=t.check_note)
             if t.samples and not t.error else
             ModeTiming(mode=t.mode, error=t.error or "failed", build_s=_rounded(t.build_s),
                        prebuild_s=_rounded(t.prebuild_s))
             for t in timers}
    results = [timed.get(m) or failed[m] for m in modes]
    return results, reference, work


def baseline_gaps(baseline: object, modes: list[str]) -> list[str]:
    """The modes of `modes` a stored baseline (its JSON) lacks or failed in (all of them
    if none): what `pike bench --fill-baselines` and `pike audit --fill-baselines`
    measure again."""
    if not isinstance(baseline, dict):
        return list(modes)
    measured = {m.get("mode"): m for m in baseline.get("modes", [])}
    return [m for m in modes if m not in measured or measured[m].get("error")
            or not measured[m].get("stats")]


def stopped_meanwhile(stopped: Callable[[], bool] | None,
                      seconds: float | None = None) -> bool:
    """Whether the caller has been stopped, or is within a moment (or `seconds`): asked
    where something failed, which the stop may have caused, and to wait before trying
    again."""
    if stopped is None:
        time.sleep(seconds or 0)
        return False
    deadline = time.monotonic() + (_STOP_GRACE_S if seconds is None else seconds)
    while not stopped():
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)
    return True


class _StopCheck:
    """`stopped_meanwhile` for one baseline: its moment's wait is spent once, at its first
    failure (a stop comes within a moment of the kill it causes, not minutes after); later
    failures ask at once. So a baseline with genuinely failing modes waits one moment, not
    one per mode."""

    def __init__(self, stopped: Callable[[], bool] | None) -> None:
        self._stopped, self._waited = stopped, False

    def __call__(self) -> bool:
        if self._stopped is None:
            return False
        if self._waited:
            return self._stopped()
        self._waited = True
        return stopped_meanwhile(self._stopped)


def _built_reporter(on_event: Callable[..., None] | None, again: bool,
                    stopped: Callable[[], bool] | None = None
                    ) -> Callable[[Timer], None] | None:
    """`again`: a new child builds the modes once more, after one took the last one down."""
    if on_event is None:
        return None

    def report(timer: Timer) -> None:
        if _why(timer) is not None and stopped is not None and stopped():
            return  # the stop's doing, most likely: not a failure to show
        on_event("mode_built", mode=timer.mode, build_s=timer.build_s, error=_why(timer),
                 again=again, prebuild_s=timer.prebuild_s)
    return report


def _why(timer: Timer) -> str | None:
    """A failed mode's reason in one line, never empty; None where it built."""
    if timer.failure is None and timer.error is None:
        return None
    text = (timer.error or (timer.failure.message if timer.failure else "") or "").strip()
    status = timer.failure.status if timer.failure is not None else "error"
    return text.splitlines()[0] if text else status


def _rounded(seconds: float | None) -> float | None:
    return round(seconds, 3) if seconds is not None else None
