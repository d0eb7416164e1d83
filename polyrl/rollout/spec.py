"""One domain of a run, as every stage sees it: where its tasks come from, how they are
rolled out and graded, and how they train.

`polyrl/train/setup.py` builds one `DomainSpec` per `rl_tasks` entry of the run file;
rollout reads its sampling and agent settings, scoring its verifier and check, the
trainer its weight and KL settings. Verifiers are shared by key across the run (a task
may name its own), so a spec names its verifier rather than holding it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from polyrl.agent.tools import ToolBox
from polyrl.domains.base import Domain
from polyrl.engine.base import SamplingParams
from polyrl.types import Task


@dataclass(frozen=True)
class AgentSpec:
    """How a domain with tools rolls out: multi-turn episodes of the agent loop."""

    toolbox_for: Callable[[Task], ToolBox]
    """fresh tools for one episode of a task"""
    max_steps: int
    """model calls an episode may make before it must answer"""
    result_chars: int | None = 400
    """cap on each tool result shown to the model (AgentConfig.result_chars); None = no cap"""
    episode_tokens: int | None = None
    """token budget of each episode (a TokenBudget per episode); None = no budget"""


@dataclass(frozen=True)
class DomainSpec:
    name: str
    source: Domain
    """yields the domain's train and held-out tasks"""
    weight: float
    """seed share of each batch (the curriculum moves it)"""
    verifier: str
    """key of the domain's default verifier among the run's verifiers"""
    check: str | None
    """key of an independent check scored on the same held-out responses; None = none"""
    sampling: SamplingParams
    """rollout sampling (the seed is set per step)"""
    eval_sampling: SamplingParams
    """held-out evaluation sampling"""
    kl_coef: float
    """starting KL coefficient to the reference policy"""
    kl_target: float | None
    """per-token KL the coefficient adapts toward; None = fixed"""
    agent: AgentSpec | None = None
    """set when the domain rolls out as agent episodes; None = single-turn groups"""
