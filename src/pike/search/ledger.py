"""The budget ledger: every LLM call of every role counts, in queries and in dollars.

What was spent is read from the run store (so a resumed run starts from what it already
spent); calls in flight are reserved here before they are sent, so parallel calls cannot
together overshoot the budget.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Protocol, TypeVar

T = TypeVar("T")


class SpendSource(Protocol):
    def spent(self, task: str) -> tuple[int, float]: ...


class Ledger:
    def __init__(self, store: SpendSource, task: str, budget_queries: int | None,
                 budget_dollars: float | None) -> None:
        self.store, self.task = store, task
        self.budget_queries, self.budget_dollars = budget_queries, budget_dollars
        self._lock = threading.Lock()
        self._reserved_queries = 0
        self._reserved_dollars = 0.0

    def spent(self) -> tuple[int, float]:
        return self.store.spent(self.task)

    def reserve(self, estimated_cost: float) -> bool:
        """Hold room for one call of about this cost; False when the budget has no room."""
        with self._lock:
            queries, dollars = self.spent()
            if (self.budget_queries is not None
                    and queries + self._reserved_queries + 1 > self.budget_queries):
                return False
            if (self.budget_dollars is not None and dollars + self._reserved_dollars
                    + estimated_cost > self.budget_dollars):
                return False
            self._reserved_queries += 1
            self._reserved_dollars += estimated_cost
            return True

    def release(self, estimated_cost: float, record: Callable[[], T] | None = None) -> T | None:
        """The reserved call is over: record it (if given) and drop the reservation in one
        step, so that no other thread sees the call counted twice or not at all."""
        with self._lock:
            try:
                return record() if record is not None else None
            finally:
                self._reserved_queries -= 1
                self._reserved_dollars -= estimated_cost

    def has_room(self) -> bool:
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
