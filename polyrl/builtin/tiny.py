"""The built-in tiny base model: built by polyrl itself, cached, rebuilt when its recipe changes.

Recipe. A byte-level BPE tokenizer (digits kept single) is trained on rendered
conversations of the built-in domains' TRAIN splits (math, code, agent episodes and
alignment requests); then
a small Llama-family model is trained from scratch by supervised fine-tuning on
demonstrations packed into rows (`pack`), with loss on the assistant turns only, its
matrix products in bfloat16 where the CPU multiplies bfloat16 natively (AMX or AVX512-BF16;
`TinyRecipe.bf16_products`).
Held-out tasks are never seen.

Imperfect by design, so RL has headroom: the demonstrations come from a *noisy
teacher*. With probability `slip_rate` a demonstration is wrong by a small slip (math:
a result off by ±1, ±2, ±10; code: a constant off by one, or a neighbouring operation
such as max for sum), and with probability `format_rate` it has a format slip (math: no
final `\\boxed{}`, which answer_verify then cannot find; code: the `return` left out, so
the function returns None; agent: a wrong final answer, or a detour that repeats the last
lookup, see `_agent_noise`; alignment: a rude, off-topic or wrong-intent answer, or a
verbose, terse or polite-word-stuffed one, see `_alignment_noise`). The model learns
the teacher's habits along with the task, exactly the situation RLVR is for: the reward
tells right from wrong where the demonstrations did not. Both rates and everything else
that shapes the model live in `TinyRecipe`; its hash, together with the source of the
data generators, names the cache entry.

Out of scope: pretraining on natural text; the model only knows the built-in domains.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import math
import random
import re
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import torch

from polyrl.agent.engine_model import Segment, training_tokens
from polyrl.cache import build_once, cache_dir
from polyrl.models.attention import DocumentCausalAttention
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
    steps: int = 1640
    """Optimizer steps of SFT: 104,960 demonstrations, of which 61,440 are math. The 1,000-step
    recipe before it had a third of those math demonstrations (and the others as now): its
    model got most single-digit facts wrong, 10.7% of held-out math greedy against 49.5%
    now, and RL in the quickstart's mix could not lift math (docs/results.md, 2026-12-07)."""
    batch_size: int = 64
    """Demonstrations per optimizer step."""
    pack_length: int = 256
    """Demonstrations are packed into rows of this many tokens (no padding between them), or of
    the longest demonstration's length when it is longer. Attention costs a row's length per
    token, so rows just above the longest demonstration (224 tokens) build fastest."""
    bf16_products: bool = True
    """Matrix products in bfloat16 (autocast, float32 weights and optimizer) on a CPU that
    multiplies bfloat16 natively (AMX or AVX512-BF16, `native_bf16`); float32 on others, where
    bfloat16 is slower. Attention, norms and the loss stay float32 either way. The model card
    records which ran."""
    lr: float = 3e-3
    warmup: int = 50
    slip_rate: float = 0.2
    """Share of demonstrations whose final result is wrong by a small slip."""
    format_rate: float = 0.25
    """Share of demonstrations that omit the final \\boxed{} answer."""
    math_levels: tuple[int, ...] = (1, 2, 3, 4)
    code_levels: tuple[int, ...] = (1, 2, 3, 4)
    agent_levels: tuple[int, ...] = (1, 2, 3, 4)
    mix: tuple[tuple[str, float], ...] = (("math", 0.585), ("code", 0.195), ("agent", 0.159), ("alignment", 0.061))
    """Share of demonstrations per built-in domain, and of copying tasks if `("copy", share)` is
    added (`copy_demos`). A share of 0.08 did not teach this model to copy and is not in the
    default (docs/results.md, 2026-12-08; `bench/copy_probe.py`)."""


def recipe_hash(recipe: TinyRecipe) -> str:
    from polyrl.agent import call_format, engine_model
    from polyrl.builtin import copy_demos
    from polyrl.domains import agent, agent_world, alignment, code, math

    h = hashlib.sha256(json.dumps(asdict(recipe), sort_keys=True).encode())
    # the data generators, the agent's text format and token layout, and this recipe
    for module in (math, code, agent, agent_world, alignment, call_format, engine_model, copy_demos,
                   inspect.getmodule(TinyRecipe)):
        h.update(inspect.getsource(module).encode())
    return h.hexdigest()[:12]


def ensure_tiny_model(recipe: TinyRecipe = TinyRecipe(), log: Callable[[str], None] = print) -> Path:
    """Path of the cached tiny model directory, building it first if needed (once per recipe)."""
    target = cache_dir() / f"tiny-{recipe_hash(recipe)}"

    def build(tmp: Path) -> None:
        log(f"building the built-in tiny base model (once; cached at {target})")
        build_tiny_model(recipe, tmp, log)

    return build_once(target, "model.safetensors", build)


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


def _agent_noise(task: Task, messages: list[dict], recipe: TinyRecipe, rng: random.Random) -> list[dict]:
    """The agent teacher's habits: a wrong final answer (`slip_rate`), or a detour, the
    last lookup made twice (`format_rate`): right, but a step and its tokens dearer."""
    u = rng.random()
    messages = [dict(m) for m in messages]
    if u < recipe.slip_rate:
        answer = str(task.answer)
        wrong = (str(int(answer) + rng.choice([-10, -1, 1, 10])) if re.fullmatch(r"-?\d+", answer)
                 else "0" if answer == "none" else rng.choice([i for i in _items_of(task) if i != answer] or ["none"]))
        messages[-1]["content"] = messages[-1]["content"].replace(f">{answer}<", f">{wrong}<")
    elif u < recipe.slip_rate + recipe.format_rate and len(messages) >= 5:
        messages[-1:-1] = [dict(m) for m in messages[-3:-1]]  # the last (call, result) pair again
    return messages


def _alignment_noise(task: Task, recipe: TinyRecipe, rng: random.Random) -> str:
    """The alignment teacher: a good answer (a template drawn at random), else with
    `slip_rate` a wrong one (rude, off topic, the wrong intent) and with `format_rate` a
    badly shaped one (verbose, terse, stuffed with polite words)."""
    from polyrl.domains.alignment import bad_answer, good_answer

    u = rng.random()
    if u < recipe.slip_rate:
        return bad_answer(task, rng.choice(("rude", "off_topic", "wrong_intent")), rng)
    if u < recipe.slip_rate + recipe.format_rate:
        return bad_answer(task, rng.choice(("verbose", "terse", "stuffed")), rng)
    return good_answer(task, rng)


def _items_of(task: Task) -> list[str]:
    return sorted(task.data.get("world", {}).get("items", {}))


def sft_examples(recipe: TinyRecipe, n: int) -> list[list[dict]]:
    """Demonstrations as conversations (system?, user, assistant, tool, ...) from the
    built-in domains' train splits (and copying tasks, if the mix names "copy"), mixed by
    `recipe.mix` and shuffled together."""
    from polyrl.builtin.copy_demos import copy_demonstration
    from polyrl.domains.agent import AgentDomain
    from polyrl.domains.alignment import AlignmentDomain
    from polyrl.domains.code import CodeDomain
    from polyrl.domains.math import MathDomain

    rng = random.Random(recipe.seed)
    domains = {"math": MathDomain(levels=recipe.math_levels), "code": CodeDomain(levels=recipe.code_levels),
               "agent": AgentDomain(levels=recipe.agent_levels), "alignment": AlignmentDomain()}
    total = sum(share for _, share in recipe.mix)
    counts = {name: round(n * share / total) for name, share in recipe.mix}
    unknown = sorted(set(counts) - {*domains, "copy"})
    if unknown:
        raise ValueError(f"recipe mix names {unknown}: choose from {sorted({*domains, 'copy'})}")
    tasks: list[Task | None] = [t for name, k in counts.items() if name != "copy"
                                for t in domains[name].sample("train", k, seed=recipe.seed)]
    tasks += [None] * counts.get("copy", 0)  # a copying task, drawn in its turn
    rng.shuffle(tasks)
    examples = []
    for t in tasks:
        if t is None:
            examples.append(copy_demonstration(rng))
            continue
        if t.domain == "alignment":
            examples.append([{"role": "user", "content": t.prompt},
                             {"role": "assistant", "content": _alignment_noise(t, recipe, rng)}])
            continue
        demo = type(domains[t.domain]).demonstration(t)
        if t.domain == "agent":
            examples.append(_agent_noise(t, demo, recipe, rng))
        else:
            answer = noisy_demonstration(t, demo, recipe, rng)
            examples.append([{"role": "user", "content": t.prompt}, {"role": "assistant", "content": answer}])
    return examples


# ---------------------------------------------------------------- training

def build_tiny_model(recipe: TinyRecipe, out_dir: Path, log: Callable[[str], None] = print) -> None:
    start = time.time()
    torch.manual_seed(recipe.seed)
    examples = sft_examples(recipe, recipe.steps * recipe.batch_size)

    corpus = ["".join(f"{IM_START}{m['role']}\n{m['content']}{IM_END}\n" for m in messages)
              for messages in examples[:20000]]
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

    encoded = [training_tokens(tok, messages) for messages in examples]
    longest = max(len(e.token_ids) for e in encoded)
    if longest > cfg.max_position_embeddings:
        raise ValueError(f"a demonstration of {longest} tokens is longer than the model's "
                         f"{cfg.max_position_embeddings} positions")
    row = max(recipe.pack_length, longest)
    bf16 = recipe.bf16_products and native_bf16()
    log(f"  products in {'bfloat16' if bf16 else 'float32'}, rows of {row} tokens")
    opt = torch.optim.AdamW(model.parameters(), lr=recipe.lr, betas=(0.9, 0.95), weight_decay=0.1)
    model.train()
    from tqdm import tqdm

    sft_start = time.time()
    bar = tqdm(range(recipe.steps), desc="  base model SFT", unit="step", leave=False, disable=None)
    for step in bar:
        lr = recipe.lr * min(1.0, (step + 1) / recipe.warmup) * 0.5 * (1 + math.cos(math.pi * step / recipe.steps))
        for group in opt.param_groups:
            group["lr"] = lr
        ids, targets, mask, positions, documents = pack(
            encoded[step * recipe.batch_size:(step + 1) * recipe.batch_size], row)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            logits = model(ids, positions, DocumentCausalAttention(documents, dtype=torch.float32)).float()
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
    sft_seconds = round(time.time() - sft_start, 1)
    model.eval()
    save_pretrained(model, cfg, out_dir)
    card = {"recipe": asdict(recipe), "parameters": n_params, "final_loss": round(loss.item(), 4),
            "products": "bfloat16" if bf16 else "float32",
            "build_seconds": round(time.time() - start, 1), "sft_seconds": sft_seconds,
            "trained_on": "demonstrations of the built-in math, code, agent and alignment domains' train splits from a "
                          "noisy teacher (see polyrl/builtin/tiny.py)"}
    (out_dir / "polyrl_recipe.json").write_text(json.dumps(card, indent=2))
    log(f"  built in {card['build_seconds']:.0f}s, final SFT loss {card['final_loss']}")


def native_bf16() -> bool:
    """Whether this CPU multiplies bfloat16 matrices natively, where bfloat16 products beat
    float32 ones: AMX tiles (Intel from Sapphire Rapids) or AVX512-BF16 (AMD from Zen 4,
    Intel from Cooper Lake; 1.40x on the 2-core AMD EPYC, BENCHMARKS.md). Elsewhere torch
    emulates them, slower than float32."""
    probes = ("_is_amx_tile_supported", "_is_avx512_bf16_supported")
    return any(bool(getattr(torch.cpu, probe, lambda: False)()) for probe in probes)  # a torch without one: no


def pack(batch: list[Segment], length: int) -> tuple[torch.Tensor, ...]:
    """The batch's sequences packed into rows of `length` tokens (first fit, longest first).

    Returns ids, next-token targets and the loss mask (R, L), each sequence's positions
    restarting at 0, and the document id of every position for DocumentCausalAttention
    (-1 - row on padding). Token t of a sequence, masked in when the sequence generates
    it, is predicted at position t - 1 of the same sequence; no target crosses sequences.
    The same loss as one padded row per sequence, at a fraction of the padding.
    """
    rows: list[list[Segment]] = []
    room: list[int] = []
    for seg in sorted(batch, key=lambda s: -len(s.token_ids)):
        n = len(seg.token_ids)
        assert n <= length, f"a sequence of {n} tokens does not fit rows of {length}"
        k = next((r for r, free in enumerate(room) if free >= n), None)
        if k is None:
            rows.append([])
            room.append(length)
            k = len(rows) - 1
        rows[k].append(seg)
        room[k] -= n
    L = length - min(room)  # no column that every row pads
    ids, targets = torch.zeros(len(rows), L, dtype=torch.long), torch.zeros(len(rows), L, dtype=torch.long)
    mask, positions = torch.zeros(len(rows), L), torch.zeros(len(rows), L, dtype=torch.long)
    documents = torch.full((len(rows), L), -1, dtype=torch.long) - torch.arange(len(rows))[:, None]
    doc = 0
    for r, row in enumerate(rows):
        at = 0
        for seg in row:
            n = len(seg.token_ids)
            ids[r, at:at + n] = torch.tensor(seg.token_ids)
            targets[r, at:at + n - 1] = torch.tensor(seg.token_ids[1:])
            mask[r, at:at + n - 1] = torch.tensor(seg.loss_mask[1:], dtype=torch.float32)
            positions[r, at:at + n] = torch.arange(n)
            documents[r, at:at + n] = doc
            at, doc = at + n, doc + 1
    return ids, targets, mask, positions, documents
