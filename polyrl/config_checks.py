"""Run-file checks against the world outside the file: the verifiers that can grade each
domain, the task packs (they must load whole and hold held-out tasks), the plugins the file
names (they must import), the verifiers' and domains' options, and the model directory. polyrl/config.py runs them with its other checks; each
returns (loc, message) pairs for its error lines.

Out of scope: whether a task is solvable or its reward sound (`polyrl audit`), and the
weights themselves (the model's files are checked to exist, not loaded).
"""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

from polyrl.config_messages import did_you_mean

MAX_GENERATED = 10_000
"""Domains one rl_tasks entry may generate (rl_tasks[].expand) at most."""

MAX_SAMPLES_PER_STEP = 2**20
"""Rollouts of one step (prompts_per_step * group_size) at most: every one is held in memory."""

_GRADES = {
    "answer_verify": ("math", "longctx"),
    "unit_test_pass": ("code", "humaneval"),
    "success_minus_cost": ("agent",),
    "rule_check": ("alignment",),
    "swe_patch": ("swe",),
    "world_state": ("ops",),
    "preference_model": ("alignment", "math", "code", "humaneval"),
}
"""Built-in verifier -> the built-in domains whose tasks it grades (what each reads of a task is
in its module's docstring; agent episodes only success_minus_cost scores). Verifiers not listed
(a plugin, a test's) are not checked."""
_DEFAULT_REWARD = {"math": "answer_verify", "code": "unit_test_pass", "humaneval": "unit_test_pass",
                   "agent": "success_minus_cost", "alignment": "preference_model", "longctx": "answer_verify",
                   "swe": "swe_patch", "ops": "world_state"}
"""Each built-in domain's default verifier (its class's default_verifier), for checking reward_options."""


def fit_problems(i: int, task: dict, domain: str) -> list[tuple[tuple, str]]:
    """A built-in domain's reward and check must be verifiers that can grade its tasks."""
    from polyrl.domains.registry import PLUGINS

    if domain in PLUGINS:  # a plugin domain: what its tasks carry is its own to know
        return []
    problems = []
    for key in ("reward", "check"):
        name = task.get(key)
        if isinstance(name, str) and name in _GRADES and domain not in _GRADES[name]:
            fits = [v for v, ds in _GRADES.items() if domain in ds]
            problems.append((("rl_tasks", i, key), f"got {name!r}; it cannot grade {domain} tasks ({name} grades "
                             f"{', '.join(_GRADES[name])} tasks); for {domain} use {' or '.join(fits)}"))
    return problems


def pack_problems(i: int, task: dict, path: Path) -> list[tuple[tuple, str]]:
    """A pack must load whole, hold held-out tasks, and suit the verifier that grades each task."""
    from polyrl.domains.pack import load_pack, verifier_for, verifier_misfit

    loc = ("rl_tasks", i, "pack")
    try:
        loaded = load_pack(path)
    except OSError as err:
        return [(loc, f"cannot read {path}: {err.strerror or err}")]
    if loaded.errors:
        first = loaded.errors[0]
        more = f" (and {len(loaded.errors) - 1} more malformed lines)" if len(loaded.errors) > 1 else ""
        return [(loc, f"{path}:{first.line}: {first.message}{more}; `polyrl audit {path}` lists them all")]
    if not loaded.tasks:
        return [(loc, f"{path} is empty: a pack has one task per line")]
    if not any(t.split == "heldout" for _, t in loaded.tasks):
        return [(loc, f"{path} has no held-out tasks, which evaluation needs; give some lines "
                      f"\"split\": \"heldout\" (without a split, about 1 prompt in 5 is held out)")]
    reward = task.get("reward") if isinstance(task.get("reward"), str) else None
    for line, t in loaded.tasks:
        try:
            name = t.verifier or reward or verifier_for(t)
        except ValueError:
            continue
        why = verifier_misfit(t, name)
        if why:
            return [(("rl_tasks", i, "reward" if reward and not t.verifier else "pack"),
                     f"{path}:{line} (task {t.id!r}): {why}")]
    return []


def plugin_problems(i: int, task: dict) -> list[tuple[tuple, str]]:
    """The plugin domain and verifiers a task names must import (PluginError: one line each)."""
    from polyrl.domains import registry as domains
    from polyrl.plugins import PluginError
    from polyrl.rewards import registry as rewards

    lookups = [("reward", rewards.PLUGINS), ("check", rewards.PLUGINS)]
    if task.get("pack") is None:
        lookups.insert(0, ("domain", domains.PLUGINS))
    problems = []
    for key, plugins in lookups:
        name = task.get(key)
        if not isinstance(name, str) or name not in plugins:
            continue
        try:
            obj = plugins.load(name)
        except PluginError as err:
            problems.append((("rl_tasks", i, key), str(err)))
            continue
        own = getattr(obj, "name", name)  # a factory function has no class attribute: not checked
        if key == "domain" and isinstance(own, str) and own != name:
            problems.append((("rl_tasks", i, key), f"got {name!r}; the plugin's class names itself {own!r} (its "
                             f"`name`), so its tasks would not be found under {name!r}; make the entry point's "
                             f"name and the class's `name` the same"))
    return problems


def option_problems(i: int, task: dict) -> list[tuple[tuple, str]]:
    """reward_options must be keyword options the verifier takes."""
    import inspect

    from polyrl.rewards.registry import UnknownVerifier, verifier_class

    options, name = task.get("reward_options"), task.get("reward")
    if not isinstance(options, dict) or not options:
        return []
    if name is None and task.get("pack") is None:
        name = _DEFAULT_REWARD.get(task.get("domain")) or _plugin_default(task.get("domain"))  # type: ignore[arg-type]
    if not isinstance(name, str):
        return []
    try:
        params = inspect.signature(verifier_class(name)).parameters.values()
    except (UnknownVerifier, ImportError, ValueError, TypeError):
        return []  # an unknown verifier has its own error; one that does not import is checked when built
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return []
    takes = [p.name for p in params if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD) and p.name != "log"]
    return [(("rl_tasks", i, "reward_options", key), f"unknown option of {name}; it takes {', '.join(takes) or 'none'}"
             f"{did_you_mean(str(key), takes)}") for key in options if key not in takes]


def expansions(name: str, options: dict, expand: dict[str, list]) -> list[tuple[str, dict]]:
    """(name, options) of each domain an rl_tasks entry generates: one per combination of the
    `expand` values, in order (the last key varies fastest), merged over `options`, named
    name/key=value,... (a list value as its items joined by "+")."""
    keys = list(expand)
    out = []
    for values in itertools.product(*(expand[k] for k in keys)):
        label = ",".join(f"{k}={_label(v)}" for k, v in zip(keys, values))
        out.append((f"{name}/{label}", {**options, **dict(zip(keys, values))}))
    return out


def _label(value: object) -> str:
    return "+".join(map(str, value)) if isinstance(value, (list, tuple)) else str(value)


def expand_problems(i: int, task: dict) -> list[tuple[tuple, str]]:
    """`expand` must map option names to non-empty lists of values, generate at most MAX_GENERATED
    domains, and every generated domain's options must be ones its domain takes (the first
    that is not is reported, with the count of the others)."""
    expand, loc = task.get("expand"), ("rl_tasks", i, "expand")
    if not isinstance(expand, dict) or not expand:
        return []
    if task.get("pack") is not None:
        return [(loc, "expand generates domains from a built-in or plugin domain's options; a pack's tasks are "
                      "the ones in its file (list each pack as its own entry)")]
    if not all(isinstance(v, list) for v in expand.values()):
        return []  # the schema's error
    empty = [k for k, v in expand.items() if not v]
    if empty:
        return [(loc + (empty[0],), "must be a non-empty list of option values, one generated domain each")]
    count = math.prod(len(v) for v in expand.values())
    if count > MAX_GENERATED:
        return [(loc, f"generates {count:,} domains ({' x '.join(str(len(v)) for v in expand.values())}); "
                      f"at most {MAX_GENERATED:,}")]
    options = task.get("options") if isinstance(task.get("options"), dict) else {}
    name = task.get("name") if isinstance(task.get("name"), str) else str(task.get("domain"))
    found = [(n, domain_option_problems(i, {**task, "options": o})) for n, o in expansions(name, options, expand)]
    bad = [(n, p) for n, p in found if p]
    if not bad:
        return []
    (first, [(_, message), *_]), more = bad[0], len(bad) - 1
    tail = f" (and {more} more generated domains)" if more else ""
    return [(loc, f"generated domain {first!r}: {message}{tail}")]


def _plugin_default(domain: object) -> str | None:
    """A plugin domain's default verifier (its class's default_verifier), or None."""
    from polyrl.domains import registry
    from polyrl.plugins import PluginError

    if not isinstance(domain, str) or domain not in registry.PLUGINS:
        return None
    try:
        default = getattr(registry.PLUGINS.load(domain), "default_verifier", None)
    except PluginError:
        return None  # plugin_problems reports it
    return default if isinstance(default, str) else None


def domain_option_problems(i: int, task: dict) -> list[tuple[tuple, str]]:
    """options must be what the built-in or plugin domain takes (it is built with them to find out)."""
    import inspect

    from polyrl.domains.registry import UnknownDomain, domain_class

    options, name = task.get("options"), str(task.get("domain"))
    if not isinstance(options, dict) or not options:
        return []
    loc = ("rl_tasks", i, "options")
    if task.get("pack") is not None:
        return [(loc, "options are for built-in domains; a pack's tasks are the ones in its file")]
    try:
        cls = domain_class(name)
    except UnknownDomain:
        return []  # the domain's own error
    takes = [p for p in inspect.signature(cls).parameters if p != "self"]
    unknown = [key for key in options if key not in takes]
    if unknown:
        return [(loc + (key,), f"unknown option of the {name} domain; it takes {', '.join(takes) or 'none'}"
                 f"{did_you_mean(str(key), takes)}") for key in unknown]
    try:
        cls(**options)
    except (TypeError, ValueError) as err:
        return [(loc, str(err))]
    return []


def model_problem(path: str) -> str | None:
    """Why model.path names no model polyrl can load, or None (built-in names: is one so called)."""
    if path.startswith("builtin:"):
        from importlib.metadata import entry_points

        names = sorted(ep.name for ep in entry_points(group="polyrl.builtin_models"))
        if names and path.removeprefix("builtin:") not in names:
            return f"no such built-in model; available: {', '.join('builtin:' + n for n in names)}"
        return None
    folder = Path(path).expanduser()
    if not folder.exists():
        return f"no such directory (looked for {folder.resolve()}); use builtin:tiny or a Hugging Face model directory"
    if not folder.is_dir():
        return "a file, not a model directory; give the directory holding config.json"
    missing = [name for name in ("config.json", "tokenizer.json") if not (folder / name).is_file()]
    if not ((folder / "model.safetensors").is_file() or (folder / "model.safetensors.index.json").is_file()):
        missing.append("model.safetensors")
    if missing:
        return (f"not a Hugging Face model directory polyrl can load (no {', '.join(missing)}); use builtin:tiny "
                "or a directory saved with save_pretrained")
    try:
        json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        return f"its config.json cannot be read: {err}"
    return None
