"""Every task of a suite on every model, each failure attributed: what `polyrl eval` runs.

    records = run_eval(suite, adapters, limits, progress=tqdm_bar)

Models run one after another, tasks in suite order. A failed task is attributed at once
(attribution.py): its re-run, when there is evidence to test, runs on the same model
before the next task. `progress(done, total, label)` is called after each task (the
command draws a tqdm bar on stderr with it). A recorder gets every task's per-call records
(runner.py), stamped with phase "eval", the task's domain and the model (`x.eval.model`);
those of a re-run also with `x.eval.rerun`.

Out of scope: running models or tasks in parallel, and resuming an interrupted evaluation
(a run is all or nothing: nothing is written until every task has run).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

from polyrl.domains.task_tools import TaskTools
from polyrl.evals.attribution import Attribution, attribute
from polyrl.evals.limits import EvalLimits
from polyrl.evals.models import ModelAdapter
from polyrl.evals.runner import TaskRun, Verifiers, run_task
from polyrl.evals.suite import Suite
from polyrl.obs import records as R
from polyrl.obs.records import Recorder, Stamp

Progress = Callable[[int, int, str], None]


@dataclass
class TaskRecord:
    """One task on one model: its run and, when it failed, why."""

    run: TaskRun
    attribution: Attribution | None


def run_eval(suite: Suite, adapters: Sequence[ModelAdapter], limits: EvalLimits,
             progress: Progress | None = None, recorder: Recorder | None = None) -> list[TaskRecord]:
    """One TaskRecord per (model, task), models in order, tasks in suite order."""
    verifiers, tools = Verifiers(), TaskTools()
    records: list[TaskRecord] = []
    total = len(adapters) * len(suite.tasks)
    try:
        for m, adapter in enumerate(adapters):
            for k, suite_task in enumerate(suite.tasks):
                trace = f"eval-{m}-{k}-{suite_task.task.id}"
                stamp = None if recorder is None else Stamp(
                    recorder, **{R.PHASE: "eval", R.DOMAIN: suite_task.task.domain, "x.eval.model": adapter.spec})
                rerun = None if stamp is None else Stamp(stamp, **{"x.eval.rerun": True})
                run = run_task(suite_task, adapter, suite_task.limits(limits), verifiers, trace, stamp, tools)
                attribution = attribute(run, lambda lifted: run_task(suite_task, adapter, lifted, verifiers,
                                                                     trace + "-lifted", rerun, tools))
                records.append(TaskRecord(run, attribution))
                if progress is not None:
                    progress(len(records), total, f"{adapter.spec} {suite_task.task.id}")
    finally:
        verifiers.close()
        tools.close()
    return records
