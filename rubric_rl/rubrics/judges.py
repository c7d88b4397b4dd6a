"""Judges: score a batch of (task, response, criteria) into one ``Verdict`` per criterion.

- ``ProgrammaticJudge`` runs the rule checkers registered in ``rubric_rl.rubrics.checkers``.
- ``LLMJudge`` asks an ``LLMClient`` to grade k criteria per call, with strict validation of the
  JSON it returns (a missing, duplicate or invalid verdict is a failure, retried, then ``None``)
  and an optional content-addressed cache.
- ``CompositeJudge`` routes rule criteria to the first and LLM criteria to the second.

A judge never turns a failure into "not met": ``Verdict(met=None, error=...)`` is excluded from
rewards and counted (DESIGN.md §5, §9).
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import dataclasses
import json
import logging
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from rubric_rl.rubrics import checkers as checkers_lib
from rubric_rl.rubrics.judge_cache import JudgeCache, cache_key
from rubric_rl.rubrics.llm import (
    RETRYABLE_STATUS,
    LLMClient,
    LLMError,
    LLMHTTPError,
    LLMRequest,
    LLMUnavailableError,
    run_sync,
    strip_json_fence,
)
from rubric_rl.rubrics.prompts import TEMPLATES, prompt_hash, verdict_schema
from rubric_rl.rubrics.types import Criterion, Task, Verdict, VerifierKind, verdict_failed
from rubric_rl.util.registry import Registry

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class JudgeItem:
    """One response to grade against ``criteria`` (default: the task's evaluated criteria)."""

    task: Task
    response: str
    criteria: tuple[Criterion, ...] | None = None

    def __post_init__(self):
        if not isinstance(self.response, str):
            raise TypeError(f"JudgeItem.response must be str, got {type(self.response).__name__}")
        crit = self.task.rubric.evaluated().criteria if self.criteria is None else self.criteria
        object.__setattr__(self, "criteria", tuple(crit))


class Judge(abc.ABC):
    """``score(items)[i][j]`` is the verdict on ``items[i].criteria[j]``."""

    @abc.abstractmethod
    async def ascore(self, items: Sequence[JudgeItem]) -> list[list[Verdict]]: ...

    def score(self, items: Sequence[JudgeItem]) -> list[list[Verdict]]:
        return run_sync(lambda: self._score_and_close(items))

    async def _score_and_close(self, items: Sequence[JudgeItem]) -> list[list[Verdict]]:
        try:
            return await self.ascore(items)
        finally:
            await self.aclose()

    async def aclose(self) -> None:  # noqa: B027 (optional hook; the default holds nothing)
        """Releases per-event-loop resources (network clients)."""

    @contextlib.contextmanager
    def caches_off(self) -> Iterator[None]:
        """Inside the block this judge, and every judge behind it, grades afresh: no verdict is
        read from or written to an on-disk cache (null-variation calibration). A judge that
        holds a cache, or wraps judges, overrides it; the default holds none."""
        yield

    @property
    def name(self) -> str:
        """The judge as errors should name it (a composite names the judge behind it)."""
        return type(self).__name__


class ProgrammaticJudge(Judge):
    """Rule criteria: ``CHECKERS.get(name)(response, task=task, **args) -> bool``.

    A checker that raises, an unknown checker, a non-bool result, or an LLM-verified criterion
    with no ``fallback`` judge gives ``met=None`` with the reason in ``error``.
    """

    def __init__(self, checkers: Registry | None = None, *, fallback: Judge | None = None):
        self.checkers = checkers if checkers is not None else checkers_lib.load_builtin_checkers()
        self.fallback = fallback

    def check(self, task: Task, response: str, criterion: Criterion) -> Verdict:
        v = criterion.verifier
        model = f"programmatic:{v.checker}"
        if v.kind != VerifierKind.RULE:
            return verdict_failed(
                criterion.id, "LLM-verified criterion and no fallback judge", judge_model=model
            )
        try:
            fn = self.checkers.get(v.checker)
        except KeyError as e:
            return verdict_failed(criterion.id, str(e.args[0]), judge_model=model)
        try:
            result = fn(response, task=task, **v.kwargs)
        except Exception as e:  # any checker bug is a failed verdict, never "not met"
            return verdict_failed(
                criterion.id,
                f"checker {v.checker!r} raised {type(e).__name__}: {e}",
                judge_model=model,
            )
        if not isinstance(result, bool | np.bool_):
            return verdict_failed(
                criterion.id,
                f"checker {v.checker!r} returned {type(result).__name__}, expected bool",
                judge_model=model,
            )
        args = ", ".join(f"{k}={val!r}" for k, val in v.args)
        return Verdict(
            criterion_id=criterion.id,
            met=bool(result),
            explanation=f"{v.checker}({args}) -> {bool(result)}",
            judge_model=model,
        )

    async def ascore(self, items: Sequence[JudgeItem]) -> list[list[Verdict]]:
        if self.fallback is not None:
            return await CompositeJudge(self, self.fallback).ascore(items)
        return [[self.check(it.task, it.response, c) for c in it.criteria] for it in items]

    async def aclose(self) -> None:
        if self.fallback is not None:
            await self.fallback.aclose()

    def caches_off(self) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext() if self.fallback is None else self.fallback.caches_off()

    @property
    def name(self) -> str:
        if self.fallback is None:
            return type(self).__name__
        return f"{type(self).__name__} (rule criteria) + {self.fallback.name} (LLM criteria)"


class LLMJudge(Judge):
    """Grades ``criteria_per_call`` (k) criteria of one response per LLM call.

    Validation is strict (verifiers v1 style): the reply must be a JSON object (a fenced
    ```json block is accepted) whose ``verdicts`` list holds one ``{name, reason, verdict}`` per
    criterion; order does not matter. A missing or duplicated name or a verdict outside the
    criterion's choices fails that criterion; unparseable/truncated JSON, an unknown name or a
    client error fails the whole call. Failed criteria are re-asked (only those) up to
    ``max_retries`` times, then get ``met=None``; a failure the client retries itself (an
    unreachable or 5xx endpoint, ``LLMUnavailableError``; 408 / 429) is not re-asked once the
    client has spent its attempts, so the judge and its client share one retry budget. The
    criterion's last choice means "met".
    Usage of all attempts is split evenly over the chunk's verdicts so sums stay exact.
    """

    def __init__(
        self,
        client: LLMClient,
        *,
        criteria_per_call: int = 1,
        template: str = "rubric_judge_v2",
        max_retries: int = 2,
        temperature: float = 0.0,
        max_tokens: int = 1024,
        seed: int | None = None,
        cache: JudgeCache | None = None,
        concurrency: int | None = None,
        structured_output: bool = True,
        progress: bool = False,
    ):
        if criteria_per_call < 1:
            raise ValueError(f"criteria_per_call must be >= 1, got {criteria_per_call}")
        if max_retries < 0:
            raise ValueError(f"max_retries must be >= 0, got {max_retries}")
        self.client = client
        self.k = int(criteria_per_call)
        self.template = TEMPLATES.get(template)
        self.max_retries = int(max_retries)
        self.temperature = float(temperature)
        self.max_tokens = int(max_tokens)
        self.seed = seed
        self.cache = cache
        # Calls in flight (default: the client's limit). The client's own limit applies to all its
        # users, so a judge asked for more raises it rather than being capped silently.
        self.concurrency = client.max_concurrency if concurrency is None else int(concurrency)
        if self.concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {concurrency}")
        client.allow_concurrency(self.concurrency)
        self.structured_output = structured_output
        self.progress = progress  # log "judged i/n calls" every ~10% of a batch
        self.stats = dict.fromkeys(("calls", "retries", "failed_verdicts", "cache_hits"), 0)

    @contextlib.contextmanager
    def caches_off(self) -> Iterator[None]:
        saved, self.cache = self.cache, None
        try:
            yield
        finally:
            self.cache = saved

    @property
    def sampling(self) -> dict[str, Any]:
        return {
            "temperature": self.temperature,
            "max_tokens": self.max_tokens,
            "seed": self.seed,
            "criteria_per_call": self.k,
        }

    def _key(self, item: JudgeItem, criterion: Criterion) -> str:
        return cache_key(
            model=self.client.model,
            template=self.template.key,
            sampling=self.sampling,
            criterion=criterion,
            task=item.task,
            response=item.response,
        )

    async def ascore(self, items: Sequence[JudgeItem]) -> list[list[Verdict]]:
        results: list[dict[str, Verdict]] = [{} for _ in items]
        jobs = []
        for i, item in enumerate(items):
            todo = []
            for c in item.criteria:
                hit = self.cache.get(self._key(item, c), criterion_id=c.id) if self.cache else None
                if hit is not None:
                    results[i][c.id] = hit
                    self.stats["cache_hits"] += 1
                    self.client.counters.add(cache_hits=1)
                else:
                    todo.append(c)
            for start in range(0, len(todo), self.k):
                jobs.append((i, item, tuple(todo[start : start + self.k])))
        sem = asyncio.Semaphore(self.concurrency)
        finished = [0]
        step = max(1, len(jobs) // 10)

        async def run(job):
            i, item, chunk = job
            async with sem:
                verdicts = await self._judge_chunk(item, chunk)
            results[i].update(verdicts)
            finished[0] += 1
            if self.progress and (finished[0] % step == 0 or finished[0] == len(jobs)):
                logger.info(
                    "judged %d/%d calls (%d failed verdicts so far)",
                    finished[0],
                    len(jobs),
                    self.stats["failed_verdicts"],
                )
            if self.cache is not None:
                for c in chunk:
                    self.cache.put(self._key(item, c), verdicts[c.id])

        await asyncio.gather(*(run(job) for job in jobs))
        return [[results[i][c.id] for c in item.criteria] for i, item in enumerate(items)]

    async def aclose(self) -> None:
        await self.client.aclose()

    @property
    def name(self) -> str:
        return f"LLMJudge({self.client.endpoint})"

    async def _judge_chunk(
        self, item: JudgeItem, chunk: tuple[Criterion, ...]
    ) -> dict[str, Verdict]:
        done: dict[str, tuple[bool, str]] = {}
        errors: dict[str, str] = {}
        pending = list(chunk)
        usage = {"prompt_tokens": 0, "completion_tokens": 0}
        model, phash = self.client.model, ""
        hashes: dict[str, str] = {}
        for attempt in range(self.max_retries + 1):
            if attempt:
                self.stats["retries"] += 1
            messages = self.template.render(item.task, item.response, pending)
            phash = prompt_hash(messages)
            request = LLMRequest(
                messages=tuple(messages),
                temperature=self.temperature,
                max_tokens=self.max_tokens,
                json_schema=verdict_schema(pending) if self.structured_output else None,
                seed=self.seed,
                schema_name="rubric_verdicts",
            )
            self.stats["calls"] += 1
            try:
                response = await self.client.generate(request)
            except LLMHTTPError as e:
                errors.update({c.id: f"attempt {attempt + 1}: {e}" for c in pending})
                if isinstance(e, LLMUnavailableError) or e.status in RETRYABLE_STATUS:
                    # The client already spent the call's one retry budget on this failure
                    # (its attempts within max_retry_s): asking again would multiply it (3 judge
                    # tries x 5 HTTP attempts), and a down endpoint only fails the same way.
                    break
                continue  # a failure the client does not retry (e.g. 400): asked once more
            except LLMError as e:
                errors.update({c.id: f"attempt {attempt + 1}: {e}" for c in pending})
                continue
            model = response.model or model
            for name in usage:
                usage[name] += int(response.usage.get(name, 0))
            parsed, call_error = parse_verdicts(response.text, pending)
            if call_error is not None:
                errors.update({c.id: f"attempt {attempt + 1}: {call_error}" for c in pending})
                continue
            for c in pending:
                outcome = parsed[c.id]
                if isinstance(outcome, str):
                    errors[c.id] = f"attempt {attempt + 1}: {outcome}"
                else:
                    done[c.id] = outcome
                    hashes[c.id] = phash  # the prompt this verdict answered
            pending = [c for c in pending if c.id not in done]
            if not pending:
                break
        shares = _split_usage(usage, len(chunk))
        out: dict[str, Verdict] = {}
        for c, share in zip(chunk, shares):
            common = dict(judge_model=model, prompt_hash=hashes.get(c.id, phash), usage=share)
            if c.id in done:
                met, reason = done[c.id]
                out[c.id] = Verdict(criterion_id=c.id, met=met, explanation=reason, **common)
            else:
                self.stats["failed_verdicts"] += 1
                logger.warning("judge failed on criterion %r: %s", c.id, errors.get(c.id))
                out[c.id] = verdict_failed(c.id, errors.get(c.id, "no verdict"), **common)
        return out


def parse_verdicts(
    text: str, criteria: Sequence[Criterion]
) -> tuple[dict[str, tuple[bool, str] | str], str | None]:
    """Validates a judge reply. Returns ({criterion id: (met, reason) or an error string}, None),
    or ({}, error) when the whole reply is unusable."""
    try:
        payload = json.loads(strip_json_fence(text))
    except json.JSONDecodeError as e:
        return {}, f"reply is not valid JSON ({e.msg} at char {e.pos}): {text[:120]!r}"
    if not isinstance(payload, Mapping) or not isinstance(payload.get("verdicts"), list):
        return {}, f"reply must be an object with a 'verdicts' list, got {text[:120]!r}"
    by_id = {c.id: c for c in criteria}
    seen: dict[str, list[Any]] = {}
    for n, entry in enumerate(payload["verdicts"]):
        if not isinstance(entry, Mapping):
            return {}, f"verdicts[{n}] is not an object: {entry!r}"
        name = entry.get("name", entry.get("criterion_id"))
        if not isinstance(name, str) or name not in by_id:
            return {}, f"verdicts[{n}] names an unknown criterion {name!r}; asked {list(by_id)}"
        seen.setdefault(name, []).append(entry)
    out: dict[str, tuple[bool, str] | str] = {}
    for cid, c in by_id.items():
        entries = seen.get(cid, [])
        if not entries:
            out[cid] = f"no verdict for criterion {cid!r}"
            continue
        if len(entries) > 1:
            out[cid] = f"{len(entries)} verdicts for criterion {cid!r} (duplicate)"
            continue
        entry = entries[0]
        verdict = entry.get("verdict")
        choices = [ch.lower() for ch in c.choices]
        if not isinstance(verdict, str) or verdict.strip().lower() not in choices:
            out[cid] = f"invalid verdict {verdict!r} for {cid!r}; expected one of {list(c.choices)}"
            continue
        reason = entry.get("reason", "")
        reason = reason if isinstance(reason, str) else json.dumps(reason)
        out[cid] = (verdict.strip().lower() == choices[-1], reason)
    return out, None


def _split_usage(usage: Mapping[str, int], n: int) -> list[dict[str, int]]:
    shares = [dict.fromkeys(usage, 0) for _ in range(n)]
    for name, total in usage.items():
        base, extra = divmod(int(total), n)
        for j in range(n):
            shares[j][name] = base + (1 if j < extra else 0)
    return shares


class CompositeJudge(Judge):
    """Rule-verified criteria → ``programmatic``; LLM-verified → ``llm``; order preserved."""

    def __init__(self, programmatic: ProgrammaticJudge, llm: Judge):
        self.programmatic = programmatic
        self.llm = llm

    async def ascore(self, items: Sequence[JudgeItem]) -> list[list[Verdict]]:
        llm_items = [
            JudgeItem(
                it.task,
                it.response,
                tuple(c for c in it.criteria if c.verifier.kind != VerifierKind.RULE),
            )
            for it in items
        ]
        llm_verdicts = await self.llm.ascore([it for it in llm_items if it.criteria])
        llm_iter = iter(llm_verdicts)
        out = []
        for it, llm_it in zip(items, llm_items):
            by_id = {v.criterion_id: v for v in next(llm_iter)} if llm_it.criteria else {}
            row = []
            for c in it.criteria:
                if c.verifier.kind == VerifierKind.RULE:
                    row.append(self.programmatic.check(it.task, it.response, c))
                else:
                    row.append(by_id[c.id])
            out.append(row)
        return out

    async def aclose(self) -> None:
        await self.llm.aclose()

    def caches_off(self) -> contextlib.AbstractContextManager[None]:
        return self.llm.caches_off()
