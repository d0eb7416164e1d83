"""Teacher-forced answer accuracy: does the model's greedy choice give the reference reply?

    answer_accuracy(model, tokenizer, tasks)   # {"tasks", "accuracy", "answer_nll", "overflow"}

For each task the chat prompt and the reference reply (`\\boxed{ANSWER}` and the end of the
turn) run through the model in one forward pass. A task counts as correct when the argmax at
every reply position is the reference token: exactly the case in which greedy decoding writes
the reference reply, so this is greedy accuracy computed without generating (a greedy reply
that is right in another format counts as wrong here). `answer_nll` is the reply's mean
negative log-likelihood per token, a graded signal where accuracy is still 0.

A prompt and reply longer than the model's window count as wrong ("overflow"), as the
engine refuses them.
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F

from polyrl.agent.engine_model import Segment, training_tokens
from polyrl.models.tokenizer import Tokenizer
from polyrl.models.transformer import Transformer
from polyrl.types import Task


def reference_reply(task: Task) -> str:
    return f"\\boxed{{{task.answer}}}"


def reference_tokens(task: Task, tokenizer: Tokenizer) -> Segment:
    """The task's prompt and reference reply as one token sequence, loss mask 1 on the reply."""
    return training_tokens(tokenizer, [{"role": "user", "content": task.prompt},
                                       {"role": "assistant", "content": reference_reply(task)}])


@torch.no_grad()
def answer_accuracy(model: Transformer, tokenizer: Tokenizer, tasks: Sequence[Task]) -> dict:
    window = model.cfg.max_position_embeddings
    correct, overflow, nll_sum, nll_tokens = 0, 0, 0.0, 0
    device = next(model.parameters()).device
    for task in tasks:
        segment = reference_tokens(task, tokenizer)
        if len(segment.token_ids) > window:
            overflow += 1
            continue
        ids = torch.tensor([segment.token_ids], device=device)
        reply = torch.tensor(segment.loss_mask[1:], device=device).bool()
        logits = model(ids)[0, :-1].float()
        targets = ids[0, 1:]
        correct += bool((logits[reply].argmax(-1) == targets[reply]).all())
        nll_sum += float(F.cross_entropy(logits[reply], targets[reply], reduction="sum"))
        nll_tokens += int(reply.sum())
    n = len(tasks)
    return {"tasks": n, "accuracy": correct / n if n else None, "overflow": overflow,
            "answer_nll": round(nll_sum / nll_tokens, 4) if nll_tokens else None}
