"""What a report shows of an evaluation, read from its directory (`polyrl eval -o DIR`).

    EVAL_DIR/results.json  {"models": [...], "tasks": [{"id", "model", "success", "reward",
                            "attribution", "tag", "tokens_in", "tokens_out", "latency_s",
                            "stop_reason", ...}], "summary": {...}}
                           (polyrl/evals/document.py: a model entry is an object of its
                           figures named by "model"; the summary holds "comparisons")
    EVAL_DIR/tasks.jsonl   one line per task and model: the trajectory (optional)

The fields read from a task row are the ones above; every other field is kept and shown in
the drill-down. Reading is tolerant: a model is a name or an object with "name" (or "id",
"spec"); `attribution` is null (a success), a label ("engineering" / "capability") or an
object with "label" and its evidence; `tag` may sit in the row or in its "metadata"; a
missing number is None. A results.json that is not an object with a "tasks" list is an
EvalDirError, said in one line.

Out of scope: running an evaluation (polyrl eval), drawing (plots.py), the page (eval_page.py).
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from polyrl.obs.jsonl import iter_jsonl
from polyrl.obs.report import percentile

RESULTS = "results.json"
TRAJECTORIES = "tasks.jsonl"
LABELS = ("engineering", "capability")


class EvalDirError(Exception):
    """An evaluation directory whose results cannot be read; exit status 2."""

    exit_code = 2


@dataclass
class TaskResult:
    id: str
    model: str
    success: bool
    reward: float | None
    tag: str
    attribution: str | None
    """"engineering", "capability", another label, or None (a success, or not attributed)"""
    row: dict[str, Any]
    """the whole row, every field polyrl eval wrote"""
    trajectory: Any = None
    """its line of tasks.jsonl, when there is one"""

    def number(self, key: str) -> float | None:
        value = self.row.get(key)
        return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


@dataclass
class EvalData:
    path: Path
    models: list[str]
    tasks: list[TaskResult]
    summary: dict[str, Any]
    figures: dict[str, dict[str, Any]] = field(default_factory=dict)
    """per model, the figures its entry of "models" carries (when it is an object)"""
    notes: list[str] = field(default_factory=list)

    @property
    def tags(self) -> list[str]:
        order = {"typical": 0, "edge": 1, "failure_mode": 2}
        return sorted({t.tag for t in self.tasks}, key=lambda t: (order.get(t, 3), t))

    @property
    def task_ids(self) -> list[str]:
        return list(dict.fromkeys(t.id for t in self.tasks))

    def of(self, model: str) -> list[TaskResult]:
        return [t for t in self.tasks if t.model == model]

    def per_model(self) -> dict[str, dict[str, Any]]:
        """Figures per model computed from the task rows (the side-by-side table)."""
        out = {}
        for m in self.models:
            rows = self.of(m)
            n = len(rows)
            wins = sum(t.success for t in rows)
            tokens = [(t.number("tokens_in") or 0.0) + (t.number("tokens_out") or 0.0) for t in rows]
            latency = [t.number("latency_s") for t in rows if t.number("latency_s") is not None]
            rewards = [t.reward for t in rows if t.reward is not None]
            out[m] = {"tasks": n, "successes": wins, "success_rate": wins / n if n else None,
                      "mean_reward": sum(rewards) / len(rewards) if rewards else None,
                      "tokens_per_success": sum(tokens) / wins if wins else None,
                      "latency_p50_s": percentile(latency, 0.5), "latency_p95_s": percentile(latency, 0.95),
                      "engineering_failures": sum(t.attribution == "engineering" for t in rows if not t.success),
                      "capability_failures": sum(t.attribution == "capability" for t in rows if not t.success)}
        return out

    def by_tag(self) -> dict[str, dict[str, dict[str, int]]]:
        """model -> tag -> {"tasks", "success", "engineering", "capability", "other"} counts."""
        out: dict[str, dict[str, dict[str, int]]] = {}
        for m in self.models:
            counts: dict[str, dict[str, int]] = defaultdict(lambda: dict.fromkeys(
                ("tasks", "success", "engineering", "capability", "other"), 0))
            for t in self.of(m):
                c = counts[t.tag]
                c["tasks"] += 1
                kind = "success" if t.success else t.attribution if t.attribution in LABELS else "other"
                c[kind] += 1
            out[m] = {tag: counts[tag] for tag in self.tags if tag in counts}
        return out

    def differing(self) -> list[str]:
        """Task ids on which the models do not all agree on success (the paired comparison)."""
        by_id: dict[str, set[bool]] = defaultdict(set)
        for t in self.tasks:
            by_id[t.id].add(t.success)
        return [i for i in self.task_ids if len(by_id[i]) > 1]


def is_eval_dir(path: Path) -> bool:
    return (path / RESULTS).is_file()


def _model_name(m: Any) -> str:
    if isinstance(m, dict):
        for key in ("name", "id", "spec", "model"):
            if m.get(key) is not None:
                return str(m[key])
        return json.dumps(m, sort_keys=True)
    return str(m)


def _label(attribution: Any) -> str | None:
    if attribution is None or attribution is False:
        return None
    if isinstance(attribution, dict):
        for key in ("label", "kind", "category", "class"):
            if isinstance(attribution.get(key), str):
                return attribution[key]
        return None
    return str(attribution)


def read_eval(path: str | Path) -> EvalData:
    """The evaluation directory at `path` (it holds results.json; is_eval_dir says so)."""
    path = Path(path)
    try:
        doc = json.loads((path / RESULTS).read_text())
    except (OSError, ValueError) as err:
        raise EvalDirError(f"{path / RESULTS}: not readable as JSON ({err})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("tasks"), list):
        raise EvalDirError(f"{path / RESULTS}: not an evaluation's results (an object with a \"tasks\" list)")
    notes: list[str] = []
    trajectories: dict[tuple[str, str], Any] = {}
    if (path / TRAJECTORIES).is_file():
        try:
            for line in iter_jsonl(path / TRAJECTORIES, notes):
                if isinstance(line, dict) and line.get("id") is not None:
                    trajectories[(str(line["id"]), _model_name(line.get("model")))] = line
        except ValueError as err:
            notes.append(f"{TRAJECTORIES} not shown: {err}")
    tasks = []
    for i, row in enumerate(doc["tasks"]):
        if not isinstance(row, dict) or row.get("id") is None:
            notes.append(f"results.json: task row {i} has no id; left out")
            continue
        meta = row.get("metadata") if isinstance(row.get("metadata"), dict) else {}
        model = _model_name(row.get("model"))
        reward = row.get("reward")
        tasks.append(TaskResult(str(row["id"]), model, bool(row.get("success")),
                                float(reward) if isinstance(reward, (int, float)) and not isinstance(reward, bool)
                                else None, str(row.get("tag") or meta.get("tag") or "untagged"),
                                _label(row.get("attribution")), row, trajectories.get((str(row["id"]), model))))
    entries = doc.get("models") if isinstance(doc.get("models"), list) else []
    models = [_model_name(m) for m in entries]
    models += [m for m in dict.fromkeys(t.model for t in tasks) if m not in models]
    figures = {_model_name(m): m for m in entries if isinstance(m, dict)}
    summary = doc.get("summary") if isinstance(doc.get("summary"), dict) else {}
    return EvalData(path, models, tasks, summary, figures, notes)
