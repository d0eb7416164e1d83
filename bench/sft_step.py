"""A step of the base model's supervised fine-tuning, four ways.

    python bench/sft_step.py [--steps 40] [--repeats 3] [--arms recipe,buckets,compiled,dp2]

The tiny base model's build (polyrl/builtin/tiny.py) is its SFT steps, each on 64
demonstrations packed into rows of 256 tokens. Issue 22 asks for the whole build in 5
minutes; this measures three levers against the recipe's own step, on the recipe's
demonstrations (`sft_examples(TinyRecipe(), steps x 64)`: the recipe's mix), tokenized by a
tokenizer trained on them as the build trains its own:

- "recipe": the build's step as it is: one packed batch of rows of 256, attention in float32
  under a (T, T) document mask, products in bfloat16 where the CPU multiplies them natively;
- "buckets": demonstrations of at most 128 tokens packed into rows of 128 and the others
  into rows of 256, two forward passes and one backward. The attention mask costs a row's
  length per token, and 74% of the tokens are in demonstrations of at most 128;
- "compiled": the recipe's step through `torch.compile(model)`, compiled afresh each repeat
  into an empty inductor cache directory (the batches' row counts vary, so it compiles more
  than once). What the process keeps in memory still speeds up later repeats' compiles, so
  the first repeat's overhead is the one a first build pays;
- "dp2": two processes of one torch thread each (torch.multiprocessing, gloo), each packing
  half of every batch (halves of about equal tokens), the loss normalized by the whole
  batch's answer tokens and the gradients summed across the two before the recipe's update:
  the same update as the recipe's, up to the order of float sums. Its overhead includes the
  processes' start.

Every arm starts from the same initial weights and sees the same batches; a repeat runs the
arms one after another. Per arm: the median seconds a step after `--warmup` steps, and its
overhead, the seconds of all steps less that median times their number (a compile, mostly);
each the median over repeats. The last lines project each arm to the recipe's full step
count: overhead plus median times steps. Not covered: the data preparation and the
tokenizer (the same for every arm), other machines.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch

from polyrl.agent.engine_model import Segment, training_tokens
from polyrl.builtin.tiny import TinyRecipe, native_bf16, pack, sft_examples
from polyrl.models.attention import DocumentCausalAttention
from polyrl.models.config import ModelConfig
from polyrl.models.tokenizer import IM_END, IM_START, Tokenizer, save_tokenizer, train_tiny_tokenizer
from polyrl.models.transformer import Transformer

ROW = 256
SHORT_ROW = 128


def demonstrations(recipe: TinyRecipe, steps: int) -> tuple[list[Segment], int, int]:
    """The first steps x batch_size demonstrations as token segments, the vocabulary size and eos id."""
    examples = sft_examples(recipe, steps * recipe.batch_size)
    corpus = ["".join(f"{IM_START}{m['role']}\n{m['content']}{IM_END}\n" for m in messages) for messages in examples]
    out = Path(tempfile.mkdtemp(prefix="polyrl-sft-step-"))
    save_tokenizer(train_tiny_tokenizer(corpus, recipe.vocab_size), out)
    tok = Tokenizer.from_dir(out)
    return [training_tokens(tok, messages) for messages in examples], tok.vocab_size, tok.eos_token_id


def model_config(recipe: TinyRecipe, vocab: int, eos: int) -> ModelConfig:
    return ModelConfig(model_type="llama", vocab_size=vocab, hidden_size=recipe.hidden_size,
                       intermediate_size=recipe.intermediate_size, num_hidden_layers=recipe.num_layers,
                       num_attention_heads=recipe.num_heads, num_key_value_heads=recipe.num_kv_heads,
                       max_position_embeddings=512, rms_norm_eps=1e-5, tie_word_embeddings=True,
                       eos_token_id=eos, pad_token_id=0)


def row_groups(batch: list[Segment], arm: str) -> list[tuple[torch.Tensor, ...]]:
    """The batch packed as the arm packs it: one group of rows, or a short and a long one."""
    if arm != "buckets":
        return [pack(batch, ROW)]
    short = [s for s in batch if len(s.token_ids) <= SHORT_ROW]
    long = [s for s in batch if len(s.token_ids) > SHORT_ROW]
    return [pack(group, row) for group, row in ((short, SHORT_ROW), (long, ROW)) if group]


def run_arm(arm: str, cfg: ModelConfig, batches: list[list[Segment]], bf16: bool) -> list[float]:
    """Seconds of each step of `arm`, from the same initial weights."""
    torch._dynamo.reset()
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="polyrl-inductor-")  # a cold compile
    model = Transformer(cfg, seed=0)
    model.train()
    forward = torch.compile(model) if arm == "compiled" else model
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, betas=(0.9, 0.95), weight_decay=0.1)
    seconds = []
    for batch in batches:
        start = time.perf_counter()
        groups = row_groups(batch, arm)
        total = sum(float(g[2].sum()) for g in groups)
        loss = torch.zeros(())
        for ids, targets, mask, positions, documents in groups:
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                logits = forward(ids, positions, DocumentCausalAttention(documents, dtype=torch.float32)).float()
            per_token = torch.nn.functional.cross_entropy(logits.transpose(1, 2), targets, reduction="none")
            loss = loss + (per_token * mask).sum() / total
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        seconds.append(time.perf_counter() - start)
    return seconds


def halves(batch: list[Segment]) -> tuple[list[Segment], list[Segment]]:
    """The batch split in two of about equal tokens: longest first, each to the lighter half."""
    parts: tuple[list[Segment], list[Segment]] = ([], [])
    sizes = [0, 0]
    for seg in sorted(batch, key=lambda s: -len(s.token_ids)):
        k = sizes.index(min(sizes))
        parts[k].append(seg)
        sizes[k] += len(seg.token_ids)
    return parts


def _dp_worker(rank: int, port: int, cfg: ModelConfig, batches: list[list[Segment]], bf16: bool, out: str) -> None:
    """One of two data-parallel ranks, one thread each: its half of every batch, the loss over
    the whole batch's tokens, gradients summed across ranks (gloo) before the same update."""
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    model = Transformer(cfg, seed=0)
    model.train()
    params = list(model.parameters())
    opt = torch.optim.AdamW(params, lr=3e-3, betas=(0.9, 0.95), weight_decay=0.1)
    seconds = []
    for batch in batches:
        start = time.perf_counter()
        mine = halves(batch)[rank]
        total = float(sum(sum(s.loss_mask[1:]) for s in batch))
        ids, targets, mask, positions, documents = pack(mine, ROW)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            logits = model(ids, positions, DocumentCausalAttention(documents, dtype=torch.float32)).float()
        loss = (torch.nn.functional.cross_entropy(logits.transpose(1, 2), targets, reduction="none") * mask).sum() / total
        opt.zero_grad(set_to_none=False)
        loss.backward()
        flat = torch.cat([p.grad.reshape(-1) for p in params])
        dist.all_reduce(flat)
        at = 0
        for p in params:
            p.grad.copy_(flat[at:at + p.numel()].view_as(p))
            at += p.numel()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        seconds.append(time.perf_counter() - start)
    if rank == 0:
        Path(out).write_text(" ".join(map(str, seconds)))
    dist.destroy_process_group()


def run_dp(cfg: ModelConfig, batches: list[list[Segment]], bf16: bool) -> list[float]:
    """Seconds of each step of two one-thread data-parallel processes (rank 0's clock)."""
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = tempfile.mktemp(prefix="polyrl-dp-")
    start = time.perf_counter()
    mp.spawn(_dp_worker, args=(port, cfg, batches, bf16, out), nprocs=2)
    wall = time.perf_counter() - start
    seconds = [float(x) for x in Path(out).read_text().split()]
    seconds[0] += wall - sum(seconds)  # the processes' start and end count as overhead
    return seconds


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=40, help="SFT steps per arm and repeat")
    p.add_argument("--warmup", type=int, default=8, help="steps left out of each arm's median")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--arms", default="recipe,buckets,compiled,dp2")
    args = p.parse_args()
    if args.steps <= args.warmup:
        raise SystemExit(f"--steps ({args.steps}) must exceed --warmup ({args.warmup})")
    recipe = TinyRecipe()
    segments, vocab, eos = demonstrations(recipe, args.steps)
    batches = [segments[k:k + recipe.batch_size] for k in range(0, len(segments), recipe.batch_size)]
    cfg, bf16 = model_config(recipe, vocab, eos), recipe.bf16_products and native_bf16()
    print(f"{len(batches)} steps of {recipe.batch_size} demonstrations, "
          f"products in {'bfloat16' if bf16 else 'float32'}, torch threads {torch.get_num_threads()}")
    arms = tuple(args.arms.split(","))
    per_step: dict[str, list[float]] = {arm: [] for arm in arms}
    overhead: dict[str, list[float]] = {arm: [] for arm in arms}
    for repeat in range(args.repeats):
        for arm in arms:
            seconds = run_dp(cfg, batches, bf16) if arm == "dp2" else run_arm(arm, cfg, batches, bf16)
            median = statistics.median(seconds[args.warmup:])
            per_step[arm].append(median)
            overhead[arm].append(sum(seconds) - median * len(seconds))
            print(f"repeat {repeat} {arm:8s} {median:.4f} s a step, overhead {overhead[arm][-1]:5.1f} s "
                  f"(first step {seconds[0]:.1f} s)", flush=True)
    base = statistics.median(per_step["recipe"])
    print(f"\nmedians over {args.repeats} repeats; projected to the recipe's {recipe.steps} steps")
    for arm in arms:
        m, extra = statistics.median(per_step[arm]), statistics.median(overhead[arm])
        print(f"{arm:8s} {m:.4f} s a step ({base / m:.2f}x the recipe's step), overhead {extra:4.1f} s; "
              f"SFT {m * recipe.steps + extra:4.0f} s")


if __name__ == "__main__":
    main()
