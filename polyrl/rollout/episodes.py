"""Multi-turn agent rollouts: G episodes per task through the Engine interface, in lock-step.

Every episode runs the agent loop (polyrl.agent.loop) against its own EngineChatModel,
which records the episode's tokens. The driver advances all episodes together: it
collects the pending model request of every live episode, answers them with one
batched `Engine.generate` call (per distinct max_tokens), feeds each reply back, and
repeats until every episode has ended. Tools run inside each episode's loop; each
episode's ToolBox is closed when the episode ends (a sandboxed one ends its tool host).

What comes back, per episode (`Episode`):

- `segments`: token sequences with `loss_mask` 1 exactly on policy-generated tokens
  (prompts, tool results, template markup and compression summaries are 0) and the
  generated tokens' sampling `logprobs` (0.0 elsewhere). Usually one segment; one more
  each time compression or truncation rewrote the prompt.
- `response`: the EpisodeOutcome a verifier grades
  (`SuccessMinusCost().score([task], [episode.response])`); with the rest of groups.py's
  sample interface, an Episode is one sample of a Group.
- `result`: the full AgentResult (answer, stop reason, steps, events) for logs.

How a trainer uses it (the layout of polyrl.train.batch, one row per segment):

    episodes = rollout_episodes(engine, tokenizer, tasks, group_size, sampling, AgentDomain.toolbox)
    scores = verifier.score([e.task for e in episodes], [e.response for e in episodes])
    # group advantages over the G episodes of each task, then for each segment of each episode:
    #   input_ids = seg.token_ids;  targets[t] = token_ids[t + 1]
    #   mask[t - 1] = seg.loss_mask[t];  old_logp[t - 1] = seg.logprobs[t]   (token t predicted at t - 1)
    #   advantage = the episode's advantage, broadcast to every segment of the episode

Rollout knows the Engine and the agent loop, nothing of training or rewards.
Out of scope: asynchronous episodes (an episode waits for the slowest of its round),
and lighter fallback models inside RL rollouts (one policy answers every call).
"""

from __future__ import annotations

import hashlib
import time
from collections import defaultdict
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Sequence

from polyrl.agent.budget import TokenBudget
from polyrl.agent.engine_model import EngineChatModel, Segment
from polyrl.agent.loop import AgentConfig, AgentResult, ModelSlot, agent_episode
from polyrl.agent.model import ModelReply, ModelRequest
from polyrl.agent.outcome import EpisodeOutcome
from polyrl.agent.tools import ToolBox
from polyrl.engine.base import Engine, SamplingParams
from polyrl.models.tokenizer import Tokenizer
from polyrl.obs.records import Recorder
from polyrl.rollout.groups import latency_shares
from polyrl.types import Task


@dataclass
class Episode:
    task: Task
    sample: int
    """Index of this episode among its task's group (0..G-1)."""
    segments: list[Segment]
    result: AgentResult
    weight_versions: list[int]
    """Weight version of each model call's completion (staleness checks)."""
    default_version: int = 0
    """The engine's weight version when the episode ran (an episode without model calls)."""
    call_versions: list[list[int]] = field(default_factory=list)
    """The weight version of every token each model call generated, call by call."""

    # ---- what groups.py asks of a sample

    @property
    def response(self) -> EpisodeOutcome:
        """What the verifier grades: the answer and the episode's costs."""
        return self.result.outcome

    @property
    def generated_ids(self) -> list[int]:
        return [t for seg in self.segments for t, m in zip(seg.token_ids, seg.loss_mask) if m]

    @property
    def generated_logprobs(self) -> list[float]:
        return [p for seg in self.segments for p, m in zip(seg.logprobs, seg.loss_mask) if m]

    @property
    def finish_reason(self) -> str:
        """"length" when any model call of the episode was cut at its max_tokens."""
        return "length" if any(s.reply.finish_reason == "length" for s in self.result.steps) else "stop"

    @property
    def weight_version(self) -> int:
        return min(self.weight_versions, default=self.default_version)

    @property
    def token_versions(self) -> list[int]:
        """Each generated token's version, in call order (a compressed context may re-lay
        earlier turns; their tokens keep the version they were sampled with)."""
        versions = [v for call in self.call_versions for v in call]
        n = len(self.generated_ids)
        return versions[-n:] if len(versions) >= n else [self.weight_version] * (n - len(versions)) + versions

    def rows(self) -> list[tuple[list[int], list[int], list[float]]]:
        """One training row per segment, as the rollout recorded it."""
        return [(seg.token_ids, seg.loss_mask, seg.logprobs) for seg in self.segments]

    def record(self) -> dict[str, Any]:
        return {"prompt_ids": [], "completion": self.result.answer, "episode": self.result.to_json()}

    # ---- the episode itself

    @property
    def rewritten(self) -> bool:
        """True when compression or truncation split the episode into several segments."""
        return len(self.segments) > 1

    def _only(self) -> Segment:
        if len(self.segments) != 1:
            raise ValueError(f"episode of {self.task.id!r} has {len(self.segments)} segments (its context was "
                             f"compressed); train on each of `segments`")
        return self.segments[0]

    @property
    def token_ids(self) -> list[int]:
        """The whole episode's token ids (single-segment episodes)."""
        return self._only().token_ids

    @property
    def loss_mask(self) -> list[int]:
        return self._only().loss_mask

    @property
    def logprobs(self) -> list[float]:
        return self._only().logprobs

    @property
    def generated_tokens(self) -> int:
        return sum(sum(s.loss_mask) for s in self.segments)


def rollout_episodes(engine: Engine, tokenizer: Tokenizer, tasks: Sequence[Task], group_size: int,
                     sampling: SamplingParams, toolbox_for: Callable[[Task], ToolBox],
                     config: AgentConfig = AgentConfig(), episode_budget: int | None = None,
                     context_window: int | None = None, recorder: Recorder | None = None,
                     trace_prefix: str = "rollout") -> list[Episode]:
    """`group_size` episodes per task, grouped: result[i * group_size + j] is episode j of task i.

    `toolbox_for(task)` makes each episode's fresh tools (e.g. AgentDomain.toolbox);
    `episode_budget` gives every episode its own TokenBudget of that many tokens;
    `context_window` (e.g. the model's max_position_embeddings) bounds prompt + max_tokens;
    `sampling.seed`, when set, seeds round r of batched calls with a stable derivative.
    Each call's max_tokens is the loop's (`config.max_tokens`, `config.conclusion_tokens`);
    `sampling.max_tokens` is not used.
    """
    assert group_size >= 1
    sessions: list[EngineChatModel] = []
    toolboxes: list[ToolBox] = []
    episodes = []
    try:
        for i, task in enumerate(tasks):
            for j in range(group_size):
                session = EngineChatModel(engine, tokenizer, sampling, context_window=context_window)
                budget = TokenBudget(episode_budget) if episode_budget is not None else None
                trace_id = f"{trace_prefix}-{i}-{j}-{task.id}"
                sessions.append(session)
                toolboxes.append(toolbox_for(task))
                episodes.append(agent_episode(task.prompt, toolboxes[-1], [ModelSlot(session)], config, budget,
                                              recorder, trace_id, task.id))

        results: dict[int, AgentResult] = {}
        pending: dict[int, ModelRequest] = {}
        call_versions: list[list[list[int]]] = [[] for _ in episodes]
        for k, episode in enumerate(episodes):
            _advance(k, episode, None, pending, results, toolboxes)

        round_index = 0
        while pending:
            by_max_tokens: dict[int, list[int]] = defaultdict(list)
            for k, request in pending.items():
                by_max_tokens[request.max_tokens].append(k)
            for max_tokens, ks in sorted(by_max_tokens.items()):
                prompts = [sessions[k].prepare(pending[k]) for k in ks]
                params = replace(sampling, max_tokens=max_tokens,
                                 seed=_round_seed(sampling.seed, round_index, max_tokens))
                start = time.perf_counter()
                completions = engine.generate(prompts, 1, params)
                duration = time.perf_counter() - start  # one batched call: each reply reports its share of it
                shares = latency_shares(duration, [len(c.token_ids) for c in completions])
                for k, prompt_ids, completion, share in zip(ks, prompts, completions, shares):
                    call_versions[k].append(completion.versions())
                    reply = sessions[k].finish(prompt_ids, completion, share)
                    _advance(k, episodes[k], reply, pending, results, toolboxes)
            round_index += 1
    finally:  # every episode's tools end, whatever went wrong (a sandboxed tool host is a process)
        for tools in toolboxes:
            tools.close()

    return [Episode(tasks[k // group_size], k % group_size, sessions[k].trace.segments, results[k],
                    sessions[k].weight_versions, engine.weight_version, call_versions[k])
            for k in range(len(episodes))]


def _advance(k: int, episode, reply: ModelReply | None, pending: dict[int, ModelRequest],
             results: dict[int, AgentResult], toolboxes: list[ToolBox]) -> None:
    """Feed `reply` to episode k (None starts it); file its next request, or its result
    (and close its tools: the episode has ended)."""
    try:
        pending[k] = next(episode) if reply is None else episode.send(reply)
    except StopIteration as done:
        pending.pop(k, None)
        results[k] = done.value
        toolboxes[k].close()


def _round_seed(seed: int | None, round_index: int, max_tokens: int) -> int | None:
    if seed is None:
        return None
    digest = hashlib.sha256(f"{seed}:{round_index}:{max_tokens}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1
