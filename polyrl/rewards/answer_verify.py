"""answer_verify: is the completion's final answer symbolically equal to the gold answer?

Extraction (in the parent, cheap): the last `\\boxed{...}` (balanced, nested braces ok);
without one, the last "Final answer: X" / "The answer is X" / "Answer: X". Equivalence
(in worker processes, with a hard deadline): math-verify parses both sides as LaTeX, so
0.5, 1/2 and \\frac{1}{2} are equal.

Reward 1.0 with status "correct", else 0.0 with a status saying why: "wrong",
"no_answer", "empty" (an empty box or answer line), "hedged" (several different boxed
answers, or alternatives such as "2 or 3", "2, 3", "\\pm 2" when the gold is a single
value), "overlong" (more than `max_chars` characters; nothing is parsed), "timeout",
"unparsable" (math-verify found no expression), "gold_unparsable" (a bad task) and
"error" (the checker itself failed). Details always carry `extracted` and `gold`.

Out of scope: judging the reasoning, partial credit, multiple-choice letters, units.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from typing import Sequence

from polyrl.rewards.deadline_pool import DeadlinePool, Outcome
from polyrl.types import Score, Task

# ---------------------------------------------------------------------------- extraction

_BOX_OPEN = re.compile(r"\\(?:boxed|fbox)\s*\{")
_ANSWER_MARKER = re.compile(r"\b(?:final\s+answer(?:\s+is)?\s*[:=]?|answer\s+is\s*:?|answer\s*:)", re.I)
_WRAPPERS = ((r"\(", r"\)"), (r"\[", r"\]"), ("$$", "$$"), ("$", "$"))


@dataclass(frozen=True)
class Extraction:
    """The answers a completion commits to, in order of appearance; the last one counts."""

    answers: tuple[str, ...]
    source: str
    """"boxed", "answer_line" or "none"."""


def boxed_answers(text: str) -> list[str]:
    """Contents of every complete `\\boxed{...}` (an unclosed box is ignored).

    Braces nest; escaped braces (`\\{`, `\\}`) are content, not structure.
    """
    out = []
    for match in _BOX_OPEN.finditer(text):
        depth, i = 1, match.end()
        while i < len(text) and depth:
            if text[i] == "\\":
                i += 2
                continue
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        if depth == 0:
            out.append(text[match.end() : i - 1])
    return out


def clean_answer(answer: str) -> str:
    """Strip whitespace, markdown bold, math delimiters and a final full stop."""
    answer = answer.strip().strip("*").strip().removesuffix(".").rstrip()
    for left, right in _WRAPPERS:
        if answer.startswith(left) and answer.endswith(right) and len(answer) >= len(left) + len(right):
            answer = answer[len(left) : len(answer) - len(right)].strip()
            break
    return answer.removesuffix(".").strip()


def extract(text: str) -> Extraction:
    boxes = boxed_answers(text)
    if boxes:
        return Extraction(tuple(clean_answer(b) for b in boxes), "boxed")
    for line in reversed(text.splitlines()):
        markers = list(_ANSWER_MARKER.finditer(line))
        if markers:
            return Extraction((clean_answer(line[markers[-1].end() :]),), "answer_line")
    return Extraction((), "none")


# ------------------------------------------------------------------------------ hedging

_HEDGE_WORDS = re.compile(r"\b(?:or|and|either)\b", re.I)
_PLUS_MINUS = re.compile(r"±|∓|\\pm(?![a-zA-Z])|\\mp(?![a-zA-Z])")
_THOUSANDS = re.compile(r"(?<=\d),(?=\d{3}(?!\d))|\{,\}")


def is_hedged(answer: str, gold: str) -> bool:
    """Does `answer` offer alternatives where `gold` is one value?

    A marker the gold itself uses is not a hedge (a gold "(1, 2)" allows commas).
    "2/3" is a fraction and "1,000" a number, not alternatives.
    """
    if _HEDGE_WORDS.search(answer) and not _HEDGE_WORDS.search(gold):
        return True
    if _PLUS_MINUS.search(answer) and not _PLUS_MINUS.search(gold):
        return True
    return bool(re.search(r"[,;]", _THOUSANDS.sub("", answer))) and not re.search(r"[,;]", gold)


# ------------------------------------------------------------------ worker side (spawned)

_GOLD_CACHE: dict[str, list] = {}
_GOLD_CACHE_SIZE = 4096


def _init_worker() -> None:
    import math_verify  # noqa: F401 -- a slow import: do it before the clock runs

    # We disable math-verify's own signal timeouts (the parent owns the deadline); it
    # warns about that once per process.
    logging.getLogger("math_verify").setLevel(logging.ERROR)


def _parse(answer: str, fallback_to_string: bool) -> list:
    from math_verify import parse

    mode = "first_match" if fallback_to_string else "no_fallback"
    return parse(f"${answer}$", fallback_mode=mode, parsing_timeout=None)


def check_answers(item: tuple[str, tuple[str, ...]]) -> list[str]:
    """(gold, candidates) -> a verdict per candidate: "equal", "different",
    "unparsable", or "gold_unparsable" for all when the gold does not parse."""
    from math_verify import verify

    gold_text, candidates = item
    if gold_text not in _GOLD_CACHE:
        if len(_GOLD_CACHE) >= _GOLD_CACHE_SIZE:
            _GOLD_CACHE.clear()
        # A gold that is no expression still compares as a string; a candidate that is
        # none is "unparsable".
        _GOLD_CACHE[gold_text] = _parse(gold_text, fallback_to_string=True)
    gold = _GOLD_CACHE[gold_text]
    if not gold:
        return ["gold_unparsable"] * len(candidates)
    verdicts = []
    for candidate in candidates:
        parsed = _parse(candidate, fallback_to_string=False)
        if not parsed:
            verdicts.append("unparsable")
        else:
            verdicts.append("equal" if verify(gold, parsed, timeout_seconds=None) else "different")
    return verdicts


# ------------------------------------------------------------------------------ verifier


def _squash(answer: str) -> str:
    return "".join(answer.split())


def _status_from_verdicts(verdicts: list[str]) -> str:
    if "gold_unparsable" in verdicts:
        return "gold_unparsable"
    if all(v == "equal" for v in verdicts):
        return "correct"
    if len(verdicts) > 1:
        return "hedged"
    return {"different": "wrong", "unparsable": "unparsable"}[verdicts[0]]


def _from_outcome(outcome: Outcome, details: dict) -> Score:
    if outcome.status == "ok":
        status = _status_from_verdicts(outcome.value)
        return Score(1.0 if status == "correct" else 0.0, {**details, "status": status})
    status = "timeout" if outcome.status == "timeout" else "error"  # "error", "crashed"
    return Score(0.0, {**details, "status": status, "error": outcome.error})


class AnswerVerify:
    """Symbolic final-answer check against `task.answer`; see the module docstring."""

    name = "answer_verify"

    def __init__(self, max_chars: int = 2000, timeout_s: float = 5.0, workers: int = 1) -> None:
        self.max_chars = max_chars
        self.timeout_s = timeout_s
        self.workers = workers
        self._pool: DeadlinePool | None = None
        self._closed = False

    def score(self, tasks: Sequence[Task], completions: Sequence[str]) -> list[Score]:
        if self._closed:
            raise RuntimeError("AnswerVerify.score after close()")
        assert len(tasks) == len(completions)
        scores: list[Score | None] = []
        to_check: list[tuple[int, tuple[str, tuple[str, ...]], dict]] = []
        for task, text in zip(tasks, completions):
            if task.answer is None:
                raise ValueError(f"task {task.id!r} has no gold answer; answer_verify needs one")
            gold = clean_answer(str(task.answer))
            status, candidates, details = self._triage(text, gold)
            if status:
                scores.append(Score(1.0 if status == "correct" else 0.0, {**details, "status": status}))
            else:
                to_check.append((len(scores), (gold, candidates), details))
                scores.append(None)

        if to_check:
            outcomes = self._get_pool().map([item for _, item, _ in to_check])
            for (index, _, details), outcome in zip(to_check, outcomes):
                scores[index] = _from_outcome(outcome, details)
        return scores  # type: ignore[return-value]

    def _triage(self, text: str, gold: str) -> tuple[str, tuple[str, ...], dict]:
        """Everything decidable without math-verify: (status or "" when the candidates
        must go to a worker, the candidate answers, details)."""
        details: dict = {"extracted": None, "gold": gold}
        if len(text) > self.max_chars:
            return "overlong", (), {**details, "chars": len(text)}
        found = extract(text)
        if not found.answers:
            return "no_answer", (), details
        details |= {"extracted": found.answers[-1], "source": found.source}
        if not found.answers[-1]:
            return "empty", (), details
        # Boxing several different answers is a hedge unless all of them equal the gold.
        candidates = tuple(dict.fromkeys(a for a in found.answers if a))
        if len({_squash(c) for c in candidates}) == 1:
            candidates = (found.answers[-1],)
        else:
            details["candidates"] = list(candidates)
        if any(is_hedged(c, gold) for c in candidates):
            return "hedged", candidates, details
        if all(_squash(c) == _squash(gold) for c in candidates):
            return "correct", candidates, details  # an exact match needs no symbolic check
        return "", candidates, details

    def close(self) -> None:
        self._closed = True
        if self._pool is not None:
            self._pool.close()

    def _get_pool(self) -> DeadlinePool:
        if self._pool is None:
            self._pool = DeadlinePool(
                check_answers, workers=self.workers, timeout_s=self.timeout_s, initializer=_init_worker
            )
        return self._pool
