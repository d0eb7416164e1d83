"""The built-in draft model: a smaller model of the tiny family, for speculative decoding.

`builtin:tiny-draft` shares the built-in tiny model's tokenizer (its files are copied from
the tiny model's directory, so the vocabularies are identical) and is distilled from it:
on the same supervised data as tiny.py trains on (`sft_examples`, packed by `pack`), the
draft minimises the KL divergence from the tiny model's next-token distribution (the
quantity speculative sampling's acceptance rate depends on: sum of min(p, q)) plus a
little cross-entropy on the demonstrations, on the assistant tokens only. It is cached
like the tiny model, named by a hash of its recipe and of the tiny model it drafts for,
and builds in a few minutes on 2 cores.

Out of scope: drafts for other targets (for a Hugging Face model, name a draft directory
in engine.native.speculative.draft_model), self-speculation with early exits.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import math
import shutil
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F

from polyrl.agent.engine_model import training_tokens
from polyrl.builtin.tiny import TinyRecipe, ensure_tiny_model, pack, sft_examples
from polyrl.cache import build_once, cache_dir
from polyrl.models.attention import DocumentCausalAttention
from polyrl.models.config import ModelConfig
from polyrl.models.hf_io import load_pretrained, save_pretrained
from polyrl.models.tokenizer import Tokenizer

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


@dataclass(frozen=True)
class DraftRecipe:
    seed: int = 1
    hidden_size: int = 64
    num_layers: int = 2
    num_heads: int = 2
    num_kv_heads: int = 1
    intermediate_size: int = 192
    steps: int = 600
    """Optimizer steps of distillation."""
    batch_size: int = 32
    """Demonstrations per optimizer step."""
    lr: float = 4e-3
    warmup: int = 30
    ce_weight: float = 0.1
    """Weight of the cross-entropy on the demonstrations next to the KL to the tiny model."""


def draft_hash(recipe: DraftRecipe, target_dir: Path) -> str:
    h = hashlib.sha256(json.dumps(asdict(recipe), sort_keys=True).encode())
    h.update(target_dir.name.encode())  # the tiny model's own hash: a new tiny model, a new draft
    h.update(inspect.getsource(sys.modules[__name__]).encode())
    return h.hexdigest()[:12]


def ensure_tiny_draft(recipe: DraftRecipe = DraftRecipe(), log: Callable[[str], None] = print) -> Path:
    """Path of the cached draft model directory, building it (and the tiny model) first if needed."""
    target_dir = ensure_tiny_model(TinyRecipe(), log=log)
    out = cache_dir() / f"tiny-draft-{draft_hash(recipe, target_dir)}"

    def build(tmp: Path) -> None:
        log(f"building the built-in tiny draft model (once; cached at {out})")
        build_tiny_draft(recipe, target_dir, tmp, log)

    return build_once(out, "model.safetensors", build)


def build_tiny_draft(recipe: DraftRecipe, target_dir: Path, out_dir: Path, log: Callable[[str], None] = print) -> None:
    start = time.time()
    torch.manual_seed(recipe.seed)
    out_dir.mkdir(parents=True, exist_ok=True)
    for name in TOKENIZER_FILES:
        shutil.copy(target_dir / name, out_dir / name)
    tok = Tokenizer.from_dir(out_dir)
    teacher, tcfg = load_pretrained(target_dir, dtype=torch.float32)
    teacher.eval()
    cfg = ModelConfig(
        model_type="llama", vocab_size=tcfg.vocab_size, hidden_size=recipe.hidden_size,
        intermediate_size=recipe.intermediate_size, num_hidden_layers=recipe.num_layers,
        num_attention_heads=recipe.num_heads, num_key_value_heads=recipe.num_kv_heads,
        max_position_embeddings=tcfg.max_position_embeddings, rms_norm_eps=tcfg.rms_norm_eps,
        tie_word_embeddings=True, eos_token_id=tcfg.eos_token_id, pad_token_id=tcfg.pad_token_id)
    from polyrl.models.transformer import Transformer

    model = Transformer(cfg, seed=recipe.seed)
    n_params = sum(p.numel() for p in model.parameters())
    tiny = TinyRecipe()
    examples = sft_examples(tiny, recipe.steps * recipe.batch_size)
    encoded = [training_tokens(tok, messages) for messages in examples]
    log(f"  draft model: {n_params / 1e6:.2f}M parameters (the tiny model: "
        f"{sum(p.numel() for p in teacher.parameters()) / 1e6:.2f}M); {len(encoded)} demonstrations")
    opt = torch.optim.AdamW(model.parameters(), lr=recipe.lr, betas=(0.9, 0.95), weight_decay=0.1)
    model.train()
    for step in range(recipe.steps):
        lr = recipe.lr * min(1.0, (step + 1) / recipe.warmup) * 0.5 * (1 + math.cos(math.pi * step / recipe.steps))
        for group in opt.param_groups:
            group["lr"] = lr
        ids, targets, mask, positions, documents = pack(
            encoded[step * recipe.batch_size:(step + 1) * recipe.batch_size], tiny.pack_length)
        with torch.no_grad():
            t_logp = teacher(ids, positions, DocumentCausalAttention(documents)).log_softmax(-1)  # (R, L, V)
        logits = model(ids, positions, DocumentCausalAttention(documents))  # (R, L, V)
        logp = logits.log_softmax(-1)
        kl = (t_logp.exp() * (t_logp - logp)).sum(-1)  # (R, L) KL(teacher || draft)
        ce = F.cross_entropy(logits.transpose(1, 2), targets, reduction="none")  # (R, L)
        loss = ((kl + recipe.ce_weight * ce) * mask).sum() / mask.sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % 100 == 0:
            mean_kl = float((kl.detach() * mask).sum() / mask.sum())
            log(f"  draft distillation step {step}/{recipe.steps}, KL {mean_kl:.3f}")
    model.eval()
    save_pretrained(model, cfg, out_dir)
    card = {"recipe": asdict(recipe), "parameters": n_params, "drafts_for": target_dir.name,
            "final_kl": round(float((kl.detach() * mask).sum() / mask.sum()), 4),
            "build_seconds": round(time.time() - start, 1),
            "trained_on": "the tiny model's next-token distributions on its own SFT data "
                          "(polyrl/builtin/tiny_draft.py)"}
    (out_dir / "polyrl_recipe.json").write_text(json.dumps(card, indent=2))
    log(f"  built in {card['build_seconds']:.0f}s, final KL {card['final_kl']}")


def builtin_draft_model(log: Callable[[str], None] = print, **options) -> Path:
    """Entry point of `builtin:tiny-draft` (pyproject.toml, polyrl.builtin_models)."""
    return ensure_tiny_draft(DraftRecipe(**options), log=log)
