"""LLMCall: the record of one chat request, kept by the run store whether it worked or not."""

from __future__ import annotations

from pydantic import BaseModel, Field


class PromptParts(BaseModel):
    """How a prompt was assembled from its parts under the token budget (agents/prompt.py);
    tokens are estimated, 4 characters each."""

    budget: int | None = Field(None, description="the prompt's token budget; None = no limit")
    total: int = Field(0, description="all messages, the template's own words included")
    tokens: dict[str, int] = Field(default_factory=dict, description="part -> tokens kept; "
                                   "'frame' is the template's own words")
    trimmed: dict[str, int] = Field(default_factory=dict,
                                    description="part -> its tokens before it was cut to fit")
    dropped: dict[str, int] = Field(default_factory=dict,
                                    description="part -> the tokens it would have taken")


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
    prompt_parts: PromptParts | None = None  # None: the prompt was not built from parts

    @property
    def ok(self) -> bool:
        return self.error is None
