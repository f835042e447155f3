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
from pike.evaluate.pool import Pool, make_pool, one_line
from pike.evaluate.verdict import Verdict, says_out_of_memory
from pike.llm import LLMClient, Pricing, resolve_spec
from pike.search.branching import BranchingSearch, Seed
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


def confirm_best(store: RunStore, task: Task, cfg: RunConfig) -> None:
    """Time the search's top candidates and eager again in one window (evaluate/confirm.py)
    and keep the figures in the store; a resumed run with the same top keeps them."""
    top = confirm_candidates(store.candidates(task.name), cfg.search,
                             fastest_mode(store.get_state(task.name, BASELINE_STATE)))
    if not top:
        return
    ids = [r.id for r in top]
    kept = store.get_state(task.name, "confirmed")
    if isinstance(kept, dict) and kept.get("candidates") == ids:
        return
    from pike.evaluate.confirm import confirm

    sources = {r.id: r.source for r in top}
    searched = {r.id: r.verdict.speedup or 0.0 for r in top}
    found = confirm(task, sources, cfg.eval)
    failed = _failed_above_the_best(found, searched)
    if any(says_out_of_memory(c.error) for c in found) and not due():
        # its children were loaded beside other evaluations: one window more, as a
        # candidate that ran out in a crowded pool is judged once more
        log.warning("%s: a confirmed candidate ran out of GPU memory; the window is timed "
                    "once more", task.name)
        found = confirm(task, sources, cfg.eval)
    elif failed and not due():
        # Judged correct and faster in its own window, it failed in this one: on the H100
        # pike's own compile:default (2.38x) crashed there beside three other tasks, its
        # message cut short, and a 1.27x file became the task's best. A window more.
        log.warning("%s: candidate %d failed in the confirming window (%s); the window is "
                    "timed once more", task.name, failed[0], _error_line(failed[1]))
        found = confirm(task, sources, cfg.eval)
    _keep_what_the_window_caught(store, task, found)
    failed = _failed_above_the_best(found, searched)
    if failed:
        after = ("the best is the fastest one confirmed" if any(c.speedup for c in found)
                 else "no candidate was confirmed: the search's own figures stand")
        log.warning("%s: candidate %d (%.2fx in its search window) failed in the confirming "
                    "window (%s); %s", task.name, failed[0], searched[failed[0]],
                    _error_line(failed[1]), after)
    store.set_state(task.name, "confirmed", {"candidates": ids,
                                             "figures": [c.model_dump() for c in found]})


def _keep_what_the_window_caught(store: RunStore, task: Task, found: list[Any]) -> None:
    """A candidate whose trials (on inputs the search never drew) or timed calls (wrong
    sampled outputs, reused answers) were caught in the confirming window gets that
    verdict in the store, in place of its search
    window's `ok`: a file that told the two windows apart must not come back as the
    task's best by its search figure where no other candidate was confirmed."""
    for confirmation in found:
        if not confirmation.caught:
            continue
        row = store.candidate(confirmation.candidate_id)
        if row.verdict is None:
            continue
        log.warning("%s: candidate %d was caught in the confirming window (%s)", task.name,
                    confirmation.candidate_id, _error_line(confirmation.error))
        store.set_verdict(confirmation.candidate_id, row.verdict.model_copy(update={
            "status": confirmation.caught, "phase": confirmation.caught_in, "speedup": None,
            "runtime": None, "message": "in the confirming window: " + confirmation.error}))


def _failed_above_the_best(found: list[Any], searched: dict[int, float]
                           ) -> tuple[int, str] | None:
    """Of the candidates that failed in the confirming window although their search-time
    figure is above that of the confirmed best (or any, where none was confirmed), the
    one with the highest: a failure that changes which file is the task's best. One a
    guard caught is left out: another window would not undo it."""
    best = next((searched.get(c.candidate_id, 0.0) for c in found if c.speedup), 0.0)
    above = [c for c in found if not c.speedup and not c.caught
             and searched.get(c.candidate_id, 0.0) > best]
    first = max(above, key=lambda c: searched.get(c.candidate_id, 0.0), default=None)
    return (first.candidate_id, first.error) if first else None


def _error_line(message: str) -> str:
    """A failure's first line and, where it goes on, its last (a child's message ends with
    its error, after its stderr's traceback)."""
    lines = [line.strip() for line in message.strip().splitlines() if line.strip()]
    if len(lines) <= 1:
        return one_line(message)
    return f"{one_line(lines[0])} ... {one_line(lines[-1])}"


def confirm_candidates(rows: list[Any], cfg: SearchConfig, mode: str | None = None
                       ) -> list[Any]:
    """Which candidates the confirming window takes: the `confirm_top` best by search-time
    speedup, and any other within `confirm_within` of the best, `confirm_max` at most;
    and the offline candidate of `mode` (the task's fastest torch.compile mode in its
    baseline, `fastest_mode`) wherever the search judged it correct, whatever its
    figure there. In its own window beside other searches a compile mode can measure
    far below what it does alone (max-autotune's kernels picked in a busy pool ran 22%
    slower, contamination-h200-alone.md), and the offline level3-pike set audited alone
    had 17 files below their task's fastest mode (the CNNs' CUDA graphs around eager at
    0.69x to 0.86x of reduce-overhead). Timed in the same window as the search's best, the mode is the best where it is
    faster, so a search's result is not below the mode alone. It comes on top of
    `confirm_max`; where nothing is rankable there is no window at all. Only pike's own
    rendering of the mode (role 'offline'): a window checks less than a verdict, and such
    a file is the reference wrapped in torch.compile."""
    ranked = sorted((r for r in rows if r.role != "reference" and r.verdict is not None
                     and r.verdict.rankable and r.verdict.speedup),
                    key=lambda r: (-(r.verdict.speedup or 0.0), r.id))
    if not ranked or cfg.confirm_top == 0:
        return []
    near = (1.0 - cfg.confirm_within) * ranked[0].verdict.speedup
    chosen = [r for i, r in enumerate(ranked)
              if i < cfg.confirm_top or r.verdict.speedup >= near]
    chosen = chosen[:max(cfg.confirm_top, cfg.confirm_max)]
    # one beyond confirm_max; a window cut short behind the best counts, a hopeless one not
    floor = next((r for r in rows if mode and r.role == "offline" and r.idea == mode
                  and r.verdict is not None and r.verdict.comparable), None)
    if floor is not None and all(r.id != floor.id for r in chosen):
        chosen.append(floor)
    return chosen


def fastest_mode(baseline: object) -> str | None:
    """The torch.compile mode a stored baseline found fastest among those it checked
    against eager and found correct; None where none was (or no baseline is stored)."""
    rows = [m for m in _compile_rows(baseline) if m.get("checked") is True
            and not m.get("error") and isinstance(m.get("speedup_vs_eager"), (int, float))]
    return str(max(rows, key=lambda m: m["speedup_vs_eager"])["mode"]) if rows else None


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


def compile_build_seconds(baseline: object) -> dict[str, float]:
    """Each torch.compile mode's build seconds in a stored baseline (pre-build included)."""
    return {m["mode"]: float(m["build_s"]) for m in _compile_rows(baseline)
            if isinstance(m.get("build_s"), (int, float))}


def compile_speedups(baseline: object) -> dict[str, float]:
    """Each torch.compile mode's speedup over eager in a stored baseline (a campaign
    measures every task's before its search); empty where there is none."""
    return {m["mode"]: float(m["speedup_vs_eager"]) for m in _compile_rows(baseline)
            if isinstance(m.get("speedup_vs_eager"), (int, float))}


def _compile_rows(baseline: object) -> list[dict[str, Any]]:
    """A stored baseline's torch.compile modes, as stored; none where it is not one."""
    if not isinstance(baseline, dict):
        return []
    return [m for m in baseline.get("modes", [])
            if isinstance(m, dict) and str(m.get("mode", "")).startswith("compile:")]


# A compile mode its baseline found under this much faster than eager is not judged alone.
NO_GAIN = 1.05


def no_gain_modes(baseline: object) -> dict[str, float]:
    """torch.compile modes the task's baseline measured, checked against eager, and found
    no faster than eager (under NO_GAIN): their speedup there. Judged alone, each would
    hold a lane for a build of a minute or more to say what the baseline said; the offline
    search tries them only in company of its best set (or alone where nothing else is
    correct). A mode measured before pike checked modes (`checked` missing) is not one."""
    return {str(m["mode"]): float(m["speedup_vs_eager"]) for m in _compile_rows(baseline)
            if m.get("checked") is True and not m.get("error")
            and isinstance(m.get("speedup_vs_eager"), (int, float))
            and m["speedup_vs_eager"] < NO_GAIN}


def hopeless_modes(baseline: object, timeouts: bool = True) -> dict[str, str]:
    """torch.compile modes not worth a candidate, with why: the task's baseline found the
    mode answering otherwise than eager on the check trials' inputs (a candidate of it is
    judged on the same ones), or, with `timeouts` (the baseline's build limit is at least
    the candidate's, whose compile runs in its check phase), its build making no progress
    for that limit with every build core (a candidate builds with fewer and would hold its
    lane that long to fail the same way)."""
    found = {}
    for m in _compile_rows(baseline):
        error = str(m.get("error") or "")
        if error.startswith("incorrect:") or timeouts and "no progress for" in error:
            found[str(m["mode"])] = error.splitlines()[0][:160]
    return found


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
