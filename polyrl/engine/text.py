"""Token ids -> completion text: stop strings and the visible text of a completion.

Shared by the engines so that they cut text the same way. Out of scope: incremental
detokenisation for streaming (the server's business).
"""

from __future__ import annotations

from typing import Collection

from polyrl.models.tokenizer import Tokenizer


def hits_stop_string(tokenizer: Tokenizer, tokens: list[int], stop: tuple[str, ...]) -> bool:
    text = tokenizer.decode(tokens[-32:])  # a stop string completes within the last few tokens
    return any(s in text for s in stop)


def visible_text(tokenizer: Tokenizer, tokens: list[int], finish: str, stop_ids: Collection[int],
                 stop: tuple[str, ...]) -> str:
    """The completion's text without its stop token, cut at the first stop string."""
    if finish == "stop" and tokens and tokens[-1] in stop_ids:
        tokens = tokens[:-1]
    text = tokenizer.decode(tokens)
    cuts = [text.find(s) for s in stop if s in text]
    return text[:min(cuts)] if cuts else text
