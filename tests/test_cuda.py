"""The trainer on a GPU (`trainer.device: cuda`): what a CUDA machine must show, checked by
bench/gpu_check.sh there.

Every test runs once per device: on "cpu" everywhere (so the test itself runs wherever the
suite does), and on "cuda" only where torch sees a GPU (skipped elsewhere, never faked):
- one update on the device gives float32 CPU's loss and gradients, within bfloat16
  autocast's error on CUDA;
- a run on the device trains, rolls out each step on the weights of the step before (the
  engine is synced from the device's policy), writes checkpoints that load on the CPU, and
  resumes to the end.
"""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import pytest
import torch

from polyrl.config import TrainerConfig, load_config_text
from polyrl.models.hf_io import load_pretrained
from polyrl.train.device import resolve_device
from polyrl.train.distributed import SingleProcess
from polyrl.train.loop import train
from polyrl.train.update import update
from tests.helpers import random_model_dir
from tests.test_distributed import tied_model
from tests.test_packing import mixed_batch
from tests.test_train import parity_reward  # noqa: F401  (a fixture)

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(),
                                                                 reason="torch sees no CUDA device"))]
TOLERANCE = {"cpu": 1e-6, "cuda": 5e-2}
"""Relative error allowed against float32 on the CPU: none on the CPU (the same float32 math);
on CUDA the forward runs under bfloat16 autocast (8 bits of mantissa)."""


def one_update(device: str) -> tuple[dict, dict[str, torch.Tensor]]:
    """One update() of a fresh policy on `device`: its stats and its gradients, on the host."""
    cfg = SimpleNamespace(seed=0, engine=SimpleNamespace(temperature=0.7),
                          trainer=TrainerConfig.model_construct(ppo_epochs=1, minibatches=1, micro_batch_tokens=40,
                                                                shared_prefix=True, max_grad_norm=1e6))
    policy = tied_model().to(resolve_device(device))
    optimizer = torch.optim.AdamW(policy.parameters(), lr=1e-3)
    stats = update(policy, None, optimizer, mixed_batch(seed=1), cfg, step=0, dp=SingleProcess())
    return stats, {n: p.grad.detach().float().cpu() for n, p in policy.named_parameters()}


@pytest.mark.parametrize("device", DEVICES)
def test_an_update_on_the_device_matches_float32_on_the_cpu(device):
    ref_stats, ref_grads = one_update("cpu")
    stats, grads = one_update(device)
    tol = TOLERANCE[device]
    assert math.isfinite(stats["loss"]) and stats["loss"] == pytest.approx(ref_stats["loss"], rel=tol, abs=tol)
    assert grads.keys() == ref_grads.keys()
    for name, g in grads.items():
        scale = ref_grads[name].norm().item()
        assert (g - ref_grads[name]).norm().item() <= tol * max(scale, 1e-6), name


def run_file(model_dir, device: str, steps: int):
    return load_config_text(f"""
seed: 3
rl_tasks:
  - {{domain: math, reward: length_parity, weight: 1.0}}
model: {{path: {model_dir}}}
engine: {{max_tokens: 12}}
trainer: {{steps: {steps}, prompts_per_step: 4, group_size: 4, lr: 1.0e-3, kl_coef: 0.01, overlong: none,
           checkpoint_every: 2, device: {device}}}
eval: {{every: 2, heldout_per_domain: 4, samples: 2}}
""")


@pytest.mark.parametrize("device", DEVICES)
def test_a_run_on_the_device_trains_syncs_checkpoints_and_resumes(tmp_path, parity_reward, device):  # noqa: F811
    model_dir = random_model_dir(tmp_path / "model")
    run = tmp_path / "run"
    first = train(run_file(model_dir, device, steps=4), run, log=lambda *_: None, stop_after=2)
    assert first.steps_done == 2
    second = train(run_file(model_dir, device, steps=4), run, resume=True, log=lambda *_: None)
    assert second.steps_done == 4
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [0, 1, 2, 3]
    for m in metrics:
        d = m["domains"]["math"]
        assert math.isfinite(d["reward"]) and d["kl"] is not None and math.isfinite(d["kl"]) and d["entropy"] > 0
    # each step's rollouts ran on the weights the step before left (version = step)
    versions = {json.loads(line)["weight_version"] for line in (run / "trajectories.jsonl").read_text().splitlines()}
    assert versions == {0, 1, 2, 3}
    # the checkpoints are host files: they load on the CPU, and training changed them
    before, _ = load_pretrained(model_dir)
    after, _ = load_pretrained(run / "checkpoints" / "final")
    assert all(p.device.type == "cpu" for p in after.parameters())
    assert any(not torch.equal(a, b) for a, b in zip(before.state_dict().values(), after.state_dict().values()))
    assert json.loads((run / "eval" / "after.json").read_text())["math"]["tasks"] == 4
