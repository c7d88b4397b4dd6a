"""``Services``: what stages and controllers may call during a step (DESIGN §3).

Every controller and stage gets one when it is built (``Services.for_caller(name)`` gives it a
view whose time is logged as ``time/services/<name>``), together with the run directory:

- ``generate(prompts, n, stream=...)`` samples on the policy the engine serves now: the current
  policy, before this step's update. Each stream has its own seeds (``sample_seed`` over a
  stream-specific task index, and a per-step call counter), so probe rollouts never repeat the
  trained ones. What it returns is never trained unless a stage puts it in the step's
  ``Rollouts`` as trainable.
- ``run_agent(tasks, n, stream=...)``: the multi-turn agent loop over the domain's ``Env`` (tool
  outputs masked out of the loss).
- ``judge(tasks, responses, criteria=None, fresh=False)``: verdicts under the tasks' rubrics or
  candidate criteria. Verdicts are cached by content (task, response, criterion text, sign and
  verifier: not the id), so re-grading a recorded group under a candidate rubric costs only its
  new criteria; ``fresh=True`` bypasses every cache (null-variation calibration).
- ``encode_prompt`` / ``decode`` / ``tokenizer``.

Engine and judge failures are retried (``rollout.retries``, ``judge.retries``) and then raised as
``ComponentError`` naming the component. The domain's oracle is not a service: no controller sees
it (``rubric_rl/pair_failures.py`` reads it for analysis only).
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import hashlib
import json
import os
import shutil
import time
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
from absl import logging

from rubric_rl.buckets import round_up_to_bucket
from rubric_rl.rollout.batch import Messages, Trajectory
from rubric_rl.rollout.engine import GenerationRequest, SamplingParams
from rubric_rl.rubrics.judges import JudgeItem
from rubric_rl.rubrics.types import Criterion, Rubric, Task, Verdict

TRAIN_STREAM = "train"
_CALL_STRIDE = 1 << 20  # task indices of one call: < 2**20 groups per call
_STREAM_STRIDE = 1 << 40  # calls of one stream in one step: < 2**20


class ComponentError(RuntimeError):
    """A component (rollout engine, judge) failed after its retries; the message names it."""


def stream_base(stream: str) -> int:
    """The first task index of a seed stream: 0 for the trained rollouts (so their seeds are
    ``sample_seed(step, g, j)``, as always), a stable hash of the name for any other stream."""
    if stream == TRAIN_STREAM:
        return 0
    h = int.from_bytes(hashlib.blake2b(stream.encode(), digest_size=8).digest(), "big")
    return (1 + h % ((1 << 21) - 1)) * _STREAM_STRIDE


def _check_seed_indices(seed_indices: Sequence[int] | None, n: int) -> None:
    if seed_indices is not None and len(seed_indices) != n:
        raise ValueError(f"seed_indices: one per prompt ({n}), got {len(seed_indices)}")


def _criterion_key(task: Task, response: str, c: Criterion) -> str:
    """Content key of one verdict: what the judge sees, not the criterion's id."""
    payload = [
        task.id,
        [m.to_dict() for m in task.prompt],
        task.reference_answer,
        response,
        c.text,
        c.title,
        c.weight > 0,
        list(c.choices),
        [str(c.verifier.kind), c.verifier.checker, [list(a) for a in c.verifier.args]],
    ]
    return hashlib.sha256(json.dumps(payload, default=str).encode()).hexdigest()


@contextlib.contextmanager
def _judge_caches_off(judge: Any) -> Iterator[None]:
    """Temporarily detaches the on-disk verdict caches of a judge and its fallbacks."""
    saved, stack, seen = [], [judge], set()
    while stack:
        j = stack.pop()
        if j is None or id(j) in seen:
            continue
        seen.add(id(j))
        if getattr(j, "cache", None) is not None:
            saved.append((j, j.cache))
            j.cache = None
        stack += [getattr(j, "fallback", None), getattr(j, "llm", None)]
    try:
        yield
    finally:
        for j, cache in saved:
            j.cache = cache


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


class Services:
    """The step's services over one engine, tokenizer, judge and domain (module docstring)."""

    def __init__(self, config, engine, tokenizer, judge, domain, workdir: str, prompt_buckets):
        self.config = config
        self.engine = engine
        self.tokenizer = tokenizer
        self.judge_impl = judge
        self.domain = domain
        self.workdir = workdir
        self._prompt_buckets = prompt_buckets  # fn(cap) -> buckets
        self._step = [0]  # shared with every caller's view
        self.cache = VerdictCache()
        self.seconds: dict[str, float] = collections.defaultdict(float)
        self._calls: dict[str, int] = collections.defaultdict(int)
        self._caller = "trainer"
        self._held: dict[str, tuple[int, Any]] = {}  # name -> (step taken, engine snapshot)

    # --- callers and time ------------------------------------------------------------------

    def for_caller(self, name: str) -> Services:
        """A view of these services whose time is logged as ``time/services/<name>``."""
        view = object.__new__(Services)
        view.__dict__.update(self.__dict__)
        view._caller = name
        return view

    @contextlib.contextmanager
    def _timed(self) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[self._caller] += time.perf_counter() - t0

    @property
    def step(self) -> int:
        """The step being produced (its rollouts are sampled with the weights of step - 1)."""
        return self._step[0]

    def begin_step(self, step: int) -> None:
        self._step[0] = int(step)
        self._calls.clear()

    def pop_seconds(self) -> dict[str, float]:
        out = dict(self.seconds)
        self.seconds.clear()
        return out

    def rollout_mode(self) -> str:
        """``rollout.mode``: "agent" or "single" ("auto": agent on a domain with an env)."""
        mode = str(self.config.rollout.get("mode", "auto"))
        if mode == "auto":
            return "agent" if getattr(self.domain, "make_env", None) is not None else "single"
        return mode

    def is_episode(self, task: Task) -> bool:
        """Whether ``task``'s rollouts are multi-turn agent episodes: in agent mode, every task,
        except on a domain that mixes tool environments into single-turn tasks
        (``Domain.episodic``: the embedded domain with ``domain.tool_envs``), where only the
        tool environments' tasks are."""
        if self.rollout_mode() != "agent":
            return False
        episodic = getattr(self.domain, "episodic", None)
        return True if episodic is None else bool(episodic(task))

    def rollouts(
        self,
        tasks: Sequence[Task],
        n: int,
        *,
        stream: str = "probe",
        params: SamplingParams | None = None,
        prompts: Sequence[Messages] | None = None,
    ) -> tuple[list[tuple[int, ...]], list[list[Trajectory]]]:
        """``n`` rollouts per task, each the way its task is rolled out (``is_episode``): agent
        episodes (``run_agent``) or single-turn samples (``generate``), in task order. ``prompts``:
        each task's messages in place of its own (a decorated prompt; an episode starts from
        it). A batch of one kind is one call, exactly as calling that method; a mixed batch is
        two (episodes first), each with its own seeds."""
        prompts = [t.messages for t in tasks] if prompts is None else list(prompts)
        if len(prompts) != len(tasks):
            raise ValueError(f"rollouts: {len(prompts)} prompts for {len(tasks)} tasks")
        episode = [self.is_episode(t) for t in tasks]
        ids: list[Any] = [None] * len(tasks)
        trajs: list[Any] = [None] * len(tasks)
        for kind in (True, False):
            idx = [i for i, e in enumerate(episode) if e is kind]
            if not idx:
                continue
            if kind:
                sub = [with_prompt(tasks[i], prompts[i]) for i in idx]
                got = self.run_agent(sub, n, stream=stream, params=params)
            else:
                got = self.generate(
                    [prompts[i] for i in idx], n, stream=stream, params=params,
                    names=[tasks[i].id for i in idx],
                )  # fmt: skip
            for i, p, ts in zip(idx, *got, strict=True):
                ids[i], trajs[i] = p, ts
        return ids, trajs

    # --- tokens ----------------------------------------------------------------------------

    def encode_prompt(
        self, messages: Messages, what: str = "prompt", field: str = "max_prompt_len"
    ) -> tuple[int, ...]:
        """Chat-template token ids; longer than ``model.<field>`` is an error, never a silent
        truncation (cutting the start of a prompt drops its instruction)."""
        ids = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
        cap = int(self.config.model[field])
        if len(ids) > cap:
            raise ValueError(
                f"{what}: {len(ids)} tokens (chat template and guidance included) > "
                f"config.model.{field}={cap}; raise it (the prompt would lose its start)"
            )
        return tuple(ids)

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids))

    def prompt_len(self, lengths: Sequence[int], field: str = "max_prompt_len") -> int:
        """The padded prompt length of a batch: the smallest bucket that fits its longest."""
        buckets = self._prompt_buckets(int(self.config.model[field]))
        return round_up_to_bucket(max(lengths), buckets)

    def sampling_params(self, n: int, **overrides: Any) -> SamplingParams:
        r = self.config.rollout
        kw = dict(
            max_new_tokens=int(r.max_new_tokens),
            temperature=float(r.temperature),
            top_p=float(r.top_p),
            top_k=int(r.top_k) if r.top_k > 0 else -1,
            n=int(n),
            min_new_tokens=int(r.get("min_new_tokens", 0)),
            ignore_eos=bool(r.get("ignore_eos", False)),
        )
        kw.update(overrides)
        return SamplingParams(**kw)

    # --- generation ------------------------------------------------------------------------

    def _task_base(self, stream: str) -> int:
        k = self._calls[stream]
        self._calls[stream] += 1
        return stream_base(stream) + k * _CALL_STRIDE

    def _engine_generate(self, requests, params):
        retries = int(self.config.rollout.retries)
        for attempt in range(retries + 1):
            try:
                return self.engine.generate(requests, params)
            except Exception as e:  # noqa: BLE001 - any engine failure is retried, then named
                err = e
                logging.warning("rollout engine attempt %d failed: %r", attempt + 1, e)
        raise ComponentError(
            f"rollout engine {type(self.engine).__name__} failed {retries + 1} times: {err!r}"
        ) from err

    # --- held policies: a second parameter set ---------------------------------------------

    def _policy_dir(self, name: str) -> str:
        if not name or "/" in name or name.startswith("."):
            raise ValueError(f"a held policy's name must be a plain file name, got {name!r}")
        return os.path.join(self.workdir, "policies", name)

    def hold_policy(self, name: str) -> None:
        """Keeps a copy of the policy the engine serves now (before this step's update) as
        ``name`` — e.g. ARISE-RL's frozen solver or the frozen base policy — in device memory and
        under ``<workdir>/policies/<name>/`` with the step it was taken at, so that a resumed run
        gets it back (``held_step``). Replaces an earlier copy of that name. Needs an engine that
        can hold a second parameter set (the JAX engine)."""
        snap = self.engine.snapshot()
        d = self._policy_dir(name)
        tmp = f"{d}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        os.makedirs(os.path.dirname(d), exist_ok=True)
        self.engine.save_snapshot(snap, tmp)
        with open(os.path.join(tmp, "held.json"), "w") as f:
            json.dump({"name": name, "step": self.step}, f)
        shutil.rmtree(d, ignore_errors=True)
        os.rename(tmp, d)
        self._held[name] = (self.step, snap)

    def held_step(self, name: str) -> int | None:
        """The step the held policy ``name`` was taken at (in memory, else on disk); None."""
        if name in self._held:
            return self._held[name][0]
        meta = os.path.join(self._policy_dir(name), "held.json")
        if not os.path.isfile(meta):
            return None
        with open(meta) as f:
            return int(json.load(f)["step"])

    def release_policy(self, name: str) -> None:
        """Drops the held policy ``name`` from memory and disk (held only while needed)."""
        self._held.pop(name, None)
        shutil.rmtree(self._policy_dir(name), ignore_errors=True)

    def _held_snapshot(self, name: str) -> Any:
        if name not in self._held:
            step = self.held_step(name)
            if step is None:
                raise ValueError(f"no held policy {name!r} (hold_policy was never called)")
            self._held[name] = (step, self.engine.load_snapshot(self._policy_dir(name)))
        return self._held[name][1]

    def generate(
        self,
        prompts: Sequence[Messages],
        n: int,
        *,
        stream: str = "probe",
        params: SamplingParams | None = None,
        names: Sequence[str] | None = None,
        policy: str | None = None,
        seed_indices: Sequence[int] | None = None,
    ) -> tuple[list[tuple[int, ...]], list[list[Trajectory]]]:
        """``n`` single-turn samples per prompt on the current policy, or on the held policy
        ``policy`` (``hold_policy``): (prompt ids per prompt, trajectories per prompt).
        ``names`` (e.g. task ids) only label errors. ``seed_indices``: each prompt's seed task
        index in place of the stream's — sample j of prompt i then has the seed of sample j of
        the request that used that index this step (paired samples, e.g. a memory rollout and
        the standard rollout it is compared with)."""
        params = params or self.sampling_params(n)
        if params.n != n:
            params = dataclasses.replace(params, n=int(n))
        _check_seed_indices(seed_indices, len(prompts))
        base = self._task_base(stream)
        with self._timed():
            requests = [
                GenerationRequest(
                    self.encode_prompt(m, f"task {names[g] if names else g} at step {self.step}"),
                    request_id=f"s{self.step}-t{g}" if base == 0 else f"s{self.step}-{stream}-{g}",
                    step=self.step,
                    task_index=base + g if seed_indices is None else int(seed_indices[g]),
                )
                for g, m in enumerate(prompts)
            ]
            held = self.engine.serving(self._held_snapshot(policy)) if policy else None
            with held if held is not None else contextlib.nullcontext():
                gens = self._engine_generate(requests, params)
            out = [
                [
                    Trajectory(
                        tuple(x.token_ids),
                        tuple(x.logprobs),
                        x.finish_reason,
                        int(x.weight_version),
                        self.tokenizer.decode(x.token_ids),
                        sample_index=j,
                        seed=x.seed,
                    )
                    for j, x in enumerate(gs)
                ]
                for gs in gens
            ]
        return [r.prompt_ids for r in requests], out

    def run_agent(
        self,
        tasks: Sequence[Task],
        n: int,
        *,
        stream: str = "probe",
        params: SamplingParams | None = None,
        make_env: Any = None,
        policy: str | None = None,
        seed_indices: Sequence[int] | None = None,
    ) -> tuple[list[tuple[int, ...]], list[list[Trajectory]]]:
        """``n`` multi-turn episodes per task over the domain's environment (``make_env``: a
        ``Task -> Env`` factory in its place, e.g. ARISE-RL's generator role), on the current
        policy or on the held policy ``policy`` (``hold_policy``): (prompt ids per task,
        trajectories per task). Tool outputs and template tokens get loss mask 0.
        ``seed_indices``: as ``generate``'s (paired episodes)."""
        from rubric_rl.rollout.agent import AgentConfig, ChatFormat, run_agent

        make_env = make_env if make_env is not None else self.domain.make_env
        if make_env is None:
            raise ValueError(
                f"config.rollout.mode: agent rollouts need a domain with an environment; "
                f"domain {self.domain.name!r} has none"
            )
        a = self.config.rollout.agent
        chat = ChatFormat(self.tokenizer, tools_in_system=bool(a.tools_in_system))
        acfg = AgentConfig(max_turns=int(a.max_turns), max_total_tokens=int(a.max_total_tokens))
        _check_seed_indices(seed_indices, len(tasks))
        base = self._task_base(stream)
        flat_tasks = [t for t in tasks for _ in range(n)]
        envs = [make_env(t) for t in flat_tasks]
        params = dataclasses.replace(params, n=1) if params else self.sampling_params(1)
        held = self.engine.serving(self._held_snapshot(policy)) if policy else None
        with self._timed():
            try:
                with held if held is not None else contextlib.nullcontext():
                    trajs = run_agent(
                        self.engine, chat, envs, flat_tasks, params, acfg, step=self.step,
                        task_indices=[
                            base + g if seed_indices is None else int(seed_indices[g])
                            for g in range(len(tasks)) for _ in range(n)
                        ],
                        sample_indices=[j for _ in tasks for j in range(n)],
                    )  # fmt: skip
            finally:
                for e in envs:
                    e.close()
        prompts, out = [], []
        for g in range(len(tasks)):
            group = []
            for j in range(n):
                tr = trajs[g * n + j]
                p = tr.prompt_len
                group.append(
                    Trajectory(
                        tuple(tr.token_ids[p:]),
                        tuple(tr.logprobs[p:]),
                        tr.status,
                        int(tr.weight_version),
                        tr.response if tr.response is not None else "",
                        loss_mask=tuple(tr.loss_mask[p:]),
                        sample_index=j,
                        info={
                            "turns": len(tr.turns),
                            "tool_calls": tr.num_tool_calls,
                            "tool_errors": tr.num_tool_errors,
                            "error": tr.error,
                        },
                    )  # fmt: skip
                )
                if j == 0:
                    prompts.append(tuple(tr.token_ids[:p]))
            out.append(group)
        return prompts, out

    # --- judging ---------------------------------------------------------------------------

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
        with self._timed():
            crits = []
            for g, task in enumerate(tasks):
                c = None if criteria is None else criteria[g]
                c = task.rubric.evaluated().criteria if c is None else tuple(c)
                crits.append(c)
            out: list[list[list[Verdict | None]]] = []
            misses: list[tuple[int, int, int, str]] = []
            for g, (task, rs) in enumerate(zip(tasks, responses, strict=True)):
                rows = []
                for j, r in enumerate(rs):
                    row: list[Verdict | None] = []
                    for i, c in enumerate(crits[g]):
                        key = _criterion_key(task, r, c)
                        hit = None if fresh else self.cache.get(key)
                        if hit is None:
                            self.cache.misses += 0 if fresh else 1
                            misses.append((g, j, i, key))
                        else:
                            self.cache.hits += 1
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
                    f"judge {_judge_name(self.judge_impl)}: {len(failed)}/{total} verdicts "
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
        name = _judge_name(self.judge_impl)
        retries = int(self.config.judge.retries)
        ctx = _judge_caches_off(self.judge_impl) if fresh else contextlib.nullcontext()
        with ctx:
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

    # --- outcome reward --------------------------------------------------------------------

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


def nan_mean(x: np.ndarray) -> float:
    d = np.asarray(x, np.float64)
    d = d[~np.isnan(d)]
    return float(d.mean()) if d.size else float("nan")


def _judge_name(judge: Any) -> str:
    """The judge as errors name it: a composite names the judge behind it and its endpoint."""
    return str(getattr(judge, "name", type(judge).__name__))


__all__ = ["TRAIN_STREAM", "ComponentError", "Services", "VerdictCache", "stream_base"]


def with_prompt(task: Task, messages: Messages) -> Task:
    """``task`` whose prompt is ``messages`` (an agent episode starts from its task's prompt);
    the task itself when they are its own."""
    if list(messages) == task.messages:
        return task
    return dataclasses.replace(task, prompt=tuple(dict(m) for m in messages))
