"""The built-in tiny reward model: trained by polyrl on synthetic preference pairs, cached.

Recipe. Pairs (prompt, chosen, rejected) come from the alignment domain's TRAIN split
(`polyrl.domains.alignment.preference_pairs`): a good answer against a rude, off-topic,
verbose, terse, polite-word-stuffed or wrong-intent one. A byte-level BPE tokenizer is
trained on them, then a small Llama-family sequence classifier (models/classifier.py)
with the Bradley-Terry loss -log sigmoid(r_chosen - r_rejected), plus a small r^2 term
that keeps rewards centred. A conversation is scored as the tokenizer's chat template
renders it, user turn then assistant turn, pooled at its last token.

Because the rejected answers include padded and keyword-stuffed versions of good ones,
the honest tiny RM does not reward length or "please" by itself. It has a blind spot by
construction: an answer about the wrong person or thing ("off_topic") scores about as
well as the right one (telling them apart means matching names across the two turns,
which a model this size did not learn in 800 steps either); the rule check
`rule_check` covers it, which is what the hacking detector compares against. The
ensemble members
(`ensure_tiny_reward_models(recipe, members=3)`: seeds seed, seed+1, ...) differ in
initialisation and data order, so they disagree on answers unlike their training data.

Each member is a Hugging Face directory (LlamaForSequenceClassification, loadable by
transformers) plus `polyrl_reward.json`: the recipe, held-out pair accuracy and the
calibration (mean and std of raw rewards on held-out answers) that the
`preference_model` verifier uses to put members on one scale. Cached under
`<cache>/tiny-rm-<hash>` (POLYRL_CACHE, as for the tiny policy), the hash covering the
recipe and the source of the data generator and of this file.

Out of scope: reward models of natural text; this one knows only the alignment domain's
requests, which is what the quickstart needs.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import math
import os
import random
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn.functional as F

from polyrl.cache import build_once, cache_dir
from polyrl.models.classifier import SequenceClassifier, right_pad, save_classifier
from polyrl.models.config import ModelConfig
from polyrl.models.tokenizer import Tokenizer, save_tokenizer, train_tiny_tokenizer
from polyrl.rewards.preference_model import render

CARD_NAME = "polyrl_reward.json"


@dataclass(frozen=True)
class TinyRMRecipe:
    seed: int = 0
    """Seed of the data draw, the initialisation and the batch order."""
    vocab_size: int = 384
    hidden_size: int = 64
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    intermediate_size: int = 192
    steps: int = 150
    """Optimizer steps; each sees batch_size pairs."""
    batch_size: int = 24
    lr: float = 3e-3
    warmup: int = 20
    center_coef: float = 1e-3
    """Weight of the mean r^2 term (keeps raw rewards near 0; Bradley-Terry only fixes differences)."""
    heldout_pairs: int = 256
    """Held-out pairs for the card's accuracy and the calibration."""


def recipe_hash(recipe: TinyRMRecipe) -> str:
    from polyrl.domains import alignment

    h = hashlib.sha256(json.dumps(asdict(recipe), sort_keys=True).encode())
    for source in (alignment, inspect.getmodule(TinyRMRecipe), render):  # render: the text a model scores
        h.update(inspect.getsource(source).encode())
    return h.hexdigest()[:12]


PARALLEL_PAIRS = 1000
"""A member trained on at least this many pairs takes longer to build than a process takes to
start (the built-in recipe: 3,600 pairs, about 20 s); smaller ones build in this process."""


def ensure_tiny_reward_models(recipe: TinyRMRecipe = TinyRMRecipe(), members: int = 3,
                              log: Callable[[str], None] = print, root: Path | None = None) -> list[Path]:
    """Directories of `members` tiny reward models (seeds recipe.seed, +1, ...), built if needed.

    Members missing from the cache build side by side, one process each, on a machine with
    more than one core (members of fewer than PARALLEL_PAIRS pairs build here, one after
    another). A member builds on one thread from its own seed either way, so its weights do
    not depend on where it was built."""
    assert members >= 1
    recipes = [replace(recipe, seed=recipe.seed + i) for i in range(members)]
    missing = [r for r in recipes if not (_target(r, root) / CARD_NAME).exists()]
    if len(missing) > 1 and (os.cpu_count() or 1) > 1 and recipe.steps * recipe.batch_size >= PARALLEL_PAIRS:
        log(f"building {len(missing)} built-in tiny reward models side by side, one process each "
            f"(once; cached in {_target(missing[0], root).parent})")
        for line in _build_side_by_side(missing, root):
            log(line)
    return [ensure_tiny_reward_model(r, log, root) for r in recipes]


def _build_side_by_side(recipes: list[TinyRMRecipe], root: Path | None) -> list[str]:
    """Build each recipe in a `python -c` process of its own (not multiprocessing, which would
    import the caller's main module again in each worker); their log lines, in order.
    RuntimeError naming the member when one fails; every process is ended either way."""
    import polyrl

    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(Path(polyrl.__file__).resolve().parents[1])]
                                        + [p for p in [env.get("PYTHONPATH")] if p])
    code = "import sys; from polyrl.builtin.tiny_rm import _build_member; _build_member(sys.argv[1])"
    procs = [subprocess.Popen([sys.executable, "-c", code, json.dumps({"recipe": asdict(r), "root": root and str(root)})],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env) for r in recipes]
    try:
        outputs = [p.communicate() for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    lines = []
    for r, p, (out, err) in zip(recipes, procs, outputs):
        if p.returncode != 0:
            raise RuntimeError(f"building the tiny reward model of seed {r.seed} failed (exit {p.returncode}):\n"
                               f"{err[-2000:]}")
        lines += out.splitlines()
    return lines


def _build_member(spec: str) -> None:
    """A worker of _build_side_by_side: build one member, its log lines on stdout."""
    job = json.loads(spec)
    ensure_tiny_reward_model(TinyRMRecipe(**job["recipe"]), lambda line: print(line, flush=True), job["root"])


def _target(recipe: TinyRMRecipe, root: Path | None) -> Path:
    return (Path(root) if root is not None else cache_dir()) / f"tiny-rm-{recipe_hash(recipe)}"


def ensure_tiny_reward_model(recipe: TinyRMRecipe = TinyRMRecipe(), log: Callable[[str], None] = print,
                             root: Path | None = None) -> Path:
    """Path of one cached tiny reward model directory, building it first if needed (once per
    recipe). `root` overrides the cache directory."""
    target = _target(recipe, root)

    def build(tmp: Path) -> None:
        log(f"building a built-in tiny reward model, seed {recipe.seed} (once; cached at {target})")
        build_tiny_reward_model(recipe, tmp, log)

    return build_once(target, CARD_NAME, build)


def builtin_reward_models(log: Callable[[str], None] = print, members: int = 3,
                          recipe: dict[str, Any] | None = None) -> list[Path]:
    """`builtin:tiny-rm`: the ensemble's directories; `recipe` overrides TinyRMRecipe fields."""
    return ensure_tiny_reward_models(TinyRMRecipe(**(recipe or {})), members, log=log)


def build_tiny_reward_model(recipe: TinyRMRecipe, out_dir: Path, log: Callable[[str], None] = print) -> None:
    # Matrices this small run fastest on one thread: with more, OpenMP synchronisation
    # dominates, most of all when another process holds a core.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        _build(recipe, out_dir, log)
    finally:
        torch.set_num_threads(threads)


def _build(recipe: TinyRMRecipe, out_dir: Path, log: Callable[[str], None]) -> None:
    from polyrl.domains.alignment import preference_pairs

    start = time.time()
    torch.manual_seed(recipe.seed)
    pairs = preference_pairs(recipe.steps * recipe.batch_size, seed=recipe.seed)
    heldout = preference_pairs(recipe.heldout_pairs, seed=recipe.seed, split="heldout")
    save_tokenizer(train_tiny_tokenizer([f"{p}\n{c}\n{r}" for p, c, r, _ in pairs[:5000]], recipe.vocab_size), out_dir)
    tok = Tokenizer.from_dir(out_dir)

    cfg = ModelConfig(
        model_type="llama", vocab_size=tok.vocab_size, hidden_size=recipe.hidden_size,
        intermediate_size=recipe.intermediate_size, num_hidden_layers=recipe.num_layers,
        num_attention_heads=recipe.num_heads, num_key_value_heads=recipe.num_kv_heads,
        max_position_embeddings=512, rms_norm_eps=1e-5, tie_word_embeddings=False,
        eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    model = SequenceClassifier(cfg, num_labels=1, seed=recipe.seed)

    def encode(prompt: str, answer: str) -> list[int]:
        return tok.encode(render(tok, prompt, answer))[:cfg.max_position_embeddings]

    def rewards(seqs: list[list[int]]) -> torch.Tensor:
        ids, mask = right_pad(seqs, cfg.pad_token_id)
        return model(ids, mask)[:, 0]  # (B,)

    opt = torch.optim.AdamW(model.parameters(), lr=recipe.lr, betas=(0.9, 0.95), weight_decay=0.01)
    order = list(range(len(pairs)))
    random.Random(recipe.seed).shuffle(order)
    model.train()
    for step in range(recipe.steps):
        lr = recipe.lr * min(1.0, (step + 1) / recipe.warmup) * 0.5 * (1 + math.cos(math.pi * step / recipe.steps))
        for group in opt.param_groups:
            group["lr"] = lr
        batch = [pairs[i] for i in order[step * recipe.batch_size:(step + 1) * recipe.batch_size]]
        r = rewards([encode(p, c) for p, c, _, _ in batch] + [encode(p, x) for p, _, x, _ in batch])
        chosen, rejected = r[:len(batch)], r[len(batch):]
        loss = -F.logsigmoid(chosen - rejected).mean() + recipe.center_coef * r.pow(2).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % 100 == 0:
            log(f"  reward model step {step}/{recipe.steps}, loss {loss.item():.3f}")
    model.eval()

    with torch.no_grad():
        r = torch.cat([rewards([encode(p, c) for p, c, _, _ in heldout[i:i + 64]]
                               + [encode(p, x) for p, _, x, _ in heldout[i:i + 64]]).view(2, -1)
                       for i in range(0, len(heldout), 64)], dim=1)  # (2, N): chosen, rejected
    accuracy = float((r[0] > r[1]).float().mean())
    save_classifier(model, out_dir)
    card = {"recipe": asdict(recipe), "parameters": sum(p.numel() for p in model.parameters()),
            "final_loss": round(loss.item(), 4), "heldout_pair_accuracy": round(accuracy, 4),
            "calibration": {"mean": float(r.mean()), "std": float(r.std().clamp(min=1e-3))},
            "build_seconds": round(time.time() - start, 1),
            "trained_on": "synthetic preference pairs of the alignment domain's train split "
                          "(see polyrl/builtin/tiny_rm.py)"}
    (out_dir / CARD_NAME).write_text(json.dumps(card, indent=2))
    log(f"  built in {card['build_seconds']:.0f}s, held-out pair accuracy {accuracy:.3f}")
