"""Tokenizer: a Hugging Face `tokenizer.json` plus the chat template of
`tokenizer_config.json`, and the builder of the tiny model's own tokenizer.

We use the `tokenizers` library directly (fast, no transformers import at run time)
and render chat templates with jinja2 the way transformers does, so any Hugging Face
model directory with a tokenizer.json works. Out of scope: slow (Python/sentencepiece)
tokenizers without a tokenizer.json, and chat templates that need custom filters.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterable

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Regex, Tokenizer as HFTokenizer, decoders, models, pre_tokenizers, trainers

IM_START, IM_END, ENDOFTEXT = "<|im_start|>", "<|im_end|>", "<|endoftext|>"

# ChatML, as Qwen models use it: the generation prompt opens the assistant turn.
CHATML_TEMPLATE = (
    "{%- for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{%- endif %}"
)


def _raise(message: str) -> None:
    raise jinja2.TemplateError(message)


def _from_json(text: str, config: dict[str, Any], cls: type) -> "Tokenizer":
    return cls(HFTokenizer.from_str(text), config)


class Tokenizer:
    """Encode/decode plus chat templating for one model directory."""

    def __init__(self, tok: HFTokenizer, config: dict[str, Any]):
        self.tok = tok
        self.config = config
        template = config.get("chat_template")
        if isinstance(template, list):  # some models ship named templates
            template = next((t["template"] for t in template if t.get("name") == "default"), None)
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.globals["raise_exception"] = _raise
        self._template = env.from_string(template) if template else None
        self.eos_token = _token_text(config.get("eos_token"))
        self.pad_token = _token_text(config.get("pad_token")) or self.eos_token
        self.bos_token = _token_text(config.get("bos_token"))
        self.eos_token_id = self.tok.token_to_id(self.eos_token) if self.eos_token else None
        self.pad_token_id = self.tok.token_to_id(self.pad_token) if self.pad_token else None

    def __reduce__(self):
        """Pickle as the tokenizer's JSON and config (the compiled template is rebuilt), so that
        engine worker processes receive it."""
        return _from_json, (self.tok.to_str(), self.config, type(self))

    @classmethod
    def from_dir(cls, model_dir: str | Path) -> "Tokenizer":
        model_dir = Path(model_dir)
        path = model_dir / "tokenizer.json"
        if not path.exists():
            raise FileNotFoundError(f"{model_dir}: no tokenizer.json (polyrl needs a fast tokenizer file)")
        config_path = model_dir / "tokenizer_config.json"
        config = json.loads(config_path.read_text()) if config_path.exists() else {}
        template_path = model_dir / "chat_template.jinja"  # newer transformers write it separately
        if "chat_template" not in config and template_path.exists():
            config["chat_template"] = template_path.read_text()
        return cls(HFTokenizer.from_file(str(path)), config)

    @property
    def vocab_size(self) -> int:
        return self.tok.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str) -> list[int]:
        return self.tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = True) -> str:
        return self.tok.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def chat_prompt(self, user: str, system: str | None = None) -> str:
        """The text of a one-turn conversation, ending where the assistant starts."""
        messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": user}]
        return self.apply_chat_template(messages, add_generation_prompt=True)

    def apply_chat_template(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True,
                            tools: list[dict[str, Any]] | None = None) -> str:
        """The conversation as the model's template lays it out; `tools` (OpenAI tool specs) go to
        templates that read them (`chat_template_source()` mentions them) as Hugging Face passes them."""
        if self._template is None:
            raise ValueError("this tokenizer has no chat_template in tokenizer_config.json")
        extra = {"tools": tools} if tools else {}
        return self._template.render(
            messages=messages,
            add_generation_prompt=add_generation_prompt,
            bos_token=self.bos_token or "",
            eos_token=self.eos_token or "",
            **extra,
        )

    def chat_template_source(self) -> str:
        """The chat template's Jinja text ("" when the model has none)."""
        template = self.config.get("chat_template") or ""
        if isinstance(template, list):
            template = next((t["template"] for t in template if t.get("name") == "default"), "")
        return template

    def stop_token_ids(self) -> list[int]:
        """Token ids that end an assistant turn: EOS and, for ChatML models, <|im_end|>."""
        ids = {self.eos_token_id, self.tok.token_to_id(IM_END), self.tok.token_to_id(ENDOFTEXT)}
        return sorted(i for i in ids if i is not None)


def _token_text(value: Any) -> str | None:
    if isinstance(value, dict):  # AddedToken serialisation
        return value.get("content")
    return value


def train_tiny_tokenizer(corpus: Iterable[str], vocab_size: int) -> HFTokenizer:
    """Byte-level BPE trained on `corpus`, with every digit its own token.

    Single-digit tokens keep arithmetic learnable for a tiny model (a BPE that merges
    "47" into one token hides the digits from it); merges elsewhere shorten sequences
    against bytes, and sequence length is what the tiny model's speed depends on most.
    """
    tok = HFTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.Split(Regex(r"\\boxed"), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[ENDOFTEXT, IM_START, IM_END],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus, trainer=trainer)
    return tok


def save_tokenizer(tok: HFTokenizer, model_dir: str | Path, chat_template: str = CHATML_TEMPLATE,
                   model_max_length: int = 512) -> None:
    """Write tokenizer.json + tokenizer_config.json that transformers' AutoTokenizer loads."""
    model_dir = Path(model_dir)
    model_dir.mkdir(parents=True, exist_ok=True)
    tok.save(str(model_dir / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "chat_template": chat_template,
        "eos_token": IM_END,
        "pad_token": ENDOFTEXT,
        "bos_token": None,
        "unk_token": None,
        "model_max_length": model_max_length,
        "clean_up_tokenization_spaces": False,
        "added_tokens_decoder": {
            str(tok.token_to_id(t)): {"content": t, "special": True, "lstrip": False, "rstrip": False,
                                      "normalized": False, "single_word": False}
            for t in (ENDOFTEXT, IM_START, IM_END)
        },
    }
    (model_dir / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
    (model_dir / "special_tokens_map.json").write_text(
        json.dumps({"eos_token": IM_END, "pad_token": ENDOFTEXT}, indent=2))
