"""Groups of samples: the unit GRPO's advantages are computed over, and how they are scored.

A group is one task and its G samples. A sample is either a `SingleTurn` (one completion
of the task's prompt, here) or an `Episode` (a multi-turn agent episode, episodes.py).
Both answer what the later stages ask of a sample, so reward, advantage, loss and logs
treat them alike:

    sample.response          what the verifier grades: the completion's text, or the
                             episode's EpisodeOutcome (answer, calls, tokens)
    sample.generated_ids     the tokens the policy generated (lengths, rollout counts)
    sample.finish_reason     "length" when generation was cut at max_tokens (for an
                             episode: any of its calls), else "stop"; overlong handling
    sample.weight_version    the oldest weight version among its tokens
    sample.token_versions    the weight version of each generated token (staleness)
    sample.rows()            training rows (token ids, loss mask, logprobs)
    sample.record()          its fields of the trajectory log

`sample_groups` with a recorder writes one observability record per completion ("chat
policy": prompt tokens, cached tokens, completion tokens, finish reason, x.domain). One
engine call answers a whole batch, so a record's duration is its share of the call, in
proportion to the tokens it generated (`latency_shares`); x.call.batch_duration and
x.call.batch_size give the call itself.

Rollout knows the Engine contract and the verifier contract, nothing of training.
"""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Mapping, Protocol

from polyrl.engine.base import Engine, SamplingParams
from polyrl.models.tokenizer import Tokenizer
from polyrl.obs import records
from polyrl.obs.records import Recorder
from polyrl.rewards.base import Response, Verifier
from polyrl.rollout.spec import DomainSpec
from polyrl.types import Completion, Score, Task

Row = tuple[list[int], list[int], list[float]]
"""(token ids, loss mask, logprobs), aligned per token; mask 1 on tokens the policy generated."""


class Sample(Protocol):
    @property
    def response(self) -> Response: ...

    @property
    def generated_ids(self) -> list[int]: ...

    @property
    def generated_logprobs(self) -> list[float]: ...

    @property
    def finish_reason(self) -> str: ...

    @property
    def weight_version(self) -> int: ...

    @property
    def token_versions(self) -> list[int]: ...

    def rows(self) -> list[Row]: ...

    def record(self) -> dict[str, Any]: ...


@dataclass
class SingleTurn:
    """One completion of a task's chat prompt: one training row, prompt then completion."""

    prompt_ids: list[int]
    completion: Completion

    @property
    def response(self) -> str:
        return self.completion.text

    @property
    def generated_ids(self) -> list[int]:
        return self.completion.token_ids

    @property
    def generated_logprobs(self) -> list[float]:
        return self.completion.logprobs

    @property
    def finish_reason(self) -> str:
        return self.completion.finish_reason

    @property
    def weight_version(self) -> int:
        return self.completion.weight_version

    @property
    def token_versions(self) -> list[int]:
        return self.completion.versions()

    def rows(self) -> list[Row]:
        c, P = self.completion, len(self.prompt_ids)
        return [(self.prompt_ids + c.token_ids, [0] * P + [1] * len(c.token_ids), [0.0] * P + list(c.logprobs))]

    def record(self) -> dict[str, Any]:
        return {"prompt_ids": self.prompt_ids, "completion": self.completion.text}


@dataclass
class Group:
    task: Task
    samples: list[Sample]
    """G samples: SingleTurns, or Episodes (episodes.py) for a domain with tools."""
    scores: list[Score] = field(default_factory=list)

    @property
    def rewards(self) -> list[float]:
        return [s.value for s in self.scores]


def render_prompts(tokenizer: Tokenizer, tasks: list[Task]) -> list[list[int]]:
    return [tokenizer.encode(tokenizer.chat_prompt(t.prompt)) for t in tasks]


def latency_shares(duration_s: float, generated: list[int]) -> list[float]:
    """Split one batched call's seconds among its requests in proportion to the tokens each
    generated (plus one: a request that generated nothing still took part in the call)."""
    weights = [n + 1 for n in generated]
    total = sum(weights)
    return [duration_s * w / total for w in weights]


def sample_groups(engine: Engine, tokenizer: Tokenizer, tasks: list[Task], group_size: int,
                  sampling_for: Mapping[str, SamplingParams], recorder: Recorder | None = None,
                  trace_prefix: str = "rollout", model: str = "policy") -> list[Group]:
    """Generate `group_size` completions for every task; `sampling_for` maps domain -> params
    (domains may differ in max_tokens). One engine call per distinct sampling setting; with a
    `recorder`, one model-call record per completion (trace "{trace_prefix}-{domain}-{i}-{j}-{id}")."""
    if not tasks:
        return []
    prompt_ids = render_prompts(tokenizer, tasks)
    groups: list[Group | None] = [None] * len(tasks)
    by_params: dict[SamplingParams, list[int]] = defaultdict(list)
    for i, task in enumerate(tasks):
        by_params[sampling_for[task.domain]].append(i)
    for params, indices in by_params.items():
        start = time.perf_counter()
        completions = engine.generate([prompt_ids[i] for i in indices], group_size, params)
        duration = time.perf_counter() - start
        if recorder is not None:
            shares = latency_shares(duration, [len(c.token_ids) for c in completions])
            for k, (c, share) in enumerate(zip(completions, shares)):
                i, j = indices[k // group_size], k % group_size
                recorder.record(_call_record(tasks[i], i, j, prompt_ids[i], c, share, duration, len(completions),
                                             trace_prefix, model))
        for k, i in enumerate(indices):
            group = completions[k * group_size:(k + 1) * group_size]
            groups[i] = Group(tasks[i], [SingleTurn(prompt_ids[i], c) for c in group])
    return [g for g in groups if g is not None]


def _call_record(task: Task, i: int, j: int, prompt_ids: list[int], c: Completion, share_s: float,
                 batch_s: float, batch_size: int, trace_prefix: str, model: str) -> records.ObsRecord:
    trace_id = f"{trace_prefix}-{task.domain}-{i}-{j}-{task.id}"
    return records.model_call(trace_id, task.id, 0, provider="polyrl", request_model=model, response_model=model,
                              input_tokens=len(prompt_ids), cached_tokens=c.num_cached_tokens,
                              output_tokens=len(c.token_ids), duration_s=share_s, ttft_s=None,
                              finish_reason=c.finish_reason, error_type=None, purpose="sample",
                              extra={records.DOMAIN: task.domain, "x.call.batch_duration": batch_s,
                                     "x.call.batch_size": batch_size, "x.weight_version": c.weight_version})


def score_groups(groups: list[Group], verifiers: Mapping[str, Verifier], specs: Mapping[str, DomainSpec]) -> None:
    """Fill each group's scores with one batched call per verifier: the task's own, else its
    domain's (verifiers: key -> Verifier)."""
    pending: dict[str, list[tuple[Group, int]]] = defaultdict(list)
    for g in groups:
        name = g.task.verifier or specs[g.task.domain].verifier
        pending[name].extend((g, j) for j in range(len(g.samples)))
        g.scores = [Score(0.0)] * len(g.samples)
    for name, items in pending.items():
        scores = verifiers[name].score([g.task for g, _ in items], [g.samples[j].response for g, j in items])
        for (g, j), s in zip(items, scores):
            g.scores[j] = s
