"""Incremental text of a streamed choice: what may be sent now without taking it back later.

The whole token list is decoded at each step (byte-level tokens can split a character, so
token-by-token decoding would emit broken UTF-8), and two kinds of tail are held back: an
incomplete character (U+FFFD at the end) and, when the request has stop strings, the last
len(longest stop) - 1 characters, which could be the start of a stop string the final text
is cut at. At the end the engine's final text (stop token dropped, cut at the first stop
string) supplies the rest, so the deltas join to exactly the non-streamed text.
"""

from __future__ import annotations

from typing import Sequence

from polyrl.models.tokenizer import Tokenizer


class TextDelta:
    def __init__(self, tokenizer: Tokenizer, stops: Sequence[str], prefix: str = "") -> None:
        self.tokenizer = tokenizer
        self.hold = max((len(s) for s in stops), default=1) - 1
        self.prefix = prefix
        """Text the reply was forced to start with (tool_choice), sent before any token's text."""
        self.sent = ""

    def update(self, token_ids: Sequence[int]) -> str:
        """New text safe to send, given all the tokens sampled so far."""
        text = self.prefix + self.tokenizer.decode(list(token_ids))
        text = text.rstrip("\ufffd")
        safe = text[:max(len(text) - self.hold, 0)]
        if len(safe) <= len(self.sent) or not safe.startswith(self.sent):
            return ""
        delta, self.sent = safe[len(self.sent):], safe
        return delta

    def final(self, text: str) -> str:
        """The rest of the choice's final text (`text` includes the prefix); "" if what was sent
        is not a prefix of it (it cannot be taken back; tests pin that this does not happen)."""
        delta = text[len(self.sent):] if text.startswith(self.sent) else ""
        self.sent = text
        return delta
