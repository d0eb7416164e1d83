"""Architecture of a decoder-only model, and its translation to and from HF config.json.

Supported families: Llama, Qwen2 and Qwen3 with default RoPE, full (causal) attention
and a SwiGLU MLP. Out of scope, rejected by `from_hf_dict` with a clear error: RoPE
scaling variants (linear, dynamic, yarn, llama3, ...), sliding-window attention,
activations other than SiLU, MLP biases, MoE.

`from_hf_dict` reads configs written by transformers 4.4x (`rope_theta`,
`rope_scaling`) and 5.x (`rope_parameters`); `to_hf_dict` writes both spellings so
either version loads the directory.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}
"""model_type -> the transformers class name written to config.json `architectures`."""

_REQUIRED = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads")


@dataclass
class ModelConfig:
    """Everything the forward pass depends on; nothing about training or sampling."""

    model_type: str
    """Family: "llama", "qwen2" or "qwen3"."""
    vocab_size: int
    """Rows of the embedding matrix (and of lm_head)."""
    hidden_size: int
    """Width D of the residual stream."""
    intermediate_size: int
    """Width of the SwiGLU MLP's hidden layer."""
    num_hidden_layers: int
    """Number of decoder layers."""
    num_attention_heads: int
    """Query heads per layer."""
    num_key_value_heads: int | None = None
    """Key/value heads (grouped-query attention); defaults to num_attention_heads."""
    head_dim: int | None = None
    """Per-head width; defaults to hidden_size // num_attention_heads."""
    max_position_embeddings: int = 2048
    """Longest context the model was trained for (informational; RoPE has no table)."""
    rms_norm_eps: float = 1e-6
    """Epsilon inside every RMSNorm."""
    rope_theta: float = 10000.0
    """RoPE base frequency."""
    tie_word_embeddings: bool = False
    """lm_head shares its weight with embed_tokens."""
    attention_bias: bool | None = None
    """Bias on q_proj, k_proj, v_proj; defaults to the family's (Qwen2 always has it)."""
    bos_token_id: int | None = None
    """Beginning-of-sequence token, if the tokenizer uses one."""
    eos_token_id: int | list[int] | None = None
    """End-of-sequence token(s); generation stops at any of them."""
    pad_token_id: int | None = None
    """Padding token, if defined."""

    def __post_init__(self) -> None:
        if self.model_type not in ARCHITECTURES:
            raise ValueError(
                f"model_type={self.model_type!r} is not supported; supported: {sorted(ARCHITECTURES)}"
            )
        for name in _REQUIRED:
            if getattr(self, name) <= 0:
                raise ValueError(f"{name}={getattr(self, name)} must be a positive integer")
        if self.num_key_value_heads is None:
            self.num_key_value_heads = self.num_attention_heads
        if self.num_attention_heads % self.num_key_value_heads != 0:
            raise ValueError(
                f"num_attention_heads={self.num_attention_heads} must be a multiple of "
                f"num_key_value_heads={self.num_key_value_heads}"
            )
        if self.head_dim is None:
            if self.hidden_size % self.num_attention_heads != 0:
                raise ValueError(
                    f"hidden_size={self.hidden_size} is not divisible by num_attention_heads="
                    f"{self.num_attention_heads}; set head_dim explicitly"
                )
            self.head_dim = self.hidden_size // self.num_attention_heads
        if self.head_dim % 2 != 0:
            raise ValueError(f"head_dim={self.head_dim} must be even for RoPE")
        if self.attention_bias is None:
            self.attention_bias = self.model_type == "qwen2"
        if self.model_type == "qwen2" and not self.attention_bias:
            raise ValueError("qwen2 always has q/k/v biases; attention_bias=False is not expressible")

    @property
    def attention_out_bias(self) -> bool:
        """Bias on o_proj: Llama and Qwen3 tie it to attention_bias; Qwen2 never has one."""
        return bool(self.attention_bias) and self.model_type != "qwen2"

    @property
    def qk_norm(self) -> bool:
        """RMSNorm over each q and k head before RoPE (Qwen3)."""
        return self.model_type == "qwen3"

    @classmethod
    def from_hf_dict(cls, d: dict[str, Any]) -> ModelConfig:
        """Parse a config.json dict (transformers 4.4x or 5.x) into a ModelConfig."""
        model_type = d.get("model_type")
        if model_type not in ARCHITECTURES:
            raise ValueError(
                f"model_type={model_type!r} is not supported; supported: {sorted(ARCHITECTURES)}"
            )
        missing = [name for name in _REQUIRED if name not in d]
        if missing:
            raise ValueError(f"{model_type} config is missing required fields {missing}")
        if d.get("hidden_act", "silu") != "silu":
            raise ValueError(f"hidden_act={d['hidden_act']!r} is not supported; only 'silu'")
        if d.get("mlp_bias", False):
            raise ValueError("mlp_bias=true is not supported; only bias-free MLPs")
        if d.get("use_sliding_window", False):
            raise ValueError("use_sliding_window=true is not supported; only full attention")
        fields = {name: d[name] for name in _REQUIRED}
        for name in ("num_key_value_heads", "max_position_embeddings", "rms_norm_eps",
                     "tie_word_embeddings", "bos_token_id", "eos_token_id", "pad_token_id"):
            if d.get(name) is not None:
                fields[name] = d[name]
        # Qwen3's HF default head_dim is 128, not hidden_size // num_attention_heads.
        head_dim = d.get("head_dim", 128 if model_type == "qwen3" else None)
        return cls(
            model_type=model_type,
            head_dim=head_dim,
            rope_theta=float(_rope_theta(d)),
            attention_bias=True if model_type == "qwen2" else bool(d.get("attention_bias", False)),
            **fields,
        )

    def to_hf_dict(self, dtype: str = "float32") -> dict[str, Any]:
        """A config.json dict that transformers (4.4x and 5.x) loads as the same architecture.

        dtype: the dtype of the saved weights, e.g. "float32" or "bfloat16".
        """
        d: dict[str, Any] = {
            "architectures": [ARCHITECTURES[self.model_type]],
            "model_type": self.model_type,
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "max_position_embeddings": self.max_position_embeddings,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "rope_scaling": None,
            "rope_parameters": {"rope_type": "default", "rope_theta": self.rope_theta},
            "tie_word_embeddings": self.tie_word_embeddings,
            "hidden_act": "silu",
            "attention_dropout": 0.0,
            "torch_dtype": dtype,
            "dtype": dtype,
            "use_cache": True,
            "bos_token_id": self.bos_token_id,
            "eos_token_id": self.eos_token_id,
            "pad_token_id": self.pad_token_id,
        }
        if self.model_type == "llama":
            d.update(attention_bias=self.attention_bias, mlp_bias=False)
        if self.model_type == "qwen3":
            d["attention_bias"] = self.attention_bias
        if self.model_type in ("qwen2", "qwen3"):
            d.update(use_sliding_window=False, sliding_window=None)
        return d


def _rope_theta(d: dict[str, Any]) -> float:
    """RoPE base from 4.x (`rope_theta`, `rope_scaling`) or 5.x (`rope_parameters`) fields.

    Raises ValueError for any rope type other than "default".
    """
    theta = d.get("rope_theta", 10000.0)
    for key in ("rope_scaling", "rope_parameters"):
        params = d.get(key)
        if params is None:
            continue
        rope_type = params.get("rope_type", params.get("type", "default"))
        if rope_type != "default":
            raise ValueError(
                f"{key}.rope_type={rope_type!r} is not supported; only 'default' RoPE "
                f"(no scaling) is implemented"
            )
        theta = params.get("rope_theta", theta)
    return theta
