"""Reward `preference_model`: a reward model (or an ensemble) judges each answer, guarded
against being gamed.

    v = get_verifier("preference_model")                        # the built-in tiny RMs (3)
    v = get_verifier("preference_model", model="path/to/rm")    # an HF *ForSequenceClassification dir
    v = get_verifier("preference_model", model=["rm_a", "rm_b"])  # an ensemble of HF RMs
    v = PreferenceModel(reward_models=[my_rm])                  # anything with raw_scores()
    scores = v.score(tasks, completions)

Per answer, each member m gives a raw score r_m, put on one scale as z_m = (r_m - mean_m)
/ std_m (the calibration in the member's polyrl_reward.json; 0 and 1 when it has none).
The reward is

    value = clip(sigmoid(mean(z) - disagreement * std(z)) - length_penalty * excess, 0, 1)

- the ensemble's spread lowers the reward (members disagree where an answer is unlike
  what they were trained on, where a policy finds an RM's blind spot; Coste et al.
  2023, "Reward Model Ensembles Help Mitigate Overoptimization"); std(z) is 0 for one
  member;
- excess = max(0, words / max_words - 1): answers longer than the task's bound
  (`task.data["max_words"]`, else the `max_words` option; none = no penalty) lose
  `length_penalty` per 100% over, against the length bias reward models are known for.

Score.value is in [0, 1]. Score.details: status ("ok" or "truncated": the conversation
was longer than the model's context and its head was scored), raw (per member), z,
mean_z, spread, ensemble_penalty, length_penalty, words, max_words. The other guards
against reward hacking live elsewhere: the per-domain KL (rl/kl_control.py) and the hacking detector
(rewards/hacking.py) against the rule check (rewards/alignment_rules.py).

Out of scope: pairwise/generative judges (an LLM asked "which is better?"), remote RM
servers, reward models with more than one output.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Callable, Protocol, Sequence

import torch

from polyrl.models.loading import builtin_model_dirs
from polyrl.models.tokenizer import Tokenizer
from polyrl.rewards.alignment_rules import words
from polyrl.types import Score, Task


class RewardModel(Protocol):
    """Anything that scores (prompt, completion) pairs with one raw number each."""

    calibration: tuple[float, float]
    """(mean, std) of raw scores on typical answers; z = (raw - mean) / std."""

    def raw_scores(self, prompts: Sequence[str], completions: Sequence[str]) -> list[float]: ...


class ClassifierRewardModel:
    """A Hugging Face sequence-classification directory (num_labels = 1) as a RewardModel."""

    def __init__(self, model_dir: str | Path, device: str = "cpu", dtype: torch.dtype = torch.float32,
                 batch_size: int = 32) -> None:
        from polyrl.models.classifier import load_classifier

        self.model_dir = Path(model_dir)
        self.model, self.cfg = load_classifier(self.model_dir, dtype=dtype, device=device)
        if self.model.num_labels != 1:
            raise ValueError(f"{model_dir}: a reward model has one output (num_labels = 1), "
                             f"this classifier has {self.model.num_labels}")
        self.tok = Tokenizer.from_dir(self.model_dir)
        self.pad_id = self.cfg.pad_token_id if self.cfg.pad_token_id is not None else self.tok.pad_token_id
        if self.pad_id is None:
            raise ValueError(f"{model_dir}: neither config.json nor the tokenizer defines a pad token")
        self.device, self.batch_size = device, batch_size
        card = self.model_dir / "polyrl_reward.json"
        cal = json.loads(card.read_text()).get("calibration", {}) if card.is_file() else {}
        self.calibration = (float(cal.get("mean", 0.0)), float(cal.get("std", 1.0)))
        self.max_length = self.cfg.max_position_embeddings
        self.last_truncated: list[bool] = []

    def encode(self, prompt: str, completion: str) -> list[int]:
        try:
            return self.tok.encode(render(self.tok, prompt, completion))
        except ValueError:  # no chat template: plain text, one turn per line
            return self.tok.encode(f"{prompt}\n{completion}")

    @torch.no_grad()
    def raw_scores(self, prompts: Sequence[str], completions: Sequence[str]) -> list[float]:
        from polyrl.models.classifier import right_pad

        seqs = [self.encode(p, c) for p, c in zip(prompts, completions, strict=True)]
        self.last_truncated = [len(s) > self.max_length for s in seqs]
        seqs = [s[:self.max_length] for s in seqs]
        out: list[float] = []
        for i in range(0, len(seqs), self.batch_size):
            ids, mask = right_pad(seqs[i:i + self.batch_size], self.pad_id)
            out += self.model(ids.to(self.device), mask.to(self.device))[:, 0].tolist()
        return out


def render(tok: Tokenizer, prompt: str, completion: str) -> str:
    """The text a reward model scores: the conversation as the tokenizer's chat template writes it."""
    return tok.apply_chat_template([{"role": "user", "content": prompt}, {"role": "assistant", "content": completion}],
                                   add_generation_prompt=False)


def builtin_reward_models(members: int = 3, recipe: dict[str, Any] | None = None,
                          log: Callable[[str], None] = print, **kwargs: Any) -> list[ClassifierRewardModel]:
    """The built-in tiny reward models (`builtin:tiny-rm`, polyrl/builtin/tiny_rm.py), built on
    first use and cached; `recipe` overrides TinyRMRecipe fields (tests use a micro recipe)."""
    dirs = builtin_model_dirs("tiny-rm", log=log, members=members, recipe=recipe)
    return [ClassifierRewardModel(p, **kwargs) for p in dirs]


class PreferenceModel:
    """Verifier: calibrated ensemble reward with disagreement and length penalties; see the module docstring."""

    name = "preference_model"

    def __init__(self, model: str | list[str] = "builtin:tiny-rm", members: int = 3, recipe: dict[str, Any] | None = None,
                 disagreement: float = 1.0, length_penalty: float = 0.5, max_words: int | None = None,
                 reward_models: Sequence[RewardModel] | None = None, device: str = "cpu", batch_size: int = 32,
                 log: Callable[[str], None] = print, **_: Any) -> None:
        """model: "builtin:tiny-rm" (also accepted as "builtin:tiny"), an HF reward-model directory,
        or a list of them (an ensemble); members: ensemble size of builtin:tiny-rm; recipe:
        TinyRMRecipe overrides for builtin:tiny-rm;
        disagreement: weight of the ensemble's spread; length_penalty: reward lost per 100% over
        the word bound; max_words: the bound for tasks without data.max_words (None: no bound);
        reward_models: ready RewardModel objects, used instead of `model`."""
        if disagreement < 0 or length_penalty < 0:
            raise ValueError(f"disagreement and length_penalty must be >= 0; got {disagreement}, {length_penalty}")
        if max_words is not None and max_words <= 0:
            raise ValueError(f"max_words must be > 0 or None; got {max_words}")
        if reward_models is not None:
            self.members = list(reward_models)
        elif model in ("builtin:tiny-rm", "builtin:tiny"):
            self.members = builtin_reward_models(members, recipe, log=log, device=device, batch_size=batch_size)
        else:
            dirs = [model] if isinstance(model, str) else list(model)
            self.members = [ClassifierRewardModel(d, device=device, batch_size=batch_size) for d in dirs]
        if not self.members:
            raise ValueError("preference_model needs at least one reward model")
        self.disagreement, self.length_penalty, self.max_words = disagreement, length_penalty, max_words
        self._closed = False

    def score(self, tasks: Sequence[Task], completions: Sequence[str]) -> list[Score]:
        assert not self._closed, "PreferenceModel.score after close"
        assert len(tasks) == len(completions)
        if not tasks:
            return []
        prompts = [t.prompt for t in tasks]
        raw = [m.raw_scores(prompts, completions) for m in self.members]  # (M, N)
        truncated = [any(getattr(m, "last_truncated", [False] * len(tasks))[i] for m in self.members)
                     for i in range(len(tasks))]
        return [self._one(t, c, [r[i] for r in raw], truncated[i]) for i, (t, c) in enumerate(zip(tasks, completions))]

    def _one(self, task: Task, completion: str, raw: list[float], truncated: bool) -> Score:
        z = [(r - m.calibration[0]) / m.calibration[1] for r, m in zip(raw, self.members)]
        mean_z = sum(z) / len(z)
        spread = math.sqrt(sum((x - mean_z) ** 2 for x in z) / len(z))
        base = _sigmoid(mean_z)
        guarded = _sigmoid(mean_z - self.disagreement * spread)
        bound = task.data.get("max_words", self.max_words)
        n_words = len(words(completion))
        excess = max(0.0, n_words / bound - 1.0) if bound else 0.0
        penalty = self.length_penalty * excess
        value = min(1.0, max(0.0, guarded - penalty))
        return Score(value, {"status": "truncated" if truncated else "ok", "raw": raw, "z": z, "mean_z": mean_z,
                             "spread": spread, "ensemble_penalty": base - guarded, "length_penalty": penalty,
                             "words": n_words, "max_words": bound})

    def close(self) -> None:
        self._closed = True
        self.members = []


def _sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x)) if x >= 0 else math.exp(x) / (1.0 + math.exp(x))
