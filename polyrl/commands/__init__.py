"""The `polyrl` commands, one module each: `add_arguments(parser)` and `main(args) -> exit status`.

Commands sit above every library package: they parse arguments, call the libraries and
print. polyrl/cli.py lists them, and gives every command one error path: a user's mistake
is one line on stderr and exit status 2 (a command returns 2 itself, or raises an exception
whose class sets `exit_code`), an internal error one line naming the file that holds its
traceback and status 1, Ctrl-C one line and status 130. The argparse types below make bad
numbers usage errors.
"""

from __future__ import annotations

import argparse
from typing import Callable


def at_least(minimum: int) -> Callable[[str], int]:
    """An argparse `type` for integers >= minimum: `-n -5` is a usage error, not an empty result."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, got {value}")
        return value

    return parse


def _finite_number(allow_zero: bool) -> Callable[[str], float]:
    bound = ">= 0" if allow_zero else "> 0"

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not (0 <= value if allow_zero else 0 < value) or value == float("inf"):
            raise argparse.ArgumentTypeError(f"must be a finite number {bound}, got {text}")
        return value

    return parse


positive_number = _finite_number(allow_zero=False)
"""An argparse `type` for finite numbers > 0 (seconds, weights)."""
non_negative_number = _finite_number(allow_zero=True)
"""An argparse `type` for finite numbers >= 0 (prices, costs)."""
