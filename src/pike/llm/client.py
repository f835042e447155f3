"""LLMClient: chat completions from any OpenAI-compatible endpoint, with our retries.

A failed call is returned as an LLMCall with `error` set, never raised: a search
records it and goes on. Only configuration problems (bad spec, missing key) raise.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from datetime import datetime, timezone
from typing import Any

import openai
from tenacity import RetryCallState, Retrying, retry_if_exception, stop_after_attempt

from pike.errors import ConfigError, LLMError
from pike.llm.call import LLMCall
from pike.llm.pricing import Pricing
from pike.llm.retry import Backoff, describe, is_retryable
from pike.llm.spec import ModelSpec, resolve_spec

log = logging.getLogger(__name__)

# Local servers (vLLM, llama.cpp, Ollama) usually ignore the key, but the SDK needs one.
LOCAL_KEY_ENV = "PIKE_LLM_API_KEY"
LOCAL_KEY_PLACEHOLDER = "not-needed"


class LLMClient:
    """Thread-safe; at most `max_concurrency` requests in flight at once."""

    def __init__(
        self,
        spec: str | ModelSpec,
        *,
        max_concurrency: int = 4,
        timeout_s: float = 300.0,
        max_retries: int = 5,
        pricing: Pricing | None = None,
        temperature: float | None = None,
        max_tokens: int | None = None,
        retry_wait_s: float = 1.0,
    ) -> None:
        if max_concurrency < 1 or max_retries < 0 or timeout_s <= 0 or retry_wait_s < 0:
            raise ConfigError(
                "LLM client: need max_concurrency >= 1, max_retries >= 0, timeout_s > 0 "
                "and retry_wait_s >= 0")
        self.spec = spec if isinstance(spec, ModelSpec) else resolve_spec(spec)
        self.pricing = pricing if pricing is not None else Pricing.load()
        self.timeout_s = timeout_s
        self.max_retries = max_retries
        self.temperature = temperature
        self.max_tokens = max_tokens
        self.retry_wait_s = retry_wait_s
        self._slots = threading.Semaphore(max_concurrency)
        # max_retries=0: the SDK's own retries would multiply ours and hide them from the log.
        self._openai = openai.OpenAI(
            base_url=self.spec.base_url,
            api_key=_api_key(self.spec),
            timeout=timeout_s,
            max_retries=0,
        )

    def complete(self, messages: list[dict[str, str]], *, role: str) -> LLMCall:
        """Send one chat request; the reply, or the reason it failed, is in the LLMCall."""
        call = LLMCall(role=role, model=self.spec.spec, messages=[dict(m) for m in messages])
        with self._slots:
            call.started_at = datetime.now(timezone.utc).isoformat(timespec="milliseconds")
            start = time.perf_counter()
            attempts = 0

            def attempt() -> Any:
                nonlocal attempts
                attempts += 1
                return self._openai.chat.completions.create(**self._request(call.messages))

            try:
                response = self._retrying()(attempt)
            except openai.OpenAIError as exc:
                call.error = describe(exc, timeout_s=self.timeout_s, retries=attempts - 1)
                log.warning("%s (%s): %s", self.spec.spec, role, call.error)
            else:
                self._fill(call, response)
            call.latency_s = time.perf_counter() - start
        return call

    def close(self) -> None:
        self._openai.close()

    def __enter__(self) -> LLMClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _request(self, messages: list[dict[str, str]]) -> dict[str, Any]:
        request: dict[str, Any] = {"model": self.spec.model, "messages": messages}
        if self.temperature is not None:
            request["temperature"] = self.temperature
        if self.max_tokens is not None:
            # OpenAI's reasoning models (gpt-5, o-series) reject max_tokens; other
            # OpenAI-compatible servers do not all know max_completion_tokens.
            name = "max_completion_tokens" if "api.openai.com" in self.spec.base_url else "max_tokens"
            request[name] = self.max_tokens
        return request

    def _retrying(self) -> Retrying:
        # A fresh controller per call: no retry state is shared between threads.
        return Retrying(
            retry=retry_if_exception(is_retryable),
            stop=stop_after_attempt(self.max_retries + 1),
            wait=Backoff(self.retry_wait_s),
            before_sleep=self._log_retry,
            reraise=True,
        )

    def _log_retry(self, state: RetryCallState) -> None:
        exc = state.outcome.exception() if state.outcome is not None else None
        what = describe(exc, timeout_s=self.timeout_s, retries=0) if exc else "failed"
        wait = state.next_action.sleep if state.next_action is not None else 0.0
        log.info("%s: %s; retry %d of %d in %.1f s", self.spec.spec, what,
                 state.attempt_number, self.max_retries, wait)

    def _fill(self, call: LLMCall, response: Any) -> None:
        # Tolerant reading: compatible servers omit usage, or send no content when a
        # reasoning model spends its whole token budget thinking.
        choices = getattr(response, "choices", None) or []
        message = getattr(choices[0], "message", None) if choices else None
        call.reply = getattr(message, "content", None) or ""
        usage = getattr(response, "usage", None)
        call.tokens_in = getattr(usage, "prompt_tokens", None) or 0
        call.tokens_out = getattr(usage, "completion_tokens", None) or 0
        call.cost_usd = self.pricing.cost(self.spec.model, call.tokens_in, call.tokens_out)
        if not choices:
            call.error = "the response had no choices"


def _api_key(spec: ModelSpec) -> str:
    if spec.key_env is None:
        return os.environ.get(LOCAL_KEY_ENV) or LOCAL_KEY_PLACEHOLDER
    key = os.environ.get(spec.key_env)
    if not key:
        raise LLMError(f"{spec.key_env} is not set: export it to use {spec.spec}")
    return key
