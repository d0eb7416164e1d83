"""The built-in swe domain: repair a small generated Python repository with a planted bug.

A task is a package of 2-4 modules that call each other, visible tests under tests/ and
hidden tests kept in the task (swe_repos.py), with one bug of a family (off_by_one,
wrong_branch, missing_case, wrong_call; swe_templates.py). The prompt names the failing
visible test (levels 1-3 also what it got and expected). The model works on its own
in-memory copy of the repository through tools (swe_tools.py: list_files, read_file,
search, edit, apply_patch, diff, run_tests in the sandbox) and answers with a unified
diff, which `swe_patch` applies to the buggy repository and grades on every visible and
hidden test in a fresh sandbox (rewards/swe_patch.py).

Why the answer carries the patch, and not the episode's edited files: a verifier grades
`(task, response)` only (rewards/base.py), so the same grading serves agent episodes,
single-turn completions, `polyrl score` files and the audit's probes; and the grader
never reads state the model left behind, only the text it submitted. The `diff` tool
prints the working copy's patch, so an agent need not write one by hand.

Task data: package, bug_family, bug_site, files (the buggy repository the model sees),
original_files, reference_patch, visible_tests, hidden_tests, failing_tests, seed.

Levels: 1 two modules, 2 three, 3 four (visible tests only on the top modules: the bug
shows through a call), 4 as 3 with a prompt that names the failing test and no more.
Splits: which split a task belongs to is a stable hash of its generator seed and level
(`hash_split`), decided before the repository is built: train and held-out never share
a generator seed.

Out of scope: real repositories, installs and dependencies, more than one bug per task.
"""

from __future__ import annotations

import hashlib
import json
import random
from typing import Any, Sequence

from polyrl.agent.tools import ToolBox
from polyrl.domains.generated import check_levels, draw_distinct
from polyrl.domains.pack import check_split, hash_split
from polyrl.domains.swe_repos import LEVELS, Repo, call_text, generate, test_file
from polyrl.domains.swe_templates import FAMILIES, LEVEL_MODULES, MODULES
from polyrl.types import Task

_INSTRUCTIONS = ("Find and fix the bug in the package; do not edit the tests (a patch that touches tests/ "
                 "scores 0; hidden tests check the fix too). Inspect the repository with list_files, read_file "
                 "and search, change it with edit or apply_patch, check it with run_tests. Finish with the "
                 "unified diff of your fix as the answer (the diff tool prints it).")


class SweDomain:
    """Generated repositories with one bug each, repaired with tools; see the module docstring."""

    name = "swe"
    default_verifier = "swe_patch"
    result_chars = 4000
    """cap on each tool result an episode shows the model (a file or a test run, not 400 characters)"""

    def __init__(self, levels: tuple[int, ...] = LEVELS, weights: tuple[float, ...] | None = None,
                 families: Sequence[str] = FAMILIES, workers: int = 1) -> None:
        """`levels` (and relative `weights`), the bug `families` to plant, sandbox `workers`
        for the run_tests tool (one pool per domain, started on the first episode)."""
        self.levels, self.weights = check_levels("swe", levels, LEVELS, weights)
        self.families, _ = check_levels("swe", (families,) if isinstance(families, str) else tuple(families),
                                        FAMILIES, noun="families")
        for level in self.levels:
            have = {s.family for m in LEVEL_MODULES[level] for s in MODULES[m].sites}
            if not have & set(self.families):
                raise ValueError(f"swe level {level} has no bug site of families {self.families} "
                                 f"(it has {sorted(have)}); drop the level or add a family")
        self.workers = workers
        self._pool: Any = None

    def sample(self, split: str, n: int, seed: int) -> list[Task]:
        """n distinct tasks of `split`, a pure function of (split, n, seed)."""
        check_split(split)
        return draw_distinct(random.Random(f"swe|{split}|{seed}"), n, lambda rng: self._draw(rng, split))

    def _draw(self, rng: random.Random, split: str) -> tuple[str, Task] | None:
        level = rng.choices(self.levels, self.weights)[0]
        task_seed = rng.randrange(2**32)
        if seed_split(task_seed, level) != split:
            return None
        repo = generate(task_seed, level, self.families)
        if repo is None:
            return None
        return make_task(repo, task_seed, split)

    def toolbox(self, task: Task) -> ToolBox:
        """Fresh tools over a fresh working copy of `task`'s repository (one per episode)."""
        from polyrl.domains.swe_tools import workspace_toolbox
        from polyrl.sandbox.pool import SandboxPool

        if self._pool is None:
            self._pool = SandboxPool(self.workers)
        return workspace_toolbox(task, self._pool)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool = None


def seed_split(task_seed: int, level: int) -> str:
    return hash_split(f"swe|{level}|{task_seed}")


def make_task(repo: Repo, task_seed: int, split: str) -> tuple[str, Task]:
    key = json.dumps([repo.buggy, repo.hidden], sort_keys=True)
    sha = hashlib.sha256(key.encode()).hexdigest()
    return key, Task(
        id=f"swe-{split}-{repo.level}-{repo.site.family}-{sha[:10]}", domain="swe", prompt=prompt(repo),
        split=split, difficulty=repo.level,
        data={"package": repo.package, "bug_family": repo.site.family,
              "bug_site": f"{repo.module}.{repo.site.function}", "files": repo.buggy,
              "original_files": repo.original, "reference_patch": repo.reference_patch,
              "visible_tests": repo.visible, "hidden_tests": repo.hidden,
              "failing_tests": [c["name"] for c in repo.failing], "seed": task_seed})


def prompt(repo: Repo) -> str:
    failing = repo.failing[0]
    where = f"{test_file(failing)}::{failing['name']}"
    lines = [f"The Python package `{repo.package}` has a bug: the test {where} fails"
             + (f" (and {len(repo.failing) - 1} more)" if len(repo.failing) > 1 else "") + "."]
    if repo.level <= 3:
        lines.append(f"{call_text(failing)} returned {failing['got']}, expected {failing['expected']!r}.")
    lines.append(_INSTRUCTIONS)
    return "\n".join(lines)
