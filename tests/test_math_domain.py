"""MathDomain: determinism, disjoint splits, answers recomputed from the prompt text."""

from __future__ import annotations

import ast
import operator
import re

import pytest

from polyrl.domains.math import MathDomain
from polyrl.domains.pack import hash_split
from polyrl.domains.registry import UnknownDomain, available_domains, get_domain

_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul}


def _eval(expr: str) -> int:
    """Integer +, -, * with Python precedence; nothing else is accepted."""

    def walk(node: ast.AST) -> int:
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](walk(node.left), walk(node.right))
        if isinstance(node, ast.Constant) and type(node.value) is int:
            return node.value
        raise ValueError(f"unexpected expression {expr!r}")

    return walk(ast.parse(expr, mode="eval").body)


# Each word template, read back from its text: pattern -> answer from the numbers.
_WORD = [
    (r"\w+ has (\d+) \w+ and gets (\d+) more\. How many now\?", lambda a, b: a + b),
    (r"\w+ has (\d+) \w+ and gives away (\d+)\. How many are left\?", lambda a, b: a - b),
    (r"\w+ buys (\d+) bags of (\d+) (\w+)\. How many \3\?", lambda a, b: a * b),
    (r"(\d+) \w+ are shared by (\d+) kids\. How many each\?", lambda a, b: a // b),
    (r"\w+ has (\d+) \w+ and buys (\d+) bags of (\d+)\. How many now\?", lambda a, b, c: a + b * c),
    (r"\w+ has (\d+) \w+, sells (\d+) and gets (\d+)\. How many now\?", lambda a, b, c: a - b + c),
    (r"\w+ buys (\d+) bags of (\d+) \w+ and uses (\d+)\. How many left\?", lambda a, b, c: a * b - c),
]


def _solve(prompt: str) -> int:
    if m := re.fullmatch(r"What is ([\d +*-]+)\?", prompt):
        return _eval(m.group(1))
    if m := re.fullmatch(r"Solve for x: (\d+)x ([+-]) (\d+) = (-?\d+)\.", prompt):
        a, sign, b, c = int(m[1]), m[2], int(m[3]), int(m[4])
        rhs = c - b if sign == "+" else c + b
        assert rhs % a == 0, prompt
        return rhs // a
    for pattern, formula in _WORD:
        if m := re.fullmatch(pattern, prompt):
            numbers = [int(g) for g in m.groups() if g.isdigit()]
            if "shared" in prompt:
                assert numbers[0] % numbers[1] == 0, prompt
            return formula(*numbers)
    raise AssertionError(f"no reader for prompt {prompt!r}")


@pytest.fixture(scope="module")
def domain() -> MathDomain:
    return MathDomain()


def test_sample_is_a_pure_function_of_its_arguments(domain: MathDomain) -> None:
    a = domain.sample("train", 50, seed=3)
    assert a == MathDomain().sample("train", 50, seed=3)
    assert a != domain.sample("train", 50, seed=4)
    assert domain.sample("heldout", 20, seed=0) == domain.sample("heldout", 20, seed=0)


def test_train_and_heldout_never_share_a_prompt(domain: MathDomain) -> None:
    train = {t.prompt for seed in range(3) for t in domain.sample("train", 1000, seed)}
    heldout = {t.prompt for seed in range(3) for t in domain.sample("heldout", 400, seed)}
    assert len(train) > 2000 and len(heldout) > 800
    assert not train & heldout
    assert all(hash_split(p) == "train" for p in train)
    assert all(hash_split(p) == "heldout" for p in heldout)


def test_answers_match_the_prompt_text(domain: MathDomain) -> None:
    for task in domain.sample("train", 800, seed=1) + domain.sample("heldout", 200, seed=1):
        assert task.answer == str(_solve(task.prompt)), task


def test_prompts_are_short_ascii_and_ids_follow_the_scheme(domain: MathDomain) -> None:
    for task in domain.sample("heldout", 500, seed=2):
        assert task.prompt.isascii() and len(task.prompt) <= 60, task.prompt
        assert re.fullmatch(rf"math-heldout-{task.difficulty}-[0-9a-f]{{10}}", task.id)
        assert task.domain == "math" and task.split == "heldout"
        assert re.fullmatch(r"-?\d+", task.answer or "")


def test_levels_select_the_problem_kinds() -> None:
    level1 = MathDomain(levels=(1,)).sample("train", 100, seed=0)
    assert {t.difficulty for t in level1} == {1}
    for t in level1:
        assert all(len(n) == 1 for n in re.findall(r"\d+", t.prompt)), t.prompt
        assert int(t.answer or "") >= 0
    level4 = MathDomain(levels=(4,)).sample("train", 100, seed=0)
    assert {t.data["kind"] for t in level4} == {"algebra", "expression"}
    assert {t.difficulty for t in MathDomain().sample("train", 200, seed=0)} == {1, 2, 3, 4}


def test_weights_control_the_level_mix() -> None:
    tasks = MathDomain(levels=(1, 3), weights=(0.0, 1.0)).sample("train", 50, seed=0)
    assert {t.difficulty for t in tasks} == {3}


@pytest.mark.parametrize(
    "options", [{"levels": ()}, {"levels": (5,)}, {"levels": (1, 2), "weights": (1.0,)}, {"weights": (0, 0, 0, 0)}]
)
def test_bad_options_are_clear_errors(options: dict) -> None:
    with pytest.raises(ValueError, match="math"):
        MathDomain(**options)


def test_small_levels_repeat_only_when_exhausted() -> None:
    tasks = MathDomain(levels=(1,)).sample("heldout", 300, seed=0)
    assert len(tasks) == 300
    assert 20 < len({t.prompt for t in tasks}) < 300
    assert len({t.prompt for t in MathDomain(levels=(1,)).sample("heldout", 20, seed=0)}) == 20


def test_demonstrations_end_in_the_right_box(domain: MathDomain) -> None:
    for task in domain.sample("train", 400, seed=5):
        demo = domain.demonstration(task)
        assert demo.endswith(f"\\boxed{{{task.answer}}}") and len(demo) <= 120, demo
        assert demo.isascii()
    algebra = next(t for t in MathDomain(levels=(4,)).sample("train", 50, 0) if t.data["kind"] == "algebra")
    pattern = r"\d+x = -?\d+ [+-] \d+ = -?\d+, x = -?\d+ / \d+ = -?\d+\.\n\\boxed\{-?\d+\}"
    assert re.fullmatch(pattern, domain.demonstration(algebra))


def test_registry_builds_math_and_names_the_known_domains() -> None:
    assert "math" in available_domains()
    math = get_domain("math", levels=(2,))
    assert math.name == "math" and math.default_verifier == "answer_verify"
    with pytest.raises(UnknownDomain, match="available: .*math"):
        get_domain("chess")
