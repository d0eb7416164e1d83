"""Single-turn rollouts: G samples per prompt through the Engine interface, then scores.

A group is one task, its prompt tokens, and its G completions with their scores. This
is the unit GRPO's advantages are computed over. Rollout knows the Engine contract and
the verifier contract, nothing of training.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from polyrl.engine.base import Engine, SamplingParams
from polyrl.models.tokenizer import Tokenizer
from polyrl.rewards.base import Verifier
from polyrl.types import Completion, Score, Task


@dataclass
class Group:
    task: Task
    prompt_ids: list[int]
    completions: list[Completion]
    scores: list[Score] = field(default_factory=list)
    episodes: list[Any] | None = None
    """Agent groups (dispatch.py): sample j's Episode, whose segments are its training rows."""

    @property
    def rewards(self) -> list[float]:
        return [s.value for s in self.scores]


def render_prompts(tokenizer: Tokenizer, tasks: list[Task]) -> list[list[int]]:
    return [tokenizer.encode(tokenizer.chat_prompt(t.prompt)) for t in tasks]


def sample_groups(engine: Engine, tokenizer: Tokenizer, tasks: list[Task], group_size: int,
                  sampling_for: dict[str, SamplingParams]) -> list[Group]:
    """Generate `group_size` completions for every task; `sampling_for` maps domain -> params
    (domains may differ in max_tokens). One engine call per distinct sampling setting."""
    if not tasks:
        return []
    prompt_ids = render_prompts(tokenizer, tasks)
    groups: list[Group | None] = [None] * len(tasks)
    by_params: dict[SamplingParams, list[int]] = defaultdict(list)
    for i, task in enumerate(tasks):
        by_params[sampling_for[task.domain]].append(i)
    for params, indices in by_params.items():
        completions = engine.generate([prompt_ids[i] for i in indices], group_size, params)
        for k, i in enumerate(indices):
            groups[i] = Group(tasks[i], prompt_ids[i], completions[k * group_size:(k + 1) * group_size])
    return [g for g in groups if g is not None]


def score_groups(groups: list[Group], verifiers: dict[str, Verifier], default_verifier: dict[str, str]) -> None:
    """Fill each group's scores with one batched call per verifier.

    verifiers: name -> Verifier; default_verifier: domain -> verifier name, used when the
    task does not name its own."""
    pending: dict[str, list[tuple[Group, int]]] = defaultdict(list)
    for g in groups:
        name = g.task.verifier or default_verifier[g.task.domain]
        pending[name].extend((g, j) for j in range(len(g.completions)))
        g.scores = [Score(0.0)] * len(g.completions)
    for name, items in pending.items():
        scores = verifiers[name].score([g.task for g, _ in items], [g.completions[j].text for g, j in items])
        for (g, j), s in zip(items, scores):
            g.scores[j] = s
