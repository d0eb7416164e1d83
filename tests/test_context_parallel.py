"""Context parallelism (models/context_parallel.py, train/context_parallel.py): one sequence
split over P = 2 and 4 gloo processes gives one process's loss and gradients.

Tolerance: atol 1e-5, rtol 0 on the loss and on every parameter gradient (fp32; the
kernels differ only in masking and summation order, observed differences ~1e-8)."""

import os
import socket
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from polyrl.config import TrainerConfig
from polyrl.models.config import ModelConfig
from polyrl.models.context_parallel import SequenceShard, _PrefixAndDiagonal, sharded_hidden
from polyrl.models.rope import RopeScaling
from polyrl.models.transformer import Transformer
from polyrl.rl.loss import policy_loss
from polyrl.train import context_parallel as cp_mod
from polyrl.train.batch import token_logprobs

V = 97
TEMPERATURE, CLIP_LOW, CLIP_HIGH = 0.7, 0.2, 0.28
YARN = RopeScaling("yarn", factor=4.0, original_max_position_embeddings=2048)
# name -> (sequence length, rows, RoPE scaling, layout, attention kernel). "long": the issue's
# 8k sequence; "uneven": a length no P divides (the end is padded), two rows, YaRN-scaled RoPE at
# global positions; "masked": the device-agnostic masked kernel (CPU's default is "split").
CASES = {
    "long": (8192, 1, None, "contiguous", "auto"),
    "long_zigzag": (8192, 1, None, "zigzag", "auto"),
    "uneven": (1001, 2, YARN, "contiguous", "auto"),
    "uneven_zigzag": (1001, 2, YARN, "zigzag", "auto"),
    "masked": (1001, 2, YARN, "contiguous", "masked"),
    "masked_zigzag": (1001, 2, YARN, "zigzag", "masked"),
}


def model(scaling: RopeScaling | None) -> Transformer:
    cfg = ModelConfig(model_type="qwen2", vocab_size=V, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=8192,
                      tie_word_embeddings=True, rope_scaling=scaling)
    m = Transformer(cfg, seed=0)
    with torch.no_grad():  # weights 5x the 0.02 init: attention and logits far from uniform, so the
        for name, w in m.named_parameters():  # loss (not only its gradients) depends on every position
            if "norm" not in name:
                w.mul_(5.0)
    return m


def inputs(T: int, B: int) -> dict:
    """A sequence batch with a masked prompt, a masked row tail, and ratios some of which clip."""
    g = torch.Generator().manual_seed(T)
    ids = torch.randint(0, V, (B, T), generator=g)
    targets = torch.roll(ids, -1, dims=1)
    mask = torch.ones(B, T)
    mask[:, : T // 5] = 0  # the prompt
    mask[:, -1] = 0  # no next token
    mask[-1, -T // 7:] = 0  # one row ends early (its tail padding)
    old_logp = torch.log(torch.full((B, T), 1.0 / V)) + 0.3 * torch.randn(B, T, generator=g)
    adv = torch.linspace(-1.0, 1.0, B) if B > 1 else torch.ones(1)
    return dict(input_ids=ids, targets=targets, old_logp=old_logp, adv=adv, mask=mask)


def one_process(name: str) -> dict:
    T, B, scaling, _, _ = CASES[name]
    m, x = model(scaling), inputs(T, B)
    logits = m.lm_head(m.hidden(x["input_ids"])).float()
    logp = token_logprobs(logits, x["targets"], TEMPERATURE)
    loss, _ = policy_loss(logp, x["old_logp"], x["adv"], x["mask"], CLIP_LOW, CLIP_HIGH)
    loss.backward()
    return {"loss": loss.item(), "grads": {n: p.grad.clone() for n, p in m.named_parameters()}}


def sharded(name: str, cp: cp_mod.ContextParallel) -> dict:
    T, B, scaling, layout, kernel = CASES[name]
    m, x = model(scaling), inputs(T, B)
    cp.layout, cp.kernel = layout, kernel
    mine, loss = cp_mod.policy_loss(cp, m, x["input_ids"], x["targets"], x["old_logp"], x["adv"], x["mask"],
                                    CLIP_LOW, CLIP_HIGH, TEMPERATURE)
    mine.backward()
    cp.all_reduce_grads(m)
    return {"loss": loss, "grads": {n: p.grad.clone() for n, p in m.named_parameters()}}


def worker(rank: int, world_size: int, port: int, out: str) -> None:
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world_size), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    torch.set_num_threads(1)
    # a short timeout: a mismatched collective fails the test instead of hanging it
    dist.init_process_group("gloo", rank=rank, world_size=world_size, timeout=timedelta(seconds=120))
    cp = cp_mod.init_from_env(world_size, "cpu")
    try:
        results = {name: sharded(name, cp) for name in CASES}
        every = [None] * world_size
        dist.all_gather_object(every, {n: (r["loss"], r["grads"]) for n, r in results.items()})
        if rank == 0:
            torch.save({"results": results, "every_rank": every}, out)
    finally:
        cp.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn(world_size: int, out: str) -> dict:
    for attempt in range(3):  # a rank killed by a signal (gloo's rendezvous losing its port) is retried
        try:
            mp.spawn(worker, args=(world_size, free_port(), out), nprocs=world_size, join=True)
            break
        except mp.ProcessExitedException:
            if attempt == 2:
                raise
    return torch.load(out, weights_only=False)


@pytest.fixture(scope="module")
def reference() -> dict:
    by_input: dict = {}  # cases differing only in layout or kernel share one reference
    for name, case in CASES.items():
        if case[:3] not in by_input:
            by_input[case[:3]] = one_process(name)
    return {name: by_input[case[:3]] for name, case in CASES.items()}


@pytest.fixture(scope="module", params=[2, 4], ids=lambda p: f"P{p}")
def processes(request, tmp_path_factory) -> tuple[int, dict]:
    return request.param, spawn(request.param, str(tmp_path_factory.mktemp("cp") / "rank0.pt"))


@pytest.mark.parametrize("name", list(CASES))
def test_sharded_loss_and_gradients_equal_one_process(name, processes, reference):
    P, got = processes
    mine, one = got["results"][name], reference[name]
    assert mine["loss"] == pytest.approx(one["loss"], abs=1e-5, rel=0)
    assert mine["grads"].keys() == one["grads"].keys()
    for k, g in one["grads"].items():
        assert torch.allclose(mine["grads"][k], g, atol=1e-5, rtol=0), (P, name, k, (mine["grads"][k] - g).abs().max())


def test_every_rank_ends_with_the_same_loss_and_gradients(processes):
    P, got = processes
    first = got["every_rank"][0]
    for other in got["every_rank"][1:]:
        for name, (loss, grads) in other.items():
            assert loss == first[name][0]
            assert all(torch.equal(g, first[name][1][k]) for k, g in grads.items())


def test_the_gradients_compared_are_not_trivial(reference):
    """Equality above would hold for zero gradients; every weight's gradient is non-zero."""
    for name, r in reference.items():
        assert all(g.abs().sum() > 0 for g in r["grads"].values()), name


# ---- the shard layout, without processes -------------------------------------------------


@pytest.mark.parametrize("layout", ["contiguous", "zigzag"])
@pytest.mark.parametrize("T,P", [(8192, 4), (1001, 4), (7, 2), (3, 4)])
def test_shards_cover_the_sequence_once_with_the_end_padded(T, P, layout):
    shards = [SequenceShard(r, P, T, layout) for r in range(P)]
    padded = shards[0].padded
    assert padded >= T and padded - T < P * (2 if layout == "zigzag" else 1)
    x = torch.arange(T)[None] + 1
    taken = torch.cat([s.take(x) for s in shards], dim=1)[0]  # (padded,) in rank order
    positions = torch.cat([s.positions() for s in shards], dim=1)[0]
    assert torch.equal(positions.sort().values, torch.arange(padded))  # every position once
    assert torch.equal(taken, torch.where(positions < T, positions + 1, 0))  # each token at its position
    if layout == "zigzag":  # head and tail: every rank the same causal work
        work = [int((s.positions()[0] + 1).sum()) for s in shards]
        assert len(set(work)) == 1, work


@pytest.mark.parametrize("past", [0, 5, 12])
def test_split_attention_is_causal_attention_over_the_prefix(past):
    """The CPU kernel's two blocks merged by log-sum-exp, forward and backward, against one
    masked SDPA call (float64; GQA: 4 query heads on 2 kv heads; past 0 = rank 0)."""
    g = torch.Generator().manual_seed(past)
    S = 7
    q = torch.randn(2, 4, S, 16, generator=g, dtype=torch.float64, requires_grad=True)
    k, v, k_past, v_past = (torch.randn(2, 2, n, 16, generator=g, dtype=torch.float64, requires_grad=True)
                            for n in (S, S, past, past))
    out = _PrefixAndDiagonal.apply(q, k, v, k_past, v_past)
    mask = torch.cat((torch.ones(S, past, dtype=torch.bool), torch.ones(S, S, dtype=torch.bool).tril()), dim=1)
    ref = torch.nn.functional.scaled_dot_product_attention(q, torch.cat((k_past, k), 2), torch.cat((v_past, v), 2),
                                                           attn_mask=mask, enable_gqa=True)
    assert torch.allclose(out, ref, atol=1e-12, rtol=0)
    up = torch.randn(out.shape, generator=g, dtype=torch.float64)
    mine = torch.autograd.grad(out, (q, k, v, k_past, v_past), up)
    theirs = torch.autograd.grad(ref, (q, k, v, k_past, v_past), up)
    for a, b in zip(mine, theirs):
        assert a.shape == b.shape and torch.allclose(a, b, atol=1e-12, rtol=0)


def test_unpinned_dynamic_rope_is_refused():
    """Its base depends on each call's longest position, which differs between ranks."""
    m = model(RopeScaling("dynamic", factor=2.0))
    m.rope.dynamic_length = None
    with pytest.raises(ValueError, match="dynamic NTK"):
        sharded_hidden(m, torch.zeros(1, 4, dtype=torch.long), SequenceShard(0, 2, 8))


def test_a_launch_without_the_environment_is_a_clear_error(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    with pytest.raises(RuntimeError, match=r"trainer.context_parallel: 2 needs a launch with WORLD_SIZE=2"):
        cp_mod.init_from_env(2, "cpu")


def test_the_run_file_field():
    assert TrainerConfig().context_parallel == 1
    assert TrainerConfig(context_parallel=4).context_parallel == 4
    with pytest.raises(ValueError, match="context_parallel"):
        TrainerConfig(context_parallel=0)


def test_polyrl_train_refuses_a_run_that_sets_it(tmp_path, monkeypatch):
    """The training loop does not shard sequences yet: a run asking for it stops at once, in one line."""
    from polyrl.config import load_config_text
    from polyrl.train.loop import train
    from tests.helpers import random_model_dir

    monkeypatch.delenv("WORLD_SIZE", raising=False)
    cfg = load_config_text(f"""
rl_tasks:
  - domain: math
    weight: 1.0
model:
  path: {random_model_dir(tmp_path / "model")}
trainer:
  context_parallel: 2
""")
    with pytest.raises(RuntimeError, match=r"^trainer.context_parallel: 2 is not wired into polyrl train yet") as e:
        train(cfg, tmp_path / "run", log=lambda _: None)
    assert "\n" not in str(e.value)
