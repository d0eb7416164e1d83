"""Where one fused decode pass spends its time: each product and kernel call, timed alone.

    python bench/decode_pass.py [--model tiny|90m] [--batch 64] [--context 48] [--threads 1]

Builds the paged engine on bench/engine.py's random-weight model, fills B decode-cache
rows with --context positions by generating, then times (median over --repeats rounds of
--calls calls each) the whole pass `FusedDecoder.logits` and, separately, each of its
parts on the first layer's weights: RMSNorm, the q/k/v product, RoPE + attention, the o
product with the residual, the gate/up product, SiLU-and-multiply, the down product with
the residual, the lm_head product, and the sampler. The per-layer parts times the layer
count, plus head, sampler and embedding, should come to about the pass: the rest is
dispatch, and cache rows that no longer sit in the CPU's caches. Where the whole pass
runs as one C call (small models), the same pass with its layer loop in Python is timed
beside it.

It also prints the products' FLOP rate, timed alone and over the whole pass, against
the machine's matmul rate at the same thread count (bench/engine.py's ceiling): the
products alone bound what share of the ceiling any decode pass can reach.

Not covered: the unfused pass (bench/engine.py's "unfused" engine times that end to
end), prefill, the scheduler.
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="tiny", choices=["tiny", "90m"])
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--context", type=int, default=48, help="positions already in each row")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--calls", type=int, default=100)
    ap.add_argument("--workdir", default="/tmp/polyrl-bench")
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    import torch

    torch.set_num_threads(args.threads)
    from bench.engine_parts import NoTextTokenizer, machine_bound, make_model_dir
    from polyrl.engine.base import SamplingParams
    from polyrl.engine.paged import PagedEngine
    from polyrl.engine.runner.decode_backend import FusedDecode
    from polyrl.engine.runner.fused_decode import ATTEND_GROUP, FusedDecoder
    from polyrl.models.hf_io import load_pretrained

    model = load_pretrained(make_model_dir(args.model, Path(args.workdir)))[0].eval()
    eng = PagedEngine(copy.deepcopy(model), NoTextTokenizer())
    backend = eng.runner.decode_backend
    if not isinstance(backend, FusedDecode):
        sys.exit(f"no fused pass: {backend.reason}")
    fused = backend.decoder
    S, P = args.batch, args.context
    eng.generate([[5] * 16] * S, 1, SamplingParams(max_tokens=P, ignore_eos=True, seed=0))  # sizes the rows
    lib, cache, cfg = fused.lib, eng.runner.decode_cache, model.cfg
    ids, pos, rows = torch.randint(3, cfg.vocab_size, (S,)), torch.full((S,), P, dtype=torch.long), torch.arange(S)
    x = torch.randn(S, cfg.hidden_size)
    h = torch.randn_like(x)  # real values: uninitialised memory can hold subnormals, which time differently
    norm, qkv, o, _, gate_up, down = fused.layers[0]
    q = qkv(h, torch.empty(S, qkv.out_features))
    attn = torch.empty(S, fused.nh * fused.hd)
    gu = gate_up(h, torch.empty(S, gate_up.out_features))
    act = torch.empty(S, gu.shape[1] // 2)
    logits = torch.empty(S, fused.head.out_features)
    threads = fused.threads()
    scores = torch.empty(threads, ATTEND_GROUP * cache.k.shape[3])
    fused._rope_tables(P + 1)
    u, temperature = torch.rand(S, dtype=torch.float64), torch.ones(S)
    parts = {
        "rms_norm": lambda: lib.rms_norm(x.data_ptr(), norm.data_ptr(), h.data_ptr(), S, x.shape[1], fused.eps),
        "qkv product": lambda: qkv(h, q),
        "rope + attention": lambda: lib.rope_attend(
            q.data_ptr(), S, fused.nh, fused.nkv, fused.hd, fused.cos.data_ptr(), fused.sin.data_ptr(),
            pos.data_ptr(), rows.data_ptr(), cache.k.data_ptr(), cache.v.data_ptr(), cache.k.shape[3],
            attn.data_ptr(), fused.scale, scores.data_ptr(), fused.kv_q8, threads),
        "o product + residual": lambda: o.add_to(x, attn),
        "gate/up product": lambda: gate_up(h, gu),
        "silu * up": lambda: lib.silu_mul(gu.data_ptr(), act.data_ptr(), S, act.shape[1], threads),
        "down product + residual": lambda: down.add_to(x, act),
        "lm_head product": lambda: fused.head(h, logits),
        "sampler": lambda: fused.sample(logits, temperature, u),
        "embedding": lambda: model.model.embed_tokens.weight.index_select(0, ids),
        "WHOLE PASS": lambda: fused.logits(ids, pos, rows),
    }
    if fused.whole is not None:  # the same pass with the layer loop in Python, for comparison
        loop = FusedDecoder(fused.model, fused.cache, lib, whole_pass=False)
        parts["LAYER LOOP IN PYTHON"] = lambda: loop.logits(ids, pos, rows)
    times = {name: [] for name in parts}
    for _ in range(args.repeats):  # rounds interleave the parts, so drift hits all alike
        for name, fn in parts.items():
            for _ in range(5):
                fn()
            t = time.perf_counter()
            for _ in range(args.calls):
                fn()
            times[name].append((time.perf_counter() - t) / args.calls * 1e6)
    med = {name: statistics.median(v) for name, v in times.items()}
    layer = sum(med[n] for n in ("rms_norm", "rms_norm", "qkv product", "rope + attention", "o product + residual",
                                 "gate/up product", "silu * up", "down product + residual"))
    print(f"{args.model}: B={S}, context {P}, {args.threads} thread(s), {cfg.num_hidden_layers} layers; "
          f"median us per call over {args.repeats} rounds, load={os.getloadavg()[0]:.2f}")
    for name, us in med.items():
        print(f"  {name:<26} {us:9.1f} us")
    parts_total = layer * cfg.num_hidden_layers + med["rms_norm"] + med["lm_head product"] + med["embedding"]
    products = (med["qkv product"] + med["o product + residual"] + med["gate/up product"]
                + med["down product + residual"]) * cfg.num_hidden_layers + med["lm_head product"]
    print(f"  parts of one pass, summed: {parts_total:.1f} us; products {products:.1f} us "
          f"({100 * products / med['WHOLE PASS']:.0f}% of the pass); pass + sampler = "
          f"{med['WHOLE PASS'] + med['sampler']:.1f} us = {S / (med['WHOLE PASS'] + med['sampler']) * 1e6:,.0f} tok/s")
    D, V = cfg.hidden_size, fused.head.out_features
    layer_flops = 2 * S * (D * qkv.out_features + fused.nh * fused.hd * D + D * gate_up.out_features
                           + gate_up.out_features // 2 * D)
    flops = layer_flops * cfg.num_hidden_layers + 2 * S * D * V
    peak = machine_bound()["flops"]
    print(f"  the pass's products: {flops / 1e9:.3f} GFLOP; timed alone {flops / products / 1e3:.1f} GFLOP/s "
          f"({100 * flops / products / 1e3 / peak * 1e9:.0f}% of this machine's 2048^2 matmul rate at "
          f"{args.threads} thread(s), {peak / 1e9:.1f} GFLOP/s); over the whole pass "
          f"{flops / med['WHOLE PASS'] / 1e3:.1f} GFLOP/s ({100 * flops / med['WHOLE PASS'] / 1e3 / peak * 1e9:.0f}%)")
    if "LAYER LOOP IN PYTHON" in med:
        print(f"  the whole pass is one C call (decode_pass): {med['LAYER LOOP IN PYTHON'] / med['WHOLE PASS']:.2f}x "
              f"faster than the same pass with its layer loop in Python")
    else:
        print("  the layer loop runs in Python (large layers, or no BLAS sgemm in this torch)")


if __name__ == "__main__":
    main()
