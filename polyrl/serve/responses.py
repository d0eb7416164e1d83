"""Completions -> OpenAI response objects (chat and text, whole and streamed).

Field by field as openai-python's types read them (../shared/research/openai_server.md §1):
`usage` always has `prompt_tokens_details.cached_tokens` (0 on a cold prompt); token
logprobs carry `bytes`; every chunk of a stream repeats id, created, model, service_tier
and system_fingerprint. `finish_reason` is "tool_calls" when the reply's tool calls were
parsed, else the engine's "stop" or "length".
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Sequence

from polyrl.models.tokenizer import Tokenizer
from polyrl.types import Completion


@dataclass
class Envelope:
    """What every object of one response repeats."""

    kind: str
    """"chat.completion" or "text_completion"."""
    model: str
    service_tier: str
    fingerprint: str
    id: str = ""
    created: int = field(default_factory=lambda: int(time.time()))

    def __post_init__(self) -> None:
        if not self.id:
            self.id = ("chatcmpl-" if self.kind.startswith("chat") else "cmpl-") + uuid.uuid4().hex[:24]

    def wrap(self, choices: list[dict[str, Any]], usage: dict[str, Any] | None, chunk: bool = False,
             with_usage_key: bool = True) -> dict[str, Any]:
        obj = {"id": self.id, "object": self.kind + (".chunk" if chunk and self.kind.startswith("chat") else ""),
               "created": self.created, "model": self.model, "service_tier": self.service_tier,
               "system_fingerprint": self.fingerprint, "choices": choices}
        if with_usage_key:
            obj["usage"] = usage
        return obj


def usage(prompt_tokens: int, completions: Sequence[Completion], cached: int) -> dict[str, Any]:
    out = sum(len(c.token_ids) for c in completions)
    return {"prompt_tokens": prompt_tokens, "completion_tokens": out, "total_tokens": prompt_tokens + out,
            "prompt_tokens_details": {"cached_tokens": cached},
            "completion_tokens_details": {"reasoning_tokens": 0}}


def token_text(tokenizer: Tokenizer, token_id: int) -> str:
    return tokenizer.decode([token_id], skip_special_tokens=False)


def chat_logprobs(tokenizer: Tokenizer, token_ids: Sequence[int], logprobs: Sequence[float],
                  top: Sequence[dict[int, float]] | None, top_n: int) -> dict[str, Any]:
    content = []
    for k, (tid, lp) in enumerate(zip(token_ids, logprobs)):
        text = token_text(tokenizer, tid)
        alts = sorted((top[k] if top is not None and k < len(top) else {}).items(), key=lambda kv: -kv[1])[:top_n]
        content.append({"token": text, "logprob": max(float(lp), -9999.0), "bytes": list(text.encode()),
                        "top_logprobs": [{"token": token_text(tokenizer, t), "logprob": max(float(v), -9999.0),
                                          "bytes": list(token_text(tokenizer, t).encode())} for t, v in alts]})
    return {"content": content, "refusal": None}


def text_logprobs(tokenizer: Tokenizer, completion: Completion, top_n: int) -> dict[str, Any]:
    tokens = [token_text(tokenizer, t) for t in completion.token_ids]
    offsets, at = [], 0
    for t in tokens:
        offsets.append(at)
        at += len(t)
    top = completion.top_logprobs
    return {"tokens": tokens, "token_logprobs": [float(x) for x in completion.logprobs],
            "top_logprobs": [{token_text(tokenizer, t): float(v) for t, v in
                              sorted(top[k].items(), key=lambda kv: -kv[1])[:top_n]} for k in range(len(tokens))]
            if top is not None and top_n > 0 else None,
            "text_offset": offsets}


def rl_fields(completion: Completion) -> dict[str, Any]:
    """The extension an RL client asks for with `return_token_ids`: exact tokens, their
    sampling logprobs and the weight version(s) that sampled them."""
    return {"token_ids": list(completion.token_ids), "token_logprobs": [float(x) for x in completion.logprobs],
            "weight_version": completion.weight_version, "token_versions": completion.token_versions,
            "cached_tokens": completion.num_cached_tokens,
            "top_logprobs_ids": [{str(t): float(v) for t, v in d.items()} for d in completion.top_logprobs]
            if completion.top_logprobs is not None else None}
