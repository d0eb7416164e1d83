"""Copying tasks: in-context skills that natural text teaches a pretrained model and the
built-in domains' demonstrations barely ask for.

- echo: repeat a span of made-up words and numbers exactly;
- lookup: a list of name-number pairs, then the number of one name;
- repeat: a list of tagged names in which exactly one name comes again; the tag of that
  later entry.

Each asks the model to match or copy a span it has never seen in training, by its place in
the prompt: a customer's name carried into a tool call (ops), a fact found again further on
(long-context consistency), a key looked up among others (retrieval). The names are random
letters, so no span can be learnt by heart; the tasks share no template with any domain.

A base recipe may add them to its mix (`TinyRecipe.mix` with `("copy", share)`), and
bench/copy_probe.py measures how well a model does them. A share of 0.08 did not teach the
tiny model to copy (docs/results.md, 2026-12-08), so the default recipe has none.
"""

from __future__ import annotations

import random

KINDS = ("echo", "lookup", "repeat")
_CONSONANTS = "bcdfghjklmnprstvwz"
_VOWELS = "aeiou"


def made_up_word(rng: random.Random) -> str:
    """Two or three consonant-vowel syllables, perhaps with a closing consonant: 'tovi', 'bamek'."""
    word = "".join(rng.choice(_CONSONANTS) + rng.choice(_VOWELS) for _ in range(rng.randint(2, 3)))
    return word + (rng.choice(_CONSONANTS) if rng.random() < 0.3 else "")


def _distinct_words(rng: random.Random, n: int) -> list[str]:
    words: list[str] = []
    while len(words) < n:
        word = made_up_word(rng)
        if word not in words:
            words.append(word)
    return words


def echo(rng: random.Random) -> tuple[str, str]:
    span = " ".join(made_up_word(rng) if rng.random() < 0.75 else str(rng.randint(1, 999))
                    for _ in range(rng.randint(2, 8)))
    return f"Repeat exactly: {span}", span


def lookup(rng: random.Random) -> tuple[str, str]:
    names = _distinct_words(rng, rng.randint(2, 10))
    numbers = [rng.randint(10, 999) for _ in names]
    key = rng.randrange(len(names))
    pairs = "\n".join(f"{name}: {number}" for name, number in zip(names, numbers))
    return f"{pairs}\nWhat is the number of {names[key]}?", str(numbers[key])


def repeat(rng: random.Random) -> tuple[str, str]:
    names = _distinct_words(rng, rng.randint(2, 9))
    again = rng.randrange(1, len(names) + 1)  # the repeat's place: anywhere after the first entry
    order = names[:again] + [rng.choice(names[:again])] + names[again:]
    tags = rng.sample(range(100, 1000), len(order))
    entries = "\n".join(f"{tag} {name}" for tag, name in zip(tags, order))
    return f"{entries}\nOne name comes again. What is the tag of its second entry?", str(tags[again])


def copy_demonstration(rng: random.Random) -> list[dict]:
    """One copying task, its kind drawn uniformly, as a (user, assistant) conversation."""
    prompt, answer = {"echo": echo, "lookup": lookup, "repeat": repeat}[rng.choice(KINDS)](rng)
    return [{"role": "user", "content": prompt}, {"role": "assistant", "content": answer}]
