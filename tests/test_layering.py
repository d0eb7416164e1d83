"""The layering rule of DESIGN.md, checked on the package's own imports.

Every module of polyrl belongs to a layer; an import may go to its own layer or below,
never above, and the agent library imports no tasks or grading. Lazy imports inside
functions count as much as the ones at the top, and so do module paths written as
strings for importlib (the verifier and domain registries name their classes that way).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import polyrl

BASE, MIDDLE, TOP = 0, 1, 2
LAYERS = {
    # the network, the engine, isolation, RL math, records, and the plain types between stages
    "models": BASE, "engine": BASE, "sandbox": BASE, "rl": BASE, "obs": BASE, "types": BASE, "cache": BASE, "plugins": BASE,
    # libraries of tasks, grading, audits and the agent loop
    "agent": MIDDLE, "domains": MIDDLE, "rewards": MIDDLE, "quality": MIDDLE,
    # what wires them together: rollout, training, the built-in recipes, the run file, the commands
    "rollout": TOP, "train": TOP, "pipeline": TOP, "serve": TOP, "evals": TOP, "report": TOP, "builtin": TOP,
    "config": TOP, "config_messages": TOP, "config_checks": TOP, "config_tasks": TOP, "commands": TOP, "cli": TOP,
}
NAMES = {BASE: "base", MIDDLE: "middle", TOP: "top"}
FORBIDDEN_PEERS = {("agent", "domains"), ("agent", "rewards"), ("agent", "quality")}
"""Middle-layer arrows that are still wrong: the agent library knows no tasks or grading."""

_MODULE_STRING = re.compile(r"polyrl(\.\w+)+(:\w+)?")


def part_of(module: str) -> str | None:
    """'polyrl.engine.runner.sampler' -> 'engine'; None for the package itself."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[0] == "polyrl" else None


def imports_of(path: Path, module: str) -> list[tuple[int, str]]:
    """(line, imported module) for every import in the file, and every module path written as a string."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    package = module.rsplit(".", 1)[0] if path.name != "__init__.py" else module
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            found.append((node.lineno, target))
            found += [(node.lineno, f"{target}.{alias.name}") for alias in node.names]  # `from polyrl import x`
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and _MODULE_STRING.fullmatch(node.value):
            found.append((node.lineno, node.value.split(":")[0]))
    return [(line, name) for line, name in found if name == "polyrl" or name.startswith("polyrl.")]


def violations(root: Path) -> list[str]:
    """Every import in the package at `root` that breaks the rule, as 'file:line: a -> b (why)'."""
    problems = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root.parent).with_suffix("")
        module = ".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)
        source = part_of(module)
        if source is None:
            continue
        if source not in LAYERS:
            problems.append(f"{path}: part {source!r} has no layer; add it to LAYERS in tests/test_layering.py")
            continue
        arrows = {(line, part_of(target_module)) for line, target_module in imports_of(path, module)}
        for line, target in sorted(arrows, key=lambda a: (a[0], a[1] or "")):
            if target is None or target == source or target not in LAYERS:
                continue
            where = f"{path.relative_to(root.parent)}:{line}: {source} -> {target}"
            if LAYERS[target] > LAYERS[source]:
                problems.append(f"{where} ({NAMES[LAYERS[source]]} layer imports the {NAMES[LAYERS[target]]} layer)")
            elif (source, target) in FORBIDDEN_PEERS:
                problems.append(f"{where} (the agent library knows no tasks or grading)")
    return problems


def test_the_package_keeps_the_layering_rule():
    assert violations(Path(polyrl.__file__).parent) == []


@pytest.mark.parametrize("part, source, arrow", [
    ("models", "from polyrl.domains.math import MathDomain\n", "models -> domains"),
    ("engine", "def f():\n    from polyrl.train import loop\n", "engine -> train"),
    ("sandbox", "import polyrl.rewards.registry\n", "sandbox -> rewards"),
    ("rl", "from polyrl import rollout\n", "rl -> rollout"),
    ("obs", "REGISTRY = {'x': 'polyrl.quality.audit:Audit'}\n", "obs -> quality"),
    ("quality", "from polyrl.train.setup import build_domains\n", "quality -> train"),
    ("agent", "from polyrl.rewards.success_minus_cost import SuccessMinusCost\n", "agent -> rewards"),
    ("agent", "from polyrl.domains.pack import load_pack\n", "agent -> domains"),
    ("models", "from ..builtin.tiny import ensure_tiny_model\n", "models -> builtin"),
])
def test_an_upward_import_is_caught(tmp_path, part, source, arrow):
    root = tmp_path / "polyrl"
    (root / part).mkdir(parents=True)
    (root / "__init__.py").write_text("")
    (root / part / "__init__.py").write_text("")
    (root / part / "bad.py").write_text(source)
    found = violations(root)
    assert len(found) == 1 and arrow in found[0], found


def test_allowed_arrows_pass(tmp_path):
    root = tmp_path / "polyrl"
    for part, source in [("train", "from polyrl.engine.base import Engine\nfrom polyrl.rollout import groups\n"),
                         ("domains", "from polyrl.agent.tools import ToolBox\n"),
                         ("engine", "from polyrl.models.transformer import Transformer\n"),
                         ("rewards", "DOC = 'polyrl.rewards.answer_verify:AnswerVerify'\n")]:
        (root / part).mkdir(parents=True)
        (root / part / "ok.py").write_text(source)
    assert violations(root) == []


def test_a_new_part_needs_a_layer(tmp_path):
    root = tmp_path / "polyrl"
    (root / "newpart").mkdir(parents=True)
    (root / "newpart" / "x.py").write_text("")
    assert "has no layer" in violations(root)[0]
