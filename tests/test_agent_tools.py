"""Tool calls: the text format's parser, schema checks, and failures as observations."""

import pytest

from polyrl.agent.call_format import format_call, parse_answer, parse_calls, system_prompt
from polyrl.agent.tools import Tool, ToolCall, check_arguments
from tests.agent_fakes import toy_tools


def test_format_round_trips():
    text = "let me add " + format_call("add", {"a": 2, "b": 3})
    [c] = parse_calls(text, "call_7")
    assert (c.id, c.name, c.arguments, c.error) == ("call_7_0", "add", {"a": 2, "b": 3}, None)


@pytest.mark.parametrize("text, name, arguments", [
    ('<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>', "add", {"a": 1, "b": 2}),
    ('<tool_call>\n{"name":"add","arguments":{"a":1,"b":2}}\n</tool_call>', "add", {"a": 1, "b": 2}),
    ("<tool_call>{'name': 'add', 'arguments': {'a': 1, 'b': 2}}</tool_call>", "add", {"a": 1, "b": 2}),
    ('<tool_call>{"name":"add","parameters":{"a":1,"b":2}}</tool_call>', "add", {"a": 1, "b": 2}),
    ('<tool_call>{"name":"add","arguments":"{\\"a\\": 1, \\"b\\": 2}"}</tool_call>', "add", {"a": 1, "b": 2}),
    ('<tool_call>{"name":"add","arguments":{"a":1,"b":2}}', "add", {"a": 1, "b": 2}),  # unclosed, at the end
    ('<tool_call>sure: {"name":"echo","arguments":{"text":"hi"}} ok</tool_call>', "echo", {"text": "hi"}),
    ('<tool_call>{"name":"boom"}</tool_call>', "boom", {}),
])
def test_parser_reads_what_models_write(text, name, arguments):
    [c] = parse_calls(text)
    assert c.error is None and c.name == name and c.arguments == arguments


@pytest.mark.parametrize("text", [
    "<tool_call>add(1, 2)</tool_call>",
    "<tool_call>{\"name\": </tool_call>",
    "<tool_call>[1, 2]</tool_call>",
    '<tool_call>{"arguments": {"a": 1}}</tool_call>',
    '<tool_call>{"name": "add", "arguments": [1, 2]}</tool_call>',
    '<tool_call>{"name": "add", "arguments": "not json"}</tool_call>',
    "<tool_call>",
])
def test_malformed_calls_are_values(text):
    [c] = parse_calls(text)
    assert c.error is not None
    outcome = toy_tools().run(c)
    assert outcome.error_type == "malformed_call" and outcome.content.startswith("Error: malformed tool call")


def test_several_calls_in_order_and_answers():
    text = format_call("add", {"a": 1, "b": 2}) + " then " + format_call("echo", {"text": "x"})
    assert [c.name for c in parse_calls(text)] == ["add", "echo"]
    assert parse_answer("so <answer> 42 </answer>") == "42"
    assert parse_answer("<answer>42") == "42"
    assert parse_answer("no answer here") is None


@pytest.mark.parametrize("arguments, expected, problem", [
    ({"a": 1, "b": 2}, {"a": 1, "b": 2}, None),
    ({"a": "1", "b": 2.0}, {"a": 1, "b": 2}, None),            # coerced: the intent is clear
    ({"a": 1}, None, "missing argument 'b'"),
    ({"a": 1, "b": 2, "c": 3}, None, "unexpected argument 'c'"),
    ({"a": "one", "b": 2}, None, "argument 'a' must be integer"),
    ({"a": True, "b": 2}, None, "argument 'a' must be integer"),
    ({"a": 1.5, "b": 2}, None, "argument 'a' must be integer"),
])
def test_arguments_checked_against_schema(arguments, expected, problem):
    schema = toy_tools().tools["add"].parameters
    out, error = check_arguments(schema, arguments)
    assert error == problem if problem is None else problem in error
    if expected is not None:
        assert out == expected


def test_every_failure_is_an_observation():
    calls = []
    tools = toy_tools(calls)
    unknown = tools.run(ToolCall("c1", "nope", {}))
    assert unknown.error_type == "unknown_tool" and "add" in unknown.content
    bad = tools.run(ToolCall("c2", "add", {"a": "x", "b": 1}))
    assert bad.error_type == "invalid_arguments" and bad.content.startswith("Error: add:")
    raised = tools.run(ToolCall("c3", "boom", {}))
    assert raised.error_type == "RuntimeError" and raised.content == "Error: the tool broke"
    ok = tools.run(ToolCall("c4", "add", {"a": "2", "b": 3}))
    assert ok.ok and ok.content == "5" and calls == [("add", 2, 3)]


def test_tool_declarations_are_checked():
    with pytest.raises(ValueError, match="identifier"):
        Tool("bad name", "", {"type": "object", "properties": {}}, lambda: 0)
    with pytest.raises(ValueError, match="type"):
        Tool("t", "", {"type": "object", "properties": {"x": {"type": "object"}}}, lambda x: 0)
    with pytest.raises(ValueError, match="required"):
        Tool("t", "", {"type": "object", "properties": {}, "required": ["x"]}, lambda x: 0)


def test_openai_specs_and_prompts():
    tools = toy_tools()
    spec = tools.tools["add"].openai_spec()
    assert spec["type"] == "function" and spec["function"]["parameters"]["required"] == ["a", "b"]
    assert "add(a, b)" in system_prompt(tools, "compact")
    assert '"name":"add"' in system_prompt(tools, "json")
    assert "add" not in system_prompt(tools, "openai")
