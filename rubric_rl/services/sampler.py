"""``Sampler``: the step's generation — single-turn samples and multi-turn agent episodes on the
policy the engine serves, each request seeded from its stream, and the held policies (second
parameter sets) some methods sample from (the sampling half of ``Services``).

- ``generate(prompts, n, stream=...)`` samples on the policy the engine serves now: the current
  policy, before this step's update. Each stream has its own seeds (``sample_seed`` over a
  stream-specific task index, and a per-step call counter), so probe rollouts never repeat the
  trained ones. What it returns is never trained unless a stage puts it in the step's
  ``Rollouts`` as trainable.
- ``run_agent(tasks, n, stream=...)``: the multi-turn agent loop over the domain's ``Env`` (tool
  outputs masked out of the loss).
- ``hold_policy(name)``: a copy of the policy served now, sampled from with ``policy=name``. Held
  policies are part of the run's checkpointed state (``held_state`` / ``load_held``): a resumed
  run gets back exactly those held at its checkpoint's step.

Engine failures are retried (``rollout.retries``) and then raised as ``ComponentError``.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import hashlib
from collections.abc import Mapping, Sequence
from typing import Any

from absl import logging

from rubric_rl.envs.base import DomainContract
from rubric_rl.rollout.batch import Messages, Trajectory
from rubric_rl.rollout.engine import GenerationRequest, SamplingParams
from rubric_rl.rubrics.types import Task
from rubric_rl.services.grader import ComponentError
from rubric_rl.util.buckets import round_up_to_bucket

TRAIN_STREAM = "train"
_CALL_STRIDE = 1 << 20  # task indices of one call: < 2**20 groups per call
_STREAM_STRIDE = 1 << 40  # calls of one stream in one step: < 2**20


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


class Sampler:
    """Generation over one engine, tokenizer and domain (module docstring)."""

    def __init__(
        self, config: Any, engine: Any, tokenizer: Any, domain: DomainContract, prompt_buckets
    ):
        self.config, self.engine, self.tokenizer, self.domain = config, engine, tokenizer, domain
        self._prompt_buckets = prompt_buckets  # fn(cap) -> buckets
        self.step = 0  # the step being produced (sampled with the weights of step - 1)
        self._calls: dict[str, int] = collections.defaultdict(int)
        self._held: dict[str, tuple[int, Any]] = {}  # name -> (step taken, engine snapshot)

    def begin_step(self, step: int) -> None:
        self.step = int(step)
        self._calls.clear()

    def rollout_mode(self) -> str:
        """``rollout.mode``: "agent" or "single" ("auto": agent on a domain with an env)."""
        mode = str(self.config.rollout.mode)
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
            min_new_tokens=int(r.min_new_tokens),
            ignore_eos=bool(r.ignore_eos),
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

    # --- held policies: second parameter sets -------------------------------------------

    def hold_policy(self, name: str) -> None:
        """Keeps a copy of the policy the engine serves now (before this step's update) as
        ``name`` — e.g. ARISE-RL's frozen solver or the frozen base policy — in device memory,
        with the step it was taken at (``held_step``); checkpoints hold it too. Replaces an
        earlier copy of that name. Needs an engine that can hold a second parameter set (the
        JAX engine)."""
        if not isinstance(name, str) or not name or "/" in name or name.startswith("."):
            # A key of the checkpoint's tree item, stored as a path component.
            raise ValueError(f"a held policy's name must be a plain file name, got {name!r}")
        self._held[name] = (self.step, self.engine.snapshot())

    def held_step(self, name: str) -> int | None:
        """The step the held policy ``name`` was taken at; None when none is held."""
        return self._held[name][0] if name in self._held else None

    def release_policy(self, name: str) -> None:
        """Drops the held policy ``name`` (held only while needed)."""
        self._held.pop(name, None)

    def _held_snapshot(self, name: str) -> Any:
        if name not in self._held:
            raise ValueError(f"no held policy {name!r} (hold_policy was never called)")
        return self._held[name][1]

    def held_state(self) -> tuple[dict[str, dict[str, int]], dict[str, Any]]:
        """What a checkpoint keeps of the held policies: ``({name: {"step", "version"}}, {name:
        parameters})``, the first JSON, the second a tree of the policy's parameters."""
        meta, params = {}, {}
        for name, (step, snap) in sorted(self._held.items()):
            p, version = self.engine.snapshot_parts(snap)
            meta[name] = {"step": int(step), "version": int(version)}
            params[name] = p
        return meta, params

    def load_held(self, meta: Mapping[str, Mapping[str, int]], params: Mapping[str, Any]) -> None:
        """The held policies of a checkpoint (``held_state``'s two parts), replacing any held."""
        if set(meta) != set(params):
            raise ValueError(
                f"held policies: metadata for {sorted(meta)}, parameters for {sorted(params)}"
            )
        self._held = {
            name: (int(m["step"]), self.engine.snapshot_of(params[name], int(m["version"])))
            for name, m in meta.items()
        }

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


def with_prompt(task: Task, messages: Messages) -> Task:
    """``task`` whose prompt is ``messages`` (an agent episode starts from its task's prompt);
    the task itself when they are its own."""
    if list(messages) == task.messages:
        return task
    return dataclasses.replace(task, prompt=tuple(dict(m) for m in messages))
