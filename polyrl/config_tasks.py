"""The run file's `rl_tasks` entries: one domain each, with its reward, share, per-domain
overrides, tools and flag policy (polyrl/config.py reads the whole file; this is one
entry's schema)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from polyrl.config_checks import expansions
from polyrl.train.flag_policy import OnFlag

_STRICT = ConfigDict(extra="forbid", use_attribute_docstrings=True, validate_assignment=True, allow_inf_nan=False)
"""As polyrl/config.py's: unknown keys, inf and nan are errors."""


class ToolsConfig(BaseModel):
    """Where an agent domain's tool calls run (polyrl/agent/tool_host.py; docs/tools.md)."""

    model_config = _STRICT

    isolation: Literal["sandbox", "process", "none"] = "none"
    """none: in the trainer's process (trusted tools only: no timeout, no output limit); sandbox: a tool
    host per episode in bubblewrap (a plain process where bubblewrap is not installed), with the limits
    below; process: a plain process per episode with the same limits and no isolation. A tool host adds
    about 5 to 10 ms per episode, which is why none is the default (docs/tools.md, BENCHMARKS.md)"""
    timeout_s: float = Field(10.0, gt=0, le=3600)
    """wall-clock limit of one tool call (sandbox, process); past it the episode's tool host is stopped
    (at most 3600)"""
    output_bytes: int = Field(65536, ge=256, le=2**26)
    """largest result of one tool call in bytes (sandbox, process); longer ones are cut (256 to 2**26)"""
    memory_MB: int = Field(512, ge=64, le=2**20)
    """address-space limit of the episode's tool host in MiB (sandbox, process; 64 to 2**20)"""


class RLTask(BaseModel):
    """One domain to train on, and how much of each batch it gets."""

    model_config = _STRICT

    domain: str
    """built-in domain name (math, code, ...), a plugin domain's (an installed package's; docs/plugins.md),
    or any name when `pack` is given"""
    reward: str | None = None
    """verifier name (answer_verify, unit_test_pass, ...); null = the domain's default"""
    weight: float = Field(gt=0, le=1e6)
    """relative share of training prompts drawn from this domain (at most 1e6)"""
    pack: str | None = None
    """JSONL task pack; a relative path is resolved against the run file's directory"""
    options: dict[str, Any] = Field(default_factory=dict)
    """keyword options of a built-in or plugin domain (not a pack), for both its train and held-out tasks:
    levels (math, code, agent: a subset of 1-4) and their relative weights, e.g. {levels: [1, 2]};
    intents (alignment)"""
    level_curriculum: bool = False
    """draw this domain's training prompts of each difficulty level by the signal the level gives:
    its recent share of groups neither all right nor all wrong (rl/level_curriculum.py), so levels
    it has solved or cannot reach yet give way to those it is learning; the held-out set keeps the
    levels and weights of `options`. Generated domains with levels only (math, code, agent, longctx, swe, ops)"""
    quarantine: str | None = None
    """file of task ids to leave out of training (one per line, or JSONL with id/task_id, such as
    `polyrl audit --write-quarantine` output or a run's flags.jsonl); relative to the run file like `pack`"""
    kl_coef: float | None = Field(None, ge=0, le=100)
    """per-domain override of trainer.kl_coef (at most 100); null = use trainer.kl_coef"""
    kl_target: float | None = Field(None, gt=0, le=100)
    """per-token KL to the reference this domain is driven toward by adapting its coefficient
    (starting from kl_coef, which must then be > 0); null = the coefficient stays fixed"""
    max_tokens: int | None = Field(None, gt=0, le=2**20)
    """per-domain override of engine.max_tokens (agent domains: per model call; at most 2**20);
    null = use engine.max_tokens"""
    reward_options: dict[str, Any] = Field(default_factory=dict)
    """keyword options of this domain's verifier, e.g. {alpha: 0.02, beta: 1.0e-4} for success_minus_cost"""
    check: str | None = None
    """independent verifier scored on the same held-out completions (its mean is the eval's
    check_accuracy; the reward-hacking detector flags a reward that rises while it does not);
    null = the domain's default check (alignment: rule_check), if it has one"""
    max_steps: int = Field(8, gt=0, le=10_000)
    """agent domains: model calls an episode may make before it must answer (at most 10,000); when
    the run file leaves it out, a domain's own default if it has one (ops: 150), else 8"""
    episode_tokens: int | None = Field(None, gt=0, le=2**40)
    """agent domains: token budget of each episode in training and held-out rollouts (prompt +
    completion tokens of every model call, polyrl/agent/budget.py); as it runs out the loop compresses
    the context, then stops with "budget" and asks for a stage conclusion; null = no budget"""
    tools: ToolsConfig = Field(default_factory=ToolsConfig)
    """agent domains: where tool calls run, with their timeout and output limit"""
    on_flag: OnFlag = Field(default_factory=OnFlag)
    """what a reward-hacking or divergence flag on this domain does (default: nothing but the flag)"""
    name: str | None = Field(None, min_length=1, max_length=200)
    """the name this entry trains under (metrics, its advantage normalisation, KL coefficient and
    curriculum share); null = `domain`. Two entries of one domain with different options need names"""
    expand: dict[str, list[Any]] = Field(default_factory=dict)
    """generated domains: one domain per combination of these option values (a product over the keys,
    merged over `options`), named <name or domain>/<key>=<value>,..., sharing `weight` equally; e.g.
    {levels: [[1], [2], [3], [4]]} gives math/levels=1 .. math/levels=4 (docs/many-domains.md)"""

    @property
    def run_name(self) -> str:
        """The name the domain trains under: `name`, else `domain`."""
        return self.name or self.domain

    def expanded(self) -> list[RLTask]:
        """This entry as the domains it generates: itself without `expand`, else one entry per
        combination of the expand values (config_checks.expansions names and merges them)."""
        if not self.expand:
            return [self]
        combos = expansions(self.run_name, self.options, self.expand)
        share = self.weight / len(combos)
        return [self.model_copy(update={"name": name, "options": options, "expand": {}, "weight": share})
                for name, options in combos]
