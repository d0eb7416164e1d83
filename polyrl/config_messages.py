"""Run-file errors in words: a pydantic error as a message that names the field, what it
got and what is allowed (with a "did you mean"), and the YAML line it comes from.

    loc, message, kind = explain(err, RunConfig)   # err: one of ValidationError.errors()
    line = line_for(yaml_root_node, loc, kind)
    duplicate_keys(yaml_root_node)                 # [(loc, line, first line), ...]

Used by polyrl/config.py's loader; pure functions over the schema and the YAML node tree.
"""

from __future__ import annotations

import difflib
import types
from typing import Any, Literal, Union, get_args, get_origin

import annotated_types as at
import yaml
from pydantic import BaseModel


def explain(err: dict, schema: type[BaseModel]) -> tuple[tuple, str, str]:
    """A pydantic error of validating `schema` as (loc, message, kind); kind picks the line:
    "value", "key", "parent"."""
    loc, kind, value = tuple(err["loc"]), err["type"], err.get("input")
    found = _field_at(loc, schema)

    if kind == "extra_forbidden":
        parent = _field_at(loc[:-1], schema)
        allowed = _keys(parent[1]) if parent else []
        key = str(loc[-1])
        return loc, f"unknown key {key!r}; allowed: {', '.join(allowed)}{did_you_mean(key, allowed)}", "key"
    if kind == "invalid_key":
        return loc[:-1], f"keys must be strings; got {show(loc[-1])}", "key"
    if kind == "missing":
        field = found[0] if found else None
        what = f" ({field.description})" if field is not None and field.description else ""
        return loc, f"missing required key{what}", "parent"
    if kind == "value_error" and isinstance(value, dict):  # a model validator: fields that cannot go together
        return loc, str(err["msg"]).removeprefix("Value error, "), "value"
    if found is None:
        return loc, f"got {show(value)}; {err['msg']}", "value"
    field, annotation = found
    if kind == "literal_error":
        choices = [str(c) for c in get_args(_strip_none(annotation))]
        return loc, f"got {show(value)}; must be one of {', '.join(choices)}{did_you_mean(str(value), choices)}", "value"
    if kind in ("greater_than", "greater_than_equal", "less_than", "less_than_equal"):
        return loc, f"got {show(value)}; must be {_bounds(field.metadata)}", "value"
    if kind == "finite_number":
        bounds = _bounds(field.metadata)
        return loc, f"got {show(value)}; must be a finite number{' ' + bounds if bounds else ''}", "value"
    if kind == "too_short":
        return loc, f"got {show(value)}; must have at least {err['ctx']['min_length']} item", "value"
    metadata = field.metadata if field is not None and not isinstance(loc[-1], int) else []
    return loc, f"got {show(value)}; must be {_expected(annotation, metadata)}", "value"


def _field_at(loc: tuple, schema: type[BaseModel]) -> tuple[Any, Any] | None:
    """(FieldInfo, annotation) of what a loc points at; after a list index the FieldInfo is
    the list's and the annotation the element type. None if the loc leaves the schema."""
    field, annotation = None, schema
    for part in loc:
        inner = _strip_none(annotation)
        if isinstance(part, int):
            if get_origin(inner) is not list:
                return None
            annotation = get_args(inner)[0]
        elif isinstance(inner, type) and issubclass(inner, BaseModel) and part in inner.model_fields:
            field = inner.model_fields[part]
            annotation = field.annotation
        else:
            return None
    return field, annotation


def _keys(annotation: Any) -> list[str]:
    inner = _strip_none(annotation)
    return list(inner.model_fields) if isinstance(inner, type) and issubclass(inner, BaseModel) else []


def _strip_none(annotation: Any) -> Any:
    if get_origin(annotation) in (Union, types.UnionType):
        args = [a for a in get_args(annotation) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return annotation


def _bounds(metadata: list) -> str:
    parts = []
    for m in metadata:
        for cls, attr, op in ((at.Gt, "gt", ">"), (at.Ge, "ge", ">="), (at.Lt, "lt", "<"), (at.Le, "le", "<=")):
            if isinstance(m, cls):
                parts.append(f"{op} {_number_text(getattr(m, attr))}")
    return " and ".join(parts)


def _number_text(value: float) -> str:
    """A bound as a reader writes it: 65536, 2**20, 10**8, 1e+06, 0.5."""
    if isinstance(value, int) and value >= 2**17:
        if value & (value - 1) == 0:
            return f"2**{value.bit_length() - 1}"
        digits = str(value)
        if digits.strip("0") == "1":
            return f"10**{len(digits) - 1}"
    return str(value) if isinstance(value, int) else format(value, "g")


def _expected(annotation: Any, metadata: list) -> str:
    """What a field accepts, in words: "an integer > 0", "one of mask, penalty, none"."""
    inner = _strip_none(annotation)
    nullable = inner is not annotation
    if get_origin(inner) is Literal:
        text = "one of " + ", ".join(str(c) for c in get_args(inner))
    elif get_origin(inner) is list:
        item = get_args(inner)[0]
        text = f"a list of mappings (keys: {', '.join(_keys(item))})" if _keys(item) else "a list"
    elif _keys(inner):
        text = f"a mapping (keys: {', '.join(_keys(inner))})"
    else:
        text = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}.get(inner, str(inner))
        bounds = _bounds(metadata)
        text += f" {bounds}" if bounds else ""
    return text + (", or null" if nullable else "")


# ---------------------------------------------------------------------------- YAML node tree -> line numbers


def line_for(root: yaml.Node, loc: tuple, kind: str) -> int:
    """1-based line for a loc: the value's line, the key's line ("key"), or the line of the
    deepest mapping that exists ("parent", for missing keys and defaults)."""
    node, key_node = root, None
    for i, part in enumerate(loc):
        child = _child(node, part)
        if child is None:
            if kind == "parent" and i == len(loc) - 1:
                return node.start_mark.line + 1
            return (key_node or node).start_mark.line + 1
        key_node, node = child
    if kind == "key" and key_node is not None:
        return key_node.start_mark.line + 1
    return node.start_mark.line + 1


def _child(node: yaml.Node, part: Any) -> tuple[yaml.Node | None, yaml.Node] | None:
    if isinstance(node, yaml.MappingNode):
        match = None
        for k, v in node.value:  # the last duplicate wins, as in the loaded data
            if isinstance(k, yaml.ScalarNode) and k.value == str(part):
                match = (k, v)
        return match
    if isinstance(node, yaml.SequenceNode) and isinstance(part, int) and 0 <= part < len(node.value):
        return None, node.value[part]
    return None


def duplicate_keys(node: yaml.Node, loc: tuple = ()) -> list[tuple[tuple, int, int]]:
    """(loc, line, first line) for every key given twice in one mapping."""
    out: list[tuple[tuple, int, int]] = []
    if isinstance(node, yaml.MappingNode):
        seen: dict[str, int] = {}
        for k, v in node.value:
            if isinstance(k, yaml.ScalarNode):
                if k.value in seen:
                    out.append((loc + (k.value,), k.start_mark.line + 1, seen[k.value]))
                else:
                    seen[k.value] = k.start_mark.line + 1
                out += duplicate_keys(v, loc + (k.value,))
    elif isinstance(node, yaml.SequenceNode):
        for i, v in enumerate(node.value):
            out += duplicate_keys(v, loc + (i,))
    return out


# ---------------------------------------------------------------------------- small helpers


def dotted(loc: tuple) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def show(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict):
        return "a mapping" if value else "an empty mapping"
    if isinstance(value, list):
        return "a list" if value else "an empty list"
    if isinstance(value, int) and value.bit_length() > 200:  # repr of a huge int is slow or refused
        return f"an integer of about {int(value.bit_length() * 0.30103) + 1} digits"
    if isinstance(value, float) and value != value:
        return "nan"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def did_you_mean(word: str, choices: list[str]) -> str:
    close = difflib.get_close_matches(word, choices, n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""


# ---------------------------------------------------------------------------- YAML a loader can hold

MAX_RUN_FILE_BYTES = 1 << 20
"""A run file is a page of settings; a larger one is refused before it is parsed."""
MAX_NODES = 100_000
"""Values of the document with every alias expanded: an alias bomb (billion laughs) expands a few
lines into billions, which the schema check would then walk."""
MAX_DEPTH = 64
"""Nesting of mappings and lists; the schema is four levels deep."""
MAX_INT_CHARS = 64
"""Characters of an integer literal: int() of thousands of digits is slow, or refused by Python."""


class Refused(yaml.MarkedYAMLError):
    """YAML that is well formed but that polyrl will not load (its message says why)."""


class SafeRunLoader(yaml.SafeLoader):
    """yaml.SafeLoader that refuses integers of more than MAX_INT_CHARS characters."""


def _construct_int(loader: SafeRunLoader, node: yaml.ScalarNode) -> int:
    if len(node.value) > MAX_INT_CHARS:
        raise Refused(None, None, f"an integer of {len(node.value)} characters; no setting needs more than "
                      f"{MAX_INT_CHARS}", node.start_mark)
    return yaml.SafeLoader.construct_yaml_int(loader, node)


SafeRunLoader.add_constructor("tag:yaml.org,2002:int", _construct_int)


def refuse_expansion(root: yaml.Node) -> None:
    """Raise Refused at the first node where the composed document stops being one a loader and a
    validator can walk: a recursive alias, nesting deeper than MAX_DEPTH, or more than MAX_NODES
    values with aliases expanded. Linear in the composed nodes (expanded sizes are memoised)."""
    sizes: dict[int, int] = {}
    on_path: set[int] = set()

    def size(node: yaml.Node, depth: int) -> int:
        key = id(node)
        if key in sizes:
            return sizes[key]
        if key in on_path:
            raise Refused(None, None, "a recursive alias (an anchor used inside itself)", node.start_mark)
        if depth > MAX_DEPTH:
            raise Refused(None, None, f"nested more than {MAX_DEPTH} levels deep", node.start_mark)
        on_path.add(key)
        total = 1
        if isinstance(node, yaml.SequenceNode):
            total += sum(size(child, depth + 1) for child in node.value)
        elif isinstance(node, yaml.MappingNode):
            total += sum(size(k, depth + 1) + size(v, depth + 1) for k, v in node.value)
        on_path.discard(key)
        if total > MAX_NODES:
            raise Refused(None, None, f"more than {MAX_NODES:,} values once its aliases are expanded "
                          "(an alias bomb?)", node.start_mark)
        sizes[key] = total
        return total

    size(root, 0)
