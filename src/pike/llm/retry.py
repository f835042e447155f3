"""Which API failures are worth retrying, how long to wait, and how to say what failed.

Retries are ours rather than the openai SDK's so that the policy is the same for every
provider, visible in one place, and testable with tiny waits.
"""

from __future__ import annotations

import http
import random
from collections.abc import Mapping

import openai
from tenacity import RetryCallState

# 408 and 429 are the server asking us to come back later; 5xx are its own failures.
_RETRY_STATUS = frozenset({408, 429})
_MAX_MESSAGE_CHARS = 200


def is_retryable(exc: BaseException) -> bool:
    """Rate limits, server errors, timeouts and dropped connections; never 4xx user errors."""
    if isinstance(exc, openai.APIConnectionError):  # includes APITimeoutError
        return True
    if isinstance(exc, openai.APIStatusError):
        return exc.status_code in _RETRY_STATUS or exc.status_code >= 500
    return False


class Backoff:
    """Exponential backoff from `initial_s`, plus up to 50% jitter, and at least what a
    Retry-After header asks for (both capped at `max_s`).

    Jitter spreads out the retries of many parallel searches that hit the same rate
    limit at once, so they do not all come back together.
    """

    def __init__(self, initial_s: float, max_s: float = 60.0) -> None:
        self.initial_s = initial_s
        self.max_s = max_s

    def __call__(self, state: RetryCallState) -> float:
        retry_index = state.attempt_number - 1
        wait = min(self.max_s, self.initial_s * 2**retry_index * random.uniform(1.0, 1.5))
        exc = state.outcome.exception() if state.outcome is not None else None
        asked = _retry_after_s(exc)
        if asked is not None:
            wait = max(wait, min(asked, self.max_s))
        return wait


def _retry_after_s(exc: BaseException | None) -> float | None:
    if not isinstance(exc, openai.APIStatusError):
        return None
    value = exc.response.headers.get("retry-after")
    try:
        seconds = float(value) if value is not None else None
    except ValueError:  # an HTTP date; rare for these APIs, fall back to our backoff
        return None
    return seconds if seconds is not None and seconds >= 0 else None


def describe(exc: BaseException, *, timeout_s: float, retries: int) -> str:
    """One line saying what went wrong, e.g.
    '429 Too Many Requests after 5 retries: Rate limit reached for gpt-5'."""
    detail: object = None
    if isinstance(exc, openai.APITimeoutError):
        head = f"timed out ({timeout_s:g} s limit)"
    elif isinstance(exc, openai.APIConnectionError):
        head = "connection error"
        detail = exc.__cause__ or exc.__context__ or exc.message
    elif isinstance(exc, openai.APIStatusError):
        try:
            head = f"{exc.status_code} {http.HTTPStatus(exc.status_code).phrase}"
        except ValueError:
            head = f"HTTP {exc.status_code}"
        detail = _server_message(exc.body)
    else:
        head, detail = type(exc).__name__, exc
    if retries:
        head += f" after {retries} {'retry' if retries == 1 else 'retries'}"
    return _one_line(f"{head}: {detail}" if detail else head)


def _server_message(body: object) -> str | None:
    # OpenAI sends {"error": {"message": ...}} (the SDK unwraps "error"); Gemini's
    # compatibility layer has been seen to wrap the same in a one-element list.
    if isinstance(body, list) and body:
        return _server_message(body[0])
    if isinstance(body, Mapping):
        if isinstance(body.get("message"), str):
            return body["message"]
        return _server_message(body.get("error"))
    if isinstance(body, str):
        return body
    return None


def _one_line(text: str) -> str:
    line = " ".join(text.split())
    if len(line) > _MAX_MESSAGE_CHARS:
        line = line[: _MAX_MESSAGE_CHARS - 3] + "..."
    return line
