"""The English instruction-following domain (``domain.name=instruct``): its public module.

Tasks, splits, seed rubrics, the verifier and the hidden oracle are in ``instruct_domain``; the
instruction types in ``instruct_spec``; checkers in ``instruct_checkers``; the prompt-reading
checker library in ``instruct_library``; plain-English guidance in ``instruct_guidance``. See
``docs/instruct_domain.md``.
"""

from __future__ import annotations

import functools

from rubric_rl.envs.instruct_domain import (
    DOMAIN,
    InstructDomain,
    hard_requirements,
    oracle_quality,
    task_bank,
    task_requirements,
    verify,
)
from rubric_rl.envs.instruct_guidance import FIELD_TITLES, criterion_guidance, skill_guidance
from rubric_rl.envs.instruct_spec import OOD_PAIRS, OOD_TYPES, SPLITS, TRAIN_TYPES, TYPES
from rubric_rl.envs.tool_domain import BASE_UNITS, units

__all__ = [
    "DOMAIN",
    "OOD_PAIRS",
    "OOD_TYPES",
    "SPLITS",
    "TRAIN_TYPES",
    "TYPES",
    "InstructDomain",
    "criterion_guidance",
    "hard_requirements",
    "oracle_quality",
    "skill_guidance",
    "task_bank",
    "task_requirements",
    "verify",
    "vocabulary",
]

# Tasks per split scanned for the vocabulary (seed 0): every topic, request and instruction
# sentence appears many times over.
VOCAB_SCAN_TASKS = 300


@functools.cache
def vocabulary() -> tuple[str, ...]:
    """The embedded "spaced" tokenizer's units for tiny test policies: every printable ASCII
    character, and the units of the scanned prompts, reference answers, criterion and skill
    texts and guidance titles (a real model brings its own tokenizer)."""
    found = set(BASE_UNITS)
    gen = InstructDomain(0)
    for split in SPLITS:
        for t in gen.tasks(split, VOCAB_SCAN_TASKS):
            texts = [t.question, t.reference_answer or ""] + [c.text for c in t.rubric.criteria]
            for text in texts:
                found.update(units(text))
    for t in TYPES:
        found.update(units(t.skill))
    for title in FIELD_TITLES.values():
        found.update(units(title))
    return tuple(sorted(found))
