"""`polyrl agent`: run agent tasks against a model, with a live view of steps, tools and budget.

    polyrl agent                                   1 generated held-out task, builtin:tiny
    polyrl agent --generate 20 --levels 3 4        20 generated tasks of levels 3 and 4
    polyrl agent PACK.jsonl [--id ID ...]          tasks of an agent (or ops) task pack
    polyrl agent --domain ops --levels 4 --max-steps 150 --budget 300000 --openai-base-url ...
                                                   long-horizon ops tasks, graded on the world's final state
    polyrl agent --openai-base-url http://localhost:8000/v1 --openai-model Qwen/Qwen2.5-7B-Instruct
    polyrl agent --budget 600 --max-steps 6 --run-dir runs/agent-try
    polyrl agent --openai-base-url http://127.0.0.1:8000/v1 --openai-model builtin:tiny --tool-format text \
        --budget 900 --fallback-service-tier fast      over budget: the same model on `polyrl serve`'s fast tier
    polyrl agent --budget 900 --fallback-model fast    the same, in process

Each task runs one episode of the agent loop; the live view prints every model call
(tokens, cache hits, budget), every tool call and result, and every budget or context
event. The run directory gets `obs.sqlite` (read it with `polyrl obs RUN_DIR`) and
`agent_episodes.jsonl` (one full trajectory per episode, untruncated tool results,
reward and verdict). Episodes are scored with success_minus_cost (--alpha, --beta), ops
episodes (`--domain ops`, or a pack's ops lines) with world_state.

Out of scope: running episodes concurrently (they run one after another), chat
sessions with a human, and model endpoints other than OpenAI-compatible ones.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable, TextIO

from polyrl.agent.budget import TokenBudget
from polyrl.agent.loop import AgentConfig, ModelSlot, run_agent
from polyrl.commands import at_least, non_negative_number, positive_number
from polyrl.obs import records as R
from polyrl.obs.records import ObsRecord, Tee
from polyrl.obs.store import ObsStore
from polyrl.types import Task


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("pack", nargs="?", help="agent task pack (JSONL); default: generated tasks of the agent domain")
    p.add_argument("--id", action="append", default=[], help="run only this task id of the pack (repeatable)")
    p.add_argument("--generate", type=at_least(1), default=1, metavar="N", help="generated tasks to run (default 1)")
    p.add_argument("--domain", default="agent", choices=["agent", "ops"],
                   help="domain of generated tasks: agent (shop questions) or ops (stateful back office)")
    p.add_argument("--levels", type=int, nargs="+", default=[1, 2, 3, 4], help="levels of generated tasks")
    p.add_argument("--split", default="heldout", choices=["train", "heldout"], help="split of generated tasks")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--model", default="builtin:tiny", help="polyrl/Hugging Face model dir, or builtin:tiny")
    p.add_argument("--openai-base-url", help="an OpenAI-compatible endpoint instead of --model")
    p.add_argument("--openai-model", default="default", help="model name at the endpoint")
    p.add_argument("--api-key-env", default="OPENAI_API_KEY", help="environment variable holding the API key")
    p.add_argument("--tool-format", default="openai", choices=["openai", "text"],
                   help="endpoint tool calls: OpenAI tools, or the text format for endpoints without tools")
    p.add_argument("--stream", action="store_true", help="stream endpoint calls (measures time to first token)")
    p.add_argument("--fallback-openai-model", help="a lighter model at the same endpoint, used over budget")
    p.add_argument("--fallback-service-tier", metavar="TIER",
                   help="fall back to the endpoint's model (or --fallback-openai-model) on this service tier, "
                        "e.g. fast: the fast tier of a `polyrl serve` endpoint")
    p.add_argument("--fallback-model", metavar="M",
                   help="without an endpoint: a lighter local model to fall back to (builtin:NAME or a directory), "
                        "or `fast`: --model itself on polyrl's fast tier (int8, speculative decoding)")
    p.add_argument("--fallback-cost-weight", type=non_negative_number, default=0.25,
                   help="budget tokens per token of the fallback model (default 0.25)")
    p.add_argument("--budget", type=at_least(1), help="token budget per episode (prompt + completion); default none")
    p.add_argument("--max-steps", type=at_least(1), default=8)
    p.add_argument("--max-tokens", type=at_least(1), default=64, help="completion tokens per model call")
    p.add_argument("--timeout", type=positive_number, help="seconds per episode")
    p.add_argument("--temperature", type=non_negative_number, default=0.0)
    p.add_argument("--alpha", type=non_negative_number, default=0.02, help="success_minus_cost: cost per model call")
    p.add_argument("--beta", type=non_negative_number, default=1e-4, help="success_minus_cost: cost per token")
    p.add_argument("--run-dir", help="where to write obs.sqlite and agent_episodes.jsonl "
                                     "(default runs/agent-<time>)")
    p.add_argument("--otel-endpoint", help="also export records as OTLP/HTTP spans (needs polyrl[otel])")
    p.add_argument("--json", action="store_true", help="one JSON summary on stdout; the live view goes to stderr")
    p.add_argument("--quiet", action="store_true", help="no live view, only the summary")


class LiveView:
    """A Recorder printing each record as one line as it arrives."""

    def __init__(self, out: TextIO):
        self.out = out

    def record(self, rec: ObsRecord) -> None:
        a = rec.attributes
        if rec.kind == "model":
            budget = a.get("x.budget.limit")
            spent = a.get("x.budget.spent")
            money = f"budget {spent}/{budget} ({spent / budget:.0%})" if budget else f"spent {spent}"
            error = f" ERROR {a[R.ERROR_TYPE]}" if a.get(R.ERROR_TYPE) else ""
            line = (f"  step {rec.step} {a.get('x.call.purpose', 'act'):<8} {a.get('gen_ai.request.model')}: "
                    f"in {a.get(R.INPUT_TOKENS)} (cached {a.get(R.CACHE_READ_TOKENS)}) out {a.get(R.OUTPUT_TOKENS)}, "
                    f"{(rec.duration_s or 0) * 1e3:.0f} ms, {money}{error}")
        elif rec.kind == "tool":
            args = ", ".join(f"{k}={v}" for k, v in (a.get("gen_ai.tool.call.arguments") or {}).items())
            error = f"  [{a[R.ERROR_TYPE]}]" if a.get(R.ERROR_TYPE) else ""
            line = f"    {a.get(R.TOOL_NAME)}({args}) -> {a.get('gen_ai.tool.call.result')}{error}"
        elif rec.kind == "event":
            details = ", ".join(f"{k.split('.')[-1]}={v}" for k, v in a.items()
                                if k not in ("x.step", "x.task_id") and v is not None)
            line = f"    ! {rec.name}: {details}"
        else:
            return
        print(line, file=self.out, flush=True)


def _load_tasks(args: argparse.Namespace) -> list[Task]:
    if args.pack:
        from polyrl.domains.pack import load_pack

        loaded = load_pack(args.pack)
        for err in loaded.errors:
            print(f"{args.pack}:{err.line}: {err.message}", file=sys.stderr)
        tasks = [t for _, t in loaded.tasks]
        if args.id:
            missing = set(args.id) - {t.id for t in tasks}
            if missing:
                raise ValueError(f"ids not in {args.pack}: {', '.join(sorted(missing))}")
            tasks = [t for t in tasks if t.id in set(args.id)]
        no_world = [t.id for t in tasks if "world" not in t.data]
        if no_world:
            raise ValueError(f"{args.pack}: task {no_world[0]!r} has no 'world' ({len(no_world)} such tasks); "
                             "polyrl agent runs tasks whose tools read a world (agent, ops); "
                             "`polyrl eval` runs any task pack")
        return tasks
    from polyrl.domains.agent import AgentDomain
    from polyrl.domains.ops import OpsDomain

    domain = OpsDomain if args.domain == "ops" else AgentDomain
    return domain(levels=tuple(args.levels)).sample(args.split, args.generate, args.seed)


def _model_factory(args: argparse.Namespace) -> Callable[[], list[ModelSlot]]:
    """Makes the model slots of one episode (engine backends hold one episode's tokens)."""
    if args.openai_base_url:
        from polyrl.agent.openai_model import OpenAIChatModel

        key = os.environ.get(args.api_key_env)
        make = lambda name, tier=None: OpenAIChatModel(  # noqa: E731
            name, args.openai_base_url, key, tool_format=args.tool_format, stream=args.stream,
            temperature=args.temperature, service_tier=tier)
        slots = [ModelSlot(make(args.openai_model))]
        if args.fallback_openai_model or args.fallback_service_tier:
            fallback = make(args.fallback_openai_model or args.openai_model, args.fallback_service_tier)
            slots.append(ModelSlot(fallback, args.fallback_cost_weight))
        return lambda: slots
    if args.fallback_service_tier:
        raise ValueError("--fallback-service-tier needs --openai-base-url (locally: --fallback-model fast)")
    from polyrl.agent.engine_model import EngineChatModel
    from polyrl.engine.base import SamplingParams
    from polyrl.config import EngineConfig
    from polyrl.engine.factory import build_engine
    from polyrl.models.loading import load_policy, resolve_model_dir

    log = lambda m: print(m, file=sys.stderr)  # noqa: E731
    model_dir = resolve_model_dir(args.model, log=log)
    model, tokenizer = load_policy(model_dir, "float32")
    engine = build_engine(EngineConfig(), model, tokenizer, model_dir)  # the paged engine: turns reuse the cache
    window = model.cfg.max_position_embeddings
    sampling = SamplingParams(temperature=args.temperature, seed=args.seed)
    name = "tiny" if args.model == "builtin:tiny" else Path(args.model).name
    if not args.fallback_model:
        return lambda: [ModelSlot(EngineChatModel(engine, tokenizer, sampling, name, window))]
    light, light_name = _local_fallback(args.fallback_model, model, tokenizer, log)
    return lambda: [ModelSlot(EngineChatModel(engine, tokenizer, sampling, name, window)),
                    ModelSlot(EngineChatModel(light, tokenizer, sampling, light_name, window), args.fallback_cost_weight)]


def _local_fallback(spec: str, model: Any, tokenizer: Any, log: Callable[[str], None]) -> tuple[Any, str]:
    """The fallback engine of --fallback-model: `fast` (the same weights on the fast tier) or another
    model, which must share the tokenizer (the episode's token trace is one sequence)."""
    import copy

    from polyrl.engine.config import NativeEngineConfig
    from polyrl.engine.paged import PagedEngine
    from polyrl.models.loading import load_policy, resolve_model_dir
    from polyrl.serve.tiers import speculation_for, tier_config

    if spec == "fast":  # as `polyrl serve` builds its fast tier: speculating only where it pays
        fast = tier_config("fast", NativeEngineConfig(), speculative={"method": speculation_for(model, "auto")})
        return PagedEngine(copy.deepcopy(model), tokenizer, fast), "fast"
    light_dir = resolve_model_dir(spec, log=log)
    light, light_tok = load_policy(light_dir, "float32")
    if light_tok.vocab_size != tokenizer.vocab_size:
        raise ValueError(f"--fallback-model {spec}: its tokenizer differs from --model's; "
                         "a local fallback must share the tokenizer")
    return PagedEngine(light, tokenizer), Path(spec).name


def main(args: argparse.Namespace) -> int:
    from polyrl.domains.task_tools import graded_on_state, task_toolbox
    from polyrl.rewards.success_minus_cost import SuccessMinusCost
    from polyrl.rewards.world_state import WorldState

    config = AgentConfig(max_steps=args.max_steps, max_tokens=args.max_tokens, timeout_s=args.timeout)
    try:
        tasks = _load_tasks(args)
    except (OSError, ValueError) as exc:
        print(f"polyrl agent: {exc}", file=sys.stderr)
        return 2
    if not tasks:
        print("polyrl agent: no tasks to run", file=sys.stderr)
        return 2
    try:
        slots_for = _model_factory(args)
    except (FileNotFoundError, NotADirectoryError, ValueError) as exc:
        print(f"polyrl agent: --model {args.model}: {exc}", file=sys.stderr)
        return 2
    by_answer, by_state = SuccessMinusCost(alpha=args.alpha, beta=args.beta), WorldState()
    run_dir = Path(args.run_dir or f"runs/agent-{time.strftime('%Y%m%d-%H%M%S')}")
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        print(f"polyrl agent: cannot use --run-dir {run_dir}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    view_out = sys.stderr if args.json else sys.stdout
    otel = None
    if args.otel_endpoint:
        from polyrl.obs.otel import otlp_recorder

        otel = otlp_recorder(args.otel_endpoint)

    summary = []
    with ObsStore.in_run_dir(run_dir) as store, open(run_dir / "agent_episodes.jsonl", "a") as log:
        recorder = Tee(store, otel, None if args.quiet else LiveView(view_out))
        for k, task in enumerate(tasks):
            if not args.quiet:
                print(f"[{k + 1}/{len(tasks)}] {task.id}: {task.prompt}", file=view_out, flush=True)
            budget = TokenBudget(args.budget) if args.budget else None
            trace_id = f"agent-{k}-{task.id}"
            ops = graded_on_state(task)
            tools = task_toolbox(task)
            result = run_agent(task.prompt, tools, slots_for(), config, budget, recorder, trace_id, task.id)
            score = (by_state if ops else by_answer).score([task], [result.to_completion()])[0]
            success = bool(score.details.get("success"))
            store.record(R.episode(trace_id, task.id, success=success, reward=score.value,
                                   stop_reason=result.stop_reason, steps=len(result.steps),
                                   input_tokens=result.input_tokens, output_tokens=result.output_tokens,
                                   cached_tokens=result.cached_tokens))
            log.write(json.dumps({**result.to_json(), "expected": task.answer, "reward": score.value,
                                  "success": success}) + "\n")
            summary.append({"id": task.id, "answer": result.answer, "expected": task.answer, "success": success,
                            "reward": score.value, "stop_reason": result.stop_reason, "steps": len(result.steps),
                            "tokens": result.tokens})
            if not args.quiet:
                verdict = "OK" if success else "WRONG"
                expected = "the gold world state" if ops else repr(task.answer)
                print(f"  => {result.answer!r} (expected {expected}) {verdict}, reward {score.value:.3f}, "
                      f"{result.tokens} tokens, stop: {result.stop_reason}"
                      + (f"\n  conclusion: {result.conclusion}" if result.conclusion else ""), file=view_out)

    successes = sum(s["success"] for s in summary)
    tokens = sum(s["tokens"] for s in summary)
    if args.json:
        print(json.dumps({"run_dir": str(run_dir), "episodes": summary, "successes": successes,
                          "tokens": tokens}))
    else:
        per = f", {tokens / successes:.0f} tokens per success" if successes else ""
        print(f"{successes}/{len(summary)} succeeded, {tokens} tokens{per}; records in {run_dir}/obs.sqlite")
    return 0
