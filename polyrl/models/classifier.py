"""Sequence classifier (reward model): the decoder of transformer.py plus a `score` head.

The Hugging Face `LlamaForSequenceClassification` / `Qwen2ForSequenceClassification` /
`Qwen3ForSequenceClassification` layout: the same `model.*` decoder weights as a causal
LM, no lm_head, and `score.weight` (num_labels, D) without bias, applied to the final
hidden state of the LAST real token of each sequence. A reward model is such a
classifier with num_labels = 1; its one logit is the raw reward.

    model, cfg = load_classifier("path/to/reward-model")     # an HF directory
    ids, mask = right_pad([[...], [...]], cfg.pad_token_id)   # token ids per text
    raw = model(ids, mask)[:, 0]                              # (B,) raw rewards

`save_classifier` writes a directory that transformers' AutoModelForSequenceClassification
loads. Pooling differs from transformers in one corner only: transformers finds the last
token by comparing ids with pad_token_id (so a real token equal to the pad id confuses
it); here the attention mask says which tokens are real.

Out of scope: regression/multi-label loss heads, `.bin` checkpoints, sharded writes,
value heads of other layouts (TRL's `v_head`, `AutoModelForCausalLMWithValueHead`).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
import torch.nn as nn
from safetensors.torch import save_file
from torch import Tensor

from polyrl.models.attention import CausalAttention
from polyrl.models.config import ARCHITECTURES, ModelConfig
# The private readers of hf_io are shared on purpose: one safetensors reader and one
# key check for every kind of checkpoint polyrl loads.
from polyrl.models.hf_io import WEIGHTS_NAME, _check_keys, _read_weights, _write_json
from polyrl.models.rope import Rotary
from polyrl.models.transformer import DecoderModel, RMSNorm, Transformer

CLASSIFIER_ARCHITECTURES = {t: name.replace("ForCausalLM", "ForSequenceClassification")
                            for t, name in ARCHITECTURES.items()}
"""model_type -> the transformers class name written to config.json `architectures`."""


class SequenceClassifier(nn.Module):
    """Decoder + `score` head; `forward` returns (B, num_labels) float32 logits."""

    def __init__(self, cfg: ModelConfig, num_labels: int = 1, seed: int = 0) -> None:
        super().__init__()
        assert num_labels >= 1
        self.cfg = cfg
        self.num_labels = num_labels
        self.rope = Rotary(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling, cfg.max_position_embeddings)
        self.model = DecoderModel(cfg)
        self.score = nn.Linear(cfg.hidden_size, num_labels, bias=False)
        self.init_weights(seed)

    # The very same decoder forward as the causal LM: it reads only self.cfg, self.rope and self.model.
    hidden = Transformer.hidden

    @torch.no_grad()
    def init_weights(self, seed: int) -> None:
        """Normal(0, 0.02) weights, zero biases, unit norms (as Transformer.init_weights); no-op on meta."""
        if self.score.weight.is_meta:
            return
        g = torch.Generator().manual_seed(seed)
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                module.weight.copy_(torch.empty(module.weight.shape).normal_(0.0, 0.02, generator=g))
            if isinstance(module, nn.Linear) and module.bias is not None:
                module.bias.zero_()
            if isinstance(module, RMSNorm):
                module.weight.fill_(1.0)

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None) -> Tensor:
        """input_ids (B, T), attention_mask (B, T) 1 = real token (left or right padding)
        -> logits (B, num_labels) at each row's last real token."""
        B, T = input_ids.shape
        if attention_mask is None:
            attention_mask = torch.ones(B, T, dtype=torch.bool, device=input_ids.device)
        mask = attention_mask.bool()
        if bool((mask[:, 1:] <= mask[:, :-1]).all()):
            # Right padding: real tokens never see the pads after them, so plain causal
            # attention (the fast path) gives them the same outputs.
            h = self.hidden(input_ids)  # (B, T, D)
        else:
            positions = (mask.long().cumsum(-1) - 1).clamp(min=0)  # (B, T): real tokens count from 0
            h = self.hidden(input_ids, positions, CausalAttention(key_padding_mask=mask))  # (B, T, D)
        idx = torch.arange(T, device=input_ids.device)
        last = (idx * mask.long()).argmax(-1)  # (B,) rightmost real token
        return self.score(h[torch.arange(B, device=h.device), last]).float()  # (B, num_labels)


def right_pad(seqs: list[list[int]], pad_id: int) -> tuple[Tensor, Tensor]:
    """Token lists -> ids (B, T) padded on the right with pad_id, and the bool mask (B, T)."""
    T = max(1, max(len(s) for s in seqs))
    ids = torch.full((len(seqs), T), pad_id, dtype=torch.long)
    mask = torch.zeros(len(seqs), T, dtype=torch.bool)
    for i, s in enumerate(seqs):
        ids[i, :len(s)] = torch.tensor(s, dtype=torch.long)
        mask[i, :len(s)] = True
    return ids, mask


def load_classifier(model_dir: str | os.PathLike[str], dtype: torch.dtype = torch.float32,
                    device: str | torch.device = "cpu") -> tuple[SequenceClassifier, ModelConfig]:
    """A SequenceClassifier from an HF *ForSequenceClassification directory."""
    model_dir = Path(model_dir)
    config_path = model_dir / "config.json"
    if not config_path.is_file():
        raise FileNotFoundError(f"{model_dir}: no config.json; is this a Hugging Face model directory?")
    d = json.loads(config_path.read_text())
    archs = d.get("architectures") or []
    if archs and not any(a.endswith("ForSequenceClassification") for a in archs):
        raise ValueError(f"{model_dir}: architectures {archs} is not a sequence classifier; a reward model "
                         f"directory has e.g. {CLASSIFIER_ARCHITECTURES.get(d.get('model_type'), 'LlamaForSequenceClassification')}")
    d = {**d, "tie_word_embeddings": False}  # there is no lm_head to tie
    cfg = ModelConfig.from_hf_dict(d)
    num_labels = len(d["id2label"]) if d.get("id2label") else int(d.get("num_labels", 1))

    tensors = _read_weights(model_dir, dtype, torch.device(device))
    with torch.device("meta"):
        model = SequenceClassifier(cfg, num_labels)
    _check_keys(model_dir, {k: v.shape for k, v in model.state_dict().items()}, tensors)
    model.load_state_dict(tensors, strict=True, assign=True)
    return model.eval(), cfg


def save_classifier(model: SequenceClassifier, model_dir: str | os.PathLike[str]) -> None:
    """Write config.json and model.safetensors that AutoModelForSequenceClassification loads."""
    model_dir = Path(model_dir)
    model_dir.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().to("cpu").contiguous() for k, v in model.state_dict().items()}
    dtype = str(model.score.weight.dtype).removeprefix("torch.")
    tmp = model_dir / (WEIGHTS_NAME + ".tmp")
    save_file(state, str(tmp), metadata={"format": "pt"})
    os.replace(tmp, model_dir / WEIGHTS_NAME)
    config = model.cfg.to_hf_dict(dtype=dtype)
    labels = {str(i): f"LABEL_{i}" for i in range(model.num_labels)}
    config.update(architectures=[CLASSIFIER_ARCHITECTURES[model.cfg.model_type]], tie_word_embeddings=False,
                  id2label=labels, label2id={v: int(k) for k, v in labels.items()}, use_cache=False)
    _write_json(model_dir / "config.json", config)
