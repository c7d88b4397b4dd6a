"""The embedded synthetic constraint-following domain (DESIGN.md §7): its public module.

The domain itself (splits, tasks, seed rubrics, the verifier and the hidden oracle) is defined in
``constraint_domain``, its guidance blocks and warm-start corpus in ``constraint_corpus`` (which
builds on the domain); this module re-exports both, so ``constraints.ConstraintDomain`` and
``constraints.warmstart_corpus`` are one import away without either module importing the other's
user.
"""

from __future__ import annotations

from rubric_rl.envs.constraint_corpus import (
    copy_corpus,
    decorate_prompt,
    format_reference,
    render_guidance,
    skill_guidance,
    warmstart_corpus,
)
from rubric_rl.envs.constraint_domain import (
    CAPABILITIES,
    HABITS,
    OOD_PAIRS,
    OOD_TASK_TYPES,
    SPLITS,
    SPURIOUS_WEIGHT,
    TRAIN_TASK_TYPES,
    Constraint,
    ConstraintDomain,
    combo_kinds,
    domain_vocabulary,
    hard_constraints,
    oracle_quality,
    render_response,
    seed_rubric,
    task_bank,
    verify,
    with_hard_env,
)

__all__ = [
    "CAPABILITIES",
    "HABITS",
    "OOD_PAIRS",
    "OOD_TASK_TYPES",
    "SPLITS",
    "SPURIOUS_WEIGHT",
    "TRAIN_TASK_TYPES",
    "Constraint",
    "ConstraintDomain",
    "copy_corpus",
    "combo_kinds",
    "decorate_prompt",
    "domain_vocabulary",
    "format_reference",
    "hard_constraints",
    "oracle_quality",
    "render_guidance",
    "render_response",
    "seed_rubric",
    "skill_guidance",
    "task_bank",
    "verify",
    "warmstart_corpus",
    "with_hard_env",
]
