"""What every LLM strategy shares: asking in parallel, turning replies into judged
candidates exactly once, and the error fixer's chains (counted in the same budget).

Strategies derive every decision from the store, so a resumed search re-walks its path,
finds the calls and verdicts it already has, and only does what is missing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pike.agents import (
    AgentContext,
    extract_ideas,
    extract_module,
    fix_messages,
    plan_ideas,
    planner_messages,
)
from pike.evaluate.verdict import Verdict
from pike.search.querier import Querier, RecordedCall

NO_CODE = ("the reply had no ```python block defining ModelNew; answer with one complete "
           "module in a single fenced block")


class LLMSearch:
    def __init__(self, store: Any, task_name: str, querier: Querier, ctx: AgentContext,
                 judge: Callable[[str], Verdict], concurrency: int, max_fix_attempts: int,
                 on_event: Callable[..., None] = lambda kind, **data: None) -> None:
        self.store, self.task = store, task_name
        self.querier, self.ctx = querier, ctx
        self.judge, self.concurrency = judge, concurrency
        self.max_fix_attempts, self.on_event = max_fix_attempts, on_event
        self.fix_first: list[int] = []  # failing seed candidates for the fixer (--fix-seeds)
        self.planner = False  # --planner: a planner call before each round or generation
        self.plan_granularity = "one"

    def ask_parallel(self, asks: list[tuple[str, list[dict[str, str]]]]
                     ) -> list[RecordedCall | None]:
        if not asks:
            return []
        return self.querier.ask_many(asks, self.concurrency)

    def candidate(self, call: RecordedCall, parent_id: int | None, role: str, round_: int,
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

    def judge_pending(self) -> None:
        for row in self.store.pending(self.task):
            self._judge(row.id, row.source, None)

    def ok(self, cid: int) -> bool:
        verdict = self.store.candidate(cid).verdict
        return verdict is not None and verdict.ok

    def plan(self, round_: int, source: str | None, verdict: Verdict | None,
             queries: int) -> list[str] | None:
        """The planner's steps for this round's `queries` (None: the budget is spent). Its
        reply is recorded like every call, so resume and replay get the same plan."""
        count = max(queries, 4)
        call = self.querier.ask(f"plan:{round_}", planner_messages(self.ctx, source, verdict,
                                                                   count))
        if call is None:
            return None
        steps = extract_ideas(call.reply, count) if not call.error else []
        self.on_event("plan", steps=steps)
        return plan_ideas(steps, queries, self.plan_granularity)

    def fix_seeds(self) -> None:
        """Hand failing seed candidates (`--fix-seeds`) to the error fixer before round 0;
        the fixes are round -1, so both strategies treat the correct ones as seeds."""
        if self.fix_first:
            self.fix_chains(-1, dict(enumerate(self.fix_first)))

    def fix_chains(self, round_: int, latest: dict[int, int]) -> None:
        """Send each failing slot's latest candidate to the error fixer, up to
        max_fix_attempts times, while the budget has room; `latest` is updated in place."""
        for attempt in range(1, self.max_fix_attempts + 1):
            failing = {slot: cid for slot, cid in latest.items() if not self.ok(cid)}
            if not failing or not self.querier.ledger.has_room():
                return
            asks = []
            for slot, cid in failing.items():
                row = self.store.candidate(cid)
                asks.append((f"fix:{round_}:{slot}:{attempt}",
                             fix_messages(self.ctx, row.source, row.verdict)))
            calls = self.ask_parallel(asks)
            for (slot, cid), call in zip(failing.items(), calls, strict=True):
                if call is None:
                    continue
                parent = self.store.candidate(cid)
                latest[slot] = self.candidate(call, cid, "fix", round_, parent.branch, "")
                if self.ok(latest[slot]):
                    self.on_event("rescued", branch=slot, attempt=attempt)
