"""Data-parallel engine: paged engines in worker processes over one shared copy of the weights.

On a CPU, a small model's decode pass is a few dozen small products; splitting each
one across cores costs a thread wake-up per operator, so adding threads adds little
(bench/engine.py compares the two). This engine splits the requests instead: each worker
process runs its own PagedEngine (KV pool, scheduler, prefix cache) on its share of the
cores, and all of them read the model's weights from shared memory, never copied.

    engine = DataParallelEngine(model, tokenizer, NativeEngineConfig(workers=2))
    outs = engine.generate(prompts, n=8, sampling=SamplingParams(seed=0))  # as PagedEngine
    engine.update_weights(policy.state_dict(), version=1)
    engine.close()

Routing (`PrefixRouter`). All samples of a prompt go to one worker, so a GRPO group's
prompt is computed once. A prompt goes to the worker whose recent prompts share the
longest prefix with it, in full KV blocks, so an agent's next turn finds its history
in that worker's cache; a worker already holding its share of the call's work (by
prompt and sampled tokens, plus 25%) takes nothing more unless all do; ties go to the
least loaded.

Sampling is seeded per request exactly as in PagedEngine.generate (request_seed of the
call's seed and the sample's index), so a seeded call returns the same tokens however
the requests are split. `update_weights` copies the new tensors into the shared ones,
then every worker refreshes its packed layers, drops its prefix cache and takes the
version; calls are synchronous, so no request is in flight during an update.

Workers are started with "spawn", so, as with any spawn-based multiprocessing, a script
that builds this engine must do so under `if __name__ == "__main__":` (the workers
import the main module; `polyrl train` and the tests already do).

Out of scope: the step API (add_request / step; use PagedEngine), workers on other
machines (Ray), GPUs (the vLLM backend has its own data parallelism).
"""

from __future__ import annotations

import traceback
import weakref
from collections import OrderedDict
from typing import Any, Mapping, Sequence

import torch
import torch.multiprocessing as mp

from polyrl.engine.base import SamplingParams, check_prompts, copy_weights_
from polyrl.engine.config import NativeEngineConfig
from polyrl.engine.sampler import request_seed
from polyrl.models.tokenizer import Tokenizer
from polyrl.models.transformer import Transformer
from polyrl.types import Completion

LOAD_SLACK = 1.25
"""A worker takes more than its share of a call's work only when every worker has (x this)."""
ROUTER_MEMORY = 1 << 16
"""Block hashes remembered per worker (least recently used forgotten first)."""


class PrefixRouter:
    """Which worker serves each prompt of a call; see the module docstring."""

    def __init__(self, workers: int, block_size: int, memory: int = ROUTER_MEMORY) -> None:
        assert workers >= 1 and block_size >= 1
        self.block_size, self.memory = block_size, memory
        self.seen: list[OrderedDict[int, None]] = [OrderedDict() for _ in range(workers)]

    def block_hashes(self, prompt: Sequence[int]) -> list[int]:
        """Chain hashes of the prompt's full blocks (equal chains: equal prefixes)."""
        out, parent, bs = [], 0, self.block_size
        for i in range(len(prompt) // bs):
            parent = hash((parent, tuple(prompt[i * bs:(i + 1) * bs])))
            out.append(parent)
        return out

    def assign(self, prompts: Sequence[Sequence[int]], n: int, max_tokens: int) -> list[int]:
        """The worker of each prompt."""
        cost = [n * (len(p) + max_tokens) for p in prompts]
        cap = LOAD_SLACK * sum(cost) / len(self.seen)
        load = [0] * len(self.seen)
        out = []
        for prompt, c in zip(prompts, cost):
            hashes = self.block_hashes(prompt)
            matches = [self._matched(hashes, seen) for seen in self.seen]
            room = [w for w in range(len(self.seen)) if load[w] + c <= cap] or range(len(self.seen))
            w = max(room, key=lambda w: (matches[w], -load[w], -w))
            load[w] += c
            self._remember(w, hashes)
            out.append(w)
        return out

    def forget(self) -> None:
        """After a weight update the workers' caches are empty: affinity means nothing."""
        for seen in self.seen:
            seen.clear()

    @staticmethod
    def _matched(hashes: list[int], seen: OrderedDict[int, None]) -> int:
        k = 0
        while k < len(hashes) and hashes[k] in seen:
            k += 1
        return k

    def _remember(self, w: int, hashes: list[int]) -> None:
        seen = self.seen[w]
        for h in hashes:
            seen[h] = None
            seen.move_to_end(h)
        while len(seen) > self.memory:
            seen.popitem(last=False)


class SummedCounters:
    """The workers' EngineCounters, summed: `snapshot()` as EngineCounters has it."""

    def __init__(self, workers: int) -> None:
        self.latest: list[dict[str, int]] = [{} for _ in range(workers)]

    def snapshot(self) -> dict[str, int]:
        keys = {k for s in self.latest for k in s}
        return {k: sum(s.get(k, 0) for s in self.latest) for k in sorted(keys)}


class DataParallelEngine:
    """Engine over `workers` PagedEngine processes sharing `model`'s weights (see the module docstring)."""

    def __init__(self, model: Transformer, tokenizer: Tokenizer, config: NativeEngineConfig,
                 weight_version: int = 0, threads_per_worker: int | None = None) -> None:
        """config.workers worker processes (config.paged is not read: each is a PagedEngine).
        `model` is owned by the engine from here on: its tensors move to shared memory.
        threads_per_worker: torch threads of each worker; None = this process's threads / workers."""
        self.config = config
        workers = config.workers
        self.model = model.eval()
        self.model.share_memory()
        self.weight_version = weight_version
        threads = threads_per_worker or max(1, torch.get_num_threads() // workers)
        self.router = PrefixRouter(workers, self.config.block_size)
        self.counters = SummedCounters(workers)
        ctx = mp.get_context("spawn")  # fork is unsafe once OpenMP threads exist
        self._conns, self._procs = [], []
        for w in range(workers):
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=_worker_main, args=(child, model, tokenizer, self.config, threads, weight_version),
                               daemon=True, name=f"polyrl-engine-{w}")
            proc.start()
            child.close()
            self._conns.append(parent)
            self._procs.append(proc)
        self._finalizer = weakref.finalize(self, _shutdown, self._conns, self._procs)
        self._receive_all(range(workers))  # "ready", or a worker's start-up error

    @property
    def workers(self) -> int:
        return len(self._procs)

    def generate(self, prompts: Sequence[Sequence[int]], n: int, sampling: SamplingParams) -> list[Completion]:
        """n completions per prompt, grouped: result[i*n + j] is sample j of prompt i."""
        check_prompts(prompts, n)
        base = sampling.seed if sampling.seed is not None else int(torch.randint(0, 2**62, (1,)))
        owner = self.router.assign(prompts, n, sampling.max_tokens)
        busy = sorted(set(owner))
        for w in busy:
            requests = [(i, list(prompts[i]), [request_seed(base, i * n + j) for j in range(n)])
                        for i in range(len(prompts)) if owner[i] == w]
            self._conns[w].send(("generate", requests, sampling))
        results: list[Completion | None] = [None] * (len(prompts) * n)
        for w, (completions, counters) in zip(busy, self._receive_all(busy)):
            self.counters.latest[w] = counters
            for i, j, completion in completions:
                results[i * n + j] = completion
        return results  # type: ignore[return-value]

    @torch.no_grad()
    def update_weights(self, weights: Mapping[str, torch.Tensor], version: int) -> None:
        """Copy `weights` into the shared tensors in place; every worker then refreshes."""
        copy_weights_(self.model, weights)
        for conn in self._conns:
            conn.send(("update", version))
        self._receive_all(range(self.workers))
        self.weight_version = version
        self.router.forget()

    def close(self) -> None:
        """Stop the workers (also done when the engine is garbage-collected or at exit)."""
        self._finalizer()

    def _receive_all(self, workers: Sequence[int]) -> list[Any]:
        """Every listed worker's answer, read before raising the first failure (so none is
        left in a pipe to be mistaken for the answer to the next call)."""
        answers = [self._receive(w) for w in workers]
        for failure in answers:
            if isinstance(failure, RuntimeError):
                raise failure
        return answers

    def _receive(self, w: int) -> Any:
        """The worker's payload, or a RuntimeError (returned, not raised) when it failed."""
        try:
            kind, payload = self._conns[w].recv()
        except (EOFError, OSError):
            return RuntimeError(f"engine worker {w} died (exit code {self._procs[w].exitcode})")
        if kind == "error":
            return RuntimeError(f"engine worker {w} failed:\n{payload}")
        return payload


def _shutdown(conns: list, procs: list) -> None:
    for conn in conns:
        try:
            conn.send(("close", None))
        except (OSError, ValueError):
            pass
    for proc in procs:
        proc.join(timeout=10)
        if proc.is_alive():
            proc.kill()
    for conn in conns:
        conn.close()


def _worker_main(conn, model: Transformer, tokenizer: Tokenizer, config: NativeEngineConfig, threads: int,
                 version: int) -> None:
    """One worker: a PagedEngine over the shared model, serving the parent's messages."""
    from polyrl.engine.paged import PagedEngine

    torch.set_num_threads(threads)
    try:
        engine = PagedEngine(model, tokenizer, config, weight_version=version)
    except Exception:  # noqa: BLE001 - reported to the parent, which raises it
        conn.send(("error", traceback.format_exc()))
        return
    conn.send(("ready", None))
    while True:
        kind, *args = conn.recv()
        if kind == "close":
            return
        try:
            if kind == "generate":
                conn.send(("ok", (_serve(engine, *args), engine.counters.snapshot())))
            elif kind == "update":
                engine.refresh_weights(args[0])
                conn.send(("ok", None))
        except Exception:  # noqa: BLE001 - a failed call is reported, the worker goes on
            conn.send(("error", traceback.format_exc()))


def _serve(engine, requests: list[tuple[int, list[int], list[int]]],
           sampling: SamplingParams) -> list[tuple[int, int, Completion]]:
    """Run (prompt index, prompt, per-sample seeds) requests: (prompt index, sample, Completion)."""
    flat = [(prompt, seed, i) for i, prompt, seeds in requests for seed in seeds]
    slots = [(i, j) for i, _, seeds in requests for j in range(len(seeds))]
    return [(i, j, c) for (i, j), c in zip(slots, engine.run_requests(flat, sampling))]
