"""The embedded constraint domain with tool environments mixed in (``domain.tool_envs``).

RISED trains one policy on several environments at once, single- and multi-turn together (the
seed's ALFWorld, WebShop and DBBench). Here the constraint domain's task types stay its
single-turn environments and each tool environment named in ``domain.tool_envs`` (``sql``,
``inventory``: ``envs/tool_domain.py``) joins as one more environment:

- **Tasks**: each tool environment adds ``n_<split> // 4`` tasks per split (about one constraint
  task type's share; ours) from its own task bank (the OOD split: its held-out task type), merged
  so that every prefix of a split holds each environment in proportion (evaluation reads the
  first ``eval.n`` tasks). The validation split stays the constraint domain's (the tool banks
  have none).
- **Rollouts**: ``episodic(task)`` is True for a tool environment's task; in agent mode
  (``rollout.mode`` "auto" resolves to it) those tasks are agent episodes
  (``Services.is_episode``), the rest single-turn. One step batches both.
- **Verifier / oracle**: each task's own (a tool task has no hidden oracle: NaN, left out of
  every mean).
- **Tokenizer**: the exact-decode ("spaced") embedded tokenizer over both vocabularies (tool
  calls and SQL must decode to the text the policy wrote).
- **Method text** (``MixedStyle``): a tool environment's task gets the generic style's prompts,
  the rest the constraint domain's.
- **Behaviours** (what a rollout tagger reads): a tool environment's episodes its own
  (``envs/tool_behaviours.py``), the rest the constraint domain's.
- **Warm start**: ``tool_demo_share`` of the corpus per tool environment (its reference episodes
  replayed, one demonstration per assistant turn; ours), the rest the constraint corpus, in a
  seeded shuffle.
"""

from __future__ import annotations

import dataclasses
import math
import random
from collections.abc import Sequence
from typing import Any

from rubric_rl.envs import tool_domain
from rubric_rl.envs.base import derive_seed, is_tool_env
from rubric_rl.envs.constraint_style import MixedStyle
from rubric_rl.envs.tool_behaviours import mixed_behaviours
from rubric_rl.envs.tool_envs import ENVS, env_for_task
from rubric_rl.rubrics.types import Task

__all__ = ["interleave", "tool_split_size", "with_tool_envs"]

# A tool environment's tasks per split: the split's constraint tasks over this many (the
# constraint domain's four task types; ours).
TOOL_SHARE_DIVISOR = 4


def tool_split_size(n: int) -> int:
    """Tasks a tool environment adds to a split of ``n`` constraint tasks (at least 1)."""
    return max(1, int(n) // TOOL_SHARE_DIVISOR)


def interleave(parts: Sequence[Sequence[Task]]) -> tuple[Task, ...]:
    """The parts merged so that every prefix holds each part in proportion: item j of a part of
    size m sits at (j + 1/2) / m; ties keep the parts' order. Each part keeps its order."""
    keyed = [
        ((j + 0.5) / len(part), p, j, t) for p, part in enumerate(parts) for j, t in enumerate(part)
    ]
    return tuple(t for *_, t in sorted(keyed, key=lambda x: x[:3]))


def with_tool_envs(domain: Any, names: Sequence[str], seed: int, demo_share: float) -> Any:
    """A copy of the constraint ``domain`` (``builders.Domain``) with the tool environments
    ``names`` mixed in (module docstring)."""
    names = tuple(names)
    if not names:
        return domain
    if not 0.0 <= demo_share or demo_share * len(names) >= 1.0:
        raise ValueError(
            f"config.domain.tool_demo_share: {demo_share} per tool environment x {len(names)} "
            "must leave the constraint domain part of the warm-start corpus (0 <= share, "
            "share x environments < 1)"
        )
    for name in names:
        if name not in tool_domain.TOOL_DOMAINS:
            raise ValueError(
                f"config.domain.tool_envs: {name!r} is not a tool environment; known: "
                f"{', '.join(tool_domain.TOOL_DOMAINS)}"
            )

    def split(tasks: tuple[Task, ...], split_name: str) -> tuple[Task, ...]:
        n = tool_split_size(len(tasks))
        return interleave([tasks, *(ENVS.get(e).task_bank(split_name, n, seed) for e in names)])

    base_verify, base_oracle, base_corpus = domain.verify, domain.oracle, domain.corpus
    base_guidance, base_library = domain.guidance, domain.criteria_library

    def verify(task: Task, response: str) -> bool:
        if is_tool_env(task.env_name):
            return tool_domain.VERIFIERS[task.env_name](task, response)
        return base_verify(task, response)

    def oracle(task: Task, response: str) -> float:
        return math.nan if is_tool_env(task.env_name) else base_oracle(task, response)

    def guidance(task: Task) -> list[dict]:
        return task.messages if is_tool_env(task.env_name) else base_guidance(task)

    def library(task: Task) -> Sequence[Any]:
        # A tool task's bank is its own rubric (the checker library reads constraint prompts).
        if is_tool_env(task.env_name):
            return tuple(task.rubric.criteria)
        return base_library(task)

    def corpus(n: int, s: int, p_keep: float, copy_fraction: float) -> list:
        per_tool = int(round(demo_share * n))
        out = list(base_corpus(n - per_tool * len(names), s, p_keep, copy_fraction))
        for e in names:
            out += tool_domain.warmstart_corpus(e, per_tool, s, p_keep)
        random.Random(derive_seed("mixed-warmstart", ",".join(names), s)).shuffle(out)
        return out

    vocabulary = list(domain.vocabulary)
    seen = set(vocabulary)
    for e in names:
        for u in tool_domain.vocabulary(e):
            if u not in seen:
                seen.add(u)
                vocabulary.append(u)
    return dataclasses.replace(
        domain,
        train=split(domain.train, "train"),
        heldout=split(domain.heldout, "heldout"),
        ood=split(domain.ood, "ood"),
        verify=verify,
        oracle=oracle if base_oracle is not None else None,
        corpus=corpus if base_corpus is not None else None,
        vocabulary=tuple(vocabulary),
        make_env=lambda task: env_for_task(task),
        embedded_tokenizer="spaced",
        guidance=guidance if base_guidance is not None else None,
        criteria_library=library if base_library is not None else None,
        episodic=lambda task: is_tool_env(task.env_name),
        style=MixedStyle(),
        behaviours=mixed_behaviours(domain.behaviours, names) if domain.behaviours else None,
    )
