"""``Grader``: the step's judges — verdicts under rubrics or candidate criteria, through an
in-memory verdict cache, and the domain's pass/fail verifier (the grading half of ``Services``).

Verdicts are cached by content (task, response, criterion text, sign and verifier: not the id),
so re-grading a recorded group under a candidate rubric costs only its new criteria;
``fresh=True`` bypasses every cache, the judges' own on-disk caches included (``Judge.caches_off``,
for null-variation calibration). A judge that raises on every attempt (``judge.retries``), or
fails more than ``judge.max_failure_rate`` of the verdicts, is a ``ComponentError`` naming it.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import hashlib
import json
from collections.abc import Sequence
from typing import Any

from absl import logging

from rubric_rl.envs.base import DomainContract
from rubric_rl.rubrics.judges import Judge, JudgeItem
from rubric_rl.rubrics.types import Criterion, Rubric, Task, Verdict


class ComponentError(RuntimeError):
    """A component (rollout engine, judge) failed after its retries; the message names it."""


def _digest(payload: Any) -> bytes:
    return hashlib.sha256(json.dumps(payload, default=str).encode()).digest()


def task_digest(task: Task) -> bytes:
    """The task's part of a verdict's key: its id, prompt and reference answer."""
    return _digest([task.id, [m.to_dict() for m in task.prompt], task.reference_answer])


def criterion_digest(c: Criterion) -> bytes:
    """The criterion's part of a verdict's key: what the judge sees of it (not its id)."""
    verifier = [str(c.verifier.kind), c.verifier.checker, [list(a) for a in c.verifier.args]]
    return _digest([c.text, c.title, c.weight > 0, list(c.choices), verifier])


def response_digest(task: bytes, response: str) -> bytes:
    """The (task, response) part of a verdict's key, from the task's ``task_digest``."""
    return task + hashlib.sha256(response.encode("utf-8", "surrogatepass")).digest()


def criterion_key(task: Task, response: str, c: Criterion) -> str:
    """Content key of one verdict: what the judge sees (task, response, criterion), not the
    criterion's id."""
    return verdict_key(response_digest(task_digest(task), response), criterion_digest(c))


def verdict_key(item: bytes, criterion: bytes) -> str:
    """``criterion_key`` from its parts' digests: a batch digests each task, response and
    criterion once, not once per verdict. The parts are fixed-length digests, so their
    concatenation is unambiguous."""
    return hashlib.sha256(item + criterion).hexdigest()


@dataclasses.dataclass
class VerdictCache:
    """In-memory content-addressed verdicts (failed ones are never stored), bounded LRU."""

    capacity: int = 500_000
    hits: int = 0
    misses: int = 0

    def __post_init__(self):
        self._store: collections.OrderedDict[str, Verdict] = collections.OrderedDict()

    def get(self, key: str) -> Verdict | None:
        v = self._store.get(key)
        if v is not None:
            self._store.move_to_end(key)
        return v

    def put(self, key: str, verdict: Verdict) -> None:
        if verdict.met is None:
            return
        self._store[key] = verdict
        self._store.move_to_end(key)
        while len(self._store) > self.capacity:
            self._store.popitem(last=False)


def judge_name(judge: Any) -> str:
    """The judge as errors name it: a composite names the judge behind it and its endpoint."""
    return str(getattr(judge, "name", type(judge).__name__))


class Grader:
    """Verdicts from one judge (``judge_impl``) and the domain's verifier (module docstring)."""

    def __init__(self, config: Any, judge: Any, domain: DomainContract):
        self.config, self.judge_impl, self.domain = config, judge, domain
        self.cache = VerdictCache()

    def judge(
        self,
        tasks: Sequence[Task],
        responses: Sequence[Sequence[str]],
        criteria: Sequence[Sequence[Criterion] | Rubric | None] | None = None,
        *,
        fresh: bool = False,
        check_failure_rate: bool = True,
    ) -> list[list[list[Verdict]]]:
        """``verdicts[g][j]``: the judge's verdicts on ``responses[g][j]``, one per criterion of
        ``criteria[g]`` (default: the task's evaluated rubric), in that order. A judge that raises
        on every attempt, or fails more than ``judge.max_failure_rate`` of the verdicts, is a
        ``ComponentError`` naming it (failed verdicts are never turned into zero rewards)."""
        crits = []
        for g, task in enumerate(tasks):
            c = None if criteria is None else criteria[g]
            c = task.rubric.evaluated().criteria if c is None else tuple(c)
            crits.append(c)
        out: list[list[list[Verdict | None]]] = []
        misses: list[tuple[int, int, int, str]] = []
        for g, (task, rs) in enumerate(zip(tasks, responses, strict=True)):
            rows = []
            t_digest = task_digest(task)
            c_digests = [criterion_digest(c) for c in crits[g]]
            for j, r in enumerate(rs):
                row: list[Verdict | None] = []
                item = response_digest(t_digest, r)
                for i, c in enumerate(crits[g]):
                    key = verdict_key(item, c_digests[i])
                    hit = None if fresh else self.cache.get(key)
                    if hit is None:
                        self.cache.misses += 0 if fresh else 1
                        misses.append((g, j, i, key))
                    else:
                        self.cache.hits += 1
                        if hit.criterion_id != c.id:  # the same content under another id
                            hit = dataclasses.replace(hit, criterion_id=c.id)
                    row.append(hit)
                rows.append(row)
            out.append(rows)
        if misses:
            self._judge_misses(tasks, responses, crits, misses, out, fresh)
        total = sum(len(crits[g]) * len(rs) for g, rs in enumerate(responses))
        failed = [v for g in out for row in g for v in row if v.met is None]
        rate = float(self.config.judge.max_failure_rate)
        if check_failure_rate and total and len(failed) / total > rate:
            raise ComponentError(
                f"judge {judge_name(self.judge_impl)}: {len(failed)}/{total} verdicts "
                f"failed (> judge.max_failure_rate={rate}); first error: {failed[0].error!r}"
            )
        return out  # type: ignore[return-value]

    def _judge_misses(self, tasks, responses, crits, misses, out, fresh: bool) -> None:
        by_item: dict[tuple[int, int], list[tuple[int, str]]] = {}
        for g, j, i, key in misses:
            by_item.setdefault((g, j), []).append((i, key))
        keys = sorted(by_item)
        items = [
            JudgeItem(tasks[g], responses[g][j], tuple(crits[g][i] for i, _ in by_item[(g, j)]))
            for g, j in keys
        ]
        name = judge_name(self.judge_impl)
        retries = int(self.config.judge.retries)
        off = isinstance(self.judge_impl, Judge) and fresh
        with self.judge_impl.caches_off() if off else contextlib.nullcontext():
            for attempt in range(retries + 1):
                try:
                    flat = self.judge_impl.score(items)
                    break
                except Exception as e:  # noqa: BLE001
                    err = e
                    logging.warning("judge %s attempt %d failed: %r", name, attempt + 1, e)
            else:
                raise ComponentError(f"judge {name} failed {retries + 1} times: {err!r}") from err
        for (g, j), verdicts in zip(keys, flat, strict=True):
            slots = by_item[(g, j)]
            if len(verdicts) != len(slots):
                raise ComponentError(
                    f"judge {name}: {len(verdicts)} verdicts for {len(slots)} criteria "
                    f"(task {tasks[g].id!r})"
                )
            for (i, key), v in zip(slots, verdicts):
                out[g][j][i] = v
                if not fresh:
                    self.cache.put(key, v)

    def task_verifier(self, task: Task, response: str) -> float:
        """The domain's pass/fail verifier as 1.0 / 0.0; NaN when it raises (undefined, never
        a 0 reward) or the domain has none."""
        if self.domain.verify is None:
            return float("nan")
        try:
            return float(bool(self.domain.verify(task, response)))
        except Exception as e:  # noqa: BLE001
            logging.warning("task verifier failed on task %r: %r", task.id, e)
            return float("nan")
