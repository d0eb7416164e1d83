"""`polyrl eval --model openai:BASE_URL#MODEL` against a stub OpenAI-compatible server in a
thread: agent tasks through OpenAI tool calls, single-call tasks, usage and price-card cost."""

from __future__ import annotations

import contextlib
import io
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

pytest.importorskip("openai")

from polyrl.cli import main  # noqa: E402

USAGE = {"prompt_tokens": 50, "completion_tokens": 10, "total_tokens": 60,
         "prompt_tokens_details": {"cached_tokens": 32}}
WORLD = {"items": {"pen": {"price": 12, "stock": 3}, "cup": {"price": 7, "stock": 5}}, "notes": {}}


def _message(body: dict) -> dict:
    """Agent requests: call price(pen), then answer with the tool's result. Others: a boxed answer."""
    if not body.get("tools"):
        return {"role": "assistant", "content": "6 * 7 = 42, so \\boxed{42}"}
    results = [m["content"] for m in body["messages"] if m["role"] == "tool"]
    if results:
        return {"role": "assistant", "content": f"<answer>{results[-1]}</answer>"}
    return {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "price", "arguments": '{"item": "pen"}'}}]}


class _Stub(BaseHTTPRequestHandler):
    bodies: list[dict] = []

    def log_message(self, *args):
        pass

    def _json(self, obj: dict) -> None:
        payload = json.dumps(obj).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def do_GET(self):
        if self.path != "/v1/models":
            self.send_error(404)
            return
        self._json({"object": "list", "data": [{"id": "stub", "object": "model", "created": 0, "owned_by": "x"}]})

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.bodies.append(body)
        message = _message(body)
        finish = "tool_calls" if message.get("tool_calls") else "stop"
        self._json({"id": "c", "object": "chat.completion", "created": 0, "model": body["model"],
                    "choices": [{"index": 0, "message": message, "finish_reason": finish}], "usage": USAGE})


@pytest.fixture
def endpoint():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Stub)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    _Stub.bodies = []
    yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()
    server.server_close()


def test_openai_endpoint_runs_agent_and_single_call_tasks(endpoint, tmp_path):
    suite = tmp_path / "suite.jsonl"
    suite.write_text(json.dumps({"id": "pen", "domain": "agent", "prompt": "What is the price of a pen?",
                                 "answer": "12", "verifier": "success_minus_cost", "world": WORLD,
                                 "metadata": {"tag": "typical"}}) + "\n"
                     + json.dumps({"id": "mul", "domain": "math", "prompt": "What is 6 * 7?", "answer": "42",
                                   "metadata": {"tag": "edge"}}) + "\n")
    spec = f"openai:{endpoint}#stub-model"
    prices = tmp_path / "prices.json"
    prices.write_text(json.dumps({"models": {spec: {"input": 1.0, "cached_input": 0.5, "output": 2.0}}}))
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        assert main(["eval", str(suite), "--model", spec, "--prices", str(prices), "--json", "--quiet"]) == 0
    doc = json.loads(stdout.getvalue())

    pen, mul = doc["tasks"]
    assert pen["success"] and pen["answer"] == "12" and pen["model_calls"] == 2 and pen["tool_calls"] == 1
    assert mul["success"] and mul["model_calls"] == 1 and mul["stop_reason"] == "stop"
    assert (pen["tokens_in"], pen["cached_tokens"], pen["tokens_out"]) == (100, 64, 20)  # the endpoint's usage
    # per call: (50 - 32) * 1.0 + 32 * 0.5 + 10 * 2.0 = 54 per million tokens; three calls, two successes
    (model,) = doc["models"]
    assert model["kind"] == "openai" and model["context_window"] is None
    assert model["cost"] == pytest.approx(3 * 54e-6) and model["cost_per_success"] == pytest.approx(81e-6)
    assert model["tokens_per_success"] == 90 and model["tokens_per_step"] == 60

    assert all(b["model"] == "stub-model" for b in _Stub.bodies)
    agent_calls = [b for b in _Stub.bodies if b.get("tools")]
    assert {t["function"]["name"] for t in agent_calls[0]["tools"]} == {"price", "stock", "calc", "note"}
    assert agent_calls[1]["messages"][-1] == {"role": "tool", "tool_call_id": "call_1", "content": "12"}
    single = next(b for b in _Stub.bodies if not b.get("tools"))
    assert single["messages"] == [{"role": "user", "content": "What is 6 * 7?"}] and single["max_tokens"] == 256
