"""Rewrites of a code task's reference, by `ast`: equivalent ones and mutants.

The reference region is the part of the program (`build_program(prompt, reference)`)
that the reference wrote: for a HumanEval body, the entry-point function it completes;
for a whole-function reference, everything it defines. Every rewrite is that region
unparsed, as a fenced python block (so it also exercises the completion forms of
code_extract.py: the prompt's imports and helpers still come first).

Equivalent rewrites (they must score what the reference scores):
- `reformatted`: the region as `ast.unparse` prints it (comments dropped, quotes and
  spacing normalised);
- `renamed_locals`: every local variable of its functions renamed (`_local_0`, ...);
  parameters, globals, nonlocals and names nested functions take as parameters keep theirs.

Mutants (a sound test suite fails them; one site changed each, in the region only):
- `off_by_one`: an integer constant c becomes c + 1, or a boundary moves (< to <=, >= to >);
- `flipped_comparison`: ==/!=, </>, <=/>=, in/not in, is/is not swapped;
- `dropped_branch`: an `if` replaced by its `else` (or by nothing), `a if c else b` by `b`.
A mutant can be equivalent to the reference (a constant that does not matter), so a
surviving mutant is a warning, never a failure.

Out of scope: mutating the prompt's helpers, semantic equivalence proofs, and mutation
operators beyond these (arithmetic operator swaps, removed statements).
"""

from __future__ import annotations

import ast
import builtins
import copy
from dataclasses import dataclass
from typing import Callable, Iterator

from polyrl.rewards.code_extract import build_program

_BOUNDARY = {ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt}
_FLIP = {ast.Eq: ast.NotEq, ast.NotEq: ast.Eq, ast.Lt: ast.Gt, ast.Gt: ast.Lt, ast.LtE: ast.GtE, ast.GtE: ast.LtE,
         ast.In: ast.NotIn, ast.NotIn: ast.In, ast.Is: ast.IsNot, ast.IsNot: ast.Is}
MUTANT_KINDS = ("off_by_one", "flipped_comparison", "dropped_branch")


@dataclass(frozen=True)
class Rewrite:
    kind: str
    """"reformatted", "renamed_locals", or one of MUTANT_KINDS."""
    description: str
    completion: str


@dataclass
class _Region:
    tree: ast.Module
    nodes: list[ast.stmt]
    """Top-level statements the reference wrote (or completes)."""
    start: int
    """First program line that is the reference's."""


def _region(prompt: str, reference: str, entry: str) -> _Region | None:
    program = build_program(prompt, reference, entry)
    try:
        tree = ast.parse(program.code)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    if program.form == "body":
        start = prompt.count("\n") + 1
    elif program.code.startswith(prompt.rstrip() + "\n\n\n"):
        start = prompt.rstrip().count("\n") + 4
    else:
        start = 1
    nodes = [n for n in tree.body if (n.end_lineno or n.lineno) >= start]
    return _Region(tree, nodes, start) if nodes else None


def _fenced(nodes: list[ast.stmt]) -> str:
    return "```python\n" + ast.unparse(ast.fix_missing_locations(ast.Module(nodes, []))) + "\n```\n"


def equivalent_rewrites(prompt: str, reference: str, entry: str) -> list[Rewrite]:
    region = _region(prompt, reference, entry)
    if region is None:
        return []
    out = [Rewrite("reformatted", "the reference reformatted by ast.unparse", _fenced(region.nodes))]
    renamed = [_rename_locals(copy.deepcopy(n)) for n in region.nodes]
    count = sum(k for _, k in renamed)
    if count:
        out.append(Rewrite("renamed_locals", f"the reference with {count} local variable(s) renamed",
                           _fenced([n for n, _ in renamed])))
    return out


def _rename_locals(node: ast.stmt) -> tuple[ast.stmt, int]:
    """Rename the locals of every function in `node`; returns it and how many were renamed."""
    total = 0
    for fn in [n for n in ast.walk(node) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]:
        keep = {a.arg for n in ast.walk(fn) if isinstance(n, ast.arguments)
                for a in [*n.posonlyargs, *n.args, *n.kwonlyargs, *filter(None, [n.vararg, n.kwarg])]}
        keep |= {name for n in ast.walk(fn) if isinstance(n, (ast.Global, ast.Nonlocal)) for name in n.names}
        keep |= {n.name for n in ast.walk(fn) if isinstance(n, ast.ExceptHandler) and n.name}
        keep |= set(dir(builtins))
        stored = sorted({n.id for n in ast.walk(fn) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)} - keep)
        taken = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
        mapping: dict[str, str] = {}
        for name in stored:
            new, k = f"_local_{len(mapping)}", len(mapping)
            while new in taken:
                k += 1
                new = f"_local_{k}"
            mapping[name] = new
            taken.add(new)
        for n in ast.walk(fn):
            if isinstance(n, ast.Name) and n.id in mapping:
                n.id = mapping[n.id]
        total += len(mapping)
    return node, total


# ---------------------------------------------------------------------------- mutants


def _sites(region: _Region, kind: str) -> Iterator[tuple[ast.AST, str]]:
    """(node, description) of every place `kind` can mutate, in source order."""
    for top in region.nodes:
        for node in ast.walk(top):
            if getattr(node, "lineno", 0) < region.start:
                continue
            line = node.lineno - region.start + 1  # type: ignore[attr-defined]
            if kind == "off_by_one":
                if isinstance(node, ast.Constant) and type(node.value) is int:
                    yield node, f"reference line {line}: {node.value} -> {node.value + 1}"
                elif isinstance(node, ast.Compare) and any(type(op) in _BOUNDARY for op in node.ops):
                    yield node, f"reference line {line}: boundary of `{ast.unparse(node)[:50]}` moved"
            elif kind == "flipped_comparison":
                if isinstance(node, ast.Compare) and any(type(op) in _FLIP for op in node.ops):
                    yield node, f"reference line {line}: `{ast.unparse(node)[:50]}` flipped"
            elif isinstance(node, (ast.If, ast.IfExp)):
                yield node, f"reference line {line}: branch `if {ast.unparse(node.test)[:50]}` dropped"


def _mutate(node: ast.AST, kind: str) -> None:
    """Change `node` in place (a copy of the region)."""
    if kind == "off_by_one" and isinstance(node, ast.Constant):
        node.value += 1
    elif kind in ("off_by_one", "flipped_comparison") and isinstance(node, ast.Compare):
        table = _BOUNDARY if kind == "off_by_one" else _FLIP
        i = next(i for i, op in enumerate(node.ops) if type(op) in table)
        node.ops[i] = table[type(node.ops[i])]()


class _DropBranch(ast.NodeTransformer):
    def __init__(self, target: ast.AST):
        self.target = target

    def visit_If(self, node: ast.If) -> list[ast.stmt] | ast.stmt:
        if node is self.target:
            return node.orelse or [ast.Pass()]
        return self.generic_visit(node)

    def visit_IfExp(self, node: ast.IfExp) -> ast.expr:
        if node is self.target:
            return node.orelse
        return self.generic_visit(node)  # type: ignore[return-value]


def mutants(prompt: str, reference: str, entry: str, per_kind: int = 2) -> list[Rewrite]:
    """Up to `per_kind` mutants of each kind, at sites spread over the reference."""
    region = _region(prompt, reference, entry)
    if region is None:
        return []
    original = ast.unparse(ast.Module(region.nodes, []))
    out: list[Rewrite] = []
    seen = {original}
    for kind in MUTANT_KINDS:
        sites = list(_sites(region, kind))
        step = max(1, len(sites) // per_kind) if per_kind else len(sites) + 1
        for index in range(0, len(sites), step)[:per_kind]:
            nodes = _mutated_copy(region, kind, index)
            source = ast.unparse(ast.fix_missing_locations(ast.Module(nodes, [])))
            if source not in seen:
                seen.add(source)
                out.append(Rewrite(kind, sites[index][1], f"```python\n{source}\n```\n"))
    return out


def _mutated_copy(region: _Region, kind: str, index: int) -> list[ast.stmt]:
    """A deep copy of the region's nodes with site `index` of `kind` mutated."""
    nodes = copy.deepcopy(region.nodes)
    copied = _Region(region.tree, nodes, region.start)
    target = list(_sites(copied, kind))[index][0]
    if kind == "dropped_branch":
        transform: Callable[[ast.stmt], ast.stmt | list[ast.stmt]] = _DropBranch(target).visit
        out: list[ast.stmt] = []
        for node in nodes:
            result = transform(node)
            out.extend(result if isinstance(result, list) else [result])
        return out
    _mutate(target, kind)
    return nodes
