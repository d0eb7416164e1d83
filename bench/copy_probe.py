"""Does a model copy in context, and can copying be taught to it?

The copying tasks of polyrl/builtin/copy_demos.py (echo a span, look a name up, find the name
that comes again), on made-up names drawn fresh for the probe. A task counts as right when
every answer token, its end of turn included, is the model's top token given the right ones
before it: exactly what greedy decoding would write.

    .venv/bin/python bench/copy_probe.py                        # builtin:tiny
    .venv/bin/python bench/copy_probe.py --model DIR            # any polyrl model directory
    .venv/bin/python bench/copy_probe.py --copy-share 0.08      # the base recipe with copying tasks
    .venv/bin/python bench/copy_probe.py --finetune 500 --lr 1e-3 [--kinds lookup,repeat]
    .venv/bin/python bench/copy_probe.py --from-scratch --finetune 1500 --lr 3e-3

--copy-share builds (once, cached like builtin:tiny) the tiny model whose recipe adds that share
of copying tasks to its mix, and probes it. --from-scratch keeps only the model's architecture
and tokenizer, with fresh random weights. --finetune then trains the model on copying tasks
alone (64 a step, AdamW, no weight decay) and probes it again every --every steps.
Results: docs/results.md, 2026-12-08.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from polyrl.agent.engine_model import Segment, training_tokens  # noqa: E402
from polyrl.builtin import copy_demos  # noqa: E402
from polyrl.builtin.tiny import TinyRecipe, ensure_tiny_model, pack  # noqa: E402
from polyrl.models.attention import DocumentCausalAttention  # noqa: E402
from polyrl.models.loading import load_policy, resolve_model_dir  # noqa: E402
from polyrl.models.tokenizer import Tokenizer  # noqa: E402
from polyrl.models.transformer import Transformer  # noqa: E402

ROW = 256
"""Tokens a packed row holds; the longest copying task is about 140."""


def segment(tok: Tokenizer, kind: str, rng: random.Random) -> Segment:
    prompt, answer = getattr(copy_demos, kind)(rng)
    return training_tokens(tok, [{"role": "user", "content": prompt}, {"role": "assistant", "content": answer}])


def loss_and_right(model: Transformer, batch: list[Segment]) -> tuple[torch.Tensor, int]:
    """Mean answer-token loss of the batch, and how many of its tasks the model gets whole."""
    ids, targets, mask, positions, documents = pack(batch, ROW)
    logits = model(ids, positions, DocumentCausalAttention(documents, dtype=torch.float32)).float()
    loss = (torch.nn.functional.cross_entropy(logits.transpose(1, 2), targets, reduction="none") * mask).sum() / mask.sum()
    wrong = (logits.argmax(-1) != targets) & (mask > 0)
    right = sum(not bool(wrong[documents == d].any()) for d in range(len(batch)))
    return loss, right


def probe(model: Transformer, tok: Tokenizer, n: int) -> dict[str, float]:
    rng = random.Random("copy-probe")  # the same held-out tasks at every probe
    model.eval()
    scores = {}
    with torch.no_grad():
        for kind in copy_demos.KINDS:
            tasks = [segment(tok, kind, rng) for _ in range(n)]
            scores[kind] = sum(loss_and_right(model, tasks[i:i + 32])[1] for i in range(0, n, 32)) / n
    model.train()
    return scores


def show(label: str, scores: dict[str, float]) -> None:
    print(f"{label:>14}  " + "  ".join(f"{k} {v:6.1%}" for k, v in scores.items()), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="builtin:tiny")
    ap.add_argument("--copy-share", type=float, default=None,
                    help="probe the tiny model built with this share of copying tasks added to its mix")
    ap.add_argument("--from-scratch", action="store_true",
                    help="the model's architecture and tokenizer with fresh random weights")
    ap.add_argument("--finetune", type=int, default=0, metavar="STEPS")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--kinds", default=",".join(copy_demos.KINDS))
    ap.add_argument("--every", type=int, default=100)
    ap.add_argument("-n", type=int, default=150, help="held-out tasks per kind")
    args = ap.parse_args()
    kinds = args.kinds.split(",")
    if set(kinds) - set(copy_demos.KINDS):
        ap.error(f"--kinds: choose from {','.join(copy_demos.KINDS)}")

    if args.copy_share is not None:
        base = TinyRecipe()
        model_dir = ensure_tiny_model(replace(base, mix=base.mix + (("copy", args.copy_share),)))
    else:
        model_dir = resolve_model_dir(args.model)
    print(f"model: {model_dir}")
    model, tok = load_policy(model_dir, "float32")
    if args.from_scratch:
        model = Transformer(model.cfg, seed=0)
    show("before", probe(model, tok, args.n))

    torch.manual_seed(0)
    rng = random.Random("copy-finetune")
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.0)
    start = time.perf_counter()
    for step in range(1, args.finetune + 1):
        loss, _ = loss_and_right(model, [segment(tok, rng.choice(kinds), rng) for _ in range(64)])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % args.every == 0 or step == args.finetune:
            show(f"step {step}", probe(model, tok, args.n))
            print(f"{'':>14}  loss {loss.item():.3f}, {time.perf_counter() - start:.0f} s", flush=True)


if __name__ == "__main__":
    main()
