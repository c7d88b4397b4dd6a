"""Loaders for public rubric datasets and our own task format: one entry point, ``load_tasks``.

Formats (``format=``), each read as the public dataset publishes it:

* ``healthbench``: JSONL rows ``prompt`` [{role, content}], ``rubrics`` [{criterion, points,
  tags}] (negative points = pitfalls), ``prompt_id``, ``example_tags``, optional
  ``ideal_completions_data.ideal_completion`` (-> reference answer). Aggregation "healthbench".
* ``rar`` (Rubrics as Rewards): JSON/JSONL/parquet rows ``question``, ``reference_answer``,
  ``rubric`` [{title, description, weight}]; or ``rubric_list`` (strings "Essential Criteria: …"
  or "[5] …") when ``rubric`` is absent. ``weight`` is a number, or a category string mapped by
  ``RAR_CATEGORY_WEIGHTS`` (Essential 5, Important 4, Optional 1, Pitfall −1 — the RaR paper
  gives ranges 3–4 / 1–2 / −1–−2; we take the upper magnitude for Important, the lower for the
  others). The criterion text is ``description``; ``title`` is kept as the title.
* ``rubrichub`` (RubricHub / RuscaRL / verl parquet, also JSONL): ``prompt`` (messages or a
  string; ``messages`` accepted), ``data_source`` (-> domain), ``ability`` (-> task type),
  ``reward_model`` (a dict or its JSON string) with ``rubrics`` [{criterion, points, tags}] or
  ``ground_truth`` holding the rubric list as a JSON string. RuscaRL tags
  ``{"verifier": "rule", "function": f, "parameters": {...}}`` (or string tags ``verifier:rule``
  + ``function:f``) make the criterion ``Verifier.rule(f, **parameters)``.
* ``openrubrics``: ``instruction`` (or ``prompt``) and one ``rubric`` string of numbered items,
  each marked ``[Hard Rule]`` or ``[Principle]``. Hard rules get weight ``HARD_RULE_WEIGHT`` (3)
  and tag "hard_rule"; principles ``PRINCIPLE_WEIGHT`` (1) and tag "principle".
* ``jsonl``: our own format, a direct serialisation of Task (``dump_tasks`` writes it; loading
  what it wrote gives equal tasks).
* ``plain``: a task with no rubric, for reward functions (``rubric_rl/rubrics/reward_fns.py``):
JSON/JSONL/
  parquet rows with ``prompt`` (a string, one user message, or a list of {role, content}) and
  an optional ``id``; every other column is kept in ``Task.raw`` and given to reward functions
  as fields. The only format whose rubric may be empty. ``plain_tasks`` parses rows given in
  Python the same way.

Environments: every task carries ``env_name``, the environment its evaluation is reported under
(``eval/<split>/env/<env_name>/...``): the row's own category where the format has one, else the
format's name. plain: "plain". healthbench: the first ``theme:`` example tag (its seven themes, e.g.
"emergency_referrals"), else "healthbench". rar: ``question_source``, else "rar". rubrichub:
``data_source`` (as ``domain``), else "rubrichub". openrubrics: ``source`` / ``domain`` (as
``domain``), else "openrubrics". jsonl: the row's ``env_name``; when absent or null its
``domain``, else "jsonl" (so what ``dump_tasks`` writes loads back equal). None of these is a tool
environment unless it names one registered in ``envs.tool_envs`` (``is_tool_env``).

Ids: a task id is the row's own id (``prompt_id`` / ``id``) when it has one, else
``f"{format}-{sha1(row)[:12]}"`` (deterministic in the row's content, independent of order).
Criterion ids are ``f"{task_id}/c{i}"`` with i the 0-based position in the source rubric.
Weights keep the source's signed points. A duplicate task id within one load is an error.

Errors: a malformed row raises ``DatasetError`` naming the file, the 1-based row (line number for
JSONL) and the field, and what was expected. Zero weights are errors (λ ≠ 0), and so is a missing
one in every format; a rubric with no positive weight among its judged criteria (its reward
would be NaN for every response); and, when ``load_tasks`` is given the registered checker names
(the dataset domain does), a rule criterion naming an unknown checker. With ``lenient=True`` a
malformed row is skipped instead, counted in the ``LoadReport`` and logged. A file that cannot
be read (a non-UTF-8 byte: that line, skippable; a gzip file named ``.jsonl``, a truncated
``.gz`` or parquet file: the whole file) raises ``DatasetError`` naming the file and the row,
line or byte offset.
"""

from __future__ import annotations

import dataclasses
import difflib
import gzip
import hashlib
import json
import math
import os
import re
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

from absl import logging

from rubric_rl.rubrics.checkers import argument_problem
from rubric_rl.rubrics.dataset_files import DatasetError, iter_rows, resolve_files
from rubric_rl.rubrics.types import (
    Criterion,
    CriterionStatus,
    Message,
    Rubric,
    Task,
    Verifier,
    VerifierKind,
)
from rubric_rl.util.registry import Registry

RAR_CATEGORY_WEIGHTS = {"essential": 5.0, "important": 4.0, "optional": 1.0, "pitfall": -1.0}
HARD_RULE_WEIGHT = 3.0
PRINCIPLE_WEIGHT = 1.0


@dataclasses.dataclass(frozen=True)
class SkippedRow:
    file: str
    row: int
    field: str
    message: str


@dataclasses.dataclass
class LoadReport:
    """What a load read and (in lenient mode) skipped. Filled in by ``load_tasks``."""

    files: list[str] = dataclasses.field(default_factory=list)
    rows_read: int = 0
    tasks_loaded: int = 0
    skipped: list[SkippedRow] = dataclasses.field(default_factory=list)
    # task id -> (file, row) it was read from, so an error about a task can point at its row.
    locations: dict[str, tuple[str, int]] = dataclasses.field(default_factory=dict)

    @property
    def num_skipped(self) -> int:
        return len(self.skipped)


class _Row:
    """One source row plus its location, so every field error names file, row and field."""

    def __init__(
        self,
        file: str,
        number: int,
        data: Any,
        fmt: str,
        checkers: Collection[str] | None = None,
    ):
        self.file, self.number, self.data, self.fmt = file, number, data, fmt
        self.checkers = checkers

    def error(self, field: str, message: str) -> DatasetError:
        return DatasetError(self.file, self.number, field, message)

    def expect(self, field: str, value: Any, types: type | tuple[type, ...], what: str) -> Any:
        if isinstance(value, bool) and bool not in _as_tuple(types):
            raise self.error(field, f"expected {what}, got bool {value!r}")
        if not isinstance(value, types):
            raise self.error(field, f"expected {what}, got {type(value).__name__} {_short(value)}")
        return value

    def field(self, name: str, types, what: str, *, default: Any = ..., data: Any = None) -> Any:
        data = self.data if data is None else data
        if name not in data or data[name] is None:
            if default is ...:
                raise self.error(name, f"missing; expected {what}")
            return default
        return self.expect(name, data[name], types, what)

    def text(self, field: str, value: Any) -> str:
        self.expect(field, value, str, "a non-empty string")
        if not value.strip():
            raise self.error(field, "expected a non-empty string, got an empty one")
        return value

    def weight(self, field: str, value: Any) -> float:
        self.expect(field, value, (int, float), "a non-zero number")
        w = float(value)
        if w == 0.0 or not math.isfinite(w):
            raise self.error(field, f"expected a non-zero finite weight (λ ≠ 0), got {value!r}")
        return w

    def checker(self, field: str, name: str) -> str:
        """A rule criterion's checker name, which must be registered (when the load was given
        the registered names): a misspelt one would fail every verdict of that criterion."""
        if self.checkers is None or name in self.checkers:
            return name
        close = difflib.get_close_matches(name, list(self.checkers), n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise self.error(
            field,
            f"unknown checker {name!r}; {hint}registered checkers: {sorted(self.checkers)}",
        )

    def checker_args(self, field: str, name: str, args: Mapping[str, Any]) -> None:
        """A rule criterion's arguments against its checker's signature, when the load was given
        the checkers themselves (a registry, not only their names): missing, unexpected or
        wrongly typed arguments would fail every verdict of that criterion inside the judge."""
        get = getattr(self.checkers, "get", None)
        if get is None or name not in self.checkers:
            return
        problem = argument_problem(get(name), args)
        if problem is not None:
            raise self.error(field, f"checker {name!r}: {problem}")

    def rubric(self, field: str, criteria: Sequence[Criterion], aggregation: str) -> Rubric:
        """The row's rubric; one whose judged (active or hidden) criteria carry no positive
        weight is an error: its reward Σλs / Σmax(λ, 0) is undefined for every response."""
        try:
            rubric = Rubric(tuple(criteria), aggregation=aggregation)
        except ValueError as e:
            raise self.error(field, str(e)) from None
        if not any(c.weight > 0 for c in rubric.evaluated()):
            weights = [c.weight for c in rubric.evaluated()]
            raise self.error(
                field,
                f"no judged criterion has a positive weight (weights {weights}): the rubric "
                "reward Σλs / Σmax(λ, 0) would be undefined (NaN) for every response",
            )
        return rubric

    def messages(self, field: str, value: Any) -> tuple[Message, ...]:
        if isinstance(value, str):
            return (Message("user", self.text(field, value)),)
        self.expect(field, value, (list, tuple), "a list of {role, content} messages or a string")
        if not value:
            raise self.error(field, "expected at least one message, got an empty list")
        out = []
        for i, m in enumerate(value):
            self.expect(f"{field}[{i}]", m, dict, "a {role, content} message")
            role = self.field("role", str, "a string", data=m)
            content = self.field("content", str, "a string", data=m)
            try:
                out.append(Message(role, content))
            except ValueError as e:
                raise self.error(f"{field}[{i}].role", str(e)) from None
        return tuple(out)

    def list_of(self, field: str, value: Any, what: str) -> list:
        self.expect(field, value, (list, tuple), what)
        if not value:
            raise self.error(field, f"expected {what}, got an empty list")
        return list(value)

    def string_tags(self, field: str, value: Any) -> tuple[str, ...]:
        if value is None:
            return ()
        self.expect(field, value, (list, tuple), "a list of strings")
        for i, t in enumerate(value):
            self.expect(f"{field}[{i}]", t, str, "a string")
        return tuple(value)

    def content_id(self) -> str:
        blob = json.dumps(self.data, sort_keys=True, default=str, ensure_ascii=False)
        return f"{self.fmt}-{hashlib.sha1(blob.encode()).hexdigest()[:12]}"


def _as_tuple(types) -> tuple:
    return types if isinstance(types, tuple) else (types,)


def _short(value: Any, n: int = 60) -> str:
    s = repr(value)
    return s if len(s) <= n else s[: n - 3] + "..."


def _freeze_lists(value: Any) -> Any:
    """JSON lists -> tuples, recursively, so verifier args stay hashable (dicts are kept)."""
    if isinstance(value, list | tuple):
        return tuple(_freeze_lists(v) for v in value)
    if isinstance(value, dict):
        return {k: _freeze_lists(v) for k, v in value.items()}
    return value


def _maybe_json(row: _Row, field: str, value: Any, what: str) -> Any:
    if isinstance(value, str):
        try:
            return json.loads(value)
        except json.JSONDecodeError as e:
            raise row.error(field, f"expected {what} or its JSON string; bad JSON: {e}") from None
    return value


# --- formats ---------------------------------------------------------------------------------

_Parser = Callable[[_Row], Task]
FORMATS: Registry[_Parser] = Registry("dataset format")


def _criterion(task_id: str, i: int, **fields: Any) -> Criterion:
    return Criterion(id=f"{task_id}/c{i}", **fields)


def _env_name(category: Any, fmt: str) -> str:
    """The row's category when it has a non-empty one, else the format's name."""
    return category if isinstance(category, str) and category.strip() else fmt


@FORMATS.register("healthbench")
def _parse_healthbench(row: _Row) -> Task:
    task_id = row.text("prompt_id", row.field("prompt_id", str, "a string id"))
    prompt = row.messages("prompt", row.field("prompt", (list, str), "a list of messages"))
    rubrics = row.list_of("rubrics", row.field("rubrics", list, "a list"), "a list of criteria")
    criteria = []
    for i, item in enumerate(rubrics):
        f = f"rubrics[{i}]"
        row.expect(f, item, dict, "a {criterion, points, tags} object")
        text = row.text(f"{f}.criterion", item.get("criterion"))
        weight = row.weight(f"{f}.points", item.get("points"))
        tags = row.string_tags(f"{f}.tags", item.get("tags"))
        criteria.append(_criterion(task_id, i, text=text, weight=weight, tags=tags))
    example_tags = row.string_tags("example_tags", row.data.get("example_tags"))
    ideal = row.data.get("ideal_completions_data")
    reference = None
    if isinstance(ideal, dict) and isinstance(ideal.get("ideal_completion"), str):
        reference = ideal["ideal_completion"]
    themes = [t.split(":", 1)[1] for t in example_tags if t.startswith("theme:")]
    return Task(
        id=task_id,
        prompt=prompt,
        rubric=row.rubric("rubrics", criteria, "healthbench"),
        reference_answer=reference,
        domain="healthbench",
        task_type=themes[0] if themes else "",
        capabilities=example_tags,
        env_name=_env_name(themes[0] if themes else None, "healthbench"),
        raw=row.data,
    )


_RAR_PREFIX = re.compile(r"^\s*(essential|important|optional|pitfall)\s+criteri(?:a|on)\s*:", re.I)
_NUMBER_PREFIX = re.compile(r"^\s*\[\s*(-?\d+(?:\.\d+)?)\s*\]\s*")


def _rar_weight(row: _Row, field: str, value: Any) -> float:
    if isinstance(value, str):
        key = re.sub(r"\s+criteri(a|on)$", "", value.strip().lower())
        if key not in RAR_CATEGORY_WEIGHTS:
            raise row.error(
                field, f"expected a number or one of {sorted(RAR_CATEGORY_WEIGHTS)}, got {value!r}"
            )
        return RAR_CATEGORY_WEIGHTS[key]
    return row.weight(field, value)


@FORMATS.register("rar")
def _parse_rar(row: _Row) -> Task:
    question = row.text("question", row.field("question", str, "a string"))
    reference = row.field("reference_answer", str, "a string", default=None)
    task_id = str(row.data["id"]) if row.data.get("id") is not None else row.content_id()
    criteria = []
    rubric_field = "rubric"
    if row.data.get("rubric") is not None or "rubric_list" not in row.data:
        items = row.list_of("rubric", row.field("rubric", list, "a list"), "a list of criteria")
        for i, item in enumerate(items):
            f = f"rubric[{i}]"
            row.expect(f, item, dict, "a {title, description, weight} object")
            text = row.text(f"{f}.description", item.get("description"))
            title = item.get("title") or ""
            row.expect(f"{f}.title", title, str, "a string")
            weight = _rar_weight(row, f"{f}.weight", item.get("weight"))
            criteria.append(_criterion(task_id, i, text=text, title=title, weight=weight))
    else:
        rubric_field = "rubric_list"
        items = row.list_of("rubric_list", row.data["rubric_list"], "a list of strings")
        for i, item in enumerate(items):
            f = f"rubric_list[{i}]"
            text = row.text(f, item)
            if m := _NUMBER_PREFIX.match(text):
                weight, text = row.weight(f, float(m.group(1))), text[m.end() :]
            elif m := _RAR_PREFIX.match(text):
                weight = RAR_CATEGORY_WEIGHTS[m.group(1).lower()]
            else:
                raise row.error(f, "expected a '[weight] ' or '<Category> Criteria:' prefix")
            criteria.append(_criterion(task_id, i, text=text.strip(), weight=weight))
    source = row.data.get("question_source")
    return Task(
        id=task_id,
        prompt=(Message("user", question),),
        rubric=row.rubric(rubric_field, criteria, "weighted"),
        reference_answer=reference,
        domain="rar",
        task_type=source if isinstance(source, str) else "",
        env_name=_env_name(source, "rar"),
        raw=row.data,
    )


def _rubrichub_verifier(row: _Row, field: str, tags: Any) -> tuple[tuple[str, ...], Verifier]:
    """RuscaRL tags -> (string tags, verifier). Rule criteria need a function name."""
    if tags is None:
        return (), Verifier()
    if isinstance(tags, dict):
        kind = tags.get("verifier") or "llm"
        function = tags.get("function") or None
        params = _maybe_json(row, f"{field}.parameters", tags.get("parameters") or {}, "a dict")
        flat = tuple(
            f"{k}:{v}"
            for k, v in sorted(tags.items())
            if k != "parameters" and isinstance(v, str) and v
        )
    else:
        flat = row.string_tags(field, tags)
        kv = dict(t.split(":", 1) for t in flat if ":" in t)
        kind, function = kv.get("verifier", "llm"), kv.get("function") or None
        params = _maybe_json(row, f"{field}.parameters", kv.get("parameters") or {}, "a dict")
    if kind not in (VerifierKind.LLM, VerifierKind.RULE):
        raise row.error(f"{field}.verifier", f"expected 'llm' or 'rule', got {kind!r}")
    if kind == VerifierKind.LLM:
        return flat, Verifier()
    if not isinstance(function, str):
        raise row.error(f"{field}.function", "a 'verifier: rule' criterion needs a function name")
    row.expect(f"{field}.parameters", params, dict, "a dict of checker arguments")
    function = row.checker(f"{field}.function", function)
    row.checker_args(f"{field}.parameters", function, params)
    return flat, Verifier.rule(function, **_freeze_lists(params))


@FORMATS.register("rubrichub")
def _parse_rubrichub(row: _Row) -> Task:
    key = "messages" if "prompt" not in row.data and "messages" in row.data else "prompt"
    prompt = row.messages(key, row.field(key, (list, str), "a list of messages or a string"))
    reward_model = _maybe_json(
        row, "reward_model", row.field("reward_model", (dict, str), "a dict"), "a dict"
    )
    row.expect("reward_model", reward_model, dict, "a dict with 'rubrics'")
    field, rubrics = "reward_model.rubrics", reward_model.get("rubrics")
    if not rubrics and reward_model.get("ground_truth"):
        field = "reward_model.ground_truth"
        rubrics = _maybe_json(row, field, reward_model["ground_truth"], "a rubric list")
        if isinstance(rubrics, dict):
            rubrics = rubrics.get("rubrics")
    if rubrics is None:
        raise row.error("reward_model.rubrics", "missing; expected a list of criteria")
    rubrics = row.list_of(field, rubrics, "a list of {criterion, points} objects")
    task_id = str(row.data["id"]) if row.data.get("id") is not None else row.content_id()
    criteria = []
    for i, item in enumerate(rubrics):
        f = f"{field}[{i}]"
        row.expect(f, item, dict, "a {criterion, points, tags} object")
        text = row.text(f"{f}.criterion", item.get("criterion"))
        weight = row.weight(f"{f}.points", item.get("points"))
        tags, verifier = _rubrichub_verifier(row, f"{f}.tags", item.get("tags"))
        criteria.append(
            _criterion(task_id, i, text=text, weight=weight, tags=tags, verifier=verifier)
        )
    data_source = row.field("data_source", str, "a string", default="")
    ability = row.field("ability", str, "a string", default="")
    extra = row.field("extra_info", dict, "a dict", default={})
    reference = extra.get("reference_answer") if isinstance(extra, dict) else None
    return Task(
        id=task_id,
        prompt=prompt,
        rubric=row.rubric(field, criteria, "weighted"),
        reference_answer=reference if isinstance(reference, str) else None,
        domain=data_source,
        task_type=ability,
        env_name=_env_name(data_source, "rubrichub"),
        raw=row.data,
    )


_ITEM_START = re.compile(r"^\s*(\d+)\s*[.)]\s+")
_KIND = re.compile(r"\[\s*(hard\s*rule|principle)\s*\]\s*:?", re.I)


@FORMATS.register("openrubrics")
def _parse_openrubrics(row: _Row) -> Task:
    key = next((k for k in ("instruction", "prompt", "messages") if k in row.data), "instruction")
    prompt = row.messages(key, row.field(key, (str, list), "a string or a list of messages"))
    rubric_key = "rubric" if "rubric" in row.data else "rubrics"
    text = row.text(rubric_key, row.field(rubric_key, str, "a numbered rubric string"))
    items: list[list[str]] = []
    for line in text.splitlines():
        if _ITEM_START.match(line):
            items.append([_ITEM_START.sub("", line, count=1)])
        elif items and line.strip():
            items[-1].append(line.strip())  # continuation of a wrapped item
    if not items:
        raise row.error(rubric_key, "expected numbered items ('1. … [Hard Rule]'), found none")
    task_id = str(row.data["id"]) if row.data.get("id") is not None else row.content_id()
    criteria = []
    for i, parts in enumerate(items):
        item = " ".join(parts)
        kinds = _KIND.findall(item)
        if len(kinds) != 1:
            raise row.error(
                f"{rubric_key}[item {i + 1}]",
                f"expected exactly one [Hard Rule] or [Principle] marker, got {item!r}",
            )
        body = _KIND.sub("", item).strip(" :-")
        hard = kinds[0].lower().replace(" ", "") == "hardrule"
        criteria.append(
            _criterion(
                task_id,
                i,
                text=row.text(f"{rubric_key}[item {i + 1}]", body),
                weight=HARD_RULE_WEIGHT if hard else PRINCIPLE_WEIGHT,
                tags=("hard_rule",) if hard else ("principle",),
            )
        )
    source = row.data.get("source") or row.data.get("domain")
    return Task(
        id=task_id,
        prompt=prompt,
        rubric=row.rubric(rubric_key, criteria, "weighted"),
        domain=source if isinstance(source, str) else "openrubrics",
        env_name=_env_name(source, "openrubrics"),
        raw=row.data,
    )


# --- our own JSONL ---------------------------------------------------------------------------

_CRITERION_FIELDS = {f.name for f in dataclasses.fields(Criterion)}
_TASK_FIELDS = {f.name for f in dataclasses.fields(Task)} - {"raw"}
_CRITERION_TYPES = {
    "title": (str, "a string"),
    "origin": (str, "a string"),
    "created_step": (int, "an integer"),
    "parent_id": (str, "a string or null"),
    "skill": (str, "a string or null"),
    "capability": (str, "a string or null"),
    "anchor": (bool, "a boolean"),
}


def criterion_to_dict(c: Criterion) -> dict[str, Any]:
    d = {f: getattr(c, f) for f in sorted(_CRITERION_FIELDS)}
    d.update(
        status=c.status.value,
        tags=list(c.tags),
        choices=list(c.choices),
        verifier={
            "kind": c.verifier.kind.value,
            "checker": c.verifier.checker,
            "args": dict(c.verifier.args),
        },
    )
    return d


def task_to_dict(t: Task) -> dict[str, Any]:
    return {
        "id": t.id,
        "prompt": [m.to_dict() for m in t.prompt],
        "rubric": {
            "aggregation": t.rubric.aggregation,
            "criteria": [criterion_to_dict(c) for c in t.rubric],
        },
        "reference_answer": t.reference_answer,
        "domain": t.domain,
        "task_type": t.task_type,
        "capabilities": list(t.capabilities),
        "env_name": t.env_name,
    }


def dump_tasks(tasks: Sequence[Task], path: str) -> str:
    """Writes tasks as our JSONL format (gzip if ``path`` ends in .gz); returns ``path``."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "wt", encoding="utf-8") as f:
        for t in tasks:
            f.write(json.dumps(task_to_dict(t), ensure_ascii=False) + "\n")
    return path


def _parse_our_criterion(row: _Row, f: str, d: Any) -> Criterion:
    row.expect(f, d, dict, "a criterion object")
    unknown = sorted(set(d) - _CRITERION_FIELDS)
    if unknown:
        raise row.error(
            f"{f}.{unknown[0]}", f"unknown criterion field; known: {sorted(_CRITERION_FIELDS)}"
        )
    fields = dict(d)
    row.text(f"{f}.id", d.get("id"))
    row.text(f"{f}.text", d.get("text"))
    if d.get("weight") is None:  # as every public format: a criterion's weight is never implied
        raise row.error(f"{f}.weight", "missing; expected a non-zero number (λ ≠ 0)")
    fields["weight"] = row.weight(f"{f}.weight", d["weight"])
    for name in ("tags", "choices"):
        if name in d:
            fields[name] = row.string_tags(f"{f}.{name}", d[name])
    for name, (types, what) in _CRITERION_TYPES.items():
        if d.get(name) is not None:
            row.expect(f"{f}.{name}", d[name], types, what)
    if "status" in d and d["status"] not in {s.value for s in CriterionStatus}:
        raise row.error(f"{f}.status", f"expected one of {[s.value for s in CriterionStatus]}")
    v = d.get("verifier")
    if v is not None:
        row.expect(f"{f}.verifier", v, dict, "a {kind, checker, args} object")
        args = row.field("args", dict, "a dict", default={}, data=v)
        if v.get("kind") == VerifierKind.RULE and isinstance(v.get("checker"), str):
            row.checker(f"{f}.verifier.checker", v["checker"])
            row.checker_args(f"{f}.verifier.args", v["checker"], args)
        try:
            fields["verifier"] = Verifier(
                v.get("kind", "llm"), v.get("checker"), _freeze_lists(args)
            )
        except ValueError as e:
            raise row.error(f"{f}.verifier", str(e)) from None
    try:
        return Criterion(**fields)
    except (TypeError, ValueError) as e:
        raise row.error(f, str(e)) from None


@FORMATS.register("jsonl")
def _parse_jsonl(row: _Row) -> Task:
    unknown = sorted(set(row.data) - _TASK_FIELDS)
    if unknown:
        raise row.error(unknown[0], f"unknown task field; known: {sorted(_TASK_FIELDS)}")
    task_id = row.text("id", row.data.get("id"))
    prompt = row.messages("prompt", row.field("prompt", list, "a list of messages"))
    rubric = row.field("rubric", dict, "a {aggregation, criteria} object")
    aggregation = row.field("aggregation", str, "a string", default="weighted", data=rubric)
    items = row.field("criteria", list, "a list", data=rubric)
    criteria = [_parse_our_criterion(row, f"rubric.criteria[{i}]", d) for i, d in enumerate(items)]
    rub = row.rubric("rubric.criteria", criteria, aggregation)
    domain = row.field("domain", str, "a string", default="")
    env_name = row.field("env_name", str, "a string", default=None)
    return Task(
        id=task_id,
        prompt=prompt,
        rubric=rub,
        reference_answer=row.field("reference_answer", str, "a string", default=None),
        domain=domain,
        task_type=row.field("task_type", str, "a string", default=""),
        capabilities=row.string_tags("capabilities", row.data.get("capabilities")),
        env_name=_env_name(env_name or domain, "jsonl"),
        raw=row.data,
    )


# --- plain: no rubric ------------------------------------------------------------------------


@FORMATS.register("plain")
def _parse_plain(row: _Row) -> Task:
    prompt = row.messages(
        "prompt", row.field("prompt", (str, list), "a string or a list of {role, content} messages")
    )
    task_id = row.content_id()
    if row.data.get("id") is not None:
        value = row.expect("id", row.data["id"], (str, int), "a string or integer id")
        task_id = row.text("id", value) if isinstance(value, str) else str(value)
    return Task(id=task_id, prompt=prompt, rubric=Rubric(()), env_name="plain", raw=row.data)


def plain_tasks(rows: Sequence[Any], source: str = "<rows>") -> list[Task]:
    """Tasks from rows given in Python (dicts as the ``plain`` format's rows; a ``Task`` is kept
    as it is): errors name ``source``, the 1-based row and the field, as ``load_tasks`` does. A
    duplicate id is an error."""
    if isinstance(rows, str | bytes | dict):
        what = f"expected a list of rows, got {type(rows).__name__}"
        raise DatasetError(source, None, "<rows>", what)
    tasks, seen = [], {}
    for number, data in enumerate(rows, start=1):
        row = _Row(source, number, data, "plain")
        if isinstance(data, Task):
            task = data
        elif isinstance(data, dict):
            task = _parse_plain(row)
        else:
            raise row.error("<row>", f"expected a dict (or a Task), got {type(data).__name__}")
        if task.id in seen:
            raise row.error("id", f"duplicate task id {task.id!r} (first at row {seen[task.id]})")
        seen[task.id] = number
        tasks.append(task)
    return tasks


# --- entry point -----------------------------------------------------------------------------


def load_tasks(
    path: str | os.PathLike,
    format: str,
    *,
    lenient: bool = False,
    split: str | Sequence[str] | None = None,
    limit: int | None = None,
    report: LoadReport | None = None,
    checkers: Collection[str] | None = None,
) -> list[Task]:
    """Loads tasks from a file, or from every data file under a directory (optionally a split).

    Args:
      path: a .jsonl / .jsonl.gz / .json / .parquet file, or a directory of them.
      format: one of ``FORMATS`` (healthbench, rar, rubrichub, openrubrics, jsonl, plain).
      lenient: skip malformed rows (counted in ``report`` and logged) instead of raising.
      split: with a directory, only files whose path inside it has this word, or one of these
        words (e.g. "train": train.jsonl, train-00000-of-00002.parquet, train/part0.jsonl).
      limit: stop after this many tasks.
      report: filled with counts, skipped rows and each task's location if given.
      checkers: the registered checker names; a rule criterion naming another is a malformed
        row (None: not checked, e.g. to inspect a dataset whose checkers live elsewhere). The
        registry itself (``checkers.load_builtin_checkers()``) also checks each rule
        criterion's arguments against its checker's signature.

    Raises:
      DatasetError: a malformed row (strict mode), naming file, row and field; or a file that
        cannot be read (not UTF-8, compressed under another name, truncated), naming the file
        and the row or line where reading failed.
    """
    parse = FORMATS.get(format)
    if limit is not None and limit < 0:
        raise ValueError(f"limit must be >= 0, got {limit}")
    report = report if report is not None else LoadReport()
    tasks: list[Task] = []
    seen: dict[str, tuple[str, int]] = {}
    for file in resolve_files(os.fspath(path), split):
        if limit is not None and len(tasks) >= limit:
            break
        report.files.append(file)
        for number, data in iter_rows(file):
            if limit is not None and len(tasks) >= limit:
                break
            report.rows_read += 1
            try:
                if isinstance(data, DatasetError):
                    raise data
                row = _Row(file, number, data, format, checkers)
                if not isinstance(data, dict):
                    raise row.error("<row>", f"expected a JSON object, got {type(data).__name__}")
                task = parse(row)
                if task.id in seen:
                    prev = "{}:{}".format(*seen[task.id])
                    raise row.error("id", f"duplicate task id {task.id!r} (first at {prev})")
            except DatasetError as e:
                if not lenient:
                    raise
                report.skipped.append(SkippedRow(e.file, e.row or 0, e.field, e.message))
                logging.warning("skipped %s:%s field %r: %s", e.file, e.row, e.field, e.message)
                continue
            seen[task.id] = (file, number)
            tasks.append(task)
    report.tasks_loaded = len(tasks)
    report.locations.update(seen)
    if report.skipped:
        logging.warning("%s: skipped %d malformed rows", path, report.num_skipped)
    return tasks


def load_tasks_with_report(
    path: str | os.PathLike, format: str, **kwargs: Any
) -> tuple[list[Task], LoadReport]:
    report = LoadReport()
    return load_tasks(path, format, report=report, **kwargs), report
