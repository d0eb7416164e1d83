"""The mixed-load scheduler on a real engine: training keeps its share, interactive its latency.

    .venv/bin/python bench/scheduler.py [--seconds 30] [--workers 1] [--capacity 64] [--rate 2] [--threads 2]

One engine (the built-in tiny model; --workers 1: the paged engine, driven sequence by
sequence; --workers 2: two worker processes, driven in rounds; polyrl/pipeline/
shared_engine.py) behind one SharedEngine, and three load generators in threads:

- training: --train-callers threads, each calling generate back to back with a GRPO-shaped
  batch (16 prompts x 8 samples, temperature 1, up to 64 tokens), so training always has
  work queued, as the pipeline's rollout role keeps it;
- evaluation: two threads calling generate back to back (32 prompts x 4 samples);
- interactive: requests (1 prompt, 1 sample, up to 32 tokens) arriving as a Poisson
  process of --rate per second, each from its own thread, timed from call to return.

Scenarios, --seconds each (the first 10% left out): training alone; training beside
evaluation; interactive alone; interactive beside training. Printed: training rollout
throughput (generated tokens/s) beside evaluation as a share of training alone, against
its configured share; interactive p50/p99 latency alone and under training load. Each
scenario runs twice: with the scheduler's defaults (scheduler.py: train share 0.5
priority 1, eval 0.25 priority 0, interactive 0.25 priority 2) and with the same engine
serving calls in arrival order whatever their load (FIFO), the control the shares are
measured against.

Not covered: GPUs, a served HTTP front (serve/), weight updates during the run.
"""

from __future__ import annotations

import argparse
import copy
import json
import random
import statistics
import threading
import time
from dataclasses import dataclass
from typing import Mapping

import torch

from polyrl.engine.base import SamplingParams
from polyrl.engine.config import NativeEngineConfig
from polyrl.engine.factory import build_engine
from polyrl.models.loading import load_policy, resolve_model_dir
from polyrl.pipeline.scheduler import LoadState, MixedLoadPolicy, SchedulerConfig
from polyrl.pipeline.shared_engine import SharedEngine

TEXTS = ["What is 47 + 38?", "Write a function that returns the square of x.", "Solve for x: 3x + 4 = 19.",
         "Thank you so much for your help yesterday!", "How many apples are left if I eat 3 of 10?",
         "Find the price of the blue shirt in the shop.", "Could you please move the meeting to Friday?",
         "Compute 12 * 13.", "Return the largest element of a list.", "Apologise for the late reply."]
TRAIN = SamplingParams(temperature=1.0, max_tokens=64)
EVAL = SamplingParams(temperature=1.0, max_tokens=64)
CHAT = SamplingParams(temperature=0.7, max_tokens=32)


@dataclass
class Settings:
    """What build_engine reads of a run file's engine section."""

    native: NativeEngineConfig
    backend: str = "native"


class FifoPolicy(MixedLoadPolicy):
    """The control: free slots go to calls in arrival order, whatever their load."""

    def admit(self, now: float, state: Mapping[str, LoadState]) -> dict[str, int]:
        free = self.capacity - sum(s.running for s in state.values())
        grant = {name: 0 for name in self.loads}
        for name in sorted((n for n in state if state[n].queued), key=lambda n: state[n].oldest):
            grant[name] = max(0, min(state[name].queued, free))
            free -= grant[name]
        return grant


def prompts(tokenizer, k: int, rng: random.Random) -> list[list[int]]:
    return [tokenizer.encode(tokenizer.chat_prompt(rng.choice(TEXTS))) for _ in range(k)]


def caller(shared: SharedEngine, load: str, stop: threading.Event, tokenizer, batch: int, n: int,
           sampling: SamplingParams, seed: int) -> None:
    """Back-to-back generate calls of one load until stopped."""
    rng = random.Random(seed)
    while not stop.is_set():
        shared.generate(load, prompts(tokenizer, batch, rng), n, sampling)


def interactive(shared: SharedEngine, stop: threading.Event, tokenizer, rate: float, seed: int,
                latencies: list[tuple[float, float]]) -> None:
    """Poisson arrivals, one thread per request; (submit time, latency) of each."""
    rng = random.Random(seed)
    threads = []

    def one(prompt):
        t0 = time.perf_counter()
        shared.generate("interactive", [prompt], 1, CHAT)
        latencies.append((t0, time.perf_counter() - t0))

    while not stop.is_set():
        time.sleep(rng.expovariate(rate))
        t = threading.Thread(target=one, args=(prompts(tokenizer, 1, rng)[0],))
        t.start()
        threads.append(t)
    for t in threads:
        t.join()


def scenario(shared: SharedEngine, tokenizer, loads: set[str], args) -> dict:
    """Run the given loads for args.seconds; generated tokens/s per load and interactive latencies."""
    stop, latencies, threads = threading.Event(), [], []
    if "train" in loads:
        threads += [threading.Thread(target=caller, args=(shared, "train", stop, tokenizer, 16, 8, TRAIN, 10 + i))
                    for i in range(args.train_callers)]
    if "eval" in loads:
        threads += [threading.Thread(target=caller, args=(shared, "eval", stop, tokenizer, 32, 4, EVAL, 20 + i))
                    for i in range(2)]
    if "interactive" in loads:
        threads.append(threading.Thread(target=interactive, args=(shared, stop, tokenizer, args.rate, 30, latencies)))
    start = time.perf_counter()
    for t in threads:
        t.start()
    time.sleep(args.seconds * 0.1)
    before, t0 = shared.stats(), time.perf_counter()
    time.sleep(args.seconds * 0.9)
    after, t1 = shared.stats(), time.perf_counter()
    stop.set()
    for t in threads:
        t.join()
    kept = sorted(lat for sub, lat in latencies if sub >= start + args.seconds * 0.1)
    out = {load: (after[load]["tokens"] - before[load]["tokens"]) / (t1 - t0) for load in loads}
    if kept:
        out["p50"] = statistics.median(kept)
        out["p99"] = kept[min(len(kept) - 1, -(-99 * len(kept) // 100) - 1)]
        out["requests"] = len(kept)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=30.0, help="length of each scenario")
    ap.add_argument("--workers", type=int, default=1, help="engine worker processes (1: step mode, >1: rounds)")
    ap.add_argument("--capacity", type=int, default=64, help="sequences the engine runs at once (scheduler.capacity)")
    ap.add_argument("--rate", type=float, default=2.0, help="interactive requests per second")
    ap.add_argument("--threads", type=int, default=2, help="torch threads of this process")
    ap.add_argument("--train-callers", type=int, default=2, help="threads generating training batches")
    ap.add_argument("--model", default="builtin:tiny")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model_dir = resolve_model_dir(args.model)
    model, tokenizer = load_policy(model_dir, "float32")
    native = NativeEngineConfig(workers=args.workers, max_num_seqs=args.capacity)
    cfg = SchedulerConfig(capacity=args.capacity)
    policies = {"scheduled": MixedLoadPolicy.from_config(cfg), "fifo": FifoPolicy(cfg.loads(), args.capacity)}
    results = {}
    for name, rule in policies.items():
        engine = build_engine(Settings(native), copy.deepcopy(model), tokenizer, model_dir)
        shared = SharedEngine(engine, cfg, policy=rule)
        try:
            for _ in range(3):  # warm-up: worker start-up, first passes, allocator
                shared.generate("train", prompts(tokenizer, 16, random.Random(0)), 8, TRAIN)
            results[name] = {
                "train_alone": scenario(shared, tokenizer, {"train"}, args),
                "train_eval": scenario(shared, tokenizer, {"train", "eval"}, args),
                "interactive_alone": scenario(shared, tokenizer, {"interactive"}, args),
                "interactive_train": scenario(shared, tokenizer, {"interactive", "train"}, args),
            }
        finally:
            shared.close()
    mode = "step mode (paged engine)" if args.workers == 1 else f"round mode ({args.workers} worker processes)"
    if args.json:
        print(json.dumps({"args": vars(args), "mode": mode, "results": results}, indent=1))
        return 0
    print(f"engine: {args.model}, {mode}, capacity {args.capacity}, {args.seconds:g} s per scenario, "
          f"interactive {args.rate:g} req/s")
    for name, r in results.items():
        alone, beside = r["train_alone"]["train"], r["train_eval"]["train"]
        print(f"[{name}] training rollout: {alone:.0f} tok/s alone, {beside:.0f} tok/s beside evaluation "
              f"(eval {r['train_eval']['eval']:.0f} tok/s): {beside / alone:.2f} of alone"
              + (f" (share {cfg.train.share:g})" if name == "scheduled" else ""))
        ia, it = r["interactive_alone"], r["interactive_train"]
        if "p99" in ia and "p99" in it:
            print(f"[{name}] interactive latency: p50 {ia['p50']:.3f} s / p99 {ia['p99']:.3f} s alone "
                  f"({ia['requests']} requests), p50 {it['p50']:.3f} s / p99 {it['p99']:.3f} s under training "
                  f"({it['requests']} requests; training {it['train']:.0f} tok/s beside)")
    s, f = results["scheduled"]["interactive_train"], results["fifo"]["interactive_train"]
    if "p99" in s and "p99" in f:
        print(f"interactive p99 under training load, FIFO / scheduled: {f['p99'] / s['p99']:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
