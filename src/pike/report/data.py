"""What a report shows, read from run stores: runs, their tasks, best-so-far curves, outcome
counts. Nothing here draws or writes; figures.py and html.py turn these values into files.

Every speedup is the ratio the evaluator measured in one verdict (reference eager time over
candidate time, same host, same protocol), so numbers from different hosts are never mixed
inside one ratio.
"""

from __future__ import annotations

import logging
import math
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, get_args

from pydantic import ValidationError

from pike.evaluate.baseline import Baseline
from pike.evaluate.verdict import Status, Verdict
from pike.store import (
    BASELINE_STATE,
    DONE_STATE,
    ERROR_STATE,
    MISSING_STATE,
    CandidateRow,
    RunStore,
)

log = logging.getLogger(__name__)

Axis = Literal["queries", "dollars"]
# What became of a task in a run: a correct candidate; candidates judged but none correct;
# or never judged at all (a campaign cut off before it, a failing reference, no file to
# audit). The last two both count 1.0x (the user keeps the reference), but only the
# second says the search found nothing.
Outcome = Literal["solved", "no_correct", "not_run"]

STATUSES: tuple[str, ...] = get_args(Status)
PENDING = "pending"  # recorded but not judged yet: a report of a live or killed run


@dataclass(frozen=True)
class Spend:
    """Where an LLM call sits in its task's spending: its 1-based position and the dollars
    spent up to and including it."""

    query: int
    dollars: float


@dataclass
class TaskRun:
    """One task as one run saw it."""

    name: str
    reference: str
    candidates: list[CandidateRow]
    spend: dict[int, Spend]  # llm_call_id -> its place in the task's spending
    queries: int
    dollars: float
    uncosted_calls: int  # calls recorded without a cost (a model missing from the pricing)
    baseline: Baseline | None = None
    error: str | None = None  # why a campaign gave up on the task (its reference failed)
    confirmed: CandidateRow | None = None  # the store's confirmed best, where there is one
    done: bool = False  # a campaign or audit finished the task
    missing: bool = False  # an audited set had no file for the task

    def searched(self) -> list[CandidateRow]:
        """The candidates a search proposed: the reference itself is not one."""
        return [c for c in self.candidates if c.role != "reference"]

    def correct(self) -> list[CandidateRow]:
        return [c for c in self.searched() if speedup(c) is not None]

    def best(self) -> CandidateRow | None:
        """The confirmed best where the search's top was timed again in one window (its
        verdict says `confirmed`, with the search's figure as `search_speedup`); otherwise
        the correct candidate with the highest search-time speedup, the earliest on ties."""
        if self.confirmed is not None:
            return self.confirmed
        correct = self.rankable()
        return max(correct, key=lambda c: (speedup(c), -c.id)) if correct else None

    def rankable(self) -> list[CandidateRow]:
        """The correct candidates a search may take for its best, as store.best: not one
        whose window was cut short (a figure of a few rounds)."""
        return [c for c in self.correct() if c.verdict is not None and c.verdict.rankable]

    def final_speedup(self) -> float:
        """What the task adds to a run's geomean: its best's speedup, 1.0 without one."""
        best = self.best()
        return (speedup(best) or 1.0) if best is not None else 1.0

    def outcome(self) -> Outcome:
        if self.error is None and self.best() is not None:
            return "solved"
        judged = any(c.verdict is not None for c in self.searched())
        return "no_correct" if judged and self.error is None else "not_run"

    def not_run_reason(self) -> str:
        """Why a task that was never judged was not (meaningful for outcome 'not_run')."""
        if self.error is not None:
            return f"its reference failed: {self.error}"
        if self.missing:
            return "no solution file in the set"
        if self.done:
            return "finished without a judged candidate"
        if self.searched():
            return "cut off before its first verdict"
        return "cut off or stopped before it started"

    def position(self, candidate: CandidateRow, axis: Axis) -> float:
        """When a candidate became available, in queries or dollars spent on this task.
        Candidates made without an LLM (offline transformations) cost nothing."""
        spend = self.spend.get(candidate.llm_call_id) if candidate.llm_call_id else None
        if spend is None:
            return 0.0
        return float(spend.query) if axis == "queries" else spend.dollars

    def total(self, axis: Axis) -> float:
        return float(self.queries) if axis == "queries" else self.dollars

    def best_at(self, budget: float, axis: Axis) -> float:
        """Best correct speedup within `budget`; 1.0 with none, since the user then keeps
        the reference."""
        found = [speedup(c) for c in self.rankable() if self.position(c, axis) <= budget]
        return max(found) if found else 1.0


@dataclass
class Environment:
    """Where a run's verdicts were measured (the most common value of each field)."""

    device: str = ""
    device_name: str = ""
    torch_version: str = ""
    host: str = ""

    def describe_device(self) -> str:
        if self.device_name and self.device_name != self.device:
            return f"{self.device} ({self.device_name})" if self.device else self.device_name
        return self.device or "unknown"


@dataclass
class RunData:
    run_dir: Path
    label: str
    strategy: str
    model: str | None
    command: str
    created_at: str
    config: dict
    tasks: list[TaskRun]
    environment: Environment = field(default_factory=Environment)

    def task(self, name: str) -> TaskRun | None:
        return next((t for t in self.tasks if t.name == name), None)


def speedup(candidate: CandidateRow) -> float | None:
    """The speedup of a correct, timed candidate; None for any other."""
    verdict = candidate.verdict
    if verdict is None or not verdict.ok or not verdict.speedup or verdict.speedup <= 0:
        return None
    return verdict.speedup


def reference_ms(verdict: Verdict) -> float | None:
    """Eager's median in the window the verdict's speedup comes from (for a confirmed
    best, the store gives the confirming window's)."""
    return verdict.reference.median_ms if verdict.reference is not None else None


# -- loading -------------------------------------------------------------------------------


def load_runs(run_dirs: list[Path]) -> list[RunData]:
    runs = [load_run(Path(d)) for d in run_dirs]
    _disambiguate(runs)
    return runs


def load_run(run_dir: Path) -> RunData:
    with RunStore.open(run_dir) as store:
        config = store.config()
        tasks = [_load_task(store, row) for row in store.tasks()]
        command, created_at = store.command(), store.created_at()
    strategy, model = describe_strategy(config)
    judged = [c for t in tasks for c in t.searched()]
    if judged and all(c.role == "audit" for c in judged):
        strategy, model = "audit", None  # `pike audit` of a solution set: no search ran
    label = " · ".join(p for p in (strategy, model, Path(run_dir).resolve().name) if p)
    return RunData(run_dir=Path(run_dir), label=label, strategy=strategy, model=model,
                   command=command, created_at=created_at, config=config, tasks=tasks,
                   environment=_environment(tasks))


def describe_strategy(config: dict) -> tuple[str, str | None]:
    """(strategy, LLM model) of a run config. A run with no model ran only the offline
    transformations, whatever search.strategy says."""
    search = config.get("search") or {}
    llm = config.get("llm") or {}
    model = llm.get("model") or config.get("model")
    strategy = search.get("strategy") or config.get("strategy") or "unknown"
    if not model:
        return "offline", None
    if search.get("seed_offline"):
        strategy = f"offline+{strategy}"
    return strategy, model


def _load_task(store: RunStore, row: dict) -> TaskRun:
    name = row["name"]
    spend: dict[int, Spend] = {}
    dollars, uncosted = 0.0, 0
    calls = store.llm_calls(name)
    for index, call in enumerate(calls, start=1):
        cost = call.get("cost_usd")
        if cost is None:
            uncosted += 1
        # rounded so that $0.1 + $0.2 and $0.3 are one budget, not two steps of a curve
        dollars = round(dollars + (cost or 0.0), 9)
        spend[call["id"]] = Spend(index, dollars)
    best = store.best(name)
    return TaskRun(name=name, reference=row["source"], candidates=store.candidates(name),
                   spend=spend, queries=len(calls), dollars=dollars, uncosted_calls=uncosted,
                   baseline=stored_baseline(store, name), error=_error(store, name),
                   confirmed=best if best and best.verdict and best.verdict.confirmed else None,
                   done=bool(store.get_state(name, DONE_STATE)),
                   missing=bool(store.get_state(name, MISSING_STATE)))


def stored_baseline(store: RunStore, task: str) -> Baseline | None:
    """The task's baseline as `pike bench` or `pike audit` kept it; None if absent or
    unreadable (logged)."""
    raw = store.get_state(task, BASELINE_STATE)
    if raw is None:
        return None
    try:
        return Baseline.model_validate(raw)
    except ValidationError as e:
        log.warning("%s: the baseline of %s is unreadable, left out: %s", store.path, task, e)
        return None


def _error(store: RunStore, task: str) -> str | None:
    error = store.get_state(task, ERROR_STATE)  # set by `pike bench` (search/campaign.py)
    return None if error is None else str(error)


def _environment(tasks: list[TaskRun]) -> Environment:
    verdicts = [c.verdict for t in tasks for c in t.candidates if c.verdict is not None]

    def common(attr: str) -> str:
        values = Counter(getattr(v, attr) for v in verdicts if getattr(v, attr))
        return values.most_common(1)[0][0] if values else ""

    env = Environment(common("device"), common("device_name"), common("torch_version"),
                      common("host"))
    if not env.torch_version:  # an offline-only run may have no verdict; its baseline may
        baseline = next((t.baseline for t in tasks if t.baseline), None)
        if baseline is not None:
            env = Environment(baseline.device, baseline.device_name, baseline.torch_version,
                              baseline.host)
    return env


def _disambiguate(runs: list[RunData]) -> None:
    """Two runs with one label (same strategy, model and folder name) get numbered."""
    seen = Counter(r.label for r in runs)
    for index, run in enumerate(runs, start=1):
        if seen[run.label] > 1:
            run.label = f"{run.label} #{index}"


# -- what the figures and tables show ---------------------------------------------------


def geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else 1.0


def progress(run: RunData, axis: Axis) -> list[tuple[float, float]]:
    """The run's geomean over its tasks of the best correct speedup so far, at each budget
    per task where some task's spending stepped; a task that spent less stays at its end."""
    steps = {0.0}
    for task in run.tasks:
        steps.update(task.position(c, axis) for c in task.candidates)
        steps.add(task.total(axis))
    return [(x, geomean([t.best_at(x, axis) for t in run.tasks])) for x in sorted(steps)]


def final_geomean(run: RunData) -> float:
    """The geomean over the run's tasks of each one's best (confirmed where it was), a task
    without a correct candidate, run or not, counting 1.0x."""
    return geomean([t.final_speedup() for t in run.tasks])


def outcome_counts(run: RunData) -> Counter[Outcome]:
    return Counter(t.outcome() for t in run.tasks)


def task_names(runs: list[RunData]) -> list[str]:
    """Every task of any run, in the order first seen."""
    return list(dict.fromkeys(t.name for r in runs for t in r.tasks))


def baseline_of(runs: list[RunData], task: str) -> tuple[Baseline, RunData] | None:
    """The first recorded baseline of a task, with the run that measured it."""
    for run in runs:
        found = run.task(task)
        if found is not None and found.baseline is not None:
            return found.baseline, run
    return None


RoundKey = tuple[int, int]  # (0 offline / 1 LLM, round): offline rounds come first


def round_label(key: RoundKey) -> str:
    return f"offline {key[1]}" if key[0] == 0 else str(key[1])


def outcomes_by_round(run: RunData) -> dict[RoundKey, Counter[str]]:
    """Verdict status counts per round over all tasks; offline and LLM rounds are numbered
    apart, so they are kept apart."""
    counts: dict[RoundKey, Counter[str]] = {}
    for task in run.tasks:
        for c in task.searched():
            key = (0 if c.role == "offline" else 1, c.round)
            status = c.verdict.status if c.verdict else PENDING
            counts.setdefault(key, Counter())[status] += 1
    return dict(sorted(counts.items()))


def fixer_success(run: RunData) -> tuple[int, int]:
    """(error-fixer candidates that came out correct, judged error-fixer candidates)."""
    fixes = [c for t in run.tasks for c in t.candidates if c.role == "fix" and c.verdict]
    return sum(1 for c in fixes if c.verdict and c.verdict.ok), len(fixes)


def lines_of_code(source: str) -> int:
    """Lines that are neither blank nor only a comment; embedded CUDA or Triton source
    counts, since it is code the solution ships."""
    return sum(1 for line in source.splitlines()
               if line.strip() and not line.lstrip().startswith("#"))
