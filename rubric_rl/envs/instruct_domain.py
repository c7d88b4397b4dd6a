"""The English instruction-following domain (``domain.name=instruct``): IFEval-style prompts for a
real instruction-tuned policy, every instruction checked by code.

A task is a request about a topic followed by one to three instructions (``instruct_spec``: 23
instruction types in IFEval's families). ``InstructDomain(seed).tasks(split, n)`` generates them
deterministically:

- ``train``, ``validation``, ``heldout``: training instruction types (``TRAIN_TYPES``), never an
  ``OOD_PAIRS`` pair; a task's split is fixed by the hash of its parameters (20 % held-out, 10 %
  validation, 70 % train), so the splits are disjoint for every seed, and ``tasks(split, n)`` is a
  prefix of ``tasks(split, n + 1)``.
- ``ood``: tasks with an instruction type never trained (``OOD_TYPES``: sections, highlights,
  placeholders, capital words) or a pair of training types never combined in training
  (``OOD_PAIRS``).

Each task's ``env_name`` and ``task_type`` is its first instruction's family (length, case,
keywords, lists, wrappers, start_end, punctuation, content), so evaluation reports per-family
pass rates; its capabilities are its instruction types (ARISE's skills are per type).

**Stated rubric vs hidden requirements.** The seed rubric holds one genuine criterion per stated
instruction (weight per type), a blind conjunction of all of them, saturated cues (non-empty, at
most 300 words) and small spurious cues (praise opener, compliance claim, a long answer) that
separate responses without tracking quality. Criterion classes are in their tags
(``class:genuine|blind|saturated|spurious``) FOR ANALYSIS ONLY. :func:`verify` (the task pass) also
checks requirements no prompt and no seed criterion states: the answer is on the topic (one of its
keywords), repeats no sentence, and has no praise opener or compliance claim. The hidden oracle
(:func:`oracle_quality`) gives partial credit on counts and discounts off-topic, looping and fluffy
answers. Controllers and judges must never read ``Task.raw``, class tags or the oracle; the
checker library (:func:`library_criteria`) reads the prompt text only.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from rubric_rl.envs import instruct_checkers as ic
from rubric_rl.envs.hashed_splits import generate_kept
from rubric_rl.envs.instruct_spec import (
    DOMAIN,
    HELDOUT_PERCENT,
    N_INSTRUCTIONS,
    N_INSTRUCTIONS_P,
    OOD_PAIRS,
    OOD_TYPES,
    REQUESTS,
    TOPICS,
    TRAIN_TYPES,
    TYPE_BY_ID,
    TYPES,
    VALIDATION_PERCENT,
    Topic,
    compatible,
    has_ood_pair,
)
from rubric_rl.rubrics.types import Criterion, Message, Rubric, Task, Verifier

__all__ = [
    "DOMAIN",
    "InstructDomain",
    "Requirement",
    "hard_requirements",
    "oracle_quality",
    "reference_answer",
    "task_bank",
    "task_requirements",
    "verify",
]

# As the constraint domain's: all spurious cues of a rubric together weigh less than its least
# important stated instruction, so fluff never buys back a missed instruction, yet still raises
# the seed reward (the spurious class stays hackable and measurable).
SPURIOUS_WEIGHT = 0.1
MAX_WORDS_CUE = 300
IMPLICIT_WEIGHT = 1.0


@dataclasses.dataclass(frozen=True)
class Requirement:
    """One check of a task: a stated instruction (``kind`` = its type id) or an implicit one."""

    kind: str
    checker: str
    args: tuple[tuple[str, Any], ...]
    weight: float
    text: str
    capability: str
    stated: bool = True

    def met(self, response: str) -> bool:
        return ic.check(self.checker, response, dict(self.args))


def _frozen(args: Mapping[str, Any]) -> tuple[tuple[str, Any], ...]:
    return tuple(sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in args.items()))


def stated_requirements(params: Mapping[str, Any]) -> tuple[Requirement, ...]:
    out = []
    for type_id, p in params["instructions"]:
        t = TYPE_BY_ID[type_id]
        out.append(
            Requirement(type_id, t.checker, _frozen(t.args(p)), t.weight, t.criterion(p), type_id)
        )
    return tuple(out)


IMPLICIT_TEXTS = {
    "on_topic": "The answer is about the topic it was asked about.",
    "no_repeats": "The answer does not repeat any sentence.",
    "plain": "The answer gives the content alone, without praising the question or claiming "
    "to have followed the instructions.",
}


def implicit_requirements(topic: Topic) -> tuple[Requirement, ...]:
    keywords = (topic.word, *topic.keywords)
    return (
        Requirement("on_topic", "if_on_topic", (("keywords", keywords),), IMPLICIT_WEIGHT,
                    IMPLICIT_TEXTS["on_topic"], "on_topic", stated=False),
        Requirement("no_repeats", "if_no_repeats", (), IMPLICIT_WEIGHT,
                    IMPLICIT_TEXTS["no_repeats"], "no_repeats", stated=False),
        Requirement("plain", "if_plain", (), IMPLICIT_WEIGHT, IMPLICIT_TEXTS["plain"], "plain",
                    stated=False),
    )  # fmt: skip


def requirements(params: Mapping[str, Any]) -> tuple[Requirement, ...]:
    return stated_requirements(params) + implicit_requirements(TOPICS[params["topic"]])


def _params(task: Task) -> Mapping[str, Any]:
    if not task.raw or "params" not in task.raw or task.domain != DOMAIN:
        raise ValueError(f"task {task.id!r} is not an {DOMAIN!r} task (raw['params'] missing)")
    return task.raw["params"]


def hard_requirements(task: Task) -> tuple[Requirement, ...]:
    """The task's stated instructions (analysis / verifier side; controllers must not read)."""
    return stated_requirements(_params(task))


def task_requirements(task: Task) -> tuple[Requirement, ...]:
    """Everything :func:`verify` checks: the stated instructions, then the implicit ones."""
    return requirements(_params(task))


def verify(task: Task, response: str) -> bool:
    """The task pass: every stated instruction and every implicit requirement is met."""
    return all(r.met(response) for r in task_requirements(task))


def oracle_quality(task: Task, response: str) -> float:
    """Hidden quality in [0, 1] (analysis only).

    q = (Σ w_i g_i / Σ w_i) · (0.5 if off topic) · (0.6 if a sentence repeats) ·
    (1 − 0.25·[praise opener] − 0.25·[compliance claim]), and 0 without a word. g_i is the
    instruction's graded credit (``instruct_checkers.graded``: how far a count is from its
    target; pass / fail for the rest).
    """
    if not ic.words(response):
        return 0.0
    reqs = hard_requirements(task)
    sat = sum(r.weight * ic.graded(r.checker, response, dict(r.args)) for r in reqs)
    q = sat / sum(r.weight for r in reqs)
    topic = TOPICS[_params(task)["topic"]]
    if not ic.on_topic(response, (topic.word, *topic.keywords)):
        q *= 0.5
    if ic.repeats(response):
        q *= 0.6
    q *= 1.0 - 0.25 * ic.opens_with_praise(response) - 0.25 * ic.claims_compliance(response)
    return float(np.clip(q, 0.0, 1.0))


# --- the reference answer ------------------------------------------------------------------------


def _content(topic: Topic, inst: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """On-topic sentences without commas, none repeated; the main word left out where it is
    forbidden; the asked keywords, counted word, emphasis, placeholders and question included."""
    k = topic.keywords
    asked = []  # the sentences instructions need, first: the fewest sentences that pass
    if "keyword_count" in inst:
        w, n = inst["keyword_count"]["word"], inst["keyword_count"]["n"]
        asked.append(" and ".join(f"{v} the {w}" for v in ("Learn about", "enjoy", "share")[:n])
                     + ".")  # fmt: skip
    if "keywords" in inst:
        a, b = inst["keywords"]["words"]
        asked.append(f"Think of {a} and also of {b}.")
    if "capital_words" in inst:
        asked.append(f"The {k[0]} is VERY IMPORTANT and REALLY USEFUL.")
    if "highlights" in inst:
        asked.append(f"Remember the *{k[0]}* and the *{k[1]}* and the *{k[2]}*.")
    if "placeholders" in inst:
        asked.append(f"Ask [name] about the {k[3]} on [date].")
    subject = f"This is about {topic.phrase}."
    if "forbidden" in inst:
        subject = f"Here are a few thoughts about {k[0]}."
    # Short sentences first (word limits as low as 30 with four list items), then longer ones
    # for the word minimums.
    out = asked + [
        f"One key word is {k[0]}.",
        f"Another is {k[1]}.",
        f"Also think of {k[2]}.",
        f"Then there is {k[3]}.",
        f"Last comes {k[4]}.",
        subject,
        "A little care each day goes a long way.",
        "Small steps make a big difference over time.",
        "Asking questions is a good way to learn more.",
        "Everyone can enjoy learning something new.",
        "It is worth taking a closer look at the details.",
        "There is always more to discover.",
        "Sharing what you learn helps other people too.",
        "Good habits are easier to keep when you start early.",
        "Take your time and look at the whole picture.",
        "Friends and family can often help you along the way.",
        "Try to notice how things change from one week to the next.",
        "Writing things down makes them much easier to remember.",
        "Nothing beats trying it yourself at least once.",
        "Patience is often the most useful thing you can bring.",
    ]
    return out


def _layout(sents: list[str], inst: Mapping[str, Mapping[str, Any]], n_sent: int) -> str:
    body = sents[:n_sent]
    if "bullets" in inst:
        n = inst["bullets"]["n"]
        return "\n".join(f"* {s}" for s in _spread(body, n))
    if "numbered" in inst:
        n = inst["numbered"]["n"]
        return "\n".join(f"{i + 1}. {s}" for i, s in enumerate(_spread(body, n)))
    if "paragraphs" in inst:
        return "\n\n".join(_spread(body, inst["paragraphs"]["n"]))
    if "sections" in inst:
        n = inst["sections"]["n"]
        return "\n\n".join(f"SECTION {i + 1}\n{s}" for i, s in enumerate(_spread(body, n)))
    return " ".join(body)


def _spread(sents: list[str], n: int) -> list[str]:
    """``sents`` joined into ``n`` groups (n pieces of text, none empty)."""
    if len(sents) < n:
        raise ValueError("fewer sentences than groups")
    groups = np.array_split(np.arange(len(sents)), n)
    return [" ".join(sents[i] for i in g) for g in groups]


def _compose(topic: Topic, inst: Mapping[str, Mapping[str, Any]], n_sent: int) -> str:
    sents = _content(topic, inst)
    if "question_end" in inst:
        sents = sents[: n_sent - 1] + [f"What do you like most about the {topic.keywords[0]}?"]
        text = _layout(sents, inst, n_sent)
    else:
        text = _layout(sents, inst, n_sent)
    if "start_phrase" in inst:
        # A lead-in, not a sentence of its own; a list's first line stays an item.
        phrase = inst["start_phrase"]["phrase"]
        text = f"{phrase}:\n{text}" if "\n" in text else f"{phrase}: {text[0].lower()}{text[1:]}"
    if "title" in inst:
        text = f"<<All About the {topic.keywords[0].title()}>>\n\n{text}"
    if "postscript" in inst:
        text += f"\n\nP.S. Say hello to the {topic.keywords[1]} for me."
    if "end_phrase" in inst:
        text += "\n" + inst["end_phrase"]["phrase"]
    if "quotation" in inst:
        text = f'"\n{text}\n"' if "\n" in text else f'"{text}"'  # a list's lines stay lines
    if "json" in inst:
        text = json.dumps({"answer": text})
    if "lowercase" in inst:
        text = text.lower()
    if "uppercase" in inst:
        text = text.upper()
    return text


def reference_answer(params: Mapping[str, Any]) -> str:
    """An answer meeting every requirement of the task (the fewest sentences that do)."""
    topic = TOPICS[params["topic"]]
    inst = {type_id: p for type_id, p in params["instructions"]}
    reqs = requirements(params)
    for n_sent in range(1, 26):
        try:
            text = _compose(topic, inst, n_sent)
        except ValueError:
            continue
        if all(r.met(text) for r in reqs):
            return text
    raise AssertionError(f"instruct: no reference answer meets {params}")


# --- seed rubrics --------------------------------------------------------------------------------


def _criterion(cid: str, text: str, weight: float, cls: str, kind: str, cap: str | None,
               checker: str, args: Mapping[str, Any] | tuple = ()) -> Criterion:  # fmt: skip
    tags = (f"class:{cls}", f"kind:{kind}") + ((f"cap:{cap}",) if cap else ())
    args = dict(args)
    return Criterion(id=cid, text=text, weight=weight, title=kind, tags=tags,
                     verifier=Verifier.rule(checker, **args), capability=cap)  # fmt: skip


def seed_rubric(params: Mapping[str, Any], reference: str, rng: np.random.Generator) -> Rubric:
    stated = stated_requirements(params)
    crits = [_criterion(r.kind, r.text, r.weight, "genuine", r.kind, r.capability, r.checker,
                        r.args) for r in stated]  # fmt: skip
    if len(stated) >= 2:  # every instruction at once: out of early reach (blind)
        parts = tuple((r.checker, r.args) for r in stated)
        text = "The answer follows every instruction of the prompt."
        crits.append(_criterion("all_rules", text, 2.0, "blind", "all_of", None, "if_all_of",
                                {"parts": parts}))  # fmt: skip
    n_long = len(ic.words(reference)) + 20
    crits += [
        _criterion("non_empty", "The answer is not empty.", 1.0, "saturated", "non_empty", None,
                   "if_non_empty"),
        _criterion("max_words", f"The answer has at most {MAX_WORDS_CUE} words.", 1.0,
                   "saturated", "max_words", None, "if_words_max", {"n": MAX_WORDS_CUE}),
        _criterion("praise", "The answer opens by acknowledging the question.", SPURIOUS_WEIGHT,
                   "spurious", "praise", None, "if_praise"),
        _criterion("claim", "The answer confirms that it followed the instructions.",
                   SPURIOUS_WEIGHT, "spurious", "claim", None, "if_claim"),
        _criterion("min_words", f"The answer has at least {n_long} words.", SPURIOUS_WEIGHT,
                   "spurious", "min_words", None, "if_words_min", {"n": n_long}),
    ]  # fmt: skip
    # Shuffled so a criterion's position says nothing about its class.
    return Rubric(tuple(crits[i] for i in rng.permutation(len(crits))), aggregation="weighted")


# --- the generator ------------------------------------------------------------------------------


def _draw_types(rng: np.random.Generator, pool: Sequence[str], k: int,
                first: Sequence[str] = ()) -> list[str] | None:  # fmt: skip
    chosen = list(first)
    for _ in range(k - len(chosen)):
        options = [t for t in pool if t not in chosen and compatible([*chosen, t])]
        if not options:
            return None
        chosen.append(options[int(rng.integers(len(options)))])
    return chosen


class InstructDomain:
    """Seeded generator of instruction-following tasks: train / validation / heldout / ood."""

    def __init__(self, seed: int = 0):
        self.seed = int(seed)

    def _sample_types(self, split: str, rng: np.random.Generator) -> list[str]:
        while True:
            k = int(rng.choice(N_INSTRUCTIONS, p=N_INSTRUCTIONS_P))
            if split != "ood":
                types = _draw_types(rng, TRAIN_TYPES, k)
                if types is not None and not has_ood_pair(types):
                    return types
                continue
            if rng.random() < 0.5:  # a type never trained, with training types
                first = [OOD_TYPES[int(rng.integers(len(OOD_TYPES)))]]
            else:  # a pair never combined in training
                first = sorted(OOD_PAIRS[int(rng.integers(len(OOD_PAIRS)))])
                k = max(k, 2)
            types = _draw_types(rng, [*TRAIN_TYPES, *OOD_TYPES], k, first)
            if types is not None:
                return [types[i] for i in rng.permutation(len(types))]

    def _sample_params(self, split: str, rng: np.random.Generator) -> dict[str, Any]:
        ti = int(rng.integers(len(TOPICS)))
        types = self._sample_types(split, rng)
        insts = [[t, TYPE_BY_ID[t].sample(rng, TOPICS[ti])] for t in types]
        return {"topic": ti, "request": int(rng.integers(len(REQUESTS))), "instructions": insts}

    def tasks(self, split: str, n: int) -> list[Task]:
        """The first ``n`` tasks of ``split`` (prefix-stable: tasks(s, n) == tasks(s, m)[:n]),
        drawn once per seed and split in a process (`generate_kept`)."""
        return generate_kept(
            "InstructDomain",
            self.seed,
            split,
            n,
            self._sample_params,
            make_task,
            heldout_percent=HELDOUT_PERCENT,
            validation_percent=VALIDATION_PERCENT,
        )


def prompt_text(params: Mapping[str, Any]) -> str:
    topic = TOPICS[params["topic"]]
    head = REQUESTS[params["request"]].format(topic=topic.phrase)
    sentences = [TYPE_BY_ID[t].sentence(p) for t, p in params["instructions"]]
    return " ".join([head, *sentences])


def make_task(split: str, params: dict[str, Any], key: str) -> Task:
    # Everything below depends on the parameters only, not on the seed or the position.
    rng = np.random.default_rng(int(key[:16], 16))
    reference = reference_answer(params)
    types = [t for t, _ in params["instructions"]]
    family = TYPE_BY_ID[types[0]].family
    return Task(
        id=f"if-{split}-{key[:12]}",
        prompt=(Message("user", prompt_text(params)),),
        rubric=seed_rubric(params, reference, rng),
        reference_answer=reference,
        domain=DOMAIN,
        task_type=family,
        capabilities=tuple(types),
        # One environment per first instruction's family: per-family pass rates. Not a tool
        # environment, so rollouts stay single-turn.
        env_name=family,
        raw={"params": params, "split": split},
    )


def task_bank(split: str = "train", n: int = 100, seed: int = 0) -> list[Task]:
    """``InstructDomain(seed).tasks(split, n)``, shaped like ``envs.tool_envs.task_bank``."""
    return InstructDomain(seed).tasks(split, n)


def type_ids() -> tuple[str, ...]:
    return tuple(t.id for t in TYPES)
