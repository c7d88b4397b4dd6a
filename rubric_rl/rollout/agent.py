"""Multi-turn tool-use rollouts over the `Env` interface, with either engine.

One episode (envs/base.py protocol): prompt = chat template of ``env.reset(task)``; then repeat
{model turn → ``env.step(text)`` → tool turn appended as tokens} until the env is done or a limit
is hit. Many episodes run together: each round, every live episode's next model turn is generated
in ONE engine call (requests of ``n = 1``).

Token-level assembly (one `Trajectory` per episode, token-indexed, all lengths equal):
- model-sampled tokens (including the stop token that ended the turn): ``loss_mask = 1`` and the
  engine's log-prob;
- prompt, tool outputs, environment observations and chat-template tokens: ``loss_mask = 0``,
  log-prob 0.
The model's tokens are never re-tokenised: the text given to ``env.step`` is a decode of them,
and what goes back into the context are the ids the engine returned.

Tool turn tokens: the chat template's own rendering of ``tool`` messages. `ChatFormat` renders
``[user, assistant(SENTINEL)]`` and ``[user, assistant(SENTINEL), tool...] + generation prompt``
and takes the text after the sentinel: it closes the assistant turn, holds the tool turn and opens
the next assistant turn. When the model's stop token spells the start of that text (Qwen3's
``<|im_end|>``), that prefix is dropped (the model already produced it).

Finish status per trajectory:
- "stop": the env ended the episode on a final answer (a turn without tool calls);
- "length": a model turn hit ``max_new_tokens`` (the cut turn still goes to ``env.step`` so the
  transcript has it; no further turns);
- "truncated": ``AgentConfig.max_turns`` model turns done, the env's own turn limit, or the token
  budget ``max_total_tokens`` reached (a model turn overrunning it is cut to fit; a tool turn
  that does not fit is not appended);
- "aborted": the engine aborted the turn, or ``env.reset`` / ``env.step`` raised (the error is in
  ``Trajectory.error``; the other episodes go on).
Malformed tool calls are the env's business: it answers them with an error observation, which is
appended like any tool output (loss_mask 0) and the episode continues.

Seeds: turn ``k`` of sample ``j`` of task ``i`` uses ``sample_seed(step, i, j * max_turns + k)``
(``GenerationRequest.sample_offset``), so no two turns of a group share a seed.

Prefix reuse (``AgentConfig.prefix_reuse``, default on): when ``engine.prefix_session()`` gives a
session (the JAX engine), every round goes through it keyed by episode, so a turn prefills only
what was appended since the episode's last turn; the session lives for one `run_agent` call (one
weight version) and frees an episode's cache when it ends. Requests, seeds and results are the
same either way (rollout/prefix_reuse.py).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Generator, Sequence
from typing import Any

import numpy as np

from rubric_rl.envs.base import Env, Observation, StepResult
from rubric_rl.rollout.engine import Generation, GenerationRequest, RolloutEngine, SamplingParams
from rubric_rl.rubrics.types import Message, Task

TRAJECTORY_STATUSES: tuple[str, ...] = ("stop", "length", "truncated", "aborted")
STATUS_CODES: dict[str, int] = {s: i for i, s in enumerate(TRAJECTORY_STATUSES)}
_SENTINEL = "\u27e6ASSISTANT-TURN-SENTINEL\u27e7"


@dataclasses.dataclass(frozen=True)
class AgentConfig:
    """Episode limits (see the module docstring for what hitting them does)."""

    max_turns: int = 8
    max_total_tokens: int = 4096
    # Keep each episode's KV cache between turns when the engine offers a prefix session (the
    # JAX engine; rollout/prefix_reuse.py): same tokens and log-probs, no re-prefill of the
    # history. False re-sends whole conversations to `engine.generate`.
    prefix_reuse: bool = True

    def __post_init__(self) -> None:
        if self.max_turns < 1:
            raise ValueError(f"AgentConfig.max_turns must be >= 1, got {self.max_turns}")
        if self.max_total_tokens < 2:
            raise ValueError(
                f"AgentConfig.max_total_tokens must be >= 2, got {self.max_total_tokens}"
            )


@dataclasses.dataclass(frozen=True)
class Trajectory:
    """One episode, token-indexed: ``loss_mask[i] = 1`` iff ``token_ids[i]`` was sampled by the
    model, and then ``logprobs[i]`` is its behaviour log-prob (else 0)."""

    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    loss_mask: tuple[int, ...]
    prompt_len: int
    status: str
    turns: tuple[str, ...] = ()  # decoded model turns, as given to env.step
    weight_versions: tuple[int, ...] = ()  # per model turn
    response: str | None = None  # env.response(): what a judge scores
    task_index: int = 0
    sample_index: int = 0
    num_tool_calls: int = 0
    num_tool_errors: int = 0
    error: str | None = None

    def __post_init__(self) -> None:
        n = len(self.token_ids)
        if len(self.logprobs) != n or len(self.loss_mask) != n:
            raise ValueError(
                f"Trajectory task {self.task_index} sample {self.sample_index}: {n} tokens, "
                f"{len(self.logprobs)} log-probs, {len(self.loss_mask)} mask entries"
            )
        if self.status not in TRAJECTORY_STATUSES:
            raise ValueError(f"Trajectory status {self.status!r} not in {TRAJECTORY_STATUSES}")

    @property
    def num_model_tokens(self) -> int:
        return sum(self.loss_mask)

    @property
    def weight_version(self) -> int:
        """The stalest policy version that produced any of its turns (-1: no model turn)."""
        return min(self.weight_versions) if self.weight_versions else -1


class ChatFormat:
    """Prompt and tool-turn token ids from a `rubric_rl.models.Tokenizer` (see module doc).

    ``tools_in_system``: write the tool schemas into the system message
    (``Observation.chat_messages``); False passes ``tools=`` to a chat template that takes them.
    """

    def __init__(self, tokenizer: Any, *, tools_in_system: bool = True):
        self.tokenizer = tokenizer
        self.tools_in_system = tools_in_system
        self._stop_text: dict[int, str] = {}

    def prompt_ids(self, observation: Observation) -> list[int]:
        tok = self.tokenizer
        if not self.tools_in_system and observation.tools and tok.has_chat_template:
            text = tok.chat_text(
                observation.chat_messages(), tools=observation.tools, add_generation_prompt=True
            )
            return tok.encode(text)
        msgs = observation.chat_messages(tools_in_system=self.tools_in_system)
        return tok.apply_chat_template(msgs, add_generation_prompt=True)

    def tool_turn_text(self, tool_messages: Sequence[Message]) -> str:
        """Text from the end of an assistant turn's content to the next generation prompt."""
        head = [{"role": "user", "content": "x"}, {"role": "assistant", "content": _SENTINEL}]
        tools = [m.to_dict() if hasattr(m, "to_dict") else dict(m) for m in tool_messages]
        a = self.tokenizer.chat_text(head, add_generation_prompt=False)
        b = self.tokenizer.chat_text(head + tools, add_generation_prompt=True)
        cut = a.find(_SENTINEL)
        if cut < 0 or not b.startswith(a[: cut + len(_SENTINEL)]):
            raise ValueError(
                "ChatFormat: the chat template does not render a conversation as a prefix of the "
                "same conversation plus tool messages; cannot derive the tool-turn tokens"
            )
        return b[cut + len(_SENTINEL) :]

    def tool_turn_ids(self, tool_messages: Sequence[Message], last_token: int | None) -> list[int]:
        """Token ids of the tool turn appended after a model turn that ended with
        ``last_token`` (its stop token, or None when the turn did not end on one).

        A tool's output is text the model may have written (the SQL tool echoes strings from
        the query): a special token's string in it (``<|im_end|>``, ``<|im_start|>assistant``)
        is encoded as the characters it is, never as the special id, so tool output cannot end
        a turn or open one in the agent's context. The template's own markup keeps its ids."""
        msgs = [m.to_dict() if hasattr(m, "to_dict") else dict(m) for m in tool_messages]
        hf = getattr(self.tokenizer, "hf", None)
        specials = tuple(getattr(hf, "all_special_tokens", ()) or ())
        if not any(sp in str(m.get("content", "")) for m in msgs for sp in specials):
            return self.tokenizer.encode(self._after_stop(self.tool_turn_text(msgs), last_token))
        # Render with a mark for each content, then encode the markup and the contents apart.
        marks = [f"{_SENTINEL}tool-{i}" for i in range(len(msgs))]
        text = self.tool_turn_text(
            [{**m, "content": mk} for m, mk in zip(msgs, marks, strict=True)]
        )
        text = self._after_stop(text, last_token)
        ids: list[int] = []
        for m, mk in zip(msgs, marks, strict=True):
            head, found, text = text.partition(mk)
            if not found:
                raise ValueError(
                    "ChatFormat: the chat template does not place a tool message's content "
                    "verbatim; cannot encode the special-token text in it as text"
                )
            ids += self.tokenizer.encode(head)
            ids += hf.encode(str(m["content"]), add_special_tokens=False, split_special_tokens=True)
        return ids + self.tokenizer.encode(text)

    def _after_stop(self, text: str, last_token: int | None) -> str:
        """``text`` less the stop token's text the model's turn already ended with."""
        if last_token is not None:
            if last_token not in self._stop_text:
                self._stop_text[last_token] = self.tokenizer.decode(
                    [last_token], skip_special_tokens=False
                )
            stop = self._stop_text[last_token]
            if stop and text.startswith(stop):
                text = text[len(stop) :]
        return text

    def turn_text(self, token_ids: Sequence[int]) -> str:
        return self.tokenizer.decode(token_ids, skip_special_tokens=False)


# ----------------------------------------------------------------------------- the loop


class _Episode:
    def __init__(self, env: Env, task: Task, task_index: int, sample_index: int, index: int):
        self.env, self.task = env, task
        self.task_index, self.sample_index, self.index = task_index, sample_index, index
        self.ids: list[int] = []
        self.logps: list[float] = []
        self.mask: list[int] = []
        self.prompt_len = 0
        self.turns: list[str] = []
        self.versions: list[int] = []
        self.status: str | None = None
        self.error: str | None = None
        self.num_calls = 0
        self.num_errors = 0

    def extend(self, ids: Sequence[int], logps: Sequence[float] | None, model: bool) -> None:
        self.ids.extend(int(t) for t in ids)
        if model:
            self.logps.extend(float(x) for x in logps)
        else:
            self.logps.extend([0.0] * len(ids))
        self.mask.extend([1 if model else 0] * len(ids))

    def finish(self, status: str, error: str | None = None) -> None:
        self.status, self.error = status, error

    def trajectory(self) -> Trajectory:
        try:
            response = self.env.response()
        except Exception:  # noqa: BLE001 - reset failed: there is no transcript
            response = None
        return Trajectory(
            token_ids=tuple(self.ids),
            logprobs=tuple(self.logps),
            loss_mask=tuple(self.mask),
            prompt_len=self.prompt_len,
            status=self.status or "aborted",
            turns=tuple(self.turns),
            weight_versions=tuple(self.versions),
            response=response,
            task_index=self.task_index,
            sample_index=self.sample_index,
            num_tool_calls=self.num_calls,
            num_tool_errors=self.num_errors,
            error=self.error,
        )


def _advance(ep: _Episode, gen: Generation, chat: ChatFormat, config: AgentConfig) -> None:
    """Appends one model turn, steps the env, appends its tool turn or finishes the episode."""
    budget = config.max_total_tokens - len(ep.ids)
    toks, lps = list(gen.token_ids), list(gen.logprobs)
    over_budget = len(toks) > budget
    if over_budget:
        toks, lps = toks[:budget], lps[:budget]
    ep.extend(toks, lps, model=True)
    ep.versions.append(gen.weight_version)
    if gen.finish_reason == "abort":
        return ep.finish("aborted", "the engine aborted the turn")
    ended_on_stop = gen.finish_reason == "stop" and not over_budget and bool(toks)
    text = chat.turn_text(toks[:-1] if ended_on_stop else toks)
    ep.turns.append(text)
    try:
        res: StepResult = ep.env.step(text)
    except Exception as e:  # noqa: BLE001 - one broken env must not kill the batch
        return ep.finish("aborted", f"env.step raised {type(e).__name__}: {e}")
    calls = res.info.get("tool_calls", ()) if isinstance(res.info, dict) else ()
    ep.num_calls += len(calls)
    ep.num_errors += int(res.info.get("num_errors", 0)) if isinstance(res.info, dict) else 0
    if over_budget:
        return ep.finish("truncated")
    if gen.finish_reason == "length":
        return ep.finish("length")
    if res.done:
        return ep.finish("stop" if res.info.get("status") == "answered" else "truncated")
    if len(ep.turns) >= config.max_turns:
        return ep.finish("truncated")
    tool_msgs = res.tool_messages or (Message("tool", res.observation or ""),)
    obs = chat.tool_turn_ids(tool_msgs, toks[-1] if ended_on_stop else None)
    if len(ep.ids) + len(obs) > config.max_total_tokens:
        return ep.finish("truncated")
    ep.extend(obs, None, model=False)


def _episode_loop(
    chat: ChatFormat,
    envs: Sequence[Env],
    tasks: Sequence[Task],
    config: AgentConfig,
    step: int,
    task_indices: Sequence[int],
    sample_indices: Sequence[int],
) -> Generator[tuple[list[GenerationRequest], list[int]], list[list[Generation]], list[Trajectory]]:
    from rubric_rl.rollout.engine import sample_seed

    eps = []
    for i, (env, task) in enumerate(zip(envs, tasks, strict=True)):
        ep = _Episode(env, task, task_indices[i], sample_indices[i], i)
        eps.append(ep)
        try:
            obs = env.reset(task, seed=sample_seed(step, task_indices[i], sample_indices[i]))
            prompt = chat.prompt_ids(obs)
        except Exception as e:  # noqa: BLE001
            ep.finish("aborted", f"env.reset raised {type(e).__name__}: {e}")
            continue
        ep.extend(prompt, None, model=False)
        ep.prompt_len = len(prompt)
        if len(prompt) >= config.max_total_tokens:
            ep.finish("truncated")
    while True:
        live = [ep for ep in eps if ep.status is None]
        if not live:
            return [ep.trajectory() for ep in eps]
        requests = [
            GenerationRequest(
                prompt_ids=tuple(ep.ids),
                request_id=f"episode{ep.index}/turn{len(ep.turns)}",
                step=step,
                task_index=ep.task_index,
                sample_offset=ep.sample_index * config.max_turns + len(ep.turns),
            )
            for ep in live
        ]
        gens = yield requests, [ep.index for ep in live]
        if len(gens) != len(live):
            raise RuntimeError(f"engine returned {len(gens)} results for {len(live)} requests")
        for ep, g in zip(live, gens, strict=True):
            _advance(ep, g[0], chat, config)


def _loop_args(envs, tasks, params, task_indices, sample_indices):
    if params.n != 1:
        raise ValueError(
            f"run_agent: SamplingParams.n must be 1 (one env per sample), got {params.n}"
        )
    if len(envs) != len(tasks):
        raise ValueError(f"run_agent: {len(envs)} envs but {len(tasks)} tasks")
    task_indices = list(range(len(envs))) if task_indices is None else list(task_indices)
    sample_indices = [0] * len(envs) if sample_indices is None else list(sample_indices)
    if len(task_indices) != len(envs) or len(sample_indices) != len(envs):
        raise ValueError("run_agent: task_indices / sample_indices must have one entry per env")
    return task_indices, sample_indices


def _prefix_session(engine: Any, config: AgentConfig) -> Any:
    """The engine's prefix session when reuse is on and it has one (duck-typed engines and
    SGLang: None, whole conversations are re-sent)."""
    open_session = getattr(engine, "prefix_session", None)
    return open_session() if config.prefix_reuse and open_session is not None else None


def run_agent(
    engine: RolloutEngine,
    chat: ChatFormat,
    envs: Sequence[Env],
    tasks: Sequence[Task],
    params: SamplingParams,
    config: AgentConfig = AgentConfig(),
    *,
    step: int = 0,
    task_indices: Sequence[int] | None = None,
    sample_indices: Sequence[int] | None = None,
) -> list[Trajectory]:
    """Runs one episode per (env, task) pair, all turns batched; returns trajectories in order.

    A group of J samples of one task = J envs with the same task and task index and sample
    indices 0..J-1. ``params.n`` must be 1. The caller owns (and closes) the envs.
    """
    ti, si = _loop_args(envs, tasks, params, task_indices, sample_indices)
    loop = _episode_loop(chat, envs, tasks, config, step, ti, si)
    session = _prefix_session(engine, config)
    try:
        requests, keys = next(loop)
        while True:
            if session is None:
                gens = engine.generate(requests, params)
            else:
                gens = session.generate(requests, params, keys)
            requests, keys = loop.send(gens)
    except StopIteration as done:
        return done.value
    finally:
        if session is not None:
            session.close()


async def arun_agent(
    engine: RolloutEngine,
    chat: ChatFormat,
    envs: Sequence[Env],
    tasks: Sequence[Task],
    params: SamplingParams,
    config: AgentConfig = AgentConfig(),
    *,
    step: int = 0,
    task_indices: Sequence[int] | None = None,
    sample_indices: Sequence[int] | None = None,
) -> list[Trajectory]:
    """`run_agent` awaiting ``engine.agenerate`` (use inside an event loop)."""
    ti, si = _loop_args(envs, tasks, params, task_indices, sample_indices)
    loop = _episode_loop(chat, envs, tasks, config, step, ti, si)
    session = _prefix_session(engine, config)
    try:
        requests, keys = next(loop)
        while True:
            if session is None:
                gens = await engine.agenerate(requests, params)
            else:
                gens = await session.agenerate(requests, params, keys)
            requests, keys = loop.send(gens)
    except StopIteration as done:
        return done.value
    finally:
        if session is not None:
            session.close()


def pack_trajectories(
    trajectories: Sequence[Trajectory], length: int | None = None, pad_id: int = 0
) -> dict[str, np.ndarray]:
    """Right-padded arrays for a TrainBatch (DESIGN §4). ``loss_mask`` and ``rollout_logps`` are
    in the trainer's prediction layout (core/logprobs.py: position t is about token t + 1).

    Returns input_ids, positions, attention_mask, loss_mask, rollout_logps [B, T];
    weight_version, finish_status (``STATUS_CODES``) [B].
    """
    longest = max((len(t.token_ids) for t in trajectories), default=1)
    t_len = longest if length is None else length
    if t_len < longest:
        raise ValueError(f"pack_trajectories: length {t_len} < longest trajectory {longest}")
    b = len(trajectories)
    out = {
        "input_ids": np.full((b, t_len), pad_id, np.int32),
        "attention_mask": np.zeros((b, t_len), np.int32),
        "loss_mask": np.zeros((b, t_len), np.float32),
        "rollout_logps": np.zeros((b, t_len), np.float32),
        "weight_version": np.asarray([t.weight_version for t in trajectories], np.int32),
        "finish_status": np.asarray([STATUS_CODES[t.status] for t in trajectories], np.int32),
    }
    for i, t in enumerate(trajectories):
        n = len(t.token_ids)
        out["input_ids"][i, :n] = t.token_ids
        out["attention_mask"][i, :n] = 1
        out["loss_mask"][i, : n - 1] = t.loss_mask[1:]
        out["rollout_logps"][i, : n - 1] = t.logprobs[1:]
    out["positions"] = np.maximum(np.cumsum(out["attention_mask"], axis=1) - 1, 0).astype(np.int32)
    return out
