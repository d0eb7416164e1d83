"""The built-in tiny base model: built by polyrl itself, cached, rebuilt when its recipe changes.

Recipe. A byte-level BPE tokenizer (digits kept single) is trained on rendered
conversations of the built-in domains' TRAIN splits (math and code); then a small
Llama-family model is trained from scratch by supervised fine-tuning on demonstrations,
with loss on the assistant turn only. Held-out tasks are never seen.

Imperfect by design, so RL has headroom: the demonstrations come from a *noisy
teacher*. With probability `slip_rate` a demonstration is wrong by a small slip (math:
a result off by ±1, ±2, ±10; code: a constant off by one, or a neighbouring operation
such as max for sum), and with probability `format_rate` it has a format slip (math: no
final `\\boxed{}`, which answer_verify then cannot find; code: the `return` left out, so
the function returns None). The model learns
the teacher's habits along with the task, exactly the situation RLVR is for: the reward
tells right from wrong where the demonstrations did not. Both rates and everything else
that shapes the model live in `TinyRecipe`; its hash, together with the source of the
data generators, names the cache entry.

Out of scope: pretraining on natural text; the model only knows the built-in domains.
"""

from __future__ import annotations

import fcntl
import hashlib
import inspect
import json
import math
import os
import random
import re
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import torch

from polyrl.models.config import ModelConfig
from polyrl.models.hf_io import save_pretrained
from polyrl.models.tokenizer import IM_END, IM_START, Tokenizer, save_tokenizer, train_tiny_tokenizer
from polyrl.models.transformer import Transformer
from polyrl.types import Task


@dataclass(frozen=True)
class TinyRecipe:
    seed: int = 0
    vocab_size: int = 512
    hidden_size: int = 128
    num_layers: int = 4
    num_heads: int = 4
    num_kv_heads: int = 2
    intermediate_size: int = 384
    steps: int = 1000
    """Optimizer steps of SFT."""
    batch_size: int = 64
    lr: float = 3e-3
    warmup: int = 50
    slip_rate: float = 0.2
    """Share of demonstrations whose final result is wrong by a small slip."""
    format_rate: float = 0.25
    """Share of demonstrations that omit the final \\boxed{} answer."""
    math_levels: tuple[int, ...] = (1, 2, 3, 4)
    code_levels: tuple[int, ...] = (1, 2, 3, 4)
    code_share: float = 0.5
    """Share of demonstrations from the code domain; the rest are math."""


def cache_dir() -> Path:
    root = os.environ.get("POLYRL_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "polyrl")
    return Path(root)


def recipe_hash(recipe: TinyRecipe) -> str:
    from polyrl.domains import code as code_domain
    from polyrl.domains import math as math_domain

    h = hashlib.sha256(json.dumps(asdict(recipe), sort_keys=True).encode())
    for module in (math_domain, code_domain, inspect.getmodule(TinyRecipe)):  # data generators and this recipe
        h.update(inspect.getsource(module).encode())
    return h.hexdigest()[:12]


def ensure_tiny_model(recipe: TinyRecipe = TinyRecipe(), log: Callable[[str], None] = print) -> Path:
    """Path of the cached tiny model directory, building it first if needed (one process builds,
    concurrent callers wait on a file lock)."""
    target = cache_dir() / f"tiny-{recipe_hash(recipe)}"
    if (target / "model.safetensors").exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / ".build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (target / "model.safetensors").exists():
            return target
        tmp = target.with_name(target.name + f".tmp{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        log(f"building the built-in tiny base model (once; cached at {target})")
        build_tiny_model(recipe, tmp, log)
        os.replace(tmp, target)
    return target


# ---------------------------------------------------------------- data

def _slip(demo: str, answer: str, rng: random.Random) -> str:
    """The same demonstration with its final result replaced by a nearby wrong number."""
    wrong = str(int(answer) + rng.choice([-10, -2, -1, 1, 2, 10]))
    demo = demo.replace(f"\\boxed{{{answer}}}", f"\\boxed{{{wrong}}}")
    i = demo.rfind(f"= {answer}")
    end = i + 2 + len(answer)
    if i >= 0 and not demo[end:end + 1].isdigit():
        demo = demo[:i] + f"= {wrong}" + demo[end:]
    return demo


def _unboxed(demo: str) -> str:
    return re.sub(r"\s*\\boxed\{[^{}]*\}\s*$", "", demo)


def noisy_demonstration(task: Task, demo: str, recipe: TinyRecipe, rng: random.Random) -> str:
    u = rng.random()
    if task.domain == "code":
        if u < recipe.slip_rate:
            return _code_slip(task, demo, rng)
        if u < recipe.slip_rate + recipe.format_rate:
            return demo.replace("    return ", "    ", 1)
        return demo
    if u < recipe.slip_rate and task.answer is not None and re.fullmatch(r"-?\d+", task.answer):
        return _slip(demo, task.answer, rng)
    if u < recipe.slip_rate + recipe.format_rate:
        return _unboxed(demo)
    return demo


def _code_slip(task: Task, demo: str, rng: random.Random) -> str:
    """A plausible wrong solution: a constant off by one, or a neighbouring operation."""
    from polyrl.domains.code import LIST_OPS, STR_OPS

    expr = demo.split("    return ", 1)[1].split("\n", 1)[0]
    ops = LIST_OPS if task.difficulty == 2 else STR_OPS if task.difficulty == 3 else None
    if ops is not None:
        wrong = rng.choice([op for op in ops if op != expr])
    else:  # "x + 3" -> "x + 4"; "2 * x + 5" -> "2 * x + 4" or "3 * x + 5"
        numbers = list(re.finditer(r"\d+", expr))
        target = rng.choice(numbers)
        value = int(target.group()) + rng.choice([-1, 1])
        wrong = expr[:target.start()] + str(max(value, 1)) + expr[target.end():]
    return demo.replace(f"return {expr}", f"return {wrong}", 1)


def sft_examples(recipe: TinyRecipe, n: int) -> list[tuple[str, str]]:
    """(user prompt, assistant demonstration) pairs from the built-in domains' train splits,
    shuffled together: `code_share` of them code, the rest math."""
    from polyrl.domains.code import CodeDomain
    from polyrl.domains.math import MathDomain

    rng = random.Random(recipe.seed)
    n_code = round(n * recipe.code_share)
    tasks = (MathDomain(levels=recipe.math_levels).sample("train", n - n_code, seed=recipe.seed)
             + CodeDomain(levels=recipe.code_levels).sample("train", n_code, seed=recipe.seed))
    rng.shuffle(tasks)
    demonstrate = {"math": MathDomain.demonstration, "code": CodeDomain.demonstration}
    return [(t.prompt, noisy_demonstration(t, demonstrate[t.domain](t), recipe, rng)) for t in tasks]


# ---------------------------------------------------------------- training

def build_tiny_model(recipe: TinyRecipe, out_dir: Path, log: Callable[[str], None] = print) -> None:
    start = time.time()
    torch.manual_seed(recipe.seed)
    examples = sft_examples(recipe, recipe.steps * recipe.batch_size)

    corpus = [f"{IM_START}user\n{p}{IM_END}\n{IM_START}assistant\n{d}{IM_END}" for p, d in examples[:20000]]
    save_tokenizer(train_tiny_tokenizer(corpus, recipe.vocab_size), out_dir)
    tok = Tokenizer.from_dir(out_dir)

    cfg = ModelConfig(
        model_type="llama", vocab_size=tok.vocab_size, hidden_size=recipe.hidden_size,
        intermediate_size=recipe.intermediate_size, num_hidden_layers=recipe.num_layers,
        num_attention_heads=recipe.num_heads, num_key_value_heads=recipe.num_kv_heads,
        max_position_embeddings=512, rms_norm_eps=1e-5, tie_word_embeddings=True,
        eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    model = Transformer(cfg, seed=recipe.seed)
    n_params = sum(p.numel() for p in model.parameters())
    log(f"  tokenizer: {tok.vocab_size} tokens; model: {n_params / 1e6:.2f}M parameters; "
        f"{len(examples)} demonstrations")

    encoded = [_encode_example(tok, p, d) for p, d in examples]
    opt = torch.optim.AdamW(model.parameters(), lr=recipe.lr, betas=(0.9, 0.95), weight_decay=0.1)
    model.train()
    from tqdm import tqdm

    bar = tqdm(range(recipe.steps), desc="  base model SFT", unit="step", leave=False, disable=None)
    for step in bar:
        lr = recipe.lr * min(1.0, (step + 1) / recipe.warmup) * 0.5 * (1 + math.cos(math.pi * step / recipe.steps))
        for group in opt.param_groups:
            group["lr"] = lr
        ids, targets, mask = _collate(encoded[step * recipe.batch_size:(step + 1) * recipe.batch_size])
        logits = model(ids)
        loss = (torch.nn.functional.cross_entropy(logits.transpose(1, 2), targets, reduction="none") * mask).sum() / mask.sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % 20 == 0:
            bar.set_postfix(loss=f"{loss.item():.3f}")
        if bar.disable and step % 100 == 0:
            log(f"  base model SFT step {step}/{recipe.steps}, loss {loss.item():.3f}")
    bar.close()
    model.eval()
    save_pretrained(model, cfg, out_dir)
    card = {"recipe": asdict(recipe), "parameters": n_params, "final_loss": round(loss.item(), 4),
            "build_seconds": round(time.time() - start, 1),
            "trained_on": "demonstrations of the built-in math and code domains' train splits from a noisy "
                          "teacher (see polyrl/models/tiny.py)"}
    (out_dir / "polyrl_recipe.json").write_text(json.dumps(card, indent=2))
    log(f"  built in {card['build_seconds']:.0f}s, final SFT loss {card['final_loss']}")


def _encode_example(tok: Tokenizer, prompt: str, demo: str) -> tuple[list[int], int]:
    """Token ids of the whole conversation and where the assistant's answer starts."""
    head = tok.encode(tok.chat_prompt(prompt))
    return head + tok.encode(demo) + [tok.eos_token_id], len(head)


def _collate(batch: list[tuple[list[int], int]]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    T = max(len(ids) for ids, _ in batch)
    ids = torch.zeros(len(batch), T, dtype=torch.long)
    targets = torch.zeros(len(batch), T, dtype=torch.long)
    mask = torch.zeros(len(batch), T)
    for b, (seq, start) in enumerate(batch):
        ids[b, :len(seq)] = torch.tensor(seq)
        targets[b, :len(seq) - 1] = torch.tensor(seq[1:])
        mask[b, start - 1:len(seq) - 1] = 1.0  # predict the answer tokens and the closing EOS
    return ids, targets, mask
