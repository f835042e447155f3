"""The budget ledger: every LLM call of every role counts, in queries and in dollars.

What was spent is read from the run store (so a resumed run starts from what it already
spent). Each call is counted in the store before it is sent (a reservation at its
estimated cost) and settled when its reply is recorded, so parallel calls cannot together
overshoot the budget, and calls in flight at a crash stay counted: a resumed run never
sends more requests, or more dollars' worth, than the budget.
"""

from __future__ import annotations

import threading
from typing import Protocol

from pike.search.drain import due


class SpendSource(Protocol):
    def spent(self, task: str) -> tuple[int, float]: ...

    def reserve_call(self, task: str, reserved_usd: float) -> int: ...

    def settle_call(self, pending_id: int, task: str, call: object | None) -> int | None: ...


class Ledger:
    def __init__(self, store: SpendSource, task: str, budget_queries: int | None,
                 budget_dollars: float | None) -> None:
        self.store, self.task = store, task
        self.budget_queries, self.budget_dollars = budget_queries, budget_dollars
        self._lock = threading.Lock()

    def spent(self) -> tuple[int, float]:
        return self.store.spent(self.task)

    def reserve(self, estimated_cost: float) -> int | None:
        """Count one call of about this cost in the store before it is sent; its
        reservation's id, or None when the budget has no room."""
        with self._lock:
            if due():  # a campaign's time limit: no new query
                return None
            queries, dollars = self.spent()
            if self.budget_queries is not None and queries + 1 > self.budget_queries:
                return None
            if (self.budget_dollars is not None
                    and dollars + estimated_cost > self.budget_dollars):
                return None
            return self.store.reserve_call(self.task, estimated_cost)

    def settle(self, pending_id: int, call: object | None) -> int | None:
        """The reserved call is over: record it (None: it was never sent) in place of its
        reservation, in one step; the recorded call's id."""
        with self._lock:
            return self.store.settle_call(pending_id, self.task, call)

    def has_room(self) -> bool:
        if due():
            return False
        with self._lock:
            queries, dollars = self.spent()
            if self.budget_queries is not None and queries >= self.budget_queries:
                return False
            return self.budget_dollars is None or dollars < self.budget_dollars

    def describe(self) -> str:
        queries, dollars = self.spent()
        q = f"{queries}/{self.budget_queries}" if self.budget_queries else str(queries)
        d = f"${dollars:.2f}/${self.budget_dollars:.2f}" if self.budget_dollars else f"${dollars:.2f}"
        return f"{q} queries, {d}"
