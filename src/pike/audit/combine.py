"""`combine()`: one audit result from several audit runs of the same set, nothing re-run.

An audit spread over machines or device sessions (a call that can hold a task's
torch.compile builds only so long, a subset of tasks on another host) leaves several run
stores. Each task's figures still come from one run (its baselines and its file, measured in
one call on one GPU); combining only gathers them and works the aggregates out again, as
`pike audit` would over the same tasks. It refuses what would mix different things under
one figure: other judging terms (trials, tolerances, how the model is built, a run
whose baselines leave eager out), a file that is not the set's, a task file that changed,
or one task judged in two runs (unless asked to keep the later run's verdict: a task judged again after its first
verdict was found to be the evaluator's fault). A task whose reference failed in one run (an
`error`) may be judged in another, and that run's figures are kept, said so.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

from pike.audit.matching import Matching
from pike.audit.result import AuditResult, TaskAudit
from pike.audit.run import (
    ROLE,
    audit_result,
    audited_tasks,
    changed_tasks,
    judged_audit,
    recorded_audit,
    task_base,
    write_result,
)
from pike.config import RunConfig
from pike.errors import ConfigError
from pike.evaluate import Baseline
from pike.store import BASELINE_STATE, ERROR_STATE, STORE_FILE, RunStore
from pike.task import Task

_Found = tuple[TaskAudit, Baseline | None, Path]


def _no_file(base: TaskAudit) -> TaskAudit:
    """A task the set has no file for, with the set's reason where it gave one."""
    return base.model_copy(update={"message": base.message or "no solution file"})


def combine(solutions: Path, tasks: Path, run_dirs: list[Path], *, out: Path,
            ids: list[int] | None = None, later_wins: bool = False) -> AuditResult:
    """The audit of `solutions` against the folder `tasks` (its tasks of `ids` only, where
    given: an audit of a sample of a folder), gathered from the audit runs `run_dirs`;
    tasks none of them judged are the result's `open_tasks`. A task judged in two runs is
    refused, or with `later_wins` taken from the one later in `run_dirs`, said so. Writes
    audit.json and audit.md into `out`, a folder that holds no run store (the runs keep
    theirs)."""
    runs = [Path(r) for r in run_dirs]
    _check_places(runs, Path(out))
    solutions, tasks_dir = Path(solutions), Path(tasks)
    # the tasks a single audit of the set would take
    task_list, matching, set_notes, _ = audited_tasks(solutions, tasks_dir, ids)
    changed = changed_tasks(matching, task_list)
    if changed:
        raise ConfigError(f"{', '.join(changed)}: the task file differs from the one in the "
                          "set's manifest; combine against the set's task files")
    configs = [recorded_audit(run, None, None)[1] for run in runs]
    choices = {run: cfg.eval.construct_on for run, cfg in zip(runs, configs, strict=True)}
    built = _built_alike(choices)
    terms = [_judging_terms(cfg) for cfg in configs]
    for run, differ in zip(runs[1:], terms[1:], strict=True):
        if differ != terms[0]:
            keys = sorted(k for k in differ if differ[k] != terms[0][k])
            raise ConfigError(f"{runs[0]} and {run} judged on different terms "
                              f"({', '.join(keys)}): their figures are not one audit's")
    found: dict[str, _Found] = {}
    warnings = list(matching.notes) + set_notes + _baselines_alike(runs, configs)
    protocol = configs[0]
    limits = {run: cfg.eval.limits.build_seconds for run, cfg in zip(runs, configs, strict=True)}
    if len(set(limits.values())) > 1:  # a bar, not a verdict: warned, not refused
        warnings.append("the runs gave a compile mode's build different limits ("
                        + ", ".join(f"{run}: {s:g} s" for run, s in limits.items())
                        + "): a mode that failed past one limit might have built within another")
    names = {t.name for t in task_list}
    # with later_wins, judgments of a file the set has since replaced: (run's place, why)
    stale: dict[str, list[tuple[int, str]]] = {}
    for run in runs:
        with RunStore.open(run) as store:
            rows = {t["name"]: t for t in store.tasks()}
            outside = [name for name in rows if name not in names]
            where = f"among the tasks asked of {tasks_dir}" if ids is not None else f"in {tasks_dir}"
            warnings += [f"{run}: {', '.join(outside)} not {where}; left out"] if outside else []
            for task in task_list:
                if task.name not in rows:
                    continue
                try:
                    judged = _judged_in(store, rows[task.name]["sha256"], run, task,
                                        matching, solutions)
                except _OtherFile as other:
                    if not later_wins:
                        raise
                    stale.setdefault(task.name, []).append((runs.index(run), str(other)))
                    continue
                if judged is not None:
                    warnings += _keep(found, task.name, (*judged, run), later_wins)
                elif later_wins and task.name in found:  # a redo there not yet done
                    warnings.append(f"{task.name}: not finished in {run}, named after "
                                    f"{found[task.name][2]}: the verdict there kept")
    warnings += _replaced_files(stale, found, runs)
    missing = {t.name: _no_file(task_base(t, matching, solutions, [])) for t in task_list
               if matching.files[t.name] is None}
    warnings += [f"{name}: judged in {found.pop(name)[2]}, but the set has no file for it now"
                 for name in list(found) if name in missing]
    audits = [found[t.name][0] if t.name in found else missing[t.name]
              for t in task_list if t.name in found or t.name in missing]
    baselines = {name: baseline for name, (_, baseline, _) in found.items() if baseline}
    left = [t.name for t in task_list if t.name not in found and t.name not in missing]
    warnings.append(f"gathered from {len(runs)} audit runs: " + ", ".join(
        f"{run} ({sum(r == run for *_, r in found.values())} tasks)" for run in runs))
    warnings += _measured_apart(list(baselines.values()))
    if left:
        warnings.append(f"partial: {len(audits)} of {len(task_list)} tasks audited; not yet: "
                        + ", ".join(left))
    if built is not None:  # runs of 'auto' beside runs of one fixed choice
        _check_built(found, choices, built)
        protocol = next(cfg for cfg in configs if cfg.eval.construct_on == built)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    result = audit_result(solutions, tasks_dir, out, matching, audits, baselines, protocol,
                          warnings)
    result.open_tasks = left
    result.combined_from = [str(run) for run in runs]
    result.date = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    write_result(result)
    return result


def _check_places(runs: list[Path], out: Path) -> None:
    if not runs:
        raise ConfigError("name at least one audit run to combine")
    seen = [r.resolve() for r in runs]
    twice = sorted({str(r) for r, s in zip(runs, seen, strict=True) if seen.count(s) > 1})
    if twice:
        raise ConfigError(f"{', '.join(twice)} named more than once")
    if (out / STORE_FILE).exists() or out.resolve() in seen:
        raise ConfigError(f"{out} holds a run store: give the gathered result a folder of its "
                          "own, so no run's own audit.json is overwritten")


def _judging_terms(cfg: RunConfig) -> dict[str, Any]:
    """What decides a verdict or the bar it is compared with: runs that differ in any of it
    measured different things. Where the models are built is checked apart (_built_alike):
    'auto' settles it per task."""
    ev = cfg.eval
    return {"trials": ev.trials, "atol": ev.atol, "rtol": ev.rtol, "model_mode": ev.model_mode,
            "seed": ev.seed}


def _baselines_alike(runs: list[Path], configs: list[RunConfig]) -> list[str]:
    """Runs that timed different baseline modes may be gathered where every one timed
    eager, each task's file's figure over eager being measured alike (a run against eager
    alone is what a task whose compile builds outlast a device call can have). A figure
    over a torch.compile mode then covers the tasks of the runs that timed it, as it
    leaves out a task whose build of the mode failed: said in a warning. Otherwise
    refused."""
    modes = {run: list(cfg.search.baseline_modes) for run, cfg in zip(runs, configs, strict=True)}
    if len({tuple(sorted(m)) for m in modes.values()}) == 1:
        return []  # (the order a run listed them in changes nothing measured)
    without = [str(run) for run, m in modes.items() if "eager" not in m]
    if without:
        raise ConfigError(f"the runs judged on different terms (baseline_modes; {', '.join(without)} "
                          "without eager): their figures are not one audit's")
    runs_of: dict[str, list[str]] = {}  # each set of modes, once, with its runs
    for run, m in modes.items():
        runs_of.setdefault(", ".join(m), []).append(str(run))
    return ["the runs timed different baselines (" + "; ".join(
        f"{timed} in {', '.join(named)}" for timed, named in runs_of.items()) + "): a figure "
        "over a torch.compile mode covers only the tasks of the runs that timed it, and a "
        "task's fastest mode is the fastest of those its run timed"]


def _built_alike(choices: dict[Path, str]) -> str | None:
    """Runs that build the models in different places (`choices`: each run's
    eval.construct_on) measured different things, except that a run of `auto` may stand
    beside runs of one fixed choice: its tasks are then checked one by one (_check_built).
    That choice, where there is such a mix; None where every run has the same setting."""
    fixed = sorted(set(choices.values()) - {"auto"})
    if len(set(choices.values())) == 1:
        return None
    if len(fixed) > 1:
        raise ConfigError("the runs judged on different terms (construct_on: " + ", ".join(
            f"{run} {c}" for run, c in choices.items()) + "): their figures are not one audit's")
    return fixed[0]


def _check_built(found: dict[str, _Found], choices: dict[Path, str], fixed: str) -> None:
    """Each task taken from a run of construct_on 'auto' was built where the other runs
    build every task (`fixed`), or the gathered audit would mix the two."""
    apart = [f"{name} ({audit.built_on or 'not recorded'} in {run})"
             for name, (audit, _, run) in sorted(found.items())
             if choices[run] == "auto" and audit.status != "error" and audit.file is not None
             and audit.built_on != fixed]
    if apart:
        raise ConfigError(f"construct_on auto built these tasks elsewhere than the runs of "
                          f"construct_on {fixed} build every task: {'; '.join(apart)}; audit "
                          "them again with one setting")


def _keep(found: dict[str, _Found], name: str, new: _Found, later_wins: bool) -> list[str]:
    """Add `new` for task `name`; a judged task beats an error (its reference failed in
    that run), two judgments of one task are refused, or with `later_wins` the new one
    replaces the old."""
    old = found.get(name)
    if old is None:
        found[name] = new
        return []
    old_error, new_error = old[0].status == "error", new[0].status == "error"
    if old_error and not new_error:
        found[name] = new
        return [f"{name}: an error in {old[2]} ({old[0].message[:120]}), judged in {new[2]}: "
                "kept from there"]
    if new_error and not old_error:
        return [f"{name}: an error in {new[2]} ({new[0].message[:120]}), judged in {old[2]}: "
                "kept from there"]
    if old_error and new_error:
        return []
    if later_wins:
        found[name] = new
        return [f"{name}: judged in {old[2]} ({old[0].status}) and again in {new[2]} "
                f"({new[0].status}): the later kept (--later-wins)"]
    raise ConfigError(f"{name} was judged in both {old[2]} and {new[2]}: combine runs of "
                      "different tasks, or give --later-wins to keep the verdict of the run "
                      "named later")


class _OtherFile(ConfigError):
    """A run judged another file for a task than the set holds now."""


def _replaced_files(stale: dict[str, list[tuple[int, str]]], found: dict[str, _Found],
                    runs: list[Path]) -> list[str]:
    """With --later-wins, a run that judged a file the set has since replaced is passed
    over where a run named after it judged the set's file (a task's file improved, the
    set written again, only that task audited anew); anything else is still refused."""
    warnings = []
    for name, judged in stale.items():
        place, why = max(judged)
        kept = found.get(name)
        if kept is None or runs.index(kept[2]) < place:
            raise ConfigError(f"{why}, and no run named after it judged the set's file "
                              "(--later-wins keeps only a later run's verdict)")
        warnings.append(f"{name}: " + ", ".join(sorted({str(runs[i]) for i, _ in judged}))
                        + f" judged another file than the set's; the set's file judged in "
                        f"{kept[2]} kept (--later-wins)")
    return warnings


def _measured_apart(baselines: list[Baseline]) -> list[str]:
    """When and where the gathered figures were measured: the result's own date is when
    they were gathered."""
    dates = sorted(b.date for b in baselines if b.date)
    lines = [f"measured from {dates[0]} to {dates[-1]}"] if dates else []
    # the cards: audit_result says so for every audit, gathered or not
    for attr, what in (("torch_version", "torch versions"), ("host", "hosts")):
        values = sorted({getattr(b, attr) for b in baselines if getattr(b, attr)})
        if len(values) > 1:
            lines.append(f"measured on {len(values)} {what}: {', '.join(values)}; each "
                         "task's figures come from one of them")
    return lines


def _judged_in(store: RunStore, sha256: str, run_dir: Path, task: Task, matching: Matching,
               solutions: Path) -> tuple[TaskAudit, Baseline | None] | None:
    """The task's audit as `run_dir` recorded it (its task file's hash `sha256`), or None
    where that run did not finish it."""
    if sha256 != task.sha256:
        raise ConfigError(f"{run_dir} audited another version of {task.name}'s task file")
    base = task_base(task, matching, solutions, [])
    error = store.get_state(task.name, ERROR_STATE)
    if error is not None:  # the reference itself failed there
        return base.model_copy(update={"status": "error", "message": str(error)}), None
    file = matching.files[task.name]
    judged = [c for c in store.candidates(task.name) if c.role == ROLE and c.verdict]
    if not judged:
        return None
    if file is None:  # a run judged a file the set no longer has: the caller says so
        return base, None
    try:
        source = file.read_text()
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError(f"cannot read {file}: {err}") from None
    mine = next((c for c in judged if c.source == source), None)
    if mine is None or mine.verdict is None:
        raise _OtherFile(f"{run_dir} judged another file for {task.name} than the set's "
                         f"{file.name}")
    kept = store.get_state(task.name, BASELINE_STATE)
    if kept is None:
        return None
    baseline = Baseline.model_validate(kept)
    return judged_audit(base, task, source, mine.id, mine.verdict, baseline), baseline
