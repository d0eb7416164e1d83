"""The trainer's placement (train/device.py) and data-parallel update (train/distributed.py):
two processes over gloo on CPU give one process's loss, gradients and new weights."""

import os
import socket
from datetime import timedelta
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from polyrl.config import TrainerConfig
from polyrl.models.config import ModelConfig
from polyrl.models.transformer import Transformer
from polyrl.train.device import autocast, host_state_dict, resolve_device, to_device
from polyrl.train.distributed import SingleProcess, init_from_env
from polyrl.train.update import update
from tests.test_packing import V, mixed_batch

# name -> (trainer settings, KL coefficient). "one_step": one minibatch, gradients compared
# before any clipping; "minibatches": 2 epochs x 5 minibatches in pieces of at most 40
# tokens (ranks make different numbers of passes), shared prefixes in the one-process run,
# a reference model, and the decoupled-PPO proximal pass (max_staleness 1); "row_each":
# minibatches of one row, so one rank has no rows (and one minibatch's only row is masked).
SCENARIOS = {
    "one_step": (dict(ppo_epochs=1, minibatches=1, micro_batch_tokens=None, shared_prefix=False,
                      max_grad_norm=1e6), 0.0),
    "minibatches": (dict(ppo_epochs=2, minibatches=5, micro_batch_tokens=40, shared_prefix=True,
                         max_grad_norm=1.0, max_staleness=1), 0.05),
    "row_each": (dict(ppo_epochs=1, minibatches=20, micro_batch_tokens=None, shared_prefix=True,
                      max_grad_norm=1.0), 0.0),
}


def tied_model(seed=0) -> Transformer:
    """Tied embeddings: FSDP must keep lm_head and embed_tokens one parameter."""
    cfg = ModelConfig(model_type="qwen2", vocab_size=V, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)
    return Transformer(cfg, seed=seed).eval()


def run_scenario(name: str, dp) -> dict:
    """One update() of a fresh policy; the full gradients it leaves and its new weights."""
    settings, kl = SCENARIOS[name]
    cfg = SimpleNamespace(seed=0, engine=SimpleNamespace(temperature=0.7),
                          trainer=TrainerConfig.model_construct(**settings))
    batch = mixed_batch(seed=1)
    batch.kl_coef[:] = kl
    policy = dp.wrap(tied_model())
    ref = dp.wrap(tied_model(seed=1).requires_grad_(False)) if kl else None
    optimizer = torch.optim.AdamW(policy.parameters(), lr=1e-3)
    stats = update(policy, ref, optimizer, batch, cfg, step=0, dp=dp)
    grads = {n: full(p.grad) for n, p in policy.named_parameters()}
    return {"stats": stats, "grads": grads, "weights": dp.engine_weights(policy)}


def full(t):
    from torch.distributed.tensor import DTensor

    return t.full_tensor() if isinstance(t, DTensor) else t.detach().clone()


def worker(rank: int, world_size: int, port: int, out: str) -> None:
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world_size), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    torch.set_num_threads(1)
    # A group of our own with a short timeout, so a mismatched collective fails the test
    # instead of hanging it; init_from_env then joins it.
    dist.init_process_group("gloo", rank=rank, world_size=world_size, timeout=timedelta(seconds=60))
    dp = init_from_env("cpu")
    try:
        results = {name: run_scenario(name, dp) for name in SCENARIOS}
        # A full state dict given on rank 0 loads into a sharded model (resume).
        fresh = dp.wrap(tied_model(seed=5))
        dp.load_full_state_dict(fresh, results["one_step"]["weights"] if rank == 0 else {})
        results["reloaded"] = dp.engine_weights(fresh)
        if rank == 0:
            torch.save(results, out)
        else:
            assert not results["reloaded"] and all(not results[n]["weights"] for n in SCENARIOS), \
                "only rank 0 gets the engine's weights"
        # Every rank reports the group's statistics, not its own part's.
        ranks_stats = dp.gather({n: results[n]["stats"] for n in SCENARIOS})
        assert all(s == ranks_stats[0] for s in ranks_stats), ranks_stats
    finally:
        dp.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def two_processes(tmp_path_factory) -> dict:
    out = str(tmp_path_factory.mktemp("dist") / "rank0.pt")
    for attempt in range(3):  # a rank killed by a signal (gloo's rendezvous losing its port) is retried
        try:
            mp.spawn(worker, args=(2, free_port(), out), nprocs=2, join=True)
            break
        except mp.ProcessExitedException:
            if attempt == 2:
                raise
    return torch.load(out, weights_only=False)


@pytest.fixture(scope="module")
def one_process() -> dict:
    return {name: run_scenario(name, SingleProcess()) for name in SCENARIOS}


def assert_close_dicts(a: dict, b: dict, what: str, atol: float = 1e-5) -> None:
    assert a.keys() == b.keys(), (what, sorted(a.keys() ^ b.keys()))
    for k, x in a.items():
        assert torch.allclose(x, b[k], atol=atol, rtol=0), (what, k, (x - b[k]).abs().max())


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_two_processes_give_one_process_loss_and_gradients(name, two_processes, one_process):
    two, one = two_processes[name], one_process[name]
    assert two["stats"]["loss"] == pytest.approx(one["stats"]["loss"], abs=1e-5)
    assert two["stats"]["grad_norm"] == pytest.approx(one["stats"]["grad_norm"], abs=1e-5)
    assert_close_dicts(two["grads"], one["grads"], "gradient")
    for d, per_domain in one["stats"]["domains"].items():
        for k, v in per_domain.items():
            assert two["stats"]["domains"][d][k] == pytest.approx(v, abs=1e-5), (d, k)
    assert two["stats"]["ratio_mean"] == pytest.approx(one["stats"]["ratio_mean"], abs=1e-5)
    assert two["stats"]["clip_frac"] == pytest.approx(one["stats"]["clip_frac"], abs=1e-5)
    for k in ("iw", "mismatch_kl"):
        assert two["stats"].get(k) == pytest.approx(one["stats"].get(k), abs=1e-5), k


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_two_processes_step_to_one_process_weights(name, two_processes, one_process):
    two, one = two_processes[name]["weights"], one_process[name]["weights"]
    assert_close_dicts(two, one, "weight")
    assert all(t.device.type == "cpu" for t in two.values())
    # The engine's copy_weights_ needs every state_dict name, the tied lm_head included.
    assert set(two) == set(tied_model().state_dict())


def test_one_step_gradient_is_not_trivial(one_process):
    """The comparisons above would pass on zero gradients; they are not."""
    g = one_process["one_step"]["grads"]
    assert all(v.abs().sum() > 0 for k, v in g.items() if "norm" not in k)


def test_a_full_state_dict_loads_into_the_sharded_model(two_processes):
    assert_close_dicts(two_processes["reloaded"], two_processes["one_step"]["weights"], "reloaded", atol=0)


# ---- placement ----------------------------------------------------------------------------


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only behaviour")
def test_auto_is_cpu_without_a_gpu_and_cuda_is_a_clear_error():
    assert resolve_device("auto") == torch.device("cpu")
    assert resolve_device("cpu") == torch.device("cpu")
    with pytest.raises(RuntimeError, match="trainer.device: cuda was requested but torch sees no CUDA device"):
        resolve_device("cuda")
    with pytest.raises(ValueError, match="must be one of auto, cpu, cuda"):
        resolve_device("gpu")


def test_cpu_placement_changes_nothing():
    batch = mixed_batch(seed=1)
    assert to_device(batch, torch.device("cpu")) is batch
    model = tied_model()
    x = torch.randint(0, V, (2, 5))
    with autocast(torch.device("cpu")):
        logits = model(x)
    assert torch.equal(logits, model(x))
    state = host_state_dict(model)
    assert all(state[k].data_ptr() == v.data_ptr() for k, v in model.state_dict().items())


def test_one_process_without_the_environment(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    dp = init_from_env("cpu")
    assert isinstance(dp, SingleProcess) and dp.world_size == 1
    monkeypatch.setenv("WORLD_SIZE", "2")
    for k in ("RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(k, raising=False)
    with pytest.raises(RuntimeError, match="RANK, MASTER_ADDR, MASTER_PORT not set"):
        init_from_env("cpu")


def test_the_run_file_names_the_device():
    assert TrainerConfig().device == "auto"
    with pytest.raises(ValueError, match="device"):
        TrainerConfig(device="gpu")
