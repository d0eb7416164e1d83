"""The HTML of a report: one self-contained page, CSS inline, no script, no network.

    page("run quickstart", [section("Rewards", figure(svg), table(head, rows))])

Every piece is a function returning HTML text; every value shown passes through
`escape` (task prompts and model outputs are untrusted text). The page loads nothing:
plots are inline SVG (plots.py), the style sheet is below, and there is no JavaScript,
so it opens the same from a CI artifact, a mail attachment or a file:// URL.

Out of scope: what the sections say (run_page.py, eval_page.py).
"""

from __future__ import annotations

import html
import json
from typing import Any, Iterable, Sequence

CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 0; color: #1d2330; background: #fff; }
header { background: #1d2330; color: #fff; padding: 14px 28px; }
header h1 { margin: 0; font-size: 20px; }
header p { margin: 4px 0 0; color: #c5cbd8; font-size: 13px; }
main { max-width: 1100px; margin: 0 auto; padding: 8px 28px 40px; }
section { margin-top: 26px; }
h2 { font-size: 17px; border-bottom: 1px solid #d8dce5; padding-bottom: 4px; }
figure { margin: 10px 0; }
figure svg { width: 100%; height: auto; max-width: 900px; display: block; }
figcaption { font-size: 12px; color: #5b6475; }
table { border-collapse: collapse; font-size: 13px; margin: 8px 0; }
th, td { border: 1px solid #d8dce5; padding: 3px 8px; text-align: left; vertical-align: top; }
th { background: #f1f3f7; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
details { border: 1px solid #d8dce5; border-radius: 4px; margin: 4px 0; padding: 4px 8px; }
summary { cursor: pointer; font-size: 13px; }
pre { background: #f6f7fa; padding: 8px; overflow-x: auto; font-size: 12px; white-space: pre-wrap; }
.ok { color: #137333; } .bad { color: #b3261e; } .muted { color: #5b6475; font-size: 12px; }
"""


def escape(value: Any) -> str:
    return html.escape(str(value), quote=True)


def fmt(value: Any, digits: int = 3) -> str:
    """A cell's text: numbers rounded, None as a dash, the rest as text."""
    if value is None:
        return "–"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return str(int(value)) if value.is_integer() and abs(value) >= 100 else f"{value:.{digits}f}"
    if isinstance(value, list) and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value):
        return "[" + ", ".join(fmt(v, digits) for v in value) + "]"
    if isinstance(value, (dict, list)):
        return json.dumps(value, default=str)
    return str(value)


def page(title: str, subtitle: str, sections: Iterable[str]) -> str:
    return (f'<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">\n<title>{escape(title)}</title>\n'
            f'<link rel="icon" href="data:,">\n<style>{CSS}</style>\n</head>\n<body>\n'
            f'<header><h1>{escape(title)}</h1><p>{escape(subtitle)}</p></header>\n<main>\n'
            + "\n".join(s for s in sections if s) + "\n</main>\n</body>\n</html>\n")


def section(title: str, *parts: str | None, anchor: str | None = None) -> str:
    body = "\n".join(p for p in parts if p)
    if not body:
        return ""
    ident = f' id="{escape(anchor)}"' if anchor else ""
    return f"<section{ident}>\n<h2>{escape(title)}</h2>\n{body}\n</section>"


def figure(svg: str | None, caption: str = "", name: str = "") -> str:
    """An inline SVG plot with its caption; `name` becomes data-plot (tests find plots by it)."""
    if not svg:
        return ""
    cap = f"<figcaption>{escape(caption)}</figcaption>" if caption else ""
    return f'<figure data-plot="{escape(name)}">{svg}{cap}</figure>'


def paragraph(text: str, cls: str = "") -> str:
    return f'<p class="{cls}">{escape(text)}</p>' if cls else f"<p>{escape(text)}</p>"


def table(head: Sequence[str], rows: Iterable[Sequence[Any]], digits: int = 3) -> str:
    rows = list(rows)
    if not rows:
        return ""
    th = "".join(f"<th>{escape(h)}</th>" for h in head)
    body = []
    for row in rows:
        cells = []
        for v in row:
            num = isinstance(v, (int, float)) and not isinstance(v, bool)
            cells.append(f'<td class="num">{escape(fmt(v, digits))}</td>' if num else f"<td>{escape(fmt(v, digits))}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    return f"<table>\n<tr>{th}</tr>\n" + "\n".join(body) + "\n</table>"


def details(summary_html: str, body_html: str) -> str:
    """A collapsed drill-down; `summary_html` is HTML already escaped by the caller."""
    return f"<details><summary>{summary_html}</summary>\n{body_html}\n</details>"


def pre(value: Any, limit: int = 20000) -> str:
    """Preformatted text (JSON for structured values), clipped to `limit` characters."""
    text = value if isinstance(value, str) else json.dumps(value, indent=2, default=str, ensure_ascii=False)
    if len(text) > limit:
        text = text[:limit] + f"\n... ({len(text) - limit} more characters)"
    return f"<pre>{escape(text)}</pre>"
