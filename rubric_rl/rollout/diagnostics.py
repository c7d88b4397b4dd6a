"""Engine-vs-trainer log-prob mismatch: the numbers that choose the IS-filtering preset.

An engine's behaviour log-probs (``π_engine``) and the trainer's recomputation on the same tokens
(``π_trainer``, `rubric_rl.core.logprobs`) should agree; where they do not (bf16 servers, kernels,
a different temperature or top-p) the importance ratio ``r = π_trainer / π_engine`` departs from 1
and rollout correction (truncated / masked IS) has to absorb it. `mismatch_report` summarises
``Δ = log π_trainer − log π_engine`` over the loss-mask tokens; `rescore_generations` /
`rescore_trajectories` compute the trainer side with the trainer's own code and return the report.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from rubric_rl.core.logprobs import sequence_logprobs
from rubric_rl.models.qwen3 import default_positions
from rubric_rl.rollout.engine import Generation, GenerationRequest

DEFAULT_THRESHOLDS: tuple[float, ...] = (1e-4, 1e-3, 1e-2, 1e-1, 1.0)


def _as_2d(x: Any, name: str) -> np.ndarray:
    a = np.asarray(x, dtype=np.float64)
    if a.ndim == 1:
        a = a[None]
    if a.ndim != 2:
        raise ValueError(f"mismatch_report: {name} must be [B, T] or [T], got shape {a.shape}")
    return a


def mismatch_report(
    engine_logps: Any,
    trainer_logps: Any,
    mask: Any,
    *,
    thresholds: Sequence[float] = DEFAULT_THRESHOLDS,
) -> dict[str, Any]:
    """Summary of ``Δ = trainer − engine`` on the tokens where ``mask > 0``.

    Inputs are [B, T] (rows = sequences) or [T]. Keys: ``num_tokens``, ``num_sequences`` (rows
    with at least one token); ``mean_abs_diff``, ``max_abs_diff``, ``mean_diff`` (signed),
    ``correlation`` (Pearson between the two log-prob vectors; None with < 2 tokens or zero
    variance); ``frac_abs_diff_gt_{t:g}`` per threshold; token importance ratio ``exp(Δ)``:
    ``ratio_min`` / ``ratio_max``; ``kl_k3`` = mean(exp(Δ) − 1 − Δ) (estimates
    KL(π_engine ‖ π_trainer) from engine samples, Schulman's k3); sequence level
    ``seq_abs_log_ratio_mean`` / ``seq_abs_log_ratio_max`` = |Σ_t Δ| per row. Statistics of an
    empty selection are None.
    """
    e, t, m = _as_2d(engine_logps, "engine_logps"), _as_2d(trainer_logps, "trainer_logps"), None
    m = _as_2d(mask, "mask") > 0
    if not e.shape == t.shape == m.shape:
        raise ValueError(
            f"mismatch_report: shapes differ: engine {e.shape}, trainer {t.shape}, mask {m.shape}"
        )
    for name, a in (("engine_logps", e), ("trainer_logps", t)):
        bad = m & ~np.isfinite(a)
        if bad.any():
            row, col = map(int, np.argwhere(bad)[0])
            raise ValueError(f"mismatch_report: {name}[{row}, {col}] is not finite ({a[row, col]})")
    ev, tv = e[m], t[m]
    d = tv - ev
    n = int(d.size)
    rows = m.any(axis=1)
    out: dict[str, Any] = {"num_tokens": n, "num_sequences": int(rows.sum())}
    if n == 0:
        out.update(
            mean_abs_diff=None, max_abs_diff=None, mean_diff=None, correlation=None,
            ratio_min=None, ratio_max=None, kl_k3=None,
            seq_abs_log_ratio_mean=None, seq_abs_log_ratio_max=None,
        )  # fmt: skip
        out.update({f"frac_abs_diff_gt_{thr:g}": None for thr in thresholds})
        return out
    ad = np.abs(d)
    corr = None
    if n >= 2 and ev.std() > 0 and tv.std() > 0:
        corr = float(np.corrcoef(ev, tv)[0, 1])
    seq = np.abs(np.where(m, t - e, 0.0).sum(axis=1))[rows]
    out.update(
        mean_abs_diff=float(ad.mean()),
        max_abs_diff=float(ad.max()),
        mean_diff=float(d.mean()),
        correlation=corr,
        ratio_min=float(np.exp(d.min())),
        ratio_max=float(np.exp(d.max())),
        kl_k3=float(np.mean(np.expm1(d) - d)),
        seq_abs_log_ratio_mean=float(seq.mean()),
        seq_abs_log_ratio_max=float(seq.max()),
    )
    out.update({f"frac_abs_diff_gt_{thr:g}": float((ad > thr).mean()) for thr in thresholds})
    return out


# ----------------------------------------------------------------------------- trainer side


@functools.partial(jax.jit, static_argnames=("graphdef", "temperature", "chunk_size"))
def _trainer_logps(graphdef, params, rest, ids, mask, *, temperature: float, chunk_size: int):
    model = nnx.merge(graphdef, params, rest)
    logps, _ = sequence_logprobs(
        model,
        ids,
        default_positions(ids, mask),
        mask,
        temperature=temperature,
        chunk_size=chunk_size,
    )
    return logps


def trainer_token_logprobs(
    model: nnx.Module,
    sequences: Sequence[Sequence[int]],
    *,
    temperature: float = 1.0,
    chunk_size: int = 128,
    pad_id: int = 0,
) -> list[np.ndarray]:
    """The trainer's log-probs (``core.logprobs.sequence_logprobs``) of whole token sequences,
    token-indexed: ``out[i][k] = log softmax(logits/T)[seq[k]]`` given ``seq[:k]``; ``out[i][0]
    = 0``. Rows are right-padded to a multiple of 64 (fewer shapes to compile).
    ``model`` may also be a `JaxEngine` (its current parameters are used)."""
    if hasattr(model, "model") and callable(model.model) and not isinstance(model, nnx.Module):
        model = model.model()
    if temperature <= 0:
        temperature = 1.0  # greedy rollouts carry T = 1 log-probs (engine.py)
    if not sequences:
        return []
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    t = 64 * math.ceil(max(len(s) for s in sequences) / 64)
    b = 8 * math.ceil(len(sequences) / 8)
    ids = np.full((b, t), pad_id, np.int32)
    mask = np.zeros((b, t), np.int32)
    mask[:, 0] = 1
    for i, s in enumerate(sequences):
        ids[i, : len(s)] = s
        mask[i, : len(s)] = 1
    lp = np.asarray(
        _trainer_logps(
            graphdef,
            params,
            rest,
            jnp.asarray(ids),
            jnp.asarray(mask),
            temperature=float(temperature),
            chunk_size=chunk_size,
        )
    )
    # prediction layout -> token layout: token k's log-prob sits at position k - 1
    return [np.concatenate([[0.0], lp[i, : len(s) - 1]]) for i, s in enumerate(sequences)]


def _rows(seqs, engine_lps, masks, trainer_lps):
    t = max(len(s) for s in seqs)
    shape = (len(seqs), t)
    e, tr, m = np.zeros(shape), np.zeros(shape), np.zeros(shape)
    for i, s in enumerate(seqs):
        n = len(s)
        e[i, :n], tr[i, :n], m[i, :n] = engine_lps[i], trainer_lps[i], masks[i]
    return e, tr, m


def rescore_generations(
    model: nnx.Module,
    requests: Sequence[GenerationRequest],
    generations: Sequence[Sequence[Generation]],
    *,
    temperature: float,
    thresholds: Sequence[float] = DEFAULT_THRESHOLDS,
    chunk_size: int = 128,
) -> dict[str, Any]:
    """Re-scores an engine's ``generate`` output (any engine) with the trainer's log-prob code at
    the sampling ``temperature`` and returns `mismatch_report` over the generated tokens."""
    seqs, e, masks = [], [], []
    for req, gens in zip(requests, generations, strict=True):
        for g in gens:
            p, c = len(req.prompt_ids), len(g.token_ids)
            seqs.append(list(req.prompt_ids) + list(g.token_ids))
            e.append([0.0] * p + list(g.logprobs))
            masks.append([0] * p + [1] * c)
    if not seqs:
        return mismatch_report(np.zeros((0, 0)), np.zeros((0, 0)), np.zeros((0, 0)))
    tr = trainer_token_logprobs(model, seqs, temperature=temperature, chunk_size=chunk_size)
    return mismatch_report(*_rows(seqs, e, masks, tr), thresholds=thresholds)


def rescore_trajectories(
    model: nnx.Module,
    trajectories: Sequence[Any],
    *,
    temperature: float,
    thresholds: Sequence[float] = DEFAULT_THRESHOLDS,
    chunk_size: int = 128,
) -> dict[str, Any]:
    """`rescore_generations` for multi-turn `agent.Trajectory`s (their loss-mask tokens)."""
    trajs = [t for t in trajectories if t.token_ids]
    if not trajs:
        return mismatch_report(np.zeros((0, 0)), np.zeros((0, 0)), np.zeros((0, 0)))
    seqs = [list(t.token_ids) for t in trajs]
    tr = trainer_token_logprobs(model, seqs, temperature=temperature, chunk_size=chunk_size)
    return mismatch_report(
        *_rows(seqs, [t.logprobs for t in trajs], [t.loss_mask for t in trajs], tr),
        thresholds=thresholds,
    )
