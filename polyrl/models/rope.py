"""Rotary position embeddings: inverse frequencies and attention scaling per scaling type.

One place computes RoPE for the trainer's forward pass and the engine's decode kernels
(engine/runner/fused_decode.py builds its cos/sin tables with `Rotary.cos_sin`), so both
see the same table. The types are those transformers' Llama and Qwen2 accept, with the
same formulas (transformers' modeling_rope_utils; d = rotary dim, b = rope_theta,
L = original_max_position_embeddings, s = factor):

- default: θᵢ = b^(−2i/d).
- linear: θᵢ / s (position interpolation).
- dynamic (NTK): θᵢ with base b·(s·ℓ/M − (s−1))^(d/(d−2)), ℓ = max(length, M), M =
  max_position_embeddings. It depends on the sequence length; see `Rotary` for how
  polyrl pins it.
- yarn: high-frequency dims kept, low-frequency dims divided by s, a linear ramp
  between (β_fast, β_slow); cos and sin multiplied by 0.1·ln s + 1 (or the
  mscale / mscale_all_dim ratio, or an explicit attention_factor).
- llama3: wavelengths shorter than L/high_freq_factor kept, longer than
  L/low_freq_factor divided by s, a smooth blend between.

`RopeScaling.from_hf` reads a config.json `rope_scaling` (transformers 4.x) or
`rope_parameters` (5.x) dict and raises a ValueError naming the field for a bad value;
`to_hf` writes the dict transformers reads back.

Out of scope: longrope (per-dimension factors switched by length), partial rotary
dims (partial_rotary_factor < 1), multimodal RoPE (mrope).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any

import torch
from torch import Tensor

ROPE_TYPES = ("default", "linear", "dynamic", "yarn", "llama3")
"""rope_type values this module computes."""

_KEYS = {
    "default": set(),
    "linear": {"factor"},
    "dynamic": {"factor"},
    "yarn": {"factor", "original_max_position_embeddings", "attention_factor", "beta_fast", "beta_slow",
             "mscale", "mscale_all_dim", "truncate"},
    "llama3": {"factor", "original_max_position_embeddings", "low_freq_factor", "high_freq_factor"},
}
"""Fields each type reads, beside rope_type / type / rope_theta (transformers' own lists)."""
_REQUIRED = {"linear": {"factor"}, "dynamic": {"factor"}, "yarn": {"factor"},
             "llama3": {"factor", "low_freq_factor", "high_freq_factor"}}


@dataclass(frozen=True)
class RopeScaling:
    """A RoPE scaling recipe, as in config.json `rope_scaling` / `rope_parameters`."""

    rope_type: str
    """One of ROPE_TYPES other than "default" (no scaling is `None` in ModelConfig)."""
    factor: float
    """s: how many times the original context the scaled RoPE is meant to cover."""
    original_max_position_embeddings: int | None = None
    """L, the context length of pretraining (yarn, llama3); read from max_position_embeddings when absent."""
    low_freq_factor: float | None = None
    """llama3: wavelengths above L / low_freq_factor are divided by s."""
    high_freq_factor: float | None = None
    """llama3: wavelengths below L / high_freq_factor are kept."""
    beta_fast: float | None = None
    """yarn: rotations bounding the extrapolated (kept) dims; transformers' default 32."""
    beta_slow: float | None = None
    """yarn: rotations bounding the interpolated dims; transformers' default 1."""
    mscale: float | None = None
    """yarn (DeepSeek): numerator coefficient of the attention factor."""
    mscale_all_dim: float | None = None
    """yarn (DeepSeek): denominator coefficient of the attention factor."""
    attention_factor: float | None = None
    """yarn: explicit multiplier on cos and sin (overrides the one derived from factor)."""
    truncate: bool | None = None
    """yarn: round the ramp's ends to whole dims (transformers' default true)."""

    @classmethod
    def from_hf(cls, d: dict[str, Any], max_position_embeddings: int, key: str = "rope_scaling") -> RopeScaling | None:
        """Parse a config.json RoPE dict; None for default RoPE. `key` names the field in errors."""
        if not isinstance(d, dict):
            raise ValueError(f"{key} must be a mapping, not {type(d).__name__}")
        rope_type = d.get("rope_type", d.get("type", "default"))
        if rope_type not in ROPE_TYPES:
            raise ValueError(f"{key}.rope_type={rope_type!r} is not supported; supported: {list(ROPE_TYPES)}")
        partial = d.get("partial_rotary_factor", 1.0)
        if partial != 1.0:
            raise ValueError(f"{key}.partial_rotary_factor={partial!r} is not supported; only 1.0 (full rotary dims)")
        known = _KEYS[rope_type] | {"rope_type", "type", "rope_theta", "partial_rotary_factor"}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"{key} has fields {unknown} that rope_type={rope_type!r} does not use; "
                             f"it reads {sorted(_KEYS[rope_type])}")
        if rope_type == "default":
            return None
        missing = sorted(name for name in _REQUIRED[rope_type] if d.get(name) is None)
        if missing:
            raise ValueError(f"{key} with rope_type={rope_type!r} is missing {missing}")
        values = {f.name: d.get(f.name) for f in fields(cls) if f.name != "rope_type"}
        if rope_type in ("yarn", "llama3") and values["original_max_position_embeddings"] is None:
            values["original_max_position_embeddings"] = max_position_embeddings  # as transformers does
        scaling = cls(rope_type=rope_type, **values)
        scaling.validate(key)
        return scaling

    def validate(self, key: str = "rope_scaling") -> None:
        """Raise ValueError naming `key`.<field> for a value the formulas cannot use."""
        def number(name: str, low: float, inclusive: bool = True) -> None:
            value = getattr(self, name)
            if value is None:
                return
            ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and (
                value >= low if inclusive else value > low)
            if not ok:
                raise ValueError(f"{key}.{name}={value!r} must be a number {'>=' if inclusive else '>'} {low}")

        if self.rope_type not in ROPE_TYPES[1:]:
            raise ValueError(f"{key}.rope_type={self.rope_type!r} is not supported; supported: {list(ROPE_TYPES)}")
        needed = _REQUIRED[self.rope_type] | ({"original_max_position_embeddings"} if self.rope_type in ("yarn", "llama3")
                                             else set())
        missing = sorted(name for name in needed if getattr(self, name) is None)
        if missing:
            raise ValueError(f"{key} with rope_type={self.rope_type!r} is missing {missing}")
        number("factor", 1.0)
        for name in ("low_freq_factor", "high_freq_factor", "beta_fast", "beta_slow", "mscale", "mscale_all_dim"):
            number(name, 0.0)
        number("attention_factor", 0.0, inclusive=False)
        L = self.original_max_position_embeddings
        if L is not None and (not isinstance(L, int) or isinstance(L, bool) or L <= 0):
            raise ValueError(f"{key}.original_max_position_embeddings={L!r} must be a positive integer")
        if self.rope_type == "llama3" and self.high_freq_factor <= self.low_freq_factor:
            raise ValueError(f"{key}.high_freq_factor={self.high_freq_factor} must exceed "
                             f"low_freq_factor={self.low_freq_factor}")
        if self.truncate is not None and not isinstance(self.truncate, bool):
            raise ValueError(f"{key}.truncate={self.truncate!r} must be true or false")

    def to_hf(self) -> dict[str, Any]:
        """The config.json dict (without rope_theta): rope_type plus the fields that are set."""
        d: dict[str, Any] = {"rope_type": self.rope_type}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name != "rope_type" and value is not None and f.name in _KEYS[self.rope_type]:
                d[f.name] = value
        return d


def inv_freq_and_scale(head_dim: int, theta: float, scaling: RopeScaling | None, max_position_embeddings: int,
                       seq_len: int | None = None) -> tuple[Tensor, float]:
    """Inverse frequencies (head_dim/2,) float32 and the factor multiplying cos and sin.

    seq_len matters to dynamic NTK only: the length the base is stretched for (None or
    anything up to max_position_embeddings gives the unscaled base).
    """
    d = head_dim
    exponents = torch.arange(0, d, 2).float() / d  # (d/2,)
    if scaling is None:
        return 1.0 / theta ** exponents, 1.0
    s = scaling.factor
    if scaling.rope_type == "linear":
        return 1.0 / theta ** exponents / s, 1.0
    if scaling.rope_type == "dynamic":
        length = max(seq_len or 0, max_position_embeddings)
        base = theta * ((s * length / max_position_embeddings) - (s - 1)) ** (d / (d - 2))
        return 1.0 / base ** exponents, 1.0
    L = scaling.original_max_position_embeddings
    assert L is not None, "from_hf fills original_max_position_embeddings for yarn and llama3"
    if scaling.rope_type == "yarn":
        return _yarn(d, theta, scaling, L, exponents)
    inv_freq = 1.0 / theta ** exponents  # llama3
    low_wavelen, high_wavelen = L / scaling.low_freq_factor, L / scaling.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / s, inv_freq)
    smooth = (L / wavelen - scaling.low_freq_factor) / (scaling.high_freq_factor - scaling.low_freq_factor)
    blended = (1 - smooth) * scaled / s + smooth * scaled
    medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
    return torch.where(medium, blended, scaled), 1.0


def _yarn(d: int, theta: float, scaling: RopeScaling, L: int, exponents: Tensor) -> tuple[Tensor, float]:
    s = scaling.factor

    def mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    attention = scaling.attention_factor
    if attention is None:
        if scaling.mscale and scaling.mscale_all_dim:
            attention = float(mscale(s, scaling.mscale) / mscale(s, scaling.mscale_all_dim))
        else:
            attention = mscale(s)

    def correction_dim(rotations: float) -> float:  # the dim completing `rotations` turns over L positions
        return (d * math.log(L / (rotations * 2 * math.pi))) / (2 * math.log(theta))

    low, high = correction_dim(scaling.beta_fast or 32), correction_dim(scaling.beta_slow or 1)
    if scaling.truncate is not False:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, d - 1)
    if low == high:
        high += 0.001  # no zero-width ramp
    ramp = ((torch.arange(d // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)  # (d/2,)
    keep = 1 - ramp  # 1: extrapolate (keep θᵢ), 0: interpolate (θᵢ / s)
    pos_freqs = theta ** exponents
    inv_freq = (1.0 / (s * pos_freqs)) * (1 - keep) + (1.0 / pos_freqs) * keep
    return inv_freq, attention


def cos_sin(positions: Tensor, inv_freq: Tensor, scale: float, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """positions (B, T) -> cos, sin (B, T, hd), computed in float32 then cast to dtype, in
    HF's rotate_half layout except that the first half of sin is negated (transformer.apply_rope)."""
    freqs = positions[..., None].float() * inv_freq.to(positions.device)  # (B, T, hd/2)
    cos, sin = torch.cat((freqs, freqs), dim=-1).cos(), freqs.sin()
    if scale != 1.0:  # yarn: both multiplied, so attention logits scale by scale² (as in transformers)
        cos, sin = cos * scale, sin * scale
    return cos.to(dtype), torch.cat((-sin, sin), dim=-1).to(dtype)


class Rotary:
    """The RoPE table of one model: `cos_sin(positions, dtype)`.

    Dynamic NTK stretches the base for the current sequence length. Keys in a KV cache
    keep the base they were rotated with, so a base that moves with the length would mix
    bases inside one cache, and make a sequence's logprobs depend on what else shares
    its batch. polyrl therefore pins the length: `dynamic_length` (default
    max_position_embeddings · factor, the longest context the scaling is meant for, as
    vLLM does), used by the trainer's forward and the engine alike, so trainer and engine
    agree and a prefix's logits never depend on what follows. Set `dynamic_length = None`
    for transformers' own behaviour (the base for the longest position of each call):
    equal to transformers' logits on a cache-free forward, and refused by the engine's
    fused decode (whose tables are cached).
    """

    def __init__(self, head_dim: int, theta: float, scaling: RopeScaling | None, max_position_embeddings: int) -> None:
        self.head_dim, self.theta, self.scaling = head_dim, theta, scaling
        self.max_position_embeddings = max_position_embeddings
        dynamic = scaling is not None and scaling.rope_type == "dynamic"
        self.dynamic_length: int | None = round(max_position_embeddings * scaling.factor) if dynamic else None
        self._table: tuple[int | None, Tensor, float] | None = None  # (the length it is for, inv_freq, scale)
        self._on_device: dict[torch.device, Tensor] = {}  # the table's inv_freq copied to each device used

    @property
    def per_call(self) -> bool:
        """True when the table depends on the positions of each call (dynamic NTK, unpinned)."""
        return self.scaling is not None and self.scaling.rope_type == "dynamic" and self.dynamic_length is None

    def inv_freq_and_scale(self, seq_len: int | None = None) -> tuple[Tensor, float]:
        """(hd/2,) inverse frequencies and the cos/sin factor; seq_len is used only when `per_call`."""
        length = seq_len if self.per_call else self.dynamic_length
        if self._table is None or self._table[0] != length:
            inv_freq, scale = inv_freq_and_scale(self.head_dim, self.theta, self.scaling,
                                                 self.max_position_embeddings, length)
            self._table = (length, inv_freq, scale)
            self._on_device = {}
        return self._table[1], self._table[2]

    def cos_sin(self, positions: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """positions (B, T) -> cos, sin (B, T, hd) (see `cos_sin`)."""
        inv_freq, scale = self.inv_freq_and_scale(int(positions.max()) + 1 if self.per_call else None)
        if positions.device not in self._on_device:  # one host-to-device copy per table, not per call
            self._on_device[positions.device] = inv_freq.to(positions.device)
        return cos_sin(positions, self._on_device[positions.device], scale, dtype)
