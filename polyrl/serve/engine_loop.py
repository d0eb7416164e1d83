"""One engine, one thread, many HTTP requests: continuous batching across clients.

Each tier's engine is driven by a thread of its own that loops schedule -> run ->
postprocess (PagedEngine.step) while anything is in flight, and sleeps on its inbox when
nothing is. Request handlers (the asyncio side) never touch the engine: they `submit` a
Job (one prompt, n samples) and read its events from an asyncio queue that the thread
feeds between steps:

- ("tokens", i, token_ids, logprobs): sample i's tokens so far, for streaming jobs, after
  every step that added some (a decode burst adds several);
- ("done", i, Completion): sample i finished;
- ("error", APIError): the engine failed; the job is over.

A client that goes away is `abort`ed: its sequences leave the engine and free their KV
blocks. Weight updates run on the thread between two steps (`call`), so no step ever sees
half-copied weights. At most `max_in_flight` jobs are accepted at once; the next one is
refused at once with 429 rather than queued without bound.

Out of scope: priorities between jobs of one tier (tiers are separate engines), fairness
between clients, preempting a long job for a short one.
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from polyrl.engine.base import SamplingParams
from polyrl.serve.errors import APIError, queue_full


@dataclass(eq=False)
class Job:
    """One request's samples on one engine; `events` is read by the request's handler."""

    prompt_ids: list[int]
    sampling: SamplingParams
    seeds: Sequence[int]
    stream: bool
    loop: asyncio.AbstractEventLoop
    events: asyncio.Queue = field(default_factory=asyncio.Queue)
    """Shared by the jobs of one request (one job per prompt); events name the choice index."""
    base: int = 0
    """Choice index of this job's first sample (a request with several prompts: prompt i's
    samples are choices i*n .. i*n + n - 1)."""
    submitted_at: float = field(default_factory=time.perf_counter)
    first_token_at: float | None = None
    seq_ids: list[int] = field(default_factory=list)
    sent: list[int] = field(default_factory=list)
    """Tokens of each sample already sent as ("tokens", ...) events."""
    left: int = 0
    """Samples not finished yet."""

    def emit(self, *event: Any) -> None:
        self.loop.call_soon_threadsafe(self.events.put_nowait, event)


class EngineLoop:
    def __init__(self, engine: Any, tier: str, max_in_flight: int = 256,
                 on_first_token: Callable[[str, float], None] | None = None) -> None:
        self.engine = engine
        self.tier = tier
        self.max_in_flight = max_in_flight
        self.on_first_token = on_first_token
        self.failed: str | None = None
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._jobs: dict[int, tuple[Job, int]] = {}
        """Engine sequence id -> (its job, sample index); touched by the thread only."""
        self._lock = threading.Lock()
        self._in_flight = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"polyrl-engine-{tier}", daemon=True)
        self._thread.start()

    @property
    def in_flight(self) -> int:
        return self._in_flight

    def submit(self, job: Job) -> None:
        """Accept the job or raise APIError (429 when full, 503 after an engine failure)."""
        if self.failed:
            raise APIError(503, f"the {self.tier} tier's engine failed ({self.failed}); restart the server",
                           "server_error", None, "engine_failed")
        with self._lock:
            if self._in_flight >= self.max_in_flight:
                raise queue_full(self.tier, self.max_in_flight)
            self._in_flight += 1
        job.left = len(job.seeds)
        job.sent = [0] * len(job.seeds)
        self._inbox.put(("add", job))

    def abort(self, job: Job) -> None:
        self._inbox.put(("abort", job))

    async def call(self, fn: Callable[[Any], Any]) -> Any:
        """fn(engine) on the engine's thread between two steps; its result (or exception)."""
        future = asyncio.get_running_loop().create_future()
        self._inbox.put(("call", fn, future))
        return await future

    def close(self) -> None:
        self._stop.set()
        self._inbox.put(("wake",))
        self._thread.join(timeout=10)

    # ---- the thread --------------------------------------------------------------------------

    def _run(self) -> None:
        while not self._stop.is_set():
            idle = self.failed is not None or not self.engine.has_unfinished()
            self._drain(block=idle)
            if self._stop.is_set() or self.failed is not None or not self.engine.has_unfinished():
                continue
            try:
                finished = self.engine.step()
            except Exception as err:  # noqa: BLE001 -- an engine bug fails its jobs, not the server
                self._fail(err)
                continue
            self._stream()
            for seq_id, completion in finished:
                self._finish(seq_id, completion)

    def _drain(self, block: bool) -> None:
        try:
            command = self._inbox.get(timeout=0.5) if block else self._inbox.get_nowait()
        except queue.Empty:
            return
        while True:
            self._handle(command)
            try:
                command = self._inbox.get_nowait()
            except queue.Empty:
                return

    def _handle(self, command: tuple) -> None:
        kind = command[0]
        if kind == "add":
            job = command[1]
            if self.failed is not None:  # accepted just before the engine failed
                job.emit("error", self._failure())
                self._release()
                return
            try:
                for i, seed in enumerate(job.seeds):
                    seq_id = self.engine.add_request(job.prompt_ids, job.sampling, seed=seed)
                    job.seq_ids.append(seq_id)
                    self._jobs[seq_id] = (job, i)
            except ValueError as err:  # handlers check prompts first; this is the backstop
                for seq_id in job.seq_ids:
                    self.engine.abort(seq_id)
                    self._jobs.pop(seq_id, None)
                job.emit("error", APIError(400, str(err), "invalid_request_error", "prompt", None))
                self._release()
        elif kind == "abort":
            job = command[1]
            live = [s for s in job.seq_ids if s in self._jobs]
            for seq_id in live:
                self.engine.abort(seq_id)
                del self._jobs[seq_id]
            if live:
                self._release()
        elif kind == "call":
            _, fn, future = command
            try:
                result = fn(self.engine)
            except Exception as err:  # noqa: BLE001 -- handed to the awaiting handler
                future.get_loop().call_soon_threadsafe(_set, future, None, err)
            else:
                future.get_loop().call_soon_threadsafe(_set, future, result, None)

    def _stream(self) -> None:
        now = time.perf_counter()
        for seq_id, (job, i) in self._jobs.items():
            if job.stream or job.first_token_at is None:
                tokens, logprobs = self.engine.partial(seq_id)
                if len(tokens) > job.sent[i]:
                    self._first_token(job, now)
                    if job.stream:
                        job.sent[i] = len(tokens)
                        job.emit("tokens", job.base + i, tokens, logprobs)

    def _finish(self, seq_id: int, completion: Any) -> None:
        entry = self._jobs.pop(seq_id, None)
        if entry is None:
            return
        job, i = entry
        self._first_token(job, time.perf_counter())
        job.emit("done", job.base + i, completion)
        job.left -= 1
        if job.left == 0:
            self._release()

    def _first_token(self, job: Job, now: float) -> None:
        if job.first_token_at is None:
            job.first_token_at = now
            if self.on_first_token is not None:
                self.on_first_token(self.tier, now - job.submitted_at)

    def _release(self) -> None:
        with self._lock:
            self._in_flight -= 1

    def _fail(self, err: Exception) -> None:
        traceback.print_exc()
        self.failed = f"{type(err).__name__}: {err}"
        for job in {job for job, _ in self._jobs.values()}:
            job.emit("error", self._failure())
            self._release()
        self._jobs.clear()

    def _failure(self) -> APIError:
        return APIError(500, f"the {self.tier} tier's engine failed ({self.failed})", "server_error", None,
                        "engine_failed")


def _set(future: asyncio.Future, result: Any, error: BaseException | None) -> None:
    if future.done():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)
