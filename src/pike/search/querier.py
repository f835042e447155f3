"""Every LLM call a search makes goes through here: budget, key, record, or replay.

Each call has a key that says where in the search it belongs ("brainstorm:0",
"optimize:2:5", "fix:2:5:1"), stored as the call's role. A resumed search finds the
calls it already made by key and does not make them again; a replayed search takes the
reply recorded under the same key in another run instead of asking a model.
"""

from __future__ import annotations

import datetime as dt
import logging
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol

from pike.llm.call import PromptParts

log = logging.getLogger(__name__)

Messages = list[dict[str, str]]


class CallLike(Protocol):
    role: str
    reply: str
    error: str | None
    cost_usd: float


class Client(Protocol):
    def complete(self, messages: Messages, *, role: str) -> Any: ...


class RecordedCall:
    """A call as the store holds it (attribute access over a row)."""

    def __init__(self, row: dict[str, Any]) -> None:
        self.id: int = int(row["id"])
        self.role: str = row["role"]
        self.model: str = row.get("model", "")
        self.messages: Messages = row.get("messages") or []
        self.reply: str = row.get("reply") or ""
        self.tokens_in: int = int(row.get("tokens_in") or 0)
        self.tokens_out: int = int(row.get("tokens_out") or 0)
        self.latency_s: float = float(row.get("latency_s") or 0.0)
        self.cost_usd: float = float(row.get("cost_usd") or 0.0)
        self.error: str | None = row.get("error")
        self.started_at: str = row.get("started_at") or ""
        parts = row.get("prompt_parts")
        self.prompt_parts = PromptParts.model_validate(parts) if parts else None


class ReplayExhausted(Exception):
    """The recorded run has no reply for this point of the search."""


class Querier:
    def __init__(self, store: Any, task: str, ledger: Any, clients: dict[str, Client],
                 estimate: Any, replay_from: dict[str, RecordedCall] | None = None) -> None:
        self.store, self.task, self.ledger = store, task, ledger
        self.clients = clients  # by role: "brainstorm", "optimize", "fix"
        self.estimate = estimate  # (role, messages) -> estimated dollars
        self.replay_from = replay_from

    def recorded(self) -> dict[str, RecordedCall]:
        return {row["role"]: RecordedCall(row) for row in self.store.llm_calls(self.task)}

    def ask(self, key: str, messages: Messages) -> RecordedCall | None:
        """The call for `key`: already recorded, replayed, or made now; None if no budget."""
        return self.ask_many([(key, messages)], concurrency=1)[0]

    def ask_many(self, asks: list[tuple[str, Messages]],
                 concurrency: int) -> list[RecordedCall | None]:
        """Several calls at once. Budget is reserved in the order given, before any call
        starts, so which asks get room never depends on thread timing: a resumed or
        replayed search grants the same ones."""
        recorded = self.recorded()
        plan: list[tuple[str, str, Messages, int] | None] = []
        results: list[RecordedCall | None] = []
        for key, messages in asks:
            role = key.split(":", 1)[0]
            pending = None if key in recorded else self.ledger.reserve(
                self.estimate(role, messages))
            plan.append((key, role, messages, pending) if pending is not None else None)
            results.append(recorded.get(key))
        todo = [i for i, item in enumerate(plan) if item is not None]
        if not todo:
            return results
        with ThreadPoolExecutor(max_workers=max(1, min(concurrency, len(todo)))) as pool:
            futures = {i: pool.submit(self._complete, *plan[i]) for i in todo}  # type: ignore[misc]
            for i, future in futures.items():
                results[i] = future.result()
        return results

    def _complete(self, key: str, role: str, messages: Messages,
                  pending: int) -> RecordedCall | None:
        try:
            call = self._make(key, role, messages)
        except ReplayExhausted:
            self.ledger.settle(pending, None)  # nothing was sent
            raise
        # An interrupt mid-call leaves the reservation: the request may have been billed.
        call_id = self.ledger.settle(pending, call)
        if call.error:
            log.warning("LLM call %s failed: %s", key, call.error)
        return self.recorded()[key] if call_id is not None else None

    def _make(self, key: str, role: str, messages: Messages) -> Any:
        if self.replay_from is not None:
            old = self.replay_from.get(key)
            if old is None:
                raise ReplayExhausted(key)
            old.started_at = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
            return old  # with the messages, and the parts, that the recorded run sent
        call = self.clients[role].complete(messages, role=key)
        # A prompt built by agents/prompt.py says how it was assembled; keep that with it.
        call.prompt_parts = getattr(messages, "parts", None)
        return call
