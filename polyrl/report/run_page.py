"""The report page of a training run: what a reader checks, in the order they check it.

    1. held-out accuracy before -> after, per domain (the table the run ends with)
    2. reward: per-domain training reward per step, held-out accuracy where measured
    3. curriculum: the domain shares per step, and each change with its reason
    4. KL: per-domain KL to the reference and the coefficient in force, with reasons
    5. speed: the step-time split (rollout, reward, update) and rollout throughput
    6. budget: steps, minutes and rollout tokens spent against the run file's limits
    7. reward monitor flags (flags.jsonl) and what the on_flag policy did
    8. per-call figures of obs.sqlite, training and evaluation apart

Out of scope: reading the run (run_data.py), drawing (plots.py).
"""

from __future__ import annotations

from dataclasses import asdict

from polyrl.obs.report import ObsReport
from polyrl.report import html as H
from polyrl.report import plots
from polyrl.report.run_data import RunData


def run_page(run: RunData) -> str:
    steps = run.steps
    subtitle = (f"{run.path} · {len(steps)} step(s) · domains: {', '.join(run.domains) or 'none'}"
                + (f" · model {run.config['model'].get('path')}" if isinstance(run.config.get("model"), dict) else ""))
    notes = H.section("Notes", *(H.paragraph(n, "muted") for n in run.notes))
    return H.page(f"polyrl run report: {run.name}", subtitle,
                  [summary(run), rewards(run), curriculum(run), kl(run), speed(run), budget(run), flags(run),
                   observability(run), notes])


def summary(run: RunData) -> str:
    before, after = run.before or {}, run.after or {}
    rows = []
    for d in run.domains:
        b, a = (before.get(d) or {}).get("accuracy"), (after.get(d) or {}).get("accuracy")
        rows.append([d, b, a, (a - b) if a is not None and b is not None else None,
                     (before.get(d) or {}).get("greedy_accuracy"), (after.get(d) or {}).get("greedy_accuracy")])
    if not rows:
        return ""
    text = "" if run.after else H.paragraph("The run has not finished: eval/after.json is not written yet.", "muted")
    return H.section("Held-out accuracy", text,
                     H.table(["domain", "before", "after", "change", "greedy before", "greedy after"], rows),
                     anchor="summary")


def rewards(run: RunData) -> str:
    svg = plots.lines("training reward per domain", run.steps, {d: run.series("reward", d) for d in run.domains},
                      "mean reward", "reward", points=run.heldout)
    lengths = plots.lines("response length", run.steps, {d: run.series("response_length", d) for d in run.domains},
                          "generated tokens", "length")
    return H.section("Reward", H.figure(svg, "Lines: mean training reward of each step's samples. Dashed with "
                                             "markers: held-out accuracy at the step it was measured.", "reward"),
                     H.figure(lengths, "Mean generated tokens per sample.", "length"), anchor="reward")


def curriculum(run: RunData) -> str:
    marks = [m["step"] for m in run.metrics if m.get("curriculum_update")]
    svg = plots.stacked_shares("domain shares of each batch", run.steps,
                               {d: run.per_step("weights", d) for d in run.domains}, "weights", marks)
    changes = run.reason_changes("weight_reasons")
    rows = [[step, d, _at(run, step, "weights", d), reason] for step, d, reason in changes]
    return H.section("Curriculum", H.figure(svg, "Dotted lines: a held-out evaluation moved the shares.", "weights"),
                     H.paragraph("Each change of a domain's share, with the curriculum's reason:") if rows else "",
                     H.table(["step", "domain", "share", "reason"], rows), anchor="curriculum")


def kl(run: RunData) -> str:
    svg = plots.kl("KL per domain", run.steps, {d: run.series("kl", d) for d in run.domains},
                   {d: run.per_step("kl_coef", d) for d in run.domains}, "kl")
    rows = [[step, d, _at(run, step, "kl_coef", d), reason] for step, d, reason in run.reason_changes("kl_coef_reasons")]
    return H.section("KL", H.figure(svg, "Top: measured per-token KL to the reference policy. Bottom: the "
                                         "coefficient each domain's controller set.", "kl"),
                     H.table(["step", "domain", "coefficient", "reason"], rows), anchor="kl")


def speed(run: RunData) -> str:
    parts = {}
    for m in run.metrics:
        for k in m.get("time") or {}:
            parts.setdefault(k, None)
    svg = plots.step_time(run.steps, {k: run.at("time", k) for k in parts}, run.at("tokens_per_s"), "speed")
    totals = [[k, sum(v or 0.0 for v in run.at("time", k))] for k in parts]
    return H.section("Speed", H.figure(svg, "Seconds per step by part, and generated tokens per second of rollout.",
                                       "speed"), H.table(["part", "seconds in all"], totals), anchor="speed")


def budget(run: RunData) -> str:
    limits = run.budget
    used: dict[str, list[float | None]] = {}
    rows = []
    steps = run.steps
    if limits["steps"]:
        used["steps"] = [(s + 1) / limits["steps"] for s in steps]
        rows.append(["steps", len(steps), limits["steps"]])
    clock = run.at("clock")
    if limits["max_minutes"]:
        used["minutes"] = [None if c is None else c / 60 / limits["max_minutes"] for c in clock]
        rows.append(["minutes of training", _last(clock, 1 / 60), limits["max_minutes"]])
    else:
        rows.append(["minutes of training", _last(clock, 1 / 60), None])
    tokens = run.at("rollout_tokens")
    if limits["max_rollout_tokens"]:
        used["rollout tokens"] = [None if t is None else t / limits["max_rollout_tokens"] for t in tokens]
    rows.append(["rollout tokens", _last(tokens), limits["max_rollout_tokens"]])
    svg = plots.budget_use(steps, used, "budget")
    agent = [f"{phase or 'unlabelled'}: budget ran out at agent step(s) "
             f"{', '.join(f'{s} ({n}x)' for s, n in rep.budget_exhausted_at_step.items())}"
             for phase, rep in run.obs.items() if rep.budget_exhausted_at_step]
    return H.section("Budget", H.table(["limit", "spent", "limit (run file)"], rows),
                     H.figure(svg, "The run stops when a line reaches 1.", "budget"),
                     *(H.paragraph(a) for a in agent), anchor="budget")


def flags(run: RunData) -> str:
    rows = [[f.get("step"), f.get("domain"), f.get("kind"), f.get("task_id"), f.get("reason")] for f in run.flags]
    acts = [[m["step"], a.get("domain"), a.get("flag"), ", ".join(map(str, a.get("actions", [])))]
            for m in run.metrics for a in m.get("flag_actions") or []]
    if not rows and not acts:
        return H.section("Reward monitor", H.paragraph("No suspicious reward pattern was flagged.", "muted"))
    return H.section("Reward monitor", H.table(["step", "domain", "flag", "task", "reason"], rows),
                     H.table(["step", "domain", "flag", "actions taken"], acts), anchor="flags")


def observability(run: RunData) -> str:
    if not run.obs:
        return ""
    keys = ["model_calls", "traces", "input_tokens", "cached_tokens", "output_tokens", "tokens_per_step",
            "cache_hit_rate", "length_stops", "tool_calls", "tool_failure_rate", "scored_episodes", "successes",
            "tokens_per_success"]
    phases = list(run.obs)
    figures = {p: asdict(r) for p, r in run.obs.items()}
    rows = [[k] + [figures[p].get(k) for p in phases] for k in keys]
    by_domain = []
    for p, rep in run.obs.items():
        for d, fig in sorted(_by_domain(rep).items()):
            by_domain.append([p or "unlabelled", d, fig.get("calls"), fig.get("input_tokens"),
                              fig.get("cached_tokens"), fig.get("output_tokens"), fig.get("length_stops")])
    return H.section("Per-call records (obs.sqlite)",
                     H.table(["figure"] + [p or "unlabelled" for p in phases], rows),
                     H.table(["phase", "domain", "model calls", "input tokens", "cached", "output tokens",
                              "cut at max_tokens"], by_domain),
                     H.paragraph("`polyrl obs RUN_DIR --phase train|eval` prints these figures.", "muted"),
                     anchor="obs")


def _by_domain(rep: ObsReport) -> dict:
    return getattr(rep, "domains", {}) or {}


def _at(run: RunData, step: int, block: str, domain: str) -> float | None:
    for m in run.metrics:
        if m["step"] == step:
            value = (m.get(block) or {}).get(domain)
            return value if isinstance(value, (int, float)) else None
    return None


def _last(values: list[float | None], scale: float = 1.0) -> float | None:
    present = [v for v in values if v is not None]
    return present[-1] * scale if present else None
