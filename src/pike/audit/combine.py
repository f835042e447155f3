"""`combine()`: one audit result from several audit runs of the same set, nothing re-run.

An audit spread over machines or device sessions (a call that can hold a task's
torch.compile builds only so long, a subset of tasks on another host) leaves several run
stores. Each task's figures still come from one run (its baselines and its file, measured in
one call on one GPU); combining only gathers them and works the aggregates out again, as
`pike audit` would over the same tasks. It refuses what would mix different things under
one figure: another correctness protocol, a file that is not the set's, a task file that
changed, or one task audited in two runs.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path

from pike.audit.matching import Matching, match
from pike.audit.result import AuditResult, TaskAudit
from pike.audit.run import (
    ROLE,
    audit_result,
    changed_tasks,
    judged_audit,
    protocol_line,
    recorded_audit,
    task_base,
    write_result,
)
from pike.errors import ConfigError
from pike.evaluate import Baseline
from pike.store import BASELINE_STATE, ERROR_STATE, RunStore
from pike.task import Task, load_tasks


def combine(solutions: Path, tasks: Path, run_dirs: list[Path], *, out: Path) -> AuditResult:
    """The audit of `solutions` against the folder `tasks`, gathered from the audit runs
    `run_dirs`; tasks none of them judged are the result's `open_tasks`. Writes audit.json
    and audit.md into `out` (no run store: the runs keep theirs)."""
    if not run_dirs:
        raise ConfigError("name at least one audit run to combine")
    solutions, tasks_dir = Path(solutions), Path(tasks)
    task_list = load_tasks(tasks_dir)
    matching = match(solutions, task_list)
    changed = changed_tasks(matching, task_list)
    if changed:
        raise ConfigError(f"{', '.join(changed)}: the task file differs from the one in the "
                          "set's manifest; combine against the set's task files")
    configs = [recorded_audit(Path(run_dir), None, None)[1] for run_dir in run_dirs]
    protocols = {protocol_line(cfg) for cfg in configs}
    if len(protocols) > 1:
        raise ConfigError("the runs judged by different protocols: " + " / ".join(sorted(protocols)))
    found: dict[str, tuple[TaskAudit, Baseline | None, Path]] = {}
    for run_dir in map(Path, run_dirs):
        with RunStore.open(run_dir) as store:
            for task in task_list:
                if matching.files[task.name] is None:
                    continue  # counted missing below, whatever a run recorded
                judged = _judged_in(store, run_dir, task, matching, solutions)
                if judged is None:
                    continue
                if task.name in found:
                    raise ConfigError(f"{task.name} was audited in both {found[task.name][2]} "
                                      f"and {run_dir}: combine runs of different tasks")
                found[task.name] = (*judged, run_dir)
    missing = {t.name: task_base(t, matching, solutions, []).model_copy(
        update={"message": "no solution file"}) for t in task_list
        if matching.files[t.name] is None}
    audits = [found[t.name][0] if t.name in found else missing[t.name]
              for t in task_list if t.name in found or t.name in missing]
    baselines = {name: baseline for name, (_, baseline, _) in found.items() if baseline}
    left = [t.name for t in task_list if t.name not in found and t.name not in missing]
    warnings = [*matching.notes,
                f"combined from {len(run_dirs)} audit runs: "
                + ", ".join(f"{run_dir} ({sum(r == Path(run_dir) for *_, r in found.values())}"
                            " tasks)" for run_dir in run_dirs)]
    if left:
        warnings.append(f"partial: {len(audits)} of {len(task_list)} tasks audited; not yet: "
                        + ", ".join(left))
    Path(out).mkdir(parents=True, exist_ok=True)
    result = audit_result(solutions, tasks_dir, Path(out), matching, audits, baselines,
                          configs[0], warnings)
    result.open_tasks = left
    result.combined_from = [str(run_dir) for run_dir in run_dirs]
    result.date = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    write_result(result)
    return result


def _judged_in(store: RunStore, run_dir: Path, task: Task, matching: Matching,
               solutions: Path) -> tuple[TaskAudit, Baseline | None] | None:
    """The task's audit as `run_dir` recorded it, or None where that run did not finish it."""
    row = next((t for t in store.tasks() if t["name"] == task.name), None)
    if row is None:
        return None
    if row["sha256"] != task.sha256:
        raise ConfigError(f"{run_dir} audited another version of {task.name}'s task file")
    base = task_base(task, matching, solutions, [])
    error = store.get_state(task.name, ERROR_STATE)
    if error is not None:  # the reference itself failed there
        return base.model_copy(update={"status": "error", "message": str(error)}), None
    file = matching.files[task.name]
    judged = [c for c in store.candidates(task.name) if c.role == ROLE and c.verdict]
    if file is None or not judged:
        return None
    source = file.read_text()
    mine = next((c for c in judged if c.source == source), None)
    if mine is None or mine.verdict is None:
        raise ConfigError(f"{run_dir} judged another file for {task.name} than the set's "
                          f"{file.name}")
    kept = store.get_state(task.name, BASELINE_STATE)
    if kept is None:
        return None
    baseline = Baseline.model_validate(kept)
    return judged_audit(base, task, source, mine.id, mine.verdict, baseline), baseline
