"""Multi-turn rollouts over the Engine protocol: token layout, loss mask, logprobs, segments."""

import pytest

from polyrl.agent.engine_model import EngineChatModel, render_prompt, training_tokens
from polyrl.agent.loop import AgentConfig, ModelSlot, run_agent
from polyrl.domains.agent import AgentDomain
from polyrl.engine.base import SamplingParams
from polyrl.engine.dense import DenseEngine
from polyrl.models.tokenizer import IM_END
from polyrl.rewards.success_minus_cost import SuccessMinusCost
from polyrl.rollout.episodes import rollout_episodes
from polyrl.types import Completion
from tests.helpers import tiny_model, tiny_tokenizer


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return tiny_tokenizer(tmp_path_factory.mktemp("tok"))


class DemoEngine:
    """An Engine that answers each prompt with the next assistant turn of its task's
    demonstration (found by the user message in the prompt), logprob -0.5 per token."""

    weight_version = 7

    def __init__(self, tok, tasks, wrong_first=False):
        self.tok = tok
        self.turns = {t.prompt: [m["content"] for m in AgentDomain.demonstration(t) if m["role"] == "assistant"]
                      for t in tasks}
        self.calls = []

    def generate(self, prompts, n, sampling):
        assert n == 1
        self.calls.append(len(prompts))
        out = []
        for i, ids in enumerate(prompts):
            text = self.tok.decode(ids, skip_special_tokens=False)
            user = text.split("<|im_start|>user\n", 1)[1].split("\n", 1)[0].split("<|im_end|>")[0]
            k = text.count("<|im_start|>assistant") - 1
            reply = self.turns[user][min(k, len(self.turns[user]) - 1)]
            token_ids = self.tok.encode(reply) + [self.tok.tok.token_to_id(IM_END)]
            finish = "stop" if len(token_ids) <= sampling.max_tokens else "length"
            token_ids = token_ids[:sampling.max_tokens]
            out.append(Completion(i, reply, token_ids, [-0.5] * len(token_ids), finish, self.weight_version))
        return out

    def update_weights(self, weights, version):
        self.weight_version = version


def test_episode_tokens_mask_and_logprobs(tok):
    tasks = AgentDomain().sample("train", 4, seed=0)
    engine = DemoEngine(tok, tasks)
    episodes = rollout_episodes(engine, tok, tasks, 2, SamplingParams(), AgentDomain.toolbox,
                                AgentConfig(max_tokens=96))
    assert [(e.task.id, e.sample) for e in episodes] == [(t.id, j) for t in tasks for j in range(2)]
    assert engine.calls[0] == 8  # lock-step: every live episode in one batched call
    scores = SuccessMinusCost().score([e.task for e in episodes], [e.response for e in episodes])
    assert all(s.details["success"] for s in scores)
    for e in episodes:
        assert not e.rewritten and len(e.token_ids) == len(e.loss_mask) == len(e.logprobs)
        demo = AgentDomain.demonstration(e.task)
        # the sequence is the conversation as the chat template renders it ...
        text = tok.decode(e.token_ids, skip_special_tokens=False)
        assert text == tok.apply_chat_template(demo, add_generation_prompt=False).rstrip("\n")
        # ... with mask 1 exactly on the generated tokens (assistant turns and their <|im_end|>)
        generated = [t for t, m in zip(e.token_ids, e.loss_mask) if m]
        expected = [t for m in demo if m["role"] == "assistant"
                    for t in tok.encode(m["content"]) + [tok.tok.token_to_id(IM_END)]]
        assert generated == expected
        assert all(lp == -0.5 for lp, m in zip(e.logprobs, e.loss_mask) if m)
        assert all(lp == 0.0 for lp, m in zip(e.logprobs, e.loss_mask) if not m)
        masked_text = tok.decode([t for t, m in zip(e.token_ids, e.loss_mask) if not m], skip_special_tokens=False)
        for m in demo:
            if m["role"] == "tool":
                assert m["content"] in masked_text  # tool output is never trained on
        assert e.weight_versions == [7] * len(e.result.steps)
        # SFT lays a demonstration out exactly like the rollout of it
        sft = training_tokens(tok, demo)
        assert (sft.token_ids, sft.loss_mask) == (e.token_ids, e.loss_mask)


def test_rewritten_context_starts_a_new_segment(tok):
    task = next(t for t in AgentDomain().sample("train", 50, seed=1) if t.data["optimal_steps"] >= 4)
    engine = DemoEngine(tok, [task])
    full = len(training_tokens(tok, AgentDomain.demonstration(task)).token_ids)
    window = full - 10  # too small for the whole episode: compression must kick in
    [episode] = rollout_episodes(engine, tok, [task], 1, SamplingParams(), AgentDomain.toolbox,
                                 AgentConfig(max_tokens=64), context_window=window)
    assert episode.rewritten and any(e["event"] == "context.compress" for e in episode.result.events)
    for seg in episode.segments:
        assert len(seg.token_ids) <= window and len(seg.token_ids) == len(seg.loss_mask) == len(seg.logprobs)
    assert episode.generated_tokens == sum(s.reply.usage.output_tokens for s in episode.result.steps)
    with pytest.raises(ValueError, match="segments"):
        episode.token_ids


def test_counts_are_exact_for_the_engine_backend(tok):
    """Reservations use count_tokens; for the engine it must equal the prompt actually sent."""
    task = AgentDomain().sample("train", 1, seed=2)[0]
    engine = DemoEngine(tok, [task])
    session = EngineChatModel(engine, tok, SamplingParams(), context_window=512)
    counted = []
    original = session.prepare

    def prepare(request):
        counted.append(session.count_tokens(request.messages, request.tools))
        ids = original(request)
        assert len(ids) == counted[-1]
        return ids

    session.prepare = prepare
    result = run_agent(task.prompt, AgentDomain.toolbox(task), [ModelSlot(session)])
    assert result.stop_reason == "answer" and len(counted) == len(result.steps)
    assert [s.reply.usage.input_tokens for s in result.steps] == counted


def test_random_policy_episodes_are_well_formed(tok):
    engine = DenseEngine(tiny_model(tok.vocab_size), tok)
    tasks = AgentDomain().sample("heldout", 2, seed=0)
    episodes = rollout_episodes(engine, tok, tasks, 2, SamplingParams(temperature=1.0, seed=5),
                                AgentDomain.toolbox, AgentConfig(max_steps=2, max_tokens=12), episode_budget=600,
                                context_window=512)
    for e in episodes:
        assert e.result.stop_reason in ("answer", "max_steps", "budget")
        for seg in e.segments:
            assert len(seg.token_ids) == len(seg.loss_mask) == len(seg.logprobs)
            assert all(lp < 0 for lp, m in zip(seg.logprobs, seg.loss_mask) if m)
        assert e.generated_tokens == sum(s.reply.usage.output_tokens for s in e.result.steps)
        first = render_prompt(tok, e.result.transcript.messages()[:2])
        assert tok.decode(e.segments[0].token_ids, skip_special_tokens=False).startswith(first)
