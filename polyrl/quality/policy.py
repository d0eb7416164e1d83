"""A policy to audit difficulty with: k sampled completions per task, and pass@k from them.

`Policy` is anything with `sample(tasks, k) -> [[completion] * k per task]`; tests pass
canned completions. `EnginePolicy` samples a model (a Hugging Face directory, or
"builtin:tiny") through the same engine and chat template training uses, at the
rollout temperature.

pass@k here is the unbiased estimator of Chen et al. 2021 (HumanEval) from n samples of
which c solve the task: 1 - C(n-c, k) / C(n, k), with k = n it is "any sample solved".

Out of scope: agent domains (multi-turn episodes), remote endpoints.
"""

from __future__ import annotations

from math import comb
from typing import Protocol, Sequence

from polyrl.types import Task


class Policy(Protocol):
    name: str

    def sample(self, tasks: Sequence[Task], k: int) -> list[list[str]]:
        """k completions of each task, in task order."""
        ...


def pass_at_k(n: int, c: int, k: int) -> float:
    assert 0 <= c <= n and 1 <= k <= n
    return 1.0 if n - c < k else 1.0 - comb(n - c, k) / comb(n, k)


class EnginePolicy:
    def __init__(self, path: str, max_tokens: int = 512, temperature: float = 1.0, seed: int = 0) -> None:
        import copy

        from polyrl.engine.base import SamplingParams
        from polyrl.engine.paged import PagedEngine
        from polyrl.models.loading import load_policy, resolve_model_dir

        self.name = path
        model_dir = resolve_model_dir(path)
        model, self.tokenizer = load_policy(model_dir, "float32")
        self.engine = PagedEngine(copy.deepcopy(model), self.tokenizer)
        self.params = SamplingParams(temperature=temperature, max_tokens=max_tokens, seed=seed)

    def sample(self, tasks: Sequence[Task], k: int) -> list[list[str]]:
        if not tasks:
            return []
        prompts = [self.tokenizer.encode(self.tokenizer.chat_prompt(t.prompt)) for t in tasks]
        texts = [c.text for c in self.engine.generate(prompts, k, self.params)]  # grouped: k per prompt
        return [texts[i * k:(i + 1) * k] for i in range(len(tasks))]
