"""LLM access: model specs, one OpenAI-compatible client with retries, and token pricing."""

from pike.errors import LLMError
from pike.llm.call import LLMCall
from pike.llm.client import LLMClient
from pike.llm.pricing import Pricing
from pike.llm.spec import ModelSpec, resolve_spec

__all__ = ["LLMCall", "LLMClient", "LLMError", "ModelSpec", "Pricing", "resolve_spec"]
