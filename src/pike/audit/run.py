"""`audit()`: re-judge a folder of solutions against a folder of tasks, from scratch.

Every file goes through `evaluate` with the full guards, whatever the config says; every
task's baselines (eager and each torch.compile mode of `search.baseline_modes`) are
measured once. All of it lands in a run store at `out` like any pike run: candidates with
role "audit" and the file name as idea, task states "baseline", "missing", "error" and
"done", so `pike report` and `pike show` read it. `audit.json` (the AuditResult) and
`audit.md` (to_markdown) are written beside the store. An audit cut off (Ctrl-C, a
device call's time limit) goes on with `resume(run_dir)`: what it asked is in the store,
and every verdict already recorded is kept, with the baseline of its call; a baseline
whose file was not judged is kept only on the card that timed it (device_identity).
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, NamedTuple

import torch

from pike.agents.offline import named_in
from pike.audit.markdown import to_markdown
from pike.audit.matching import Matching, match
from pike.audit.precision import detect_precision
from pike.audit.result import AuditResult, TaskAudit, aggregate, relative, task_audit
from pike.config import BUILD_ON_DEVICE_BYTES, RunConfig
from pike.errors import ConfigError, TaskError
from pike.evaluate import Baseline, Verdict, evaluate, measure_baselines
from pike.evaluate.baseline import BaselineStopped, baseline_gaps, stopped_meanwhile
from pike.evaluate.device_identity import probe
from pike.evaluate.device_slots import DeviceSlots
from pike.evaluate.judge import resolve_device
from pike.evaluate.reference_cache import close_idle_references, keep_references
from pike.report.data import geomean
from pike.search import drain
from pike.search.failed_modes import resumable_baselines
from pike.solution_set import SolutionSet
from pike.store import (
    BASELINE_STATE,
    DONE_STATE,
    ERROR_STATE,
    MISSING_STATE,
    RunStore,
)
from pike.task import Task, load_tasks, tasks_to_redo
from pike.threads import run_each

log = logging.getLogger(__name__)

ROLE = "audit"
# What the audit was asked, kept in the store's state under the run's own (empty) name.
RUN_STATE, ASKED_STATE = "", "audit"
RESULT_JSON = "audit.json"
RESULT_MARKDOWN = "audit.md"
# in the audit's asked state: its tasks are its set's own (tasks_of_the_set), as a resume
# and a redo take them too
SET_TASKS = "set_tasks"


def _no_event(kind: str, **data: Any) -> None:
    pass


def resume(run_dir: Path, *, workers: int | None = None, devices: list[str] | None = None,
           stop_after: float | None = None, on_event: Callable[..., None] = _no_event,
           redo: list[int] | None = None, fill_baselines: bool = False) -> AuditResult:
    """Go on with the audit in `run_dir`, as it was asked; `workers` and the GPUs to spread
    tasks over (`devices`: the next call may hold another number of them) may change.
    The tasks of ids `redo`, and with `fill_baselines` every finished task whose baselines
    lack a mode or failed in one, are audited again from the start (reopen)."""
    asked, config, command = recorded_audit(run_dir, workers, devices)
    if redo or fill_baselines:
        reopen(Path(run_dir), asked, config, redo or [], fill_baselines, on_event)
    return audit(Path(asked["solutions"]), Path(asked["tasks"]), config, out=Path(run_dir),
                 ids=asked.get("ids"), command=command,
                 allow_changed_tasks=bool(asked.get("allow_changed_tasks")),
                 stop_after=stop_after, on_event=on_event, _resumed=True,
                 # an audit begun before sets were audited over their own tasks took the
                 # whole folder: it goes on so
                 set_tasks=bool(asked.get(SET_TASKS)))


def reopen(run_dir: Path, asked: dict[str, Any], cfg: RunConfig, redo: list[int],
           fill_baselines: bool, on_event: Callable[..., None] = _no_event) -> list[str]:
    """Drop what the tasks of ids `redo` recorded (their file's verdict, their baselines,
    done or error), and with `fill_baselines` what every finished task recorded whose
    baselines lack a mode of `search.baseline_modes` or failed in one (a compile that
    timed out beside other work): the resumed audit measures and judges them again. The
    file is judged again with its baselines, as a task's figures come from one card and
    one call. A reopen cut off goes on with the next resume, as any task not done does.
    Returns the tasks reopened."""
    tasks = audited_tasks(Path(asked["solutions"]), Path(asked["tasks"]), asked.get("ids"),
                          bool(asked.get(SET_TASKS))).tasks
    again = [t.name for t in tasks_to_redo(tasks, redo, "audit")]
    with RunStore.open(run_dir) as store:
        if fill_baselines:
            modes = cfg.search.baseline_modes
            again += [t.name for t in tasks if t.name not in again
                      and store.get_state(t.name, DONE_STATE)
                      and (kept := store.get_state(t.name, BASELINE_STATE)) is not None
                      and baseline_gaps(kept, modes)]
        for name in again:
            gone = store.forget_task(name)
            log.info("%s: audited again; dropped %d verdicts", name, gone["candidates"])
            on_event("task_phase", task=name, phase="redo")
    return again


def resumed_config(run_dir: Path, workers: int | None = None,
                   devices: list[str] | None = None) -> RunConfig:
    """The config a resumed audit will run with (to check its GPUs before any work)."""
    return recorded_audit(run_dir, workers, devices)[1]


def recorded_audit(run_dir: Path, workers: int | None,
                   devices: list[str] | None) -> tuple[dict[str, Any], RunConfig, str]:
    with RunStore.open(Path(run_dir)) as store:  # no run there: a StoreError says so
        asked = store.get_state(RUN_STATE, ASKED_STATE)
        config, command = RunConfig.model_validate(store.config()), store.command()
    if not isinstance(asked, dict):
        raise ConfigError(f"{run_dir} is not an audit run (it records no audit)")
    if workers is not None:
        config.eval.workers = workers
    if devices is not None:  # for this call: the next one goes back to the recorded GPUs
        config.eval.devices = devices
    return asked, config, command


def audit(solutions: Path, tasks: Path, config: RunConfig | None = None, *, out: Path,
          ids: list[int] | None = None, command: str = "", allow_changed_tasks: bool = False,
          stop_after: float | None = None, on_event: Callable[..., None] = _no_event,
          _resumed: bool = False, set_tasks: bool | None = None) -> AuditResult:
    """Judge each solution file of `solutions` against its task in the folder `tasks`.

    Refuses (TaskError) when a solution set's manifest recorded another version of a task
    file, unless allow_changed_tasks, which audits anyway and marks those tasks.
    With several GPUs in `eval.devices`, tasks are spread over them: each task's baselines
    and file are measured on one GPU, the least busy when the task starts, and at least one
    task runs per GPU. After `stop_after` seconds no task starts new work (a device
    session's limit): the tasks in flight finish, the others are the result's
    `open_tasks`, for `resume`. A pike set is audited over its own tasks where `ids` is
    None (tasks_of_the_set); `set_tasks` says so for a resumed audit, as it was recorded.
    on_event(kind, task=..., **data) is called with "task_phase" (phase "baseline" or
    "evaluate") and "task_done" (audit=TaskAudit).
    """
    solutions, tasks_dir = Path(solutions), Path(tasks)
    cfg, warnings = _audit_config(config or RunConfig())
    gpus = DeviceSlots(cfg, cfg.eval.workers)
    warnings += [f"{line}: each task's baselines and file are measured on one of them"
                 for line in gpus.note("tasks")]
    task_list, matching, notes, set_tasks = audited_tasks(solutions, tasks_dir, ids, set_tasks)
    warnings += matching.notes + notes
    changed = changed_tasks(matching, task_list)
    if changed and not allow_changed_tasks:
        raise TaskError(f"{', '.join(changed)}: the task file differs from the one the solution "
                        "set was judged on (sha256 in its manifest); audit with the set's task "
                        "files, or allow changed tasks to audit anyway")
    warnings += [f"{name}: the task file differs from the one in the set's manifest"
                 for name in changed]
    if matching.solution_set is not None:
        warnings += [f"{name}: changed since the set's manifest was written; its claimed "
                     "numbers are for another file"
                     for name in matching.solution_set.modified_files(solutions)]
    if ids is None:
        warnings += [f"{name}: matches no task; not audited"
                     for name in matching.unmatched(solutions)]
    if _resumed:
        store = RunStore.open(out)
        warnings.append("resumed: the baselines and verdicts of earlier calls are kept")
    else:
        store = RunStore.create(out, cfg.model_dump(mode="json"), command)
        store.set_state(RUN_STATE, ASKED_STATE, {
            "solutions": str(solutions.resolve()), "tasks": str(tasks_dir.resolve()),
            "ids": ids, "allow_changed_tasks": allow_changed_tasks, SET_TASKS: set_tasks})
    baselines: dict[str, Baseline] = {}
    finished: dict[int, TaskAudit] = {}
    finishing = threading.Lock()
    cards: dict[str | None, str] = {}  # filled in below, before any task starts

    def one(index: int, task: Task) -> None:
        event = _task_events(on_event, task.name)
        base = task_base(task, matching, solutions, changed)
        with gpus.take(_card_that_measured(store, task, cards)) as task_cfg:
            try:
                done = _audit_task(store, task, matching.files[task.name], base, index,
                                   task_cfg, baselines, event, cards)
            finally:  # no file of this task is judged again: its GPU memory is the next's
                close_idle_references(of=task)
        if done is None:  # the time limit came first: left for --resume
            return
        with finishing:
            finished[index] = done
            store.set_state(task.name, DONE_STATE, True)  # as `pike bench` marks it
            if len(finished) < len(task_list):  # a long audit cut off keeps what it judged
                partial = [f"partial: {len(finished)} of {len(task_list)} tasks audited so far"]
                write_result(audit_result(
                    solutions, tasks_dir, store.path.parent, matching,
                    [finished[i] for i in sorted(finished)], baselines, cfg, warnings + partial))
            event("task_done", audit=done)

    try:
        known = {t["name"] for t in store.tasks()}
        for task in task_list:
            if task.name not in known:
                store.add_task(task.name, str(task.path), task.sha256, task.source)
        if _resumed:  # which physical card each device of this call is, asked once before
            # any task starts (a probe starts CUDA in a process of its own: never beside a
            # task's timed window)
            cards.update(_cards_now(store, cfg, gpus.devices))
        with drain.stop_after(stop_after):
            _each_task(one, task_list, gpus.at_once)
        run_dir = store.path.parent
    finally:
        store.close()
    audits = [finished[i] for i in sorted(finished)]
    left = [t.name for i, t in enumerate(task_list) if i not in finished]
    if left:
        warnings = [*warnings, f"partial: {len(audits)} of {len(task_list)} tasks audited so "
                    f"far; stopped at the time limit, the rest with --resume"]
    result = audit_result(solutions, tasks_dir, run_dir, matching, audits, baselines, cfg,
                          warnings)
    result.open_tasks = left
    write_result(result)
    return result


def _each_task(one: Callable[[int, Task], None], tasks: list[Task], workers: int) -> None:
    """`one` for every task; with several workers, tasks at once (their baselines and
    files still take the GPU alone to be timed: the device lock)."""
    if workers <= 1:
        for index, task in enumerate(tasks):
            one(index, task)
        return
    keep_references(workers + 1)
    for _ in run_each(lambda item: one(*item), list(enumerate(tasks)), workers, "pike-audit"):
        pass


def write_result(result: AuditResult) -> None:
    """audit.json and audit.md, each whole or not at all: a Ctrl-C ends pike at once, and
    a worker thread may be writing them then."""
    run_dir = Path(result.run_dir)
    for name, text in ((RESULT_JSON, result.model_dump_json(indent=2) + "\n"),
                       (RESULT_MARKDOWN, to_markdown(result))):
        part = run_dir / f".{name}.part"
        part.write_text(text)
        part.replace(run_dir / name)


def _task_events(on_event: Callable[..., None], task: str) -> Callable[..., None]:
    def event(kind: str, **data: Any) -> None:
        on_event(kind, task=task, **data)

    return event


def _audit_config(config: RunConfig) -> tuple[RunConfig, list[str]]:
    """The guards are part of the audit: a config that turns them off is overridden."""
    if config.eval.guards:
        return config, []
    fixed = config.model_copy(update={"eval": config.eval.model_copy(update={"guards": True})})
    return fixed, ["eval.guards was off in the config; an audit always runs the guards"]


class AuditedTasks(NamedTuple):
    tasks: list[Task]
    matching: Matching
    notes: list[str]  # what tasks_of_the_set said of the tasks left or missing
    set_tasks: bool  # the list is the set's own tasks (SET_TASKS)


def audited_tasks(solutions: Path, tasks_dir: Path, ids: list[int] | None,
                  set_tasks: bool | None = None) -> AuditedTasks:
    """The tasks an audit of `solutions` against `tasks_dir` takes, with its matching: the
    tasks of `ids`, or of the folder; of those, a pike set's own where `set_tasks` says
    so (None, for a new audit: wherever no `ids` were given). A missing folder or a bad
    mapping fails here, before any work."""
    tasks = load_tasks(tasks_dir, ids)
    matching = match(solutions, tasks)
    if set_tasks is None:
        set_tasks = ids is None and matching.solution_set is not None
    notes: list[str] = []
    if set_tasks and matching.solution_set is not None:
        tasks, notes = tasks_of_the_set(tasks, matching.solution_set)
    return AuditedTasks(tasks, matching, notes, set_tasks)


def tasks_of_the_set(tasks: list[Task], found: SolutionSet) -> tuple[list[Task], list[str]]:
    """Without --tasks, a solution set is audited over its own tasks: its manifest lists
    every task of the run it came from, solved or not, so this leaves none of them out,
    and a set of 20 tasks of a folder of 89 gets its figure over those 20 rather than 69
    more counted 1.0x (and their baselines' device time)."""
    named = {e.task for e in found.tasks}
    kept = [t for t in tasks if t.name in named]
    absent = sorted(named - {t.name for t in kept})
    notes = [f"{name}: in the set's manifest, but no such task in the task folder; not "
             "audited" for name in absent]
    if not kept:
        return tasks, notes
    if len(kept) < len(tasks):
        notes.append(f"the set's {len(kept)} tasks audited, of the task folder's "
                     f"{len(tasks)} (--tasks audits others)")
    return kept, notes


def changed_tasks(matching: Matching, tasks: list[Task]) -> list[str]:
    if matching.solution_set is None:
        return []
    changed = []
    for task in tasks:
        entry = matching.solution_set.entry(task.name)
        if entry is not None and entry.task_sha256 != task.sha256:
            changed.append(task.name)
    return changed


def task_base(task: Task, matching: Matching, solutions: Path, changed: list[str]) -> TaskAudit:
    file = matching.files[task.name]
    entry = matching.solution_set.entry(task.name) if matching.solution_set else None
    return TaskAudit(task=task.name, task_id=task.id, status="missing",
                     file=relative(file, solutions) if file is not None else None,
                     claimed_speedup=entry.speedup_vs_eager if entry else None,
                     task_changed=task.name in changed,
                     # why the set has no file: no correct candidate, or a slower one
                     message=entry.detail if entry and not entry.file else "")


def _audit_task(store: RunStore, task: Task, file: Path | None, base: TaskAudit, index: int,
                cfg: RunConfig, baselines: dict[str, Baseline],
                event: Callable[..., None], cards: dict[str | None, str]) -> TaskAudit | None:
    # A task with nothing to judge counts 1.0x whatever its baselines: skip timing them.
    if file is None:
        store.set_state(task.name, MISSING_STATE, True)
        return base.model_copy(update={"message": base.message or "no solution file"})
    try:
        source = file.read_text()
    except (OSError, UnicodeDecodeError) as err:
        store.set_state(task.name, MISSING_STATE, True)
        return base.model_copy(update={"message": f"cannot read {file.name}: {err}"})
    recorded_error = store.get_state(task.name, ERROR_STATE)
    if recorded_error is not None:  # an earlier call of this audit found the reference broken
        return base.model_copy(update={"status": "error", "message": str(recorded_error)})
    # What an earlier call of this audit recorded for this very file is kept.
    recorded = next((r for r in store.candidates(task.name)
                     if r.role == ROLE and r.source == source), None)
    judged = recorded is not None and recorded.verdict is not None
    if not judged and drain.due():  # new work after the time limit: none
        return None
    try:
        # A task's figures come from one card: a baseline whose file was not judged in its
        # call is kept only where this call measures the task on that very card.
        baseline = _kept_baseline(store, task, cards.get(cfg.eval.device, ""), judged)
        if baseline is not None:
            if not judged:
                event("baseline_kept", device_id=baseline.device_id)
        else:
            event("task_phase", phase="baseline")
            baseline = measure_baselines(task, cfg, cfg.search.baseline_modes,
                                         **resumable_baselines(store, task, event))
            store.set_state(task.name, BASELINE_STATE, baseline.model_dump(mode="json"))
        baselines[task.name] = baseline
        candidate_id = recorded.id if recorded is not None else store.add_candidate(
            task.name, source, parent_id=None, role=ROLE, round=0, branch=index,
            idea=file.name)
        if judged:
            assert recorded is not None and recorded.verdict is not None
            verdict = recorded.verdict
        else:
            event("task_phase", phase="evaluate")
            verdict = evaluate(task, source, cfg)
            if not verdict.ok and stopped_meanwhile(drain.interrupted):
                return None  # Ctrl-C killed its child, most likely: judged again on resume
    except BaselineStopped:  # Ctrl-C during its baselines: measured again on resume
        return None
    except TaskError as err:  # the reference itself fails: nothing to judge against
        if stopped_meanwhile(drain.interrupted):  # Ctrl-C took the reference down, most likely
            return None
        log.warning("%s: %s", task.name, err)
        store.set_state(task.name, ERROR_STATE, str(err))
        return base.model_copy(update={"status": "error", "message": str(err)})
    store.set_verdict(candidate_id, verdict)
    return judged_audit(base, task, source, candidate_id, verdict, baseline)


def _kept_baseline(store: RunStore, task: Task, card: str, judged: bool) -> Baseline | None:
    """The baseline an earlier call recorded for `task`, where it still stands: its file was
    judged in that call, or this call measures on the card that timed it (`card`: its
    identity, '' where unknown), with the same torch: a held machine resumed, whose every
    build and failed mode would otherwise be done again."""
    kept = store.get_state(task.name, BASELINE_STATE)
    if kept is None:
        return None
    baseline = Baseline.model_validate(kept)
    if judged:
        return baseline
    same = (baseline.task_sha256 == task.sha256 and baseline.device_id != ""
            and baseline.device_id == card and baseline.torch_version == torch.__version__)
    return baseline if same else None


def _card_that_measured(store: RunStore, task: Task, cards: dict[str | None, str]
                        ) -> str | None:
    """The device of this call behind the card that timed `task`'s stored baseline, if
    any: given that GPU, the task keeps its baseline instead of measuring it again."""
    kept = store.get_state(task.name, BASELINE_STATE)
    card = kept.get("device_id") if isinstance(kept, dict) else None
    return next((d for d, c in cards.items() if card and c == card), None)


def _cards_now(store: RunStore, cfg: RunConfig, devices: list[str]) -> dict[str | None, str]:
    """Each device a task of this call may get (as its config names it) -> the identity of
    the card behind it now; probed only where a stored baseline waits for its file's
    verdict (a task cut off between the two)."""
    waiting = any(store.get_state(row["name"], BASELINE_STATE) is not None
                  and not store.get_state(row["name"], DONE_STATE) for row in store.tasks())
    if not waiting:
        return {}
    named: list[str | None] = list(devices) or [cfg.eval.device]
    resolved = [resolve_device(device) for device in named]  # a missing one fails first
    with ThreadPoolExecutor(len(named), thread_name_prefix="pike-probe") as probes:
        # at once: a probe stuck in the driver waits out its limit, not one per GPU
        return dict(zip(named, probes.map(probe, resolved), strict=True))


def judged_audit(base: TaskAudit, task: Task, source: str, candidate_id: int,
                 verdict: Verdict, baseline: Baseline) -> TaskAudit:
    """A task's audit from its file's verdict and the baselines of the same card."""
    precision = detect_precision(source, task.source, verdict)
    done = task_audit(base.model_copy(update={"precision": precision}), verdict, baseline)
    done.candidate_id = candidate_id
    done.built_on = verdict.built_on
    done.transformations = named_in(source)
    return done


def measuring_cards(baselines: list[Baseline]) -> list[str]:
    """The physical cards that timed `baselines`, each named by its model and, where its
    identity is known, the start of it: two H100s of one model are two cards (a resumed
    audit on a fresh machine), which the name alone would hide."""
    cards = {b.device_id or b.device_name: b.device_name for b in baselines
             if b.device_id or b.device_name}
    return sorted(f"{name} ({key[:12]})" if key != name else name
                  for key, name in cards.items())


def audit_result(solutions: Path, tasks_dir: Path, run_dir: Path, matching: Matching,
            audits: list[TaskAudit], baselines: dict[str, Baseline], cfg: RunConfig,
            warnings: list[str]) -> AuditResult:
    env = _environment(list(baselines.values()))
    cards = measuring_cards(list(baselines.values()))
    if len(cards) > 1:  # a resumed audit whose calls ran on different cards
        warnings = [*warnings, f"tasks were measured on {len(cards)} devices: "
                    f"{', '.join(cards)}; each task's figures come from one of them"]
    gpus = {b.device for b in baselines.values() if b.device}
    if len(gpus) > 1 and not any("spread over" in w for w in warnings):
        warnings = [*warnings, f"tasks were measured on {len(gpus)} GPUs (a call spread "
                    "them, calls ran on different GPUs, or runs were gathered); each task's "
                    "figures come from one of them"]
    warnings = [*warnings, *_unchecked_bars(audits, baselines), *_built_apart(audits),
                *(f"{t.task}: {t.weak_check}" for t in audits if t.weak_check),
                *(f"{t.task}: correct, but its figure was withheld ({t.withheld}); counted "
                  "1.0x, audit it again for a figure" for t in audits if t.withheld)]
    claim = _claim_over(audits, matching)
    return AuditResult(
        solutions=str(solutions), tasks_dir=str(tasks_dir), run_dir=str(run_dir),
        matched_by=matching.how,
        date=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), **env,
        protocol=protocol_line(cfg), tasks=audits, aggregates=aggregate(audits, baselines, claim),
        warnings=warnings)


def _built_apart(audits: list[TaskAudit]) -> list[str]:
    """Which tasks had their models built on the GPU, where not all were built alike
    (eval.construct_on 'auto' settles it per task, or runs were gathered)."""
    on = {t.task: t.built_on for t in audits if t.built_on}
    device = sorted(name for name, where in on.items() if where == "device")
    if not device or len(device) == len(on):
        return []
    return [f"models built on the GPU for {len(device)} of {len(on)} tasks ("
            f"{', '.join(device)}), on the CPU for the others"]


def _unchecked_bars(audits: list[TaskAudit], baselines: dict[str, Baseline]) -> list[str]:
    """The compile modes a file is measured against that were not shown to answer as eager
    does: a wrong mode would be a bar no correct file needs to clear."""
    never, could_not = [], []
    for name in (t.task for t in audits):
        timed = [m for m in baselines[name].modes
                 if m.mode != "eager" and m.stats] if name in baselines else []
        if any(m.checked is None for m in timed):
            never.append(name)
        could_not += [f"{name} {m.mode} ({m.check_note or 'no reason given'})"
                      for m in timed if m.checked is False]
    lines = []
    if never:
        lines.append("compile modes timed but never compared with eager (baselines measured "
                     "before pike checked them; one may be wrong for its task): "
                     + ", ".join(never))
    if could_not:
        lines.append("compile modes that could not be compared with eager: "
                     + "; ".join(could_not))
    return lines


def protocol_line(cfg: RunConfig) -> str:
    """The correctness protocol the files were judged by, as the result states it."""
    ev = cfg.eval
    built = {"cpu": "on the CPU", "device": "on the GPU",
             "auto": "on the GPU where their weights and buffers reach "
                     f"{BUILD_ON_DEVICE_BYTES // 2**20} MiB, else on the CPU"}[ev.construct_on]
    return (f"{ev.trials} trials with fresh seeded inputs, plus shifted-input and "
            f"after-timing trials; atol {ev.atol}, rtol {ev.rtol}; guards on; "
            f"models built {built}")


def _claim_over(audits: list[TaskAudit], matching: Matching) -> tuple[float, str] | None:
    """The set's claim over the tasks audited: a manifest's per-task claims give it for
    any part of the set (a partial or --tasks audit), counted as the manifest counts."""
    if matching.claim is None:
        return None
    found = matching.solution_set
    if found is None or {t.task for t in audits} == {e.task for e in found.tasks}:
        return matching.claim.geomean, matching.claim.source
    entries = [found.entry(t.task) for t in audits]
    claimed = [e.speedup_vs_eager if e is not None and e.status == "ok" and e.speedup_vs_eager
               else 1.0 for e in entries]
    outside = sum(e is None for e in entries)
    return (geomean(claimed) if claimed else 1.0,
            f"{matching.claim.source}; over the {len(audits)} tasks audited here, of the "
            f"set's {len(found.tasks)}" + (f" ({outside} not in the set, counted 1.0x)"
                                           if outside else ""))


def _environment(baselines: list[Baseline]) -> dict[str, str]:
    """Where the audit measured: the most common value of each field over the baselines."""
    def common(attr: str) -> str:
        values = Counter(getattr(b, attr) for b in baselines if getattr(b, attr))
        return values.most_common(1)[0][0] if values else ""

    found = {k: common(k) for k in ("device", "device_name", "torch_version", "host")}
    devices = sorted({b.device for b in baselines if b.device}, key=_device_order)
    if len(devices) > 1:  # tasks spread over GPUs: name them all
        found["device"] = ", ".join(devices)
    return found


def _device_order(device: str) -> tuple[str, int]:
    kind, _, index = device.partition(":")
    return kind, int(index) if index.isdigit() else -1
