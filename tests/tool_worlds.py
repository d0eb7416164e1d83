"""Tool factories for the tool-host tests: importable ("tests.tool_worlds:name"), standard library only.

`misbehaving(task)` builds tools that hang, flood, exit, allocate, spawn, touch files and
keep state; `broken(task)` fails while building.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

from polyrl.agent.tools import Tool, ToolBox
from polyrl.types import Task

SLEEPER_SECONDS = "3133.7"
"""The argument of the processes `spawn` starts: the tests look for it in /proc."""
BUILT = []
"""Module-level state: one entry per ToolBox this process built."""


def _schema(**props: str) -> dict:
    return {"type": "object", "properties": {k: {"type": v} for k, v in props.items()}, "required": list(props),
            "additionalProperties": False}


def misbehaving(task: Task) -> ToolBox:
    state = {"count": 0}
    BUILT.append(task.id)

    def count() -> str:
        state["count"] += 1
        return f"{state['count']} of toolbox {len(BUILT)}"

    def hang() -> str:
        while True:
            time.sleep(60)

    def spin() -> str:
        while True:
            pass

    def flood(size: int) -> str:
        return "H" * 16 + "x" * (size - 16)

    def shout(size: int) -> str:
        chunk = "y" * 4096
        for _ in range(size // len(chunk)):
            sys.stdout.write(chunk)
        sys.stdout.flush()
        return "shouted"

    def whisper() -> str:
        print("a little noise")
        return "quiet"

    def quit() -> str:
        sys.exit(3)

    def hog(mb: int) -> str:
        return str(len(bytearray(mb << 20)))

    def spawn(detach: bool) -> str:
        proc = subprocess.Popen(["sleep", SLEEPER_SECONDS], start_new_session=detach)
        return str(proc.pid)

    def read(path: str) -> str:
        with open(path) as f:
            return f.read()

    def write(path: str) -> str:
        with open(path, "w") as f:
            f.write("escaped")
        return "written"

    def data() -> str:
        return f"{task.data['secret']} answer={task.answer}"

    none = _schema()
    return ToolBox([
        Tool("count", "Counts its calls.", none, count),
        Tool("hang", "Never returns.", none, hang),
        Tool("spin", "Busy forever.", none, spin),
        Tool("flood", "Returns size bytes.", _schema(size="integer"), flood),
        Tool("shout", "Prints size bytes.", _schema(size="integer"), shout),
        Tool("whisper", "Prints a line.", none, whisper),
        Tool("quit", "Calls sys.exit.", none, quit),
        Tool("hog", "Allocates mb MiB.", _schema(mb="integer"), hog),
        Tool("spawn", "Starts a long sleep in the background (in a session of its own: detach).",
             _schema(detach="boolean"), spawn),
        Tool("read", "Reads a file.", _schema(path="string"), read),
        Tool("write", "Writes a file.", _schema(path="string"), write),
        Tool("data", "Shows the task data it was built from.", none, data),
    ])


def broken(task: Task) -> ToolBox:
    raise RuntimeError("this world cannot be built")


def exploit(task: Task) -> ToolBox:
    """One tool, `solve`, that runs the task's `code` (an exploit of tests/test_sandbox_exploits.py)
    and calls its add(1, 2): the exploit suite applied to a tool instead of a graded program."""

    def solve() -> str:
        namespace: dict = {"__name__": "exploit"}
        exec(task.data["code"], namespace)  # noqa: S102 -- running hostile code is the point
        return repr(namespace["add"](1, 2))

    return ToolBox([Tool("solve", "run the solution", _schema(), solve)])
