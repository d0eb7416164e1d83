"""Standard tier vs fast tier: per-stream decode speed, greedy agreement, held-out scores.

    .venv/bin/python bench/tiers.py [--repeats 3] [--tokens 64] [--batches 1,8] [--models tiny,90m]
                                    [--heldout 32] [--threads 2] [--workdir /tmp/polyrl-bench] [--no-speed]

The standard tier is the default paged engine (engine.native as it ships). The fast tier's
levers are measured one by one and together, on the same prompts:

- "ngram": speculative decoding by prompt lookup (engine.native.speculative.method ngram,
  k = 4, lookup 4..2);
- "draft": speculative decoding with the built-in draft model (builtin:tiny-draft,
  polyrl/builtin/tiny_draft.py; the built-in model only: a random model has no draft);
- "int8": int8 linear layers (engine.native.quantization "int8"), when this checkout's
  NativeEngineConfig has that field (else the row says so);
- "int8+burst": int8 with FAST_BURST times the standard decode burst (polyrl/serve/tiers.py):
  the fast tier as `polyrl serve` builds it for a model under 20M parameters, where it does
  not speculate;
- "int8+ngram", "int8+draft": both levers (at the standard burst); int8+ngram is the fast
  tier as served for a model of 20M parameters or more;
- "int8+burst+ngram" (90m only): what the longer burst would do to a speculating tier (the
  reason the served one keeps the standard burst).

Models: "tiny", the built-in model with its real weights (builtin:tiny), and "90m", the
~88M random-weight Llama of bench/engine.py (its builder, by import). Workloads, reported
separately: "grounded", prompts whose answer copies from them (tiny: the held-out code and
math tasks, whose answers restate the prompt's names and numbers, and agent-style prompts
that quote a tool result; 90m: a random 24-token segment repeated 4 times), and
"open-ended" (tiny: the alignment domain's requests; 90m: 96 random tokens).

Per model, workload, batch size (1 and 8) and variant: per-stream decode tokens/s = (T - 1)
/ (time from the step where every sequence has its first token to the last), greedy,
end-of-sequence ignored, the B requests joining together (step API), median
over --repeats runs interleaved variant by variant; the ratio to the standard tier; greedy
agreement with the standard tier (share of sequences token-for-token equal, and of tokens
equal before the first difference); speculative acceptance rate (accepted / drafted tokens)
and mean acceptance length (1 + accepted / drafts, the bonus token included).

Held-out scores (tiny only): each domain's held-out tasks (--heldout per domain, the first
of the domain's held-out split with the run's seed; a smaller sample than a training run's
128) scored as polyrl/train/evaluate.py does (quickstart run file's domains and verifiers,
one sample per task at temperature 0.7, plus greedy), standard vs each fast variant, in
points (accuracy x 100). Here speculation runs at every batch size (max_batch_size raised,
no switch-off), so that the scores see the verifier at work rather than its switch-off.

The machine is shared: compare the ratios, not the absolute figures.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from polyrl.engine.base import SamplingParams  # noqa: E402
from polyrl.engine.config import NativeEngineConfig  # noqa: E402
from polyrl.engine.paged import PagedEngine  # noqa: E402
from polyrl.engine.speculative.config import SpeculativeConfig  # noqa: E402
from polyrl.models.loading import load_policy  # noqa: E402
from polyrl.serve.tiers import FAST_BURST  # noqa: E402

HAS_INT8 = "quantization" in NativeEngineConfig.model_fields
BURST = NativeEngineConfig().decode_burst
NGRAM = dict(method="ngram", num_speculative_tokens=4, prompt_lookup_max=4, prompt_lookup_min=2)
DRAFT = dict(method="draft", num_speculative_tokens=4, draft_model="builtin:tiny-draft")


def variants(model: str) -> dict[str, dict | None]:
    """Variant name -> NativeEngineConfig fields (None: not measurable in this checkout)."""
    out: dict[str, dict | None] = {"standard": {}, "ngram": dict(speculative=NGRAM)}
    if model == "tiny":
        out["draft"] = dict(speculative=DRAFT)
    out["int8"] = dict(quantization="int8") if HAS_INT8 else None
    out["int8+burst"] = dict(quantization="int8", decode_burst=FAST_BURST * BURST) if HAS_INT8 else None
    out["int8+ngram"] = dict(quantization="int8", speculative=NGRAM) if HAS_INT8 else None
    if model != "tiny":  # the fast tier as served for a model of 20M parameters or more
        out["int8+burst+ngram"] = dict(out["int8+burst"], speculative=NGRAM) if HAS_INT8 else None
    if model == "tiny":
        out["int8+draft"] = dict(quantization="int8", speculative=DRAFT) if HAS_INT8 else None
    return out


# ---------------------------------------------------------------------------- workloads


def tiny_workloads(tok, n: int) -> dict[str, list[list[int]]]:
    from polyrl.config import default_config
    from polyrl.train.setup import build_domains

    cfg = default_config()
    specs = build_domains(cfg, verifiers=False).specs
    tasks = {d: s.source.sample("heldout", n, seed=cfg.seed) for d, s in specs.items()}
    grounded = [t.prompt for t in tasks["code"][: n // 2]] + [t.prompt for t in tasks["math"][: n - n // 2]]
    open_ended = [t.prompt for t in tasks["alignment"][:n]]
    enc = lambda ps: [tok.encode(tok.chat_prompt(p)) for p in ps]  # noqa: E731
    return {"grounded": enc(grounded), "open-ended": enc(open_ended)}


def random_workloads(vocab: int, n: int) -> dict[str, list[list[int]]]:
    g = torch.Generator().manual_seed(0)
    grounded = [torch.randint(5, vocab, (24,), generator=g).tolist() * 4 for _ in range(n)]
    open_ended = [torch.randint(5, vocab, (96,), generator=g).tolist() for _ in range(n)]
    return {"grounded": grounded, "open-ended": open_ended}


# ---------------------------------------------------------------------------- timing


def make_engine(model, tok, fields: dict, draft) -> PagedEngine:
    config = NativeEngineConfig(**fields)
    uses_draft = config.speculative.method == "draft"
    return PagedEngine(copy.deepcopy(model), tok, config, draft_model=draft if uses_draft else None)


def timed(engine: PagedEngine, prompts, tokens: int) -> tuple[float, list, dict]:
    """Decode seconds of `tokens` greedy tokens per prompt (from the step at which every
    sequence has its first token to the end), the completions, and the counters of the call."""
    sp = SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True)
    before = engine.counters.snapshot()
    ids = [engine.add_request(p, sp, seed=i) for i, p in enumerate(prompts)]
    out = {}
    sched = engine.scheduler
    while sched.waiting or any(s.num_completion_tokens == 0 for s in sched.running):  # prefill
        out.update(engine.step())
    t = time.perf_counter()
    while engine.has_unfinished():
        out.update(engine.step())
    seconds = time.perf_counter() - t
    after = engine.counters.snapshot()
    return seconds, [out[i].token_ids for i in ids], {k: after[k] - before.get(k, 0) for k in after}


def agreement(a: list[list[int]], b: list[list[int]]) -> tuple[float, float]:
    same = sum(x == y for x, y in zip(a, b)) / len(a)
    prefix = 0
    for x, y in zip(a, b):
        k = next((i for i, (u, v) in enumerate(zip(x, y)) if u != v), min(len(x), len(y)))
        prefix += k
    return same, prefix / sum(len(x) for x in a)


def speed_table(name: str, model, tok, draft, workloads, args) -> None:
    print(f"\n== {name}: {sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters; "
          f"per-stream decode tokens/s, {args.tokens} greedy tokens, median of {args.repeats}")
    print(f"{'workload':<11} {'B':>2} {'variant':<16} {'tok/s':>8} {'x std':>6} {'greedy=':>8} {'tok=':>6} "
          f"{'accept':>7} {'mean len':>8}")
    for wname, prompts_all in workloads.items():
        for B in args.batches:
            prompts = prompts_all[:B]
            vs = variants(name)
            engines = {v: make_engine(model, tok, f, draft) for v, f in vs.items() if f is not None}
            for e in engines.values():  # warm-up: kernels, caches, the first-call costs
                timed(e, prompts, 4)
            times: dict[str, list[float]] = {v: [] for v in engines}
            outs: dict[str, list] = {}
            counters: dict[str, dict] = {}
            for _ in range(args.repeats):  # interleaved, so load from other jobs hits every variant alike
                for v, e in engines.items():
                    seconds, toks, c = timed(e, prompts, args.tokens)
                    times[v].append(seconds)
                    outs[v], counters[v] = toks, c
            base = (args.tokens - 1) / statistics.median(times["standard"])
            for v, f in vs.items():
                if f is None:
                    print(f"{wname:<11} {B:>2} {v:<16} {'n/a: NativeEngineConfig has no quantization field':>30}")
                    continue
                speed = (args.tokens - 1) / statistics.median(times[v])
                same, tok_same = agreement(outs["standard"], outs[v])
                c = counters[v]
                acc = f"{c['spec_accepted_tokens'] / c['spec_draft_tokens']:.2f}" if c.get("spec_draft_tokens") else "-"
                mlen = f"{1 + c['spec_accepted_tokens'] / c['spec_drafts']:.2f}" if c.get("spec_drafts") else "-"
                print(f"{wname:<11} {B:>2} {v:<16} {speed:>8.1f} {speed / base:>6.2f} {same:>8.2f} {tok_same:>6.2f} "
                      f"{acc:>7} {mlen:>8}")


# ---------------------------------------------------------------------------- held-out scores


def heldout_scores(model, tok, draft, args) -> None:
    from polyrl.config import default_config
    from polyrl.rollout.dispatch import Rollout
    from polyrl.train.evaluate import evaluate
    from polyrl.train.setup import build_domains

    cfg = default_config()
    domains = build_domains(cfg)
    heldout = {d: s.source.sample("heldout", args.heldout, seed=cfg.seed) for d, s in domains.specs.items()}
    print(f"\n== tiny: held-out scores, {args.heldout} tasks per domain (points; sampled at T="
          f"{cfg.engine.temperature} / greedy), standard vs fast variants")
    rows = {}
    try:
        for v, fields in variants("tiny").items():
            if args.variants and v not in args.variants.split(","):
                continue
            if fields is None:
                print(f"{v:<11} n/a: NativeEngineConfig has no quantization field")
                continue
            if "speculative" in fields:  # speculate at every batch size: the scores see the verifier at work
                always = dict(fields["speculative"], max_batch_size=4096, min_acceptance_rate=0)
                fields = dict(fields, speculative=always)
            engine = make_engine(model, tok, fields, draft)
            rollout = Rollout(engine, tok, domains.specs, context_window=model.cfg.max_position_embeddings)
            t = time.perf_counter()
            res, cells = {}, []
            for d in sorted(heldout):  # domain by domain: one domain's failure is reported, not fatal
                try:
                    r = evaluate(rollout, {d: heldout[d]}, domains.verifiers, seed=cfg.seed, samples=1,
                                 greedy=True)[d]
                except Exception as e:  # noqa: BLE001  (a benchmark reports what broke and goes on)
                    cells.append(f"{d} n/a ({type(e).__name__}: {str(e)[:60]})")
                    continue
                res[d] = r
                cells.append(f"{d} {100 * r['accuracy']:5.1f}/{100 * r.get('greedy_accuracy', float('nan')):5.1f}")
            rows[v] = res
            print(f"{v:<11} {'  '.join(cells)}   ({time.perf_counter() - t:.0f}s)", flush=True)
    finally:
        domains.close()
    if "standard" in rows:
        for v, res in rows.items():
            if v == "standard":
                continue
            both = [d for d in res if d in rows["standard"]]
            if not both:
                continue
            worst = max(abs(100 * (res[d]["accuracy"] - rows["standard"][d]["accuracy"])) for d in both)
            worst_g = max(abs(100 * (res[d].get("greedy_accuracy", 0) - rows["standard"][d].get("greedy_accuracy", 0)))
                          for d in both)
            print(f"{v:<11} largest |delta| vs standard: sampled {worst:.1f} points, greedy {worst_g:.1f} points")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--models", default="tiny,90m")
    ap.add_argument("--heldout", type=int, default=32, help="held-out tasks per domain (0: skip the scores)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--no-speed", action="store_true", help="only the held-out scores")
    ap.add_argument("--workdir", default="/tmp/polyrl-bench")
    ap.add_argument("--variants", default="", help="comma-separated variants to run (default: all), e.g. standard,int8")
    args = ap.parse_args()
    args.batches = [int(b) for b in args.batches.split(",")]
    torch.set_num_threads(args.threads)
    from bench.engine_parts import make_model_dir

    print(f"torch threads {args.threads}; int8 field {'present' if HAS_INT8 else 'ABSENT (int8 rows are n/a)'}; "
          f"load average {' '.join(f'{x:.2f}' for x in __import__('os').getloadavg())}")
    for name in args.models.split(","):
        model_dir = make_model_dir(name, Path(args.workdir), builtin=name == "tiny")
        model, tok = load_policy(model_dir, "float32")
        if name == "tiny":
            from polyrl.builtin.tiny_draft import ensure_tiny_draft

            # (the builder itself, so that an install made before the tiny-draft entry point works too)
            draft, _ = load_policy(ensure_tiny_draft(), "float32")
            workloads = tiny_workloads(tok, max(args.batches))
        else:
            draft = None
            workloads = random_workloads(model.cfg.vocab_size, max(args.batches))
        if not args.no_speed:
            with torch.inference_mode():
                speed_table(name, model, tok, draft, workloads, args)
        if name == "tiny" and args.heldout:
            heldout_scores(model, tok, draft, args)


if __name__ == "__main__":
    main()
