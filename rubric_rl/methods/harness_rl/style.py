"""How a domain writes HarnessRL's guidance, reads surface features, and proposes criteria.

The embedded constraint domain writes guidance exactly as its warm-start corpus does
(``constraint_corpus``: ``<criterion> … </criterion>`` blocks appended to the last user message,
``guidance_hint``, ``format_reference``, ``format_critique``), so mounted guidance is a prompt
shape the policy has seen; its checker library proposes rule criteria from the prompt text. Any
other domain gets the generic style: the same blocks, plain-English texts, and surface features
read from common praise / compliance / refusal phrases; no library (rubric operations then
reweight and delete only, unless an LLM proposer is configured).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping, Sequence

from rubric_rl.envs.base import SurfaceFeatures
from rubric_rl.rubrics.types import Criterion, Task, append_to_last_user


@dataclasses.dataclass(frozen=True)
class GuidanceStyle:
    # The task's prompt with fields (a field's value: a text, or several sharing one block).
    mount: Callable[[Task, Mapping[str, str | Sequence[str]]], list[dict]]
    hint: Callable[[str, float], str]
    reference: Callable[[str | None, str | None], str]
    critique: Callable[[Sequence[str]], str]
    features: Callable[[str], SurfaceFeatures]
    library: Callable[[Task], Sequence[Criterion]] | None = None


def embedded_style(
    library: Callable[[Task], Sequence[Criterion]] | None,
    features: Callable[[str], SurfaceFeatures] | None = None,
) -> GuidanceStyle:
    from rubric_rl.envs.constraint_corpus import decorate_prompt, format_critique, format_reference
    from rubric_rl.envs.constraint_spec import guidance_hint

    return GuidanceStyle(
        mount=lambda task, fields: decorate_prompt(task, dict(fields)),
        hint=guidance_hint,
        reference=format_reference,
        critique=format_critique,
        features=features or generic_features,
        library=library,
    )


_FLUFF = re.compile(
    r"^\s*(great|excellent|what a (great|good)) question|all (the )?requirements (are|were) met|"
    r"i hope this helps",
    re.I,
)
_STANCE = re.compile(r"\b(i cannot|i can't|as an ai|i'm not able to)\b", re.I)


def generic_features(response: str) -> SurfaceFeatures:
    return SurfaceFeatures(
        fluff=bool(_FLUFF.search(response)),
        length=len(response.split()),
        stance=bool(_STANCE.search(response)),
    )


def _generic_mount(task: Task, fields: Mapping[str, str]) -> list[dict]:
    from rubric_rl.methods.harness_rl.interfaces import ordered_fields

    def text(v) -> str:  # several texts (RuscaRL's shown criteria) share one block
        return v if isinstance(v, str) else " ; ".join(x for x in v if x.strip())

    blocks = [f"<{f}> {text(fields[f])} </{f}>" for f in ordered_fields(fields)
              if text(fields[f]).strip()]  # fmt: skip
    if not blocks:
        return task.messages
    return append_to_last_user(task.messages, "\n".join(blocks), what=f"task {task.id!r}")


def generic_style() -> GuidanceStyle:
    def reference(good: str | None, bad: str | None) -> str:
        parts = ([f"A good response: {good}"] if good else []) + (
            [f"A poor response: {bad}"] if bad else []
        )
        return "\n".join(parts)

    return GuidanceStyle(
        mount=_generic_mount,
        hint=lambda text, weight: text if weight > 0 else f"Avoid: {text}",
        reference=reference,
        critique=lambda missed: "The previous answers missed: " + "; ".join(missed),
        features=generic_features,
    )


def instruct_style(library: Callable[[Task], Sequence[Criterion]] | None) -> GuidanceStyle:
    """The English instruction-following domain's: titled plain-English lists
    (``envs/instruct_guidance.py``), for a pretrained chat policy."""
    from rubric_rl.envs import instruct_guidance as ig

    return GuidanceStyle(
        mount=ig.mount,
        hint=ig.hint,
        reference=ig.format_reference,
        critique=ig.format_critique,
        features=generic_features,
        library=library,
    )


def style_for(domain) -> GuidanceStyle:
    """The embedded domain's style for ``constraints``, the English one for ``instruct``, else
    the generic one."""
    name = getattr(domain, "name", "")
    if name == "constraints":
        return embedded_style(domain.criteria_library, domain.surface_features)
    if name == "instruct":
        return instruct_style(domain.criteria_library)
    return generic_style()


__all__ = [
    "GuidanceStyle",
    "embedded_style",
    "generic_features",
    "generic_style",
    "instruct_style",
    "style_for",
]
