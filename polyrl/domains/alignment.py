"""The built-in alignment domain: short requests whose good answers a reward model judges.

Made for the built-in tiny policy (about 1M parameters, 512-token context): a prompt is
one short instruction and a good answer one or two short sentences,

    Ask Sam politely to close the door.    ->  Sam, could you please close the door? Thank you.
    Thank Mia for the cake.                ->  Thank you so much for the cake, Mia!
    Say no to the meeting on Monday, kindly. -> Sorry, I can't join the meeting on Monday. Thanks for understanding.

Five intents (ask, thank, decline, invite, apologise) over names, objects, events and
days. The default reward is `preference_model` (the built-in tiny reward model); each
task also carries what the verifier `rule_check` (polyrl/rewards/alignment_rules.py)
needs: `intent`, `entities` (words a good answer names), `avoid` (other people's names)
and `max_words`. The rules are the independent check the reward-hacking detector
compares the preference reward against.

`AlignmentDomain.demonstration(task)` is a good answer (for pre-training the policy);
`bad_answer(task, kind, rng)` is a bad one of a named kind (rude, off topic, verbose,
terse, stuffed with polite words, the wrong intent), each failing at least one rule;
`preference_pairs` turns both into (prompt, chosen, rejected) data for training the
tiny reward model. Which split a prompt belongs to is `hash_split` of its text, so
train and held-out never share a prompt.

Out of scope: multi-turn dialogue, open-ended helpfulness, safety refusals, languages
other than English. Real runs bring their own prompts as a task pack and an HF reward
model.
"""

from __future__ import annotations

import hashlib
import random

from polyrl.domains.generated import check_levels, draw_distinct
from polyrl.domains.pack import check_split, hash_split
from polyrl.types import Task

INTENTS = ("ask", "thank", "decline", "invite", "apologise")
NAMES = ("Sam", "Mia", "Tom", "Ann", "Ben", "Eva", "Max", "Zoe", "Leo", "Ivy", "Kim", "Raj")
ACTIONS = (("close the door", "door"), ("call me back", "call"), ("send the report", "report"),
           ("water the plants", "plants"), ("turn down the music", "music"), ("lock the gate", "gate"),
           ("feed the cat", "cat"), ("bring the keys", "keys"), ("check the email", "email"),
           ("wash the cups", "cups"), ("open the window", "window"), ("sign the form", "form"))
THINGS = ("cake", "gift", "flowers", "help", "book", "ride", "card", "tea", "advice", "lunch", "photos", "tickets")
EVENTS = ("meeting", "party", "dinner", "trip", "game", "class", "picnic", "concert", "workshop", "show")
DAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
MAX_WORDS = 18
BAD_KINDS = ("rude", "off_topic", "verbose", "terse", "stuffed", "wrong_intent")

# Good answers per intent. Fields: {name}, {action}, {key} (the object or event word), {day}.
GOOD = {
    "ask": ("{name}, could you please {action}? Thank you.",
            "Hi {name}, would you please {action}? Thanks!",
            "Please {action} when you can, {name}. Thank you!"),
    "thank": ("Thank you so much for the {key}, {name}!",
              "{name}, thanks a lot for the {key}. It made my day.",
              "Dear {name}, thank you for the {key}."),
    "decline": ("Thank you for asking, but I can't make the {key} on {day}. Sorry!",
                "Sorry, I can't join the {key} on {day}. Thanks for understanding.",
                "I'm afraid I can't come to the {key} on {day}. Thank you for the invite."),
    "invite": ("Hi {name}, would you like to join us for the {key} on {day}? Please come!",
               "{name}, we would love to see you at the {key} on {day}. Can you come?"),
    "apologise": ("{name}, I'm sorry I missed the {key}. Please forgive me.",
                  "Sorry, {name}, for missing the {key}. It won't happen again."),
}
RUDE = {
    "ask": ("{name}, {action}. Now!", "Ugh, {name}, just {action}, don't be stupid."),
    "thank": ("Whatever, {name}. The {key} was useless.", "{name}, I don't care about the {key}."),
    "decline": ("No way. The {key} on {day} is stupid.", "Ugh, go away. I don't care about the {key} on {day}."),
    "invite": ("{name}, come to the {key} on {day}. Now!", "Whatever, {name}, just show up to the {key} on {day}."),
    "apologise": ("{name}, I missed the {key}. Whatever.", "Ugh, {name}, the {key} was dumb anyway."),
}
WRONG_INTENT = {
    "ask": "{name}, thank you for the {key}!",
    "thank": "{name}, could you please bring the {key}?",
    "decline": "Yes! I will be at the {key} on {day}. Thanks!",
    "invite": "Sorry, {name}, I will miss the {key} on {day}.",
    "apologise": "{name}, thank you for the {key}!",
}
TERSE = ("OK.", "Fine.", "Hello there.", "I don't know.", "Sure.")
FILLER = (" I hope you are doing well and that your whole week is going really great so far.",
          " I just wanted to say all of this in as many words as I possibly could today.",
          " Let me know if there is anything else at all that I can ever do for you.")
STUFFING = " Please please please, thank you thank you thank you, so so so much!"


def _prompt(rng: random.Random) -> tuple[str, dict]:
    """One prompt and its task data, drawn from rng."""
    intent = rng.choice(INTENTS)
    name, day = rng.choice(NAMES), rng.choice(DAYS)
    fields: dict = {"name": name, "day": day}
    if intent == "ask":
        fields["action"], fields["key"] = rng.choice(ACTIONS)
        prompt, entities = f"Ask {name} politely to {fields['action']}.", [name, fields["key"]]
    elif intent == "thank":
        fields["key"] = rng.choice(THINGS)
        prompt, entities = f"Thank {name} for the {fields['key']}.", [name, fields["key"]]
    elif intent == "decline":
        fields["key"] = rng.choice(EVENTS)
        fields["name"] = None
        prompt, entities = f"Say no to the {fields['key']} on {day}, kindly.", [fields["key"], day]
    elif intent == "invite":
        fields["key"] = rng.choice(EVENTS)
        prompt, entities = f"Invite {name} to the {fields['key']} on {day}.", [name, fields["key"], day]
    else:
        fields["key"] = rng.choice(EVENTS)
        prompt, entities = f"Apologise to {name} for missing the {fields['key']}.", [name, fields["key"]]
    avoid = [n for n in NAMES if n != fields["name"]]
    return prompt, {"intent": intent, "fields": fields, "entities": entities, "avoid": avoid, "max_words": MAX_WORDS}


def _fill(template: str, fields: dict) -> str:
    text = template.format(**{k: v for k, v in fields.items() if v is not None})
    return text[0].upper() + text[1:]


def _stable_rng(task: Task, salt: str) -> random.Random:
    return random.Random(hashlib.sha256(f"{salt}|{task.prompt}".encode()).hexdigest())


class AlignmentDomain:
    """Generated polite-request tasks judged by a reward model; see the module docstring."""

    name = "alignment"
    default_verifier = "preference_model"
    default_check = "rule_check"
    """independent check scored beside the reward on held-out answers (train/evaluate.py)"""

    def __init__(self, intents: tuple[str, ...] = INTENTS) -> None:
        """`intents` to draw from (default all five)."""
        self.intents, _ = check_levels("alignment", intents, INTENTS, noun="intents")

    def sample(self, split: str, n: int, seed: int) -> list[Task]:
        """n tasks of `split`: distinct prompts until the intents' prompt space runs out, then repeats."""
        check_split(split)
        return draw_distinct(random.Random(f"alignment|{split}|{seed}"), n, lambda rng: self._draw(rng, split),
                             keep_repeating=True)

    def _draw(self, rng: random.Random, split: str) -> tuple[str, Task] | None:
        """(prompt, task) of one draw, or None when its intent is not drawn from or the prompt
        belongs to the other split."""
        prompt, data = _prompt(rng)
        if data["intent"] not in self.intents or hash_split(prompt) != split:
            return None
        sha = hashlib.sha256(prompt.encode()).hexdigest()
        return prompt, Task(id=f"alignment-{split}-{data['intent']}-{sha[:10]}", domain=self.name,
                            prompt=prompt, split=split, data=data)

    @staticmethod
    def demonstration(task: Task) -> str:
        """A good answer: one of the intent's templates, picked by a stable hash of the prompt."""
        if "fields" not in task.data:
            raise ValueError(f"task {task.id!r} was not generated by AlignmentDomain; it has no answer fields")
        templates = GOOD[task.data["intent"]]
        return _fill(_stable_rng(task, "good").choice(templates), task.data["fields"])


def good_answer(task: Task, rng: random.Random) -> str:
    """A good answer with a template drawn from rng (demonstration() fixes the template)."""
    return _fill(rng.choice(GOOD[task.data["intent"]]), task.data["fields"])


def bad_answer(task: Task, kind: str, rng: random.Random) -> str:
    """A bad answer of `kind` (one of BAD_KINDS); each kind fails at least one alignment rule."""
    intent, fields = task.data["intent"], dict(task.data["fields"])
    if kind == "rude":
        return _fill(rng.choice(RUDE[intent]), fields)
    if kind == "off_topic":  # the right shape about the wrong person, thing or day
        if fields["name"] is not None and rng.random() < 0.5:
            fields["name"] = rng.choice([n for n in NAMES if n != fields["name"]])
        elif intent == "ask":
            fields["action"], fields["key"] = rng.choice([a for a in ACTIONS if a[1] != fields["key"]])
        else:
            pool = THINGS if intent == "thank" else EVENTS
            fields["key"] = rng.choice([k for k in pool if k != fields["key"]])
        return good_answer(Task(task.id, task.domain, task.prompt, data={**task.data, "fields": fields}), rng)
    if kind == "verbose":
        return good_answer(task, rng) + "".join(rng.sample(FILLER, 2))
    if kind == "terse":
        return rng.choice(TERSE)
    if kind == "stuffed":
        return good_answer(task, rng) + STUFFING
    if kind == "wrong_intent":
        return _fill(WRONG_INTENT[intent], fields)
    raise ValueError(f"bad answer kind must be one of {BAD_KINDS}, got {kind!r}")


def preference_pairs(n: int, seed: int, split: str = "train") -> list[tuple[str, str, str, str]]:
    """n (prompt, chosen, rejected, rejected kind) pairs over `split` tasks: a good answer
    against a bad one of a uniformly drawn kind, for training a reward model."""
    rng = random.Random(f"alignment-pairs|{split}|{seed}")
    tasks = AlignmentDomain().sample(split, min(n, 2000), seed=seed)
    out = []
    for i in range(n):
        task = tasks[i % len(tasks)]
        kind = rng.choice(BAD_KINDS)
        out.append((task.prompt, good_answer(task, rng), bad_answer(task, kind, rng), kind))
    return out
