"""Probes for a verifier polyrl knows nothing about (a plugin's), built from its reference.

A verifier may give `reference(task) -> str | None`: a completion that must earn full
reward on `task` (None: it has none for this task). With it the audit can check any
verifier the way it checks answer_verify, without knowing what the verifier reads:

- solvability: the reference scores full reward (audit.py scores it, then repeats it for
  determinism);
- negative controls: an empty completion, a generic refusal and another task's reference
  (when its text differs) score below full reward;
- leaked answer: the prompt echoed back scores below full reward;
- exploit: another task's reference followed by this task's (an answer hedged over two
  candidates) scores below full reward.

Out of scope: probes that need the verifier's format (equivalent rewrites of an answer,
code mutants): a plugin that wants them runs its own audit beside this one.
"""

from __future__ import annotations

from typing import Any, Sequence

from polyrl.quality.probes import Probe
from polyrl.types import Task

_GENERIC = "I don't know."


def has_reference(verifier_class: Any) -> bool:
    """Whether a verifier class (or instance) gives reference completions."""
    return callable(getattr(verifier_class, "reference", None))


def references(verifier: Any, tasks: Sequence[Task]) -> list[str | None | Exception]:
    """Each task's reference from `verifier`, or the exception its `reference` raised."""
    out: list[str | None | Exception] = []
    for task in tasks:
        try:
            ref = verifier.reference(task)
            out.append(ref if isinstance(ref, str) or ref is None else TypeError(
                f"reference() returned {type(ref).__name__}, not str or None"))
        except Exception as err:  # noqa: BLE001 -- a plugin's bug is a finding on the task
            out.append(err)
    return out


def reference_probe(reference: str) -> Probe:
    return Probe("solvability", "the verifier's reference completion", reference, "full")


def plugin_probes(task: Task, reference: str, other: str | None) -> list[Probe]:
    """Every probe of a task except the solvability one; `other` is another task's reference."""
    probes = [
        Probe("negative_control", "an empty completion", "", "below"),
        Probe("negative_control", "a generic 'I don't know'", _GENERIC, "below"),
        Probe("leaked_answer", "the prompt echoed back", task.prompt, "below"),
    ]
    if other is not None and other.strip() != reference.strip():
        probes += [
            Probe("negative_control", "another task's reference", other, "below"),
            Probe("exploit", "another task's reference, then this one's", f"{other}\n{reference}", "below"),
        ]
    return probes
