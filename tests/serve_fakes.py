"""Test doubles for the server: a thread running uvicorn, and an engine that replies with set text."""

from __future__ import annotations

import itertools
import threading
import time
from typing import Any

import uvicorn

from polyrl.engine.stats import EngineCounters
from polyrl.types import Completion


class ServerThread:
    """uvicorn serving `app` on a free loopback port, in a daemon thread."""

    def __init__(self, app: Any) -> None:
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.time() + 30
        while not self.server.started:
            assert time.time() < deadline and self.thread.is_alive(), "the test server did not start"
            time.sleep(0.02)
        self.port = self.server.servers[0].sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}/v1"

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


class ScriptedEngine:
    """The step API of PagedEngine, replying `reply` (two tokens per step); `hold` keeps every
    request running until it is cleared; `fail` makes the next step raise."""

    def __init__(self, tokenizer: Any, reply: str) -> None:
        self.tokenizer = tokenizer
        self.reply_ids = tokenizer.encode(reply)
        self.weight_version = 0
        self.counters = EngineCounters()
        self.hold = threading.Event()
        self.fail = False
        self.aborted: list[int] = []
        self._live: dict[int, list[int]] = {}
        self._ids = itertools.count()

    def check_prompt(self, prompt_ids: Any) -> None:
        if not prompt_ids:
            raise ValueError("empty prompt")

    def add_request(self, prompt_ids: Any, sampling: Any, seed: Any = None, prompt_index: int = 0) -> int:
        seq_id = next(self._ids)
        self._live[seq_id] = []
        return seq_id

    def has_unfinished(self) -> bool:
        return bool(self._live)

    def step(self) -> list[tuple[int, Completion]]:
        if self.fail:
            raise RuntimeError("planted engine failure")
        time.sleep(0.005)
        if self.hold.is_set():
            return []
        done = []
        for seq_id, tokens in list(self._live.items()):
            tokens.extend(self.reply_ids[len(tokens):len(tokens) + 2])
            if len(tokens) == len(self.reply_ids):
                del self._live[seq_id]
                done.append((seq_id, Completion(0, self.tokenizer.decode(tokens), list(tokens), [0.0] * len(tokens),
                                                "stop", self.weight_version)))
        return done

    def partial(self, seq_id: int) -> tuple[list[int], list[float]]:
        tokens = self._live.get(seq_id, [])
        return list(tokens), [0.0] * len(tokens)

    def abort(self, seq_id: int) -> bool:
        self.aborted.append(seq_id)
        return self._live.pop(seq_id, None) is not None
