"""Architecture of a decoder-only model, and its translation to and from HF config.json.

Supported families: Llama, Qwen2 and Qwen3 with RoPE (default, or scaled: linear,
dynamic NTK, yarn, llama3; see rope.py), full (causal) attention and a SwiGLU MLP. Out
of scope, rejected by `from_hf_dict` with a clear error: longrope and partial rotary
dims, sliding-window attention, activations other than SiLU, MLP biases, MoE.

`from_hf_dict` reads configs written by transformers 4.4x (`rope_theta`,
`rope_scaling`) and 5.x (`rope_parameters`); `to_hf_dict` writes both spellings so
either version loads the directory.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from polyrl.models.rope import RopeScaling

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
    rope_scaling: RopeScaling | None = None
    """RoPE scaling (linear, dynamic, yarn, llama3; a config.json dict is parsed); None for plain RoPE."""
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
        if isinstance(self.rope_scaling, dict):  # as written in config.json
            self.rope_scaling = RopeScaling.from_hf(self.rope_scaling, self.max_position_embeddings)
        elif self.rope_scaling is not None:
            self.rope_scaling.validate()

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
        theta, scaling = _rope(d)
        return cls(
            model_type=model_type,
            head_dim=head_dim,
            rope_theta=float(theta),
            rope_scaling=scaling,
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
            # 4.x reads rope_scaling; 5.x reads rope_scaling when set, else rope_parameters
            "rope_scaling": None if self.rope_scaling is None else self.rope_scaling.to_hf(),
            "rope_parameters": {"rope_type": "default", **({} if self.rope_scaling is None else self.rope_scaling.to_hf()),
                                "rope_theta": self.rope_theta},
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


def _rope(d: dict[str, Any]) -> tuple[float, RopeScaling | None]:
    """RoPE base and scaling from 4.x (`rope_theta`, `rope_scaling`) or 5.x (`rope_parameters`) fields.

    transformers 5.x prefers a non-null `rope_scaling` over `rope_parameters`; so do we.
    Raises ValueError naming the field for an unsupported type or a bad value.
    """
    theta = d.get("rope_theta", 10000.0)
    chosen: tuple[str, dict[str, Any]] | None = None
    for key in ("rope_parameters", "rope_scaling"):  # the later wins
        params = d.get(key)
        if params is None:
            continue
        if not isinstance(params, dict):
            raise ValueError(f"{key} must be a mapping, not {type(params).__name__}")
        theta = params.get("rope_theta", theta)
        chosen = (key, params)
    if chosen is None:
        return theta, None
    key, params = chosen
    return theta, RopeScaling.from_hf(params, d.get("max_position_embeddings", 2048), key)
