"""`audit_tasks`: every environment-quality check over a task set, in stages, each one batch per verifier.

1. hygiene (hygiene.py; math golds through math-verify, math_probes.gold_problems);
2. solvability: the reference (code) or the boxed gold (math) must score full reward;
3. probes: negative controls, mutants, exploits, equivalent rewrites and the echoed
   prompt (code_probes.py, math_probes.py; swe patches: swe_probes.py; ops episode records:
   ops_probes.py; agent answers: agent_probes.py), all tasks' probes in one batch per verifier;
4. determinism: the reference (math: and its equivalent forms) scored again `repeats`
   times by fresh verifiers; any disagreement in reward, status or per-test verdict fails;
5. difficulty, with a policy: k samples per task, pass@1 and pass@k, tasks always or
   never solved flagged; a task without reference counts as solvable once a sample solves
   it; a full-reward sample that trips the independent check (independent.py) is flagged.

A task whose check cannot be graded at all (it does not compile, calls no candidate, or
its gold does not parse) gets no probes: each would only restate that. A verifier polyrl
does not know (a plugin's) is probed through its `reference(task)` (plugin_probes.py).
Tasks graded by a verifier with no probes (rule_check, preference_model, a plugin's
without `reference`) get hygiene only, and a warning saying so.

Out of scope: printing (report.py), command-line parsing (polyrl/commands/audit.py), agent episodes.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Sequence

from polyrl.domains.pack import EmptyPack, PackError, load_pack, verifier_for
from polyrl.plugins import PluginError
from polyrl.quality import hygiene
from polyrl.quality.agent_probes import agent_probes
from polyrl.quality.agent_probes import reference_probe as agent_reference_probe
from polyrl.quality.code_probes import code_probes
from polyrl.quality.findings import TaskAudit
from polyrl.quality.independent import suspicious
from polyrl.quality.math_probes import gold_problems, math_probes, reference_probe
from polyrl.quality.ops_probes import ops_probes
from polyrl.quality.ops_probes import reference_probe as ops_reference_probe
from polyrl.quality.plugin_probes import has_reference, plugin_probes, references
from polyrl.quality.plugin_probes import reference_probe as plugin_reference_probe
from polyrl.quality.policy import Policy, pass_at_k
from polyrl.quality.probes import Probe, findings_for, holds, why
from polyrl.quality.scoring import Progress, Scorer, stderr_progress
from polyrl.quality.swe_probes import swe_probes
from polyrl.rewards.registry import PLUGINS, available_verifiers, verifier_class
from polyrl.types import Score, Task

PROBED = ("unit_test_pass", "answer_verify", "swe_patch", "world_state", "success_minus_cost")
_UNGRADABLE = ("tests_compile", "empty_tests", "unparsable_answer")
_EPISODE_REFERENCE = {"success_minus_cost": '"gold_calls"', "world_state": '"reference_calls"'}
"""Verifiers of episodes whose probes start from the task's reference calls: what it lacks."""


@dataclass
class AuditOptions:
    repeats: int = 2
    """extra scorings of the reference by fresh verifiers (determinism)"""
    samples: int = 4
    """k: policy samples per task (difficulty; only with a policy)"""
    mutants_per_kind: int = 2
    """mutants of each kind (off-by-one, flipped comparison, dropped branch) per reference"""
    per_test_timeout_s: float = 3.0
    """unit_test_pass per-call timeout for probes that must pass"""
    quick_timeout_s: float = 1.0
    """... and for probes that must fail"""
    workers: int | None = None
    """sandbox workers (default: the pool's choice)"""


@dataclass
class AuditResult:
    source: str
    tasks: list[TaskAudit]
    seconds: float = 0.0
    scored: int = 0
    """completions scored (probes, repeats, policy samples)"""
    policy: str | None = None
    tally: dict[str, list[int]] = field(default_factory=dict)
    """probe group ("exploit", "mutant:off_by_one", ...) -> [expectation held, probes]"""

    @property
    def failed(self) -> bool:
        return any(a.status == "fail" for a in self.tasks)


def audit_pack(path: str, policy: Policy | None = None, options: AuditOptions | None = None,
               progress: Progress | None = stderr_progress) -> AuditResult:
    """Audit the pack at `path` (OSError when it cannot be read, EmptyPack when it has no lines)."""
    loaded = load_pack(path)
    if not loaded.lines:
        raise EmptyPack(path)
    return audit_tasks(loaded.tasks, loaded.errors, path, policy, options, progress)


def audit_domain(name: str, n: int, seed: int = 0, policy: Policy | None = None,
                 options: AuditOptions | None = None, progress: Progress | None = stderr_progress) -> AuditResult:
    """Audit n tasks of a built-in or plugin domain: 4 in 5 from its train split, the rest held out."""
    from polyrl.domains.registry import get_domain

    domain = get_domain(name)
    heldout = n // 5
    sampled = domain.sample("train", n - heldout, seed) + domain.sample("heldout", heldout, seed)
    unique = list({t.id: replace(t, verifier=t.verifier or domain.default_verifier) for t in sampled}.values())
    return audit_tasks(list(enumerate(unique, start=1)), [], f"domain {name}", policy, options, progress)


def audit_tasks(entries: Sequence[tuple[int, Task]], errors: Sequence[PackError], source: str,
                policy: Policy | None = None, options: AuditOptions | None = None,
                progress: Progress | None = stderr_progress) -> AuditResult:
    options = options or AuditOptions()
    say = progress or (lambda message: None)
    start = time.perf_counter()
    tasks = [t for _, t in entries]
    audits = [TaskAudit(t.id, line, t.domain) for line, t in entries]
    result = AuditResult(source, [], policy=getattr(policy, "name", None) if policy else None)
    scorer = Scorer(options.workers, options.per_test_timeout_s, options.quick_timeout_s, progress=progress)
    try:
        names = [_verifier_name(t, a) for t, a in zip(tasks, audits)]
        say(f"{len(tasks)} tasks, {len(errors)} malformed lines: hygiene")
        hygiene.check_pack(tasks, audits, [n == "unit_test_pass" for n in names])
        math = [i for i, n in enumerate(names) if n == "answer_verify"]
        for i, problem in zip(math, gold_problems([tasks[i] for i in math])):
            if problem:
                audits[i].add("unparsable_answer", problem[1], problem[0])  # type: ignore[arg-type]
        own = _plugin_references(scorer, tasks, audits, names)
        usable = [i for i, n in enumerate(names) if (n in PROBED or i in own)
                  and not any(f.check in _UNGRADABLE and f.severity == "fail" for f in audits[i].findings)]
        plans = _plans(scorer, tasks, audits, names, usable)
        refs = _solvability(scorer, tasks, audits, names, usable, own, say)
        for i in usable:
            if names[i] in _EPISODE_REFERENCE and i not in refs and not audits[i].has("solvability"):
                audits[i].add("solvability", f"unverified: the task has no {_EPISODE_REFERENCE[names[i]]}, so the audit "
                                             "can neither show it solvable nor probe its reward", "warn")
        usable = [i for i in usable if not audits[i].has("verifier") and not audits[i].has("empty_tests")]
        _probes(scorer, tasks, audits, names, usable, plans, refs, own, result, options, say)
        _determinism(scorer, tasks, audits, names, [i for i in usable if i in refs], refs, options, say)
        if policy is not None:
            _difficulty(scorer, policy, tasks, audits, names, usable, options, say)
        for i in usable:
            if names[i] == "unit_test_pass" and i not in refs and not audits[i].has("solvability"):
                solved = audits[i].difficulty and audits[i].difficulty["solved"] > 0
                if not solved:
                    tail = f", and none of {options.samples} policy samples solved it" if policy else ""
                    audits[i].add("solvability", "unverified: the task has no reference solution" + tail +
                                  "; add a \"reference\" so the audit can show it is solvable", "warn")
    finally:
        scorer.close()
    result.tasks = sorted(hygiene.malformed_lines(errors) + audits, key=lambda a: a.line or 0)
    result.scored, result.seconds = scorer.calls, time.perf_counter() - start
    say(f"done in {result.seconds:.1f} s, {result.scored} completions scored")
    return result


def _verifier_name(task: Task, audit: TaskAudit) -> str | None:
    try:
        name = verifier_for(task)
    except ValueError as err:
        audit.add("verifier", str(err))
        return None
    if name not in available_verifiers():
        audit.add("verifier", f"unknown verifier {name!r}; available: {', '.join(available_verifiers())}")
        return None
    if name not in PLUGINS:
        if name not in PROBED:
            audit.add("verifier", f"verifier {name!r} has no audit probes: only the hygiene checks ran", "warn")
        return name
    try:
        probed = has_reference(verifier_class(name))
    except PluginError as err:
        audit.add("verifier", str(err))
        return None
    if not probed:
        audit.add("verifier", f"plugin verifier {name!r} has no reference(task), so no audit probes: only the "
                              "hygiene checks ran", "warn")
    return name


def _plugin_references(scorer: Scorer, tasks: list[Task], audits: list[TaskAudit], names: list) -> dict[int, str]:
    """Task index -> reference completion, for tasks graded by a verifier with `reference` (a plugin's)."""
    by_name: dict[str, list[int]] = {}
    for i, name in enumerate(names):
        if name is not None and name in PLUGINS and has_reference(verifier_class(name)):
            by_name.setdefault(name, []).append(i)
    own: dict[int, str] = {}
    for name, indices in by_name.items():
        for i, ref in zip(indices, references(scorer.verifier(name), [tasks[i] for i in indices])):
            if isinstance(ref, Exception):
                audits[i].add("verifier", f"{name}.reference() failed: {type(ref).__name__}: {ref}")
            elif ref is None:
                audits[i].add("verifier", f"{name} gives no reference for this task: only the hygiene checks ran",
                              "warn")
            else:
                own[i] = ref
    return own


def _plans(scorer: Scorer, tasks: list[Task], audits: list[TaskAudit], names: list, usable: list[int]) -> dict:
    """Check plans of the usable HumanEval-style tasks; contradictory "eq" asserts are findings."""
    planned = [i for i in usable if names[i] == "unit_test_pass" and isinstance(tasks[i].data.get("test"), str)]
    plans = dict(zip(planned, scorer.plans([tasks[i] for i in planned])))
    for i, plan in plans.items():
        message = hygiene.contradictory_plan(plan, tasks[i].data["entry_point"]) if plan is not None else None
        if message:
            audits[i].add("contradictory_tests", message)
    return plans


def _reference(task: Task, name: str, own: str | None) -> Probe | None:
    if own is not None:
        return plugin_reference_probe(own)
    if name == "answer_verify":
        return reference_probe(task)
    if name == "world_state":
        return ops_reference_probe(task) if isinstance(task.data.get("reference_calls"), list) else None
    if name == "success_minus_cost":
        return agent_reference_probe(task)
    if name == "swe_patch":
        reference = task.data.get("reference_patch")
        return Probe("solvability", "the reference patch", reference, "full") if isinstance(reference, str) else None
    reference = task.data.get("reference")
    return Probe("solvability", "the reference solution", reference, "full") if isinstance(reference, str) else None


def _solvability(scorer: Scorer, tasks, audits, names, usable, own, say) -> dict[int, tuple[Probe, Score]]:
    """Score each reference; returns task index -> (probe, score) for tasks that have one."""
    probes = {i: p for i in usable if (p := _reference(tasks[i], names[i], own.get(i))) is not None}
    say(f"solvability: scoring {len(probes)} references")
    scores = scorer.score([(names[i], tasks[i], p.completion) for i, p in probes.items()], "strict", "solvability")
    refs = {}
    for (i, probe), score in zip(probes.items(), scores):
        status = score.details.get("status")
        if status in ("task_error", "verifier_error"):
            error = str(score.details.get("error", status))
            # check_plan's PlanError for a check whose asserts never involve the candidate
            check = "empty_tests" if "calls the candidate" in error else "verifier"
            audits[i].add(check, f"the verifier cannot grade this task: {error}")
            continue
        refs[i] = (probe, score)
        if not holds(probe, score.value):
            audits[i].add("solvability", f"{probe.name} scores only {score.value:g} ({why(score)})")
    return refs


def _probes(scorer, tasks, audits, names, usable, plans, refs, own, result: AuditResult, options, say) -> None:
    per_task: dict[int, list[Probe]] = {}
    for i in usable:
        if i in own:
            per_task[i] = plugin_probes(tasks[i], own[i], _other_reference(own, names, i))
        elif names[i] == "unit_test_pass":
            ok = i in refs and refs[i][1].value >= 1.0
            per_task[i] = code_probes(tasks[i], plans.get(i), ok, options.mutants_per_kind)
        elif names[i] == "swe_patch":
            per_task[i] = swe_probes(tasks[i])
        elif names[i] == "world_state":
            per_task[i] = ops_probes(tasks[i]) if i in refs else []
        elif names[i] == "success_minus_cost":
            per_task[i] = agent_probes(tasks[i], _other_answer(tasks, names, i)) if i in refs else []
        else:
            per_task[i] = math_probes(tasks[i])
    items = [(i, p) for i, ps in per_task.items() for p in ps]
    say(f"probes: scoring {len(items)} probes of {len(per_task)} tasks")
    scores: dict[int, Score] = {}
    for must_pass, kind in ((True, "strict"), (False, "quick")):
        chosen = [k for k, (_, p) in enumerate(items) if p.must_pass == must_pass]
        batch = scorer.score([(names[items[k][0]], tasks[items[k][0]], items[k][1].completion) for k in chosen],
                             kind, "probes that must pass" if must_pass else "probes that must fail")
        scores.update(zip(chosen, batch))
    by_task: dict[int, list[tuple[Probe, Score]]] = {}
    for k, (i, probe) in enumerate(items):
        by_task.setdefault(i, []).append((probe, scores[k]))
        group = probe.check if probe.check != "mutant" else "mutant:" + probe.name.split(" ")[0]
        tally = result.tally.setdefault(group, [0, 0])
        tally[0] += holds(probe, scores[k].value)
        tally[1] += 1
    for i, pairs in by_task.items():
        audits[i].findings.extend(findings_for([p for p, _ in pairs], [s for _, s in pairs]))


def _other_reference(own: dict[int, str], names: list, i: int) -> str | None:
    """The reference of the next task graded by the same verifier whose reference differs (wraps around)."""
    same = [j for j in sorted(own) if names[j] == names[i] and own[j].strip() != own[i].strip()]
    if not same:
        return None
    return own[next((j for j in same if j > i), same[0])]


def _other_answer(tasks: list[Task], names: list, i: int) -> str | None:
    """The answer of the next task graded like task i whose answer differs (wraps around)."""
    mine = str(tasks[i].answer).strip().lower()
    same = [j for j, n in enumerate(names) if n == names[i] and str(tasks[j].answer).strip().lower() != mine]
    return None if not same else str(tasks[next((j for j in same if j > i), same[0])].answer)


def _signature(score: Score) -> tuple:
    return (score.value, score.details.get("status"), tuple(t.get("passed") for t in score.details.get("tests", [])))


def _determinism(scorer, tasks, audits, names, indices, refs, options: AuditOptions, say) -> None:
    items = []
    for i in indices:
        items.append((i, refs[i][0], refs[i][1]))
        if names[i] == "answer_verify":
            items += [(i, p, None) for p in math_probes(tasks[i]) if p.check == "false_negative"]
    if not items or options.repeats <= 0:
        return
    say(f"determinism: scoring {len(items)} completions {options.repeats + 1} times")
    base = [s for _, _, s in items]
    missing = [k for k, s in enumerate(base) if s is None]
    extra = scorer.score([(names[items[k][0]], tasks[items[k][0]], items[k][1].completion) for k in missing],
                         "strict", "determinism")
    for k, score in zip(missing, extra):
        base[k] = score
    runs = [base]
    for r in range(options.repeats):
        runs.append(scorer.score([(names[i], tasks[i], p.completion) for i, p, _ in items], "repeat",
                                 f"determinism repeat {r + 1}"))
    flaky: dict[int, list[str]] = {}
    for k, (i, probe, _) in enumerate(items):
        signatures = [_signature(run[k]) for run in runs]
        if len(set(signatures)) > 1:
            values = ", ".join(f"{run[k].value:g} ({run[k].details.get('status')})" for run in runs)
            flips = sum(len(set(column)) > 1 for column in zip(*(s[2] for s in signatures)))
            flaky.setdefault(i, []).append(f"{probe.name} scored {values}" +
                                           (f"; {flips} test verdict(s) changed" if flips else ""))
    for i, items_ in flaky.items():
        audits[i].add("determinism", "the reward is flaky, repeated scoring disagrees: " + "; ".join(items_))


def _difficulty(scorer, policy: Policy, tasks, audits, names, usable, options: AuditOptions, say) -> None:
    k = options.samples
    say(f"difficulty: sampling {k} completions of {len(usable)} tasks from {policy.name}")
    samples = policy.sample([tasks[i] for i in usable], k)
    items = [(i, c) for i, texts in zip(usable, samples) for c in texts]
    scores = scorer.score([(names[i], tasks[i], c) for i, c in items], "strict", "policy samples")
    for pos, i in enumerate(usable):
        mine = list(zip(items[pos * k:(pos + 1) * k], scores[pos * k:(pos + 1) * k]))
        solved = sum(s.value >= 1.0 for _, s in mine)
        audits[i].difficulty = {"samples": k, "solved": solved, "mean_reward": sum(s.value for _, s in mine) / k,
                                "pass@1": pass_at_k(k, solved, 1), f"pass@{k}": pass_at_k(k, solved, k)}
        if solved == k:
            audits[i].add("difficulty", f"all {k} samples solve it: no learning signal for this policy", "warn")
        elif solved == 0:
            audits[i].add("difficulty", f"none of {k} samples solves it: no learning signal for this policy", "warn")
        hacks = [p for (_, c), s in mine if s.value >= 1.0 for p in suspicious(names[i], c, tasks[i].answer)]
        if hacks:
            audits[i].add("exploit", f"a policy sample gets full reward but {'; '.join(sorted(set(hacks)))}", "warn")
