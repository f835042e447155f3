"""What every LLM strategy shares: asking in parallel, turning replies into judged
candidates exactly once, and the error fixer's chains (counted in the same budget).

Strategies derive every decision from the store, so a resumed search re-walks its path,
finds the calls and verdicts it already has, and only does what is missing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

from pike.agents import (
    AgentContext,
    extract_ideas,
    extract_module,
    fix_messages,
    plan_ideas,
    planner_messages,
)
from pike.evaluate import search_bar
from pike.evaluate.verdict import Verdict
from pike.search.querier import Querier, RecordedCall

# Judges a batch of sources: (index, verdict) pairs as they finish (an evaluation pool).
Judge = Callable[[Sequence[str]], Iterator[tuple[int, Verdict]]]

NO_CODE = ("the reply had no ```python block defining ModelNew; answer with one complete "
           "module in a single fenced block")


class LLMSearch:
    def __init__(self, store: Any, task_name: str, querier: Querier, ctx: AgentContext,
                 judge: Judge, concurrency: int, max_fix_attempts: int,
                 on_event: Callable[..., None] = lambda kind, **data: None) -> None:
        self.store, self.task = store, task_name
        self.querier, self.ctx = querier, ctx
        self.judge, self.concurrency = judge, concurrency
        self.max_fix_attempts, self.on_event = max_fix_attempts, on_event
        self.fix_first: list[int] = []  # failing seed candidates for the fixer (--fix-seeds)
        self.planner = False  # --planner: a planner call before each round or generation
        self.plan_granularity = "one"
        # the task's key in search_bar while the search holds its bar (session.py): each
        # verdict raises it, and a candidate far behind it is timed for a few rounds
        self.bar_key: str | None = None

    def ask_parallel(self, asks: list[tuple[str, list[dict[str, str]]]]
                     ) -> list[RecordedCall | None]:
        if not asks:
            return []
        return self.querier.ask_many(asks, self.concurrency)

    def candidates(self, made: Sequence[tuple[RecordedCall, int | None, str, int, int, str]]
                   ) -> list[int]:
        """The candidates made from these calls' replies (each created once), given as
        (call, parent id, role, round, branch, idea), judged together: a pool builds and
        compiles them at once."""
        ids = [self._row(*m) for m in made]
        self._judge_rows([(cid, call.error) for cid, (call, *_) in zip(ids, made, strict=True)])
        return ids

    def _row(self, call: RecordedCall, parent_id: int | None, role: str, round_: int,
             branch: int, idea: str) -> int:
        for row in self.store.candidates(self.task):
            if row.llm_call_id == call.id:
                return int(row.id)
        source = extract_module(call.reply) if not call.error else None
        return self.store.add_candidate(self.task, source or "", parent_id=parent_id,
                                        role=role, round=round_, branch=branch, idea=idea,
                                        llm_call_id=call.id)

    def _judge_rows(self, rows: Sequence[tuple[int, str | None]]) -> None:
        """Verdicts for the rows that have none; each is stored as soon as it is ready."""
        todo = []
        for cid, call_error in rows:
            row = self.store.candidate(cid)
            if row.verdict is not None:
                continue
            if call_error:
                self._record(cid, Verdict(status="compile_error", phase="load",
                                          message=f"the LLM call failed: {call_error}"))
            elif not row.source.strip():
                self._record(cid, Verdict(status="compile_error", phase="load",
                                          message=NO_CODE))
            else:
                todo.append(row)
        for i, verdict in self.judge([r.source for r in todo]):
            self._record(todo[i].id, verdict)

    def _record(self, cid: int, verdict: Verdict) -> None:
        self.store.set_verdict(cid, verdict)
        if self.bar_key is not None and verdict.rankable and verdict.speedup:
            search_bar.raise_to(self.bar_key, verdict.speedup)
        self.on_event("verdict", candidate=cid, verdict=verdict)

    def judge_pending(self) -> None:
        self._judge_rows([(row.id, None) for row in self.store.pending(self.task)])

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
            made, slots = [], []
            for (slot, cid), call in zip(failing.items(), calls, strict=True):
                if call is not None:
                    made.append((call, cid, "fix", round_, self.store.candidate(cid).branch, ""))
                    slots.append(slot)
            for slot, fixed in zip(slots, self.candidates(made), strict=True):
                latest[slot] = fixed
                if self.ok(fixed):
                    self.on_event("rescued", branch=slot, attempt=attempt)
