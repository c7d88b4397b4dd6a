"""RISED's programmatic tagger for tool-environment episodes, and the mixed-domain tagger.

The constraint domain's :class:`~rubric_rl.methods.rised.rised_tagger.ProgrammaticTagger` reads a
single answer; a tool environment's rollout is an episode (``Env.response()``: the transcript
with every tool call). :class:`ToolTagger` tags one from what a judge of that environment sees,
the transcript and the task's rubric, never the task's hidden fields beyond what its rule
checkers read (the reference result, as the verifier does):

- per rule criterion of the task's rubric (``envs/trajectory.score_rules``): a positive one met
  is ``<id>`` (positive), missed ``missed_<id>`` (negative); a negative one met (a pitfall such
  as ``write_attempted``) is ``<id>`` (negative), and not met nothing (an absence is no
  behaviour); a checker that fails tags nothing for that criterion;
- behaviours from the transcript: ``no_tool_call`` (answered without calling a tool),
  ``no_final_answer`` (the episode ended without an answer), ``tool_error`` (count: tool calls
  that returned an error);
- reward-informed (RISED E.4), as the constraint tagger: ``task_solved`` / ``task_failed``.

The outcome criteria (``answer_correct``, ``order_correct``) belong to the ``outcome`` skill,
which RISED counts in profiles but never shows as a teacher context or an anti-pattern.
:class:`MixedTagger` sends each rollout to the tagger of its task's kind (a tool environment's
or the constraint domain's). :func:`tool_catalogue` lists every rubric the tool tagger can emit
for some environments; :func:`tool_warmup` is the warm-up's rollouts (weak: imperfect replays
of the reference solutions and degenerate episodes; strong: the reference solutions). OURS (not
in the seed): all of it — the naming, the descriptions, the weak-policy stand-in.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

from rubric_rl.envs import tool_domain
from rubric_rl.envs.base import derive_seed, is_tool_env
from rubric_rl.envs.tool_envs import ENVS
from rubric_rl.envs.trajectory import score_rules, transcript_of
from rubric_rl.methods.rised.rised_tags import DetectingTagger, RolloutTagger, Tags
from rubric_rl.rubrics.types import Task
from rubric_rl.rubrics.vocabulary import RubricEntry, Vocabulary

__all__ = ["MixedTagger", "ToolTagger", "tool_catalogue", "tool_description", "tool_warmup"]

OUTCOME_SKILL = "outcome"  # the same skill name as RISED's (controllers/rised.py)
_OUTCOME_CRITERIA = ("answer_correct", "order_correct")
# Behaviour tags of episodes: id -> (skill, polarity, description).
_EPISODE_BEHAVIOURS: dict[str, tuple[str, str, str]] = {
    "no_tool_call": ("tool_use", "negative", "Answering without calling any tool."),
    "no_final_answer": (
        "tool_use",
        "negative",
        "Ending the episode without a final answer (running out of turns).",
    ),
    "tool_error": ("tool_use", "negative", "Making a tool call that returns an error."),
}
# The reward-informed tags (the constraint tagger's ids) stated for an episode.
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


def tool_catalogue(envs: Sequence[str]) -> dict[str, RubricEntry]:
    """Every rubric the tool tagger can emit for the environments ``envs``, by id (no
    environments set: the warm-up sets them). The generic description is the criterion's
    title; ``tool_description`` states it for one task."""
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


def tool_description(rubric_id: str, task: Task) -> str | None:
    """A rubric of the tool tagger stated for ``task``: a criterion's in the task rubric's own
    words ("Successfully queried every table the question needs: employees."), a behaviour or
    outcome tag's fixed text; None when the task's rubric lacks the criterion (an environment's
    anti-pattern taken from another task)."""
    if rubric_id in _EPISODE_BEHAVIOURS:
        return _EPISODE_BEHAVIOURS[rubric_id][2]
    if rubric_id in _OUTCOMES:
        return _OUTCOMES[rubric_id]
    missed = rubric_id.startswith("missed_")
    cid = rubric_id.removeprefix("missed_")
    c = next((c for c in task.rubric.criteria if c.id == cid), None)
    if c is None:
        return None
    text = c.text.rstrip(".")
    return f"Not done: {text[:1].lower()}{text[1:]}." if missed else f"{text}."


class ToolTagger(DetectingTagger):
    """Tags tool-environment episodes by code (module docstring); deterministic and free.
    ``vocab`` / ``discovery`` / ``solved_threshold`` / ``outcome_conditioned`` as
    ``ProgrammaticTagger``'s."""

    def __init__(
        self,
        vocab: Vocabulary | None = None,
        *,
        discovery: bool = False,
        solved_threshold: float | None = 0.5,
        outcome_conditioned: bool = True,
    ):
        if vocab is None and not discovery:
            raise ValueError("ToolTagger: a vocabulary is needed unless discovery=True")
        self.vocab = vocab
        self.discovery = bool(discovery)
        self.solved_threshold = None if solved_threshold is None else float(solved_threshold)
        self.outcome_conditioned = bool(outcome_conditioned)

    def detect(self, task: Task, response: str, reward: float | None) -> dict[str, int]:
        """Every name detected in the episode, with its count (ValueError: not a tool task's
        transcript)."""
        if not is_tool_env(task.env_name):
            raise ValueError(f"env_name {task.env_name!r} is not a tool environment")
        tr = transcript_of(response, task)
        weights = {c.id: c.weight for c in task.rubric.criteria}
        out: dict[str, int] = {}
        for cid, v in score_rules(task, response).items():
            if v.met is None:
                continue  # a checker that failed tags nothing
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
        if reward is not None and self.solved_threshold is not None:
            out["task_solved" if float(reward) >= self.solved_threshold else "task_failed"] = 1
        return out


class MixedTagger(RolloutTagger):
    """Each rollout to ``tool`` (a tool environment's task) or ``default`` (any other), in
    order; both see the same step and reliability seed."""

    def __init__(self, default: RolloutTagger, tool: RolloutTagger):
        self.default, self.tool = default, tool

    def _split(self, tasks, responses, rewards, call) -> list[Tags]:
        out: list[Tags | None] = [None] * len(tasks)
        for kind, tagger in ((True, self.tool), (False, self.default)):
            idx = [i for i, t in enumerate(tasks) if is_tool_env(t.env_name) is kind]
            if idx:
                got = call(
                    tagger,
                    [tasks[i] for i in idx],
                    [responses[i] for i in idx],
                    [rewards[i] for i in idx],
                )
                for i, tags in zip(idx, got, strict=True):
                    out[i] = tags
        return out  # type: ignore[return-value]

    def _tag_rollouts(self, tasks, responses, rewards, step) -> list[Tags]:
        return self._split(
            tasks, responses, rewards, lambda tg, t, r, w: tg.tag_batch(t, r, w, step=step)
        )

    def _retag_rollouts(self, tasks, responses, rewards, seed: int) -> list[Tags]:
        return self._split(
            tasks, responses, rewards, lambda tg, t, r, w: tg.retag_batch(t, r, w, seed=seed)
        )


def _episode(env_name: str, task: Task, turns: list[str]) -> str:
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
_MALFORMED_CALL = '<tool_call>\n{"name": "lookup", "arguments": {\n</tool_call>'
_WRITE_CALL = (
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
        return [_MALFORMED_CALL, *turns]
    if r < 1.0:
        return [_WRITE_CALL if env_name == "sql" else _MALFORMED_CALL, *turns]
    return turns


def tool_warmup(
    envs: Sequence[str], seed: int, n: int, weak_per_task: int = 2
) -> tuple[list[tuple[str, list[str]]], list[tuple[str, list[str]]]]:
    """The warm-up's (environment, names) rollouts over the first ``n`` training tasks of each
    environment: weak = ``weak_per_task`` weak-stand-in episodes per task, strong = the
    reference solution, each tagged in discovery mode with the verifier's reward."""
    tagger = ToolTagger(discovery=True)
    weak: list[tuple[str, list[str]]] = []
    strong: list[tuple[str, list[str]]] = []
    for env in envs:
        cls, verify = ENVS.get(env), tool_domain.VERIFIERS[env]
        for i, task in enumerate(cls.task_bank("train", n, seed)):
            rng = random.Random(derive_seed("rised-tool-warmup", env, seed, i))
            for _ in range(weak_per_task):
                text = _episode(env, task, _weak_turns(env, task, rng))
                weak.append((env, list(tagger.tag(task, text, float(verify(task, text))).counts)))
            ref = _episode(env, task, list(cls.reference_turns(task)))
            strong.append((env, list(tagger.tag(task, ref, float(verify(task, ref))).counts)))
    return weak, strong
