"""`bench()`: one strategy over many tasks, unattended, in one run store.

Each task gets its own budget (the ledger is per task), its baselines (eager and each
torch.compile mode) measured once and kept in the store, and its own search, which starts
once its own baselines are in. On GPUs, other tasks' baselines go on meanwhile: their
builds and timed windows hold the device alone where they measure, which stops the
searches' candidates, and a search's budget leaves that stopped time out. On the CPU,
where nothing holds the device alone, every baseline is measured before any search
starts, so no search runs in a baseline's timings. `jobs` tasks search at once: the
evaluator's device lock keeps timing alone on each GPU, and LLM calls are I/O. Every step
is in the store before it counts, so a campaign killed at any point resumes where it
stopped: finished tasks are skipped, a task cut off mid-search continues with the calls
and verdicts it already has.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Callable
from contextlib import closing
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from pike.config import RunConfig
from pike.errors import ConfigError, TaskError
from pike.evaluate import device_holds, host_memory, measure_baselines
from pike.evaluate.baseline import BaselineStopped, baseline_gaps, stopped_meanwhile
from pike.evaluate.device_slots import DeviceSlots
from pike.evaluate.judge import resolve_device
from pike.evaluate.leftovers import remove_tree
from pike.evaluate.pool import Lane, Pool, make_pool, one_line
from pike.evaluate.reference_cache import keep_references, release_reference, run_reference
from pike.evaluate.reference_failure import ReferenceOutOfMemory, failed_for_memory
from pike.search import drain
from pike.search.failed_modes import resumable_baselines
from pike.search.session import (
    OptimizeResult,
    new_run_dir,
    search_task,
    show_what_was_kept,
    stored_tasks,
    summary_row,
    task_result,
)
from pike.solution_set import write_set
from pike.store import BASELINE_STATE, DONE_STATE, ERROR_STATE, FOOTPRINT_STATE, RunStore
from pike.task import Task, load_tasks, tasks_to_redo
from pike.threads import InOrder, run_each, unwinding_stop

log = logging.getLogger(__name__)



class TaskOutcome(BaseModel):
    task: str
    result: OptimizeResult | None = None
    error: str | None = None


class CampaignResult(BaseModel):
    run_dir: Path
    outcomes: list[TaskOutcome]
    # tasks the time limit (stop_after) left unfinished, for --resume
    open_tasks: list[str] = []


def bench(folder: Path | None, config: RunConfig | None = None, *,
          ids: list[int] | None = None, out: Path | None = None, resume: Path | None = None,
          jobs: int = 1, command: str = "", placement: dict[str, Any] | None = None,
          redo: list[int] | None = None, fill_baselines: bool = False,
          stop_after: float | None = None,
          on_event: Callable[..., None] = lambda kind, **data: None) -> CampaignResult:
    """Run the configured strategy over the tasks of `folder` (or continue `resume`, with
    `placement` fields of pool.PLACEMENT over its recorded config). With `resume`: the
    tasks of ids `redo` run again from the start (what they had is dropped), and with
    `fill_baselines` finished tasks whose baselines lack a mode or have a failed one are
    measured again. After `stop_after` seconds nothing new starts (search/drain.py): the
    result's `open_tasks` are those left for --resume."""
    if (redo or fill_baselines) and resume is None:
        raise ConfigError("--redo and --fill-baselines act on a campaign: give --resume RUN_DIR")
    if resume is not None:
        store = RunStore.open(resume)
        cfg = RunConfig.model_validate(store.config())
        tasks = stored_tasks(store)
        try:
            _forget(store, tasks, redo or [], on_event)
            _reopen_memory_failures(store, tasks, on_event)
        except BaseException:
            store.close()
            raise
    else:
        if folder is None:
            raise ConfigError("give a task folder to bench (or --resume RUN_DIR)")
        cfg = config or RunConfig()
        tasks = load_tasks(folder, ids)
        run_dir = out or new_run_dir(cfg.runs_dir, f"bench-{Path(folder).name}")
        store = RunStore.create(run_dir, cfg.model_dump(mode="json"), command)
        for task in tasks:
            store.add_task(task.name, str(task.path), task.sha256, task.source)
    if placement:
        cfg.eval = cfg.eval.model_copy(update=placement)
    try:
        if resume is not None:
            show_what_was_kept(store, tasks, on_event)
        # what held the device alone, for bench/search_time.py: most of a bench's wall
        # time beyond its searches' budgets
        with drain.stop_after(stop_after), \
                device_holds.recording(store.path.parent / device_holds.LEDGER_NAME):
            _recall_footprints(store, tasks)
            try:
                outcomes = _run_all(store, tasks, cfg, max(1, jobs), on_event, fill_baselines)
            except KeyboardInterrupt:
                # A Ctrl-C (or SIGTERM) ends the call: its summary and solutions are those of
                # the store as it stands, not an earlier call's left in place (on the H200
                # level2 bench, the third call's cut left the second call's summary.json)
                try:
                    _write_outputs(store, _outcomes_so_far(store, tasks))
                except Exception as err:  # noqa: BLE001 - the interrupt is what to report
                    log.warning("the run's summary was not written: %s", one_line(err))
                raise
        _write_outputs(store, outcomes)
        open_tasks = [t.name for t in tasks if not store.get_state(t.name, DONE_STATE)]
        return CampaignResult(run_dir=store.path.parent, outcomes=outcomes,
                              open_tasks=open_tasks)
    finally:
        store.close()


def _forget(store: RunStore, tasks: list[Task], redo: list[int],
            on_event: Callable[..., None]) -> None:
    """Drop what the tasks of ids `redo` recorded, so they run again from the start; a
    redo cut off goes on with the next --resume, as any task not done does."""
    for task in tasks_to_redo(tasks, redo, "campaign"):
        gone = store.forget_task(task.name)
        log.info("%s: run again; dropped %d candidates and %d LLM calls", task.name,
                 gone["candidates"], gone["llm_calls"])
        on_event("task_phase", task=task.name, phase="redo")


def _reopen_memory_failures(store: RunStore, tasks: list[Task],
                            on_event: Callable[..., None]) -> None:
    """Tasks that failed because their reference was ended by memory (other tasks'
    children held it, before pike deferred such tasks, or in the campaign's last pass)
    go on with this resume, from what they had judged: the failure was not the task's."""
    for task in tasks:
        error = store.get_state(task.name, ERROR_STATE)
        if isinstance(error, str) and failed_for_memory(error):
            store.clear_state(task.name, ERROR_STATE, DONE_STATE)
            log.info("%s: failed for memory before (%s); it goes on", task.name,
                     error.splitlines()[0][-160:])
            on_event("task_phase", task=task.name, phase="redo")


def _run_all(store: RunStore, tasks: list[Task], cfg: RunConfig, jobs: int,
             on_event: Callable[..., None], fill_baselines: bool = False) -> list[TaskOutcome]:
    outcomes: dict[str, TaskOutcome] = {}
    # One evaluation pool for all tasks, `eval.workers` evaluations per task at once: each
    # task's search gets its own lane of that width, so a task's time budget never runs
    # while its candidates wait behind another task's.
    # (A Ray cluster's actors keep their own `eval.workers` each.)
    width = cfg.eval.workers
    total = width * jobs if cfg.eval.cluster == "local" else width
    # Ctrl-C or a host-level error: queued tasks do not start; what ran is in the store
    # for --resume.
    unmeasured = {t.name for t in tasks if store.get_state(t.name, DONE_STATE) is None
                  and store.get_state(t.name, BASELINE_STATE) is None}
    # With several GPUs, each task's baselines are measured on one of them, all GPUs at
    # once (on one GPU, each task's max-autotune build and timing hold it alone in turn).
    gpus = DeviceSlots(cfg, jobs, beside_others=True)  # the searches, on GPUs
    # each slot goes to the waiting task first in the list (a task begun in a call before
    # comes before those it would have come before then)
    rank = {t.name: i for i, t in enumerate(tasks)}
    measuring, searching = InOrder(gpus.at_once), InOrder(jobs)

    def measure(task: Task, beside_searches: bool = False) -> bool:
        with _Slot(measuring, rank[task.name]), gpus.take() as on_gpu:
            return _measure_baseline(store, task, on_gpu, on_event, beside_searches)

    if not gpus.locked:  # the CPU: every baseline before any search
        for _ in run_each(measure, [t for t in tasks if t.name in unmeasured],
                          gpus.at_once, "pike-baseline", stop=_stop_the_others):
            pass
        unmeasured.clear()

    ahead = jobs + (gpus.at_once if unmeasured else 0)
    # tasks begun and not yet past their search: measuring, waiting for a slot, searching
    begun = InOrder(ahead)

    def one(task: Task, lane: Lane, beside_searches: bool = True) -> TaskOutcome | None:
        # A task's search waits for its own baselines only. Threads beyond `jobs` measure
        # the next tasks' baselines meanwhile, at most `at_once` ahead of the searches.
        # A task whose search starts nothing more (its offline budget spent, or its last
        # candidate judged) leaves both counts for its last candidates and its confirming
        # window, so up to `jobs` more threads finish and confirm beside the searches: a
        # lane of the next task's search may run beside a finishing one's last
        # candidates, more than jobs x workers evaluations at once for those minutes.
        # None: its reference ran out of memory beside the searches, for its baselines or
        # its search (tried again later).
        done = bool(store.get_state(task.name, DONE_STATE))
        if done and not fill_baselines:
            # Done in a call before: nothing to measure, search or make a reference for.
            # Through the slots, on the H200 level2 bench each resumed call made a
            # reference ahead for every done task (inputs and outputs of hundreds of MB,
            # in a cache of live references the searches need), and two done tasks waited
            # five minutes for a search slot, holding places of tasks still to measure.
            return _one_task(store, task, cfg, lane, on_event)
        with _Slot(begun, rank[task.name]) as pending:
            if task.name in unmeasured and not measure(task, beside_searches):
                return None
            if gpus.locked and not done:  # a done one's baselines filled need none
                _reference_ahead(task, cfg)
            with _Slot(searching, rank[task.name]) as slot:
                def searched() -> None:
                    slot.free()
                    pending.free()
                return _one_task(store, task, cfg, lane, on_event,
                                 gpus if fill_baselines else None, beside_searches, searched)

    threads = ahead + jobs
    # A live reference child for every task begun (measured and waiting for a search
    # slot, searching, confirming): with the cache at jobs + 1 once the confirming windows
    # ran beside the searches, the H200 level2 bench closed idle references of tasks
    # between their baselines and their searches, and their first candidates waited for
    # the reference to be made again (2,300 s of the candidates' evaluation in all).
    keep_references(threads + 1)
    with closing(make_pool(cfg.search_eval().model_copy(update={"workers": total}))) as pool:
        for outcome in run_each(lambda t: one(t, Lane(pool, width)), tasks, threads,
                                "pike-bench", stop=_stop_the_others):
            if outcome is not None:
                outcomes[outcome.task] = outcome
        # once the searches have ended, with only each other beside them, as before
        later = [t for t in tasks if t.name not in outcomes]
        for outcome in run_each(lambda t: one(t, Lane(pool, width), beside_searches=False),
                                later, 2 * jobs, "pike-bench", stop=_stop_the_others):
            assert outcome is not None
            outcomes[outcome.task] = outcome
    return [outcomes[t.name] for t in tasks]


def _reference_ahead(task: Task, cfg: RunConfig) -> None:
    """The reference run the task's search will judge against (its inputs, expected
    outputs and live child), made in the background while the task waits for a search
    slot, and kept in the evaluator's cache (a child per task begun, keep_references).
    The baselines' own reference child loads the compile modes and is not cached; without
    this, each search's first candidates waited for one (8 to 25 s, once 87 s, on the H200
    level2 bench), their lanes idle. One GPU only (with several, each candidate's device
    is picked when it starts); a failure here is left for the search to meet and report."""
    search = cfg.search_eval()
    if search.cluster != "local" or len(search.devices) > 1 or drain.due():
        return

    def make() -> None:
        try:
            device = resolve_device(search.device)
            release_reference(run_reference(task, search, device,
                                            keep_child=search.time_candidate))
        except BaseException as err:  # noqa: BLE001 - the search makes it again and
            # says what fails; pike ending (Ctrl-C) ends this thread quietly
            log.info("%s: its reference, made ahead, failed (%s)", task.name, one_line(err))

    threading.Thread(target=make, name="pike-reference-ahead", daemon=True).start()


def _stop_the_others(err: BaseException) -> None:
    """One task's error ends the campaign: the others start nothing more and are waited
    for, so that the evaluations they are in are recorded for --resume."""
    if not isinstance(err, KeyboardInterrupt):
        log.warning("the campaign ends (%s): the other tasks start nothing more and finish "
                    "the evaluations they are in (Ctrl-C stops them at once)", one_line(err))
    drain.halt(interrupted=unwinding_stop())  # called as run_each unwinds `err`


class _Slot:
    """A search slot of the campaign (`--jobs`), held from the task's search start until
    it starts nothing more (`free`), or until it ends. Its confirming window, about a
    minute of loading, checking and timing its top candidates again outside the pool (66
    to 75 s a task on the H200 level2 wave), and an offline search's last candidates once
    its budget is spent (compile builds of up to four minutes, beside lanes standing
    empty: 8 to 11 of 16 lanes busy on average on the H200 level2 bench) no longer keep
    the next task's search from starting. That window holds the device alone as every
    timing does."""

    def __init__(self, slots: InOrder, rank: int) -> None:
        self._slots, self._rank, self._held = slots, rank, False
        self._lock = threading.Lock()

    def __enter__(self) -> _Slot:
        self._slots.acquire(self._rank)
        self._held = True
        return self

    def free(self) -> None:
        with self._lock:
            if self._held:
                self._held = False
                self._slots.release()

    def __exit__(self, *exc: object) -> None:
        self.free()


def _one_task(store: RunStore, task: Task, cfg: RunConfig, evaluations: Pool,
              on_event: Callable[..., None], fill_on: DeviceSlots | None = None,
              beside_others: bool = False, searched: Callable[[], None] = lambda: None
              ) -> TaskOutcome | None:
    """The task's search; `fill_on`: the slots a finished task's missing baselines are
    measured again in (--fill-baselines), as the first ones were. None where its
    reference ran out of memory (twice) `beside_others`: the other tasks' children held
    it, and the search goes on once they have ended, as a baseline's does. `searched`:
    called when the search starts nothing more (search_task)."""
    def event(kind: str, **data: Any) -> None:
        on_event(kind, task=task.name, **data)

    done = store.get_state(task.name, DONE_STATE)
    if done and fill_on is not None and not store.get_state(task.name, ERROR_STATE) \
            and not drain.due():
        old = store.get_state(task.name, BASELINE_STATE)
        with fill_on.take(old.get("device") if isinstance(old, dict) else None) as on_gpu:
            _fill_baseline(store, task, on_gpu, event)
    if done:
        error = store.get_state(task.name, ERROR_STATE)
        event("task_done", resumed=True, **({"error": str(error)} if error else {}))
        return TaskOutcome(task=task.name, result=task_result(store, task.name), error=error)
    if drain.due():
        return _left_open(store, task, event)
    try:
        event("task_phase", phase="search")
        try:
            result = search_task(store, task, cfg, None, event, evaluations, searched=searched)
        finally:
            _keep_footprint(store, task)
    except ReferenceOutOfMemory as err:
        if not beside_others:
            return _failed(store, task, err, event)
        log.warning("%s: %s; its search goes on once the searches beside it have ended",
                    task.name, one_line(err))
        event("task_phase", phase="waiting")
        return None
    except TaskError as err:  # the task's reference fails: report it, go on with the rest
        return _failed(store, task, err, event)
    if result.stopped:  # the time limit cut its search, or came before its confirming window
        return _left_open(store, task, event)
    # Other errors (no GPU, a bad seed set) are the host's or the user's: they end the
    # campaign with their message, and the task stays open for --resume.
    store.set_state(task.name, DONE_STATE, True)
    event("task_done", result=result)
    return TaskOutcome(task=task.name, result=result)


def _measure_baseline(store: RunStore, task: Task, cfg: RunConfig,
                      on_event: Callable[..., None], beside_searches: bool = False) -> bool:
    """The task's baselines, stored; a task whose reference fails here is done, with its
    error (the search would fail the same way). False, nothing stored, where the reference
    ran out of GPU memory `beside_searches`: the searches' children held it, and the task
    is measured again once they end."""
    def event(kind: str, **data: Any) -> None:
        on_event(kind, task=task.name, **data)

    if drain.due():
        return True  # its search sees the drain too, and leaves the task open

    event("task_phase", phase="baseline")
    try:
        baseline = measure_baselines(task, cfg, cfg.search.baseline_modes,
                                     **resumable_baselines(store, task, event))
    except BaselineStopped:
        return True  # left open: --resume measures it (but the modes that failed)
    except ReferenceOutOfMemory as err:
        if not beside_searches:
            _failed(store, task, err, event)
            return True
        log.warning("%s: %s; its baselines are measured again once the searches beside "
                    "them have ended", task.name, one_line(err))
        event("task_phase", phase="waiting")
        return False
    except TaskError as err:
        if not stopped_meanwhile(drain.interrupted):  # else the stop took its reference down
            _failed(store, task, err, event)
        return True
    store.set_state(task.name, BASELINE_STATE, baseline.model_dump(mode="json"))
    _keep_footprint(store, task)
    event("task_phase", phase="waiting")  # for a search slot
    return True


_FOOTPRINT_ROLES = ("reference", "candidate")  # what host_memory tells apart
_STRUCTURAL = "task_bytes"  # beside them: the task's own bytes a reference holds


def _keep_footprint(store: RunStore, task: Task) -> None:
    """What the task's children took on the host, kept for a resumed run's gate: a level1
    bench spans device calls, and in each new call every task not yet measured there was
    expected at the largest size measured (a 3 GiB task waited behind a 63 GiB one)."""
    sizes = {role: n for role in _FOOTPRINT_ROLES
             if (n := host_memory.HOST.measured(task.sha256, role))}
    if sizes and (structural := host_memory.HOST.structural(task.sha256)) is not None:
        sizes[_STRUCTURAL] = structural  # what a new task is guessed from (task_size)
    if sizes:
        store.set_state(task.name, FOOTPRINT_STATE, sizes)


def _recall_footprints(store: RunStore, tasks: list[Task]) -> None:
    for task in tasks:
        kept = store.get_state(task.name, FOOTPRINT_STATE)
        if isinstance(kept, dict):
            for role, taken in kept.items():
                if role in _FOOTPRINT_ROLES and isinstance(taken, int) and taken > 0:
                    host_memory.HOST.remember(task.sha256, role, taken)
            structural = kept.get(_STRUCTURAL)
            if isinstance(structural, int) and not isinstance(structural, bool) \
                    and structural >= 0:
                host_memory.HOST.sized(task.sha256, structural)


def _left_open(store: RunStore, task: Task, event: Callable[..., None]) -> TaskOutcome:
    """A task the time limit stopped: what it has is kept, and --resume finishes it."""
    event("task_phase", phase="stopped")
    return TaskOutcome(task=task.name, result=task_result(store, task.name))


def _failed(store: RunStore, task: Task, err: TaskError,
            event: Callable[..., None]) -> TaskOutcome:
    log.warning("%s: %s", task.name, err)
    store.set_state(task.name, ERROR_STATE, str(err))
    store.set_state(task.name, DONE_STATE, True)
    event("task_done", error=str(err))
    return TaskOutcome(task=task.name, result=task_result(store, task.name), error=str(err))


def _fill_baseline(store: RunStore, task: Task, cfg: RunConfig,
                   event: Callable[..., None]) -> None:
    """Measure a finished task's baselines again where a mode is missing or failed (a
    compile that timed out beside other tasks' work, say). All modes are measured again,
    in one window with eager, since each speedup is over that window's eager; the stored
    baseline is replaced only where the new one fills a gap the old one had."""
    modes = cfg.search.baseline_modes
    old = store.get_state(task.name, BASELINE_STATE)
    gaps = baseline_gaps(old, modes)
    if not gaps:
        return
    event("task_phase", phase="baseline")
    try:
        fresh = measure_baselines(task, cfg, modes, on_event=event,
                                  stopped=drain.interrupted).model_dump(mode="json")
    except BaselineStopped:
        return
    except TaskError as err:  # the reference failed this time: the old baseline stays
        log.warning("%s: baselines not measured again: %s", task.name, err)
        return
    if len(baseline_gaps(fresh, modes)) < len(gaps):
        store.set_state(task.name, BASELINE_STATE, fresh)
    else:
        log.warning("%s: measured again, the baselines still lack %s", task.name,
                    ", ".join(gaps))


def _outcomes_so_far(store: RunStore, tasks: list[Task]) -> list[TaskOutcome]:
    return [TaskOutcome(task=t.name, result=task_result(store, t.name),
                        error=store.get_state(t.name, ERROR_STATE)) for t in tasks]


def _write_outputs(store: RunStore, outcomes: list[TaskOutcome]) -> None:
    run_dir = store.path.parent
    best_dir = run_dir / "best"
    best_dir.mkdir(exist_ok=True)
    rows = []
    for outcome in outcomes:
        # whether the task is finished: a call cut off or stopped leaves some open, and
        # their figures are a search's so far, not its result
        done = bool(store.get_state(outcome.task, DONE_STATE))
        if outcome.result is None:
            rows.append({"task": outcome.task, "error": outcome.error, "done": done})
            continue
        if outcome.result.best_source is not None:
            (best_dir / f"{outcome.task}.py").write_text(outcome.result.best_source)
        rows.append({**summary_row(store, outcome.result), "done": done})
    (run_dir / "summary.json").write_text(json.dumps({"tasks": rows}, indent=2))
    _write_solutions(store, run_dir / SOLUTIONS)


# The campaign's best files as a solution set (`pike export --set`'s format, manifest and
# all), so `pike audit RUN/solutions FOLDER` re-judges exactly what its figures came from.
SOLUTIONS = "solutions"


def _write_solutions(store: RunStore, target: Path) -> None:
    """Write the set beside, then swap it in: a resumed campaign replaces the set it wrote
    before, and a crash mid-write leaves the old one whole."""
    fresh = target.with_name(f".{target.name}-{os.getpid()}")
    old = target.with_name(f".{target.name}-old-{os.getpid()}")
    for leftover in (fresh, old):  # of an earlier pike of the same pid, cut off here
        if leftover.exists():
            remove_tree(leftover)
    write_set(store, fresh)
    if target.exists():
        target.rename(old)
    fresh.rename(target)
    if old.exists():
        remove_tree(old)
