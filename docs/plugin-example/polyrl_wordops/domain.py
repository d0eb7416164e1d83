"""The `wordops` domain: operations on short made-up words, answered exactly.

Kinds: reverse a word, sort its letters, count one letter in it. Levels lengthen the
word (and at level 3 chain two operations: reverse the sorted letters). Every answer is
a short string in \\boxed{}, graded by the `exact_match` verifier of this package.

`wordtools` asks the same questions of an agent with tools (tools.py): `reverse`,
`sort_letters` and `count_letter`. Its tasks roll out as multi-turn agent episodes, because
the domain has a `toolbox(task)`, and are graded by polyrl's built-in
`success_minus_cost` (the episode's final answer, less what the calls cost).

Which split a task belongs to is a stable hash of its prompt (polyrl's `hash_split`),
so train and held-out never share a prompt and the held-out set is fixed.
"""

from __future__ import annotations

import hashlib
import random

from polyrl.agent.tools import ToolBox
from polyrl.domains.generated import check_levels, draw_distinct
from polyrl.domains.pack import check_split, hash_split
from polyrl.types import Task
from polyrl_wordops import tools

LEVELS = (1, 2, 3)
KINDS = ("reverse", "sort", "count")
_LENGTH = {1: (3, 4), 2: (5, 7), 3: (8, 10)}
_LETTERS = "abcdefghiklmnoprstuvw"


class WordOpsDomain:
    """String tasks with exact answers; see the module docstring."""

    name = "wordops"
    default_verifier = "exact_match"
    instruction = "Put only the answer in \\boxed{}."

    def __init__(self, levels: tuple[int, ...] = LEVELS, weights: tuple[float, ...] | None = None) -> None:
        """`levels` to draw from (1-3), with relative `weights` (default equal)."""
        self.levels, self.weights = check_levels(self.name, levels, LEVELS, weights)

    def sample(self, split: str, n: int, seed: int) -> list[Task]:
        """n distinct tasks of `split`, a pure function of (split, n, seed)."""
        check_split(split)
        return draw_distinct(random.Random(f"{self.name}|{split}|{seed}"), n, lambda rng: self._draw(rng, split))

    def _draw(self, rng: random.Random, split: str) -> tuple[str, Task] | None:
        level = rng.choices(self.levels, self.weights)[0]
        word = "".join(rng.choice(_LETTERS) for _ in range(rng.randint(*_LENGTH[level])))
        kind = rng.choice(KINDS)
        if kind == "reverse":
            question, answer = f"Write the word {word} backwards.", word[::-1]
        elif kind == "sort":
            question, answer = f"Write the letters of {word} in alphabetical order.", "".join(sorted(word))
            if level == 3:
                question, answer = (f"Write the letters of {word} in reverse alphabetical order.",
                                    "".join(sorted(word, reverse=True)))
        else:
            letter = rng.choice(word)
            question, answer = f"How many times does the letter {letter} occur in {word}?", str(word.count(letter))
        prompt = f"{question} {self.instruction}"
        if hash_split(prompt) != split:
            return None
        digest = hashlib.sha256(prompt.encode()).hexdigest()[:10]
        return prompt, Task(id=f"{self.name}-{split}-{level}-{kind}-{digest}", domain=self.name, prompt=prompt,
                            answer=answer, split=split, difficulty=level, data={"kind": kind})


class WordToolsDomain(WordOpsDomain):
    """The same questions, answered by an agent with string tools; see the module docstring."""

    name = "wordtools"
    default_verifier = "success_minus_cost"
    instruction = "Use the tools, then give the answer."

    @staticmethod
    def toolbox(task: Task) -> ToolBox:
        """Fresh tools for one episode of `task` (what makes polyrl roll the domain out as episodes)."""
        return tools.toolbox()
