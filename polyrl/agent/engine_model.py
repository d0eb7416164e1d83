"""The agent loop's in-process backend: a polyrl Engine behind the tokenizer's chat template.

Messages are rendered with the model's chat template (ChatML for the tiny model; the
tool list is in the system prompt, calls are text, see call_format.py) and sent to the
Engine as token ids. The backend keeps the episode's tokens the way RL needs them
(token in, token out: what the policy generated is trained on exactly as sampled):

- the policy's generated ids are appended verbatim, never re-tokenised, with their
  logprobs and loss mask 1;
- everything else (system prompt, task, tool results, template markup) is appended
  as the tokens of the *new* text only (the rendered prompt minus what the tokens so
  far already stand for), with loss mask 0.

So as long as each prompt extends the previous one, an episode is one token sequence
the trainer can score in a single forward pass. When the loop rewrites the history
(compression, truncation) the new prompt no longer extends it, and a new `Segment`
starts; each segment is then a training row of its own, and the episode's advantage
is broadcast to every segment.

One EngineChatModel serves one episode (it holds that episode's tokens). For many
episodes at once, `polyrl.rollout.episodes` calls `prepare` and `finish` around one
batched `Engine.generate`; `complete` does both for a single call.

`training_tokens` lays out a demonstration exactly as a rollout would, for SFT.

Out of scope: templates that are not prefix-stable across turns (Qwen3 strips earlier
<think> blocks): they still work, every call then starts a new segment.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Sequence

from polyrl.agent.call_format import parse_calls
from polyrl.agent.model import Message, ModelReply, ModelRequest, Usage
from polyrl.agent.tools import ToolBox
from polyrl.engine.base import Engine, SamplingParams
from polyrl.models.tokenizer import IM_END, Tokenizer
from polyrl.types import Completion


@dataclass
class Segment:
    """One contiguous token sequence of an episode."""

    token_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    """1 on tokens the policy generated, 0 on everything else."""
    logprobs: list[float] = field(default_factory=list)
    """The sampling logprob of each generated token; 0.0 where loss_mask is 0."""
    text: str = ""
    """What the tokens stand for, special tokens included (to test the next prompt against)."""


class TokenTrace:
    """The token sequences of one episode, built prompt by prompt."""

    def __init__(self, tokenizer: Tokenizer):
        self.tokenizer = tokenizer
        self.segments: list[Segment] = []

    def _delta(self, text: str) -> str | None:
        """The part of `text` after the current segment, or None if it does not extend it."""
        if self.segments and text.startswith(self.segments[-1].text):
            return text[len(self.segments[-1].text):]
        return None

    def measure(self, text: str) -> int:
        """How many tokens the prompt `text` will be, exactly as `prompt` lays it out."""
        delta = self._delta(text)
        if delta is None:
            return len(self.tokenizer.encode(text))
        return len(self.segments[-1].token_ids) + len(self.tokenizer.encode(delta))

    def prompt(self, text: str) -> list[int]:
        """The token ids of prompt `text`: the current segment extended, or a new one."""
        delta = self._delta(text)
        if delta is None:
            self.segments.append(Segment())
            delta = text
        seg = self.segments[-1]
        ids = self.tokenizer.encode(delta)
        seg.token_ids += ids
        seg.loss_mask += [0] * len(ids)
        seg.logprobs += [0.0] * len(ids)
        seg.text = text
        return list(seg.token_ids)

    def generated(self, token_ids: Sequence[int], logprobs: Sequence[float]) -> None:
        assert self.segments, "a completion follows a prompt"
        assert len(token_ids) == len(logprobs)
        seg = self.segments[-1]
        seg.token_ids += token_ids
        seg.loss_mask += [1] * len(token_ids)
        seg.logprobs += list(logprobs)
        seg.text += self.tokenizer.decode(token_ids, skip_special_tokens=False)


def template_messages(messages: Sequence[Message]) -> list[dict[str, str]]:
    """Messages as a chat template reads them: role and string content."""
    return [{"role": m["role"], "content": str(m.get("content") or "")} for m in messages]


def render_prompt(tokenizer: Tokenizer, messages: Sequence[Message]) -> str:
    return tokenizer.apply_chat_template(template_messages(messages), add_generation_prompt=True)


class EngineChatModel:
    """ChatModel over an Engine, for one episode; see the module docstring."""

    provider = "polyrl"
    tool_format = "text"

    def __init__(self, engine: Engine, tokenizer: Tokenizer, sampling: SamplingParams = SamplingParams(),
                 name: str = "policy", context_window: int | None = None, tools_style: str = "compact"):
        self.engine = engine
        self.tokenizer = tokenizer
        self.sampling = sampling
        self.name = name
        self.context_window = context_window
        self.tools_style = tools_style
        self.trace = TokenTrace(tokenizer)
        self.weight_versions: list[int] = []
        """Weight version of each call's completion, in order."""
        self._stop_ids = set(tokenizer.stop_token_ids()) | set(sampling.stop_token_ids)

    def count_tokens(self, messages: list[Message], tools: ToolBox) -> int:
        return self.trace.measure(render_prompt(self.tokenizer, messages))

    def prepare(self, request: ModelRequest) -> list[int]:
        """Prompt ids of `request`, recorded in the episode's tokens."""
        return self.trace.prompt(render_prompt(self.tokenizer, request.messages))

    def sampling_for(self, request: ModelRequest) -> SamplingParams:
        return replace(self.sampling, max_tokens=request.max_tokens)

    def finish(self, prompt_ids: list[int], completion: Completion, duration_s: float) -> ModelReply:
        """The reply of `completion`, its tokens recorded (loss mask 1)."""
        self.trace.generated(completion.token_ids, completion.logprobs)
        self.weight_versions.append(completion.weight_version)
        ids = completion.token_ids
        if ids and ids[-1] in self._stop_ids:
            ids = ids[:-1]  # the template adds the end-of-turn token itself
        text = self.tokenizer.decode(ids, skip_special_tokens=False)
        # num_cached_tokens: prompt tokens a prefix-caching engine served from cache
        # (0 from the dense engine, which has no cache).
        usage = Usage(len(prompt_ids), len(completion.token_ids), completion.num_cached_tokens)
        step = len(self.weight_versions) - 1
        return ModelReply(text, parse_calls(text, f"call_{step}"), {"role": "assistant", "content": text}, usage,
                          completion.finish_reason, self.name, duration_s)

    def complete(self, request: ModelRequest) -> ModelReply:
        prompt_ids = self.prepare(request)
        start = time.perf_counter()
        completion = self.engine.generate([prompt_ids], 1, self.sampling_for(request))[0]
        return self.finish(prompt_ids, completion, time.perf_counter() - start)


def training_tokens(tokenizer: Tokenizer, messages: Sequence[Message]) -> Segment:
    """A demonstration (system, user, assistant, tool, ..., assistant) as one token
    sequence laid out like a rollout, loss mask 1 on the assistant turns and their
    end-of-turn tokens. Messages after the last assistant turn are left out."""
    end_of_turn = tokenizer.tok.token_to_id(IM_END)
    end_of_turn = end_of_turn if end_of_turn is not None else tokenizer.eos_token_id
    if end_of_turn is None:
        raise ValueError("training_tokens needs a tokenizer with <|im_end|> or an eos token (the end of a turn)")
    trace = TokenTrace(tokenizer)
    for k, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        trace.prompt(render_prompt(tokenizer, messages[:k]))
        ids = tokenizer.encode(str(message.get("content") or "")) + [end_of_turn]
        trace.generated(ids, [0.0] * len(ids))
    if len(trace.segments) != 1:
        raise ValueError(f"the chat template is not prefix-stable over this conversation "
                         f"({len(trace.segments)} segments); cannot lay it out as one sequence")
    return trace.segments[0]
