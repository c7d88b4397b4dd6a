"""Warm-start demonstrations of the embedded constraint domain's task writer (ARISE-RL's
generator role).

A demonstration episode is made from a training task of ``ConstraintDomain`` (so it is valid by
construction): the generator's role prompt (``constraint_writer.role_prompt``, with 0-10 other
training questions as in-context negatives), a ``lookup`` of the category the question names,
the tool's answer, and the final answer ``<question> the task's prompt </question> <rubric>
<criterion> … </criterion> … </rubric>`` listing the library's criteria for it (every stated
clause; each implicit requirement with probability ``implicit_rate``). It becomes two supervised
pairs in the corpus format (``constraint_corpus.warmstart_corpus``: (messages, completion)), one
per assistant turn, the second's messages holding the first turn and the tool turn as the agent
loop renders them. ``turn_end`` closes the first turn inside the messages: the embedded word
tokenizer's chat template does not end an assistant message with the eos the model sampled,
while the agent loop's context keeps it, so the demonstration writes it (``"<|eos|>"``, which the
tokenizer encodes as the eos id) and the warm start's tokens are the rollout's; "" for a template
that closes assistant turns itself.

Opt-in only: the default corpus of existing configs is unchanged.
:func:`add_generator_demonstrations` extends a corpus; :func:`with_generator_demonstrations` wraps
a ``builders.Domain`` (its corpus gets a share of generator demonstrations, its vocabulary becomes
``generator_vocabulary()``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from rubric_rl.envs.constraint_domain import ConstraintDomain
from rubric_rl.envs.constraint_writer import (
    GENERATOR_TASK_TYPES,
    IMPLICIT_RATE,
    N_NEGATIVES,
    demonstration_turns,
    generator_task,
    generator_vocabulary,
    source_question,
)
from rubric_rl.rubrics.types import Task

__all__ = [
    "EMBEDDED_TURN_END",
    "add_generator_demonstrations",
    "demonstration_turns",
    "generator_corpus",
    "generator_demonstration",
    "with_generator_demonstrations",
]

EMBEDDED_TURN_END = "<|eos|>"

Pair = tuple[list[dict], str]


def generator_demonstration(
    source: Task,
    rng: np.random.Generator,
    *,
    recent: Sequence[str] = (),
    n_negatives: int = N_NEGATIVES,
    turn_end: str = EMBEDDED_TURN_END,
    implicit_rate: float = IMPLICIT_RATE,
) -> list[Pair]:
    """The two (messages, completion) pairs of one demonstration episode for ``source``."""
    if source.task_type not in GENERATOR_TASK_TYPES:
        raise ValueError(
            f"generator_demonstration: task {source.id!r} is of type {source.task_type!r}, "
            f"not a generator task type {GENERATOR_TASK_TYPES}"
        )
    role = generator_task(source.task_type, recent, n_negatives=n_negatives)
    (call, final), observation = demonstration_turns(source, rng, implicit_rate=implicit_rate)
    first = role.messages
    closed = f"{call} {turn_end}" if turn_end else call
    second = first + [
        {"role": "assistant", "content": closed},
        {"role": "tool", "content": observation},
    ]
    return [(first, call), (second, final)]


def generator_corpus(
    n: int,
    seed: int,
    *,
    n_negatives: int = N_NEGATIVES,
    turn_end: str = EMBEDDED_TURN_END,
    implicit_rate: float = IMPLICIT_RATE,
) -> list[Pair]:
    """``2 n`` pairs: ``n`` demonstration episodes over training tasks of ``seed``, each with
    0..``n_negatives`` other training questions as its in-context negatives."""
    if n < 0:
        raise ValueError(f"generator_corpus: n must be >= 0, got {n}")
    tasks = [
        t
        for t in ConstraintDomain(seed).tasks("train", max(8, min(2 * n, 2000)))
        if t.task_type in GENERATOR_TASK_TYPES
    ]
    out: list[Pair] = []
    for i in range(n):
        rng = np.random.default_rng([seed, 11, i])
        source = tasks[i % len(tasks)]
        k = int(rng.integers(0, n_negatives + 1))
        others = [t for t in tasks if t.id != source.id]
        recent = [source_question(others[j]) for j in rng.permutation(len(others))[:k]]
        out += generator_demonstration(
            source,
            rng,
            recent=recent,
            n_negatives=n_negatives,
            turn_end=turn_end,
            implicit_rate=implicit_rate,
        )
    return out


def add_generator_demonstrations(
    corpus: Sequence[Pair], n: int, seed: int, **kw: Any
) -> list[Pair]:
    """``corpus`` with ``n`` demonstration episodes (``2 n`` pairs) spread evenly through it
    (order matters only to readers: the warm start samples rows at random)."""
    extra = generator_corpus(n, seed, **kw)
    out = list(corpus)
    step = (len(out) + 1) / (len(extra) + 1)
    for j, pair in enumerate(extra):
        out.insert(int(round((j + 1) * step)) + j, pair)
    return out


def with_generator_demonstrations(domain: Any, *, fraction: float = 0.25, **kw: Any) -> Any:
    """A copy of ``domain`` (``builders.Domain``) whose warm-start corpus of size n holds
    ``round(fraction * n / 2)`` generator episodes (2 pairs each) in place of as many of its own
    demonstrations, and whose vocabulary is ``generator_vocabulary()``."""
    if not 0.0 <= fraction <= 1.0:
        raise ValueError(
            f"with_generator_demonstrations: fraction must be in [0, 1], got {fraction}"
        )
    base: Callable[..., list[Pair]] | None = domain.corpus
    if base is None:
        raise ValueError(f"domain {domain.name!r} has no warm-start corpus to extend")

    def corpus(n: int, seed: int, p_keep: float, copy_fraction: float) -> list[Pair]:
        episodes = int(round(fraction * n / 2))
        own = base(max(0, n - 2 * episodes), seed, p_keep, copy_fraction)
        return add_generator_demonstrations(own, episodes, seed, **kw)

    return dataclasses.replace(domain, corpus=corpus, vocabulary=generator_vocabulary())
