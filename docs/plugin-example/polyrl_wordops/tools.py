"""The tools of the `wordtools` domain: string operations an agent calls instead of doing
them in its head. Each episode gets a fresh ToolBox (these tools hold no state, but a
domain whose tools change a world must not share one between episodes)."""

from __future__ import annotations

from polyrl.agent.tools import Tool, ToolBox

_WORD = {"word": {"type": "string", "description": "a lowercase word"}}


def toolbox() -> ToolBox:
    return ToolBox([
        Tool("reverse", "The word written backwards.",
             {"type": "object", "properties": _WORD, "required": ["word"]}, lambda word: word[::-1]),
        Tool("sort_letters", "The letters of the word in alphabetical order (descending=true: reverse order).",
             {"type": "object", "properties": {**_WORD, "descending": {"type": "boolean"}}, "required": ["word"]},
             lambda word, descending=False: "".join(sorted(word, reverse=bool(descending)))),
        Tool("count_letter", "How many times a letter occurs in the word.",
             {"type": "object", "properties": {**_WORD, "letter": {"type": "string"}}, "required": ["word", "letter"]},
             lambda word, letter: word.count(letter) if len(letter) == 1 else "Error: letter must be one character"),
    ])
