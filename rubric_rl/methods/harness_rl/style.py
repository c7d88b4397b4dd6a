"""How HarnessRL writes its guidance into a domain's prompts and reads surface features.

The guidance texts and how they are mounted come from the domain's ``Style`` (the Domain
contract's renderer family, ``Domain.style``): the embedded constraint domain writes guidance
exactly as its warm-start corpus does (``<criterion> … </criterion>`` blocks, "avoid : …" hints),
so mounted guidance is a prompt shape the policy has seen; the instruction-following domain
writes titled plain-English lists; any other domain gets the generic style. The criteria a rubric
operation may propose come from the domain's checker library (``Domain.criteria_library``; none:
rubric operations reweight and delete only, unless an LLM proposer is configured). Surface
features: the embedded domain's own praise / compliance forms and word count, else common
praise / compliance / refusal phrases.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping, Sequence

from rubric_rl.envs.base import GENERIC_STYLE, Style, SurfaceFeatures
from rubric_rl.rubrics.types import Criterion, Task


@dataclasses.dataclass(frozen=True)
class GuidanceStyle:
    # The task's prompt with fields (a field's value: a text, or several sharing one block).
    mount: Callable[[Task, Mapping[str, str | Sequence[str]]], list[dict]]
    hint: Callable[[str, float], str]
    reference: Callable[[str | None, str | None], str]
    critique: Callable[[Sequence[str]], str]
    features: Callable[[str], SurfaceFeatures]
    library: Callable[[Task], Sequence[Criterion]] | None = None


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


def guidance_style(
    style: Style,
    features: Callable[[str], SurfaceFeatures] = generic_features,
    library: Callable[[Task], Sequence[Criterion]] | None = None,
) -> GuidanceStyle:
    """HarnessRL's view of a domain's ``Style``: its field mounting and texts."""
    return GuidanceStyle(
        mount=style.mount,
        hint=style.hint,
        reference=style.reference,
        critique=style.critique,
        features=features,
        library=library,
    )


def generic_style() -> GuidanceStyle:
    """The generic style (``envs.base.Style``), generic surface features, no library."""
    return guidance_style(GENERIC_STYLE)


def style_for(domain) -> GuidanceStyle:
    """The domain's own style, checker library and surface features (``Domain.surface_features``;
    a domain without its own: common English praise / compliance / refusal phrases)."""
    return guidance_style(
        domain.style, domain.surface_features or generic_features, domain.criteria_library
    )


__all__ = ["GuidanceStyle", "generic_features", "generic_style", "guidance_style", "style_for"]
