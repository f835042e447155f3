"""Model specs: one string names both the endpoint and the model, e.g. 'openai:gpt-5'."""

from __future__ import annotations

from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict

from pike.errors import ConfigError

# Every provider here speaks the OpenAI chat-completions protocol at this base URL,
# so one client (the openai SDK) serves them all.
PROVIDERS: dict[str, tuple[str, str]] = {
    "openai": ("https://api.openai.com/v1", "OPENAI_API_KEY"),
    "gemini": ("https://generativelanguage.googleapis.com/v1beta/openai/", "GEMINI_API_KEY"),
    "openrouter": ("https://openrouter.ai/api/v1", "OPENROUTER_API_KEY"),
}

ACCEPTED_FORMS = (
    "openai:MODEL, gemini:MODEL, openrouter:MODEL, or http(s)://HOST[:PORT]/PATH#MODEL "
    "for a local OpenAI-compatible server"
)


class ModelSpec(BaseModel):
    """Where to send chat requests, with which key, for which model."""

    model_config = ConfigDict(frozen=True)

    spec: str  # as the user wrote it
    base_url: str
    key_env: str | None  # env var holding the key; None for local servers
    model: str  # model name sent to the API


def resolve_spec(spec: str) -> ModelSpec:
    """Parse a model spec; raise ConfigError (one line) naming the accepted forms."""
    text = spec.strip()
    if text.startswith(("http://", "https://")):
        return _resolve_url(spec, text)
    provider, sep, model = text.partition(":")
    provider = provider.lower()
    if sep and provider in PROVIDERS and model.strip():
        base_url, key_env = PROVIDERS[provider]
        return ModelSpec(spec=spec, base_url=base_url, key_env=key_env, model=model.strip())
    raise ConfigError(f"unknown model spec {spec!r}: use {ACCEPTED_FORMS}")


def _resolve_url(spec: str, text: str) -> ModelSpec:
    # The model rides in the fragment because a URL fragment is never sent to the server,
    # so it cannot collide with a real part of the base URL.
    base_url, _, model = text.partition("#")
    if not urlsplit(base_url).hostname or not model.strip():
        raise ConfigError(f"bad model spec {spec!r}: use {ACCEPTED_FORMS}")
    return ModelSpec(spec=spec, base_url=base_url, key_env=None, model=model.strip())
