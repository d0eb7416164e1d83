"""int8 linear layers (engine.native.quantization: int8) against the float32 engine.

    .venv/bin/python bench/int8.py [--repeats 3] [--threads 2] [--models tiny,90m] [--heldout 128] [--samples 4]
                                   [--skip-domains alignment]

In one run, float and int8 interleaved repeat by repeat (the load average is printed with
each repeat, so that load from other jobs hits both alike):

1. per-stream decode tokens/s at batch 1 and 8 on the built-in tiny model (its real
   weights) and on bench/engine.py's ~88M random-weight Llama ("90m", built by its
   make_model_dir): B random 16-token prompts, 64 sampled tokens each (temperature 1,
   end-of-sequence ignored), through the engine's step API: the first step prefills
   every prompt and samples its first token; the decode time is that of the steps after
   it, so per-stream tokens/s is 63 / decode time. Medians over repeats, and the ratio
   int8 / float;
2. greedy agreement, int8 vs float, up to 64 tokens: the fraction of prompts whose greedy
   output is identical, and the mean length of the matching prefix (tokens, and as a share
   of the float output), on the held-out prompts of every built-in domain (tiny) and on
   random prompts (90m; random weights, so its outputs say little);
3. each domain's held-out score on the built-in model, float vs int8, as polyrl train
   measures it (train/evaluate.py's `evaluate` over the quickstart's domains and
   verifiers): accuracy (mean reward of --samples sampled responses per task, the same
   seeds on both sides) and greedy accuracy, on --heldout held-out tasks per domain (the
   quickstart's 128 and 4 samples by default), and the difference in points.

Each engine is the paged engine with its defaults, quantization aside (one process, torch
threads --threads: oneDNN/MKL use them for float; the int8 kernel runs on one).

Not covered: accuracy on real (non-tiny) models, prefill speed, a quiet machine.
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
QUANT = ("none", "int8")
PROMPT_LEN, NEW_TOKENS, BATCHES = 16, 64, (1, 8)


def engine_for(model, tok, quantization: str):
    from polyrl.engine.config import NativeEngineConfig
    from polyrl.engine.paged import PagedEngine

    return PagedEngine(copy.deepcopy(model), tok, NativeEngineConfig(quantization=quantization))


def decode_speed(name: str, model, tok, repeats: int, seed: int = 0) -> dict[tuple[str, int], float]:
    """(quantization, batch) -> median per-stream decode tokens/s."""
    from polyrl.engine.base import SamplingParams

    engines = {q: engine_for(model, tok, q) for q in QUANT}
    g = torch.Generator().manual_seed(seed)
    V = model.cfg.vocab_size

    def prompts(B: int) -> list[list[int]]:  # fresh each call: no prefix-cache hits
        return torch.randint(3, V, (B, PROMPT_LEN), generator=g).tolist()

    def decode_seconds(engine, B: int) -> float:
        """Seconds of the decode steps after the prefill step of B fresh prompts."""
        sp = SamplingParams(temperature=1.0, max_tokens=NEW_TOKENS, ignore_eos=True)
        ids = {engine.add_request(p, sp, seed=i) for i, p in enumerate(prompts(B))}
        assert not engine.step()  # the prefill step: every prompt, and its first token
        t = time.perf_counter()
        done = []
        while engine.has_unfinished():
            done += engine.step()
        dt = time.perf_counter() - t
        assert {rid for rid, _ in done} == ids and all(len(c.token_ids) == NEW_TOKENS for _, c in done)
        return dt

    for engine in engines.values():  # warm-up: kernels built, buffers sized
        decode_seconds(engine, max(BATCHES))
    rates: dict[tuple[str, int], list[float]] = {}
    for rep in range(repeats):
        for B in BATCHES:
            line = []
            for q, engine in engines.items():
                rate = (NEW_TOKENS - 1) / decode_seconds(engine, B)
                rates.setdefault((q, B), []).append(rate)
                line.append(f"{q} {rate:8.1f}")
            print(f"  {name} repeat {rep} B={B}: " + "  ".join(line) + f"  tok/s per stream  "
                  f"load={os.getloadavg()[0]:.2f}", flush=True)
    return {k: statistics.median(v) for k, v in rates.items()}


def greedy_agreement(model, tok, prompts: list[list[int]]) -> tuple[float, float, float]:
    """(fraction identical, mean matching prefix in tokens, mean matching share of the float output)."""
    from polyrl.engine.base import SamplingParams

    sp = SamplingParams(temperature=0, max_tokens=NEW_TOKENS)
    a, b = (engine_for(model, tok, q).generate(prompts, 1, sp) for q in QUANT)
    same, prefix, share = 0, [], []
    for x, y in zip(a, b):
        n = next((i for i, (s, t) in enumerate(zip(x.token_ids, y.token_ids)) if s != t),
                 min(len(x.token_ids), len(y.token_ids)))
        same += x.token_ids == y.token_ids
        prefix.append(n)
        share.append(n / max(len(x.token_ids), 1))
    return same / len(prompts), statistics.mean(prefix), statistics.mean(share)


def heldout_scores(model, tok, per_domain: int, samples: int, skip: set[str]) -> dict[str, dict[str, dict]]:
    """quantization -> domain -> train/evaluate.py's figures, on the quickstart's domains."""
    from polyrl.config import default_config
    from polyrl.rollout.dispatch import Rollout
    from polyrl.train.evaluate import evaluate
    from polyrl.train.setup import build_domains

    cfg = default_config()
    domains = build_domains(cfg)
    try:
        heldout = {d: s.source.sample("heldout", per_domain, seed=cfg.seed) for d, s in domains.specs.items()
                   if d not in skip}
        out = {}
        for q in QUANT:
            rollout = Rollout(engine_for(model, tok, q), tok, domains.specs, model.cfg.max_position_embeddings)
            t = time.perf_counter()
            out[q] = evaluate(rollout, heldout, domains.verifiers, seed=cfg.seed, samples=samples, greedy=True)
            print(f"  held-out evaluation, {q}: {time.perf_counter() - t:.0f} s", flush=True)
        return out
    finally:
        domains.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2, help="torch threads (float products; int8 runs on one)")
    ap.add_argument("--models", default="tiny,90m")
    ap.add_argument("--heldout", type=int, default=128, help="held-out tasks per domain (0: skip section 3)")
    ap.add_argument("--samples", type=int, default=4, help="sampled responses per held-out task")
    ap.add_argument("--skip-domains", default="", help="comma-separated domains left out of section 3")
    ap.add_argument("--workdir", default="/tmp/polyrl-bench")
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    from bench.engine_parts import make_model_dir
    from polyrl.engine.runner.int8_linear import int8_scheme
    from polyrl.models.loading import load_policy

    torch.set_num_threads(args.threads)
    print(f"int8 scheme here: {int8_scheme()[1]}  threads={args.threads}  load={os.getloadavg()}", flush=True)
    models = {name: load_policy(make_model_dir(name, Path(args.workdir), builtin=name == "tiny"), "float32")
              for name in args.models.split(",")}

    print("\n1. per-stream decode tokens/s (median of %d)" % args.repeats, flush=True)
    speed = {name: decode_speed(name, model, tok, args.repeats) for name, (model, tok) in models.items()}
    for name, rates in speed.items():
        for B in BATCHES:
            f, q = rates[("none", B)], rates[("int8", B)]
            print(f"  {name:5s} B={B}: float {f:8.1f}  int8 {q:8.1f}  int8/float {q / f:5.2f}x")

    print("\n2. greedy agreement, int8 vs float (up to %d tokens)" % NEW_TOKENS, flush=True)
    for name, (model, tok) in models.items():
        if name == "tiny":
            from polyrl.config import default_config
            from polyrl.train.setup import build_domains

            specs = build_domains(default_config(), verifiers=False).specs
            tasks = [t for s in specs.values() for t in s.source.sample("heldout", 16, seed=0)]
            prompts = [tok.encode(tok.chat_prompt(t.prompt)) for t in tasks]
        else:
            g = torch.Generator().manual_seed(1)
            prompts = torch.randint(3, model.cfg.vocab_size, (16, PROMPT_LEN), generator=g).tolist()
        same, prefix, share = greedy_agreement(model, tok, prompts)
        print(f"  {name:5s} {len(prompts)} prompts: identical {same:.2f}  mean matching prefix {prefix:.1f} tokens "
              f"({share:.0%} of the float output)")

    if args.heldout and "tiny" in models:
        print(f"\n3. held-out scores on the built-in model ({args.heldout} tasks per domain, {args.samples} samples "
              "each, quickstart seeds)", flush=True)
        model, tok = models["tiny"]
        scores = heldout_scores(model, tok, args.heldout, args.samples, set(filter(None, args.skip_domains.split(","))))
        for domain in scores["none"]:
            f, q = scores["none"][domain], scores["int8"][domain]
            print(f"  {domain:10s} accuracy float {f['accuracy']:.3f} int8 {q['accuracy']:.3f} "
                  f"({100 * (q['accuracy'] - f['accuracy']):+.1f} pts)   greedy float {f['greedy_accuracy']:.3f} "
                  f"int8 {q['greedy_accuracy']:.3f} ({100 * (q['greedy_accuracy'] - f['greedy_accuracy']):+.1f} pts)")


if __name__ == "__main__":
    main()
