"""The price card: what a model's tokens cost, for cost per success.

A small YAML or JSON file the user passes with `polyrl eval --prices FILE`; prices are in
a currency unit per million tokens:

    default: {input: 0, output: 0}          # any model not listed (this line is the default)
    models:
      "openai:https://api.example.com/v1#big": {input: 2.5, cached_input: 0.25, output: 10}
      builtin:tiny: {input: 0, output: 0}

A model is found by the spec it was given on the command line. Cost follows the OpenTelemetry
GenAI convention the per-call records use: input tokens *include* the cached ones, so

    cost = (input - cached) * input + cached * cached_input + output * output     (/ 1e6)

and `cached_input` defaults to `input` (no cache discount unless the card says so). Without a
card every model costs 0: local models have no per-token price.

Out of scope: prices per call or per second, cache-write surcharges, and currencies.
"""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError


class PriceError(ValueError):
    """A price card that cannot be read: the command exits 2 with this message."""

    exit_code = 2


class Price(BaseModel):
    model_config = ConfigDict(extra="forbid")

    input: float = Field(0.0, ge=0)
    """Price of a million prompt tokens (cached ones at `cached_input`)."""
    cached_input: float | None = Field(None, ge=0)
    """Price of a million prompt tokens served from a prefix cache; None = `input`."""
    output: float = Field(0.0, ge=0)
    """Price of a million completion tokens."""

    def cost(self, input_tokens: int, cached_tokens: int, output_tokens: int) -> float:
        cached_price = self.input if self.cached_input is None else self.cached_input
        uncached = max(0, input_tokens - cached_tokens)
        return (uncached * self.input + cached_tokens * cached_price + output_tokens * self.output) / 1e6


class PriceCard(BaseModel):
    model_config = ConfigDict(extra="forbid")

    default: Price = Field(default_factory=Price)
    """The price of every model the card does not list (zero unless set)."""
    models: dict[str, Price] = Field(default_factory=dict)
    """Model spec, as given to --model -> its price."""

    def price(self, model: str) -> Price:
        return self.models.get(model, self.default)


def load_price_card(path: str | Path | None) -> PriceCard:
    """The card at `path` (YAML or JSON; YAML is a superset), or the all-zero card for None."""
    if path is None:
        return PriceCard()
    import yaml

    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as err:
        raise PriceError(f"cannot read price card {path}: {err.strerror or err}") from None
    try:
        data = yaml.safe_load(text) if text.strip() else {}
    except yaml.YAMLError as err:
        raise PriceError(f"price card {path} is not YAML or JSON: {str(err).splitlines()[0]}") from None
    if not isinstance(data, dict):
        raise PriceError(f"price card {path} must be a mapping with 'models' (and 'default'), got "
                         f"{type(data).__name__}")
    try:
        return PriceCard.model_validate(data)
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        got = json.dumps(first.get("input"), default=str)
        raise PriceError(f"price card {path}: {where}: {first['msg']} (got {got})") from None
