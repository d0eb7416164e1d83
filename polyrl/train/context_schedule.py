"""The schedule file of staged context extension (`polyrl context train SCHEDULE.yaml`).

    model: builtin:tiny            # builtin:NAME or a Hugging Face directory, unscaled
    kinds: [needle, multikey_retrieval, variable_tracking]   # the long-context domain's kinds
    level: 1
    batch_tokens: 8192             # tokens per optimizer step (rows of packed sequences)
    lr: 0.0003
    prompt_loss_weight: 0.1        # weight of the document's tokens; the answer's weigh 1
    short_share: 0.5               # documents drawn shorter than the stage's length
    seed: 0
    stages:                        # lengths increase; each stage starts from the last one's weights
      - {max_length: 512, rope: none, tokens: 300000}            # level: 0 would train it on the warm-up level
      - {max_length: 2048, rope: yarn, tokens: 150000}           # factor: max_length / the model's window
      - {max_length: 8192, rope: yarn, factor: 16, tokens: 150000, batch_tokens: 16384}
    eval: {lengths: [512, 1024, 2048, 4096, 8192], per_length: 24}

A stage's RoPE scaling is applied to the original (unscaled) model's config, so a stage with
factor 4 means 4 x the original window, whatever the stage before it used. Errors name the
file, line and field, as the run file's do.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from polyrl.config_messages import SafeRunLoader, dotted, explain, line_for
from polyrl.domains.longctx import CONTROLS, KINDS, MIN_TOKENS

_STRICT = ConfigDict(extra="forbid", frozen=True)
MAX_LENGTH = 1 << 17


class Stage(BaseModel):
    model_config = _STRICT

    max_length: int = Field(ge=MIN_TOKENS, le=MAX_LENGTH)
    """Longest packed row of the stage, in tokens; documents are drawn up to it."""
    rope: Literal["none", "linear", "dynamic", "yarn", "llama3"] = "yarn"
    """RoPE scaling of the stage; "none" keeps the original positions (max_length within the window)."""
    factor: float | None = Field(None, gt=1, le=1024)
    """How many times the original window; default max_length / the original window."""
    tokens: int = Field(ge=1, le=10**10)
    """Training tokens of the stage (every token of every packed row)."""
    batch_tokens: int | None = Field(None, ge=MIN_TOKENS, le=1 << 24)
    """Tokens per optimizer step in this stage (default: the schedule's batch_tokens). Long
    stages want more: a step of one 8k document is a batch of one answer."""
    lr: float | None = Field(None, gt=0, le=1)
    """Learning rate of this stage (default: the schedule's lr)."""
    level: int | None = Field(None, ge=0, le=4)
    """Difficulty level of this stage's training documents (default: the schedule's level), for
    example 0, the warm-up level; the held-out evaluation always uses the schedule's level."""


class EvalSpec(BaseModel):
    model_config = _STRICT

    lengths: tuple[int, ...] = (512, 1024, 2048, 4096, 8192)
    """Held-out prompt lengths scored after every stage."""
    per_length: int = Field(24, ge=1, le=10_000)
    """Held-out questions per length (the same questions at every length)."""

    @model_validator(mode="after")
    def _increasing(self) -> EvalSpec:
        if not self.lengths or list(self.lengths) != sorted(set(self.lengths)) or self.lengths[0] < MIN_TOKENS:
            raise ValueError(f"eval.lengths must be increasing, distinct and at least {MIN_TOKENS}")
        return self


class Schedule(BaseModel):
    model_config = _STRICT

    model: str = "builtin:tiny"
    kinds: tuple[str, ...] = ("needle", "multikey_retrieval", "variable_tracking")
    level: int = Field(1, ge=0, le=4)
    """Difficulty level of the held-out evaluation, and of every stage that names none (0: warm-up)."""
    batch_tokens: int = Field(8192, ge=MIN_TOKENS, le=1 << 24)
    lr: float = Field(3e-4, gt=0, le=1)
    warmup_steps: int = Field(10, ge=0, le=100_000)
    """Linear warm-up at the start of every stage."""
    prompt_loss_weight: float = Field(0.1, ge=0, le=1)
    short_share: float = Field(0.5, ge=0, le=1)
    seed: int = Field(0, ge=0, le=2**31)
    """Draws each stage's training documents (by stage index) and the held-out questions. A new
    run from a model that a run of this seed trained re-reads that run's documents stage for
    stage: give it another seed (`--resume` is not affected: it goes on at the next stage)."""
    stages: tuple[Stage, ...] = Field(min_length=1, max_length=16)
    eval: EvalSpec = EvalSpec()

    @model_validator(mode="after")
    def _checks(self) -> Schedule:
        unknown = [k for k in self.kinds if k not in KINDS + CONTROLS]
        if unknown or not self.kinds:
            raise ValueError(f"kinds {unknown or '[]'}: choose from {list(KINDS + CONTROLS)}")
        lengths = [s.max_length for s in self.stages]
        if lengths != sorted(lengths):
            raise ValueError(f"stages must not shrink: max_length {lengths}")
        for s in self.stages:
            if s.rope == "none" and s.factor is not None:
                raise ValueError("a stage with rope: none has no factor")
        return self


class ScheduleError(ValueError):
    exit_code = 2


def load_schedule(path: str | Path) -> Schedule:
    """Read and validate a schedule file; ScheduleError with one line per problem."""
    source = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise ScheduleError(f"{source}: cannot read the schedule file: {err}") from None
    loader = SafeRunLoader(text)
    try:
        root = loader.get_single_node()
        data = loader.construct_document(root) if root is not None else None
    except yaml.YAMLError as err:
        raise ScheduleError(f"{source}: YAML syntax error: {err}") from None
    finally:
        loader.dispose()
    if not isinstance(data, dict):
        raise ScheduleError(f"{source}: expected a mapping with keys such as {', '.join(Schedule.model_fields)}")
    try:
        return Schedule.model_validate(data)
    except ValidationError as err:
        lines = []
        errors = err.errors(include_url=False)
        nested = {e["loc"][:-1] for e in errors if len(e["loc"]) > 1} | {e["loc"][:1] for e in errors if len(e["loc"]) > 1}
        for e in errors:
            if e["type"] == "too_short" and e["loc"] in nested:  # pydantic's echo of an item that failed
                continue
            loc, message, kind = explain(e, Schedule)
            line = line_for(root, loc, kind)
            lines.append(f"{source}:{line or '?'}: {dotted(loc) or '(top)'}: {message}")
        raise ScheduleError("\n".join(lines)) from None
