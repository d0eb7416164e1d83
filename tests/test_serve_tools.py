"""The server's tool calls, queue limit, aborts and engine failures, on a scripted engine
(a reply set in advance: a random model does not call tools on demand)."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request

import http.client
import openai
import pytest

from polyrl.models.tokenizer import Tokenizer
from polyrl.serve.app import Server, create_app
from polyrl.serve.engine_loop import EngineLoop
from polyrl.serve.chat import render_chat
from tests.helpers import random_model_dir
from tests.serve_fakes import ScriptedEngine, ServerThread

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "weather in a city",
                                            "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                           "required": ["city"]}}}
REPLY = 'Let me look. <tool_call>{"name": "get_weather", "arguments": {"city": "Oslo"}}</tool_call>'


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return Tokenizer.from_dir(random_model_dir(tmp_path_factory.mktemp("tools")))


@pytest.fixture
def scripted(tok):
    engine = ScriptedEngine(tok, REPLY)
    loop = EngineLoop(engine, "standard", max_in_flight=2)
    thread = ServerThread(create_app(Server({"standard": loop}, tok, "m", 4096)))
    yield thread, engine, loop
    engine.hold.clear()
    thread.stop()
    loop.close()


def _client(thread):
    return openai.OpenAI(base_url=thread.url, api_key="none", max_retries=0)


ASK = [{"role": "user", "content": "Weather in Oslo?"}]


def test_tool_calls_parsed_into_openai_format(scripted):
    r = _client(scripted[0]).chat.completions.create(model="m", messages=ASK, tools=[WEATHER])
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content == "Let me look."
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.function.name == "get_weather" and call.id.startswith("call_")
    assert json.loads(call.function.arguments) == {"city": "Oslo"}


def test_without_tools_the_call_text_stays_content(scripted):
    r = _client(scripted[0]).chat.completions.create(model="m", messages=ASK)
    assert r.choices[0].message.tool_calls is None and r.choices[0].message.content == REPLY


def test_streamed_tool_call_has_index_id_name_once_and_parsable_arguments(scripted):
    chunks = list(_client(scripted[0]).chat.completions.create(model="m", messages=ASK, tools=[WEATHER], stream=True))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert deltas[0].role == "assistant"
    calls = [tc for d in deltas for tc in (d.tool_calls or [])]
    assert [tc.index for tc in calls] == [0] and calls[0].id and calls[0].function.name == "get_weather"
    assert json.loads("".join(tc.function.arguments for tc in calls)) == {"city": "Oslo"}
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["tool_calls"]


def test_a_conversation_with_tool_results_is_accepted(scripted):
    history = ASK + [{"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Oslo"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "rain, 7 C"}]
    r = _client(scripted[0]).chat.completions.create(model="m", messages=history, tools=[WEATHER])
    assert r.choices[0].message.tool_calls  # the scripted model calls again; what matters is the 200


def test_text_layout_of_tools_for_a_template_without_tools(tok):
    history = ASK + [{"role": "assistant", "content": "", "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Oslo"}'}}]},
        {"role": "tool", "tool_call_id": "c", "content": "rain"}]
    prompt = render_chat(tok, history, [WEATHER], "auto")
    assert "Tools: get_weather(city)" in prompt.text and "<tool_call>" in prompt.text and "rain" in prompt.text
    forced = render_chat(tok, ASK, [WEATHER], {"type": "function", "function": {"name": "get_weather"}})
    assert forced.text.endswith('<tool_call>{"name": "get_weather", "arguments": ')
    assert render_chat(tok, ASK, [WEATHER], "none").tools is False


def test_full_queue_answers_429_not_a_hang(scripted):
    thread, engine, loop = scripted
    engine.hold.set()
    client = openai.OpenAI(base_url=thread.url, api_key="none", max_retries=0, timeout=30)
    streams = [client.chat.completions.create(model="m", messages=ASK, stream=True) for _ in range(2)]
    deadline = time.time() + 10
    while loop.in_flight < 2 and time.time() < deadline:
        time.sleep(0.01)
    with pytest.raises(openai.RateLimitError) as err:
        client.chat.completions.create(model="m", messages=ASK)
    assert err.value.body["code"] == "queue_full"
    engine.hold.clear()
    for s in streams:
        assert list(s)[-1].choices[0].finish_reason == "stop"


def test_a_client_that_goes_away_is_aborted(scripted):
    thread, engine, loop = scripted
    engine.hold.set()
    conn = http.client.HTTPConnection("127.0.0.1", thread.port, timeout=30)
    conn.request("POST", "/v1/chat/completions", json.dumps({"model": "m", "messages": ASK, "stream": True}),
                 {"content-type": "application/json"})
    assert conn.getresponse().status == 200
    deadline = time.time() + 10
    while loop.in_flight < 1 and time.time() < deadline:
        time.sleep(0.01)
    conn.close()  # the client goes away mid-stream
    deadline = time.time() + 10
    while not engine.aborted and time.time() < deadline:
        time.sleep(0.02)
    assert engine.aborted and loop.in_flight == 0


def test_engine_failure_is_a_500_error_object_then_503_and_unhealthy(scripted):
    thread, engine, loop = scripted
    engine.fail = True
    client = _client(thread)
    with pytest.raises(openai.InternalServerError) as err:
        client.chat.completions.create(model="m", messages=ASK)
    assert err.value.body["code"] == "engine_failed"
    with pytest.raises(openai.APIStatusError) as again:
        client.chat.completions.create(model="m", messages=ASK)
    assert again.value.status_code == 503
    with pytest.raises(urllib.error.HTTPError) as health:
        urllib.request.urlopen(thread.url.removesuffix("/v1") + "/health")
    assert health.value.code == 503
