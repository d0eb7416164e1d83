"""From a completion to the program the sandbox runs.

A completion is one of:
- text with fenced code blocks: the last ```python (or ```py, or unlabeled) block counts;
  an unclosed final fence (a completion cut at max_tokens) counts up to the end;
- a whole function that defines the entry point: it runs after the prompt when the prompt
  is Python code with a function (a HumanEval signature: its imports and helpers are
  there), else alone;
- a function body (HumanEval convention): the program is prompt + completion.

Nothing here judges or runs code; a completion that is none of the above simply yields a
program that fails to load in the sandbox.

Not covered: several files, other languages, completions that mix prose and code without
fences.
"""

from __future__ import annotations

import ast
import re
import textwrap
from dataclasses import dataclass

_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+.-]*)[^\n]*\n(.*?)(?:```|\Z)", re.S)
_PYTHON_LABELS = {"", "python", "py", "python3", "py3"}


@dataclass(frozen=True)
class Program:
    code: str
    form: str
    """"function" (the completion defines the entry point), "body" (prompt + completion)."""
    fenced: bool


def last_python_block(text: str) -> str | None:
    blocks = [body for label, body in _FENCE.findall(text) if label.lower() in _PYTHON_LABELS]
    return blocks[-1] if blocks else None


def _parses(code: str) -> ast.Module | None:
    try:
        return ast.parse(code)
    except (SyntaxError, ValueError):
        return None


def _defines(tree: ast.Module | None, name: str) -> bool:
    definitions = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
    return tree is not None and any(isinstance(node, definitions) and node.name == name for node in tree.body)


def _is_code(prompt: str) -> bool:
    """A Python prompt (signature + docstring, helpers), not a prose problem statement."""
    tree = _parses(prompt)
    return tree is not None and any(isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) for node in tree.body)


def build_program(prompt: str, completion: str, entry_point: str) -> Program:
    block = last_python_block(completion)
    code = completion if block is None else block
    for candidate in (code, textwrap.dedent(code)):
        if _defines(_parses(candidate), entry_point):
            prefix = prompt.rstrip() + "\n\n\n" if _is_code(prompt) else ""
            return Program(prefix + candidate, "function", block is not None)
    return Program(prompt + code, "body", block is not None)
