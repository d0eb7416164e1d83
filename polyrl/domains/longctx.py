"""The built-in long-context domain: verifiable questions about long documents built by
document assembly.

A task is a question whose evidence (the "needles": a few statements, or functions of a
code file) is scattered through a document of generated filler, to a length set in the
model's own tokens: the prompt measures at most `tokens` tokens of the given tokenizer
and at least that minus one filler unit (a sentence or a function, tens of tokens).
Kinds (after RULER and BABILong):

- variable_tracking: chains `VAR B = VAR A`, `VAR A = 48213` among distractor chains;
  the value of the chain's last variable (multi-hop);
- multikey_retrieval: the access code of one key among near-duplicate keys (a digit
  changed, digits swapped, another adjective or animal);
- consistency: numbered statements of facts, some restated; exactly one later statement
  contradicts an earlier one; its number;
- aggregation: sightings scattered through the text; how many of one bird (or, at
  levels 3-4, how many more of one than of another);
- code_returns: a long generated Python file; what a call returns through a chain of calls;
- code_calls: the same kind of file; which function calls a given one (at levels 3-4,
  which calls the function that calls it).

A retrieval control, `needle` (RULER's single needle: one access code in plain filler, no
near-duplicate keys), is not drawn by default; name it in `kinds` (the long-context
evaluation, polyrl/evals/context_sweep.py, runs it beside the kinds above).

Every answer is an integer, graded by `answer_verify` (boxed). Difficulty levels raise
hops, distractors, facts and counts, and the default length (LEVEL_TOKENS); the
`tokens` option sets one length for every level (a length sweep). Level 0, a warm-up for
training, is drawn only when named: one hop, no distractors, 512 tokens, and consistency
questions whose contradiction is the only repeated fact (level 1 adds agreeing
restatements, so that a repeat alone no longer gives the answer away: the values must be
compared). Which split a task belongs to is a stable hash of its evidence and question
(`hash_split`), decided before the document is assembled, so train and held-out never
share a question.

Out of scope: natural text (the filler is generated, and never mentions what a question
asks about: no digits, birds, keys, variables or statements), lexical paraphrase between question and needle (NoLiMa-style), tasks whose
answer is not an integer.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass
from typing import Any, Callable, Protocol, Sequence

from polyrl.domains.generated import check_levels, draw_distinct
from polyrl.domains.pack import check_split, hash_split
from polyrl.types import Task

LEVELS = (1, 2, 3, 4)
"""The levels drawn by default."""
ALL_LEVELS = (0, *LEVELS)
"""Level 0 is the warm-up, drawn only when named."""
KINDS = ("variable_tracking", "multikey_retrieval", "consistency", "aggregation", "code_returns", "code_calls")
CONTROLS = ("needle",)
"""Kinds drawn only when named: plain retrieval, the control of a length sweep."""
LEVEL_TOKENS = {0: 512, 1: 512, 2: 1024, 3: 2048, 4: 4096}
"""Default prompt length of each level, in the tokenizer's tokens."""
MIN_TOKENS = 128
_HOPS = {0: 1, 1: 1, 2: 2, 3: 3, 4: 4}
_DISTRACTORS = {0: 0, 1: 1, 2: 3, 3: 6, 4: 10}
_INSTRUCTION = "Answer with a single integer in \\boxed{}."

_ADJ = ("amber", "silent", "crimson", "hollow", "bright", "velvet", "frozen", "golden", "rapid", "gentle")
_ANIMALS = ("falcon", "otter", "badger", "lynx", "marten", "beaver", "ibex", "viper", "walrus", "gecko")
_BIRDS = ("heron", "kestrel", "plover", "curlew", "osprey", "wren")
_FACILITIES = ("library", "museum", "station", "bridge", "theatre", "hospital", "school", "market hall")
_ATTRS = (("was built in", 1700, 1999), ("has", 2, 60, "floors"), ("employs", 5, 400, "people"))
_SYLLABLES = ("nor", "val", "ka", "bri", "tom", "ell", "ash", "dun", "mer", "ro", "sil", "ford", "wick", "lan")
# Filler: sentences from words the evidence never uses (no digits, birds, codes or statements).
_SUBJECTS = ("The old miller", "A quiet teacher", "The harbour clerk", "A young painter", "The night guard",
             "An elderly tailor", "The village cook", "A travelling singer", "The river pilot", "A patient weaver")
_VERBS = ("walked slowly", "talked at length", "waited calmly", "sang softly", "worked late", "rested briefly",
          "wrote letters", "swept the floor", "mended nets", "read aloud")
_PLACES = ("beside the mill", "near the orchard", "under the old arch", "by the harbour wall", "inside the barn",
           "along the canal", "behind the chapel", "across the meadow", "at the crossroads", "on the hillside")
_TIMES = ("before dawn", "after supper", "during the storm", "through the evening", "at noon",
          "while it rained", "as the bells rang", "in the cold morning", "late in autumn", "once the fog lifted")


class Encoder(Protocol):
    def encode(self, text: str) -> list[int]: ...


@dataclass(frozen=True)
class Core:
    """A task before assembly: its evidence, question and answer."""

    kind: str
    needles: tuple[str, ...]
    """statements (or functions) the answer depends on, plus distractors of the same form"""
    question: str
    answer: int
    ordered: bool
    """needles must keep their order in the document (chains, contradiction after the original)"""
    code: bool
    """the document is a Python file (filler: functions), else prose"""
    filler: Callable[[random.Random], str]
    """one filler unit: a sentence, or a function that no needle calls"""

    @property
    def key(self) -> str:
        return "\n".join((self.kind, *self.needles, self.question))


class LongContextDomain:
    """Questions over long assembled documents; see the module docstring."""

    name = "longctx"
    default_verifier = "answer_verify"

    def __init__(self, levels: tuple[int, ...] = LEVELS, weights: tuple[float, ...] | None = None,
                 kinds: Sequence[str] = KINDS, tokens: int | None = None, tokenizer: Any = "builtin:tiny") -> None:
        """`levels` (and relative `weights`), the `kinds` to draw from, `tokens`: the prompt length
        of every task (default LEVEL_TOKENS by level), `tokenizer`: the model's own (an object
        with `encode`, or a model directory / builtin:NAME whose tokenizer is loaded on first use)."""
        self.levels, self.weights = check_levels("longctx", levels, ALL_LEVELS, weights)
        self.kinds, _ = check_levels("longctx", (kinds,) if isinstance(kinds, str) else tuple(kinds),
                                     KINDS + CONTROLS, noun="kinds")
        if tokens is not None and (not isinstance(tokens, int) or isinstance(tokens, bool) or tokens < MIN_TOKENS):
            raise ValueError(f"longctx tokens must be an integer >= {MIN_TOKENS} (prompt length in tokens), got {tokens!r}")
        if not isinstance(tokenizer, str) and not callable(getattr(tokenizer, "encode", None)):
            raise ValueError(f"longctx tokenizer must be a model directory, builtin:NAME or an object with encode(), "
                             f"got {type(tokenizer).__name__}")
        self.tokens = tokens
        self._tokenizer = tokenizer

    @property
    def tokenizer(self) -> Encoder:
        if isinstance(self._tokenizer, str):
            from polyrl.models.loading import resolve_model_dir
            from polyrl.models.tokenizer import Tokenizer

            self._tokenizer = Tokenizer.from_dir(resolve_model_dir(self._tokenizer))
        return self._tokenizer

    def sample(self, split: str, n: int, seed: int) -> list[Task]:
        """n tasks of `split`: the questions a pure function of (split, n, seed), their documents
        of (question, length, tokenizer)."""
        check_split(split)
        return draw_distinct(random.Random(f"longctx|{split}|{seed}"), n, lambda rng: self._draw(rng, split))

    def _draw(self, rng: random.Random, split: str) -> tuple[str, Task] | None:
        level = rng.choices(self.levels, self.weights)[0]
        kind = rng.choice(self.kinds)
        core = _GENERATORS[kind](rng, level)
        if hash_split(core.key) != split:
            return None
        target = self.tokens or LEVEL_TOKENS[level]
        # The layout has its own generator: the questions of (split, n, seed) do not depend on
        # the tokenizer or the length, so a length sweep asks the same questions.
        prompt, measured = assemble(core, target, self.tokenizer, random.Random(core.key), level)
        sha = hashlib.sha256(prompt.encode()).hexdigest()
        return core.key, Task(
            id=f"longctx-{split}-{level}-{kind}-{sha[:10]}", domain=self.name, prompt=prompt,
            answer=str(core.answer), split=split, difficulty=level,
            data={"kind": kind, "tokens": measured, "target_tokens": target,
                  "question_id": hashlib.sha256(core.key.encode()).hexdigest()[:16]})


def assemble(core: Core, target: int, tokenizer: Encoder, rng: random.Random, level: int = 0) -> tuple[str, int]:
    """The prompt (intro, document, question) of at most `target` tokens, and its length.

    Filler units are added while the running count stays under `target`, the needles are
    placed at random slots among them, and units are dropped until the measured prompt fits.
    """
    count = lambda text: len(tokenizer.encode(text))  # noqa: E731
    sep = "\n\n" if core.code else "\n"
    needles = list(core.needles)
    if not core.ordered:
        rng.shuffle(needles)
    fixed = count(_prompt(core, needles, sep))
    if fixed > target:
        raise ValueError(f"longctx tokens={target} is too short for a level-{level} {core.kind} task: its "
                         f"question and evidence alone take {fixed} tokens; raise tokens or lower the level")
    filler, total, misses = [], fixed, 0
    while misses < 8:  # a few more tries with other (shorter) units once one does not fit
        unit = core.filler(rng)
        cost = count(unit + sep)
        if total + cost > target:
            misses += 1
            continue
        filler.append(unit)
        total += cost
    slots = sorted(rng.randint(0, len(filler)) for _ in needles)
    doc: list[str | None] = list(filler)
    for offset, slot in enumerate(slots):
        doc.insert(slot + offset, None)  # None marks a needle's place
    it = iter(needles)
    parts = [next(it) if p is None else p for p in doc]
    prompt = _prompt(core, parts, sep)
    measured = count(prompt)
    while measured > target:  # joins tokenize a little differently from the parts alone
        drop = rng.choice([i for i, p in enumerate(doc) if p is not None])
        del doc[drop], parts[drop]
        prompt = _prompt(core, parts, sep)
        measured = count(prompt)
    return prompt, measured


def _prompt(core: Core, parts: Sequence[str], sep: str) -> str:
    what = "the Python file" if core.code else "the document"
    return (f"Read {what} below, then answer the question after it.\n\n" + sep.join(parts)
            + f"\n\nQuestion: {core.question} {_INSTRUCTION}")


# ---------------------------------------------------------------- prose filler and kinds

def _sentence(rng: random.Random) -> str:
    return f"{rng.choice(_SUBJECTS)} {rng.choice(_VERBS)} {rng.choice(_PLACES)} {rng.choice(_TIMES)}."


def _name(rng: random.Random, taken: set[str]) -> str:
    while (name := "".join(rng.choice("ABCDEFGHJKLMNPQRSTUVWXYZ") for _ in range(5))) in taken:
        pass
    taken.add(name)
    return name


def variable_tracking(rng: random.Random, level: int) -> Core:
    """A chain of `hops` assignments from a number; distractor chains; one near-duplicate name."""
    taken: set[str] = set()
    values = rng.sample(range(10000, 99999), 1 + _DISTRACTORS[level])
    chains = []
    for value in values:
        names = [_name(rng, taken) for _ in range(_HOPS[level] + 1)]
        chains.append([f"VAR {names[0]} = {value}."] + [f"VAR {b} = VAR {a}." for a, b in zip(names, names[1:])])
        chains[-1].append(names[-1])
    target = chains[0].pop()
    for chain in chains[1:]:
        chain.pop()
    if level >= 2:  # a distractor whose name differs from the asked one by one letter
        i = rng.randrange(5)
        near = target[:i] + rng.choice([c for c in "ABCDEFGHJKLMNPQRSTUVWXYZ" if c != target[i]]) + target[i + 1:]
        while (other := rng.randint(10000, 99999)) in values:
            pass
        if near not in taken:
            chains.append([f"VAR {near} = {other}."])
    needles = _interleave(rng, chains)
    return Core("variable_tracking", tuple(needles), f"What is the value of variable {target}?", values[0],
                True, False, _sentence)


def _interleave(rng: random.Random, chains: list[list[str]]) -> list[str]:
    """All chains' lines in one order that keeps each chain's own order."""
    out, heads = [], [list(c) for c in chains]
    while any(heads):
        chain = rng.choice([c for c in heads if c])
        out.append(chain.pop(0))
    return out


def multikey_retrieval(rng: random.Random, level: int) -> Core:
    adj, animal, num = rng.choice(_ADJ), rng.choice(_ANIMALS), rng.randint(10, 98)
    key = f"{adj}-{animal}-{num}"
    keys = {key}
    while len(keys) < 1 + _DISTRACTORS[level]:
        change = rng.randrange(4)
        if change == 0:
            other = f"{adj}-{animal}-{num + rng.choice((-1, 1))}"
        elif change == 1:
            other = f"{adj}-{animal}-{str(num)[::-1]}"
        elif change == 2:
            other = f"{rng.choice(_ADJ)}-{animal}-{num}"
        else:
            other = f"{adj}-{rng.choice(_ANIMALS)}-{num}"
        keys.add(other)
    codes = rng.sample(range(1_000_000, 9_999_999), len(keys))
    ordered_keys = [key] + sorted(keys - {key})
    needles = tuple(f"The access code of {k} is {c}." for k, c in zip(ordered_keys, codes))
    return Core("multikey_retrieval", needles, f"What is the access code of {key}?", codes[0], False, False, _sentence)


def consistency(rng: random.Random, level: int) -> Core:
    """Facts about facilities of towns, some restated; one later statement contradicts one, and
    up to half as many agreeing restatements of the other facts may follow it. At level 0,
    three facts stated once each and the contradiction, which is equally likely second, third
    or last (a model that learns "the last one" is right a third of the time)."""
    n_facts, n_restated = {0: 3, 1: 3, 2: 6, 3: 10, 4: 14}[level], {0: 0, 1: 0, 2: 1, 3: 3, 4: 5}[level]
    towns = set()
    while len(towns) < n_facts:
        towns.add("".join(rng.choice(_SYLLABLES) for _ in range(2)).capitalize())
    facts = []
    for town in sorted(towns):
        attr = rng.choice(_ATTRS)
        facts.append((f"the {rng.choice(_FACILITIES)} of {town}", attr, rng.randint(attr[1], attr[2])))
    rng.shuffle(facts)

    def say(fact: tuple, value: int) -> str:
        subject, attr, _ = fact
        unit = f" {attr[3]}" if len(attr) > 3 else ""
        return f"{subject[0].upper()}{subject[1:]} {attr[0]} {value}{unit}."

    order = [(f, f[2]) for f in facts]
    for f in rng.sample(facts, n_restated):  # agreeing restatements, after the original
        order.insert(rng.randint(order.index((f, f[2])) + 1, len(order)), (f, f[2]))
    false = rng.choice(facts)
    wrong = rng.choice([v for v in range(false[1][1], false[1][2] + 1) if v != false[2]])
    if level == 0:  # the contradiction at a uniform place after the first, its original before it
        at = rng.randint(1, len(facts))
        order.remove((false, false[2]))
        order.insert(rng.randint(0, at - 1), (false, false[2]))
        order.insert(at, (false, wrong))
    else:
        last = max(i for i, (f, _) in enumerate(order) if f == false)  # after every statement of it, so
        order.insert(rng.randint(last + 1, len(order)), (false, wrong))  # no restatement contradicts it back
        others = [f for f in facts if f != false]
        # Agreeing statements after it, so that position gives the answer away less: "the last
        # statement" was right 59% of the time at level 1; now the best position is right 46 / 31 /
        # 25 / 13% at levels 1 to 4 (a level-1 task keeps fitting its 512 tokens).
        for _ in range(rng.randint(0, max(1, len(others) // 2))):
            f = rng.choice(others)
            order.append((f, f[2]))
    labels = rng.sample(range(100, 999), len(order))
    needles = tuple(f"Statement {label}: {say(f, v)}" for label, (f, v) in zip(labels, order))
    answer = labels[order.index((false, wrong))]
    question = ("Exactly one numbered statement contradicts an earlier numbered statement. "
                "What is the number of that later statement?")
    return Core("consistency", needles, question, answer, True, False, _sentence)


def aggregation(rng: random.Random, level: int) -> Core:
    birds = rng.sample(_BIRDS, max(2, level + 1))
    counts = {b: rng.randint(1, 2 + 2 * level) for b in birds}
    needles = tuple(f"Sighted: a {b} {rng.choice(_PLACES)}." for b in birds for _ in range(counts[b]))
    a, b = birds[0], birds[1]
    if level >= 3 and counts[a] != counts[b] and rng.random() < 0.5:
        a, b = (a, b) if counts[a] > counts[b] else (b, a)
        question, answer = f"How many more {a} sightings than {b} sightings does the text report?", counts[a] - counts[b]
    else:
        question, answer = f"How many {a} sightings does the text report?", counts[a]
    return Core("aggregation", needles, question, answer, False, False, _sentence)


# ---------------------------------------------------------------- code files

_OPS = ("+", "-", "*")


def _code_filler(reserved: set[int]) -> Callable[[random.Random], str]:
    """Distractor functions: each returns arithmetic on x or calls an earlier distractor,
    never a needle (their ids are `reserved`); some names are near-duplicates of needles'."""
    made: list[int] = []
    near = [int(str(i)[::-1]) for i in reserved if str(i)[::-1] != str(i)] + [i + d for i in reserved for d in (-1, 1)]

    def unit(rng: random.Random) -> str:
        pool = [i for i in near if i not in reserved and i not in made and 1000 <= i <= 9999]
        ident = rng.choice(pool) if pool and rng.random() < 0.3 else rng.randint(1000, 9999)
        while ident in reserved or ident in made:
            ident = rng.randint(1000, 9999)
        c = rng.randint(1, 9)
        body = f"f_{rng.choice(made)}(x) {rng.choice(_OPS)} {c}" if made and rng.random() < 0.5 else f"x {rng.choice(_OPS)} {c}"
        made.append(ident)
        return f"def f_{ident}(x):\n    return {body}"
    return unit


def _chain(rng: random.Random, length: int) -> list[int]:
    return rng.sample(range(1000, 9999), length)


def code_returns(rng: random.Random, level: int) -> Core:
    """f_a(x) -> f_b(...) -> ... -> arithmetic; the value of f_a(x0)."""
    ids = _chain(rng, _HOPS[level] + 1)
    x0 = rng.randint(1, 9)
    defs, steps = [], []
    for here, nxt in zip(ids, ids[1:]):
        op, c = rng.choice(_OPS), rng.randint(2, 3) if rng.random() < 0.3 else rng.randint(1, 9)
        if rng.random() < 0.5:
            defs.append(f"def f_{here}(x):\n    return f_{nxt}(x {op} {c})")
            steps.append(("arg", op, c))
        else:
            defs.append(f"def f_{here}(x):\n    return f_{nxt}(x) {op} {c}")
            steps.append(("result", op, c))
    op, c = rng.choice(_OPS), rng.randint(1, 9)
    defs.append(f"def f_{ids[-1]}(x):\n    return x {op} {c}")
    answer = _evaluate(x0, steps, (op, c))
    return Core("code_returns", tuple(defs), f"What does f_{ids[0]}({x0}) return?", answer, False, True,
                _code_filler(set(ids)))


def _evaluate(x: int, steps: list[tuple[str, str, int]], last: tuple[str, int]) -> int:
    apply = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}
    if not steps:
        return apply[last[0]](x, last[1])
    where, op, c = steps[0]
    if where == "arg":
        return _evaluate(apply[op](x, c), steps[1:], last)
    return apply[op](_evaluate(x, steps[1:], last), c)


def code_calls(rng: random.Random, level: int) -> Core:
    """The one function that calls f_t (levels 1-2), or that calls the function calling f_t."""
    depth = 1 if level <= 2 else 2
    ids = _chain(rng, depth + 1)  # ids[0] calls ids[1] ... calls ids[-1] = the target
    defs = [f"def f_{a}(x):\n    return f_{b}(x) {rng.choice(_OPS)} {rng.randint(1, 9)}" for a, b in zip(ids, ids[1:])]
    defs.append(f"def f_{ids[-1]}(x):\n    return x {rng.choice(_OPS)} {rng.randint(1, 9)}")
    if depth == 1:
        question = f"Which function calls f_{ids[-1]}? Give the number in its name."
    else:
        question = f"Which function calls the function that calls f_{ids[-1]}? Give the number in its name."
    return Core("code_calls", tuple(defs), question, ids[0], False, True, _code_filler(set(ids)))


def needle(rng: random.Random, level: int) -> Core:
    """The retrieval control: one access code among filler sentences (the same at every level)."""
    key = f"{rng.choice(_ADJ)}-{rng.choice(_ANIMALS)}-{rng.randint(10, 98)}"
    code = rng.randint(1_000_000, 9_999_999)
    return Core("needle", (f"The access code of {key} is {code}.",), f"What is the access code of {key}?", code,
                False, False, _sentence)


_GENERATORS: dict[str, Callable[[random.Random, int], Core]] = {
    "variable_tracking": variable_tracking, "multikey_retrieval": multikey_retrieval, "consistency": consistency,
    "aggregation": aggregation, "code_returns": code_returns, "code_calls": code_calls, "needle": needle,
}
