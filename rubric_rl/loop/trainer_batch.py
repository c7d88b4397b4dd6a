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
from rubric_rl.rollout.batch import Group, Rollouts, Trajectory
from rubric_rl.util.buckets import round_up_to_bucket

# Single-turn finish reasons and agent statuses (rollout/agent.py) share one code table.
FINISH_CODES = {"stop": 0, "length": 1, "abort": 2, "aborted": 2, "truncated": 3}
_NOT_TRAINED = ("abort", "aborted")


def batch_rows(rollouts: Rollouts) -> list[tuple[int, Group, Trajectory]]:
    """The rows of the step's TrainBatch: every trajectory of every selected group, in group
    order (a trajectory that is not trainable is a row with an all-zero loss mask)."""
    return [
        (g, group, t)
        for g, group in enumerate(rollouts.groups)
        if group.selected
        for t in group.trajectories
    ]


def build_train_batch(
    rollouts: Rollouts,
    *,
    prompt_len: int,
    buckets: Sequence[int],
    pad_id: int,
    mesh: jax.sharding.Mesh | None = None,
    teacher_prompt_len: int = 0,
    with_teacher: bool = False,
) -> TrainBatch:
    """Packs the selected groups' trajectories (``batch_rows``) into a ``TrainBatch``. Groups
    may differ in size. A row trains where ``Trajectory.loss_mask`` is 1 (all sampled tokens when
    None), and nowhere when it is not ``trainable`` (undefined reward) or was aborted: such rows
    carry no signal and must not dilute a token-mean denominator either.

    Self-distillation (DESIGN §4–5), ``with_teacher``: a trajectory's teacher row is its
    ``teacher_prompt_ids`` (the prompt with its privileged context) left-padded to
    ``teacher_prompt_len`` followed by the student's own completion, so ``teacher_offset =
    teacher_prompt_len − prompt_len`` on every row. A trajectory without a teacher prompt gets the
    student's prompt and SD mask 0 (its SD term is exactly 0, RISED E.6); ``sd_coef`` is its λ.
    ``sd_mask`` is ``[B]`` unless some trajectory has a per-token ``Trajectory.sd_mask`` (e.g.
    distil only the final turn), then ``[B, T]`` over its loss tokens."""
    rows = batch_rows(rollouts)
    if not rows:
        raise ValueError(f"step {rollouts.step}: no group is selected for training")
    b = len(rows)
    c_max = max(len(t.tokens) for _, _, t in rows)
    c = round_up_to_bucket(max(c_max, 1), tuple(buckets))
    t_len = prompt_len + c
    ids = np.full((b, t_len), pad_id, np.int32)
    attn = np.zeros((b, t_len), np.int32)
    loss_mask = np.zeros((b, t_len), np.float32)
    logps = np.zeros((b, t_len), np.float32)
    adv = np.zeros((b,), np.float32)
    seq_w = np.zeros((b,), np.float32)
    group = np.zeros((b,), np.int32)
    version = np.zeros((b,), np.int32)
    finish = np.zeros((b,), np.int32)
    for r, (g, grp, tr) in enumerate(rows):
        prompt = grp.prompt_ids[-prompt_len:]
        n = len(tr.tokens)
        ids[r, prompt_len - len(prompt) : prompt_len] = prompt
        ids[r, prompt_len : prompt_len + n] = tr.tokens
        attn[r, prompt_len - len(prompt) : prompt_len + n] = 1
        if tr.trainable and tr.finish_reason not in _NOT_TRAINED and n:
            loss_mask[r, prompt_len - 1 : prompt_len - 1 + n] = tr.model_mask()
        logps[r, prompt_len - 1 : prompt_len - 1 + n] = tr.logprobs
        adv[r] = tr.advantage
        seq_w[r] = grp.weight
        group[r] = g
        version[r] = tr.weight_version
        finish[r] = FINISH_CODES[tr.finish_reason]
    teacher = {}
    if with_teacher:
        teacher = _teacher_arrays(
            rows, ids, attn, loss_mask, prompt_len, teacher_prompt_len, pad_id
        )
    arrays = dict(
        input_ids=ids,
        positions=_positions(attn),
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
        # Every process holds the same global batch (same rollouts: the in-process engine is
        # deterministic, the SGLang engine samples on process 0 and broadcasts,
        # rollout/multihost.py), so each places its own copy of the global array;
        # `sharding.shard_batch` is for batches whose hosts hold different rows.
        sh = sharding.batch_sharding(mesh)
        arrays = {k: jax.device_put(v, sh) for k, v in arrays.items()}
    return TrainBatch(**arrays)


def rollouts_to_batch(rollouts: Rollouts, services, with_teacher: bool, mesh) -> TrainBatch:
    """The step's ``TrainBatch``: prompts padded to the smallest prompt bucket that fits, teacher
    prompts encoded (``model.max_teacher_prompt_len``) and bucketed likewise, at least as long as
    the student's."""
    rows = batch_rows(rollouts)
    check_rows(rollouts, len(rows), services.config, mesh)
    lengths = [len(g.prompt_ids) for _, g, _ in rows]
    tp: list[int] = []
    if with_teacher:
        for _, g, tr in rows:
            if tr.teacher_prompt is not None and tr.teacher_prompt_ids is None:
                what = f"teacher prompt of task {g.task.id}"
                tr.teacher_prompt_ids = services.encode_prompt(
                    tr.teacher_prompt, what, "max_teacher_prompt_len"
                )
            if tr.teacher_prompt_ids is not None:
                tp.append(len(tr.teacher_prompt_ids))
    return build_train_batch(
        rollouts,
        prompt_len=services.prompt_len(lengths),
        buckets=tuple(services.config.rollout.buckets),
        pad_id=int(services.tokenizer.pad_id or 0),
        mesh=mesh,
        with_teacher=with_teacher,
        teacher_prompt_len=services.prompt_len(tp + lengths, "max_teacher_prompt_len")
        if with_teacher
        else 0,
    )


def check_rows(rollouts: Rollouts, rows: int, config, mesh) -> None:
    """The selected groups are what ``rollout.train_groups`` promises, and their rows split
    over the mesh's batch shards, the mini-batches and the micro-batches (a method whose rounds
    make other batch sizes must choose sizes that do)."""
    k = int(config.rollout.train_groups)
    kept = len(rollouts.selected())
    if k and kept != k:
        raise ValueError(
            f"step {rollouts.step}: the select stage kept {kept} of {len(rollouts.groups)} groups, "
            f"config.rollout.train_groups={k}"
        )
    shards = 1 if mesh is None else int(mesh.shape["data"] * mesh.shape["fsdp"])
    o = config.optim
    unit = shards * int(o.mini_batches) * int(o.num_micro_batches)
    if rows % unit:
        raise ValueError(
            f"step {rollouts.step}: {rows} trained rows do not split into config.optim."
            f"mini_batches={o.mini_batches} x num_micro_batches={o.num_micro_batches} of "
            f"{shards} batch shards"
        )


def update_batches(
    tb: TrainBatch, step: int, seed: int, epochs: int, n_mini: int, mesh
) -> Iterator[TrainBatch]:
    """The optimizer updates of one RL step: ``optim.epochs`` passes over the batch, each dealt
    into ``optim.mini_batches`` mini-batches by a permutation seeded with (train.seed, step,
    epoch), so a resumed run replays the same updates."""
    for epoch in range(epochs):
        rng = np.random.default_rng([seed, step, epoch])
        yield from mini_batches(tb, n_mini, rng, mesh)


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
    rows, ids, attn, loss_mask, prompt_len: int, tp_len: int, pad_id: int
) -> dict[str, np.ndarray]:
    if tp_len < prompt_len:
        raise ValueError(f"teacher_prompt_len {tp_len} < the student's prompt_len {prompt_len}")
    b, t = ids.shape
    c = t - prompt_len
    t_ids = np.full((b, tp_len + c), pad_id, np.int32)
    t_attn = np.zeros((b, tp_len + c), np.int32)
    per_token = any(tr.sd_mask is not None for _, _, tr in rows)
    mask = np.zeros((b, t) if per_token else (b,), np.float32)
    lam = np.zeros((b,), np.float32)
    for r, (_, grp, tr) in enumerate(rows):
        has = tr.teacher_prompt_ids is not None
        prompt = list(tr.teacher_prompt_ids if has else grp.prompt_ids)
        if len(prompt) > tp_len:
            raise ValueError(
                f"teacher prompt of task {grp.task.id!r}: {len(prompt)} tokens > the teacher "
                f"prompt length {tp_len} (its completion would fall outside the teacher row)"
            )
        t_ids[r, tp_len - len(prompt) : tp_len] = prompt
        t_attn[r, tp_len - len(prompt) : tp_len] = 1
        t_ids[r, tp_len:] = ids[r, prompt_len:]  # the student's own completion (and padding)
        t_attn[r, tp_len:] = attn[r, prompt_len:]
        lam[r] = float(tr.sd_coef) if has else 0.0
        if not per_token:
            mask[r] = float(has)
        elif has:
            n = len(tr.tokens)
            sd = tr.sd_mask if tr.sd_mask is not None else (1,) * n
            mask[r, prompt_len - 1 : prompt_len - 1 + n] = sd
            mask[r] *= loss_mask[r] != 0
    return dict(
        teacher_input_ids=t_ids,
        teacher_positions=_positions(t_attn),
        teacher_attention_mask=t_attn,
        teacher_offset=np.full((b,), tp_len - prompt_len, np.int32),
        sd_mask=mask,
        sd_coef=lam,
    )
