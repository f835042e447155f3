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
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from pike.agents import (
    AgentContext,
    brainstorm_messages,
    extract_ideas,
    extract_module,
    fix_messages,
    optimize_messages,
)
from pike.config import BranchingConfig
from pike.evaluate.verdict import Verdict
from pike.search.querier import Querier, RecordedCall

NO_CODE = ("the reply had no ```python block defining ModelNew; answer with one complete "
           "module in a single fenced block")


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


class BranchingSearch:
    def __init__(self, store: Any, task_name: str, querier: Querier, ctx: AgentContext,
                 cfg: BranchingConfig, judge: Callable[[str], Verdict], concurrency: int,
                 on_event: Callable[..., None] = lambda kind, **data: None) -> None:
        self.store, self.task = store, task_name
        self.querier, self.ctx, self.cfg = querier, ctx, cfg
        self.judge, self.concurrency, self.on_event = judge, concurrency, on_event

    # ---- the search -------------------------------------------------------------------

    def run(self) -> None:
        self._judge_pending()
        round_ = 0
        while self.querier.ledger.has_room():
            branches = self._plan(round_)
            if branches is None:
                return
            self.on_event("round", round=round_, branches=len(branches))
            calls = self._ask_parallel([(f"optimize:{round_}:{b.index}",
                                         optimize_messages(self.ctx, b.seed.source,
                                                           b.seed.verdict, b.idea))
                                        for b in branches])
            latest: dict[int, int] = {}
            for branch, call in zip(branches, calls, strict=True):
                if call is not None:
                    latest[branch.index] = self._candidate(call, branch.seed.candidate_id,
                                                           "optimize", round_, branch.index,
                                                           branch.idea or "")
            self._fix(round_, latest)
            if not latest:
                return  # no call of this round could be made: the budget is spent
            round_ += 1

    def _plan(self, round_: int) -> list[Branch] | None:
        if round_ == 0:
            ideas = self._ideas()
            if ideas is None:
                return None
            reference = Seed(None, None, None)
            return [Branch(b, reference, ideas[b % len(ideas)] if ideas else None)
                    for b in range(self.cfg.branches)]
        seeds = self._seeds()
        shares = _spread(self.cfg.branches, len(seeds))
        plan, index = [], 0
        for seed, share in zip(seeds, shares, strict=True):
            for _ in range(share):
                plan.append(Branch(index, seed, None))
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

    def _fix(self, round_: int, latest: dict[int, int]) -> None:
        for attempt in range(1, self.cfg.max_fix_attempts + 1):
            failing = {b: cid for b, cid in latest.items() if not self._ok(cid)}
            if not failing or not self.querier.ledger.has_room():
                return
            asks = []
            for branch, cid in failing.items():
                row = self.store.candidate(cid)
                asks.append((f"fix:{round_}:{branch}:{attempt}",
                             fix_messages(self.ctx, row.source, row.verdict)))
            calls = self._ask_parallel(asks)
            for (branch, cid), call in zip(failing.items(), calls, strict=True):
                if call is not None:
                    latest[branch] = self._candidate(call, cid, "fix", round_, branch, "")
                    if self._ok(latest[branch]):
                        self.on_event("rescued", branch=branch, attempt=attempt)

    # ---- candidates and verdicts ------------------------------------------------------

    def _ask_parallel(self, asks: list[tuple[str, list[dict[str, str]]]]
                      ) -> list[RecordedCall | None]:
        if not asks:
            return []
        with ThreadPoolExecutor(max_workers=min(self.concurrency, len(asks))) as pool:
            return list(pool.map(lambda kv: self.querier.ask(*kv), asks))

    def _candidate(self, call: RecordedCall, parent_id: int | None, role: str, round_: int,
                   branch: int, idea: str) -> int:
        """The candidate made from this call's reply (created once), judged."""
        for row in self.store.candidates(self.task):
            if row.llm_call_id == call.id:
                break
        else:
            source = extract_module(call.reply) if not call.error else None
            cid = self.store.add_candidate(self.task, source or "", parent_id=parent_id,
                                           role=role, round=round_, branch=branch, idea=idea,
                                           llm_call_id=call.id)
            row = self.store.candidate(cid)
        if row.verdict is None:
            self._judge(row.id, row.source, call.error)
        return row.id

    def _judge(self, cid: int, source: str, call_error: str | None) -> None:
        if call_error:
            verdict = Verdict(status="compile_error", phase="load",
                              message=f"the LLM call failed: {call_error}")
        elif not source.strip():
            verdict = Verdict(status="compile_error", phase="load", message=NO_CODE)
        else:
            verdict = self.judge(source)
        self.store.set_verdict(cid, verdict)
        self.on_event("verdict", candidate=cid, verdict=verdict)

    def _judge_pending(self) -> None:
        for row in self.store.pending(self.task):
            self._judge(row.id, row.source, None)

    def _ok(self, cid: int) -> bool:
        verdict = self.store.candidate(cid).verdict
        return verdict is not None and verdict.ok

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
