"""One rollout call for a mixed batch: single-turn groups, and agent episodes as groups.

Tasks of a domain with tools (`AgentRollout.toolbox_for` names it) run as multi-turn
episodes (episodes.py); every other task gets G single-turn samples (groups.py). Both
come back as `Group`s, so reward, advantage and loss treat them alike. An episode's
group sample carries:

- `completions[j]`: the episode's reward inputs as `text` (what success_minus_cost
  reads), and as token ids and logprobs everything the policy generated, in order
  (for lengths and metrics);
- `episodes[j]`: the Episode, whose `segments` are what the trainer trains on: token
  sequences with the loss mask on generated tokens only (prompts and tool results are 0).

After scoring, `record_episodes` writes each episode's verdict to the observability
store, next to its model and tool calls (`polyrl obs` reads tokens per success there).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Callable, Sequence

from polyrl.agent.loop import AgentConfig
from polyrl.agent.tools import ToolBox
from polyrl.engine.base import Engine, SamplingParams
from polyrl.models.tokenizer import Tokenizer
from polyrl.obs import records
from polyrl.obs.records import Recorder
from polyrl.rollout.episodes import Episode, rollout_episodes
from polyrl.rollout.groups import Group, sample_groups
from polyrl.types import Completion, Task


@dataclass
class AgentRollout:
    toolbox_for: dict[str, Callable[[Task], ToolBox]]
    """domain -> fresh tools of a task; the domains listed here roll out as episodes"""
    max_steps: dict[str, int]
    """domain -> model calls an episode may make"""
    context_window: int | None = None
    """prompt + completion tokens the model can see (its max_position_embeddings)"""
    recorder: Recorder | None = None
    """where model calls, tool calls and episode verdicts are recorded"""


def rollout_groups(engine: Engine, tokenizer: Tokenizer, tasks: Sequence[Task], group_size: int,
                   sampling_for: dict[str, SamplingParams], agents: AgentRollout | None,
                   trace_prefix: str = "rollout") -> list[Group]:
    """Groups for `tasks`, single-turn ones first, then each agent domain's, in task order."""
    agentic = agents.toolbox_for if agents else {}
    groups = sample_groups(engine, tokenizer, [t for t in tasks if t.domain not in agentic], group_size, sampling_for)
    by_domain: dict[str, list[Task]] = defaultdict(list)
    for task in tasks:
        if task.domain in agentic:
            by_domain[task.domain].append(task)
    for domain, domain_tasks in by_domain.items():
        assert agents is not None
        params = sampling_for[domain]
        config = AgentConfig(max_steps=agents.max_steps[domain], max_tokens=params.max_tokens)
        episodes = rollout_episodes(engine, tokenizer, domain_tasks, group_size, params, agentic[domain], config,
                                    context_window=agents.context_window, recorder=agents.recorder,
                                    trace_prefix=f"{trace_prefix}-{domain}")
        for i, task in enumerate(domain_tasks):
            groups.append(episode_group(task, episodes[i * group_size:(i + 1) * group_size], engine.weight_version))
    return groups


def episode_group(task: Task, episodes: list[Episode], version: int) -> Group:
    completions = []
    for j, e in enumerate(episodes):
        ids = [t for seg in e.segments for t, m in zip(seg.token_ids, seg.loss_mask) if m]
        logps = [p for seg in e.segments for p, m in zip(seg.logprobs, seg.loss_mask) if m]
        completions.append(Completion(j, e.completion, ids, logps, "stop", min(e.weight_versions, default=version)))
    return Group(task, [], completions, episodes=episodes)


def record_episodes(groups: list[Group], recorder: Recorder | None) -> None:
    """One episode record per scored episode: success, reward, stop reason, tokens."""
    if recorder is None:
        return
    for g in groups:
        for e, score in zip(g.episodes or (), g.scores):
            r = e.result
            recorder.record(records.episode(
                r.trace_id, g.task.id, success=bool(score.details.get("success")), reward=score.value,
                stop_reason=r.stop_reason, steps=len(r.steps), input_tokens=r.input_tokens,
                output_tokens=r.output_tokens, cached_tokens=r.cached_tokens))
