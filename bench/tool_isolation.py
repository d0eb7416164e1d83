"""What running an agent's tools in a tool host costs: in-process against a plain process and bubblewrap.

    python bench/tool_isolation.py [--calls 2000] [--episodes 40] [--steps 4] [--no-tiny]

Arms: "in-process" (ToolBox, the tools in this process); "process" (a tool host per
episode, a plain process forked from a warm session zygote: SandboxConfig(isolation="none"));
"sandbox" (a tool host per episode in fresh bubblewrap namespaces, forked from a warm
session zygote: the default start="fork"); "sandbox-spawn" (a new bubblewrap and
interpreter per episode: start="spawn"). The sandbox arms are left out where bwrap is not
installed. All on the built-in agent domain's tools (polyrl/agent/tool_host.py); each arm's
zygote starts before it is timed (its first call in section 1).

1. per call: the median latency of --calls calls (the tasks' gold calls, cycled) on a
   host that is already running;
2. host start: the median latency of an episode's first call (start the host, import,
   build the world, answer), over --episodes episodes;
3. scripted episodes: run_agent on --episodes tasks with a model that replays each
   task's demonstration (no model cost: the tools' share of an episode at its largest);
4. the quickstart's agent rollout (unless --no-tiny): the agent domain's share of a
   quickstart step (16 prompts x 0.3, 8 episodes each) on the built-in tiny model's base
   weights, --steps steps, arms interleaved step by step on the same tasks and seeds.

Ratios are arm / in-process (above 1: slower). Not covered: other domains' tools, many
concurrent rollout workers, machines with more cores (host starts are serial here).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from polyrl.agent.loop import ModelSlot, run_agent  # noqa: E402
from polyrl.agent.call_format import parse_calls  # noqa: E402
from polyrl.agent.model import ModelReply, Usage  # noqa: E402
from polyrl.agent.tool_host import ToolHostSettings, isolated  # noqa: E402
from polyrl.agent.tools import ToolCall  # noqa: E402
from polyrl.domains.agent import AgentDomain  # noqa: E402
from polyrl.sandbox.types import SandboxConfig  # noqa: E402

ARMS = {"in-process": None, "process": SandboxConfig(isolation="none", allow_unsafe=True),
        "sandbox": SandboxConfig(), "sandbox-spawn": SandboxConfig(start="spawn")}


def arms() -> dict:
    return {name: cfg for name, cfg in ARMS.items() if not name.startswith("sandbox") or shutil.which("bwrap")}


def tools_for(sandbox):
    if sandbox is None:
        return AgentDomain.toolbox
    return isolated(AgentDomain.toolbox, ToolHostSettings(sandbox=sandbox))


class Replay:
    """A chat model that replays a task's demonstration, one assistant turn per call."""

    provider, tool_format, tools_style, context_window = "bench", "text", "compact", None

    def __init__(self, task):
        self.turns = [m["content"] for m in AgentDomain.demonstration(task) if m["role"] == "assistant"]
        self.name, self.k = "replay", 0

    def count_tokens(self, messages, tools) -> int:
        return sum(len(str(m.get("content") or "")) // 4 + 2 for m in messages)

    def complete(self, request) -> ModelReply:
        text = self.turns[min(self.k, len(self.turns) - 1)]
        self.k += 1
        return ModelReply(text, parse_calls(text, f"call_{self.k}"), {"role": "assistant", "content": text},
                          Usage(self.count_tokens(request.messages, None), len(text) // 4 + 1), "stop", self.name, 0.0)


def per_call(tasks, n: int) -> dict[str, float]:
    out = {}
    calls = [ToolCall(f"c{k}", c["name"], dict(c["arguments"])) for t in tasks for k, c in enumerate(t.data["gold_calls"])]
    for name, sandbox in arms().items():
        tools = tools_for(sandbox)(tasks[0])
        tools.run(calls[0])  # start the host
        times = []
        for k in range(n):
            start = time.perf_counter()
            tools.run(calls[k % len(calls)])
            times.append(time.perf_counter() - start)
        tools.close()
        out[name] = statistics.median(times)
    return out


def first_call(tasks) -> dict[str, float]:
    out = {}
    for name, sandbox in arms().items():
        make, times = tools_for(sandbox), []
        for task in tasks:
            gold = task.data["gold_calls"][0]
            tools = make(task)
            start = time.perf_counter()
            tools.run(ToolCall("c0", gold["name"], dict(gold["arguments"])))
            times.append(time.perf_counter() - start)
            tools.close()
        out[name] = statistics.median(times)
    return out


def scripted_episodes(tasks) -> dict[str, float]:
    times: dict[str, list[float]] = {name: [] for name in arms()}
    makers = {name: tools_for(sandbox) for name, sandbox in arms().items()}
    for task in tasks:  # arms interleaved task by task
        for name, make in makers.items():
            start = time.perf_counter()
            with make(task) as tools:
                result = run_agent(task.prompt, tools, [ModelSlot(Replay(task))])
            times[name].append(time.perf_counter() - start)
            assert result.answer == task.answer, (name, task.id, result.answer)
    return {name: statistics.median(t) for name, t in times.items()}


def quickstart_agent(steps: int) -> dict[str, float]:
    import copy

    import polyrl
    from polyrl.config import load_config
    from polyrl.engine.factory import build_engine
    from polyrl.models.loading import load_policy, resolve_model_dir
    from polyrl.rollout.dispatch import Rollout
    from polyrl.rollout.spec import AgentSpec
    from polyrl.train.setup import build_domains, draw_tasks, rollout_sampling

    cfg = load_config(Path(polyrl.__file__).parent / "configs" / "quickstart.yaml")
    cfg.rl_tasks = [t for t in cfg.rl_tasks if t.domain == "agent"]
    model_dir = resolve_model_dir(cfg.model.path, log=lambda *_: None)
    policy, tokenizer = load_policy(model_dir, cfg.model.dtype)
    engine = build_engine(cfg.engine, copy.deepcopy(policy), tokenizer, model_dir)
    spec = build_domains(cfg, verifiers=False).specs["agent"]
    prompts = round(cfg.trainer.prompts_per_step * 0.3)
    rollouts = {}
    for name, sandbox in arms().items():
        agent = AgentSpec(tools_for(sandbox), spec.agent.max_steps, spec.agent.result_chars)
        rollouts[name] = Rollout(engine, tokenizer, {"agent": replace(spec, agent=agent)},
                                 policy.cfg.max_position_embeddings)
    times: dict[str, list[float]] = {name: [] for name in rollouts}
    calls: dict[str, int] = {name: 0 for name in rollouts}
    for step in range(steps + 1):
        tasks = draw_tasks({"agent": spec}, {"agent": prompts}, cfg.seed, step)
        for name, rollout in rollouts.items():
            start = time.perf_counter()
            groups = rollout.groups(tasks, cfg.trainer.group_size, rollout_sampling(cfg.seed, step), f"s{step}")
            if step:  # step 0 warms the engine up
                times[name].append(time.perf_counter() - start)
                calls[name] += sum(len(x.result.tool_results) for g in groups for x in g.samples)
    engine.close()
    note = f"  ({prompts} tasks x {cfg.trainer.group_size} episodes per step; tool calls per arm: {calls})"
    return {name: statistics.median(t) for name, t in times.items()}, note


def show(title: str, figures: dict[str, float], unit: str = "ms") -> None:
    base = figures["in-process"]
    scale = 1000 if unit == "ms" else 1
    print(title)
    for name, value in figures.items():
        print(f"  {name:<13} {value * scale:10.3f} {unit}   {value / base:8.2f}x in-process")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--calls", type=int, default=2000)
    p.add_argument("--episodes", type=int, default=40)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--no-tiny", action="store_true", help="skip the quickstart rollout on the tiny model")
    args = p.parse_args()
    tasks = AgentDomain().sample("train", args.episodes, seed=0)
    print(f"arms: {', '.join(arms())}")
    show(f"1. per call, host running (median of {args.calls})", per_call(tasks, args.calls))
    show(f"2. an episode's first call: start the host and answer (median of {len(tasks)})", first_call(tasks))
    show(f"3. scripted agent episode, demonstration replayed (median of {len(tasks)})", scripted_episodes(tasks))
    if not args.no_tiny:
        figures, note = quickstart_agent(args.steps)
        show(f"4. quickstart agent rollout on the tiny model, per step (median of {args.steps})", figures, "s")
        print(note)
    return 0


if __name__ == "__main__":
    sys.exit(main())
