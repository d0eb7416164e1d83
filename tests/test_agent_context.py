"""Compression keeps call/result pairs together and fits the limit; truncation keeps both ends."""

import pytest

from polyrl.agent.context import ToolResult, Transcript, Turn, truncate_result
from polyrl.agent.tools import ToolCall, ToolOutcome
from tests.agent_fakes import call, count_chars


def _turn(step: int, calls: int = 1, result: str = "some result text") -> Turn:
    tool_calls = [ToolCall(f"call_{step}_{k}", "add", {"a": step, "b": k}) for k in range(calls)]
    assistant = {"role": "assistant", "content": " ".join(call("add", a=step, b=k) for k in range(calls)),
                 "call_ids": [c.id for c in tool_calls]}
    return Turn(step, assistant, [ToolResult(c, ToolOutcome(f"{result} {step}")) for c in tool_calls])


def _pairs_intact(messages) -> bool:
    """Every tool message answers a call of the assistant message right before its run of
    tool messages, and every call of an assistant message is answered."""
    open_ids: set[str] = set()
    for m in messages:
        if m["role"] == "assistant":
            if open_ids:
                return False
            open_ids = set(m["call_ids"])
        elif m["role"] == "tool":
            if m["tool_call_id"] not in open_ids:
                return False
            open_ids.discard(m["tool_call_id"])
        elif open_ids:
            return False
    return not open_ids


@pytest.mark.parametrize("calls_per_turn", [1, 3])
@pytest.mark.parametrize("limit", [20, 60, 120, 200])
def test_compression_keeps_pairs_and_fits(calls_per_turn, limit):
    t = Transcript("system prompt", "the task", result_chars=400, tight_result_chars=40)
    for step in range(12):
        t.add(_turn(step, calls_per_turn))
    before = count_chars(t.messages())
    assert before > limit
    messages, tokens, events = t.fit(count_chars, limit)
    assert tokens == count_chars(messages) <= limit
    assert _pairs_intact(messages)
    assert events[0].action == "compress" and events[0].tokens_before == before
    assert "Earlier steps:" in messages[1]["content"]
    kept = [m for m in messages if m["role"] == "assistant"]
    assert not kept or kept[-1]["call_ids"][0] == "call_11_0"  # what is kept whole is the most recent


def test_summaries_name_calls_and_results():
    t = Transcript("sys", "task", keep_recent=1)
    for step in range(4):
        t.add(_turn(step))
    messages, _, events = t.fit(count_chars, count_chars(t.messages()) - 1)
    assert messages[1]["content"].startswith("task\nEarlier steps:\nadd(a=0, b=0) -> some result text 0")
    assert events[0].detail["turns_summarized"] == 1 and _pairs_intact(messages)


def test_compression_is_sticky_and_full_history_is_kept():
    t = Transcript("sys", "task", keep_recent=1)
    for step in range(6):
        t.add(_turn(step))
    t.fit(count_chars, 40)
    summarized = t.summarized
    assert summarized > 0
    t.add(_turn(6))
    messages, _, _ = t.fit(count_chars, 10_000)  # roomy now: nothing comes back uncompressed
    assert t.summarized == summarized and _pairs_intact(messages)
    full = t.full_messages()
    assert len([m for m in full if m["role"] == "tool"]) == 7  # the log keeps every result


def test_truncation_comes_after_compression():
    t = Transcript("sys", "task", result_chars=None, tight_result_chars=60, keep_recent=1)
    t.add(_turn(0, result="x" * 3000))
    messages, tokens, events = t.fit(count_chars, 100)
    assert [e.action for e in events] == ["truncate"]  # one turn, kept whole: nothing to compress
    assert tokens <= 100 and "[truncated: 3002 chars" in messages[-1]["content"]
    assert t.turns[0].results[0].outcome.content.startswith("x" * 3000)  # the full result is kept


def test_falls_back_to_summarising_everything():
    t = Transcript("sys", "task", tight_result_chars=40, keep_recent=2)
    for step in range(3):
        t.add(_turn(step, result="y" * 400))
    messages, tokens, events = t.fit(count_chars, 45)
    assert [e.action for e in events] == ["compress", "truncate", "compress"]
    assert tokens <= 45 and [m["role"] for m in messages] == ["system", "user"]
    assert "earlier steps omitted" in messages[1]["content"]


@pytest.mark.parametrize("limit", [16, 40, 100, 500])
def test_truncation_keeps_head_and_tail(limit):
    text = "HEAD-" + "m" * 2000 + "-TAIL"
    out = truncate_result(text, limit)
    assert out.startswith("[truncated: 2010 chars, kept ")
    body = out.split("\n", 1)[1]
    assert body.startswith("HEAD") and body.endswith("TAIL") and " ... " in body
    assert len(out) <= max(limit, 60)


def test_short_results_are_untouched():
    assert truncate_result("12", 10) == "12"
    assert truncate_result("x" * 10, 10) == "x" * 10
