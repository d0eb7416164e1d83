"""Failure attribution on a planted suite: engineering failures confirmed by the flip, a
capability failure left alone, and evidence that a re-run does not confirm.

The model is a deterministic reader (no weights): it calls the tool a task needs and
answers from what the tool result *as shown* contains, so a result cut at the cap hides
the answer exactly as it would from a real model; single-call tasks get fixed replies,
cut at max_tokens (4 characters a token) with finish reason "length".
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

import pytest

from polyrl.agent.call_format import format_call, parse_calls
from polyrl.agent.model import ModelReply, ModelRequest, Usage
from polyrl.evals.attribution import lift, Evidence
from polyrl.evals.document import build_document
from polyrl.evals.limits import EvalLimits
from polyrl.evals.prices import PriceCard
from polyrl.evals.runner import Verifiers, run_task
from polyrl.evals.session import run_eval
from polyrl.evals.suite import load_suite
from tests.agent_fakes import count_chars

DOOR_NOTE = " ".join(f"Rule {i}: visitors sign in at the desk." for i in range(30))
DOOR_NOTE = DOOR_NOTE[:600] + " The door code is 4821. " + DOOR_NOTE[600:]
INVENTORY = json.dumps([{"sku": i, "shelf": f"A{i % 7}"} for i in range(40)])
REPLIES = {  # single-call prompts -> the reader's full reply
    "1 + 1": "\\boxed{2}",
    "6 * 7": "Six times seven: 6 * 7 = 42, so the answer is \\boxed{42}",
    "5 + 5": "\\boxed{11}",
    "9 * 9": "Nine times nine: 9 * 9 = 80, so the answer is \\boxed{80}",
    "2 + 3": "\\boxed{5}",
}


class Reader:
    """A ChatModel that reads what it is shown; see the module docstring."""

    provider, tool_format, tools_style = "test", "text", "compact"

    def __init__(self, name: str, context_window: int | None):
        self.name, self.context_window, self.calls = name, context_window, 0

    def count_tokens(self, messages, tools) -> int:
        return count_chars(messages)

    def complete(self, request: ModelRequest) -> ModelReply:
        self.calls += 1
        text = self._reply(request)
        finish = "stop"
        if len(text) > 4 * request.max_tokens:
            text, finish = text[:4 * request.max_tokens], "length"
        usage = Usage(count_chars(request.messages), len(text) // 4 + 1)
        return ModelReply(text, parse_calls(text, f"call_{self.calls}"), {"role": "assistant", "content": text},
                          usage, finish, self.name, 0.001)

    def _reply(self, request: ModelRequest) -> str:
        if not request.tools.tools:
            prompt = request.messages[-1]["content"]
            return next(reply for key, reply in REPLIES.items() if key in prompt)
        task = request.messages[1]["content"]
        results = [m["content"] for m in request.messages if m["role"] == "tool"]
        if "door code" in task:
            if not results:
                return format_call("note", {"topic": "policy"})
            found = re.search(r"door code is (\d+)", " ".join(results))
            return f"<answer>{found.group(1) if found else 'unknown'}</answer>"
        if "inventory" in task:
            if not results:
                return format_call("note", {"topic": "inventory"})
            try:
                return f"<answer>{len(json.loads(results[-1]))}</answer>"
            except ValueError:
                return "<answer>unknown</answer>"
        if not results:
            return format_call("price", {"item": "pen"})
        return f"<answer>{results[-1]}</answer>"


@dataclass
class ReaderAdapter:
    spec: str = "reader"
    kind: str = "test"
    context_window: int | None = None

    def chat_model(self, context_window):
        return Reader(self.spec, context_window)

    def close(self) -> None:
        pass


def _world(**notes):
    return {"items": {"pen": {"price": 12, "stock": 3}, "cup": {"price": 7, "stock": 0}}, "notes": notes}


def _agent(task_id, prompt, answer, world, tag="failure_mode", limits=None):
    meta = {"tag": tag, **({"limits": limits} if limits else {})}
    return {"id": task_id, "domain": "agent", "prompt": prompt, "answer": answer, "verifier": "success_minus_cost",
            "world": world, "metadata": meta}


def _math(task_id, prompt, answer, tag="typical", limits=None):
    meta = {"tag": tag, **({"limits": limits} if limits else {})}
    return {"id": task_id, "domain": "math", "prompt": prompt, "answer": answer, "metadata": meta}


def _pen_prompt_tokens(tmp_path) -> int:
    """Prompt tokens of the pen task's first call (to plant a budget that fits only that call)."""
    path = tmp_path / "probe.jsonl"
    path.write_text(json.dumps(_agent("probe", "What is the price of a pen?", "12", _world())) + "\n")
    verifiers = Verifiers()
    run = run_task(load_suite(path).tasks[0], ReaderAdapter(), EvalLimits(), verifiers)
    verifiers.close()
    assert run.success and run.model_calls == 2
    return run.trajectory["steps"][0]["usage"]["input_tokens"]


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("planted")
    first_call = _pen_prompt_tokens(tmp_path)
    lines = [
        _math("ok", "What is 1 + 1?", "2"),
        _agent("door", "What is the door code? See the policy note.", "4821", _world(policy=DOOR_NOTE)),
        _agent("door_window", "What is the door code? Read the policy note.", "4821", _world(policy=DOOR_NOTE),
               limits={"result_chars": None, "context_window": 300}),
        _agent("inventory", "How many records are in the inventory note?", "40", _world(inventory=INVENTORY)),
        _agent("budget", "What is the price of a pen?", "12", _world(), limits={"budget": first_call + 64}),
        _math("cut", "What is 6 * 7?", "42", limits={"max_tokens": 8}),
        _math("wrong", "What is 5 + 5?", "10"),
        _math("cut_and_wrong", "What is 9 * 9?", "81", tag="edge", limits={"max_tokens": 8}),
        _math("overflow", "Read this. " + "Nothing to see here. " * 40 + "What is 2 + 3?", "5", tag="edge",
              limits={"context_window": 60}),
    ]
    path = tmp_path / "planted.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    suite = load_suite(path)
    records = run_eval(suite, [ReaderAdapter()], EvalLimits())
    doc = build_document(suite, [ReaderAdapter()], EvalLimits(), records, PriceCard())
    return {r.run.task_id: r for r in records}, doc


def _kinds(record) -> set[str]:
    return {e.kind for e in record.attribution.evidence}


@pytest.mark.parametrize("task_id, kinds, lifted", [
    ("door", {"tool_result_truncated"}, {"result_chars": None}),
    ("door_window", {"context_truncated", "tool_result_truncated"}, {"context_window": "unlimited"}),
    ("inventory", {"tool_result_truncated", "tool_result_unparseable"}, {"result_chars": None}),
    ("budget", {"budget_exhausted"}, {"budget": None}),
    ("cut", {"output_cut"}, {"max_tokens": 32, "agent_max_tokens": 256, "conclusion_tokens": 128}),
    ("overflow", {"prompt_overflow"}, {"context_window": "unlimited"}),
])
def test_planted_engineering_failures_are_confirmed_by_the_flip(planted, task_id, kinds, lifted):
    records, _ = planted
    record = records[task_id]
    assert not record.run.success
    assert record.attribution.label == "engineering"
    assert _kinds(record) == kinds
    assert record.attribution.flipped is True and record.attribution.rerun.success
    assert record.attribution.lifted == lifted


def test_the_planted_failures_fail_for_the_planted_reason(planted):
    records, _ = planted
    assert records["door"].run.answer == "unknown"  # the code sat past the 400-character cap
    # raw results, but a window too small for this one: the loop cut it to the tight cap to fit
    assert [e["event"] for e in records["door_window"].run.events].count("context.truncate") == 1
    assert records["budget"].run.stop_reason == "budget" and records["budget"].run.answer is None
    assert records["cut"].run.stop_reason == "length" and records["cut"].run.score.details["status"] == "no_answer"
    assert records["overflow"].run.stop_reason == "context_overflow" and records["overflow"].run.model_calls == 0


def test_a_capability_failure_has_no_evidence_and_no_rerun(planted):
    records, _ = planted
    record = records["wrong"]
    assert record.attribution.label == "capability"
    assert record.attribution.evidence == [] and record.attribution.rerun is None
    assert record.attribution.flipped is None


def test_evidence_stands_only_if_the_rerun_flips(planted):
    records, _ = planted
    record = records["cut_and_wrong"]  # cut at max_tokens, but wrong with room to finish too
    assert _kinds(record) == {"output_cut"}
    assert record.attribution.tested and record.attribution.flipped is False
    assert record.attribution.label == "capability"
    assert record.attribution.rerun.score.details["status"] == "wrong"


def test_successes_are_not_attributed_and_the_summary_gives_the_flip_rate(planted):
    records, doc = planted
    assert records["ok"].run.success and records["ok"].attribution is None
    summary = doc["summary"]["attribution"]
    assert (summary["failures"], summary["engineering"], summary["capability"]) == (8, 6, 2)
    assert (summary["tested"], summary["flipped"]) == (7, 6)
    assert summary["flip_rate"] == pytest.approx(6 / 7)
    assert summary["by_evidence"]["output_cut"] == {"seen": 2, "confirmed": 1}
    assert summary["by_tag"] == {"typical": {"engineering": 1, "capability": 1},
                                 "failure_mode": {"engineering": 4, "capability": 0},
                                 "edge": {"engineering": 1, "capability": 1}}
    assert doc["models"][0]["budget_exhausted_ids"] == ["budget"]
    entry = next(t for t in doc["tasks"] if t["id"] == "budget")
    assert entry["attribution"]["label"] == "engineering" and entry["budget"]["exhausted"] is True
    assert entry["attribution"]["evidence"][0]["kind"] == "budget_exhausted"


def test_lift_lifts_each_implicated_limit():
    base = EvalLimits(budget=100, max_steps=3, timeout_s=5.0, context_window=256)
    lifted = lift(base, [Evidence("step_limit", "", ("max_steps",)), Evidence("timeout", "", ("timeout_s",)),
                         Evidence("context_compressed", "", ("context_window",))], "success_minus_cost")
    assert base.changed(lifted) == {"max_steps": 6, "timeout_s": None, "context_window": "unlimited"}
    hinted = lift(base, [Evidence("answer_format", "", ("prompt",))], "answer_verify")
    assert hinted.prompt_suffix.endswith("\\boxed{ANSWER}.") and base.changed(hinted).keys() == {"prompt_suffix"}
