"""The long-context domain (domains/longctx.py): every gold answer equals what an independent
solver reads off the assembled document, lengths are the model's tokens, the split is fixed
and disjoint, a length sweep asks the same questions, options fail clearly, the audit passes."""

from __future__ import annotations

import ast
import re
from collections import Counter

import pytest

from polyrl.domains.longctx import KINDS, LEVEL_TOKENS, LongContextDomain, assemble, consistency
from polyrl.domains.registry import available_domains, get_domain
from polyrl.types import Task
from tests.helpers import tiny_tokenizer


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return tiny_tokenizer(tmp_path_factory.mktemp("tok"))


TOKENS = 3072  # the test tokenizer has about one token per character: level 4's evidence needs room


@pytest.fixture(scope="module")
def tasks(tok) -> list[Task]:
    domain = LongContextDomain(tokenizer=tok, tokens=TOKENS)
    return domain.sample("train", 48, seed=0) + domain.sample("heldout", 12, seed=0)


def _document(task: Task) -> str:
    body = task.prompt.split("\n\n", 1)[1]
    return body.rsplit("\n\nQuestion: ", 1)[0]


def _question(task: Task) -> str:
    return task.prompt.rsplit("\n\nQuestion: ", 1)[1]


def _solve(task: Task) -> int:
    """The answer, read off the prompt without the generator's bookkeeping."""
    doc, question = _document(task), _question(task)
    kind = task.data["kind"]
    if kind == "variable_tracking":
        defs = dict(re.findall(r"^VAR (\w+) = (.+)\.$", doc, re.M))
        name = re.search(r"variable (\w+)\?", question)[1]
        while defs[name].startswith("VAR "):
            name = defs[name][4:]
        return int(defs[name])
    if kind == "multikey_retrieval":
        key = re.search(r"access code of (\S+)\?", question)[1]
        (code,) = re.findall(rf"The access code of {re.escape(key)} is (\d+)\.", doc)
        return int(code)
    if kind == "consistency":
        first: dict[str, str] = {}
        contradicting = []
        for label, subject, value in re.findall(r"^Statement (\d+): (.+?) (\d+)(?: \w+)?\.$", doc, re.M):
            if subject in first and first[subject] != value:
                contradicting.append(int(label))
            first.setdefault(subject, value)
        (label,) = contradicting
        return label
    if kind == "aggregation":
        counts = Counter(re.findall(r"Sighted: a (\w+) ", doc))
        if m := re.search(r"How many more (\w+) sightings than (\w+)", question):
            return counts[m[1]] - counts[m[2]]
        return counts[re.search(r"How many (\w+) sightings", question)[1]]
    tree = ast.parse(doc)  # the code kinds: a Python file
    if kind == "code_returns":
        namespace: dict = {}
        exec(compile(tree, "<longctx>", "exec"), namespace)  # our own generated arithmetic
        m = re.search(r"What does (f_\d+)\((\d+)\) return", question)
        return namespace[m[1]](int(m[2]))
    callers: dict[str, set[str]] = {}
    for fn in tree.body:
        for node in ast.walk(fn):
            if isinstance(node, ast.Call):
                callers.setdefault(node.func.id, set()).add(fn.name)
    target = re.search(r"calls (f_\d+)\?", question)[1]
    (caller,) = callers[target]
    if "the function that calls" in question:
        (caller,) = callers[caller]
    return int(caller.removeprefix("f_"))


def test_every_gold_answer_is_what_the_document_says(tasks: list[Task]) -> None:
    assert {t.data["kind"] for t in tasks} == set(KINDS)
    assert {t.difficulty for t in tasks} == {1, 2, 3, 4}
    for task in tasks:
        assert task.answer == str(_solve(task)), task.id


def test_prompts_are_their_length_in_the_models_tokens(tok, tasks: list[Task]) -> None:
    for task in tasks:
        measured = len(tok.encode(task.prompt))
        assert task.data["tokens"] == measured and task.data["target_tokens"] == TOKENS
        assert TOKENS - 64 <= measured <= TOKENS, task.id
    # Without `tokens`, each level has its own length.
    by_level = LongContextDomain(levels=(1, 3), tokenizer=tok).sample("train", 8, seed=1)
    for task in by_level:
        assert LEVEL_TOKENS[task.difficulty] - 64 <= len(tok.encode(task.prompt)) <= LEVEL_TOKENS[task.difficulty]


def test_a_length_sweep_asks_the_same_questions(tok) -> None:
    short = LongContextDomain(levels=(1,), tokenizer=tok, tokens=512).sample("heldout", 6, seed=3)
    long = LongContextDomain(levels=(1,), tokenizer=tok, tokens=2048).sample("heldout", 6, seed=3)
    assert [(_question(a), a.answer, a.data["question_id"]) for a in short] == [
        (_question(b), b.answer, b.data["question_id"]) for b in long]
    assert all(len(tok.encode(b.prompt)) > 3 * len(tok.encode(a.prompt)) for a, b in zip(short, long))


def test_sampling_is_seeded_and_the_splits_never_share_a_question(tok) -> None:
    domain = LongContextDomain(levels=(1,), tokenizer=tok, tokens=512)
    a, b = domain.sample("train", 10, seed=5), domain.sample("train", 10, seed=5)
    assert [t.prompt for t in a] == [t.prompt for t in b]
    assert [t.prompt for t in a] != [t.prompt for t in domain.sample("train", 10, seed=6)]
    # The split is decided on the evidence and question (question_id), whatever the filler.
    train = {t.data["question_id"] for t in domain.sample("train", 60, seed=0)}
    heldout = domain.sample("heldout", 20, seed=0)
    assert all(t.split == "heldout" for t in heldout) and len(train) == 60
    assert not train & {t.data["question_id"] for t in heldout}
    assert [t.data["question_id"] for t in heldout] == [t.data["question_id"] for t in domain.sample("heldout", 20, 0)]


def test_consistency_has_exactly_one_contradiction_even_with_restatements() -> None:
    import random

    for seed in range(200):  # restatements of the contradicted fact must come before the contradiction
        core = consistency(random.Random(seed), 4)
        task = Task("t", "longctx", "Intro\n\n" + "\n".join(core.needles) + f"\n\nQuestion: {core.question}",
                    str(core.answer), data={"kind": "consistency"})
        assert _solve(task) == core.answer


def test_level_0_is_a_warm_up_drawn_only_when_named(tok) -> None:
    """Level 0: one hop and no distractors; a consistency question's contradiction is the only
    repeated fact, so a repeat gives the answer; level 1 adds agreeing restatements."""
    import random

    assert 0 not in LongContextDomain(tokenizer=tok).levels
    tasks = LongContextDomain(levels=(0,), tokenizer=tok, tokens=TOKENS).sample("train", 36, seed=2)
    assert {t.data["kind"] for t in tasks} == set(KINDS) and all(t.difficulty == 0 for t in tasks)
    for task in tasks:
        assert _solve(task) == int(task.answer), task.id
    def subjects(needles: tuple[str, ...]) -> list[str]:  # "Statement 123: The X of Y has 12 floors."
        return [re.sub(r" \d+( \w+)?\.$", "", n.split(": ", 1)[1]) for n in needles]

    for seed in range(100):
        said = subjects(consistency(random.Random(seed), 0).needles)
        assert len(said) == 4 and len(set(said)) == 3
    assert any(len(set(said := subjects(consistency(random.Random(seed), 1).needles))) < len(said) - 1
               for seed in range(100))


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"levels": (5,)}, r"longctx levels must be a non-empty subset of \(0, 1, 2, 3, 4\)"),
        ({"kinds": ("haystack",)}, r"longctx kinds must be a non-empty subset of \('variable_tracking'"),
        ({"tokens": 10}, r"longctx tokens must be an integer >= 128"),
        ({"tokenizer": 3}, r"longctx tokenizer must be a model directory, builtin:NAME or an object with encode"),
    ],
)
def test_bad_options_are_clear_errors(options: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        LongContextDomain(**options)


def test_a_length_too_short_for_the_evidence_says_so(tok) -> None:
    domain = LongContextDomain(levels=(4,), kinds=("aggregation",), tokenizer=tok, tokens=128)
    with pytest.raises(ValueError, match=r"longctx tokens=128 is too short for a level-4 aggregation task"):
        domain.sample("train", 1, seed=0)


def test_registered_and_audited_clean(tok) -> None:
    from polyrl.quality.audit import AuditOptions, audit_tasks

    assert "longctx" in available_domains()
    domain = get_domain("longctx", levels=(1, 2), tokenizer=tok, tokens=1024, kinds=("consistency", "code_returns"))
    sampled = domain.sample("train", 4, seed=0) + domain.sample("heldout", 2, seed=0)
    entries = [(i, Task(**{**t.to_json(), "verifier": domain.default_verifier})) for i, t in enumerate(sampled, 1)]
    result = audit_tasks(entries, [], "longctx", options=AuditOptions(repeats=1), progress=None)
    assert not result.failed and all(a.status == "pass" for a in result.tasks)


def test_assemble_keeps_ordered_evidence_in_order(tok) -> None:
    import random

    from polyrl.domains.longctx import variable_tracking

    core = variable_tracking(random.Random(1), 3)
    prompt, _ = assemble(core, 1500, tok, random.Random(2))
    positions = [prompt.index(n) for n in core.needles]
    assert positions == sorted(positions)


@pytest.mark.parametrize(("level", "bound"), [(0, 0.4), (1, 0.5), (2, 0.35)])
def test_no_position_answers_most_consistency_questions(tok, level: int, bound: float) -> None:
    """The contradiction comes after the fact it contradicts, and agreeing statements may follow
    it, so "the last statement" (or any fixed place) is no shortcut to the answer. At level 0
    the contradiction is second, third or last with equal chances."""
    tasks = LongContextDomain(levels=(level,), kinds=("consistency",), tokenizer=tok).sample("heldout", 200, seed=0)
    from_end = Counter()
    for task in tasks:
        labels = re.findall(r"Statement (\d+):", task.prompt)
        from_end[len(labels) - 1 - labels.index(task.answer)] += 1
    assert max(from_end.values()) / len(tasks) <= bound
