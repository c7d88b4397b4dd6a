"""Rollouts -> TrainBatch (DESIGN §4): host-side packing into bucketed, sharded arrays.

Layout per row: the prompt left-padded to ``prompt_len``, then the completion right-padded to a
length bucket; ``[B, T]`` arrays are in the prediction layout of ``core/logprobs.py`` (position t is
about token ``input_ids[:, t + 1]``), so completion token i sits at input position
``prompt_len + i`` and its log-prob / loss-mask entry at ``prompt_len + i − 1``.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import jax
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from rubric_rl.core import sharding
from rubric_rl.core.train_step import TrainBatch
from rubric_rl.rollout.engine import Generation, GenerationRequest
from rubric_rl.rollout.jax_engine import round_up_to_bucket

FINISH_CODES = {"stop": 0, "length": 1, "abort": 2}


def build_train_batch(
    requests: Sequence[GenerationRequest],
    gens: Sequence[Sequence[Generation]],
    advantages: np.ndarray,
    task_weights: np.ndarray,
    defined: np.ndarray,
    *,
    prompt_len: int,
    buckets: Sequence[int],
    pad_id: int,
    mesh: jax.sharding.Mesh | None = None,
    teacher_prompts: Sequence[Sequence[int] | None] | None = None,
    sd_coef: np.ndarray | None = None,
    teacher_prompt_len: int = 0,
) -> TrainBatch:
    """``gens[g][j]`` is rollout j of request g; ``advantages``/``defined`` are ``[G, J]``;
    ``task_weights`` [G] are the importance weights u. Rollouts with an undefined reward or an
    aborted generation get an all-zero loss mask (they carry no signal, and must not dilute a
    token-mean denominator either).

    Self-distillation (DESIGN §4–5): with ``teacher_prompts`` (per group, the token ids of the
    prompt with the privileged context, or None for a group without one) the teacher rows are
    that prompt left-padded to ``teacher_prompt_len`` followed by the student's own completion,
    so ``teacher_offset = teacher_prompt_len − prompt_len`` for every row. A group without
    context gets the student's prompt and ``sd_mask`` 0 (its SD term is exactly 0, RISED E.6);
    ``sd_coef`` [G] is λ per group."""
    g_n, j_n = len(gens), len(gens[0])
    b = g_n * j_n
    c_max = max(max((len(x.token_ids) for x in gs), default=0) for gs in gens)
    c = round_up_to_bucket(max(c_max, 1), tuple(buckets))
    t = prompt_len + c
    ids = np.full((b, t), pad_id, np.int32)
    attn = np.zeros((b, t), np.int32)
    loss_mask = np.zeros((b, t), np.float32)
    logps = np.zeros((b, t), np.float32)
    adv = np.zeros((b,), np.float32)
    seq_w = np.zeros((b,), np.float32)
    group = np.zeros((b,), np.int32)
    version = np.zeros((b,), np.int32)
    finish = np.zeros((b,), np.int32)
    for g, (req, gs) in enumerate(zip(requests, gens)):
        prompt = req.prompt_ids[-prompt_len:]
        for j, gen in enumerate(gs):
            r = g * j_n + j
            n = len(gen.token_ids)
            ids[r, prompt_len - len(prompt) : prompt_len] = prompt
            ids[r, prompt_len : prompt_len + n] = gen.token_ids
            attn[r, prompt_len - len(prompt) : prompt_len + n] = 1
            trainable = bool(defined[g, j]) and gen.finish_reason != "abort"
            if trainable and n:
                loss_mask[r, prompt_len - 1 : prompt_len - 1 + n] = 1.0
            logps[r, prompt_len - 1 : prompt_len - 1 + n] = gen.logprobs
            adv[r] = advantages[g, j]
            seq_w[r] = task_weights[g]
            group[r] = g
            version[r] = gen.weight_version
            finish[r] = FINISH_CODES[gen.finish_reason]
    positions = _positions(attn)
    teacher = {}
    if teacher_prompts is not None:
        teacher = _teacher_arrays(
            requests, gens, ids, attn, teacher_prompts, sd_coef, prompt_len, teacher_prompt_len,
            pad_id,
        )  # fmt: skip
    arrays = dict(
        input_ids=ids,
        positions=positions,
        attention_mask=attn,
        loss_mask=loss_mask,
        rollout_logps=logps,
        advantages=adv,
        seq_weights=seq_w,
        group_id=group,
        weight_version=version,
        finish_status=finish,
        **teacher,
    )
    if mesh is not None:
        sh = sharding.batch_sharding(mesh)
        arrays = {k: jax.device_put(v, sh) for k, v in arrays.items()}
    return TrainBatch(**arrays)


def mini_batches(
    batch: TrainBatch, n: int, rng: np.random.Generator, mesh: jax.sharding.Mesh
) -> Iterator[TrainBatch]:
    """``n`` disjoint mini-batches of ``batch`` that together hold every row once (verl's PPO
    mini-batches, GRPO's inner updates): a permutation from ``rng`` deals the rows out, each
    mini-batch keeps its rows in batch order. Yielded one at a time (one copy alive, not ``n``);
    the gather runs jitted on the global arrays, so it works on several hosts, and the result is
    sharded like a batch."""
    rows = batch.input_ids.shape[0]
    if n < 1 or rows % n:
        raise ValueError(f"mini_batches: {rows} rows do not split into {n} mini-batches")
    if n == 1:
        yield batch
        return
    parts = np.sort(rng.permutation(rows).reshape(n, rows // n), axis=1)
    take = _take(mesh)
    replicated = NamedSharding(mesh, P())
    for idx in parts:
        # Host data to device_put: every process holds the same indices (same rng).
        yield take(batch, jax.device_put(idx.astype(np.int32), replicated))


_TAKE: dict[jax.sharding.Mesh, object] = {}


def _take(mesh: jax.sharding.Mesh):
    if mesh not in _TAKE:
        _TAKE[mesh] = jax.jit(
            lambda b, idx: jax.tree.map(lambda x: x[idx], b),
            out_shardings=sharding.batch_sharding(mesh),
        )
    return _TAKE[mesh]


def _positions(attn: np.ndarray) -> np.ndarray:
    """Host-side ``models.qwen3.default_positions``: cumsum(mask) - 1, clipped at 0."""
    return np.maximum(np.cumsum(attn, axis=1) - 1, 0).astype(np.int32)


def _teacher_arrays(
    requests, gens, ids, attn, teacher_prompts, sd_coef, prompt_len: int, tp_len: int, pad_id: int
) -> dict[str, np.ndarray]:
    g_n, j_n = len(gens), len(gens[0])
    if len(teacher_prompts) != g_n:
        raise ValueError(f"teacher_prompts has {len(teacher_prompts)} entries for {g_n} groups")
    if tp_len < prompt_len:
        raise ValueError(f"teacher_prompt_len {tp_len} < the student's prompt_len {prompt_len}")
    coef = np.zeros(g_n) if sd_coef is None else np.asarray(sd_coef, np.float64)
    if coef.shape != (g_n,):
        raise ValueError(f"sd_coef must be [{g_n}], got {coef.shape}")
    b, t = ids.shape
    c = t - prompt_len
    t_ids = np.full((b, tp_len + c), pad_id, np.int32)
    t_attn = np.zeros((b, tp_len + c), np.int32)
    mask = np.zeros((b,), np.float32)
    lam = np.zeros((b,), np.float32)
    for g, (req, tp) in enumerate(zip(requests, teacher_prompts)):
        has = tp is not None
        prompt = list(tp if has else req.prompt_ids)[-tp_len:]
        for j in range(j_n):
            r = g * j_n + j
            t_ids[r, tp_len - len(prompt) : tp_len] = prompt
            t_attn[r, tp_len - len(prompt) : tp_len] = 1
            t_ids[r, tp_len:] = ids[r, prompt_len:]  # the student's own completion (and padding)
            t_attn[r, tp_len:] = attn[r, prompt_len:]
            mask[r] = float(has)
            lam[r] = float(coef[g]) if has else 0.0
    return dict(
        teacher_input_ids=t_ids,
        teacher_positions=_positions(t_attn),
        teacher_attention_mask=t_attn,
        teacher_offset=np.full((b,), tp_len - prompt_len, np.int32),
        sd_mask=mask,
        sd_coef=lam,
    )
