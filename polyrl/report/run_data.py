"""What a report shows of a training run, read from its run directory (train/run_dir.py).

    run = read_run(RUN_DIR)
    run.steps                    the step numbers of metrics.jsonl, in order
    run.series("reward", "code") per-step values of a domain field (None where absent)
    run.heldout["code"]          [(step, accuracy), ...]: eval/before.json at 0, every
                                 in-training evaluation at the step it measured, and
                                 eval/after.json at the end
    run.weights / weight_reasons per step and domain: the curriculum's shares and why
    run.budget                   the run file's limits (steps, minutes, rollout tokens)
    run.obs                      per phase (train, eval, ...) figures of obs.sqlite

Reading is tolerant: a torn last line of a log is skipped (and said in `notes`), a missing
file is an empty section, and fields a run did not write (an older run, a domain without
KL) are None. Nothing here writes to the run directory.

Out of scope: drawing (plots.py) and the page (run_page.py).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from polyrl.obs.jsonl import iter_jsonl
from polyrl.obs.report import ObsReport, build_report
from polyrl.obs.store import ObsStoreError, read_phases, store_path

METRICS = "metrics.jsonl"


@dataclass
class RunData:
    path: Path
    metrics: list[dict[str, Any]]
    """metrics.jsonl, one record per step"""
    before: dict[str, dict] | None
    after: dict[str, dict] | None
    config: dict[str, Any]
    """config.yaml as plain data ({} when absent or unreadable)"""
    flags: list[dict[str, Any]] = field(default_factory=list)
    obs: dict[str, ObsReport] = field(default_factory=dict)
    """phase ("train", "eval"; "" for records without one) -> figures of its records"""
    notes: list[str] = field(default_factory=list)

    @property
    def name(self) -> str:
        return str(self.config.get("name") or self.path.name)

    @property
    def steps(self) -> list[int]:
        return [int(m["step"]) for m in self.metrics]

    @property
    def domains(self) -> list[str]:
        seen: dict[str, None] = {}
        for m in self.metrics:
            for d in m.get("domains", {}):
                seen.setdefault(d)
        for ev in (self.before, self.after):
            for d in ev or {}:
                seen.setdefault(d)
        return sorted(seen)

    def series(self, key: str, domain: str) -> list[float | None]:
        """Per step, `domains[domain][key]` of each metrics line (None where absent)."""
        return [_number(m.get("domains", {}).get(domain, {}).get(key)) for m in self.metrics]

    def per_step(self, block: str, domain: str) -> list[float | None]:
        """Per step, `block[domain]` of each metrics line, e.g. block="weights" or "kl_coef"."""
        return [_number((m.get(block) or {}).get(domain)) for m in self.metrics]

    def at(self, *keys: str) -> list[float | None]:
        """Per step, the number at `keys` of each metrics line: at("time", "rollout")."""
        out = []
        for m in self.metrics:
            value: Any = m
            for k in keys:
                value = value.get(k) if isinstance(value, dict) else None
            out.append(_number(value))
        return out

    @property
    def heldout(self) -> dict[str, list[tuple[int, float]]]:
        """Per domain, (step measured, held-out accuracy), in step order."""
        points: list[tuple[int, dict]] = []
        if self.before:
            points.append((0, self.before))
        for m in self.metrics:
            if isinstance(m.get("eval"), dict):
                of = m.get("eval_of")
                points.append((int(of["step"]) if isinstance(of, dict) else int(m["step"]) + 1, m["eval"]))
        if self.after:
            points.append(((self.steps[-1] + 1) if self.metrics else 0, self.after))
        out: dict[str, list[tuple[int, float]]] = {}
        for step, results in sorted(points, key=lambda p: p[0]):
            for d, r in results.items():
                acc = _number(r.get("accuracy")) if isinstance(r, dict) else None
                if acc is not None:
                    out.setdefault(d, []).append((step, acc))
        return out

    def reason_changes(self, block: str = "weight_reasons") -> list[tuple[int, str, str]]:
        """(step, domain, reason) each time a domain's reason text changed: the curriculum's
        (block="weight_reasons") or the KL controller's ("kl_coef_reasons") decisions."""
        last: dict[str, str] = {}
        out = []
        for m in self.metrics:
            for d, reason in sorted((m.get(block) or {}).items()):
                if last.get(d) != reason:
                    out.append((int(m["step"]), d, str(reason)))
                    last[d] = reason
        return out

    @property
    def budget(self) -> dict[str, float | None]:
        """The run file's limits: steps, max_minutes, max_rollout_tokens (None: no limit)."""
        trainer = self.config.get("trainer") or {}
        return {"steps": _number(trainer.get("steps")), "max_minutes": _number(trainer.get("max_minutes")),
                "max_rollout_tokens": _number(trainer.get("max_rollout_tokens"))}


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def is_run_dir(path: Path) -> bool:
    return (path / METRICS).is_file()


def read_run(path: str | Path) -> RunData:
    """The run directory at `path` (it holds metrics.jsonl; is_run_dir says so)."""
    path = Path(path)
    notes: list[str] = []
    metrics = [m for m in iter_jsonl(path / METRICS, notes) if isinstance(m, dict) and isinstance(m.get("step"), int)]
    flags = list(iter_jsonl(path / "flags.jsonl", notes)) if (path / "flags.jsonl").is_file() else []
    run = RunData(path, metrics, _json(path / "eval" / "before.json", notes), _json(path / "eval" / "after.json", notes),
                  _yaml(path / "config.yaml", notes), [f for f in flags if isinstance(f, dict)], notes=notes)
    if store_path(path).is_file():
        try:
            run.obs = {phase: build_report(path, phase=phase) for phase in read_phases(path)}
        except ObsStoreError as err:
            notes.append(f"obs.sqlite not shown: {err}")
    return run


def _json(file: Path, notes: list[str]) -> Any:
    if not file.is_file():
        return None
    try:
        data = json.loads(file.read_text())
    except ValueError as err:
        notes.append(f"{file.name} not shown: not JSON ({err})")
        return None
    return data if isinstance(data, dict) else None


def _yaml(file: Path, notes: list[str]) -> dict[str, Any]:
    if not file.is_file():
        return {}
    try:
        data = yaml.safe_load(file.read_text())
    except yaml.YAMLError as err:
        notes.append(f"{file.name} not shown: not YAML ({str(err).splitlines()[0]})")
        return {}
    return data if isinstance(data, dict) else {}
