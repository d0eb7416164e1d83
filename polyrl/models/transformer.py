"""Decoder-only transformer of the Llama / Qwen2 / Qwen3 family.

Pre-norm residual blocks: RMSNorm -> grouped-query attention with RoPE -> residual,
RMSNorm -> SwiGLU MLP -> residual; a final RMSNorm and lm_head. Module names mirror
Hugging Face, so `state_dict()` keys are the HF safetensors keys (plus `lm_head.weight`
aliasing `model.embed_tokens.weight` when embeddings are tied).

Who sees which keys is the `AttentionBackend`'s business (see attention.py), so the
same code serves training (no cache), a dense KV cache and a paged one.

RoPE tables, scaled or not, come from rope.py (`Transformer.rope`).

Out of scope: sliding-window attention, dropout, MoE.
Compute runs in the parameter dtype (RMSNorm and RoPE tables in float32, as in HF);
logits are returned as float32.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from polyrl.models.attention import AttentionBackend, CausalAttention
from polyrl.models.config import ModelConfig
from polyrl.models.rope import Rotary, cos_sin, inv_freq_and_scale


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        if x.dtype == torch.float32 and self.weight.dtype == torch.float32:
            return F.rms_norm(x, self.weight.shape, self.weight, self.eps)  # the same math, one fused kernel
        # Normalise in float32 and scale in the input dtype, exactly as HF does.
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def rope_cos_sin(positions: Tensor, head_dim: int, theta: float, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """Unscaled RoPE: positions (B, T) -> cos, sin (B, T, hd), computed in float32 then cast
    to dtype, in HF's rotate_half layout except that the first half of sin is negated (see
    apply_rope). A model's own table, scaled or not, is `Transformer.rope.cos_sin`."""
    inv_freq, scale = inv_freq_and_scale(head_dim, theta, None, 0)
    return cos_sin(positions, inv_freq, scale, dtype)


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """x (B, nh, T, hd); cos, sin (B, T, hd) from rope_cos_sin.

    HF's x * cos + rotate_half(x) * sin with rotate_half(x) = (-x2, x1), written as
    roll(x) = (x2, x1) times a sin whose first half is negated: the same products (a
    negation is exact), bit for bit, in fewer operations."""
    cos, sin = cos[:, None], sin[:, None]  # (B, 1, T, hd): broadcast over heads
    return x * cos + x.roll(x.shape[-1] // 2, dims=-1) * sin


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int) -> None:
        super().__init__()
        self.layer = layer
        D, hd = cfg.hidden_size, cfg.head_dim
        self.n_heads, self.n_kv_heads, self.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, hd
        self.q_proj = nn.Linear(D, self.n_heads * hd, bias=cfg.attention_bias)
        self.k_proj = nn.Linear(D, self.n_kv_heads * hd, bias=cfg.attention_bias)
        self.v_proj = nn.Linear(D, self.n_kv_heads * hd, bias=cfg.attention_bias)
        self.o_proj = nn.Linear(self.n_heads * hd, D, bias=cfg.attention_out_bias)
        if cfg.qk_norm:
            self.q_norm = RMSNorm(hd, cfg.rms_norm_eps)
            self.k_norm = RMSNorm(hd, cfg.rms_norm_eps)
        self.qk_norm = cfg.qk_norm

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, attention: AttentionBackend) -> Tensor:
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.n_heads, self.head_dim)  # (B, T, nh, hd)
        k = self.k_proj(x).view(B, T, self.n_kv_heads, self.head_dim)  # (B, T, nkv, hd)
        v = self.v_proj(x).view(B, T, self.n_kv_heads, self.head_dim)  # (B, T, nkv, hd)
        if self.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # (B, heads, T, hd)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        y = attention.attend(self.layer, q, k, v)  # (B, nh, T, hd)
        y = y.transpose(1, 2).reshape(B, T, self.n_heads * self.head_dim)  # (B, T, nh*hd)
        return self.o_proj(y)


class MLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x))."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg, layer)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, attention: AttentionBackend) -> Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, attention)
        return x + self.mlp(self.post_attention_layernorm(x))


class DecoderModel(nn.Module):
    """The `model.` prefix of HF checkpoints: embeddings, layers, final norm."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg, i) for i in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class Transformer(nn.Module):
    def __init__(self, cfg: ModelConfig, seed: int = 0) -> None:
        """A randomly initialised model (see `init_weights`); `hf_io.load_pretrained` fills real weights."""
        super().__init__()
        self.cfg = cfg
        self.rope = Rotary(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling, cfg.max_position_embeddings)
        self.model = DecoderModel(cfg)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.tie_weights()
        self.init_weights(seed)

    def tie_weights(self) -> None:
        """Make lm_head.weight the very same Parameter as embed_tokens.weight, when tied."""
        if self.cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    @torch.no_grad()
    def init_weights(self, seed: int) -> None:
        """Normal(0, 0.02) for linear and embedding weights, zero biases, unit norms.

        Drawn on CPU, so a seed gives the same weights whatever the device. A model on
        the meta device (built only to be filled by load_state_dict) is left alone.
        """
        if self.lm_head.weight.is_meta:
            return
        g = torch.Generator().manual_seed(seed)
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                w = torch.empty(module.weight.shape).normal_(0.0, 0.02, generator=g)
                module.weight.copy_(w)
            if isinstance(module, nn.Linear) and module.bias is not None:
                module.bias.zero_()
            if isinstance(module, RMSNorm):
                module.weight.fill_(1.0)

    def hidden(
        self,
        input_ids: Tensor,  # (B, T)
        positions: Tensor | None = None,  # (B, T) absolute positions; default arange(T)
        attention: AttentionBackend | None = None,
    ) -> Tensor:
        """Final-normed hidden states (B, T, D); project chosen positions with `self.lm_head`."""
        B, T = input_ids.shape
        if positions is None:
            positions = torch.arange(T, device=input_ids.device).expand(B, T)
        if attention is None:
            attention = CausalAttention()
        x = self.model.embed_tokens(input_ids)  # (B, T, D)
        cos, sin = self.rope.cos_sin(positions, x.dtype)  # (B, T, hd)
        for layer in self.model.layers:
            x = layer(x, cos, sin, attention)
        return self.model.norm(x)

    def forward(
        self,
        input_ids: Tensor,  # (B, T)
        positions: Tensor | None = None,  # (B, T)
        attention: AttentionBackend | None = None,
    ) -> Tensor:
        """Logits (B, T, V) in float32."""
        return self.lm_head(self.hidden(input_ids, positions, attention)).float()
