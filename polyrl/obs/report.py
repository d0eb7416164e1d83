"""The figures of a run's observability records (`polyrl obs RUN_DIR` prints them).

    tokens per step            mean prompt + completion tokens of a model call, and by step index
    per domain                 model calls, tokens (cached among them), calls cut at max_tokens,
                               model seconds (training and evaluation records carry x.domain)
    prefix-cache hit rate      sum(cache-read tokens) / sum(input tokens)
    time to first token        p50 / p95 where the backend measured it
    tool latency               p50 / p95, per tool too
    tool failure rate          share of tool calls with error.type, by type
    tokens per success         all model-call tokens / successful episodes (episode records)
    cost per success           the same in money, given --price-* (per million tokens)
    where budgets ran out      budget.exhausted events by step; stop reasons; degradation
                               actions taken (compress, truncate, downgrade, conclude)

Input tokens include cached tokens (OTel GenAI), so uncached input = input - cached;
cost = uncached * price_input + cached * price_cached + output * price_output.

`build_report(path, phase="train")` takes one phase's records ("train", "eval", "" for records
without one; None: all); `polyrl obs` prints one report per phase.

Out of scope: the command line (polyrl/commands/obs.py), dashboards and time series (metrics.jsonl has those), per-tier routing.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from polyrl.obs import records as R
from polyrl.obs.store import read_records


def percentile(values: list[float], q: float) -> float | None:
    """The q-quantile (0..1) by linear interpolation; None for no values."""
    if not values:
        return None
    xs = sorted(values)
    pos = q * (len(xs) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


@dataclass
class Prices:
    """Money per million tokens; cached input defaults to the input price."""

    input: float = 0.0
    output: float = 0.0
    cached: float | None = None

    def cost(self, input_tokens: int, cached_tokens: int, output_tokens: int) -> float:
        cached_price = self.input if self.cached is None else self.cached
        return ((input_tokens - cached_tokens) * self.input + cached_tokens * cached_price
                + output_tokens * self.output) / 1e6


@dataclass
class ObsReport:
    phase: str | None = None
    """the phase whose records these are ("" none; None: every record)"""
    model_calls: int = 0
    traces: int = 0
    input_tokens: int = 0
    cached_tokens: int = 0
    output_tokens: int = 0
    tokens_per_step: float | None = None
    by_step: list[dict[str, Any]] = field(default_factory=list)
    cache_hit_rate: float | None = None
    length_stops: int = 0
    """model calls cut at max_tokens (finish reason "length")"""
    domains: dict[str, dict[str, Any]] = field(default_factory=dict)
    """per x.domain: calls, input/cached/output tokens, length_stops, model_seconds"""
    ttft_p50_s: float | None = None
    ttft_p95_s: float | None = None
    model_errors: dict[str, int] = field(default_factory=dict)
    tool_calls: int = 0
    tool_failure_rate: float | None = None
    tool_errors: dict[str, int] = field(default_factory=dict)
    tool_latency_p50_s: float | None = None
    tool_latency_p95_s: float | None = None
    tools: dict[str, dict[str, Any]] = field(default_factory=dict)
    scored_episodes: int = 0
    successes: int = 0
    tokens_per_success: float | None = None
    cost: float | None = None
    cost_per_success: float | None = None
    stop_reasons: dict[str, int] = field(default_factory=dict)
    budget_exhausted_at_step: dict[int, int] = field(default_factory=dict)
    budget_alerts: dict[str, int] = field(default_factory=dict)
    actions: dict[str, int] = field(default_factory=dict)


def build_report(path: str | Path, prices: Prices | None = None, phase: str | None = None) -> ObsReport:
    rep = ObsReport(phase=phase)
    calls = list(read_records(path, "model", phase))
    tools = list(read_records(path, "tool", phase))
    events = list(read_records(path, "event", phase))
    episodes = list(read_records(path, "episode", phase))

    per_step: dict[int, list[tuple[int, int]]] = defaultdict(list)
    for c in calls:
        a = c.attributes
        i, o = int(a.get(R.INPUT_TOKENS) or 0), int(a.get(R.OUTPUT_TOKENS) or 0)
        rep.input_tokens += i
        rep.output_tokens += o
        rep.cached_tokens += int(a.get(R.CACHE_READ_TOKENS) or 0)
        per_step[c.step if c.step is not None else -1].append((i, o))
        if a.get(R.ERROR_TYPE):
            rep.model_errors[a[R.ERROR_TYPE]] = rep.model_errors.get(a[R.ERROR_TYPE], 0) + 1
        length = (a.get(R.FINISH_REASONS) or [None])[0] == "length"
        rep.length_stops += length
        if a.get(R.DOMAIN) is not None:
            d = rep.domains.setdefault(str(a[R.DOMAIN]), {"calls": 0, "input_tokens": 0, "cached_tokens": 0,
                                                         "output_tokens": 0, "length_stops": 0, "model_seconds": 0.0})
            d["calls"] += 1
            d["input_tokens"] += i
            d["cached_tokens"] += int(a.get(R.CACHE_READ_TOKENS) or 0)
            d["output_tokens"] += o
            d["length_stops"] += length
            d["model_seconds"] += float(c.duration_s or 0.0)
    rep.model_calls = len(calls)
    rep.traces = len({c.trace_id for c in calls})
    if calls:
        rep.tokens_per_step = (rep.input_tokens + rep.output_tokens) / len(calls)
        rep.by_step = [{"step": s, "calls": len(v), "input": sum(i for i, _ in v) / len(v),
                        "output": sum(o for _, o in v) / len(v)} for s, v in sorted(per_step.items())]
    if rep.input_tokens:
        rep.cache_hit_rate = rep.cached_tokens / rep.input_tokens
    ttfts = [c.attributes[R.TTFT] for c in calls if c.attributes.get(R.TTFT) is not None]
    rep.ttft_p50_s, rep.ttft_p95_s = percentile(ttfts, 0.5), percentile(ttfts, 0.95)

    rep.tool_calls = len(tools)
    if tools:
        failed = [t for t in tools if t.attributes.get(R.ERROR_TYPE)]
        rep.tool_failure_rate = len(failed) / len(tools)
        rep.tool_errors = dict(Counter(t.attributes[R.ERROR_TYPE] for t in failed))
        latencies = [t.duration_s or 0.0 for t in tools]
        rep.tool_latency_p50_s, rep.tool_latency_p95_s = percentile(latencies, 0.5), percentile(latencies, 0.95)
        by_tool: dict[str, list] = defaultdict(list)
        for t in tools:
            by_tool[str(t.attributes.get(R.TOOL_NAME))].append(t)
        rep.tools = {name: {"calls": len(ts), "failures": sum(bool(t.attributes.get(R.ERROR_TYPE)) for t in ts),
                            "p50_s": percentile([t.duration_s or 0.0 for t in ts], 0.5),
                            "p95_s": percentile([t.duration_s or 0.0 for t in ts], 0.95)}
                     for name, ts in sorted(by_tool.items())}

    rep.scored_episodes = len(episodes)
    rep.successes = sum(bool(e.attributes.get("x.episode.success")) for e in episodes)
    if prices is not None:
        rep.cost = prices.cost(rep.input_tokens, rep.cached_tokens, rep.output_tokens)
    if rep.successes:
        rep.tokens_per_success = (rep.input_tokens + rep.output_tokens) / rep.successes
        if rep.cost is not None:
            rep.cost_per_success = rep.cost / rep.successes

    for e in events:
        if e.name == "episode.stop":
            reason = str(e.attributes.get("x.episode.stop_reason"))
            rep.stop_reasons[reason] = rep.stop_reasons.get(reason, 0) + 1
        elif e.name == "budget.exhausted":
            step = int(e.step or 0)
            rep.budget_exhausted_at_step[step] = rep.budget_exhausted_at_step.get(step, 0) + 1
        elif e.name == "budget.alert":
            key = f"{float(e.attributes.get('x.budget.milestone', 0)):.0%}"
            rep.budget_alerts[key] = rep.budget_alerts.get(key, 0) + 1
        action = e.attributes.get("x.budget.action")
        if action and action != "alert":
            rep.actions[action] = rep.actions.get(action, 0) + 1
    rep.budget_exhausted_at_step = dict(sorted(rep.budget_exhausted_at_step.items()))
    rep.domains = dict(sorted(rep.domains.items()))
    return rep


def _fmt(x: float | None, unit: str = "", scale: float = 1.0, digits: int = 1) -> str:
    return "n/a" if x is None else f"{x * scale:.{digits}f}{unit}"


def format_report(rep: ObsReport) -> str:
    lines = [f"model calls        {rep.model_calls} in {rep.traces} episodes; tokens in {rep.input_tokens} "
             f"(cached {rep.cached_tokens}), out {rep.output_tokens}",
             f"tokens per step    {_fmt(rep.tokens_per_step)}"]
    for row in rep.by_step[:12]:
        lines.append(f"  step {row['step']:>3}: {row['calls']:>5} calls, "
                     f"in {row['input']:.1f}, out {row['output']:.1f}")
    if rep.length_stops:
        lines.append(f"cut at max_tokens  {rep.length_stops} of {rep.model_calls} model calls")
    for name, d in rep.domains.items():
        lines.append(f"  {name:<12} {d['calls']:>5} calls, in {d['input_tokens']} (cached {d['cached_tokens']}), "
                     f"out {d['output_tokens']}, {d['length_stops']} cut, {d['model_seconds']:.2f} s")
    lines += [f"prefix-cache hits  {_fmt(rep.cache_hit_rate, '%', 100)} of input tokens",
              f"time to 1st token  p50 {_fmt(rep.ttft_p50_s, ' ms', 1e3)}, p95 {_fmt(rep.ttft_p95_s, ' ms', 1e3)}"]
    if rep.model_errors:
        lines.append(f"model errors       {', '.join(f'{k} {v}' for k, v in rep.model_errors.items())}")
    errors = ", ".join(f"{k} {v}" for k, v in rep.tool_errors.items())
    lines += [f"tool calls         {rep.tool_calls}; failure rate {_fmt(rep.tool_failure_rate, '%', 100)}"
              + (f" ({errors})" if errors else ""),
              f"tool latency       p50 {_fmt(rep.tool_latency_p50_s, ' ms', 1e3, 3)}, "
              f"p95 {_fmt(rep.tool_latency_p95_s, ' ms', 1e3, 3)}"]
    for name, t in rep.tools.items():
        lines.append(f"  {name:<12} {t['calls']:>5} calls, {t['failures']} failed, "
                     f"p50 {_fmt(t['p50_s'], ' ms', 1e3, 3)}, p95 {_fmt(t['p95_s'], ' ms', 1e3, 3)}")
    lines.append(f"episodes scored    {rep.scored_episodes}; successes {rep.successes}")
    lines.append(f"tokens per success {_fmt(rep.tokens_per_success)}"
                 + (f"; cost {rep.cost:.6f}, per success {_fmt(rep.cost_per_success, '', 1, 6)}"
                    if rep.cost is not None else ""))
    lines.append(f"stop reasons       {', '.join(f'{k} {v}' for k, v in sorted(rep.stop_reasons.items())) or 'n/a'}")
    where = ", ".join(f"step {s}: {n}" for s, n in rep.budget_exhausted_at_step.items())
    lines.append(f"budget ran out     {where or 'never'}")
    if rep.budget_alerts:
        lines.append(f"budget alerts      {', '.join(f'{k} {v}' for k, v in rep.budget_alerts.items())}")
    lines.append(f"degradation        {', '.join(f'{k} {v}' for k, v in sorted(rep.actions.items())) or 'none'}")
    return "\n".join(lines)
