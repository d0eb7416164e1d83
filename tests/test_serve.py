"""`polyrl serve` through the official `openai` client: chat, streaming, n, stop, seed, usage,
logprobs, prefix-cache accounting, tiers, errors, /health and /metrics, text completions and
the HTTP Engine a trainer uses (tool calls, queue limits and aborts: tests/test_serve_tools.py)."""

from __future__ import annotations

import copy
import json
import threading
import urllib.error
import urllib.request

import openai
import pytest

from polyrl.engine.base import SamplingParams
from polyrl.engine.config import NativeEngineConfig
from polyrl.engine.http_engine import HTTPEngine
from polyrl.engine.paged import PagedEngine
from polyrl.models.hf_io import load_pretrained
from polyrl.models.tokenizer import Tokenizer
from polyrl.serve.app import Server, create_app
from polyrl.serve.engine_loop import EngineLoop
from polyrl.serve.tiers import tier_config
from tests.helpers import random_model_dir, tiny_model
from tests.serve_fakes import ServerThread

NAME = "tiny-test"
CONFIG = NativeEngineConfig(num_blocks=256, block_size=16)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    model_dir = random_model_dir(tmp_path_factory.mktemp("served"))
    model, _ = load_pretrained(model_dir)
    tok = Tokenizer.from_dir(model_dir)
    # the fast tier without int8, so that its greedy output must equal the standard tier's
    fast = tier_config("fast", CONFIG, int8=False, speculative={"method": "ngram"})
    loops = {"standard": EngineLoop(PagedEngine(copy.deepcopy(model), tok, CONFIG), "standard"),
             "fast": EngineLoop(PagedEngine(copy.deepcopy(model), tok, fast), "fast")}
    server = Server(loops, tok, NAME, model.cfg.max_position_embeddings)
    thread = ServerThread(create_app(server))
    yield thread, server, model, tok
    thread.stop()
    for loop in loops.values():
        loop.close()


@pytest.fixture
def client(served):
    return openai.OpenAI(base_url=served[0].url, api_key="none", max_retries=0)


MSG = [{"role": "user", "content": "What is 47 + 38?"}]


def test_models_lists_the_served_model(client):
    assert [m.id for m in client.models.list().data] == [NAME]


def test_chat_greedy_fields_and_usage(client):
    r = client.chat.completions.create(model=NAME, messages=MSG, temperature=0, max_tokens=12)
    assert r.object == "chat.completion" and r.service_tier == "default"
    assert r.system_fingerprint == "polyrl-standard-v0"
    choice = r.choices[0]
    assert choice.index == 0 and choice.message.role == "assistant" and isinstance(choice.message.content, str)
    u = r.usage
    assert u.total_tokens == u.prompt_tokens + u.completion_tokens
    assert u.prompt_tokens_details.cached_tokens <= u.prompt_tokens
    if choice.finish_reason == "length":
        assert u.completion_tokens == 12
    assert choice.logprobs is None


def _stream_chunks(client, **kw):
    return list(client.chat.completions.create(model=NAME, messages=MSG, stream=True, **kw))


def test_stream_joins_to_the_whole_reply_with_one_finish_and_role_first(client):
    whole = client.chat.completions.create(model=NAME, messages=MSG, temperature=0, max_tokens=20)
    chunks = _stream_chunks(client, temperature=0, max_tokens=20)
    assert len({c.id for c in chunks}) == 1
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert deltas[0].role == "assistant"
    assert "".join(d.content or "" for d in deltas) == whole.choices[0].message.content
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == [whole.choices[0].finish_reason]
    assert all(c.usage is None for c in chunks)  # no include_usage: no usage anywhere


def test_stream_include_usage_is_one_last_chunk_without_choices(client):
    chunks = _stream_chunks(client, temperature=0, max_tokens=8, stream_options={"include_usage": True})
    with_usage = [c for c in chunks if c.usage is not None]
    assert len(with_usage) == 1 and with_usage[0] is chunks[-1] and chunks[-1].choices == []
    u = chunks[-1].usage
    assert u.total_tokens == u.prompt_tokens + u.completion_tokens and u.completion_tokens >= 1


def test_n_choices_seeded_and_reproducible(client):
    kw = dict(model=NAME, messages=MSG, temperature=1.0, max_tokens=10, n=3, seed=7)
    a, b = client.chat.completions.create(**kw), client.chat.completions.create(**kw)
    assert [c.index for c in a.choices] == [0, 1, 2]
    assert [c.message.content for c in a.choices] == [c.message.content for c in b.choices]
    chunks = list(client.chat.completions.create(stream=True, **kw))
    for i in range(3):
        mine = [c.choices[0] for c in chunks if c.choices and c.choices[0].index == i]
        assert sum(1 for ch in mine if ch.finish_reason) == 1
        assert "".join(ch.delta.content or "" for ch in mine) == a.choices[i].message.content


def test_stop_string_cuts_and_stream_agrees(client):
    whole = client.chat.completions.create(model=NAME, messages=MSG, temperature=0, max_tokens=40)
    text = whole.choices[0].message.content
    if len(text) < 6:
        pytest.skip("the random model's reply is too short to cut")
    stop = text[3:5]
    cut = client.chat.completions.create(model=NAME, messages=MSG, temperature=0, max_tokens=40, stop=[stop])
    assert cut.choices[0].finish_reason == "stop"
    assert stop not in cut.choices[0].message.content and text.startswith(cut.choices[0].message.content)
    chunks = _stream_chunks(client, temperature=0, max_tokens=40, stop=[stop])
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == cut.choices[0].message.content


def test_logprobs_counts_and_limit(client):
    r = client.chat.completions.create(model=NAME, messages=MSG, temperature=0, max_tokens=5, logprobs=True,
                                       top_logprobs=3)
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens
    for entry in content:
        assert len(entry.top_logprobs) == 3 and entry.bytes == list(entry.token.encode())
        assert entry.logprob == pytest.approx(entry.top_logprobs[0].logprob, abs=1e-5)  # greedy: the top one
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model=NAME, messages=MSG, logprobs=True, top_logprobs=21)
    assert err.value.body["param"] == "top_logprobs"
    assert client.chat.completions.create(model=NAME, messages=MSG, max_tokens=2).choices  # still serving


def test_prefix_cache_reported_as_cached_tokens(client):
    long = [{"role": "user", "content": "Solve for x: 3x + 4 = 19. " * 8}]
    first = client.chat.completions.create(model=NAME, messages=long, temperature=0, max_tokens=2)
    again = client.chat.completions.create(model=NAME, messages=long, temperature=0, max_tokens=2)
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    assert 0 < again.usage.prompt_tokens_details.cached_tokens < again.usage.prompt_tokens


def test_fast_tier_is_selected_reported_and_greedy_identical(client, served):
    std = client.chat.completions.create(model=NAME, messages=MSG, temperature=0, max_tokens=24)
    raw = client.chat.completions.with_raw_response.create(model=NAME, messages=MSG, temperature=0, max_tokens=24,
                                                           service_tier="fast")
    fast = raw.parse()
    assert raw.headers["x-polyrl-tier"] == "fast"
    assert fast.service_tier == "priority" and fast.system_fingerprint.startswith("polyrl-fast-")
    assert fast.choices[0].message.content == std.choices[0].message.content
    auto = client.chat.completions.create(model=NAME, messages=MSG, max_tokens=2, service_tier="auto")
    assert auto.service_tier == "default"


@pytest.mark.parametrize("body, param, status", [
    ({"messages": MSG, "temperature": 5}, "temperature", 400),
    ({"messages": []}, "messages", 400),
    ({"messages": [{"role": "robot", "content": "hi"}]}, "messages[0].role", 400),
    ({"messages": MSG, "stream_options": {"include_usage": True}}, "stream_options", 400),
    ({"messages": MSG, "max_tokens": 100000}, "messages", 400),
    ({"messages": MSG, "model": "gpt-9"}, "model", 404),
    ({"messages": MSG, "n": 0}, "n", 400),
    ({"messages": MSG, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice", 400),
])
def test_bad_requests_get_openai_error_objects(served, body, param, status):
    code, error = _post(served[0].url + "/chat/completions", json.dumps(body).encode())
    assert code == status
    assert set(error["error"]) == {"message", "type", "param", "code"} and error["error"]["param"] == param


def test_not_json_and_unknown_route_are_error_objects(served):
    assert _post(served[0].url + "/chat/completions", b"{nope")[0] == 400
    code, error = _post(served[0].url + "/nothing", b"{}")
    assert code == 404 and "message" in error["error"]


def test_context_overflow_is_400_before_streaming(client):
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model=NAME, messages=MSG, max_tokens=10**6, stream=True)
    assert err.value.body["code"] == "context_length_exceeded"


def test_health_and_metrics(served, client):
    client.chat.completions.create(model=NAME, messages=MSG, max_tokens=3)
    health = json.loads(urllib.request.urlopen(served[0].url.removesuffix("/v1") + "/health").read())
    assert health["status"] == "ok" and set(health["tiers"]) == {"standard", "fast"}
    text = urllib.request.urlopen(served[0].url.removesuffix("/v1") + "/metrics").read().decode()
    for needle in ('polyrl_requests_total{endpoint="chat",tier="standard",status="200"}',
                   'polyrl_completion_tokens_total{tier="standard"}', 'polyrl_prefix_cache_hit_tokens_total',
                   'polyrl_in_flight_requests{tier="fast"} 0', 'polyrl_time_to_first_token_seconds_bucket',
                   'polyrl_time_to_first_token_seconds_count{tier="standard"}'):
        assert needle in text, needle


def test_concurrent_requests_share_engine_steps(client, served):
    engine = served[1].loops["standard"].engine
    steps, seqs = engine.counters.steps, engine.counters.scheduled_seqs
    results = []
    threads = [threading.Thread(target=lambda: results.append(client.chat.completions.create(
        model=NAME, messages=MSG, max_tokens=24, temperature=1.0, seed=1, extra_body={"ignore_eos": True})))
        for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 8 and all(r.usage.completion_tokens == 24 for r in results)
    # batched: fewer engine steps than sequence-steps (one request alone would take one per step)
    assert engine.counters.scheduled_seqs - seqs > engine.counters.steps - steps


def test_text_completions_strings_and_token_ids(client, served):
    tok = served[3]
    r = client.completions.create(model=NAME, prompt=["What is 47 + 38?", "Solve for x"], max_tokens=6,
                                  temperature=0, n=2, logprobs=2)
    assert r.object == "text_completion" and [c.index for c in r.choices] == [0, 1, 2, 3]
    assert r.choices[0].text == r.choices[1].text  # greedy: the two samples of one prompt agree
    assert len(r.choices[0].logprobs.tokens) == len(r.choices[0].logprobs.token_logprobs)
    ids = tok.encode("What is 47 + 38?")
    by_ids = client.completions.create(model=NAME, prompt=ids, max_tokens=6, temperature=0)
    assert by_ids.choices[0].text == r.choices[0].text
    streamed = list(client.completions.create(model=NAME, prompt=ids, max_tokens=6, temperature=0, stream=True))
    assert "".join(c.choices[0].text for c in streamed if c.choices) == r.choices[0].text


def test_http_engine_equals_local_engine_and_takes_weight_updates(served):
    thread, server, model, tok = served
    engine = HTTPEngine(thread.url, model=NAME)
    prompts = [tok.encode("What is 47 + 38?"), tok.encode("Solve for x: 3x")]
    sampling = SamplingParams(temperature=1.0, max_tokens=10, seed=11, logprobs=2)
    local = PagedEngine(copy.deepcopy(model), tok, CONFIG)
    remote = engine.generate(prompts, 2, sampling)
    expected = local.generate(prompts, 2, sampling)
    assert [c.token_ids for c in remote] == [c.token_ids for c in expected]
    assert [c.prompt_index for c in remote] == [0, 0, 1, 1]
    for r, e in zip(remote, expected):
        assert r.logprobs == pytest.approx(e.logprobs, abs=1e-5)
        assert set(r.top_logprobs[0]) == set(e.top_logprobs[0])
    new = tiny_model(tok.vocab_size, seed=5)
    start = engine.weight_version
    engine.update_weights(new.state_dict(), start + 1)
    local.update_weights(new.state_dict(), start + 1)
    after = engine.generate(prompts, 1, sampling)
    assert [c.token_ids for c in after] == [c.token_ids for c in local.generate(prompts, 1, sampling)]
    assert all(c.weight_version == start + 1 for c in after)
    assert HTTPEngine(thread.url).weight_version == start + 1
    with pytest.raises(RuntimeError, match="409"):
        engine.update_weights(new.state_dict(), start + 1)  # not newer: refused
    engine.update_weights(model.state_dict(), start + 2)  # restore for the other tests


def _post(url: str, body: bytes) -> tuple[int, dict]:
    request = urllib.request.Request(url, data=body, method="POST", headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(request) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def test_the_fast_tier_speculates_by_default_only_where_it_pays():
    import torch

    from polyrl.models.config import ModelConfig
    from polyrl.models.transformer import Transformer
    from polyrl.serve.tiers import speculation_for
    small = tiny_model(64)
    assert speculation_for(small, "auto") == "none"
    assert speculation_for(small, "ngram") == "ngram" and speculation_for(small, "none") == "none"
    with torch.device("meta"):  # 88M parameters, never materialised
        big = Transformer(ModelConfig(model_type="llama", vocab_size=32000, hidden_size=768, intermediate_size=2048,
                                      num_hidden_layers=8, num_attention_heads=12, num_key_value_heads=12))
    assert speculation_for(big, "auto") == "ngram"


def test_the_fast_tier_bursts_longer_with_int8_and_no_speculation_only():
    from polyrl.serve.tiers import FAST_BURST

    base = NativeEngineConfig(decode_burst=8)
    none = {"method": "none"}
    fast = tier_config("fast", base, speculative=none)
    assert fast.quantization == "int8" and fast.decode_burst == 8 * FAST_BURST
    assert tier_config("fast", base, int8=False, speculative=none).decode_burst == 8  # float passes
    speculating = tier_config("fast", base)  # n-gram: a burst would draft nothing
    assert speculating.quantization == "int8" and speculating.decode_burst == 8
    assert tier_config("standard", base) is base
