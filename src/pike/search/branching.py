"""PIKE-B: the exploit-heavy branching search.

Round 0 asks the brainstormer for ideas and sends one optimizer query per branch, one idea
each, from the reference. Every failing candidate gets error-fixer queries until it passes
or its attempts run out. Correct candidates are ranked by runtime (the best of each branch
first); the top k seed the next round, whose branches are spread over them, more to the
better ones, with the reference as a fallback seed. It ends when the budget is spent.

Every decision is derived from what the store holds, so a resumed search re-walks the
same path, finds the calls and verdicts it already has, and only does what is missing.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pike.agents import AgentContext, brainstorm_messages, extract_ideas, optimize_messages
from pike.config import BranchingConfig
from pike.evaluate.verdict import Verdict
from pike.search.base import Judge, LLMSearch
from pike.search.querier import Querier


@dataclass
class Seed:
    candidate_id: int | None  # None: the reference itself
    source: str | None
    verdict: Verdict | None


@dataclass
class Branch:
    index: int
    seed: Seed
    idea: str | None


class BranchingSearch(LLMSearch):
    def __init__(self, store: Any, task_name: str, querier: Querier, ctx: AgentContext,
                 cfg: BranchingConfig, judge: Judge, concurrency: int,
                 on_event: Callable[..., None] = lambda kind, **data: None,
                 first_seeds: list[Seed] | None = None) -> None:
        super().__init__(store, task_name, querier, ctx, judge, concurrency,
                         cfg.max_fix_attempts, on_event)
        self.cfg = cfg
        self.first_seeds = list(first_seeds or [])

    # ---- the search -------------------------------------------------------------------

    def run(self) -> None:
        self.judge_pending()
        self.fix_seeds()
        round_ = 0
        while self.querier.ledger.has_room():
            branches = self._plan(round_)
            if branches is None:
                return
            self.on_event("round", round=round_, branches=len(branches))
            calls = self.ask_parallel([(f"optimize:{round_}:{b.index}",
                                         optimize_messages(self.ctx, b.seed.source,
                                                           b.seed.verdict, b.idea))
                                        for b in branches])
            made = [(call, branch.seed.candidate_id, "optimize", round_, branch.index,
                     branch.idea or "")
                    for branch, call in zip(branches, calls, strict=True) if call is not None]
            latest = {m[4]: cid for m, cid in zip(made, self.candidates(made), strict=True)}
            self.fix_chains(round_, latest)
            if not latest:
                return  # no call of this round could be made: the budget is spent
            round_ += 1

    def _plan(self, round_: int) -> list[Branch] | None:
        if round_ == 0:
            seeds = self._round0_seeds()
            ideas = (self.plan(0, seeds[0].source, seeds[0].verdict, self.cfg.branches)
                     if self.planner else self._ideas())
            if ideas is None:
                return None
            return [Branch(b, seeds[b % len(seeds)], ideas[b % len(ideas)] if ideas else None)
                    for b in range(self.cfg.branches)]
        seeds = self._seeds()
        steps: list[str] = []
        if self.planner:  # steps planned from the best seed, shared by this round's branches
            planned = self.plan(round_, seeds[0].source, seeds[0].verdict, self.cfg.branches)
            if planned is None:
                return None
            steps = planned
        shares = _spread(self.cfg.branches, len(seeds))
        plan, index = [], 0
        for seed, share in zip(seeds, shares, strict=True):
            for _ in range(share):
                plan.append(Branch(index, seed, steps[index % len(steps)] if steps else None))
                index += 1
        return plan

    def _ideas(self) -> list[str] | None:
        if not self.cfg.brainstorm:
            return []
        call = self.querier.ask("brainstorm:0", brainstorm_messages(self.ctx,
                                                                    self.cfg.branches))
        if call is None:
            return None
        ideas = extract_ideas(call.reply, self.cfg.branches)
        self.on_event("ideas", ideas=ideas)
        return ideas

    # ---- seeds -------------------------------------------------------------------------

    def _round0_seeds(self) -> list[Seed]:
        """The seeds given (offline best, a solution set's correct files) and the fixer's
        correct repairs of failing set files; the reference when there are none."""
        seeds = list(self.first_seeds)
        known = {s.candidate_id for s in seeds}
        for row in self.store.candidates(self.task):
            if (row.role == "fix" and row.round == -1 and row.verdict is not None
                    and row.verdict.ok and row.id not in known):
                seeds.append(Seed(row.id, row.source, row.verdict))
        return seeds or [Seed(None, None, None)]

    def _seeds(self) -> list[Seed]:
        """Top k correct candidates, the best of each branch first; the reference fills up."""
        ok = [r for r in self.store.candidates(self.task)
              if r.verdict is not None and r.verdict.ok and r.verdict.runtime is not None]
        ok.sort(key=lambda r: r.verdict.runtime.median_ms)
        firsts, rest, seen = [], [], set()
        for row in ok:
            lineage = (row.round, row.branch)
            (rest if lineage in seen else firsts).append(row)
            seen.add(lineage)
        chosen = (firsts + rest)[:self.cfg.top_k]
        seeds = [Seed(r.id, r.source, r.verdict) for r in chosen]
        if len(seeds) < self.cfg.top_k:
            seeds.append(Seed(None, None, None))
        return seeds


def _spread(total: int, seeds: int) -> list[int]:
    """Queries per seed, in rank order: weights k, k-1, ..., 1 (largest remainders)."""
    weights = list(range(seeds, 0, -1))
    exact = [total * w / sum(weights) for w in weights]
    shares = [math.floor(x) for x in exact]
    order = sorted(range(seeds), key=lambda i: (shares[i] - exact[i], i))
    for i in order[:total - sum(shares)]:
        shares[i] += 1
    return shares
