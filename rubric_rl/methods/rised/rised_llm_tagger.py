"""RISED's LLM tagger: one judge call per rollout, with a retry path (RISED §2.2, A.3-A.4).

The primary call shows the judge the whole vocabulary (names and polarity, grouped by skill),
the task, the response and its reward (reward-informed tagging, RISED E.4) and asks for
``{"tags": [{"name": ..., "count": ...}]}``. Returned names are normalised and mapped to ids
(:meth:`Vocabulary.lookup`); a name that maps to none is kept as *discovered*. When the primary
call fails (client error) or its reply is invalid, one retry shows a SHORTER candidate list: the
``retry_candidates`` most frequent ids so far (ties by vocabulary index), refreshed every
``refresh_every`` steps (:meth:`LLMTagger.refresh`). If the retry fails too, the rollout is a
failed tagging (``Tags.failed``), never an empty one. OURS (not in the seed): the prompt wording,
``retry_candidates=20``, the candidate list before the first refresh (the first ids of the
vocabulary), and a reply being invalid as a whole when any tag in it is malformed.

``outcome_threshold`` (default 0.5, ours): the prompt asks for positives from successes and
negatives from failures; tags the judge gives against that (a failure's positive, a success's
negative) are kept aside (``Tags.withheld``: in no profile) rather than attributed, so SD and
selection see outcome-conditioned tags whatever the judge does. None: the judge's tags as given.
"""

from __future__ import annotations

import asyncio
import collections
import json
import logging
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from rubric_rl.methods.arise.reflection_llm import ReflectionTemplate
from rubric_rl.methods.rised.rised_tags import (
    RolloutTagger,
    Tags,
    condition_on_outcome,
    profile,
)
from rubric_rl.rubrics.llm import (
    FailureRateStop,
    LLMClient,
    LLMError,
    LLMRequest,
    run_sync,
    strip_json_fence,
)
from rubric_rl.rubrics.prompts import FENCE_RULE, fence
from rubric_rl.rubrics.types import Message, Task
from rubric_rl.rubrics.vocabulary import Vocabulary, normalise_name

__all__ = ["TAG_SCHEMA", "TAG_TEMPLATE", "LLMTagger", "parse_tags"]

logger = logging.getLogger(__name__)

_TAG_SYSTEM_V1 = """\
You tag one rollout of an AI agent with rubrics: named behaviours from a fixed vocabulary, each \
positive (a desired behaviour the rollout shows) or negative (an undesired behaviour it shows). \
You see the task, the agent's response and the reward it received.
- A success (high reward): trace the response back to the behaviours that made it succeed and \
tag those positive rubrics.
- A failure (low reward): find the errors, count how often each occurs, and tag those negative \
rubrics, most important first.
- A partial success: tag both the behaviours shown and the rubrics violated.
Use the vocabulary's names exactly. Only when no listed name fits a clearly visible behaviour, \
give a short new snake_case name. "count" is how many times the behaviour occurs (at least 1).
Reply with JSON only, exactly: {"tags": [{"name": "...", "count": 1}]}
An empty list is a valid answer when no rubric applies."""

_TAG_USER_V1 = """\
## Rubric vocabulary
{vocabulary}
## Task (environment: {env})
{task}
## Response
{response}
## Reward
{reward}

Return the JSON object now."""

# v2: the response fenced (``fence``) and the rule in the instructions.
TAG_TEMPLATE = ReflectionTemplate(
    "rised_tag", 2, _TAG_SYSTEM_V1 + "\n" + FENCE_RULE.format(label="response"), _TAG_USER_V1
)
TAG_SCHEMA = {
    "type": "object",
    "properties": {
        "tags": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "name": {"type": "string"},
                    "count": {"type": "integer", "minimum": 1},
                },
                "required": ["name", "count"],
                "additionalProperties": False,
            },
        }
    },
    "required": ["tags"],
    "additionalProperties": False,
}


def parse_tags(text: str, vocab: Vocabulary) -> tuple[Tags | None, str | None]:
    """(tags, None) for a valid reply, or (None, error): any malformed tag invalidates the whole
    reply. Names are normalised and mapped through the vocabulary; repeated names add up."""
    try:
        payload = json.loads(strip_json_fence(text))
    except json.JSONDecodeError as e:
        return None, f"reply is not valid JSON ({e.msg} at char {e.pos}): {text[:120]!r}"
    if not isinstance(payload, Mapping) or not isinstance(payload.get("tags"), list):
        return None, f"reply must be an object with a 'tags' list, got {text[:120]!r}"
    counts: collections.Counter[str] = collections.Counter()
    discovered: collections.Counter[str] = collections.Counter()
    for n, tag in enumerate(payload["tags"]):
        if not isinstance(tag, Mapping) or not isinstance(tag.get("name"), str):
            return None, f"tags[{n}] must be an object with a string 'name', got {tag!r}"
        count = tag.get("count", 1)
        if isinstance(count, float) and count.is_integer():
            count = int(count)
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            return None, f"tags[{n}].count must be an integer >= 1, got {count!r}"
        key = normalise_name(tag["name"])
        if not key:
            return None, f"tags[{n}].name {tag['name']!r} is empty after normalisation"
        rid = vocab.lookup(key)
        if rid is None:
            discovered[key] += count
        else:
            counts[rid] += count
    return Tags(dict(counts), dict(discovered)), None


def _vocabulary_lines(vocab: Vocabulary, ids: Sequence[str]) -> str:
    wanted = set(ids)
    lines: list[str] = []
    for skill in vocab.skills:
        rows = [r for r in vocab.rubrics if r.skill == skill and r.id in wanted]
        if rows:
            lines.append(f"### {skill}")
            lines += [f"- {r.id} ({r.polarity})" for r in rows]
    return "\n".join(lines)


class LLMTagger(RolloutTagger):
    """Tags rollouts with an LLM judge through ``LLMClient`` (module docstring).

    ``tag_batch`` sends one call per rollout, concurrently (up to the client's concurrency);
    ``stats()`` counts calls, retries, failed taggings and the share of discovered names.
    """

    def __init__(
        self,
        client: LLMClient,
        vocab: Vocabulary,
        *,
        retry_candidates: int = 20,
        refresh_every: int = 10,
        temperature: float = 0.0,
        max_tokens: int = 512,
        max_chars: int = 4000,
        max_failure_rate: float = 0.5,
        outcome_threshold: float | None = 0.5,
    ):
        if retry_candidates < 1 or refresh_every < 1:
            raise ValueError(
                f"LLMTagger: retry_candidates ({retry_candidates}) and refresh_every "
                f"({refresh_every}) must be >= 1"
            )
        self.client = client
        self.vocab = vocab
        self.retry_candidates = int(retry_candidates)
        self.refresh_every = int(refresh_every)
        self.temperature = float(temperature)
        self.max_tokens = int(max_tokens)
        self.max_chars = int(max_chars)
        self.outcome_threshold = None if outcome_threshold is None else float(outcome_threshold)
        self.running = np.zeros(len(vocab), dtype=np.float64)  # counts of the tags so far
        self.candidates: tuple[str, ...] = vocab.ids[: self.retry_candidates]
        self.refreshed_at: int | None = None
        self.counts = {
            "calls": 0, "retries": 0, "failed": 0, "tagged": 0, "names": 0, "discovered_names": 0
        }  # fmt: skip
        self.last_error: str | None = None
        # Tagging that fails (both attempts) past this share of the recent rollouts stops the
        # run: RISED would go on with empty profiles and no SD context.
        self.failure_stop = FailureRateStop("RISED LLM tagger", max_failure_rate)

    # --- the retry list ----------------------------------------------------------------------

    def refresh(
        self, step: int, running_counts: Mapping[str, float] | np.ndarray | None = None
    ) -> bool:
        """Re-ranks the retry candidates when ``refresh_every`` steps have passed since the last
        refresh (or none happened): the ``retry_candidates`` ids with the most counts in
        ``running_counts`` (default: this tagger's own counts so far), ties by vocabulary
        index. Returns whether it refreshed."""
        if self.refreshed_at is not None and step - self.refreshed_at < self.refresh_every:
            return False
        if running_counts is None:
            vec = self.running
        elif isinstance(running_counts, Mapping):
            vec = np.zeros(len(self.vocab), dtype=np.float64)
            for rid, count in running_counts.items():
                vec[self.vocab.index(rid)] += float(count)
        else:
            vec = np.asarray(running_counts, dtype=np.float64)
            if vec.shape != (len(self.vocab),):
                raise ValueError(
                    f"refresh: counts of shape {vec.shape}, expected ({len(self.vocab)},)"
                )
        order = sorted(range(len(self.vocab)), key=lambda i: (-vec[i], i))
        self.candidates = tuple(self.vocab.ids[i] for i in order[: self.retry_candidates])
        self.refreshed_at = int(step)
        return True

    # --- tagging -----------------------------------------------------------------------------

    def _user(self, task: Task, response: str, reward: float | None, ids: Sequence[str]) -> str:
        return TAG_TEMPLATE.user.format(
            vocabulary=_vocabulary_lines(self.vocab, ids),
            env=task.env_name or task.task_type or "-",
            task=task.question[: self.max_chars],
            response=fence(response[: self.max_chars]) if response else "(empty)",
            reward="unknown" if reward is None else f"{float(reward):.3g}",
        )

    async def _attempt(
        self, user: str, seed: int, record: bool = True
    ) -> tuple[Tags | None, str | None]:
        if record:
            self.counts["calls"] += 1
        request = LLMRequest(
            messages=(Message("system", TAG_TEMPLATE.system), Message("user", user)),
            temperature=self.temperature, max_tokens=self.max_tokens, json_schema=TAG_SCHEMA,
            seed=seed, schema_name=TAG_TEMPLATE.name,
        )  # fmt: skip
        try:
            text = (await self.client.generate(request)).text
        except LLMError as e:
            return None, f"client error: {e}"
        return parse_tags(text, self.vocab)

    async def _tag_one(
        self, task: Task, response: str, reward: float | None, seed: int, record: bool = True
    ) -> Tags:
        """One rollout's tags (a retry on the shorter list if needed); ``record=False`` (the
        reliability probe) leaves the counts, the running profile and ``last_error`` alone."""
        tags = await self._judged(task, response, reward, seed, record)
        return condition_on_outcome(tags, reward, self.outcome_threshold, self.vocab)

    async def _judged(
        self, task: Task, response: str, reward: float | None, seed: int, record: bool
    ) -> Tags:
        user = self._user(task, response, reward, self.vocab.ids)
        tags, error = await self._attempt(user, seed, record)
        if tags is None:
            if record:
                self.counts["retries"] += 1
            retry_user = self._user(task, response, reward, self.candidates)
            tags, retry_error = await self._attempt(retry_user, seed, record)
            if tags is None:
                why = f"{TAG_TEMPLATE.key}: primary: {error}; retry: {retry_error}"
                if not record:
                    return Tags.failure(why)
                self.counts["failed"] += 1
                self.last_error = why
                self.failure_stop.record(False, why)
                logger.warning("RISED tagging failed for task %r: %s", task.id, self.last_error)
                return Tags.failure(self.last_error)
        if not record:
            return tags
        self.failure_stop.record(True)
        self.counts["tagged"] += 1
        self.counts["names"] += len(tags.counts) + len(tags.discovered)
        self.counts["discovered_names"] += len(tags.discovered)
        self.running += profile(tags, self.vocab)
        return tags

    def _tag_rollouts(self, tasks, responses, rewards, step) -> list[Tags]:
        # One judge call per rollout (plus a retry where needed), concurrently. With a step,
        # the retry list is first refreshed from this tagger's own counts when due.
        if step is not None:
            self.refresh(step)

        async def run() -> list[Tags]:
            try:
                return await asyncio.gather(
                    *(
                        self._tag_one(t, r, w, int(step or 0))
                        for t, r, w in zip(tasks, responses, rewards, strict=True)
                    )
                )
            finally:
                await self.client.aclose()

        tags = list(run_sync(run)) if tasks else []
        self.failure_stop.check()  # once the batch is tagged: its outcomes all count
        return tags

    def _retag_rollouts(self, tasks, responses, rewards, seed: int) -> list[Tags]:
        async def run() -> list[Tags]:
            try:
                return await asyncio.gather(
                    *(
                        self._tag_one(t, r, w, seed, record=False)
                        for t, r, w in zip(tasks, responses, rewards, strict=True)
                    )
                )
            finally:
                await self.client.aclose()

        return list(run_sync(run)) if tasks else []

    def tag(
        self, task: Task, response: str, reward: float | None = None, *, step: int | None = None
    ) -> Tags:
        return self.tag_batch([task], [response], [reward], step=step)[0]

    # --- bookkeeping -------------------------------------------------------------------------

    def stats(self) -> dict[str, float]:
        out = {k: float(v) for k, v in self.counts.items()}
        names = self.counts["names"]
        out["discovered_share"] = self.counts["discovered_names"] / names if names else 0.0
        return out

    def state_dict(self) -> dict[str, Any]:
        return {
            "counts": dict(self.counts),
            "running": self.running.tolist(),
            "candidates": list(self.candidates),
            "refreshed_at": self.refreshed_at,
            "failure_stop": self.failure_stop.state_dict(),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        running = np.asarray(state["running"], dtype=np.float64)
        if running.shape != self.running.shape:
            raise ValueError(
                f"LLMTagger.load_state_dict: running counts of shape {running.shape}, the "
                f"vocabulary has {len(self.vocab)} rubrics"
            )
        unknown = [c for c in state["candidates"] if c not in self.vocab]
        if unknown:
            raise ValueError(f"LLMTagger.load_state_dict: candidates {unknown} not in vocabulary")
        self.counts = {k: int(state["counts"][k]) for k in self.counts}
        self.running = running
        self.candidates = tuple(state["candidates"])
        self.refreshed_at = state["refreshed_at"]
        self.failure_stop.load_state_dict(state.get("failure_stop"))
