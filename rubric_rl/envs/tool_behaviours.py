"""The behaviours of tool-environment episodes, read by code (``Behaviours``), and those of the
embedded constraint domain with tool environments mixed in.

A tool environment's rollout is an episode (``Env.response()``: the transcript with every tool
call). :func:`detect` reads one as a judge of that environment sees it, the transcript and the
task's rubric, never the task's hidden fields beyond what its rule checkers read (the reference
result, as the verifier does):

- per rule criterion of the task's rubric (``trajectory.score_rules``): a positive one met is
  ``<id>`` (positive), missed ``missed_<id>`` (negative); a negative one met (a pitfall such as
  ``write_attempted``) is ``<id>`` (negative), and not met nothing (an absence is no behaviour);
  a checker that fails gives nothing for that criterion;
- from the transcript: ``no_tool_call`` (answered without calling a tool), ``no_final_answer``
  (the episode ended without an answer), ``tool_error`` (count: tool calls that returned an
  error).

The outcome criteria (``answer_correct``, ``order_correct``) belong to the ``outcome`` skill
(what the task asked, not a behaviour). :func:`catalogue` lists every name for some
environments; :func:`warmup` is a warm-up's rollouts (weak: imperfect replays of the reference
solutions and degenerate episodes; strong: the reference solutions); :func:`describe` states a
name for one task. :func:`mixed_behaviours` sends each task to the tool environments' or the
base domain's. OURS (not in RISED's seed): all of it — the naming, the descriptions, the
weak-policy stand-in.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

from rubric_rl.envs import tool_domain
from rubric_rl.envs.base import Behaviours, WarmupRollout, derive_seed, is_tool_env
from rubric_rl.envs.tool_envs import ENVS
from rubric_rl.envs.trajectory import score_rules, transcript_of
from rubric_rl.rubrics.types import Task
from rubric_rl.rubrics.vocabulary import RubricEntry

__all__ = [
    "MALFORMED_CALL",
    "WRITE_CALL",
    "catalogue",
    "describe",
    "detect",
    "episode",
    "mixed_behaviours",
    "tool_behaviours",
    "warmup",
]

OUTCOME_SKILL = "outcome"  # what the task asked for, not a behaviour
_OUTCOME_CRITERIA = ("answer_correct", "order_correct")
# Behaviours of episodes: id -> (skill, polarity, description).
_EPISODE_BEHAVIOURS: dict[str, tuple[str, str, str]] = {
    "no_tool_call": ("tool_use", "negative", "Answering without calling any tool."),
    "no_final_answer": (
        "tool_use",
        "negative",
        "Ending the episode without a final answer (running out of turns).",
    ),
    "tool_error": ("tool_use", "negative", "Making a tool call that returns an error."),
}
# A rollout tagger's outcome names (task_solved / task_failed) stated for an episode.
_OUTCOMES = {
    "task_solved": "Reach the right final answer and leave the world as the task asks.",
    "task_failed": "Ending with a wrong answer or a wrong change to the world.",
}
# Task banks read for the catalogue: enough tasks of each split that every task type (3-4 per
# environment, the OOD split's included) appears with its criteria.
_CATALOGUE_TASKS = 32


def _skill(criterion: Any, env: str) -> str:
    if criterion.id in _OUTCOME_CRITERIA:
        return OUTCOME_SKILL
    return criterion.capability or env


def catalogue(envs: Sequence[str]) -> dict[str, RubricEntry]:
    """Every name :func:`detect` can give for the environments ``envs``, by id (no environments
    set: a warm-up sets them). The generic description is the criterion's title;
    :func:`describe` states it for one task."""
    out: dict[str, RubricEntry] = {}
    for env in envs:
        cls = ENVS.get(env)
        for split in ("train", "ood"):
            for task in cls.task_bank(split, _CATALOGUE_TASKS, 0):
                for c in task.rubric.criteria:
                    if c.verifier.kind != "rule" or c.id in out:
                        continue
                    title = (c.title or c.id).rstrip(".")
                    skill = _skill(c, env)
                    if c.weight > 0:
                        out[c.id] = RubricEntry(c.id, skill, "positive", f"{title}.")
                        out[f"missed_{c.id}"] = RubricEntry(
                            f"missed_{c.id}", skill, "negative", f"Not done: {title.lower()}."
                        )
                    else:
                        out[c.id] = RubricEntry(c.id, skill, "negative", f"{title}.")
    for rid, (skill, polarity, text) in _EPISODE_BEHAVIOURS.items():
        out[rid] = RubricEntry(rid, skill, polarity, text)
    return out


def describe(name: str, task: Task) -> str | None:
    """A name stated for ``task``: a criterion's in the task rubric's own words ("Successfully
    queried every table the question needs: employees."), an episode behaviour's or an outcome
    name's fixed text; None when the task's rubric lacks the criterion (an environment's
    anti-pattern taken from another task)."""
    if name in _EPISODE_BEHAVIOURS:
        return _EPISODE_BEHAVIOURS[name][2]
    if name in _OUTCOMES:
        return _OUTCOMES[name]
    missed = name.startswith("missed_")
    cid = name.removeprefix("missed_")
    c = next((c for c in task.rubric.criteria if c.id == cid), None)
    if c is None:
        return None
    text = c.text.rstrip(".")
    return f"Not done: {text[:1].lower()}{text[1:]}." if missed else f"{text}."


def detect(task: Task, response: str) -> dict[str, int]:
    """Every behaviour the episode shows, with its count (module docstring; ValueError: not a
    tool task's transcript)."""
    if not is_tool_env(task.env_name):
        raise ValueError(f"env_name {task.env_name!r} is not a tool environment")
    tr = transcript_of(response, task)
    weights = {c.id: c.weight for c in task.rubric.criteria}
    out: dict[str, int] = {}
    for cid, v in score_rules(task, response).items():
        if v.met is None:
            continue  # a checker that failed gives nothing
        if weights[cid] > 0:
            out[cid if v.met else f"missed_{cid}"] = 1
        elif v.met:
            out[cid] = 1
    if not tr.tool_calls and tr.status == "answered":
        out["no_tool_call"] = 1
    if tr.status != "answered":
        out["no_final_answer"] = 1
    errors = sum(not r.ok for r in tr.tool_calls)
    if errors:
        out["tool_error"] = errors
    return out


def episode(env_name: str, task: Task, turns: list[str]) -> str:
    """The transcript of replaying ``turns`` on ``task`` (what a rollout's response holds)."""
    env = ENVS.get(env_name)()
    try:
        for _ in tool_domain.replay(env, task, turns):
            pass
        return env.response()
    finally:
        env.close()


# The weak-policy stand-in for episodes (ours): the reference turns with each step the system
# prompt asks for kept with probability _WEAK_P_KEEP (tool_domain's imperfect demonstrations);
# a share _WEAK_DEGENERATE of the episodes degenerate, in equal parts: an answer without any tool
# call, tool calls that never reach an answer, a malformed tool call first, and (SQL) a write
# statement first.
_WEAK_P_KEEP = 0.4
_WEAK_DEGENERATE = 0.3
MALFORMED_CALL = '<tool_call>\n{"name": "lookup", "arguments": {\n</tool_call>'
WRITE_CALL = (
    '<tool_call>\n{"name": "sql", "arguments": {"query": "CREATE TABLE t (x INTEGER)"}}'
    "\n</tool_call>"
)


def _weak_turns(env_name: str, task: Task, rng: random.Random) -> list[str]:
    turns = tool_domain._imperfect_turns(env_name, task, rng, _WEAK_P_KEEP)
    r = rng.random() / _WEAK_DEGENERATE
    if r < 0.25:
        return [turns[-1]]  # answers at once, no tool call
    if r < 0.5:
        return turns[:-1] or turns  # never answers
    if r < 0.75:
        return [MALFORMED_CALL, *turns]
    if r < 1.0:
        return [WRITE_CALL if env_name == "sql" else MALFORMED_CALL, *turns]
    return turns


def warmup(
    envs: Sequence[str], seed: int, n: int, weak_per_task: int = 2
) -> tuple[list[WarmupRollout], list[WarmupRollout]]:
    """(weak, strong) rollouts over the first ``n`` training tasks of each environment:
    ``weak_per_task`` weak-stand-in episodes per task, then the reference solution, each with
    the environment's verifier's reward."""
    weak: list[WarmupRollout] = []
    strong: list[WarmupRollout] = []
    for env in envs:
        cls, verify = ENVS.get(env), tool_domain.VERIFIERS[env]
        for i, task in enumerate(cls.task_bank("train", n, seed)):
            rng = random.Random(derive_seed("rised-tool-warmup", env, seed, i))
            for _ in range(weak_per_task):
                text = episode(env, task, _weak_turns(env, task, rng))
                weak.append((env, task, text, float(verify(task, text))))
            ref = episode(env, task, list(cls.reference_turns(task)))
            strong.append((env, task, ref, float(verify(task, ref))))
    return weak, strong


def tool_behaviours(envs: Sequence[str]) -> Behaviours:
    """The ``Behaviours`` of the tool environments ``envs`` (a tool domain's: one name)."""
    envs = tuple(envs)
    return Behaviours(
        name="+".join(envs),
        detect=detect,
        catalogue=lambda: catalogue(envs),
        warmup=lambda seed, n, weak_per_task: warmup(envs, seed, n, weak_per_task),
        describe=describe,
    )


def mixed_behaviours(base: Behaviours, envs: Sequence[str]) -> Behaviours:
    """``base`` (the constraint domain's) with the tool environments ``envs`` mixed in: a tool
    environment's task to :func:`detect` / :func:`describe`, any other to ``base``; the
    catalogue and the warm-up are both parts' (the base's first)."""
    envs = tuple(envs)
    base_describe = base.describe

    def detect_mixed(task: Task, response: str) -> dict[str, int]:
        return detect(task, response) if is_tool_env(task.env_name) else base.detect(task, response)

    def describe_mixed(name: str, task: Task) -> str | None:
        if is_tool_env(task.env_name):
            return describe(name, task)
        return None if base_describe is None else base_describe(name, task)

    def warmup_mixed(seed: int, n: int, weak_per_task: int):
        weak, strong = base.warmup(seed, n, weak_per_task) if base.warmup else ([], [])
        tool_weak, tool_strong = warmup(envs, seed, n, weak_per_task)
        return weak + tool_weak, strong + tool_strong

    return Behaviours(
        name="+".join((base.name, *envs)),
        detect=detect_mixed,
        catalogue=lambda: {**base.catalogue(), **catalogue(envs)},
        aliases=base.aliases,
        warmup=warmup_mixed,
        describe=describe_mixed,
    )
