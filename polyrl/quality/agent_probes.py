"""Probes of an agent task graded by success_minus_cost (the shop questions of the agent domain,
and any pack line that carries a shop `world` and its `gold_calls`).

success_minus_cost grades the final answer and charges the calls and tokens spent, so the
probes are episode records (`AgentResult.to_completion()`'s JSON) and final messages:

- the reference (solvability, must score 1): the answer the task's gold calls give when they
  run on a fresh copy of its world, with no counts recorded. A lookup's answer is its last
  result; a comparison's the item whose price came out highest; an absent item's "none",
  after the lookup failed. So a world, gold calls and stated answer that disagree is a
  finding, not a silent 0 for every rollout;
- cost (must score above 0 and below 1): the reference with the gold calls' steps and 400
  tokens recorded: calls are charged, and a right answer still pays;
- negative controls (must score 0): no answer at all; "I don't know"; another task's answer
  (when it differs); "none" (when the answer is not none);
- exploits (must score 0): hedges over candidates, which a lenient match would pay: the
  answer between its neighbours ("11, 12, 13") for a number, every item of the world for an
  item; the answer spelled out after the wrong one ("cup, then pen");
- false negatives (must score 1): the answer in another case and with an article, or as a
  decimal ("12.0"), with trailing punctuation.

Out of scope: a policy-level shortcut no single record shows: on a question between two
items, naming the first one without a call is right about half the time (the domain's
reward charges that guess nothing for the calls it skipped).
"""

from __future__ import annotations

import json
from typing import Any

from polyrl.agent.tools import ToolCall
from polyrl.quality.probes import Probe
from polyrl.types import Task


def reference_answer(task: Task) -> str | None:
    """The answer the gold calls give on a fresh world of `task` (see the module docstring);
    None when the task has no gold calls, or they do not lead to an answer."""
    from polyrl.domains.agent import AgentDomain

    gold = task.data.get("gold_calls")
    if not isinstance(gold, list) or not gold:
        return None
    tools = AgentDomain.toolbox(task)
    results: list[tuple[dict[str, Any], Any]] = []
    for k, call in enumerate(gold):
        if not isinstance(call, dict):
            return None
        outcome = tools.run(ToolCall(f"gold_{k}", call.get("name"), dict(call.get("arguments") or {})))
        results.append((call, outcome))
    last = results[-1][1]
    if not last.ok:
        return "none"
    prices = [(float(o.content), c["arguments"].get("item")) for c, o in results
              if c.get("name") == "price" and o.ok and _number(o.content)]
    if len(prices) > 1 and len(prices) == len(results):  # only price lookups: which costs more
        return max(prices)[1]
    return last.content.strip()


def reference_probe(task: Task) -> Probe | None:
    """The solvability probe; None for a task without gold calls (hygiene only). Gold calls that
    cannot run on the task's world give a probe that scores 0, named with the reason."""
    name = "the answer the gold calls give on the task's world"
    try:
        answer = reference_answer(task)
    except (ValueError, KeyError, TypeError) as err:
        return Probe("solvability", f"{name} (they cannot run: {err})", "", "full")
    if answer is None:
        return None
    return Probe("solvability", name, _record(answer), "full")


def agent_probes(task: Task, other_answer: str | None) -> list[Probe]:
    """Every probe of a task except the solvability one; `other_answer` is another task's answer."""
    answer = str(task.answer)
    gold = task.data.get("gold_calls") or []
    probes = [
        Probe("cost", "the right answer after the gold calls, 400 tokens",
              _record(answer, steps=len(gold) + 1, tokens=400), "partial"),
        Probe("negative_control", "no answer", json.dumps({"answer": None, "steps": 1, "tokens": 50}), "zero"),
        Probe("negative_control", "a generic 'I don't know'", "<answer>I don't know</answer>", "zero"),
        Probe("false_negative", "the answer in capitals with an article and a full stop",
              f"<answer>The {answer.upper()}.</answer>", "full"),
    ]
    if answer.lower() != "none":
        probes.append(Probe("negative_control", "'none'", _record("none"), "zero"))
    if other_answer is not None and other_answer.strip().lower() != answer.strip().lower():
        probes.append(Probe("negative_control", "another task's answer", _record(other_answer), "zero"))
    if _number(answer):
        value = int(float(answer))
        probes += [
            Probe("exploit", "the answer between its neighbours", _record(f"{value - 1}, {value}, {value + 1}"), "zero"),
            Probe("false_negative", "the answer as a decimal", _record(f"{value}.0"), "full"),
        ]
    else:
        items = sorted(task.data.get("world", {}).get("items", {}))
        if len(items) > 1 and answer in items:
            wrong = next(i for i in items if i != answer)
            probes += [
                Probe("exploit", "every item of the world", _record(", ".join(items)), "zero"),
                Probe("exploit", "the wrong item, then the right one", _record(f"{wrong}, then {answer}"), "zero"),
            ]
    return probes


def _record(answer: str, steps: int | None = None, tokens: int | None = None) -> str:
    """An episode record with this answer (and these counts, when given)."""
    counts = {} if steps is None else {"steps": steps, "tokens": tokens or 0}
    return json.dumps({"answer": answer, **counts})


def _number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True
