"""Token prices, so every LLM call records what it cost."""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Mapping
from importlib.resources import files

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from pike.errors import ConfigError

log = logging.getLogger(__name__)

# Providers also accept dated snapshots ('gpt-4.1-2025-04-14'), priced like the alias.
_SNAPSHOT_SUFFIX = re.compile(r"-\d{4}-\d{2}-\d{2}$")


class ModelPrice(BaseModel):
    """USD per million tokens."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    input_per_mtok: float = Field(ge=0)
    output_per_mtok: float = Field(ge=0)


class Pricing:
    """Prices by model name; an unknown model costs 0.0 and is warned about once."""

    def __init__(self, prices: Mapping[str, ModelPrice]) -> None:
        self.prices = dict(prices)
        self._warned: set[str] = set()
        self._lock = threading.Lock()

    @classmethod
    def load(cls, overrides: dict[str, dict[str, float]] | None = None) -> Pricing:
        """The packaged pricing.yaml, with `overrides` merged on top field by field."""
        text = files("pike.llm").joinpath("pricing.yaml").read_text()
        merged: dict[str, dict[str, float]] = {
            name: dict(fields) for name, fields in (yaml.safe_load(text) or {}).items()
        }
        for name, fields in (overrides or {}).items():
            if not isinstance(fields, Mapping):
                raise ConfigError(f"pricing for {name!r}: expected input_per_mtok and "
                                  f"output_per_mtok, got {fields!r}")
            merged.setdefault(name, {}).update(fields)
        prices: dict[str, ModelPrice] = {}
        for name, fields in merged.items():
            try:
                prices[name] = ModelPrice.model_validate(fields)
            except ValidationError as err:
                first = err.errors()[0]
                where = ".".join(str(p) for p in first["loc"]) or "price"
                raise ConfigError(f"pricing for {name!r}: {where}: {first['msg']}") from None
        return cls(prices)

    def cost(self, model: str, tokens_in: int, tokens_out: int) -> float:
        price = self.prices.get(model) or self.prices.get(_SNAPSHOT_SUFFIX.sub("", model))
        if price is None:
            self._warn_unknown(model)
            return 0.0
        return (tokens_in * price.input_per_mtok + tokens_out * price.output_per_mtok) / 1e6

    def _warn_unknown(self, model: str) -> None:
        with self._lock:
            if model in self._warned:
                return
            self._warned.add(model)
        log.warning("no price known for model %r: its calls are recorded as costing $0 "
                    "(add it to the pricing overrides)", model)
