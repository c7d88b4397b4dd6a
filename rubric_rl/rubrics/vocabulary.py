"""RISED's fixed rubric vocabulary (RISED §2.2, A.1; DESIGN.md §6): skills -> rubrics.

A rubric is a behaviour a rollout shows (``positive``) or should not show (``negative``), with a
description written as an instruction (the teacher context and the anti-patterns block use it;
tagging and selection use only the id). The vocabulary is the shared coordinate system of rubric
profiles: a tagger maps every name it emits onto an id here (:meth:`Vocabulary.lookup`: the
normalised name, then an alias), and a name that maps to no id is *discovered* (kept apart,
never added to the profile).

File format (``Vocabulary.save`` / ``Vocabulary.load``; JSON, version 1)::

    {"version": 1,
     "skills": {"<skill>": [{"id": "...", "polarity": "positive" | "negative",
                             "description": "...", "envs": ["<env>", ...]}, ...], ...},
     "aliases": {"<normalised alias>": "<id>", ...},
     "provenance": {...}}            # optional: how the file was built (e.g. a cache key)

An empty ``envs`` list means the rubric applies to every environment. Rubrics are kept grouped by
skill (skills in first-seen order), so a rubric's index is the same in memory and in the file.

:func:`build_vocabulary` is the seed's warm-up (A.1) in a programmatic form: names emitted in
discovery mode over weak-policy rollouts (failures) and stronger rollouts (successes) select
which entries of a fixed catalogue enter the vocabulary. OURS (not in the seed): the seed's
offline consolidation by an LLM of free-form names into rubrics is replaced by the catalogue (a
name outside it is dropped), ``min_count=1``, the order (by skill, then id) and an entry's
``envs`` being the environments where it was observed.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

__all__ = [
    "POLARITIES",
    "RubricEntry",
    "Vocabulary",
    "build_vocabulary",
    "normalise_name",
]

POLARITIES = ("positive", "negative")
FORMAT_VERSION = 1
_NON_ALNUM = re.compile(r"[^a-z0-9]+")
_ENTRY_KEYS = ("id", "polarity", "description", "envs")


def normalise_name(name: str) -> str:
    """Lower-case, strip, every run of non-alphanumeric characters -> "_", no "_" at the ends:
    ``"Repeated Item!"`` -> ``"repeated_item"``."""
    return _NON_ALNUM.sub("_", str(name).strip().lower()).strip("_")


@dataclasses.dataclass(frozen=True)
class RubricEntry:
    """One rubric: its id (a normalised name), skill, polarity, description and environments
    (empty = every environment)."""

    id: str
    skill: str
    polarity: str
    description: str
    envs: tuple[str, ...] = ()

    def __post_init__(self):
        if not isinstance(self.id, str) or not self.id or self.id != normalise_name(self.id):
            raise ValueError(
                f"RubricEntry.id must be a non-empty normalised name "
                f"(normalise_name(id) == id), got {self.id!r}"
            )
        if not isinstance(self.skill, str) or not self.skill.strip():
            raise ValueError(f"RubricEntry.skill of {self.id!r} must be a non-empty string")
        if self.polarity not in POLARITIES:
            raise ValueError(
                f"RubricEntry.polarity of {self.id!r} must be one of {POLARITIES}, "
                f"got {self.polarity!r}"
            )
        if not isinstance(self.description, str) or not self.description.strip():
            raise ValueError(f"RubricEntry.description of {self.id!r} must be a non-empty string")
        if isinstance(self.envs, str) or not all(isinstance(e, str) and e for e in self.envs):
            raise ValueError(
                f"RubricEntry.envs of {self.id!r} must be a sequence of environment names, "
                f"got {self.envs!r}"
            )
        object.__setattr__(self, "envs", tuple(self.envs))

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "polarity": self.polarity,
            "description": self.description,
            "envs": list(self.envs),
        }


@dataclasses.dataclass(frozen=True)
class Vocabulary:
    """The rubric vocabulary: rubrics grouped by skill, and aliases (normalised alias -> id)."""

    rubrics: tuple[RubricEntry, ...]
    aliases: Mapping[str, str] = dataclasses.field(default_factory=dict, hash=False)
    provenance: Mapping[str, Any] = dataclasses.field(
        default_factory=dict, hash=False, compare=False
    )

    def __post_init__(self):
        rubrics = tuple(self.rubrics)
        for n, r in enumerate(rubrics):
            if not isinstance(r, RubricEntry):
                raise TypeError(f"Vocabulary.rubrics[{n}] is {type(r).__name__}, not RubricEntry")
        seen: dict[str, int] = {}
        for n, r in enumerate(rubrics):
            if r.id in seen:
                raise ValueError(
                    f"Vocabulary: duplicate rubric id {r.id!r} (rubrics[{seen[r.id]}] and [{n}])"
                )
            seen[r.id] = n
        by_skill: dict[str, list[RubricEntry]] = {}
        for r in rubrics:
            by_skill.setdefault(r.skill, []).append(r)
        grouped = tuple(r for group in by_skill.values() for r in group)
        aliases: dict[str, str] = {}
        for alias, target in dict(self.aliases).items():
            key = normalise_name(alias)
            if not key or key in seen:
                raise ValueError(
                    f"Vocabulary.aliases: alias {alias!r} is empty or an id itself after "
                    f"normalisation ({key!r})"
                )
            if target not in seen:
                raise ValueError(f"Vocabulary.aliases: {alias!r} -> {target!r}, not a rubric id")
            if aliases.get(key, target) != target:
                raise ValueError(
                    f"Vocabulary.aliases: {key!r} maps to both {aliases[key]!r} and {target!r}"
                )
            aliases[key] = target
        object.__setattr__(self, "rubrics", grouped)
        object.__setattr__(self, "aliases", aliases)
        object.__setattr__(self, "provenance", dict(self.provenance))
        object.__setattr__(self, "_index", {r.id: i for i, r in enumerate(grouped)})

    # --- queries ---------------------------------------------------------------------------

    @property
    def ids(self) -> tuple[str, ...]:
        return tuple(r.id for r in self.rubrics)

    @property
    def skills(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(r.skill for r in self.rubrics))

    def __len__(self) -> int:
        return len(self.rubrics)

    def __contains__(self, rubric_id: object) -> bool:
        return rubric_id in self._index

    def index(self, rubric_id: str) -> int:
        try:
            return self._index[rubric_id]
        except KeyError:
            raise KeyError(f"rubric id {rubric_id!r} is not in the vocabulary") from None

    def entry(self, rubric_id: str) -> RubricEntry:
        return self.rubrics[self.index(rubric_id)]

    @property
    def positive_mask(self) -> np.ndarray:
        return np.array([r.polarity == "positive" for r in self.rubrics], dtype=bool)

    @property
    def negative_mask(self) -> np.ndarray:
        return np.array([r.polarity == "negative" for r in self.rubrics], dtype=bool)

    def lookup(self, name: str) -> str | None:
        """The id a name stands for (normalised: an id, else an alias), or None (discovered)."""
        key = normalise_name(name)
        if key in self._index:
            return key
        return self.aliases.get(key)

    def for_env(self, env: str | None) -> tuple[str, ...]:
        """Ids of the rubrics that apply to ``env`` (those without envs apply everywhere)."""
        return tuple(r.id for r in self.rubrics if not r.envs or env in r.envs)

    # --- files -----------------------------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        skills: dict[str, list[dict[str, Any]]] = {}
        for r in self.rubrics:
            skills.setdefault(r.skill, []).append(r.to_json())
        out: dict[str, Any] = {"version": FORMAT_VERSION, "skills": skills}
        out["aliases"] = dict(sorted(self.aliases.items()))
        if self.provenance:
            out["provenance"] = dict(self.provenance)
        return out

    def save(self, path: str | os.PathLike) -> None:
        """Writes the JSON file atomically (a temporary file renamed over ``path``)."""
        path = os.fspath(path)
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        tmp = f"{path}.tmp{os.getpid()}"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(self.to_json(), f, indent=1)
            f.write("\n")
        os.replace(tmp, path)

    @classmethod
    def load(cls, path: str | os.PathLike) -> Vocabulary:
        """Reads a file written by :meth:`save`; errors name the file, row and field."""
        path = os.fspath(path)
        try:
            with open(path, encoding="utf-8") as f:
                payload = json.load(f)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}: not valid JSON ({e.msg} at line {e.lineno})") from None
        return cls.from_json(payload, where=path)

    @classmethod
    def from_json(cls, payload: Any, *, where: str = "vocabulary") -> Vocabulary:
        if not isinstance(payload, Mapping):
            raise ValueError(f"{where}: expected a JSON object, got {type(payload).__name__}")
        if payload.get("version") != FORMAT_VERSION:
            raise ValueError(
                f"{where}: field 'version' must be {FORMAT_VERSION}, got {payload.get('version')!r}"
            )
        extra = sorted(set(payload) - {"version", "skills", "aliases", "provenance"})
        if extra:
            raise ValueError(f"{where}: unexpected top-level fields {extra}")
        skills = payload.get("skills")
        if not isinstance(skills, Mapping):
            raise ValueError(f"{where}: field 'skills' must be an object of skill -> list")
        rubrics: list[RubricEntry] = []
        first_row: dict[str, str] = {}
        for skill, rows in skills.items():
            if not isinstance(rows, list):
                raise ValueError(f"{where}: skills[{skill!r}] must be a list of rubrics")
            for n, row in enumerate(rows):
                rubric = _entry_from_row(row, skill, f"{where}: skills[{skill!r}][{n}]")
                if rubric.id in first_row:
                    raise ValueError(
                        f"{where}: skills[{skill!r}][{n}] field 'id': duplicate id "
                        f"{rubric.id!r} (first at {first_row[rubric.id]})"
                    )
                first_row[rubric.id] = f"skills[{skill!r}][{n}]"
                rubrics.append(rubric)
        aliases = payload.get("aliases", {})
        if not isinstance(aliases, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in aliases.items()
        ):
            raise ValueError(f"{where}: field 'aliases' must be an object of name -> id")
        provenance = payload.get("provenance", {})
        if not isinstance(provenance, Mapping):
            raise ValueError(f"{where}: field 'provenance' must be an object")
        try:
            return cls(tuple(rubrics), aliases=dict(aliases), provenance=dict(provenance))
        except ValueError as e:
            raise ValueError(f"{where}: {e}") from None


def _entry_from_row(row: Any, skill: str, where: str) -> RubricEntry:
    if not isinstance(row, Mapping):
        raise ValueError(f"{where}: expected an object with fields {list(_ENTRY_KEYS)}")
    extra = sorted(set(row) - set(_ENTRY_KEYS))
    if extra:
        raise ValueError(f"{where}: unexpected fields {extra}; expected {list(_ENTRY_KEYS)}")
    for field in ("id", "polarity", "description"):
        if field not in row:
            raise ValueError(f"{where} field {field!r}: missing")
    envs = row.get("envs", [])
    if not isinstance(envs, list):
        raise ValueError(f"{where} field 'envs': expected a list of environment names")
    try:
        return RubricEntry(
            id=row["id"],
            skill=skill,
            polarity=row["polarity"],
            description=row["description"],
            envs=tuple(envs),
        )
    except ValueError as e:
        field = next((f for f in (*_ENTRY_KEYS, "skill") if f"RubricEntry.{f} " in str(e)), "?")
        raise ValueError(f"{where} field {field!r}: {e}") from None


def build_vocabulary(
    weak: Sequence[tuple[str, Iterable[str]]],
    strong: Sequence[tuple[str, Iterable[str]]],
    catalogue: Mapping[str, RubricEntry],
    min_count: int = 1,
    *,
    aliases: Mapping[str, str] | None = None,
    provenance: Mapping[str, Any] | None = None,
) -> Vocabulary:
    """The warm-up (RISED A.1): keep the catalogue rubrics observed at least ``min_count`` times.

    ``weak`` / ``strong``: one ``(environment, names)`` pair per rollout, the names a tagger
    emitted in discovery mode on weak-policy rollouts (failure coverage) and on stronger
    rollouts (successes). A name counts once per occurrence (normalised, then matched to a
    catalogue id or an alias of one); names outside the catalogue are dropped. A kept entry's
    ``envs`` are the environments where it was observed (sorted). Order: by skill, then id.
    ``aliases`` whose target is kept are carried over.
    """
    if min_count < 1:
        raise ValueError(f"build_vocabulary: min_count must be >= 1, got {min_count}")
    by_id: dict[str, RubricEntry] = {}
    for key, entry in catalogue.items():
        if normalise_name(key) != entry.id:
            raise ValueError(f"build_vocabulary: catalogue key {key!r} is not its id {entry.id!r}")
        by_id[entry.id] = entry
    alias_map = {normalise_name(a): t for a, t in (aliases or {}).items()}
    counts: collections.Counter[str] = collections.Counter()
    envs: dict[str, set[str]] = collections.defaultdict(set)
    for side, rollouts in (("weak", weak), ("strong", strong)):
        for n, pair in enumerate(rollouts):
            if not (isinstance(pair, tuple | list) and len(pair) == 2):
                raise ValueError(f"build_vocabulary: {side}[{n}] must be (env, names)")
            env, names = pair
            for name in names:
                key = normalise_name(name)
                rid = key if key in by_id else alias_map.get(key)
                if rid in by_id:
                    counts[rid] += 1
                    envs[rid].add(str(env))
    kept = sorted(
        (rid for rid, c in counts.items() if c >= min_count),
        key=lambda rid: (by_id[rid].skill, rid),
    )
    rubrics = tuple(dataclasses.replace(by_id[rid], envs=tuple(sorted(envs[rid]))) for rid in kept)
    kept_ids = set(kept)
    return Vocabulary(
        rubrics,
        aliases={a: t for a, t in alias_map.items() if t in kept_ids and a not in kept_ids},
        provenance=dict(provenance or {}),
    )
