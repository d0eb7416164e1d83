"""The request bodies the server reads, typed; a value out of range is a 400 naming its field.

Unknown fields are ignored (clients send `user`, `metadata`, `parallel_tool_calls`, ...),
`null` for an optional field means absent (some clients send `tools: null`), and both
`max_tokens` and `max_completion_tokens` are read. Two extensions for RL clients, on
/v1/completions only: `return_token_ids` (each choice adds `token_ids`, `token_logprobs`,
`weight_version` and `cached_tokens`; polyrl's HTTP engine sets it) and `stop_token_ids` /
`ignore_eos` / `top_k`, as vLLM accepts them.

Out of scope: `response_format` (JSON mode), `logit_bias`, penalties (accepted and ignored:
`presence_penalty` and `frequency_penalty` at 0 are common defaults), `echo`, `suffix`,
`best_of`, audio and image content.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from polyrl.serve.errors import APIError, bad_request

MAX_TOP_LOGPROBS = 20


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=0)
    max_tokens: int | None = Field(None, ge=1)
    n: int | None = Field(None, ge=1, le=64)
    stop: str | list[str] | None = None
    seed: int | None = None
    stream: bool | None = None
    stream_options: dict[str, Any] | None = None
    service_tier: str | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool | None = None

    @field_validator("stop")
    @classmethod
    def _stops(cls, value: str | list[str] | None) -> str | list[str] | None:
        stops = [value] if isinstance(value, str) else value or []
        if len(stops) > 4 or any(not s for s in stops):
            raise ValueError("stop: at most 4 non-empty strings")
        return value

    def stops(self) -> tuple[str, ...]:
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())

    def include_usage(self) -> bool:
        return bool((self.stream_options or {}).get("include_usage"))

    def check_stream_options(self) -> None:
        if self.stream_options is not None and not self.stream:
            raise bad_request("stream_options is only allowed when stream is true", "stream_options")


class ChatRequest(_Body):
    messages: list[dict[str, Any]] = Field(min_length=1)
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool | None = None
    top_logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)

    def completion_limit(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens


class CompletionRequest(_Body):
    prompt: str | list[str] | list[int] | list[list[int]]
    logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    echo: bool | None = None
    return_token_ids: bool | None = None

    def completion_limit(self) -> int | None:
        return self.max_tokens

    def prompts(self) -> list[str | list[int]]:
        """One entry per prompt: a string, or token ids."""
        p = self.prompt
        if isinstance(p, str):
            return [p]
        if not p:
            raise bad_request("prompt must not be empty", "prompt")
        if all(isinstance(x, int) for x in p):
            return [list(p)]  # type: ignore[arg-type]
        return list(p)  # type: ignore[arg-type]


def parse(cls: type[_Body], body: Any) -> Any:
    """The request `body` as `cls`, or an APIError 400 naming the first bad field."""
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object")
    try:
        request = cls.model_validate(body)
    except ValidationError as err:
        first = err.errors()[0]
        param = ".".join(str(part) for part in first["loc"]) or None
        raise APIError(400, f"{param}: {first['msg']}" if param else first["msg"], "invalid_request_error",
                       param, "invalid_value") from None
    request.check_stream_options()
    if request.echo if isinstance(request, CompletionRequest) else False:
        raise bad_request("echo is not supported", "echo")
    return request


Tier = Literal["standard", "fast"]
