"""One rollout call for a mixed batch: single-turn groups, and agent episodes as groups.

    rollout = Rollout(engine, tokenizer, specs, context_window, recorder)
    groups = rollout.groups(tasks, group_size, lambda spec: spec.sampling, "s12")

Tasks of a domain whose spec has `agent` settings run as multi-turn episodes
(episodes.py), each with its own token budget when the spec sets one (`episode_tokens`:
the loop compresses, then stops on "budget" and concludes); every other task gets G
single-turn samples (groups.py). Both come back as `Group`s whose samples answer the
same questions (groups.py), so reward, advantage and loss treat them alike.

With a `recorder`, every model call is recorded, single-turn samples' too (groups.py),
each with its domain (x.domain); after scoring, `record_episodes` writes each episode's
verdict next to its model and tool calls (`polyrl obs` reads tokens per success there).
Whoever owns the records adds their phase (train/loop.py: "train" or "eval").
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

from polyrl.agent.loop import AgentConfig
from polyrl.engine.base import Engine, SamplingParams
from polyrl.models.tokenizer import Tokenizer
from polyrl.obs import records
from polyrl.obs.records import Recorder
from polyrl.rollout.episodes import Episode, rollout_episodes
from polyrl.rollout.groups import Group, sample_groups
from polyrl.rollout.spec import DomainSpec
from polyrl.types import Task


@dataclass
class Rollout:
    """What every rollout call of a run shares: the engine, the tokenizer and the domains."""

    engine: Engine
    tokenizer: Tokenizer
    specs: Mapping[str, DomainSpec]
    context_window: int | None = None
    """prompt + completion tokens the model can see (its max_position_embeddings)"""
    recorder: Recorder | None = None
    """where model calls (every domain's), agent tool calls and budget events are recorded"""

    def groups(self, tasks: Sequence[Task], group_size: int, sampling: Callable[[DomainSpec], SamplingParams],
               trace_prefix: str = "rollout") -> list[Group]:
        """Groups for `tasks`, single-turn ones first, then each agent domain's, in task order;
        `sampling(spec)` gives each domain's sampling for this call."""
        # the sampling of the domains these tasks come from (a run may have hundreds more)
        params = {name: sampling(self.specs[name]) for name in dict.fromkeys(t.domain for t in tasks)}
        single = [t for t in tasks if self.specs[t.domain].agent is None]
        groups = sample_groups(self.engine, self.tokenizer, single, group_size, params, self.recorder, trace_prefix)
        by_domain: dict[str, list[Task]] = defaultdict(list)
        for task in tasks:
            if self.specs[task.domain].agent is not None:
                by_domain[task.domain].append(task)
        for domain, domain_tasks in by_domain.items():
            agent = self.specs[domain].agent
            assert agent is not None
            config = AgentConfig(max_steps=agent.max_steps, max_tokens=params[domain].max_tokens,
                                 result_chars=agent.result_chars)
            recorder = None if self.recorder is None else records.Stamp(self.recorder, **{records.DOMAIN: domain})
            episodes = rollout_episodes(self.engine, self.tokenizer, domain_tasks, group_size, params[domain],
                                        agent.toolbox_for, config, episode_budget=agent.episode_tokens,
                                        context_window=self.context_window,
                                        recorder=recorder, trace_prefix=f"{trace_prefix}-{domain}")
            groups += [Group(task, list(episodes[i * group_size:(i + 1) * group_size]))
                       for i, task in enumerate(domain_tasks)]
        return groups


def record_episodes(groups: list[Group], recorder: Recorder | None) -> None:
    """One episode record per scored episode: success, reward, stop reason, tokens."""
    if recorder is None:
        return
    for g in groups:
        for e, score in zip(g.samples, g.scores):
            if not isinstance(e, Episode):
                continue
            r = e.result
            rec = records.episode(
                r.trace_id, g.task.id, success=bool(score.details.get("success")), reward=score.value,
                stop_reason=r.stop_reason, steps=len(r.steps), input_tokens=r.input_tokens,
                output_tokens=r.output_tokens, cached_tokens=r.cached_tokens)
            rec.attributes[records.DOMAIN] = g.task.domain
            recorder.record(rec)
