"""The ops domain (domains/ops*.py, rewards/world_state.py, quality/ops_probes.py): worlds are
deterministic and round-trip through JSON and packs, failures fall as scheduled, the
reference solver reaches the gold state in the stated calls, the verifier grades the final
state (gold 1, nothing 0, side effects 0, longer less than 1), a scripted agent episode is
graded end to end, a run file's episode budget stops RL rollouts on budget, and the audit
passes."""

from __future__ import annotations

import json
from collections import defaultdict

import pytest

from polyrl.agent.call_format import format_answer, format_call
from polyrl.agent.loop import AgentConfig, ModelSlot, run_agent
from polyrl.agent.outcome import EpisodeOutcome
from polyrl.agent.tools import ToolCall
from polyrl.config import ConfigError, load_config_text
from polyrl.domains.ops import LEVEL_SHAPES, OpsDomain
from polyrl.domains.ops_reference import solve
from polyrl.domains.ops_world import PAGE_SIZE, World, call_key, toolbox_for_task
from polyrl.domains.pack import load_pack, task_line, verifier_for
from polyrl.quality.audit import audit_domain
from polyrl.quality.ops_probes import ops_probes, record
from polyrl.rewards.world_state import WorldState, gold_state, replay
from polyrl.types import Task
from tests.agent_fakes import ScriptedModel

CALLS = {1: (2, 10), 2: (4, 25), 3: (15, 45), 4: (40, 100)}
"""Reference calls (retries included) every task of a level needs, at least and at most."""


@pytest.fixture(scope="module")
def by_level() -> dict[int, list[Task]]:
    return {level: OpsDomain(levels=(level,)).sample("train", 30, seed=0) for level in LEVEL_SHAPES}


@pytest.fixture(scope="module")
def top(by_level) -> Task:
    return next(t for t in by_level[4] if any(not k.startswith(("list_", "get_")) for k in t.data["world"]["busy"]))


def run(task: Task, calls: list[dict]) -> list:
    tools = toolbox_for_task(task)
    return [tools.run(ToolCall(f"c{k}", c["name"], dict(c["arguments"]))) for k, c in enumerate(calls)]


# ------------------------------------------------------------------ world and generator


def test_sampling_is_a_pure_function_and_splits_never_share_a_request(by_level):
    again = OpsDomain(levels=(4,)).sample("train", 30, seed=0)
    assert [t.to_json() for t in again] == [t.to_json() for t in by_level[4]]
    heldout = OpsDomain().sample("heldout", 30, seed=0)
    train = [t for ts in by_level.values() for t in ts]
    assert not {t.prompt for t in heldout} & {t.prompt for t in train}
    assert all(len({t.prompt for t in ts}) == len(ts) for ts in by_level.values())


def test_world_json_round_trips_and_packs_keep_every_field(tmp_path, by_level):
    task = by_level[3][0]
    world = World.from_json(task.data["world"])
    assert World.from_json(json.loads(json.dumps(world.to_json()))) == world
    path = tmp_path / "ops.jsonl"
    path.write_text("".join(json.dumps(task_line(t)) + "\n" for t in by_level[2][:3] + [task]))
    loaded = load_pack(path)
    assert not loaded.errors
    back = loaded.tasks[-1][1]
    assert back.data == task.data and verifier_for(back) == "world_state"
    assert WorldState().score([back], [record(back.data["reference_calls"])])[0].value == 1.0


@pytest.mark.parametrize("bad", [[], {"orders": {"O-1": {"status": "lost"}}}, {"stock": {"pen": "many"}}])
def test_a_malformed_world_is_a_clear_error(bad):
    with pytest.raises(ValueError, match="ops task's 'world'"):
        World.from_json(bad)


def test_busy_calls_fail_as_scheduled_then_go_through(top):
    busy = top.data["world"]["busy"]
    key = next(k for k, n in busy.items() if not k.startswith(("list_", "get_")))
    ref = top.data["reference_calls"]
    first = next(k for k, c in enumerate(ref) if call_key(c["name"], c["arguments"]) == key)
    outcomes = run(top, ref[:first + busy[key] + 1])
    tries = outcomes[first:]
    assert [o.error_type for o in tries] == ["ServiceBusy"] * busy[key] + [None]
    assert "service busy" in tries[0].content and ref[first] == ref[first + busy[key]]


def test_an_approval_is_needed_above_the_limit_and_pages_must_be_walked(by_level):
    task = next(t for t in by_level[4] if any(c["name"] == "approve" for c in t.data["reference_calls"]))
    ref = task.data["reference_calls"]
    k = next(k for k, c in enumerate(ref) if c["name"] == "approve")
    act = next(c for c in ref[k + 1:] if c["name"] in ("refund", "cancel_order", "cancel_booking"))
    world = World.from_json({**task.data["world"], "busy": {}})
    tools = world.toolbox()
    denied = tools.run(ToolCall("a", act["name"], dict(act["arguments"])))
    assert denied.error_type == "NeedsApproval" and "approve(ref=" in denied.content
    assert tools.run(ToolCall("b", "approve", dict(ref[k]["arguments"]))).ok
    assert tools.run(ToolCall("c", act["name"], dict(act["arguments"]))).ok
    who = next(c["arguments"]["customer"] for c in ref if c["name"] == "list_orders")
    first = tools.run(ToolCall("d", "list_orders", {"customer": who}))
    pages = -(-sum(o["customer"] == who for o in world.orders.values()) // PAGE_SIZE)
    assert f"page 1 of {pages}" in first.content and (("next: list_orders" in first.content) == (pages > 1))
    assert len(first.content.splitlines()) <= PAGE_SIZE + 2


def test_the_reference_reaches_the_gold_state_in_its_stated_calls(by_level):
    for level, tasks in by_level.items():
        lo, hi = CALLS[level]
        for task in tasks:
            ref = task.data["reference_calls"]
            assert len(ref) == task.data["min_calls"] and lo <= len(ref) <= hi, (level, len(ref))
            assert replay(task, ref).state() == gold_state(task)
            assert solve(task.data["world"], task.data["subtasks"]).calls == ref  # the solver is deterministic
            assert all(o.ok or o.error_type == "ServiceBusy" for o in run(task, ref))
    counts = defaultdict(list)
    for level, tasks in by_level.items():
        counts[level] = sorted(t.data["min_calls"] for t in tasks)
    assert max(counts[1]) < min(counts[4]) and sum(counts[3]) / 30 >= 20


# ------------------------------------------------------------------ verifier


def test_the_verifier_grades_the_final_state(top):
    ref = top.data["reference_calls"]
    world = World.from_json(top.data["world"])
    changed = set(top.data["gold_changes"].get("orders", {}))
    bystander = next(k for k, o in world.orders.items() if o["status"] == "delivered" and k not in changed
                     and o["total"] <= world.approval_limit)
    refund = {"name": "refund", "arguments": {"order_id": bystander, "amount": world.orders[bystander]["total"]}}
    reads = [c for call in ref for c in ([call, call] if call["name"].startswith(("list_", "get_")) else [call])]
    table = [
        (record(ref), 1.0, "success"),
        (EpisodeOutcome("done", tool_calls=len(ref), actions=tuple(ref)), 1.0, "success"),
        (record([]), 0.0, "wrong_state"),
        ("<answer>done</answer>", 0.0, "wrong_state"),
        (record([], world=gold_state(top)), 0.0, "wrong_state"),  # a claimed state is not believed
        (record(ref + [refund]), 0.0, "wrong_state"),  # a side effect
        (record(ref[:-1]), 0.0, "wrong_state"),
        ('{"answer": "done", "actions": [{"arguments": {}}]}', 0.0, "malformed"),
    ]
    verifier = WorldState()
    scores = verifier.score([top] * len(table), [r for r, _, _ in table])
    assert [(s.value, s.details["status"]) for s in scores] == [(v, st) for _, v, st in table]
    assert "expected" in scores[5].details["differences"][0]
    [longer] = verifier.score([top], [record(reads)])
    assert longer.details["success"] and 0.5 <= longer.value < 1.0
    assert longer.details["excess_calls"] == len(reads) - len(ref)


@pytest.mark.parametrize("response, status", [
    ('{"answer": "done", "actions": [{"name": "refund", "arguments": "O-1"}]}', "malformed"),
    ('{"answer": "done", "actions": {"name": "refund"}}', "malformed"),
    ('{"answer": "done", "world": 5}', "malformed"),
    ('{"answer": "done", "tool_calls": -1}', "malformed"),
    (json.dumps({"answer": "done", "actions": [{"name": "get_stock", "arguments": {"item": "pen"}}] * 5001}),
     "malformed"),
    (json.dumps({"answer": "done", "actions": [{"name": "__init__", "arguments": {}},
                                               {"name": "refund", "arguments": {"order_id": "O-1", "amount": -5}},
                                               {"name": "restock", "arguments": {"item": "pen", "qty": 0}}]}),
     "wrong_state"),
    ("I refunded every late order.", "wrong_state"),
    ("", "wrong_state"),
])
def test_hostile_records_score_zero(by_level, response, status):
    [score] = WorldState().score([by_level[1][0]], [response])
    assert (score.value, score.details["status"]) == (0.0, status)


def test_a_scripted_agent_episode_is_graded_on_the_world_it_left(by_level):
    task = by_level[2][0]
    ref = task.data["reference_calls"]
    model = ScriptedModel([format_call(c["name"], c["arguments"]) for c in ref] + [format_answer("done")])
    result = run_agent(task.prompt, OpsDomain.toolbox(task), [ModelSlot(model)], AgentConfig(max_steps=200))
    assert result.stop_reason == "answer" and result.world == gold_state(task)
    outcome = result.outcome
    assert list(outcome.actions) == ref and outcome.world == gold_state(task)
    [live] = WorldState().score([task], [outcome])
    [from_file] = WorldState().score([task], [result.to_completion()])
    assert live.value == from_file.value == 1.0 and "world_mismatch" not in live.details


def test_the_demonstration_is_the_reference_episode(top):
    demo = OpsDomain.demonstration(top)
    ref = top.data["reference_calls"]
    assert [m["role"] for m in demo] == ["system", "user"] + ["assistant", "tool"] * len(ref) + ["assistant"]
    busy = sum(top.data["world"]["busy"].values())
    assert sum("service busy" in m["content"] for m in demo if m["role"] == "tool") == busy
    assert demo[-1]["content"] == format_answer("done")


def test_read_only_records_are_unchanged():
    """A domain without state writes the record it always wrote (no actions, no world keys)."""
    assert set(EpisodeOutcome("5", 2, 10).to_json()) == {"answer", "steps", "tokens", "input_tokens",
                                                         "output_tokens", "tool_calls", "tool_errors", "stop_reason"}
    assert EpisodeOutcome.from_json('{"answer": "5"}') == EpisodeOutcome("5")


# ------------------------------------------------------------------ training: budget, config, audit


class ReferenceEngine:
    """An Engine that plays one task's reference: the k-th assistant turn of a prompt is the
    k-th reference call, then the answer."""

    weight_version = 0

    def __init__(self, tok, task):
        self.tok, self.task = tok, task

    def generate(self, prompts, n, sampling):
        from polyrl.models.tokenizer import IM_END
        from polyrl.types import Completion

        out = []
        for i, ids in enumerate(prompts):
            text = self.tok.decode(ids, skip_special_tokens=False)
            k = text.count("<|im_start|>assistant") - 1
            ref = self.task.data["reference_calls"]
            reply = format_call(ref[k]["name"], ref[k]["arguments"]) if k < len(ref) else format_answer("done")
            token_ids = (self.tok.encode(reply) + [self.tok.tok.token_to_id(IM_END)])[:sampling.max_tokens]
            out.append(Completion(i, reply, token_ids, [-0.5] * len(token_ids), "stop", 0))
        return out

    def update_weights(self, weights, version):
        pass


def test_a_run_files_episode_budget_stops_rl_rollouts_on_budget(tmp_path, by_level):
    from polyrl.rollout.dispatch import Rollout
    from polyrl.rollout.groups import score_groups
    from polyrl.train.loop import step_metrics
    from polyrl.train.setup import build_domains
    from tests.helpers import tiny_tokenizer

    import torch

    tok = tiny_tokenizer(tmp_path)
    task = by_level[2][0]
    scores = {}
    for budget in (None, 6000):
        extra = f", episode_tokens: {budget}" if budget else ""
        run_file = f"rl_tasks:\n  - {{domain: ops, weight: 1, max_tokens: 200{extra}}}\n"
        domains = build_domains(load_config_text(run_file))
        spec = domains.specs["ops"]
        assert spec.agent is not None and spec.agent.episode_tokens == budget and spec.agent.max_steps == 150
        rollout = Rollout(ReferenceEngine(tok, task), tok, domains.specs)
        groups = rollout.groups([task], 2, lambda s: s.sampling)
        score_groups(groups, domains.verifiers, domains.specs)
        episodes = groups[0].samples
        scores[budget] = [s.value for s in groups[0].scores]
        metrics = step_metrics(0, groups, torch.zeros(1), {}, {"rollout": 1.0})["domains"]["ops"]
        if budget is None:
            assert [e.result.stop_reason for e in episodes] == ["answer"] * 2 and metrics["budget_stops"] == 0
        else:
            assert [e.result.stop_reason for e in episodes] == ["budget"] * 2 and metrics["budget_stops"] == 2
            for e in episodes:
                spent = sum(s.charged for s in e.result.steps)
                assert spent <= budget and any(ev["event"] == "budget.exhausted" for ev in e.result.events)
                events = [ev["event"] for ev in e.result.events]
                assert any(ev.startswith("context.") for ev in events)  # compressed first
                assert "episode.conclude" in events and e.result.conclusion  # then a stage conclusion
        domains.close()
    assert scores[None] == [1.0, 1.0] and scores[6000] == [0.0, 0.0]


def test_config_takes_an_episode_budget_and_the_domains_steps():
    from polyrl.train.setup import build_domains

    cfg = load_config_text("rl_tasks:\n  - {domain: ops, weight: 1, episode_tokens: 50000, max_steps: 40}\n")
    spec = build_domains(cfg, verifiers=False).specs["ops"]
    assert spec.verifier == "world_state" and spec.agent.episode_tokens == 50000 and spec.agent.max_steps == 40
    assert build_domains(load_config_text("rl_tasks:\n  - {domain: agent, weight: 1}\n"),
                         verifiers=False).specs["agent"].agent.max_steps == 8
    for bad in ("0", "lots"):
        with pytest.raises(ConfigError, match="episode_tokens"):
            load_config_text(f"rl_tasks:\n  - {{domain: ops, weight: 1, episode_tokens: {bad}}}\n")
    with pytest.raises(ConfigError, match="for ops use world_state"):
        load_config_text("rl_tasks:\n  - {domain: ops, weight: 1, reward: answer_verify}\n")


def test_audit_passes_and_every_probe_scores_as_it_must():
    result = audit_domain("ops", 24, seed=0, progress=None)
    assert [(a.id, a.findings) for a in result.tasks if a.status != "pass"] == []
    assert set(result.tally) == {"exploit", "negative_control", "false_negative", "cost"}
    assert all(held == total for held, total in result.tally.values()), result.tally


def test_probes_cover_the_failures_the_task_has(top):
    names = [p.name for p in ops_probes(top)]
    assert "the reference without its retries of busy calls" in names
    assert any(n.startswith("the reference plus a refund") for n in names)


def test_one_training_step_on_ops(tmp_path):
    """The run file's ops entry trains: metrics count budget stops, trajectories carry the world."""
    from polyrl.train.loop import train
    from tests.helpers import random_model_dir

    cfg = load_config_text(f"""
rl_tasks:
  - {{domain: ops, weight: 1.0, max_steps: 3, max_tokens: 8, episode_tokens: 2500, options: {{levels: [1]}}}}
model: {{path: {random_model_dir(tmp_path / "model")}}}
trainer: {{steps: 1, prompts_per_step: 2, group_size: 2, checkpoint_every: 5}}
eval: {{every: 0, heldout_per_domain: 2, samples: 1, greedy: false}}
""")
    result = train(cfg, tmp_path / "run", log=lambda *_: None)
    metrics = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[0])
    assert "budget_stops" in metrics["domains"]["ops"] and result.after["ops"]["tasks"] == 2
    lines = [json.loads(line) for line in (tmp_path / "run" / "trajectories.jsonl").read_text().splitlines()]
    assert len(lines) == 4 and all(line["episode"]["world"] and "success" in line["details"] for line in lines)


def test_polyrl_agent_runs_ops_tasks_graded_on_the_world(tmp_path, capsys):
    from polyrl.cli import main as cli_main
    from tests.helpers import random_model_dir

    run_dir = tmp_path / "run"
    code = cli_main(["agent", "--domain", "ops", "--levels", "1", "--model", str(random_model_dir(tmp_path / "m")),
                     "--max-steps", "2", "--max-tokens", "8", "--budget", "3000", "--run-dir", str(run_dir), "--json"])
    assert code == 0
    summary = json.loads(capsys.readouterr().out)
    [episode] = [json.loads(line) for line in (run_dir / "agent_episodes.jsonl").read_text().splitlines()]
    assert episode["task_id"].startswith("ops-heldout-1-") and episode["world"] and not summary["successes"]
