"""Plots for the report, drawn with matplotlib and returned as inline SVG text.

    svg = figure_svg(fig, "reward")   # "<svg ...>...</svg>", ready to paste into HTML

Figures are built on `matplotlib.figure.Figure` directly (no pyplot, no global state, no
GUI backend), so drawing is safe in a training process and in threads. Text is drawn as
paths (matplotlib's default `svg.fonttype`), so the page needs no fonts; each figure gets
its own `svg.hashsalt`, so the ids inside several inline SVGs of one page never collide.

Every function takes plain lists (None where a value is missing: a gap in the line) and
returns SVG text, or None when there is nothing to draw.

Out of scope: reading run or evaluation directories (run_data.py, eval_data.py) and the
HTML around the figures (html.py).
"""

from __future__ import annotations

import io
import re
from typing import Sequence

import matplotlib
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

Series = Sequence[float | None]

WIDTH, HEIGHT = 7.5, 3.2
"""Inches of one plot; the page scales SVGs to its column."""


def new_figure(rows: int = 1, height: float = HEIGHT) -> tuple[Figure, list]:
    fig = Figure(figsize=(WIDTH, height * rows), layout="constrained")
    axes = fig.subplots(rows, 1, squeeze=False)[:, 0].tolist()
    for ax in axes:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps are whole numbers
        ax.grid(True, alpha=0.3)
        ax.spines[["top", "right"]].set_visible(False)
    return fig, axes


def figure_svg(fig: Figure, salt: str) -> str:
    """The figure as an <svg> element (the XML prolog and DOCTYPE removed)."""
    buf = io.StringIO()
    with matplotlib.rc_context({"svg.hashsalt": f"polyrl-{salt}"}):
        fig.savefig(buf, format="svg")
    text = buf.getvalue()
    start = text.find("<svg")
    assert start >= 0, "matplotlib wrote no <svg> element"
    # a fixed size in pt would overflow narrow windows; the CSS gives the width
    return re.sub(r'<svg([^>]*?) width="[^"]*" height="[^"]*"', r'<svg\1', text[start:], count=1)


def _has_values(*series: Series) -> bool:
    return any(v is not None for s in series for v in s)


def _plot(ax, xs: Sequence[float], ys: Series, **kw) -> None:
    """A line with gaps where ys is None (matplotlib leaves NaN out)."""
    ax.plot(list(xs), [float("nan") if y is None else y for y in ys], **kw)


def lines(title: str, xs: Sequence[float], series: dict[str, Series], ylabel: str, salt: str,
          points: dict[str, list[tuple[float, float]]] | None = None, xlabel: str = "step") -> str | None:
    """One line per series over xs; `points` adds, per name, a dashed line with markers in the
    same colour (held-out accuracy at the steps it was measured)."""
    points = points or {}
    if not _has_values(*series.values()) and not any(points.values()):
        return None
    fig, (ax,) = new_figure()
    colours = {}
    for i, (name, ys) in enumerate(series.items()):
        colours[name] = f"C{i % 10}"
        if _has_values(ys):
            _plot(ax, xs, ys, label=name, color=colours[name], linewidth=1.6)
    for i, (name, pts) in enumerate(points.items()):
        if pts:
            colour = colours.get(name, f"C{(len(series) + i) % 10}")
            ax.plot([p[0] for p in pts], [p[1] for p in pts], "o--", color=colour, markersize=5, linewidth=1.0,
                    label=f"{name} (held-out)")
    ax.set(title=title, xlabel=xlabel, ylabel=ylabel)
    ax.legend(fontsize=8, ncols=4, loc="upper center", bbox_to_anchor=(0.5, -0.22))
    return figure_svg(fig, salt)


def stacked_shares(title: str, xs: Sequence[float], shares: dict[str, Series], salt: str,
                   marks: Sequence[float] = ()) -> str | None:
    """Domain shares per step as a stacked area (each step's shares sum to about 1); `marks`
    draws a vertical line where the shares were moved (a curriculum update)."""
    if not _has_values(*shares.values()):
        return None
    fig, (ax,) = new_figure()
    ax.stackplot(list(xs), *[[0.0 if v is None else v for v in s] for s in shares.values()],
                 labels=list(shares), alpha=0.85)
    for x in marks:
        ax.axvline(x, color="black", linewidth=0.8, linestyle=":")
    ax.set(title=title, xlabel="step", ylabel="share of the batch", ylim=(0, 1.02))
    ax.legend(fontsize=8, ncols=len(shares), loc="upper center", bbox_to_anchor=(0.5, -0.2))
    return figure_svg(fig, salt)


def kl(title: str, xs: Sequence[float], kl_by_domain: dict[str, Series], coef_by_domain: dict[str, Series],
       salt: str) -> str | None:
    """Measured per-token KL (top) and the KL coefficient in force (bottom), per domain."""
    if not _has_values(*kl_by_domain.values(), *coef_by_domain.values()):
        return None
    fig, (top, bottom) = new_figure(2, height=2.6)
    for i, (d, ys) in enumerate(kl_by_domain.items()):
        if _has_values(ys):
            _plot(top, xs, ys, label=d, color=f"C{i % 10}")
    for i, (d, ys) in enumerate(coef_by_domain.items()):
        if _has_values(ys):
            _plot(bottom, xs, ys, label=d, color=f"C{i % 10}", drawstyle="steps-post")
    top.set(title=title, ylabel="KL to the reference")
    bottom.set(xlabel="step", ylabel="KL coefficient")
    for ax in (top, bottom):
        if ax.lines:
            ax.legend(fontsize=8, ncols=2)
    return figure_svg(fig, salt)


def step_time(xs: Sequence[float], parts: dict[str, Series], throughput: Series, salt: str) -> str | None:
    """Seconds per step split into its parts (stacked bars, top) and rollout tokens/s (bottom)."""
    if not _has_values(*parts.values(), throughput):
        return None
    fig, (top, bottom) = new_figure(2, height=2.6)
    base = [0.0] * len(xs)
    for i, (name, ys) in enumerate(parts.items()):
        heights = [0.0 if v is None else v for v in ys]
        top.bar(list(xs), heights, bottom=base, label=name, color=f"C{i % 10}", width=0.8)
        base = [b + h for b, h in zip(base, heights)]
    top.set(title="step time", ylabel="seconds")
    top.legend(fontsize=8, ncols=len(parts))
    if _has_values(throughput):
        _plot(bottom, xs, throughput, color="C3", marker=".")
    bottom.set(title="rollout throughput", xlabel="step", ylabel="generated tokens / s")
    return figure_svg(fig, salt)


def budget_use(xs: Sequence[float], used: dict[str, Series], salt: str) -> str | None:
    """Per step, the fraction of each limit spent (1.0: the run stops there)."""
    if not _has_values(*used.values()):
        return None
    fig, (ax,) = new_figure()
    for i, (name, ys) in enumerate(used.items()):
        _plot(ax, xs, ys, label=name, color=f"C{i % 10}", linewidth=1.6)
    ax.axhline(1.0, color="black", linewidth=0.8, linestyle="--")
    ax.set(title="budget use", xlabel="step", ylabel="fraction of the limit", ylim=(0, 1.1))
    ax.legend(fontsize=8)
    return figure_svg(fig, salt)


def grouped_bars(title: str, groups: Sequence[str], stacks: dict[str, dict[str, Sequence[float]]], ylabel: str,
                 salt: str) -> str | None:
    """Bars per group (e.g. a tag), one bar per series (e.g. a model), each bar stacked from its
    parts (e.g. success, engineering failure, capability failure): stacks[series][part][i].
    With one part, bars are coloured by series; with several, by part, and hatched by series."""
    if not groups or not stacks:
        return None
    from matplotlib.patches import Patch

    fig, (ax,) = new_figure(height=3.6)
    n = len(stacks)
    width = 0.8 / n
    parts = list(next(iter(stacks.values())))
    hatches = ["", "//", "..", "xx", "\\\\", "--"]
    handles = []
    for s, (series, by_part) in enumerate(stacks.items()):
        xs = [g + (s - (n - 1) / 2) * width for g in range(len(groups))]
        base = [0.0] * len(groups)
        hatch = "" if len(parts) == 1 else hatches[s % len(hatches)]
        for p, part in enumerate(parts):
            heights = list(by_part[part])
            colour = f"C{s % 10}" if len(parts) == 1 else f"C{p % 10}"
            ax.bar(xs, heights, width=width * 0.95, bottom=base, color=colour, hatch=hatch, edgecolor="white")
            base = [b + h for b, h in zip(base, heights)]
        if len(parts) == 1:
            handles.append(Patch(facecolor=f"C{s % 10}", label=series))
        else:
            handles.append(Patch(facecolor="#9aa0ab", hatch=hatch, edgecolor="white", label=series))
    if len(parts) > 1:
        handles = [Patch(facecolor=f"C{p % 10}", label=part) for p, part in enumerate(parts)] + handles
    ax.set_xticks(range(len(groups)), list(groups))
    ax.set(title=title, ylabel=ylabel)
    ax.legend(handles=handles, fontsize=8, ncols=min(len(handles), 4), loc="upper center",
              bbox_to_anchor=(0.5, -0.12))
    return figure_svg(fig, salt)
