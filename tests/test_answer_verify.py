"""answer_verify (extraction, equivalence, failure statuses) and the deadline pool."""

from __future__ import annotations

import os
import time
from typing import Iterator

import pytest

from polyrl.rewards.answer_verify import AnswerVerify, boxed_answers, extract, is_hedged
from polyrl.rewards.deadline_pool import DeadlinePool
from polyrl.rewards.registry import get_verifier
from polyrl.types import Task

# ------------------------------------------------------------------------- extraction


def test_boxed_answers_balance_nested_braces() -> None:
    text = r"so \boxed{\frac{1}{\sqrt{2}}} and \boxed{\{1, 2\}} then \boxed{3"
    assert boxed_answers(text) == [r"\frac{1}{\sqrt{2}}", r"\{1, 2\}"]


@pytest.mark.parametrize(
    "text, answers, source",
    [
        (r"first \boxed{1}, finally $\boxed{42}$.", ("1", "42"), "boxed"),
        ("work...\nFinal answer: 17", ("17",), "answer_line"),
        ("The answer is $\\frac{3}{4}$.", (r"\frac{3}{4}",), "answer_line"),
        ("Answer: 12\nsome chatter\n**Final Answer:** 13.", ("13",), "answer_line"),
        (r"Answer: 5 but really \boxed{6}", ("6",), "boxed"),
        ("I think it is 12", (), "none"),
    ],
)
def test_extract(text: str, answers: tuple[str, ...], source: str) -> None:
    found = extract(text)
    assert (found.answers, found.source) == (answers, source)


@pytest.mark.parametrize(
    "answer, gold, hedged",
    [
        ("2 or 3", "2", True),
        ("either 2 or 3", "3", True),
        ("2 and 3", "2", True),
        ("2, 3", "2", True),
        ("2; 3", "3", True),
        (r"\pm 2", "2", True),
        ("±2", "2", True),
        ("2/3", r"\frac{2}{3}", False),
        ("1,000", "1000", False),
        ("(1, 2)", "(1,2)", False),
        (r"\{1, 2\}", r"\{1,2\}", False),
        ("-5", "-5", False),
    ],
)
def test_is_hedged(answer: str, gold: str, hedged: bool) -> None:
    assert is_hedged(answer, gold) is hedged


# --------------------------------------------------------------------------- verifier


@pytest.fixture(scope="module")
def verifier() -> Iterator[AnswerVerify]:
    v = AnswerVerify(max_chars=2000, timeout_s=5.0)
    yield v
    v.close()


def _task(answer: str) -> Task:
    return Task(id="t", domain="math", prompt="?", answer=answer)


CASES = [
    # (gold, completion, reward, status)
    ("85", "47 + 38 = 85.\n\\boxed{85}", 1.0, "correct"),
    ("0.5", r"\boxed{\frac{1}{2}}", 1.0, "correct"),
    (r"\frac{1}{2}", r"\boxed{1/2}", 1.0, "correct"),
    ("1/2", r"\boxed{0.5}", 1.0, "correct"),
    ("5", r"\boxed{\frac{10}{\sqrt{4}}}", 1.0, "correct"),
    ("-3", "Final answer: -3", 1.0, "correct"),
    ("1000", "The answer is 1,000.", 1.0, "correct"),
    ("5", r"\boxed{5} and again \boxed{5.0}", 1.0, "correct"),
    ("2/3", r"\boxed{2/3}", 1.0, "correct"),
    ("85", r"\boxed{86}", 0.0, "wrong"),
    ("85", "The answer is 84.", 0.0, "wrong"),
    ("85", "eighty-five, I think", 0.0, "no_answer"),
    ("85", r"so \boxed{}", 0.0, "empty"),
    ("85", r"\boxed{  }", 0.0, "empty"),
    ("2", r"\boxed{2 \text{ or } 3}", 0.0, "hedged"),
    ("2", "The answer is 2 or 3", 0.0, "hedged"),
    ("2", r"\boxed{2, 3}", 0.0, "hedged"),
    ("2", r"\boxed{\pm 2}", 0.0, "hedged"),
    ("5", r"\boxed{5} or maybe \boxed{6}", 0.0, "hedged"),
    ("5", r"\boxed{6} or maybe \boxed{5}", 0.0, "hedged"),
    ("5", r"\boxed{\%}", 0.0, "unparsable"),
]


def test_scores_and_statuses(verifier: AnswerVerify) -> None:
    scores = verifier.score([_task(g) for g, *_ in CASES], [c for _, c, *_ in CASES])
    got = [(s.value, s.details["status"]) for s in scores]
    assert got == [(r, st) for *_, r, st in CASES]
    for score, (gold, *_) in zip(scores, CASES):
        assert score.details["gold"] == gold and "extracted" in score.details


def test_details_name_the_extracted_answer(verifier: AnswerVerify) -> None:
    [score] = verifier.score([_task("85")], [r"\boxed{86}"])
    assert score.details == {"status": "wrong", "extracted": "86", "gold": "85", "source": "boxed"}


def test_overlong_is_checked_before_parsing(verifier: AnswerVerify) -> None:
    text = "x" * 2000 + r"\boxed{85}"
    [score] = verifier.score([_task("85")], [text])
    assert (score.value, score.details["status"], score.details["extracted"]) == (0.0, "overlong", None)


def test_adversarial_answer_times_out_and_the_verifier_recovers() -> None:
    v = AnswerVerify(timeout_s=1.0)
    try:
        slow, fine = v.score([_task("5"), _task("5")], [r"\boxed{9^{9^{9^{9}}}}", r"\boxed{3+2}"])
        assert (slow.value, slow.details["status"]) == (0.0, "timeout")
        assert (fine.value, fine.details["status"]) == (1.0, "correct")
        [again] = v.score([_task("7")], [r"\boxed{14/2}"])
        assert again.details["status"] == "correct"
    finally:
        v.close()


def test_task_without_gold_is_a_user_error(verifier: AnswerVerify) -> None:
    with pytest.raises(ValueError, match="no gold answer"):
        verifier.score([Task(id="t", domain="math", prompt="?")], ["\\boxed{1}"])


def test_registry_builds_it_and_score_after_close_is_an_error() -> None:
    v = get_verifier("answer_verify", max_chars=100)
    assert isinstance(v, AnswerVerify) and v.max_chars == 100
    assert v.score([_task("1")], [r"\boxed{1}"])[0].value == 1.0  # exact match: no worker started
    v.close()
    with pytest.raises(RuntimeError, match="after close"):
        v.score([_task("1")], [r"\boxed{1}"])


# ----------------------------------------------------------------------- deadline pool
# Pool functions must be importable by the workers: top level of this module.


def slow_double(item: tuple[str, int]) -> int:
    mode, x = item
    if mode == "hang":
        time.sleep(60)
    if mode == "raise":
        raise ValueError(f"bad {x}")
    if mode == "die":
        os._exit(3)
    return 2 * x


def test_pool_kills_a_hanging_worker_and_keeps_working() -> None:
    with DeadlinePool(slow_double, workers=1, timeout_s=1.0) as pool:
        outcomes = pool.map([("ok", 1), ("hang", 2), ("ok", 3)])
        assert [o.status for o in outcomes] == ["ok", "timeout", "ok"]
        assert [outcomes[0].value, outcomes[2].value] == [2, 6]
        assert [o.value for o in pool.map([("ok", 4), ("ok", 5)])] == [8, 10]


def test_pool_reports_errors_and_crashes_as_values() -> None:
    with DeadlinePool(slow_double, workers=2, timeout_s=5.0) as pool:
        items = [("ok", 1), ("raise", 2), ("die", 3), ("ok", 4), ("ok", 5)]
        outcomes = pool.map(items)
        assert [o.status for o in outcomes] == ["ok", "error", "crashed", "ok", "ok"]
        assert "ValueError: bad 2" in outcomes[1].error
        assert [o.value for o in outcomes if o.status == "ok"] == [2, 8, 10]
        assert pool.map([]) == []


def test_pool_close_kills_workers() -> None:
    pool = DeadlinePool(slow_double, workers=2, timeout_s=5.0)
    pool.map([("ok", 1), ("ok", 2)])
    processes = [w.process for w in pool._workers]
    pool.close()
    assert all(p.poll() is not None for p in processes)
    with pytest.raises(RuntimeError, match="after close"):
        pool.map([("ok", 1)])
