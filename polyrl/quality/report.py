"""An audit's result as one JSON document, and as a summary a person reads.

    {"tasks": [{"id", "line", "status", "findings": [{"check", "message", "severity"}], ...}],
     "summary": {"source", "tasks", "pass", "warn", "fail", "checks": {check: {"fail", "warn"}},
                 "probes": {group: {"held", "total"}}, "worst": [...], "scored", "seconds", "policy"}}

A malformed line is a task entry with "id": null. The text form gives counts per check,
how many probes of each kind held (for mutants: how many the tests killed), and the
worst tasks (most failed findings first) with their first findings.

Out of scope: running the audit (audit.py) and choosing the exit code (polyrl/commands/audit.py).
"""

from __future__ import annotations

from typing import Any

from polyrl.quality.audit import AuditResult
from polyrl.quality.findings import CHECKS, TaskAudit


def _badness(audit: TaskAudit) -> tuple[int, int]:
    return (sum(f.severity == "fail" for f in audit.findings), sum(f.severity == "warn" for f in audit.findings))


def worst(result: AuditResult, n: int = 10) -> list[TaskAudit]:
    """The n tasks with the most failed (then warned) findings; passing tasks never."""
    bad = [a for a in result.tasks if a.findings]
    return sorted(bad, key=lambda a: (-_badness(a)[0], -_badness(a)[1], a.line or 0))[:n]


def summary(result: AuditResult) -> dict[str, Any]:
    statuses = [a.status for a in result.tasks]
    checks: dict[str, dict[str, int]] = {}
    for check in CHECKS:
        counts = {sev: sum(any(f.check == check and f.severity == sev for f in a.findings) for a in result.tasks)
                  for sev in ("fail", "warn")}
        if counts["fail"] or counts["warn"]:
            checks[check] = counts
    out: dict[str, Any] = {
        "source": result.source, "tasks": len(result.tasks),
        "pass": statuses.count("pass"), "warn": statuses.count("warn"), "fail": statuses.count("fail"),
        "checks": checks,
        "probes": {group: {"held": held, "total": total} for group, (held, total) in sorted(result.tally.items())},
        "worst": [{"id": a.id, "line": a.line, "status": a.status} for a in worst(result)],
        "scored": result.scored, "seconds": round(result.seconds, 2), "policy": result.policy,
    }
    solved = [a.difficulty for a in result.tasks if a.difficulty]
    if solved:
        k = solved[0]["samples"]
        out["difficulty"] = {"tasks": len(solved), "samples": k,
                             "pass@1": sum(d["pass@1"] for d in solved) / len(solved),
                             f"pass@{k}": sum(d[f"pass@{k}"] for d in solved) / len(solved),
                             "always_solved": sum(d["solved"] == k for d in solved),
                             "never_solved": sum(d["solved"] == 0 for d in solved)}
    return out


def to_json(result: AuditResult) -> dict[str, Any]:
    return {"tasks": [a.to_json() for a in result.tasks], "summary": summary(result)}


def _probe_line(group: str, held: int, total: int) -> str:
    if group.startswith("mutant:"):
        return f"  {group[7:]:<24} {total - held:>5} of {total:<5} mutants survive (score full reward)"
    return f"  {group:<24} {held:>5} of {total:<5} probes scored as they must"


def format_text(result: AuditResult, n_worst: int = 10) -> str:
    s = summary(result)
    lines = [f"audit of {s['source']}: {s['tasks']} tasks: {s['pass']} pass, {s['warn']} warn, {s['fail']} fail "
             f"({s['scored']} completions scored in {s['seconds']:.1f} s"
             + (f", policy {s['policy']})" if s["policy"] else ")")]
    if s["checks"]:
        lines.append(f"  {'check':<24} {'fail':>5} {'warn':>5}   (tasks)")
        lines += [f"  {check:<24} {c['fail']:>5} {c['warn']:>5}" for check, c in s["checks"].items()]
    if s["probes"]:
        lines.append("probes:")
        lines += [_probe_line(g, p["held"], p["total"]) for g, p in s["probes"].items()]
    if "difficulty" in s:
        d, k = s["difficulty"], s["difficulty"]["samples"]
        lines.append(f"difficulty ({k} samples per task): pass@1 {d['pass@1']:.3f}, pass@{k} {d[f'pass@{k}']:.3f}, "
                     f"always solved {d['always_solved']}, never solved {d['never_solved']}")
    bad = worst(result, n_worst)
    if bad:
        lines.append(f"worst {len(bad)} tasks:")
        for a in bad:
            where = f"line {a.line}" if a.line is not None else "-"
            lines.append(f"  {where:<9} {a.id or '(malformed)'}  {a.status}")
            for f in sorted(a.findings, key=lambda f: f.severity != "fail")[:3]:
                lines.append(f"      {f.severity} {f.check}: {_clip(f.message, 200)}")
            if len(a.findings) > 3:
                lines.append(f"      ... and {len(a.findings) - 3} more (--json for all)")
    return "\n".join(lines)


def _clip(text: str, n: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= n else text[:n - 3] + "..."
