"""`optimize()`: one search over one task, new, resumed or replayed, with its run store."""

from __future__ import annotations

import datetime as dt
import json
import logging
from collections import Counter
from collections.abc import Callable
from contextlib import closing
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from pike.agents import AgentContext
from pike.agents.roles import describe_device
from pike.config import RunConfig, SearchConfig
from pike.errors import ConfigError, TaskError
from pike.evaluate import search_bar
from pike.evaluate.judge import resolve_device
from pike.evaluate.pool import Pool, make_pool
from pike.evaluate.verdict import Verdict
from pike.llm import LLMClient, Pricing, resolve_spec
from pike.search.baseline_modes import (
    compile_build_seconds,
    compile_speedups,
    hopeless_modes,
    no_gain_modes,
)
from pike.search.branching import BranchingSearch, Seed
from pike.search.confirm_best import confirm_best
from pike.search.drain import due
from pike.search.evolve import EvolveSearch
from pike.search.ledger import Ledger
from pike.search.offline import OfflineSearch
from pike.search.querier import Querier, RecordedCall, ReplayExhausted
from pike.store import BASELINE_STATE, RunStore
from pike.task import Task

log = logging.getLogger(__name__)

_OUTPUT_TOKENS_GUESS = 8192  # what a reply may cost before we know its length


class OptimizeResult(BaseModel):
    run_dir: Path
    task: str
    best_source: str | None
    best_verdict: Verdict | None
    queries: int
    dollars: float
    verdicts: dict[str, int]
    replay_exhausted: bool = False
    # a campaign's time limit (search/drain.py) stopped it before its end: not finished
    stopped: bool = False
    best_candidate: int | None = None


def optimize(task: Task | None, config: RunConfig | None = None, *, out: Path | None = None,
             resume: Path | None = None, replay: Path | None = None, command: str = "",
             placement: dict[str, Any] | None = None,
             on_event: Callable[..., None] = lambda kind, **data: None) -> OptimizeResult:
    """Search for a faster ModelNew for `task`; every step is recorded under the run dir.

    resume: continue the run in that dir (its own config and task) where it stopped.
    replay: run again with the replies recorded in that dir, without any LLM.
    placement: where evaluations run (pool.PLACEMENT fields) for a resumed or replayed run,
    over its recorded config.
    """
    if resume is not None:
        store = RunStore.open(resume)
        cfg = RunConfig.model_validate(store.config())
        task = _stored_task(store)
        recorded = None
    else:
        recorded = None
        if replay is not None:
            old = RunStore.open(replay)
            cfg = RunConfig.model_validate(old.config())
            task = task or _stored_task(old)
            recorded = {row["role"]: RecordedCall(row) for row in old.llm_calls(task.name)}
            old.close()
        else:
            cfg = config or RunConfig()
        if task is None:
            raise ConfigError("no task to optimize")
        run_dir = out or new_run_dir(cfg.runs_dir, task.name)
        store = RunStore.create(run_dir, cfg.model_dump(mode="json"), command)
        store.add_task(task.name, str(task.path), task.sha256, task.source)
    if placement:
        cfg.eval = cfg.eval.model_copy(update=placement)
    try:
        if resume is not None:
            show_what_was_kept(store, [task], on_event)
        result = search_task(store, task, cfg, recorded, on_event)
        write_outputs(store, result)
        return result
    finally:
        store.close()


def show_what_was_kept(store: RunStore, tasks: list[Task],
                        on_event: Callable[..., None]) -> None:
    """Each task's verdicts, best and round from the calls before, so that a resumed
    run's status lines (a campaign's, a search's) count the whole run, not only this
    call, and say "new best" only of what beats the kept best."""
    for task in tasks:
        rows = [r for r in store.candidates(task.name) if r.verdict is not None]
        if not rows:
            continue
        best = store.best(task.name)
        on_event("resumed", task=task.name,
                 verdicts=Counter(r.verdict.status for r in rows if r.verdict),
                 best=best.verdict.speedup if best and best.verdict else None,
                 round=max(r.round for r in rows))


def search_task(store: RunStore, task: Task, cfg: RunConfig,
                recorded: dict[str, RecordedCall] | None,
                on_event: Callable[..., None], pool: Pool | None = None,
                searched: Callable[[], None] = lambda: None) -> OptimizeResult:
    """Run (or continue) the configured strategy on one task of the store; its candidates
    are judged by `pool` (one the config asks for when None). `searched` is called once
    the search starts nothing more: its last candidate judged, before its confirming
    window (which judges nothing in the pool), or for the offline strategy alone as soon
    as its budget is spent, while its last candidates still run (it may be called twice):
    a campaign lets its next task search beside them and that window."""
    if pool is None:  # its own pool: once it starts nothing more, the spares go
        with closing(make_pool(cfg.search_eval())) as own:
            def searched_alone() -> None:
                searched()
                own.retire_spares()

            return search_task(store, task, cfg, recorded, on_event, own, searched_alone)
    device = resolve_device(cfg.eval.device)
    seeds: list[Seed] = []
    if not cfg.llm.model or cfg.search.seed_offline:  # replays too: it needs no LLM
        # the offline search alone: once its budget is spent, the campaign's next task
        # searches beside its last candidates (they can take minutes: compile builds)
        _offline(store, task, cfg, device, pool, on_event,
                 spent=searched if not cfg.llm.model else lambda: None)
        if due():  # past a campaign's time limit: the task stays open, nothing more starts
            return task_result(store, task.name, stopped=True)
        if not cfg.llm.model:
            searched()
            confirm_best(store, task, cfg)
            return task_result(store, task.name, False)
        best = _best_offline(store, task.name)
        if best is not None:
            seeds.append(Seed(best.id, best.source, best.verdict))
    failing_seeds: list[int] = []
    if cfg.search.seed_from is not None:
        from_set, failing_seeds = _seed_from_set(store, task, cfg, pool, on_event)
        seeds += from_set
        if not cfg.search.fix_seeds:
            failing_seeds = []
    clients, pricing = _clients(cfg, replaying=recorded is not None)
    ctx = AgentContext(task_source=task.source, backend=cfg.search.backend,
                       device=describe_device(device), atol=cfg.eval.atol,
                       reference_profile=_reference_profile(store, task, cfg),
                       profile_tokens=cfg.eval.profile_tokens,
                       prompt_tokens=cfg.llm.prompt_tokens)
    ledger = Ledger(store, task.name, cfg.search.budget_queries, cfg.search.budget_dollars)
    model_of = {"brainstorm": cfg.llm.model, "optimize": cfg.llm.model, "evolve": cfg.llm.model,
                "plan": cfg.llm.model, "fix": cfg.llm.fixer or cfg.llm.model}

    def estimate(role: str, messages: list[dict[str, str]]) -> float:
        spec = model_of.get(role)
        if not spec:
            return 0.0
        seen = [c["cost_usd"] or 0.0 for c in store.llm_calls(task.name) if c["model"] == spec]
        if seen:  # the costliest reply so far is a better guess than the token limit
            return max(seen)
        tokens_in = sum(len(m["content"]) for m in messages) // 3
        out_tokens = cfg.llm.max_tokens or _OUTPUT_TOKENS_GUESS
        return pricing.cost(resolve_spec(spec).model, tokens_in, out_tokens)

    querier = Querier(store, task.name, ledger, clients, estimate, replay_from=recorded)
    common: dict[str, Any] = {
        "judge": lambda sources: pool.judge_many(task, sources),
        "concurrency": cfg.llm.max_concurrency,
        "on_event": lambda kind, **data: on_event(kind, ledger=ledger, **data)}
    search: BranchingSearch | EvolveSearch
    if cfg.search.strategy == "evolve":
        search = EvolveSearch(store, task.name, querier, ctx, cfg=cfg.search.evolve, **common)
    else:
        search = BranchingSearch(store, task.name, querier, ctx, cfg.search.branching,
                                 first_seeds=seeds, **common)
    search.fix_first = failing_seeds
    search.planner, search.plan_granularity = cfg.search.planner, cfg.search.plan_granularity
    exhausted = False
    if due():  # its seeds or profile ran past the limit: the pending ones wait for --resume
        return task_result(store, task.name, stopped=True)
    # its bar for the evaluator: a candidate far behind it gets a few rounds of its
    # timing window (search_bar.py); seeds and fitness take such a figure as it is. From
    # the search windows' figures so far, not a confirming window's (quieter, higher).
    search.bar_key = task.sha256
    before = [r.verdict.speedup for r in store.candidates(task.name)
              if r.verdict is not None and r.verdict.rankable]
    try:
        with search_bar.held(task.sha256, before, bar_rank(cfg.search)):
            search.run()
    except ReplayExhausted:
        exhausted = True  # the recorded run ended here; so does the replay
    if due():
        return task_result(store, task.name, exhausted, stopped=True)
    searched()
    confirm_best(store, task, cfg)
    return task_result(store, task.name, exhausted)


def _best_offline(store: RunStore, task: str) -> Any:
    """The fastest correct offline candidate (by in-window speedup, as the offline search
    ranks), whatever the LLM search later found: a resumed run seeds as the first did."""
    ok = [r for r in store.candidates(task)
          if r.role == "offline" and r.verdict is not None and r.verdict.rankable]
    return max(ok, key=lambda r: (r.verdict.speedup or 0.0, -r.id), default=None)


def _offline(store: RunStore, task: Task, cfg: RunConfig, device: str, pool: Pool,
             on_event: Callable[..., None], spent: Callable[[], None] = lambda: None) -> None:
    baseline = store.get_state(task.name, BASELINE_STATE)
    OfflineSearch(store, task.name, task.source, device,
                  judge=lambda sources: pool.judge_many(task, sources),
                  max_candidates=cfg.search.offline.max_candidates,
                  max_seconds=cfg.search.offline.max_seconds, batch=pool.width,
                  on_event=on_event,
                  compile_speedups=compile_speedups(baseline),
                  skip=hopeless_modes(baseline, timeouts=(cfg.eval.limits.build_seconds
                                                          >= cfg.eval.limits.check_seconds)),
                  known_alone=no_gain_modes(baseline),
                  build_seconds=compile_build_seconds(baseline),
                  bar_rank=bar_rank(cfg.search), spent=spent).run()


def bar_rank(cfg: SearchConfig) -> int:
    """Which best figure so far is a search's bar (search_bar.py, `search.bar_rank`);
    its best where no confirming window times several again."""
    return cfg.bar_rank if cfg.confirm_top > 0 else 1


def _reference_profile(store: RunStore, task: Task, cfg: RunConfig) -> str:
    """The reference's profile for the first prompts, measured once per task and kept."""
    if not cfg.eval.profile:
        return ""
    from pike.evaluate.judge import profile_reference
    from pike.evaluate.profile import ProfileSummary, render

    kept = store.get_state(task.name, "reference_profile")
    if kept is None:
        summary = profile_reference(task, cfg.eval)
        kept = summary.model_dump(mode="json") if summary else {}
        store.set_state(task.name, "reference_profile", kept)
    return render(ProfileSummary.model_validate(kept), cfg.eval.profile_tokens) if kept else ""


def _seed_from_set(store: RunStore, task: Task, cfg: RunConfig, pool: Pool,
                   on_event: Callable[..., None]) -> tuple[list[Seed], list[int]]:
    """Judge the set's file for this task once (role 'seed', its file name as the idea):
    correct, it seeds round 0 (and PIKE-O's library); failing, it may go to the fixer."""
    from pike.audit import match_solutions

    assert cfg.search.seed_from is not None
    path = match_solutions(cfg.search.seed_from, [task]).get(task.name)
    if path is None:
        return [], []
    idea = f"seed: {path}"
    row = next((r for r in store.candidates(task.name) if r.role == "seed" and r.idea == idea),
               None)
    if row is None:
        cid = store.add_candidate(task.name, path.read_text(), parent_id=None, role="seed",
                                  round=-1, branch=0, idea=idea)
        row = store.candidate(cid)
    if row.verdict is None:
        store.set_verdict(row.id, pool.judge(task, row.source))
        row = store.candidate(row.id)
        on_event("verdict", candidate=row.id, verdict=row.verdict)
    assert row.verdict is not None
    if row.verdict.ok:
        return [Seed(row.id, row.source, row.verdict)], []
    return [], [row.id]


def _clients(cfg: RunConfig, replaying: bool) -> tuple[dict[str, Any], Pricing]:
    pricing = Pricing.load(cfg.llm.pricing or None)
    if replaying:
        return {}, pricing
    options = {"max_concurrency": cfg.llm.max_concurrency, "timeout_s": cfg.llm.timeout_s,
               "max_retries": cfg.llm.max_retries, "pricing": pricing,
               "temperature": cfg.llm.temperature, "max_tokens": cfg.llm.max_tokens,
               "retry_wait_s": cfg.llm.retry_wait_s}
    main = LLMClient(cfg.llm.model, **options)
    fixer = LLMClient(cfg.llm.fixer, **options) if cfg.llm.fixer else main
    return {"brainstorm": main, "optimize": main, "evolve": main, "plan": main,
            "fix": fixer}, pricing


def task_result(store: RunStore, task: str, exhausted: bool = False, *,
                stopped: bool = False) -> OptimizeResult:
    """What the store holds for one task: its best correct candidate, spend and verdicts."""
    best = store.best(task)  # the confirmed best, where the search's top was confirmed
    verdict = best.verdict if best else None
    queries, dollars = store.spent(task)
    counts = Counter(r.verdict.status for r in store.candidates(task) if r.verdict)
    return OptimizeResult(run_dir=store.path.parent, task=task,
                          best_source=best.source if best else None,
                          best_verdict=verdict, queries=queries, best_candidate=best.id
                          if best else None, dollars=dollars, verdicts=dict(counts),
                          replay_exhausted=exhausted, stopped=stopped)


def summary_row(store: RunStore, result: OptimizeResult) -> dict[str, Any]:
    v = result.best_verdict
    return {"task": result.task, "best_candidate": result.best_candidate,
            "speedup": v.speedup if v else None,
            # the speedup above comes from the window that confirmed the best (when
            # confirmed); the search's own figure for it:
            "confirmed": bool(v and v.confirmed),
            "search_speedup": v.search_speedup if v and v.confirmed else None,
            # a correct best that is slower than eager is no reason to replace the module
            "faster_than_eager": bool(v and v.speedup and v.speedup >= 1.0),
            "runtime_ms": v.runtime.median_ms if v and v.runtime else None,
            "queries": result.queries, "dollars": result.dollars, "verdicts": result.verdicts}


def write_outputs(store: RunStore, result: OptimizeResult) -> None:
    """best.py and summary.json of a one-task run."""
    run_dir = store.path.parent
    if result.best_source is not None:
        (run_dir / "best.py").write_text(result.best_source)
    (run_dir / "summary.json").write_text(json.dumps(summary_row(store, result), indent=2))


def stored_tasks(store: RunStore) -> list[Task]:
    """The run's tasks, read again from their files, which must not have changed."""
    tasks = []
    for row in store.tasks():
        task = Task.from_file(row["path"])
        if task.sha256 != row["sha256"]:
            raise TaskError(f"{row['path']}: the task file changed since the run started; "
                            "resume needs the same task")
        tasks.append(task)
    if not tasks:
        raise TaskError(f"{store.path}: the run has no task")
    return tasks


def _stored_task(store: RunStore) -> Task:
    return stored_tasks(store)[0]


def stamp() -> str:
    return dt.datetime.now().strftime("%Y%m%d-%H%M%S")


def new_run_dir(runs_dir: Path, name: str) -> Path:
    """Where a new run goes when no dir is given: NAME-<date>-<time> in the runs folder."""
    return runs_dir / f"{name}-{stamp()}"
