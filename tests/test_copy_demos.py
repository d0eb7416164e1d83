"""The base recipe's copying tasks: answers recomputed from the prompt alone."""

import random
import re
from collections import Counter

import pytest

from polyrl.builtin import copy_demos, tiny
from polyrl.builtin.tiny import TinyRecipe


def test_echo_answer_is_the_span_after_the_colon():
    rng = random.Random(0)
    for _ in range(200):
        prompt, answer = copy_demos.echo(rng)
        assert prompt == f"Repeat exactly: {answer}" and 2 <= len(answer.split()) <= 8


def test_lookup_answer_is_the_asked_names_number():
    rng = random.Random(1)
    for _ in range(200):
        prompt, answer = copy_demos.lookup(rng)
        *pairs, question = prompt.split("\n")
        table = dict(line.split(": ") for line in pairs)
        assert len(table) == len(pairs)  # names are distinct
        assert table[re.fullmatch(r"What is the number of (\w+)\?", question).group(1)] == answer


def test_repeat_has_one_name_twice_and_answers_the_later_tag():
    rng = random.Random(2)
    places = Counter()
    for _ in range(600):
        prompt, answer = copy_demos.repeat(rng)
        entries = [line.split(" ") for line in prompt.split("\n")[:-1]]
        counts = Counter(name for _, name in entries)
        [(twice, n)] = [(name, n) for name, n in counts.items() if n > 1]
        assert n == 2 and len({tag for tag, _ in entries}) == len(entries)
        second = [i for i, (_, name) in enumerate(entries) if name == twice][1]
        assert entries[second][0] == answer
        places[second == len(entries) - 1] += 1
    assert places[True] < 0.5 * sum(places.values())  # "the last entry" is not the rule


def _kind(prompt: str) -> str | None:
    return ("echo" if prompt.startswith("Repeat exactly: ") else "repeat" if "comes again" in prompt
            else "lookup" if re.search(r"\nWhat is the number of \w+\?$", prompt) else None)


def test_recipe_mixes_copying_tasks_by_share():
    examples = tiny.sft_examples(TinyRecipe(mix=(("math", 3), ("copy", 1))), 400)
    kinds = Counter(_kind(e[0]["content"]) for e in examples)
    assert kinds[None] == 300 and sum(kinds[k] for k in copy_demos.KINDS) == 100
    assert min(kinds[k] for k in copy_demos.KINDS) > 15


def test_default_recipe_has_no_copying_tasks_and_an_unknown_mix_name_is_an_error():
    assert "copy" not in dict(TinyRecipe().mix)
    with pytest.raises(ValueError, match=r"recipe mix names \['maths'\]: choose from"):
        tiny.sft_examples(TinyRecipe(mix=(("maths", 1),)), 10)
