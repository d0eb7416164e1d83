"""Plain data: the only values that cross the sandbox boundary, and the one check of them.

Plain data is exact builtin scalars (int, float, complex, bool, str, bytes, None) and
list, tuple, set, frozenset and dict of plain data, no subclasses: an int subclass with an
always-true `__eq__` must never reach a comparison. Values cross as their `repr`, which
is why a reply is checked before it is written.

Both sides use this one file. The host imports it (code_harness.to_literal); the sandbox
programs (harness_main.py, judge_main.py) cannot import polyrl, so each is built with this
file's text right after its own docstring (code_harness.sandbox_program). Hence: standard
library only, no imports, Python 3.9+.

Not covered: reading literal text back. The host parses it with code_harness.parse_literal
(an `ast` walk, never eval); inside the sandbox the programs eval it with LITERAL_NAMES.
"""

SCALARS = (int, float, complex, bool, str, bytes, type(None))
LITERAL_NAMES = {"__builtins__": {}, "inf": float("inf"), "nan": float("nan"), "set": set, "frozenset": frozenset}
"""The names the repr of plain data may use besides literals (`inf`, `nan`, `set()`,
`frozenset({...})`): the globals a sandbox program evaluates literal text with."""


def check_plain(value, depth=0):
    """TypeError unless value is plain data, nested at most 100 deep."""
    kind = type(value)
    if kind in SCALARS:
        return
    if depth > 100:
        raise TypeError("nested more than 100 deep")
    if kind is list or kind is tuple or kind is set or kind is frozenset:
        for item in value:
            check_plain(item, depth + 1)
    elif kind is dict:
        for key, item in value.items():
            check_plain(key, depth + 1)
            check_plain(item, depth + 1)
    else:
        raise TypeError(kind.__module__ + "." + kind.__qualname__ + " is not plain data")


def to_literal(value):
    """Literal text of plain data; TypeError for anything else (subclasses included)."""
    check_plain(value)
    return repr(value)
