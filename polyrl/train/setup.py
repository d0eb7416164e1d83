"""Turn a validated RunConfig into live parts: domains, verifiers, sampling, the curriculum.

Everything here is construction; the loop in loop.py only uses what this returns.
"""

from __future__ import annotations

import copy
import hashlib
from dataclasses import dataclass, replace
from typing import Any, Callable

from polyrl.agent.tool_host import ToolHostSettings, isolated
from polyrl.agent.tools import ToolBox
from polyrl.config import RLTask, RunConfig, ToolsConfig
from polyrl.domains.base import Domain
from polyrl.engine.base import SamplingParams
from polyrl.rewards.base import Verifier
from polyrl.rewards.registry import get_verifier
from polyrl.rl.curriculum import CapabilityCurriculum, CurveSettings
from polyrl.rollout.spec import AgentSpec, DomainSpec
from polyrl.sandbox.execution_log import ExecutionLog
from polyrl.sandbox.types import SandboxConfig
from polyrl.types import Task


def step_seed(seed: int, step: int, salt: str = "") -> int:
    """A stable 63-bit seed for (run seed, step, purpose); Python's hash() is salted per process."""
    digest = hashlib.sha256(f"{seed}:{step}:{salt}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


@dataclass
class Domains:
    """The run's domains, one spec each, and the verifiers they share by key (a verifier's
    name, or name@domain for the first domain that gives it options: every domain giving the
    same verifier the same options shares that one, so 100 generated domains build one each)."""

    specs: dict[str, DomainSpec]
    verifiers: dict[str, Verifier]

    def close(self) -> None:
        for v in self.verifiers.values():
            v.close()
        for spec in self.specs.values():  # a domain whose tools hold a sandbox pool (swe)
            owner = getattr(spec.agent.toolbox_for, "__self__", None) if spec.agent else None
            for part in (spec.source, owner):
                getattr(part, "close", lambda: None)()


def build_domains(cfg: RunConfig, execution_log: ExecutionLog | None = None, verifiers: bool = True) -> Domains:
    """Domains, verifiers and sampling of `cfg`; code executions are recorded in `execution_log`.
    verifiers=False leaves the verifiers out (a role that only rolls out: no sandbox pool, no
    reward models loaded)."""
    specs: dict[str, DomainSpec] = {}
    options: dict[str, tuple[str, dict]] = {}  # verifier key -> (name, options)
    for t in cfg.domain_tasks():
        domain, named = _source(t)
        name = t.reward or domain.default_verifier
        key = _verifier_key(options, name, t.reward_options, t.run_name)
        options[key] = (name, t.reward_options)
        check = t.check or getattr(domain, "default_check", None)
        if check:
            options.setdefault(check, (check, {}))
        options.update((n, (n, {})) for n in named if n not in options)
        tools = domain if hasattr(domain, "toolbox") else _pack_tools(domain)  # tools: rolls out as episodes
        if tools is None and t.tools != ToolsConfig():  # (a resumed run's config.yaml writes the defaults out)
            raise ValueError(f"rl_tasks domain {t.domain!r}: `tools` is set, but this domain has no tools")
        if t.level_curriculum and level_source(domain) is None:
            raise ValueError(f"rl_tasks domain {t.run_name!r}: level_curriculum weights a generated domain's "
                             f"difficulty levels (math, code, agent, longctx, swe, ops), and this one has none")
        max_tokens = t.max_tokens or cfg.engine.max_tokens
        sampling = SamplingParams(temperature=cfg.engine.temperature, top_p=cfg.engine.top_p,
                                  top_k=cfg.engine.top_k, max_tokens=max_tokens)
        specs[t.run_name] = DomainSpec(
            name=t.run_name, source=domain, weight=t.weight, verifier=key, check=check or None, sampling=sampling,
            eval_sampling=replace(sampling, max_tokens=cfg.eval.max_tokens or max_tokens),
            kl_coef=cfg.trainer.kl_coef if t.kl_coef is None else t.kl_coef, kl_target=t.kl_target,
            agent=AgentSpec(episode_tools(t, tools.toolbox), t.max_steps if "max_steps" in t.model_fields_set
                            else getattr(tools, "max_steps", t.max_steps),
                            getattr(tools, "result_chars", 400), t.episode_tokens)
            if tools is not None else None)
    if not verifiers:
        return Domains(specs, {})
    return Domains(specs, {key: _verifier(name, opts, execution_log) for key, (name, opts) in sorted(options.items())})


def _source(t: RLTask) -> tuple[Domain, set[str]]:
    """The domain of an rl_tasks entry, and the verifiers its tasks name for themselves."""
    from polyrl.domains.named import NamedDomain
    from polyrl.domains.pack import PackDomain, load_pack, verifier_for
    from polyrl.domains.quarantine import QuarantinedDomain, drop_quarantined, read_quarantine
    from polyrl.domains.registry import get_domain

    if not t.pack:
        domain = get_domain(t.domain, **t.options)
        if t.quarantine:
            domain = QuarantinedDomain(domain, read_quarantine(t.quarantine))
        return (NamedDomain(domain, t.run_name) if t.run_name != t.domain else domain), set()
    loaded = load_pack(t.pack)
    if loaded.errors:
        lines = "\n".join(f"  {t.pack}:{e.line}: {e.message}" for e in loaded.errors[:10])
        raise ValueError(f"task pack for domain {t.run_name!r} has malformed lines:\n{lines}")
    # Tasks train under the run file's name for the domain. A line that names its
    # verifier keeps it; the others use the run file's reward, else their line
    # domain's default (the domain's default when that is the pack's first line's).
    default = t.reward or (verifier_for(loaded.tasks[0][1]) if loaded.tasks else "answer_verify")
    tasks = [replace(task, domain=t.run_name,
                     verifier=task.verifier or (None if t.reward or verifier_for(task) == default
                                                else verifier_for(task)))
             for _, task in loaded.tasks]
    if t.quarantine:
        tasks = drop_quarantined(tasks, t.quarantine)
    _check_worlds(t.run_name, t.pack, default, tasks)
    return PackDomain(t.run_name, tasks, default), {task.verifier for task in tasks if task.verifier}


def _verifier_key(taken: dict[str, tuple[str, dict]], name: str, options: dict, domain: str) -> str:
    """The key of verifier `name` with `options`: its name without options, else the key of an
    earlier domain's with equal options, else name@domain."""
    if not options:
        return name
    same = [k for k, v in taken.items() if v == (name, options) and k != name]
    return same[0] if same else f"{name}@{domain}"


def episode_tools(t: RLTask, toolbox_for: Callable[[Task], ToolBox]) -> Callable[[Task], ToolBox]:
    """Each episode's tools for rl_tasks entry `t`, run where `t.tools.isolation` says."""
    isolation = t.tools.isolation
    if isolation == "none":
        return toolbox_for
    sandbox = SandboxConfig(allow_unsafe=True) if isolation == "sandbox" else \
        SandboxConfig(isolation="none", allow_unsafe=True)
    settings = ToolHostSettings(t.tools.timeout_s, t.tools.output_bytes, t.tools.memory_MB, sandbox=sandbox)
    try:
        return isolated(toolbox_for, settings)
    except ValueError as err:
        raise ValueError(f"rl_tasks domain {t.domain!r}: tools.isolation {isolation!r}: {err}; "
                         "use tools.isolation: none for this domain") from None


def _pack_tools(domain: Domain) -> Any:
    """What gives a pack's tasks their tools, by the pack's verifier (`TOOLS_BY_VERIFIER`): the
    built-in swe, ops or agent domain, whose tools work on the repository or world each task
    carries (worlds checked at load, `_check_worlds`). None for other packs: they roll out
    single-turn."""
    from polyrl.domains.registry import get_domain
    from polyrl.domains.task_tools import TOOLS_BY_VERIFIER

    kind = TOOLS_BY_VERIFIER.get(getattr(domain, "default_verifier", None))
    return get_domain(kind) if kind else None


def _check_worlds(name: str, pack: str, verifier: str, tasks: list[Task]) -> None:
    """A pack whose episodes run with the tools of a world: every task must carry one, and one
    its tools read, or the run stops here instead of at that task's first rollout."""
    from polyrl.domains.task_tools import TOOLS_BY_VERIFIER, world_problem

    if TOOLS_BY_VERIFIER.get(verifier) not in ("agent", "ops"):
        return
    for task in tasks:
        problem = world_problem(replace(task, verifier=task.verifier or verifier))
        if problem:
            hint = "; put tasks without tools in a pack of their own" if "world" not in task.data else ""
            raise ValueError(f"task pack {pack} (domain {name!r}) rolls out as agent episodes (its verifier is "
                             f"{verifier}), and task {task.id!r} has {problem}{hint}")


def draw_tasks(specs: dict[str, DomainSpec], counts: dict[str, int], seed: int, step: int,
               levels: dict[str, tuple[float, ...]] | None = None) -> list[Task]:
    """A step's training prompts: counts[d] train tasks of each domain d, seeded by (run seed, step, d).
    A domain with no prompts this step is not asked (it may be one of hundreds). `levels` gives
    some domains' level weights for this draw (rl/level_curriculum.py)."""
    drawn: list[Task] = []
    for d, k in counts.items():
        if k:
            source = reweighted(specs[d].source, levels[d]) if levels and d in levels else specs[d].source
            drawn += source.sample("train", k, step_seed(seed, step, d))
    return drawn


def _draws_levels(source: Domain) -> bool:
    """Whether `source` itself draws difficulty levels by weights (a generated domain's `levels`, `weights`)."""
    return hasattr(source, "levels") and hasattr(source, "weights")


def level_source(source: Domain) -> Domain | None:
    """The generated domain under `source`'s wrappers (a name, a quarantine), when it draws
    difficulty levels by weights; None for one without levels (a pack)."""
    while not _draws_levels(source) and hasattr(source, "inner"):
        source = source.inner
    return source if _draws_levels(source) else None


def reweighted(source: Domain, weights: tuple[float, ...]) -> Domain:
    """A copy of `source` that draws its levels by `weights` (its wrappers copied down to the
    generated domain); `source` itself, whose held-out set was drawn by its own weights, is untouched."""
    out = copy.copy(source)
    if _draws_levels(source):
        out.weights = tuple(weights)
    else:
        out.inner = reweighted(source.inner, weights)
    return out


def rollout_sampling(seed: int, step: int) -> Callable[[DomainSpec], SamplingParams]:
    """Each domain's rollout sampling at a step: its own settings, one seed per (run seed, step)."""
    step_sampling_seed = step_seed(seed, step, "rollout")
    return lambda spec: replace(spec.sampling, seed=step_sampling_seed)


def build_curriculum(cfg: RunConfig, weights: dict[str, float]) -> CapabilityCurriculum | None:
    """The capability-curve curriculum over the run's domains; None for `curriculum: static`."""
    if cfg.curriculum == "static":
        return None
    return CapabilityCurriculum(weights, CurveSettings(**cfg.capability_curve.model_dump()))


def _verifier(name: str, options: dict, execution_log: ExecutionLog | None) -> Verifier:
    try:
        return get_verifier(name, **options, **_run_options(name, execution_log))
    except TypeError as err:  # an option the verifier does not take
        raise ValueError(f"reward_options for {name!r}: {err}") from None


def _run_options(verifier: str, execution_log: ExecutionLog | None) -> dict:
    """What a training run gives a verifier beyond its defaults."""
    if verifier == "unit_test_pass" and execution_log is not None:
        return {"log": execution_log}
    return {}
