"""The int8 KV cache (engine.native.kv_cache_dtype: int8) against the float32 cache.

    .venv/bin/python bench/kv_int8.py [--lengths 1024,2048,4096] [--tasks 8] [--ttft-tokens 8000]
                                      [--chunks 512,2048] [--repeats 5] [--threads 2] [--parts a,b,c]

On the built-in tiny model (builtin:tiny, head_dim 32, a 512-token window) extended 16x
with YaRN (polyrl/models/context_extension.py: 8,192 positions), in one run:

1. capacity: tokens the pool holds in the same kv_cache_mb (the engine's num_blocks x
   block_size), float32 vs int8, and from the pools' own bytes_per_token the ratio for
   common shapes (head_dim 64 and 128, float32 and bfloat16 caches);
2. greedy agreement on held-out long tasks: LongContextDomain(levels=(1,), tokens=N)
   held-out prompts at each length N, greedy up to 32 tokens with each cache; the share
   of sequences identical, and the share of tokens identical (position by position, over
   the longer of the two outputs); the mean output length; and the mean absolute difference
   of the greedy token's logprob between the caches over each pair's matching prefix (the
   drift an RL trainer would see as a rollout/trainer logprob mismatch);
3. time to first token on one prompt of --ttft-tokens tokens (a held-out long task),
   prefilled in chunks of each --chunks token budget (max_num_batched_tokens), float32
   and int8 interleaved repeat by repeat after one untimed call each (the first pays page
   faults and one-off set-up); medians and minima (the least disturbed run, on shared
   cores), and the ratios int8 / float.

Each engine is the paged engine with its defaults apart from those fields (one process,
--threads torch threads). The load average is printed: others may share the cores.

Not covered: the model's accuracy on the tasks (the tiny model does not solve them at
these lengths), decode speed (the decode cache is float either way), real models.
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
DTYPES = ("auto", "int8")
NEW_TOKENS = 32


def engine_for(model, tok, kv_cache_dtype: str, **kw):
    from polyrl.engine.config import NativeEngineConfig
    from polyrl.engine.paged import PagedEngine

    return PagedEngine(copy.deepcopy(model), tok, NativeEngineConfig(kv_cache_dtype=kv_cache_dtype, **kw))


def capacity(model, tok, kv_cache_mb: int) -> None:
    from polyrl.engine.runner.model_runner import POOLS

    tokens = {d: engine_for(model, tok, d, kv_cache_mb=kv_cache_mb) for d in DTYPES}
    tokens = {d: e.num_blocks * e.config.block_size for d, e in tokens.items()}
    cfg = model.cfg
    print(f"\n(a) tokens in kv_cache_mb={kv_cache_mb} ({cfg.num_hidden_layers} layers, "
          f"{cfg.num_key_value_heads} kv heads, head_dim {cfg.head_dim})")
    print(f"  float32 {tokens['auto']:>9,}   int8 {tokens['int8']:>9,}   ratio {tokens['int8'] / tokens['auto']:.2f}x")
    print("  other shapes (bytes per token, any layer count): cache dtype, head_dim -> ratio")
    for dtype in (torch.float32, torch.bfloat16):
        for hd in (64, 128):
            f = POOLS["auto"].bytes_per_token(1, 1, hd, dtype)
            q = POOLS["int8"].bytes_per_token(1, 1, hd, dtype)
            print(f"  {str(dtype).removeprefix('torch.'):>9} hd={hd:<4} {f / q:.2f}x")


def agreement(model, tok, lengths: list[int], n: int) -> None:
    from polyrl.domains.longctx import LongContextDomain
    from polyrl.engine.base import SamplingParams

    print(f"\n(b) greedy agreement, int8 vs float32 cache, {n} held-out longctx tasks per length, "
          f"up to {NEW_TOKENS} tokens")
    print(f"  {'length':>7} {'seqs identical':>15} {'tokens identical':>17} {'mean tokens':>12} "
          f"{'mean |dlogprob|':>16} {'load':>6}")
    sp = SamplingParams(temperature=0, max_tokens=NEW_TOKENS)
    totals = dict(seqs=0, n=0, same=0, tokens=0)
    example = ""
    for length in lengths:
        tasks = LongContextDomain(levels=(1,), tokens=length, tokenizer=tok).sample("heldout", n, 0)
        prompts = [tok.encode(tok.chat_prompt(t.prompt)) for t in tasks]
        outs = {d: engine_for(model, tok, d).generate(prompts, 1, sp) for d in DTYPES}
        pairs = [(a.token_ids, b.token_ids) for a, b in zip(outs["auto"], outs["int8"])]
        seqs = sum(a == b for a, b in pairs)
        same = sum(sum(x == y for x, y in zip(a, b)) for a, b in pairs)
        total = sum(max(len(a), len(b)) for a, b in pairs)
        # The sampled token's logprob under each cache, over each pair's matching prefix.
        diffs = [abs(x - y) for a, b in zip(outs["auto"], outs["int8"])
                 for x, y in zip(a.logprobs[:prefix(a.token_ids, b.token_ids)], b.logprobs)]
        totals = dict(seqs=totals["seqs"] + seqs, n=totals["n"] + n, same=totals["same"] + same,
                      tokens=totals["tokens"] + total)
        mean_len = sum(len(a) for a, _ in pairs) / n
        print(f"  {length:>7} {seqs:>7}/{n:<7} {same / total:>16.1%} {mean_len:>12.1f} "
              f"{sum(diffs) / max(len(diffs), 1):>16.2e} {os.getloadavg()[0]:>6.2f}", flush=True)
        example = (f"{length} tokens, task {tasks[0].id}: float32 {outs['auto'][0].text!r}, "
                   f"int8 {outs['int8'][0].text!r}")
    print(f"  {'all':>7} {totals['seqs']:>7}/{totals['n']:<7} {totals['same'] / totals['tokens']:>16.1%}")
    print(f"  e.g. {example}")


def prefix(a: list[int], b: list[int]) -> int:
    """Length of the common prefix of a and b."""
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def ttft(model, tok, tokens: int, chunks: list[int], repeats: int) -> None:
    from polyrl.domains.longctx import LongContextDomain
    from polyrl.engine.base import SamplingParams

    task = LongContextDomain(levels=(1,), tokens=tokens, tokenizer=tok).sample("heldout", 1, 0)[0]
    prompt = tok.encode(tok.chat_prompt(task.prompt))
    print(f"\n(c) time to first token, one {len(prompt)}-token prompt, chunked prefill, {repeats} repeats: "
          "median (min)")
    print(f"  {'chunk':>6} {'float32 s':>13} {'int8 s':>13} {'int8/float':>11}")
    sp = SamplingParams(temperature=0, max_tokens=1)
    for chunk in chunks:
        times: dict[str, list[float]] = {d: [] for d in DTYPES}
        engines = {d: engine_for(model, tok, d, max_num_batched_tokens=chunk, enable_prefix_caching=False)
                   for d in DTYPES}
        for e in engines.values():  # untimed: the first call pays page faults and one-off set-up
            e.generate([prompt], 1, sp)
        for r in range(repeats):
            for d in DTYPES:  # interleaved: load from other jobs hits both alike
                t = time.perf_counter()
                engines[d].generate([prompt], 1, sp)
                times[d].append(time.perf_counter() - t)
            print(f"    repeat {r}: float32 {times['auto'][-1]:.2f}s int8 {times['int8'][-1]:.2f}s "
                  f"load={os.getloadavg()[0]:.2f}", flush=True)
        f, q = statistics.median(times["auto"]), statistics.median(times["int8"])
        fm, qm = min(times["auto"]), min(times["int8"])
        print(f"  {chunk:>6} {f:>6.2f} ({fm:.2f}) {q:>6.2f} ({qm:.2f}) {q / f:>5.2f}x ({qm / fm:.2f}x)", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lengths", default="1024,2048,4096")
    ap.add_argument("--tasks", type=int, default=8)
    ap.add_argument("--ttft-tokens", type=int, default=8000)
    ap.add_argument("--chunks", default="512,2048")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--kv-cache-mb", type=int, default=64)
    ap.add_argument("--parts", default="a,b,c", help="which of (a) capacity, (b) agreement, (c) TTFT to run")
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    from polyrl.models.context_extension import extend_context
    from polyrl.models.loading import load_policy, resolve_model_dir

    torch.set_num_threads(args.threads)
    print(f"threads={args.threads} load={os.getloadavg()}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = extend_context(resolve_model_dir("builtin:tiny"), Path(tmp) / "tiny-yarn16", "yarn", 16)
        model, tok = load_policy(model_dir, "float32")
        parts = args.parts.split(",")
        if "a" in parts:
            capacity(model, tok, args.kv_cache_mb)
        if "b" in parts:
            agreement(model, tok, [int(x) for x in args.lengths.split(",")], args.tasks)
        if "c" in parts:
            ttft(model, tok, args.ttft_tokens, [int(x) for x in args.chunks.split(",")], args.repeats)
    print(f"\nload at the end: {os.getloadavg()}")


if __name__ == "__main__":
    main()
