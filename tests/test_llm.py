"""The LLM client, through the real openai SDK against the fake server (no network)."""

from __future__ import annotations

import logging
import threading
import time
from datetime import datetime

import pytest

from pike.errors import ConfigError, PikeError
from pike.llm import LLMCall, LLMClient, LLMError, ModelSpec, Pricing, resolve_spec
from tests.fake_openai import FakeOpenAI, Reply

# The `fake_llm` fixture comes from tests/fake_openai.py, registered in conftest.py.
MESSAGES = [{"role": "system", "content": "You write kernels."},
            {"role": "user", "content": "Make it fast."}]
FAKE_PRICES = {"fake-model": {"input_per_mtok": 1.0, "output_per_mtok": 2.0}}


def client_for(fake: FakeOpenAI, **kwargs) -> LLMClient:
    kwargs.setdefault("retry_wait_s", 0.001)
    kwargs.setdefault("pricing", Pricing.load(FAKE_PRICES))
    return LLMClient(fake.spec("fake-model"), **kwargs)


@pytest.mark.parametrize(("spec", "base_url", "key_env", "model"), [
    ("openai:gpt-5", "https://api.openai.com/v1", "OPENAI_API_KEY", "gpt-5"),
    ("gemini:gemini-2.5-pro", "https://generativelanguage.googleapis.com/v1beta/openai/",
     "GEMINI_API_KEY", "gemini-2.5-pro"),
    ("openrouter:openai/gpt-oss-120b", "https://openrouter.ai/api/v1", "OPENROUTER_API_KEY",
     "openai/gpt-oss-120b"),
    ("http://localhost:8000/v1#qwen3-coder", "http://localhost:8000/v1", None, "qwen3-coder"),
    ("https://llm.example.org/v1#big-model", "https://llm.example.org/v1", None, "big-model"),
])
def test_resolve_spec(spec: str, base_url: str, key_env: str | None, model: str) -> None:
    assert resolve_spec(spec) == ModelSpec(spec=spec, base_url=base_url, key_env=key_env,
                                           model=model)


@pytest.mark.parametrize("spec", [
    "gpt-5", "anthropic:claude", "openai:", "http://localhost:8000/v1", "http://#model", "",
])
def test_bad_spec_is_a_one_line_config_error(spec: str) -> None:
    with pytest.raises(ConfigError) as info:
        resolve_spec(spec)
    message = str(info.value)
    assert "\n" not in message
    assert "openai:MODEL" in message and "#MODEL" in message


def test_missing_key_is_a_one_line_error_naming_the_variable(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GEMINI_API_KEY", raising=False)
    with pytest.raises(LLMError) as info:
        LLMClient("gemini:gemini-2.5-pro")
    assert isinstance(info.value, PikeError)
    assert "GEMINI_API_KEY" in str(info.value)
    assert "\n" not in str(info.value)


def test_reply_has_tokens_latency_and_cost(fake_llm: FakeOpenAI) -> None:
    fake_llm.script(Reply("def forward(x): ...", prompt_tokens=1000, completion_tokens=2000,
                          delay_s=0.05))
    with client_for(fake_llm) as client:
        call = client.complete(MESSAGES, role="optimize")

    assert isinstance(call, LLMCall) and call.ok
    assert call.reply == "def forward(x): ..."
    assert (call.role, call.model) == ("optimize", fake_llm.spec("fake-model"))
    assert (call.tokens_in, call.tokens_out) == (1000, 2000)
    assert call.cost_usd == pytest.approx(1000 * 1.0 / 1e6 + 2000 * 2.0 / 1e6)
    assert 0.05 <= call.latency_s < 5
    assert datetime.fromisoformat(call.started_at).utcoffset().total_seconds() == 0
    assert call.messages == MESSAGES
    (request,) = fake_llm.requests
    assert request["body"]["model"] == "fake-model"
    assert request["body"]["messages"] == MESSAGES


def test_rate_limit_is_retried(fake_llm: FakeOpenAI) -> None:
    fake_llm.script(Reply(status=429), Reply("done"))
    with client_for(fake_llm) as client:
        call = client.complete(MESSAGES, role="brainstorm")
    assert call.ok and call.reply == "done"
    assert len(fake_llm.requests) == 2


def test_server_errors_are_retried(fake_llm: FakeOpenAI) -> None:
    fake_llm.script(Reply(status=500), Reply(status=503), Reply("done"))
    with client_for(fake_llm) as client:
        call = client.complete(MESSAGES, role="fix")
    assert call.ok and call.reply == "done"
    assert len(fake_llm.requests) == 3


def test_persistent_server_error_is_recorded_not_raised(fake_llm: FakeOpenAI) -> None:
    fake_llm.default = Reply("upstream is down", status=500)
    with client_for(fake_llm, max_retries=3) as client:
        call = client.complete(MESSAGES, role="optimize")
    assert call.error == "500 Internal Server Error after 3 retries: upstream is down"
    assert call.reply == "" and call.tokens_in == 0 and call.cost_usd == 0.0
    assert len(fake_llm.requests) == 4


def test_slow_reply_times_out_then_is_retried(fake_llm: FakeOpenAI) -> None:
    fake_llm.default = Reply("too late", delay_s=1.0)
    start = time.perf_counter()
    with client_for(fake_llm, timeout_s=0.3, max_retries=1) as client:
        call = client.complete(MESSAGES, role="optimize")
    assert call.error == "timed out (0.3 s limit) after 1 retry"
    assert len(fake_llm.requests) == 2
    # Had either try waited out the 1 s delay, this would take at least 1.3 s.
    assert time.perf_counter() - start < 1.25


def test_bad_request_is_not_retried(fake_llm: FakeOpenAI) -> None:
    fake_llm.script(Reply("messages must not be empty", status=400))
    with client_for(fake_llm) as client:
        call = client.complete(MESSAGES, role="optimize")
    assert call.error == "400 Bad Request: messages must not be empty"
    assert len(fake_llm.requests) == 1


def test_unreachable_server_is_recorded(fake_llm: FakeOpenAI) -> None:
    fake_llm.close()  # nothing listens on its port any more
    with client_for(fake_llm, max_retries=1) as client:
        call = client.complete(MESSAGES, role="optimize")
    assert call.error is not None
    assert call.error.startswith("connection error after 1 retry")


def test_at_most_max_concurrency_requests_in_flight(fake_llm: FakeOpenAI) -> None:
    fake_llm.default = Reply("ok", delay_s=0.3)
    calls: list[LLMCall] = []
    with client_for(fake_llm, max_concurrency=2) as client:
        threads = [threading.Thread(target=lambda: calls.append(
            client.complete(MESSAGES, role="optimize"))) for _ in range(6)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert len(calls) == 6 and all(call.ok for call in calls)
    assert fake_llm.max_in_flight == 2


def test_unknown_model_costs_nothing_and_warns_once(
        fake_llm: FakeOpenAI, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="pike.llm"):
        with LLMClient(fake_llm.spec("mystery-model"), pricing=Pricing.load()) as client:
            first = client.complete(MESSAGES, role="optimize")
            second = client.complete(MESSAGES, role="optimize")
    assert first.ok and first.tokens_in == 100
    assert first.cost_usd == 0.0 and second.cost_usd == 0.0
    warnings = [r for r in caplog.records if "mystery-model" in r.getMessage()]
    assert len(warnings) == 1 and warnings[0].levelno == logging.WARNING


def test_authorization_carries_the_key_from_the_env_var(
        fake_llm: FakeOpenAI, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PIKE_TEST_KEY", "sk-test-123")
    spec = ModelSpec(spec="test:fake-model", base_url=fake_llm.url, key_env="PIKE_TEST_KEY",
                     model="fake-model")
    with LLMClient(spec, pricing=Pricing.load(FAKE_PRICES)) as client:
        assert client.complete(MESSAGES, role="optimize").ok
    assert fake_llm.requests[0]["headers"]["authorization"] == "Bearer sk-test-123"


def test_local_server_key(fake_llm: FakeOpenAI, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PIKE_LLM_API_KEY", raising=False)
    with client_for(fake_llm) as client:
        client.complete(MESSAGES, role="optimize")
    monkeypatch.setenv("PIKE_LLM_API_KEY", "sk-local")
    with client_for(fake_llm) as client:
        client.complete(MESSAGES, role="optimize")
    keys = [r["headers"]["authorization"] for r in fake_llm.requests]
    assert keys == ["Bearer not-needed", "Bearer sk-local"]


def test_sampling_options_are_sent(fake_llm: FakeOpenAI, monkeypatch: pytest.MonkeyPatch) -> None:
    with client_for(fake_llm, temperature=0.2, max_tokens=512) as client:
        client.complete(MESSAGES, role="optimize")
    body = fake_llm.requests[0]["body"]
    assert (body["temperature"], body["max_tokens"]) == (0.2, 512)
    # OpenAI's reasoning models accept only max_completion_tokens.
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    with LLMClient("openai:gpt-5", max_tokens=512) as client:
        assert client._request(MESSAGES)["max_completion_tokens"] == 512


def test_handler_answers_by_prompt(fake_llm: FakeOpenAI) -> None:
    fake_llm.handler = lambda body: Reply(body["messages"][-1]["content"].upper())
    with client_for(fake_llm) as client:
        assert client.complete(MESSAGES, role="optimize").reply == "MAKE IT FAST."


def test_pricing_overrides_merge_and_are_validated() -> None:
    pricing = Pricing.load({"gpt-5": {"input_per_mtok": 2.0}})
    assert pricing.cost("gpt-5", 1_000_000, 0) == pytest.approx(2.0)
    assert pricing.cost("gpt-5", 0, 1_000_000) == pytest.approx(10.0)  # packaged output price
    for model in ("gpt-5-mini", "gpt-4.1", "gpt-4.1-mini", "o4-mini", "gemini-2.5-pro",
                  "gemini-2.5-flash", "openai/gpt-oss-120b"):
        assert model in pricing.prices
    with pytest.raises(ConfigError, match="new-model"):
        Pricing.load({"new-model": {"input_per_mtok": 1.0}})
