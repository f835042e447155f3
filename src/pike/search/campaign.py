"""`bench()`: one strategy over many tasks, unattended, in one run store.

Each task gets its own budget (the ledger is per task), its baselines (eager and each
torch.compile mode) measured once and kept in the store, and its own search. Tasks run in
`jobs` threads at once: the evaluator's device lock keeps timing alone on each GPU, and
LLM calls are I/O. Every step is in the store before it counts, so a campaign killed at
any point resumes where it stopped: finished tasks are skipped, a task cut off mid-search
continues with the calls and verdicts it already has.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable
from contextlib import closing
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from pike.config import RunConfig
from pike.errors import ConfigError, TaskError
from pike.evaluate import measure_baselines
from pike.evaluate.judge import keep_references
from pike.evaluate.leftovers import remove_tree
from pike.evaluate.pool import Lane, Pool, make_pool
from pike.search.session import (
    OptimizeResult,
    search_task,
    stamp,
    stored_tasks,
    summary_row,
    task_result,
)
from pike.solution_set import write_set
from pike.store import BASELINE_STATE, DONE_STATE, ERROR_STATE, RunStore
from pike.task import Task, load_tasks
from pike.threads import run_each

log = logging.getLogger(__name__)



class TaskOutcome(BaseModel):
    task: str
    result: OptimizeResult | None = None
    error: str | None = None


class CampaignResult(BaseModel):
    run_dir: Path
    outcomes: list[TaskOutcome]


def bench(folder: Path | None, config: RunConfig | None = None, *,
          ids: list[int] | None = None, out: Path | None = None, resume: Path | None = None,
          jobs: int = 1, command: str = "", placement: dict[str, Any] | None = None,
          on_event: Callable[..., None] = lambda kind, **data: None) -> CampaignResult:
    """Run the configured strategy over the tasks of `folder` (or continue `resume`, with
    `placement` fields of pool.PLACEMENT over its recorded config)."""
    if resume is not None:
        store = RunStore.open(resume)
        cfg = RunConfig.model_validate(store.config())
        tasks = stored_tasks(store)
    else:
        if folder is None:
            raise ConfigError("give a task folder to bench (or --resume RUN_DIR)")
        cfg = config or RunConfig()
        tasks = load_tasks(folder, ids)
        run_dir = out or cfg.runs_dir / f"bench-{Path(folder).name}-{stamp()}"
        store = RunStore.create(run_dir, cfg.model_dump(mode="json"), command)
        for task in tasks:
            store.add_task(task.name, str(task.path), task.sha256, task.source)
    if placement:
        cfg.eval = cfg.eval.model_copy(update=placement)
    try:
        outcomes = _run_all(store, tasks, cfg, max(1, jobs), on_event)
        _write_outputs(store, outcomes)
        return CampaignResult(run_dir=store.path.parent, outcomes=outcomes)
    finally:
        store.close()


def _run_all(store: RunStore, tasks: list[Task], cfg: RunConfig, jobs: int,
             on_event: Callable[..., None]) -> list[TaskOutcome]:
    outcomes: dict[str, TaskOutcome] = {}
    keep_references(jobs + 1)
    # One evaluation pool for all tasks, `eval.workers` evaluations per task at once: each
    # task's search gets its own lane of that width, so a task's time budget never runs
    # while its candidates wait behind another task's.
    # (A Ray cluster's actors keep their own `eval.workers` each.)
    width = cfg.eval.workers
    total = width * jobs if cfg.eval.cluster == "local" else width
    with closing(make_pool(cfg.eval.model_copy(update={"workers": total}))) as pool:
        # Ctrl-C or a host-level error: queued tasks do not start; what ran is in the store
        # for --resume.
        for outcome in run_each(lambda t: _one_task(store, t, cfg, Lane(pool, width), on_event),
                                tasks, jobs, "pike-bench"):
            outcomes[outcome.task] = outcome
    return [outcomes[t.name] for t in tasks]


def _one_task(store: RunStore, task: Task, cfg: RunConfig, evaluations: Pool,
              on_event: Callable[..., None]) -> TaskOutcome:
    def event(kind: str, **data: Any) -> None:
        on_event(kind, task=task.name, **data)

    if store.get_state(task.name, DONE_STATE):
        event("task_done", resumed=True)
        return TaskOutcome(task=task.name, result=task_result(store, task.name),
                           error=store.get_state(task.name, ERROR_STATE))
    try:
        if store.get_state(task.name, BASELINE_STATE) is None:
            event("task_phase", phase="baseline")
            baseline = measure_baselines(task, cfg, cfg.search.baseline_modes)
            store.set_state(task.name, BASELINE_STATE, baseline.model_dump(mode="json"))
        event("task_phase", phase="search")
        result = search_task(store, task, cfg, None, event, evaluations)
    except TaskError as err:  # the task's reference fails: report it, go on with the rest
        log.warning("%s: %s", task.name, err)
        store.set_state(task.name, ERROR_STATE, str(err))
        store.set_state(task.name, DONE_STATE, True)
        event("task_done", error=str(err))
        return TaskOutcome(task=task.name, result=task_result(store, task.name),
                           error=str(err))
    # Other errors (no GPU, a bad seed set) are the host's or the user's: they end the
    # campaign with their message, and the task stays open for --resume.
    store.set_state(task.name, DONE_STATE, True)
    event("task_done", result=result)
    return TaskOutcome(task=task.name, result=result)


def _write_outputs(store: RunStore, outcomes: list[TaskOutcome]) -> None:
    run_dir = store.path.parent
    best_dir = run_dir / "best"
    best_dir.mkdir(exist_ok=True)
    rows = []
    for outcome in outcomes:
        if outcome.result is None:
            rows.append({"task": outcome.task, "error": outcome.error})
            continue
        if outcome.result.best_source is not None:
            (best_dir / f"{outcome.task}.py").write_text(outcome.result.best_source)
        rows.append(summary_row(store, outcome.result))
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
