"""The OpenAI-compatible HTTP app: routes, request -> engine jobs -> response or event stream.

Routes: GET /v1/models, POST /v1/chat/completions, POST /v1/completions, GET /health,
GET /metrics (Prometheus text), GET and POST /v1/weights (the versioned weight update a
trainer uses to make this server its rollout engine; engine/http_engine.py is the client).
Every failure is OpenAI's error object with a 4xx status (errors.py); with `api_key` set,
/v1/* needs `Authorization: Bearer KEY`.

A request becomes one job per prompt on its tier's engine loop (engine_loop.py), so
concurrent requests share the engine's continuous batching. Sampling follows the request:
temperature (default 1; 0 is greedy), top_p, top_k, seed (sample j of a request with seed
s draws from the stream `request_seed(s, j)`, as Engine.generate does: a seeded request
gives the same text whatever else the server is doing), stop, max_tokens (default: the
rest of the context window), logprobs. A prompt that leaves no room for max_tokens is a
400 `context_length_exceeded` before anything streams.

Out of scope: the Responses API, embeddings, batch files, LoRA adapters, several models
per server (one model; tiers are its speeds).
"""

from __future__ import annotations

import asyncio
import json
import time
import traceback
from typing import Any, AsyncIterator, Sequence

import torch
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from polyrl.engine.base import SamplingParams
from polyrl.engine.sampler import request_seed
from polyrl.models.tokenizer import Tokenizer
from polyrl.serve import responses as R
from polyrl.serve.chat import ChatPrompt, parse_reply, render_chat
from polyrl.serve.engine_loop import EngineLoop, Job
from polyrl.serve.errors import APIError, bad_request
from polyrl.serve.metrics import Metrics
from polyrl.serve.protocol import ChatRequest, CompletionRequest, parse
from polyrl.serve.streaming import TextDelta
from polyrl.serve.tiers import reported_tier, tier_for
from polyrl.serve.weights import WeightUpdater
from polyrl.types import Completion


class Server:
    """What the routes share: the tiers' engine loops, the tokenizer, the counters."""

    def __init__(self, loops: dict[str, EngineLoop], tokenizer: Tokenizer, model_name: str, max_model_len: int,
                 api_key: str | None = None) -> None:
        assert loops, "a server needs at least one tier"
        self.loops = loops
        self.tokenizer = tokenizer
        self.model_name = model_name
        self.max_model_len = max_model_len
        self.api_key = api_key
        self.metrics = Metrics()
        self.started = int(time.time())
        self.weights = WeightUpdater(loops)
        for loop in loops.values():
            loop.on_first_token = self.metrics.first_token

    def tier(self, service_tier: str | None) -> str:
        return tier_for(service_tier, tuple(self.loops))

    def envelope(self, kind: str, tier: str) -> R.Envelope:
        version = self.loops[tier].engine.weight_version
        return R.Envelope(kind, self.model_name, reported_tier(tier), f"polyrl-{tier}-v{version}")

    def check_model(self, name: str | None) -> None:
        if name not in (None, "", self.model_name):
            raise APIError(404, f"model {name!r} is not served here; this server serves {self.model_name!r}",
                           "invalid_request_error", "model", "model_not_found")

    def sampling(self, req: ChatRequest | CompletionRequest, prompt_len: int, top_logprobs: int,
                 param: str) -> SamplingParams:
        room = self.max_model_len - prompt_len
        limit = req.completion_limit()
        if room < 1 or (limit is not None and limit > room):
            raise bad_request(f"this model's context window is {self.max_model_len} tokens; the prompt has "
                              f"{prompt_len} and {limit or 1} more were asked for", param, "context_length_exceeded")
        return SamplingParams(temperature=1.0 if req.temperature is None else req.temperature,
                              top_p=req.top_p or 1.0, top_k=req.top_k or 0, max_tokens=limit or room,
                              stop=req.stops(), stop_token_ids=tuple(req.stop_token_ids or ()),
                              seed=req.seed, logprobs=top_logprobs, ignore_eos=bool(req.ignore_eos))

    def submit(self, tier: str, prompts: Sequence[list[int]], sampling: SamplingParams, n: int,
               stream: bool) -> tuple[list[Job], asyncio.Queue]:
        """One job per prompt on `tier`, all or none (a refused one aborts those before it)."""
        loop = self.loops[tier]
        for ids in prompts:
            try:
                loop.engine.check_prompt(ids)
            except ValueError as err:
                raise bad_request(str(err), "prompt", "context_length_exceeded") from None
        base = sampling.seed if sampling.seed is not None else int(torch.randint(0, 2**62, (1,)))
        events: asyncio.Queue = asyncio.Queue()
        jobs: list[Job] = []
        try:
            for i, ids in enumerate(prompts):
                job = Job(ids, sampling, [request_seed(base, i * n + j) for j in range(n)], stream,
                          asyncio.get_running_loop(), events, base=i * n)
                loop.submit(job)
                jobs.append(job)
        except APIError:
            for job in jobs:
                loop.abort(job)
            raise
        return jobs, events

    def abort(self, tier: str, jobs: Sequence[Job]) -> None:
        for job in jobs:
            self.loops[tier].abort(job)


async def collect(server: Server, tier: str, jobs: list[Job], events: asyncio.Queue, total: int,
                  request: Request) -> list[Completion]:
    """Every choice's Completion; the jobs are aborted if the client goes away first."""
    results: list[Completion | None] = [None] * total
    left = total
    try:
        while left:
            try:
                event = await asyncio.wait_for(events.get(), timeout=1.0)
            except asyncio.TimeoutError:
                if await request.is_disconnected():
                    raise asyncio.CancelledError from None
                continue
            if event[0] == "error":
                raise event[1]
            if event[0] == "done":
                results[event[1]] = event[2]
                left -= 1
    finally:
        if left:
            server.abort(tier, jobs)
    return results  # type: ignore[return-value]


def sse(obj: Any) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


# ---- chat ------------------------------------------------------------------------------------

async def chat_completions(server: Server, request: Request) -> Response:
    req: ChatRequest = parse(ChatRequest, await _json(request))
    server.check_model(req.model)
    tier = server.tier(req.service_tier)
    prompt = render_chat(server.tokenizer, req.messages, req.tools, req.tool_choice)
    ids = server.tokenizer.encode(prompt.text)
    top = (req.top_logprobs or 0) if req.logprobs else 0
    sampling = server.sampling(req, len(ids), top, "messages")
    n = req.n or 1
    jobs, events = server.submit(tier, [ids], sampling, n, bool(req.stream))
    env = server.envelope("chat.completion", tier)
    server.metrics.request("chat", tier, 200)
    if req.stream:
        return _stream(chat_stream(server, tier, req, prompt, len(ids), jobs, events, env), tier)
    completions = await collect(server, tier, jobs, events, n, request)
    choices = []
    for i, c in enumerate(completions):
        content, calls = parse_reply(c.text, prompt)
        message: dict[str, Any] = {"role": "assistant", "content": content, "refusal": None}
        if calls:
            message["tool_calls"] = calls
        choices.append({"index": i, "message": message, "finish_reason": "tool_calls" if calls else c.finish_reason,
                        "logprobs": R.chat_logprobs(server.tokenizer, c.token_ids, c.logprobs, c.top_logprobs, top)
                        if req.logprobs else None})
    usage = _usage(server, tier, len(ids), completions)
    return JSONResponse(env.wrap(choices, usage), headers={"x-polyrl-tier": tier})


async def chat_stream(server: Server, tier: str, req: ChatRequest, prompt: ChatPrompt, prompt_len: int,
                      jobs: list[Job], events: asyncio.Queue, env: R.Envelope) -> AsyncIterator[str]:
    n, top, with_usage = req.n or 1, (req.top_logprobs or 0) if req.logprobs else 0, req.include_usage()
    deltas = [TextDelta(server.tokenizer, req.stops(), prompt.prefill) for _ in range(n)]
    started, logged = [False] * n, [0] * n
    done: list[Completion | None] = [None] * n

    def chunk(i: int, delta: dict[str, Any], finish: str | None = None, tokens: Sequence[int] = (),
              lps: Sequence[float] = (), tops: Sequence[dict[int, float]] | None = None) -> str:
        if not started[i]:
            delta, started[i] = {"role": "assistant", **delta}, True
        lp = R.chat_logprobs(server.tokenizer, tokens, lps, tops, top) if req.logprobs and tokens else None
        choice = {"index": i, "delta": delta, "logprobs": lp, "finish_reason": finish}
        return sse(env.wrap([choice], None, chunk=True, with_usage_key=with_usage))

    try:
        left = n
        while left:
            event = await events.get()
            if event[0] == "error":
                yield sse(event[1].body())
                return
            i = event[1]
            if event[0] == "tokens":
                if prompt.tools:
                    continue  # a reply with tool calls is parsed whole, at its end
                tokens, lps = event[2], event[3]
                text = deltas[i].update(tokens)
                if text or (req.logprobs and len(tokens) > logged[i]):
                    yield chunk(i, {"content": text}, None, tokens[logged[i]:], lps[logged[i]:])
                    logged[i] = len(tokens)
                continue
            c: Completion = event[2]
            done[i], left = c, left - 1
            content, calls = parse_reply(c.text, prompt)
            rest_tokens, rest_lps = c.token_ids[logged[i]:], c.logprobs[logged[i]:]
            rest_top = c.top_logprobs[logged[i]:] if c.top_logprobs is not None else None
            if calls:
                yield chunk(i, {"content": content, "tool_calls": [{"index": k, **call} for k, call in enumerate(calls)]},
                            None, rest_tokens, rest_lps, rest_top)
            else:
                text = deltas[i].final(prompt.prefill + c.text)
                if text or not started[i] or (req.logprobs and rest_tokens):
                    yield chunk(i, {"content": text}, None, rest_tokens, rest_lps, rest_top)
            yield chunk(i, {}, "tool_calls" if calls else c.finish_reason)
        if with_usage:
            yield sse(env.wrap([], _usage(server, tier, prompt_len, done), chunk=True))
        yield "data: [DONE]\n\n"
    finally:
        if any(d is None for d in done):
            server.abort(tier, jobs)


# ---- text completions ------------------------------------------------------------------------

async def completions(server: Server, request: Request) -> Response:
    req: CompletionRequest = parse(CompletionRequest, await _json(request))
    server.check_model(req.model)
    tier = server.tier(req.service_tier)
    prompts = [p if isinstance(p, list) else server.tokenizer.encode(p) for p in req.prompts()]
    if any(not p or not all(isinstance(t, int) and 0 <= t < server.tokenizer.vocab_size for t in p)
           for p in prompts):
        raise bad_request("prompt: token ids must be in [0, vocab size) and prompts non-empty", "prompt")
    top = req.logprobs or 0
    sampling = server.sampling(req, max(len(p) for p in prompts), top, "prompt")
    n = req.n or 1
    jobs, events = server.submit(tier, prompts, sampling, n, bool(req.stream))
    env = server.envelope("text_completion", tier)
    server.metrics.request("completions", tier, 200)
    prompt_len = sum(len(p) for p in prompts)
    if req.stream:
        return _stream(completion_stream(server, tier, req, prompt_len, n * len(prompts), jobs, events, env), tier)
    done = await collect(server, tier, jobs, events, n * len(prompts), request)
    choices = []
    for i, c in enumerate(done):
        choice = {"index": i, "text": c.text, "finish_reason": c.finish_reason,
                  "logprobs": R.text_logprobs(server.tokenizer, c, top) if req.logprobs is not None else None}
        if req.return_token_ids:
            choice.update(R.rl_fields(c))
        choices.append(choice)
    return JSONResponse(env.wrap(choices, _usage(server, tier, prompt_len, done)), headers={"x-polyrl-tier": tier})


async def completion_stream(server: Server, tier: str, req: CompletionRequest, prompt_len: int, total: int,
                            jobs: list[Job], events: asyncio.Queue, env: R.Envelope) -> AsyncIterator[str]:
    deltas = [TextDelta(server.tokenizer, req.stops()) for _ in range(total)]
    done: list[Completion | None] = [None] * total
    with_usage = req.include_usage()

    def chunk(i: int, text: str, finish: str | None, extra: dict[str, Any] | None = None) -> str:
        choice = {"index": i, "text": text, "logprobs": None, "finish_reason": finish, **(extra or {})}
        return sse(env.wrap([choice], None, with_usage_key=with_usage))

    try:
        left = total
        while left:
            event = await events.get()
            if event[0] == "error":
                yield sse(event[1].body())
                return
            i = event[1]
            if event[0] == "tokens":
                text = deltas[i].update(event[2])
                if text:
                    yield chunk(i, text, None)
                continue
            c: Completion = event[2]
            done[i], left = c, left - 1
            extra = R.rl_fields(c) if req.return_token_ids else None
            yield chunk(i, deltas[i].final(c.text), c.finish_reason, extra)
        if with_usage:
            yield sse(env.wrap([], _usage(server, tier, prompt_len, done)))
        yield "data: [DONE]\n\n"
    finally:
        if any(d is None for d in done):
            server.abort(tier, jobs)


# ---- the app ---------------------------------------------------------------------------------

def create_app(server: Server) -> FastAPI:
    app = FastAPI(title="polyrl", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.server = server

    @app.middleware("http")
    async def auth(request: Request, call_next: Any) -> Response:
        if server.api_key and request.url.path.startswith("/v1/"):
            if request.headers.get("authorization", "") != f"Bearer {server.api_key}":
                return _error(APIError(401, "missing or wrong API key (Authorization: Bearer KEY)",
                                       "authentication_error", None, "invalid_api_key"))
        return await call_next(request)

    @app.exception_handler(APIError)
    async def api_error(request: Request, err: APIError) -> Response:
        if err.status >= 400:
            server.metrics.request(_endpoint(request), "-", err.status)
        return _error(err)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, err: StarletteHTTPException) -> Response:
        return _error(APIError(err.status_code, str(err.detail), "invalid_request_error", None,
                               "not_found" if err.status_code == 404 else None))

    @app.exception_handler(Exception)
    async def internal_error(request: Request, err: Exception) -> Response:
        traceback.print_exc()
        server.metrics.request(_endpoint(request), "-", 500)
        return _error(APIError(500, f"internal error ({type(err).__name__}); see the server's log",
                               "server_error", None, "internal_error"))

    @app.get("/health")
    async def health() -> Response:
        failed = {t: loop.failed for t, loop in server.loops.items() if loop.failed}
        body = {"status": "failed" if failed else "ok", "model": server.model_name,
                "tiers": {t: {"in_flight": loop.in_flight, "weight_version": loop.engine.weight_version,
                              "failed": loop.failed} for t, loop in server.loops.items()}}
        return JSONResponse(body, status_code=503 if failed else 200)

    @app.get("/metrics")
    async def metrics() -> Response:
        gauges = [(name, tier, value) for tier, loop in server.loops.items()
                  for name, value in (("in_flight_requests", loop.in_flight),
                                      ("weight_version", loop.engine.weight_version))]
        return PlainTextResponse(server.metrics.render(gauges), media_type="text/plain; version=0.0.4")

    @app.get("/v1/models")
    async def models() -> Response:
        return JSONResponse({"object": "list", "data": [{"id": server.model_name, "object": "model",
                                                         "created": server.started, "owned_by": "polyrl"}]})

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        return await chat_completions(server, request)

    @app.post("/v1/completions")
    async def text(request: Request) -> Response:
        return await completions(server, request)

    @app.get("/v1/weights")
    async def weight_version() -> Response:
        return JSONResponse({"version": server.weights.version()})

    @app.post("/v1/weights")
    async def update_weights(request: Request) -> Response:
        return JSONResponse(await server.weights.update(request))

    return app


def _usage(server: Server, tier: str, prompt_len: int, done: Sequence[Completion | None]) -> dict[str, Any]:
    finished = [c for c in done if c is not None]
    cached = finished[0].num_cached_tokens if finished else 0
    usage = R.usage(prompt_len, finished, cached)
    server.metrics.usage(tier, prompt_len, usage["completion_tokens"], cached)
    return usage


def _stream(body: AsyncIterator[str], tier: str) -> StreamingResponse:
    return StreamingResponse(body, media_type="text/event-stream",
                             headers={"x-polyrl-tier": tier, "cache-control": "no-cache"})


async def _json(request: Request) -> Any:
    raw = await request.body()
    try:
        return json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise bad_request(f"the request body is not valid JSON ({err})") from None


def _error(err: APIError) -> Response:
    headers = {"retry-after": "1"} if err.status == 429 else None
    return JSONResponse(err.body(), status_code=err.status, headers=headers)


def _endpoint(request: Request) -> str:
    return request.url.path.rsplit("/", 1)[-1] or "/"
