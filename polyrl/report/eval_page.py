"""The report page of an evaluation: candidates side by side, failures by tag, every task.

    1. side by side: per model, success rate, mean reward, tokens per success, latency
       p50/p95, failures attributed to engineering and to capability (computed from the
       task rows), then the per-model figures of results.json's summary
    2. attribution by tag: per tag and model, successes and failures by label (a plot and
       a table), and the summary's remaining figures (e.g. the flip rate of re-runs)
    3. paired comparison: the tasks on which the models disagree
    4. drill-down: one collapsed entry per task, each model's row, its attribution with
       the evidence, and its trajectory (tasks.jsonl)

Out of scope: reading the directory (eval_data.py), drawing (plots.py).
"""

from __future__ import annotations

from typing import Any

from polyrl.report import html as H
from polyrl.report import plots
from polyrl.report.eval_data import EvalData, TaskResult

SHOWN = ("success", "reward", "attribution", "tag", "tokens_in", "tokens_out", "latency_s", "stop_reason")
"""Row fields with their own column in the drill-down; the rest follow as JSON."""


def eval_page(ev: EvalData) -> str:
    subtitle = (f"{ev.path} · {len(ev.task_ids)} task(s) · models: {', '.join(ev.models) or 'none'}"
                f" · tags: {', '.join(ev.tags) or 'none'}")
    notes = H.section("Notes", *(H.paragraph(n, "muted") for n in ev.notes))
    return H.page("polyrl evaluation report", subtitle,
                  [side_by_side(ev), by_tag(ev), paired(ev), drill_down(ev), notes])


def _summary_of(ev: EvalData, model: str) -> dict[str, Any]:
    """The figures results.json gives one model, wherever it keeps them, nested objects of
    plain values flattened one level ("attribution.flip_rate")."""
    found = _find(ev, model)
    flat: dict[str, Any] = {}
    for k, v in found.items():
        if k in ("model", "name"):
            continue
        if isinstance(v, dict) and all(_scalar(x) for x in v.values()):
            flat.update({f"{k}.{kk}": vv for kk, vv in v.items()})
        else:
            flat[k] = v
    return flat


def _find(ev: EvalData, model: str) -> dict[str, Any]:
    if ev.figures.get(model):
        return ev.figures[model]
    s = ev.summary
    for holder in (s.get("models"), s.get("per_model"), s):
        if isinstance(holder, dict) and isinstance(holder.get(model), dict):
            return holder[model]
        if isinstance(holder, list):
            for item in holder:
                if isinstance(item, dict) and str(item.get("name", item.get("model"))) == model:
                    return item
    return {}


def _scalar(v: Any) -> bool:
    """A value that fits a table cell: a number, text, or a short list of them (an interval)."""
    if isinstance(v, list):
        return len(v) <= 4 and all(isinstance(x, (str, int, float, bool)) or x is None for x in v)
    return v is None or isinstance(v, (str, int, float, bool))


def side_by_side(ev: EvalData) -> str:
    figures = ev.per_model()
    keys = ["tasks", "successes", "success_rate", "mean_reward", "tokens_per_success", "latency_p50_s",
            "latency_p95_s", "engineering_failures", "capability_failures"]
    rows = [[k] + [figures[m][k] for m in ev.models] for k in keys]
    given = {m: {k: v for k, v in _summary_of(ev, m).items() if _scalar(v)} for m in ev.models}
    extra = list(dict.fromkeys(k for m in ev.models for k in given[m]))
    more = [[k] + [given[m].get(k) for m in ev.models] for k in extra]
    svg = plots.grouped_bars("success rate per model", ["all"] + ev.tags,
                             {m: {"success rate": [_rate(ev.of(m), None)] + [_rate(ev.of(m), t) for t in ev.tags]}
                              for m in ev.models}, "share of tasks solved", "success")
    return H.section("Side by side", H.table(["computed from the task rows"] + ev.models, rows),
                     H.paragraph("As results.json's summary reports them:") if more else "",
                     H.table(["summary"] + ev.models, more),
                     H.figure(svg, "Success rate over all tasks and per tag.", "success"), anchor="side-by-side")


def _rate(rows: list[TaskResult], tag: str | None) -> float:
    rows = [t for t in rows if tag is None or t.tag == tag]
    return sum(t.success for t in rows) / len(rows) if rows else 0.0


def by_tag(ev: EvalData) -> str:
    counts = ev.by_tag()
    parts = ["success", "engineering", "capability", "other"]
    stacks = {m: {p: [counts[m].get(tag, {}).get(p, 0) for tag in ev.tags] for p in parts} for m in ev.models}
    svg = plots.grouped_bars("outcomes by tag: successes, and failures by attribution", ev.tags, stacks, "tasks",
                             "attribution")
    rows = [[tag, m] + [counts[m].get(tag, {}).get(k, 0) for k in ["tasks"] + parts]
            for tag in ev.tags for m in ev.models]
    rest = {k: v for k, v in ev.summary.items()
            if k not in ev.models and k not in ("models", "per_model", "comparisons")}
    if isinstance(rest.get("attribution"), dict):  # the pooled attribution figures (flip rate) as rows
        rest.update({f"attribution.{k}": v for k, v in rest.pop("attribution").items()})
    scalars = [[k, v] for k, v in rest.items() if _scalar(v)]
    nested = {k: v for k, v in rest.items() if not _scalar(v)}
    return H.section("Attribution by tag",
                     H.figure(svg, "One bar per model in each tag (the hatching names the model); failures are split into "
                                   "engineering (a limit of the setup: truncation, budget, format) and capability.",
                              "attribution"),
                     H.table(["tag", "model", "tasks", "success", "engineering", "capability", "other failure"], rows),
                     H.table(["summary figure", "value"], scalars), H.pre(nested, 8000) if nested else "",
                     anchor="attribution")


def paired(ev: EvalData) -> str:
    if len(ev.models) < 2:
        return ""
    index = {(t.id, t.model): t for t in ev.tasks}
    ids = ev.differing()
    rows = []
    for i in ids:
        row: list[Any] = [i, next(t.tag for t in ev.tasks if t.id == i)]
        for m in ev.models:
            t = index.get((i, m))
            row.append("–" if t is None else "solved" if t.success else f"failed ({t.attribution or 'unattributed'})")
        rows.append(row)
    text = f"{len(ids)} of {len(ev.task_ids)} task(s) are solved by some models and not by others."
    keys = ["a", "b", "tasks", "both", "only_a", "only_b", "neither", "p_value"]
    pairs = [[c.get(k) for k in keys] for c in ev.summary.get("comparisons") or [] if isinstance(c, dict)]
    return H.section("Paired comparison", H.paragraph(text), H.table(keys, pairs, digits=4),
                     H.table(["task", "tag"] + ev.models, rows), anchor="paired")


def drill_down(ev: EvalData) -> str:
    index: dict[str, list[TaskResult]] = {}
    for t in ev.tasks:
        index.setdefault(t.id, []).append(t)
    entries = []
    for task_id, rows in index.items():
        verdicts = " · ".join(
            f'{H.escape(t.model)}: <span class="{"ok" if t.success else "bad"}">'
            f'{"solved" if t.success else "failed" + (" (" + H.escape(t.attribution) + ")" if t.attribution else "")}'
            f"</span>" for t in rows)
        head = f"<b>{H.escape(task_id)}</b> <span class=\"muted\">[{H.escape(rows[0].tag)}]</span> — {verdicts}"
        table = H.table(["model"] + list(SHOWN), [[t.model] + [_cell(t, k) for k in SHOWN] for t in rows])
        body = [table]
        for t in rows:
            rest = {k: v for k, v in t.row.items() if k not in SHOWN and k not in ("id", "model")}
            if isinstance(t.row.get("attribution"), dict):
                rest = {"attribution": t.row["attribution"], **rest}
            if rest:
                body.append(f"<p class=\"muted\">{H.escape(t.model)}: the row's other fields</p>" + H.pre(rest, 6000))
            if t.trajectory is not None:
                body.append(f"<p class=\"muted\">{H.escape(t.model)}: trajectory</p>" + H.pre(t.trajectory, 20000))
        entries.append(H.details(head, "\n".join(body)))
    return H.section("Tasks", H.paragraph("Open a task for each model's result, the evidence of its attribution and "
                                          "its trajectory.", "muted"), "\n".join(entries), anchor="tasks")


def _cell(t: TaskResult, key: str) -> Any:
    if key == "attribution":
        return t.attribution
    if key == "tag":
        return t.tag
    return t.row.get(key)
