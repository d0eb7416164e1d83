"""The OpenAI-compatible backend against a stub /v1/chat/completions server in a thread."""

import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

pytest.importorskip("openai")

from polyrl.agent.budget import TokenBudget  # noqa: E402
from polyrl.agent.loop import AgentConfig, ModelSlot, run_agent  # noqa: E402
from polyrl.agent.openai_model import OpenAIChatModel  # noqa: E402
from polyrl.obs.records import ListRecorder  # noqa: E402
from tests.agent_fakes import toy_tools  # noqa: E402

USAGE = {"prompt_tokens": 50, "completion_tokens": 10, "total_tokens": 60,
         "prompt_tokens_details": {"cached_tokens": 32}}


def _reply(body: dict) -> dict:
    """Scripted assistant message: call add(2, 3) first; once a result is back, answer."""
    has_result = any(m["role"] == "tool" or "<tool_response>" in str(m.get("content")) for m in body["messages"])
    if has_result:
        return {"role": "assistant", "content": "It is <answer>5</answer>."}
    if body.get("tools"):
        return {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_abc", "type": "function", "function": {"name": "add", "arguments": '{"a": 2, "b": "3"}'}}]}
    return {"role": "assistant", "content": '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>'}


class _Handler(BaseHTTPRequestHandler):
    requests: list[dict] = []

    def log_message(self, *args):
        pass

    def do_POST(self):
        if self.path != "/v1/chat/completions":
            self.send_error(404)
            return
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.requests.append(body)
        message = _reply(body)
        finish = "tool_calls" if message.get("tool_calls") else "stop"
        if body.get("stream"):
            self._stream(message, finish)
            return
        payload = json.dumps({"id": "cmpl-1", "object": "chat.completion", "created": 0, "model": "stub-model",
                              "choices": [{"index": 0, "message": message, "finish_reason": finish}],
                              "usage": USAGE}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def _stream(self, message: dict, finish: str) -> None:
        def chunk(delta, finish_reason=None, usage=None):
            choices = [] if usage else [{"index": 0, "delta": delta, "finish_reason": finish_reason}]
            obj = {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": "stub-model",
                   "choices": choices, "usage": usage}
            return f"data: {json.dumps(obj)}\n\n".encode()

        parts = [chunk({"role": "assistant", "content": ""})]
        if message.get("tool_calls"):
            tc = message["tool_calls"][0]
            args = tc["function"]["arguments"]
            parts.append(chunk({"tool_calls": [{"index": 0, "id": tc["id"], "type": "function",
                                                "function": {"name": "add", "arguments": args[:7]}}]}))
            parts.append(chunk({"tool_calls": [{"index": 0, "function": {"arguments": args[7:]}}]}))
        else:
            text = message["content"]
            parts += [chunk({"content": text[:5]}), chunk({"content": text[5:]})]
        parts += [chunk({}, finish), chunk(None, usage=USAGE), b"data: [DONE]\n\n"]
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        for p in parts:
            self.wfile.write(p)
            self.wfile.flush()


@pytest.fixture
def stub():
    _Handler.requests = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1", _Handler.requests
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize("stream", [False, True])
def test_openai_tools_round_trip(stub, stream):
    url, requests = stub
    model = OpenAIChatModel("stub-model", url, "test-key", stream=stream)
    rec = ListRecorder()
    budget = TokenBudget(1000)
    result = run_agent("add 2 and 3", toy_tools(), [ModelSlot(model)], AgentConfig(), budget, rec, "tr")
    assert (result.answer, result.stop_reason, len(result.steps)) == ("5", "answer", 2)

    first, second = requests
    assert [t["function"]["name"] for t in first["tools"]] == ["add", "echo", "boom", "big"]
    assert first["messages"][0]["role"] == "system" and "add(a, b)" not in first["messages"][0]["content"]
    assistant, tool = second["messages"][-2:]
    assert assistant["tool_calls"][0]["id"] == "call_abc" and tool == {
        "role": "tool", "tool_call_id": "call_abc", "content": "5"}  # "3" was coerced to 3 by the schema

    usage = result.steps[0].reply.usage
    assert (usage.input_tokens, usage.cached_tokens, usage.output_tokens) == (50, 32, 10)
    assert budget.spent == 120 and result.tokens == 120
    calls = [r for r in rec.records if r.kind == "model"]
    assert calls[0].attributes["gen_ai.usage.cache_read.input_tokens"] == 32
    assert calls[0].attributes["gen_ai.response.model"] == "stub-model"
    assert calls[0].attributes["gen_ai.response.finish_reasons"] == ["tool_calls"]
    assert ("gen_ai.client.operation.time_to_first_chunk" in calls[0].attributes) == stream


def test_text_format_for_endpoints_without_tools(stub):
    url, requests = stub
    model = OpenAIChatModel("stub-model", url, "k", tool_format="text")
    result = run_agent("add 2 and 3", toy_tools(), [ModelSlot(model)])
    assert result.answer == "5"
    assert "tools" not in requests[0] and '"name":"add"' in requests[0]["messages"][0]["content"]
    assert requests[1]["messages"][-1] == {"role": "user", "content": "<tool_response>\n5\n</tool_response>"}


def test_unreachable_endpoint_is_a_model_error():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again before the call: nothing listens there
    model = OpenAIChatModel("m", f"http://127.0.0.1:{port}/v1", "k", timeout_s=5)
    result = run_agent("task", toy_tools(), [ModelSlot(model)])
    assert result.stop_reason == "model_error" and result.steps[0].reply.error == "APIConnectionError"
    assert result.conclusion.startswith("Stopped (model_error)")


def test_missing_openai_package_is_a_clear_error(monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_openai(name, *args, **kwargs):
        if name == "openai":
            raise ImportError("No module named 'openai'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_openai)
    with pytest.raises(ImportError, match=r"pip install 'polyrl\[openai\]'"):
        OpenAIChatModel("m", "http://localhost:1/v1")
