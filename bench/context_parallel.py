"""Context parallelism, measured: peak memory per process and step time for P = 1, 2, 4.

    python bench/context_parallel.py [--lengths 8192,16384] [--ps 1,2,4] [--layouts zigzag,contiguous]
                                     [--steps 2]
                                     [--hidden 128] [--layers 2] [--heads 8] [--kv-heads 2]

One step is the forward of one sequence, the token-level policy loss, the backward and
(P > 1) the all-reduce of the gradients: train/context_parallel.py's `policy_loss` and
`all_reduce_grads`. P = 1 is the ordinary one-process forward (`Transformer.hidden`, the
causal SDPA kernel), the path context parallelism replaces. Each (P, length) runs in fresh
processes (torch.multiprocessing spawn, gloo on CPU, one torch thread each), so every
process's peak is its own.

Memory: `resource.getrusage(RUSAGE_SELF).ru_maxrss`, the high-water mark of the process's
resident set. Printed per configuration, as the largest over the ranks: the peak, and
"step" = the peak minus the resident set just before the first step (model, inputs and
imports excluded); then each rank's "step" in rank order (the last rank holds the most
keys and values). Limits: RSS counts what the allocator holds, not what tensors use
(freed blocks kept by malloc still count, pages never touched do not); the peak is over
the whole run, warm-up included; gloo's buffers count. On CUDA one would read
torch.cuda.max_memory_allocated instead (not done: no GPU here).

Time: seconds per step on rank 0 (the mean of --steps steps after one warm-up, each
started after a barrier). With fewer cores than processes the ranks share cores and the
time says nothing about speed-up; the memory column is the point of this script.

Not covered: GPUs and nccl, bf16, optimizer state, models beyond the given shape.
"""

from __future__ import annotations

import argparse
import os
import resource
import socket
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.multiprocessing as mp

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def rss_mb() -> float:
    """Current resident set (Linux /proc), MB."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports kB


def build(args, length: int):
    from polyrl.models.config import ModelConfig
    from polyrl.models.transformer import Transformer

    cfg = ModelConfig(model_type="qwen2", vocab_size=args.vocab, hidden_size=args.hidden,
                      intermediate_size=args.hidden * 3, num_hidden_layers=args.layers,
                      num_attention_heads=args.heads, num_key_value_heads=args.kv_heads,
                      max_position_embeddings=max(length, 2048), tie_word_embeddings=True)
    model = Transformer(cfg, seed=0)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, args.vocab, (1, length), generator=g)
    x = dict(input_ids=ids, targets=torch.roll(ids, -1, dims=1), mask=torch.ones(1, length),
             old_logp=torch.full((1, length), -float(torch.log(torch.tensor(args.vocab)))), adv=torch.ones(1))
    return model, x


def one_process_step(model, x) -> float:
    from polyrl.rl.loss import policy_loss
    from polyrl.train.batch import token_logprobs

    model.zero_grad(set_to_none=True)
    logp = token_logprobs(model.lm_head(model.hidden(x["input_ids"])).float(), x["targets"], 1.0)
    loss, _ = policy_loss(logp, x["old_logp"], x["adv"], x["mask"], 0.2, 0.28)
    loss.backward()
    return loss.item()


def worker(rank: int, world_size: int, port: int, args, length: int, layout: str, out: str) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    cp = None
    if world_size > 1:
        from polyrl.train import context_parallel as cp_mod

        os.environ.update(RANK=str(rank), WORLD_SIZE=str(world_size), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        cp = cp_mod.init_from_env(world_size, "cpu", layout)
    model, x = build(args, length)

    def step() -> None:
        if cp is None:
            one_process_step(model, x)
            return
        model.zero_grad(set_to_none=True)
        mine, _ = cp_mod.policy_loss(cp, model, x["input_ids"], x["targets"], x["old_logp"], x["adv"], x["mask"],
                                     0.2, 0.28, 1.0)
        mine.backward()
        cp.all_reduce_grads(model)

    before = rss_mb()
    times = []
    for i in range(args.steps + 1):
        if cp is not None:
            dist.barrier()
        t = time.perf_counter()
        step()
        if i:  # the first step is warm-up
            times.append(time.perf_counter() - t)
    mine = {"rank": rank, "peak": peak_mb(), "step_mem": peak_mb() - before, "seconds": sum(times) / len(times)}
    if cp is None:
        torch.save([mine], out)
        return
    every: list = [None] * world_size
    dist.all_gather_object(every, mine)
    if rank == 0:
        torch.save(every, out)
    cp.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def measure(args, P: int, length: int, layout: str) -> list[dict]:
    out = tempfile.mktemp(suffix=".pt")
    mp.spawn(worker, args=(P, free_port(), args, length, layout, out), nprocs=P, join=True)
    ranks = torch.load(out, weights_only=False)
    os.unlink(out)
    return ranks


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--lengths", default="8192,16384")
    p.add_argument("--ps", default="1,2,4")
    p.add_argument("--layouts", default="zigzag,contiguous")
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--vocab", type=int, default=512)
    args = p.parse_args()
    print(f"model: hidden {args.hidden}, {args.layers} layers, {args.heads} heads ({args.kv_heads} kv), "
          f"vocab {args.vocab}, fp32; CPU, gloo, 1 torch thread per process, {os.cpu_count()} cores")
    print(f"{'T':>6} {'P':>2} {'layout':>10} {'peak MB/rank':>13} {'step MB/rank':>13} {'step vs P=1':>12} "
          f"{'step MB, each rank':>22} {'s/step':>7}")
    for length in (int(t) for t in args.lengths.split(",")):
        base = None
        for P in (int(x) for x in args.ps.split(",")):
            for layout in (["-"] if P == 1 else args.layouts.split(",")):
                ranks = measure(args, P, length, layout)
                peak = max(r["peak"] for r in ranks)
                step = max(r["step_mem"] for r in ranks)
                base = step if P == 1 else base
                ratio = f"{step / base:.2f}x" if base else "-"
                each = " ".join(f"{r['step_mem']:.0f}" for r in ranks)
                print(f"{length:>6} {P:>2} {layout:>10} {peak:>13.0f} {step:>13.0f} {ratio:>12} {each:>22} "
                      f"{ranks[0]['seconds']:>7.2f}", flush=True)


if __name__ == "__main__":
    main()
