"""`polyrl serve`: one model over an OpenAI-compatible HTTP API, at a standard and a fast speed.

    polyrl serve                                   builtin:tiny on http://127.0.0.1:8000/v1
    polyrl serve builtin:tiny --tiers standard     one tier only
    polyrl serve runs/quickstart --port 8001       a run's final (or latest) checkpoint
    polyrl serve ~/models/Qwen2.5-0.5B-Instruct --draft ~/models/Qwen2.5-0.5B-draft

A request picks its tier with `service_tier` ("fast"/"priority": the fast tier; anything
else: standard); see polyrl/serve/ for the routes, tiers and weight updates. Ctrl-C stops it.
"""

from __future__ import annotations

import argparse
import os
import sys

from polyrl.commands import at_least


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", nargs="?", default="builtin:tiny",
                   help="builtin:NAME, a Hugging Face model directory, or a run directory (default builtin:tiny)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=at_least(0), default=8000)
    p.add_argument("--tiers", default="standard,fast", help="standard, fast or both, comma-separated (default both)")
    p.add_argument("--served-model-name", help="the model's name in the API (default: MODEL as given)")
    p.add_argument("--api-key", help="require `Authorization: Bearer KEY` on /v1/*")
    p.add_argument("--max-in-flight", type=at_least(1), default=256,
                   help="requests a tier runs or queues at once; beyond it a request gets 429 (default 256)")
    p.add_argument("--kv-cache-mb", type=at_least(1), default=1024, help="KV cache memory per tier (default 1024)")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--speculative", default="auto", choices=["auto", "ngram", "draft", "none"],
                   help="the fast tier's speculative decoding; auto (default): n-gram lookup for models of "
                        "20M parameters or more, where it pays, else none; draft needs --draft")
    p.add_argument("--draft", help="the fast tier's draft model directory (a smaller model, same tokenizer)")
    p.add_argument("--no-int8", action="store_true", help="the fast tier without int8 linear layers")
    p.add_argument("--threads", type=at_least(1), default=max(1, (os.cpu_count() or 2) - 1),
                   help="torch threads of the engines (default: the cores less one, which the HTTP side keeps; "
                        "threads that compete with it for a core slow small-batch decoding several times)")


def main(args: argparse.Namespace) -> int:
    import uvicorn

    from polyrl.engine.config import NativeEngineConfig
    from polyrl.serve.app import Server, create_app
    from polyrl.serve.engine_loop import EngineLoop
    from polyrl.serve.tiers import build_tier_engines, load_served_model, parse_tiers, speculation_for

    try:
        tiers = parse_tiers(args.tiers)
    except ValueError as err:
        raise _UsageError(str(err)) from None
    if args.speculative == "draft" and not args.draft:
        raise _UsageError("--speculative draft needs --draft DIR (a smaller model with the same tokenizer)")
    log = lambda msg: print(msg, file=sys.stderr)  # noqa: E731
    import torch
    torch.set_num_threads(args.threads)
    try:
        model, tokenizer, model_dir = load_served_model(args.model, args.dtype, log=log)
    except (FileNotFoundError, ValueError) as err:
        raise _UsageError(str(err)) from None
    method = "draft" if args.draft and args.speculative == "auto" else speculation_for(model, args.speculative)
    speculative = {"method": method, **({"draft_model": args.draft} if args.draft else {})}
    engines = build_tier_engines(model, tokenizer, tiers, NativeEngineConfig(kv_cache_mb=args.kv_cache_mb),
                                 int8=not args.no_int8, speculative=speculative)
    loops = {tier: EngineLoop(engine, tier, args.max_in_flight) for tier, engine in engines.items()}
    name = args.served_model_name or args.model
    server = Server(loops, tokenizer, name, model.cfg.max_position_embeddings, args.api_key)
    fast = f" (fast: {'float' if args.no_int8 else 'int8'}, speculative {method})" if "fast" in tiers else ""
    print(f"polyrl serve: {name} ({model_dir}) on http://{args.host}:{args.port}/v1, tiers: {', '.join(tiers)}{fast}",
          file=sys.stderr)
    try:
        uvicorn.run(create_app(server), host=args.host, port=args.port, log_level="warning")
    finally:
        for loop in loops.values():
            loop.close()
    return 0


class _UsageError(Exception):
    exit_code = 2
