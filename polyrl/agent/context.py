"""What the model sees of an episode: the history, compressed and truncated to fit.

The history is a list of turns; a turn is one assistant message and the results of
the tool calls it made. The prompt of the next call is rendered from it:

    system · task (+ one-line summaries of old turns) · recent turns, whole

Ways to shrink it, applied by `Transcript.fit` in this order when the prompt is
over its limit (the context window or the budget):

1. compress: the oldest turns are replaced by one-line summaries ("price(item=pen)
   -> 12") folded into the task message (and, when nothing else fits, the oldest
   summaries are left out, with a count). A turn is summarised whole, so a tool call
   and its result always stay together: no request ever carries a call without its
   result or a result without its call (the HTTP 400 of pydantic-ai #4137).
2. truncate: tool results are cut to `tight_result_chars`, head and tail kept, with
   a header giving the original size (`truncate_result`).
3. compress everything: every turn summarised, then the oldest summaries dropped.

Both are sticky (once summarised, a turn stays summarised), so prompts stay
prefix-stable between steps as far as possible. The full results stay in the turns:
only the rendered prompt is shortened, and trajectory logs keep everything.

Out of scope: summaries written by a model (ReSum-style); here they are mechanical,
which the tiny model can read and which costs no call.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from polyrl.agent.model import Message
from polyrl.agent.tools import ToolCall, ToolOutcome

SUMMARY_HEADER = "Earlier steps:"


def truncate_result(text: str, limit: int) -> str:
    """`text` if it has at most `limit` characters, else its head and tail under a header
    giving the original size: "[truncated: 1200 chars, kept 20+20]\nhead ... tail".

    The result is about `limit` characters long; at least 8 characters of head and of
    tail are kept however small `limit` is, so the model always sees both ends.
    """
    if len(text) <= limit:
        return text
    overhead = len(f"[truncated: {len(text)} chars, kept {limit}+{limit}]\n ... ")
    room = max(16, limit - overhead)
    head, tail = (room + 1) // 2, room // 2
    return f"[truncated: {len(text)} chars, kept {head}+{tail}]\n{text[:head]} ... {text[-tail:]}"


def clip(text: str, chars: int) -> str:
    """One line of at most `chars` characters (plus "..."), for summaries."""
    text = " ".join(text.split())
    return text if len(text) <= chars else text[:chars] + "..."


@dataclass
class ToolResult:
    call: ToolCall
    outcome: ToolOutcome
    """Full result; the prompt may show it truncated."""

    def message(self, limit: int | None) -> Message:
        content = self.outcome.content if limit is None else truncate_result(self.outcome.content, limit)
        return {"role": "tool", "tool_call_id": self.call.id, "name": self.call.name or "invalid",
                "content": content}


@dataclass
class Turn:
    step: int
    assistant: Message
    results: list[ToolResult] = field(default_factory=list)

    def messages(self, result_limit: int | None) -> list[Message]:
        return [self.assistant] + [r.message(result_limit) for r in self.results]

    def summary(self, chars: int = 40) -> str:
        """One line per call: "price(item=pen) -> 12"; a turn without calls by its text."""
        if not self.results:
            return f"said: {clip(str(self.assistant.get('content') or ''), chars)}"
        return "; ".join(f"{r.call.brief()} -> {clip(r.outcome.content, chars)}" for r in self.results)


@dataclass
class FitEvent:
    """One shrinking action, recorded as an observability event."""

    action: str
    """"compress" or "truncate"."""
    tokens_before: int
    tokens_after: int
    detail: dict[str, Any] = field(default_factory=dict)


@dataclass
class Transcript:
    system: str
    task: str
    result_chars: int | None = None
    """Cap on every tool result shown (None = no cap)."""
    tight_result_chars: int = 80
    """Cap once over the limit (step 2 of fit)."""
    keep_recent: int = 1
    """Turns compression leaves whole before it resorts to truncation."""
    turns: list[Turn] = field(default_factory=list)
    summarized: int = 0
    """How many of the oldest turns are shown as summaries."""
    dropped: int = 0
    """How many of those summaries are left out too (only when nothing else fits)."""
    truncated: bool = False

    def add(self, turn: Turn) -> None:
        self.turns.append(turn)

    def messages(self, extra: list[Message] | None = None) -> list[Message]:
        """The prompt as it stands: system, task (+ summaries), the turns not summarised."""
        task = self.task
        if self.summarized:
            lines = [t.summary() for t in self.turns[self.dropped:self.summarized]]
            if self.dropped:
                lines.insert(0, f"({self.dropped} earlier steps omitted)")
            task = f"{task}\n{SUMMARY_HEADER}\n" + "\n".join(lines)
        out: list[Message] = [{"role": "system", "content": self.system}, {"role": "user", "content": task}]
        limit = self.tight_result_chars if self.truncated else self.result_chars
        for turn in self.turns[self.summarized:]:
            out.extend(turn.messages(limit))
        return out + (extra or [])

    def fit(self, count: Callable[[list[Message]], int], limit: float, extra: list[Message] | None = None,
            last_resort: bool = True) -> tuple[list[Message], int, list[FitEvent]]:
        """Shrink the prompt until `count(prompt) <= limit` or nothing is left to shrink:
        steps 1 and 2 of the module docstring, and step 3 if `last_resort`.

        Returns (messages, their token count, what was done); the count may still be
        over `limit` when even the most shrunken prompt does not fit.
        """
        events: list[FitEvent] = []
        messages = self.messages(extra)
        tokens = count(messages)

        def compress(keep: int) -> None:
            nonlocal messages, tokens
            before, done, dropped = tokens, self.summarized, self.dropped
            while tokens > limit and self.summarized < len(self.turns) - keep:
                self.summarized += 1
                messages = self.messages(extra)
                tokens = count(messages)
            while keep == 0 and tokens > limit and self.dropped < self.summarized:
                self.dropped += 1  # the last resort: even the oldest summaries go
                messages = self.messages(extra)
                tokens = count(messages)
            if self.summarized > done or self.dropped > dropped:
                events.append(FitEvent("compress", before, tokens,
                                       {"turns_summarized": self.summarized - done, "turns_kept": keep,
                                        "summaries_dropped": self.dropped - dropped}))

        if tokens > limit:
            compress(keep=self.keep_recent)
        if tokens > limit and not self.truncated:
            before, self.truncated = tokens, True
            messages = self.messages(extra)
            tokens = count(messages)
            events.append(FitEvent("truncate", before, tokens, {"result_chars": self.tight_result_chars}))
        if tokens > limit and last_resort:
            compress(keep=0)
        return messages, tokens, events

    def full_messages(self) -> list[Message]:
        """The whole history, untruncated and unsummarised (for trajectory logs)."""
        out: list[Message] = [{"role": "system", "content": self.system}, {"role": "user", "content": self.task}]
        for turn in self.turns:
            out.extend(turn.messages(None))
        return out

    def found_so_far(self) -> list[str]:
        """Summaries of the calls that worked, for a stage conclusion."""
        return [f"{r.call.brief()} -> {clip(r.outcome.content, 60)}"
                for t in self.turns for r in t.results if r.outcome.ok]
