"""LLMCall: the record of one chat request, kept by the run store whether it worked or not."""

from __future__ import annotations

from pydantic import BaseModel


class LLMCall(BaseModel):
    """One chat completion as sent and received, with its tokens, time and cost."""

    role: str  # which agent asked: 'brainstorm' | 'optimize' | 'fix' | ...
    model: str  # the spec string, as the user wrote it
    messages: list[dict[str, str]]
    reply: str = ""
    tokens_in: int = 0
    tokens_out: int = 0
    latency_s: float = 0.0  # from the first attempt to the last answer, retries included
    cost_usd: float = 0.0
    error: str | None = None  # one line, set when the call failed (after any retries)
    started_at: str = ""  # ISO 8601 UTC, when the first attempt was sent

    @property
    def ok(self) -> bool:
        return self.error is None
