"""Baselines of a task: eager and torch.compile modes, timed under the evaluator's protocol."""

from __future__ import annotations

import datetime as dt
import logging
import time
from collections.abc import Callable

from pydantic import BaseModel, Field

from pike.config import COMPILE_MODES, EvalConfig, RunConfig
from pike.errors import TaskError
from pike.evaluate.cores import build_cores
from pike.evaluate.driver import Timer
from pike.evaluate.judge import (  # the wait: a baseline's second pass waits as a reference's
    _OUT_OF_MEMORY_WAIT_S,
    ModeFailed,
    ReferenceRun,
    as_eval_config,
    resolve_device,
    run_reference,
    time_reference_modes,
)
from pike.evaluate.pool import one_line
from pike.evaluate.shared_builds import share_reference_builds
from pike.evaluate.verdict import TimingStats, says_out_of_memory
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


def measure_baselines(task: Task, config: EvalConfig | RunConfig | None = None,
                      modes: list[str] | None = None,
                      on_event: Callable[..., None] | None = None,
                      stopped: Callable[[], bool] | None = None) -> Baseline:
    """Time the reference in each mode; a mode that fails to compile is reported, not raised.
    on_event("mode_built", mode=, build_s=, error=) as each mode is built, before the
    timed window; on_event("prebuild_failed", mode=, error=) where an autotuning mode's
    pre-build took the child down (it is built again alone). `stopped`: whether the caller
    has been stopped; a mode failing then raises BaselineStopped instead of being recorded
    as failed or built again. On a GPU, a baseline where a mode ran out of memory (the
    device's, which other evaluations may hold) is measured once more, whole."""
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
                                              no_prebuild)
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
                               no_prebuild, carried=own_failures)
    except TaskError as err:
        log.warning("%s: the baseline's second pass failed (%s); the first stands",
                    task.name, one_line(err))
        return first
    failures = sum(1 for r in again[0] if r.error)
    return again if failures < sum(1 for r in first[0] if r.error) else first


def _measure_modes(task: Task, cfg: EvalConfig, device: str, modes: list[str],
                   on_event: Callable[..., None] | None, was_stopped: _StopCheck,
                   no_prebuild: set[str], carried: dict[str, ModeTiming] | None = None
                   ) -> _Pass:
    """Every mode's timing (or failure) in `modes`' order, the reference run they were
    measured in (closed) and the task's work. `carried`: failures of an earlier pass,
    kept without building those modes again; `no_prebuild` is added to as pre-builds
    take children down."""
    # A compile mode that takes the child down (a max-autotune build past the phase's
    # limit, a crash) fails alone: the others are measured again in a new child without it.
    # Eager failing is the reference failing (TaskError).
    failed: dict[str, ModeTiming] = dict(carried or {})
    again = carried is not None  # a second pass: its builds are shown as such
    while True:
        reference = run_reference(task, cfg, device, keep_child=True, cache=False)
        try:
            work = reference.work()
            timers = time_reference_modes(task, reference,
                                          [m for m in modes if m not in failed], cfg, device,
                                          _built_reporter(on_event,
                                                          again=again or bool(failed or no_prebuild),
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
