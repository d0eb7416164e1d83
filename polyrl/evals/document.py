"""The results document of `polyrl eval`, and writing it (results.json, tasks.jsonl) atomically.

    {"suite": {"path", "tasks", "tags": {tag: n}},
     "limits": {EvalLimits fields},
     "models": [{"model", "kind", "context_window", "tasks", "successes", "success_rate",
                 "success_ci95": [low, high], "mean_reward", "tokens_in", "tokens_out", "cached_tokens",
                 "model_calls", "tokens_per_success", "tokens_per_step", "latency_p50_s", "latency_p95_s",
                 "cost", "cost_per_success", "budget_exhausted", "budget_exhausted_ids",
                 "stop_reasons": {reason: n},
                 "by_tag": {tag: {"tasks", "successes", "success_rate"}},
                 "attribution": {see `_attribution_summary`}}, ...],
     "tasks": [{"id", "model", "tag", "domain", "verifier", "agent", "line", "success", "reward",
                "status", "answer", "expected", "tokens_in", "tokens_out", "cached_tokens",
                "model_calls", "tool_calls", "tool_errors", "latency_s",
                "budget": {"limit", "spent", "exhausted"}, "stop_reason", "cost",
                "attribution": null | {"label", "evidence": [{"kind", "detail", "limits"}], "tested",
                                       "flipped", "lifted", "rerun"}}, ...],
     "summary": {"models": [spec, ...], "best", "comparisons": [{"a", "b", "tasks", "both",
                 "only_a", "only_b", "neither", "p_value", "differ": [id, ...]}],
                 "by_tag": {tag: {model: success_rate}}, "attribution": {...all models...}}}

`tokens_per_success` is every token of every task (prompt + completion, failures included)
over the successes, as `polyrl obs` and training's held-out evaluation define it;
`tokens_per_step` is those tokens over the model calls. Latencies are per task, wall clock.
`comparisons` pairs every two models on the tasks they share: the counts of the 2x2 table
and the exact McNemar p-value of the tasks where exactly one succeeded (stats.py).

`tasks.jsonl` holds one line per task and model, {"id", "model", "trajectory",
"rerun_trajectory"}: every call and full tool result (agent episodes as
AgentResult.to_json writes them), and the attribution re-run's when there was one.

`write_outputs(dir, doc, trajectories)` writes both files through temporary names and
renames them into place, results.json last: a run that fails leaves nothing half-written.

Out of scope: rendering (the command prints a table; `polyrl report` draws the page).
"""

from __future__ import annotations

import json
import os
import tempfile
from collections import Counter, defaultdict
from itertools import combinations
from pathlib import Path
from typing import Any, Iterable, Sequence

from polyrl.evals.attribution import CAPABILITY, ENGINEERING, KINDS
from polyrl.evals.limits import EvalLimits
from polyrl.evals.models import ModelAdapter
from polyrl.evals.prices import PriceCard
from polyrl.evals.session import TaskRecord
from polyrl.evals.stats import mcnemar_exact, percentile, wilson_interval
from polyrl.evals.suite import TAGS, UNTAGGED, Suite


def _rate(successes: int, n: int) -> float | None:
    return successes / n if n else None


def task_entry(record: TaskRecord, prices: PriceCard) -> dict[str, Any]:
    run, task = record.run, record.run.suite_task.task
    cost = prices.price(run.model).cost(run.input_tokens, run.cached_tokens, run.output_tokens)
    return {
        "id": task.id, "model": run.model, "tag": run.suite_task.tag, "domain": task.domain,
        "verifier": run.suite_task.verifier, "agent": run.suite_task.is_agent, "line": run.suite_task.line,
        "success": run.success, "reward": run.score.value, "status": run.score.details.get("status"),
        "answer": run.answer, "expected": task.answer,
        "tokens_in": run.input_tokens, "tokens_out": run.output_tokens, "cached_tokens": run.cached_tokens,
        "model_calls": run.model_calls, "tool_calls": run.tool_calls, "tool_errors": run.tool_errors,
        "latency_s": round(run.latency_s, 6),
        "budget": {"limit": run.budget_limit, "spent": run.budget_spent, "exhausted": run.budget_exhausted},
        "stop_reason": run.stop_reason, "cost": cost,
        "attribution": None if record.attribution is None else record.attribution.to_json(),
    }


def _attribution_summary(entries: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Failures by label, by evidence kind (seen, confirmed by the flip) and by tag; the flip rate
    is flipped re-runs over re-runs (failures with evidence to test)."""
    failed = [e for e in entries if not e["success"]]
    labels = Counter(e["attribution"]["label"] for e in failed)
    tested = [e for e in failed if e["attribution"]["tested"]]
    flipped = sum(bool(e["attribution"]["flipped"]) for e in tested)
    by_evidence = {}
    for kind in KINDS:
        seen = [e for e in failed if any(ev["kind"] == kind for ev in e["attribution"]["evidence"])]
        if seen:
            by_evidence[kind] = {"seen": len(seen), "confirmed": sum(bool(e["attribution"]["flipped"]) for e in seen)}
    by_tag: dict[str, dict[str, int]] = defaultdict(lambda: {ENGINEERING: 0, CAPABILITY: 0})
    for e in failed:
        by_tag[e["tag"]][e["attribution"]["label"]] += 1
    return {"failures": len(failed), ENGINEERING: labels[ENGINEERING], CAPABILITY: labels[CAPABILITY],
            "tested": len(tested), "flipped": flipped, "flip_rate": _rate(flipped, len(tested)),
            "by_evidence": by_evidence, "by_tag": dict(by_tag)}


def _tags_in_order(entries: Iterable[dict[str, Any]]) -> list[str]:
    present = {e["tag"] for e in entries}
    return [t for t in TAGS + (UNTAGGED,) if t in present]


def model_entry(adapter: ModelAdapter, entries: Sequence[dict[str, Any]]) -> dict[str, Any]:
    n = len(entries)
    successes = sum(e["success"] for e in entries)
    tokens = sum(e["tokens_in"] + e["tokens_out"] for e in entries)
    calls = sum(e["model_calls"] for e in entries)
    latencies = [e["latency_s"] for e in entries]
    cost = sum(e["cost"] for e in entries)
    ci = wilson_interval(successes, n)
    by_tag = {}
    for tag in _tags_in_order(entries):
        mine = [e for e in entries if e["tag"] == tag]
        ok = sum(e["success"] for e in mine)
        by_tag[tag] = {"tasks": len(mine), "successes": ok, "success_rate": _rate(ok, len(mine))}
    return {
        "model": adapter.spec, "kind": adapter.kind, "context_window": adapter.context_window,
        "tasks": n, "successes": successes, "success_rate": _rate(successes, n),
        "success_ci95": list(ci) if ci else None,
        "mean_reward": sum(e["reward"] for e in entries) / n if n else None,
        "tokens_in": sum(e["tokens_in"] for e in entries), "tokens_out": sum(e["tokens_out"] for e in entries),
        "cached_tokens": sum(e["cached_tokens"] for e in entries), "model_calls": calls,
        "tokens_per_success": tokens / successes if successes else None,
        "tokens_per_step": tokens / calls if calls else None,
        "latency_p50_s": percentile(latencies, 50), "latency_p95_s": percentile(latencies, 95),
        "cost": cost, "cost_per_success": cost / successes if successes else None,
        "budget_exhausted": sum(e["budget"]["exhausted"] for e in entries),
        "budget_exhausted_ids": [e["id"] for e in entries if e["budget"]["exhausted"]],
        "stop_reasons": dict(Counter(e["stop_reason"] for e in entries)),
        "by_tag": by_tag, "attribution": _attribution_summary(entries),
    }


def compare(a: str, b: str, entries: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The paired comparison of models a and b on the tasks both ran."""
    won = {(e["model"], e["id"]): e["success"] for e in entries}
    shared = [e["id"] for e in entries if e["model"] == a and (b, e["id"]) in won]
    cells = Counter((won[(a, i)], won[(b, i)]) for i in shared)
    only_a, only_b = cells[(True, False)], cells[(False, True)]
    return {"a": a, "b": b, "tasks": len(shared), "both": cells[(True, True)], "only_a": only_a, "only_b": only_b,
            "neither": cells[(False, False)], "p_value": mcnemar_exact(only_a, only_b),
            "differ": [i for i in shared if won[(a, i)] != won[(b, i)]]}


def build_document(suite: Suite, adapters: Sequence[ModelAdapter], limits: EvalLimits,
                   records: Sequence[TaskRecord], prices: PriceCard) -> dict[str, Any]:
    tasks = [task_entry(r, prices) for r in records]
    models = [model_entry(a, [e for e in tasks if e["model"] == a.spec]) for a in adapters]
    specs = [a.spec for a in adapters]
    ranked = sorted(models, key=lambda m: (-(m["success_rate"] or 0), m["cost"]))
    by_tag = {tag: {m["model"]: m["by_tag"][tag]["success_rate"] for m in models if tag in m["by_tag"]}
              for tag in _tags_in_order(tasks)}
    return {
        "suite": {"path": suite.path, "tasks": len(suite.tasks),
                  "tags": dict(Counter(t.tag for t in suite.tasks))},
        "limits": limits.model_dump(),
        "models": models,
        "tasks": tasks,
        "summary": {"models": specs, "best": ranked[0]["model"] if ranked else None,
                    "comparisons": [compare(a, b, tasks) for a, b in combinations(specs, 2)],
                    "by_tag": by_tag, "attribution": _attribution_summary(tasks)},
    }


def trajectories(records: Sequence[TaskRecord]) -> list[dict[str, Any]]:
    out = []
    for r in records:
        rerun = r.attribution.rerun if r.attribution is not None else None
        out.append({"id": r.run.task_id, "model": r.run.model, "trajectory": r.run.trajectory,
                    "rerun_trajectory": rerun.trajectory if rerun is not None else None})
    return out


def write_outputs(out_dir: str | Path, doc: dict[str, Any], lines: Sequence[dict[str, Any]]) -> None:
    """DIR/tasks.jsonl, then DIR/results.json, each written to a temporary file and renamed."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    _atomic_write(out / "tasks.jsonl", "".join(json.dumps(line, default=str) + "\n" for line in lines))
    _atomic_write(out / "results.json", json.dumps(doc, indent=1, default=str) + "\n")


def _atomic_write(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
