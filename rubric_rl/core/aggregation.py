"""Loss aggregation: every loss returns ``(numerator_sum, denominator)``; the caller divides once.

Why a numerator/denominator pair: under gradient accumulation the step sums numerators and
denominators over all micro-batches of the global batch and divides ONCE
(``loss = Σ num / Σ den``, Tunix-style deferred reduction). Each mode below is defined so that this
is exactly the full-batch value.

Modes (names mean different things across repositories, so ours are defined here). ``L`` is the
per-token loss, ``m`` the loss mask (1 on tokens that count), ``u_b`` the per-sequence weight
(importance weight u = 1/(N p), selection weight; 1 when ``seq_weights`` is None):

- ``token-mean``: ``num = Σ_b u_b Σ_t m L``, ``den = Σ_b Σ_t m``. Every loss token of the global
  batch weighs the same. Exact under any micro-batch split (even one that cuts sequences).
- ``seq-mean-token-mean``: ``num = Σ_b u_b (Σ_t m L) / (Σ_t m)`` over sequences with ≥ 1 loss
  token, ``den`` = the number of such sequences. Every sequence weighs the same whatever its length.
  Exact when micro-batches split on sequence boundaries (the only split a batch of rows allows).
- ``seq-mean-token-sum``: ``num = Σ_b u_b Σ_t m L``, ``den`` = the number of sequences with ≥ 1 loss
  token. Exact when micro-batches split on sequence boundaries.
- ``dr-grpo`` (alias ``seq-mean-token-sum-norm``, verl's name): ``num = Σ_b u_b Σ_t m L``,
  ``den = B · constant`` where B counts every row of the batch (a fully masked row, e.g. one vetoed
  by rollout correction, still counts: the normaliser must not depend on the data) and ``constant``
  is fixed by config (Dr.GRPO uses the maximum response length). It depends on neither the padding
  length T nor the lengths of the responses. Do not pad the batch dimension with dummy rows in this
  mode (they would count in B).

Metrics follow one convention so they combine across micro-batches without bias: every value is a
scalar under a key ending in ``/sum``, ``/count``, ``/max`` or ``/min``. ``combine_metrics`` adds
sums and counts and takes max/min; ``finalize_metrics`` turns ``x/sum`` + ``x/count`` into the mean
``x`` (NaN when the count is 0) once, after the last micro-batch.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import jax.numpy as jnp

from rubric_rl.util.registry import Registry

Aggregator = Callable[..., tuple[jnp.ndarray, jnp.ndarray]]
AGGREGATORS: Registry[Aggregator] = Registry("aggregation mode")


def _weighted_token_sums(per_token, mask, seq_weights):
    """Per-sequence ``Σ_t m L`` and ``Σ_t m``; ``where`` keeps an inf/NaN at a masked slot out."""
    m = mask.astype(per_token.dtype)
    token_sum = jnp.sum(jnp.where(m != 0, per_token * m, 0.0), axis=-1)
    token_count = jnp.sum(m, axis=-1)
    if seq_weights is not None:
        token_sum = token_sum * seq_weights.astype(per_token.dtype)
    return token_sum, token_count


@AGGREGATORS.register("token-mean")
def _token_mean(per_token, mask, seq_weights, constant):
    token_sum, token_count = _weighted_token_sums(per_token, mask, seq_weights)
    return jnp.sum(token_sum), jnp.sum(token_count)


@AGGREGATORS.register("seq-mean-token-mean")
def _seq_mean_token_mean(per_token, mask, seq_weights, constant):
    token_sum, token_count = _weighted_token_sums(per_token, mask, seq_weights)
    has_tokens = token_count > 0
    seq_mean = jnp.where(has_tokens, token_sum / jnp.where(has_tokens, token_count, 1.0), 0.0)
    return jnp.sum(seq_mean), jnp.sum(has_tokens.astype(per_token.dtype))


@AGGREGATORS.register("seq-mean-token-sum")
def _seq_mean_token_sum(per_token, mask, seq_weights, constant):
    token_sum, token_count = _weighted_token_sums(per_token, mask, seq_weights)
    return jnp.sum(token_sum), jnp.sum((token_count > 0).astype(per_token.dtype))


def _dr_grpo(per_token, mask, seq_weights, constant):
    if constant is None or not constant > 0:
        raise ValueError(
            f"aggregation mode 'dr-grpo' needs a positive constant (e.g. the maximum response "
            f"length, config loss.agg_constant); got {constant!r}"
        )
    token_sum, _ = _weighted_token_sums(per_token, mask, seq_weights)
    num_rows = per_token.shape[0]
    return jnp.sum(token_sum), jnp.asarray(num_rows * float(constant), per_token.dtype)


AGGREGATORS.register("dr-grpo")(_dr_grpo)
AGGREGATORS.register("seq-mean-token-sum-norm")(_dr_grpo)


def aggregate(
    per_token: jnp.ndarray,
    mask: jnp.ndarray,
    *,
    mode: str,
    seq_weights: jnp.ndarray | None = None,
    constant: float | None = None,
) -> tuple[jnp.ndarray, jnp.ndarray]:
    """Reduce a per-token loss ``[B, T]`` to ``(num, den)`` under ``mode`` (see module docstring).

    ``mask`` is ``[B, T]`` (bool or float; float masks weight tokens), ``seq_weights`` ``[B]``
    multiplies each sequence's contribution to ``num`` only. The caller divides
    ``Σ num / Σ den`` over all micro-batches, once.
    """
    if per_token.ndim != 2 or per_token.shape != mask.shape:
        raise ValueError(
            f"aggregate: per_token and mask must both be [B, T]; got {per_token.shape} and "
            f"{mask.shape}"
        )
    if seq_weights is not None and seq_weights.shape != per_token.shape[:1]:
        raise ValueError(
            f"aggregate: seq_weights must be [B]={per_token.shape[:1]}; got {seq_weights.shape}"
        )
    per_token = jnp.asarray(per_token)
    if not jnp.issubdtype(per_token.dtype, jnp.floating):
        per_token = per_token.astype(jnp.float32)
    return AGGREGATORS.get(mode)(per_token, mask, seq_weights, constant)


# ----------------------------------------------------------------------------- metrics convention

_SUFFIXES = ("/sum", "/count", "/max", "/min")


def masked_mean_parts(name: str, values: jnp.ndarray, mask: jnp.ndarray) -> dict[str, jnp.ndarray]:
    """``{name/sum, name/count}`` over positions where ``mask`` is non-zero (counted as 1 each)."""
    on = mask != 0
    values = values.astype(jnp.float32)
    return {
        f"{name}/sum": jnp.sum(jnp.where(on, values, 0.0)),
        f"{name}/count": jnp.sum(on.astype(jnp.float32)),
    }


def masked_max_part(name: str, values: jnp.ndarray, mask: jnp.ndarray) -> dict[str, jnp.ndarray]:
    """``{name/max}`` over positions where ``mask`` is non-zero; ``-inf`` when there are none."""
    return {f"{name}/max": jnp.max(jnp.where(mask != 0, values.astype(jnp.float32), -jnp.inf))}


def _check_key(key: str) -> None:
    if not key.endswith(_SUFFIXES):
        raise ValueError(f"metric key {key!r} must end with one of {_SUFFIXES}")


def combine_metrics(
    a: Mapping[str, jnp.ndarray], b: Mapping[str, jnp.ndarray]
) -> dict[str, jnp.ndarray]:
    """Merge two micro-batches' metrics: add ``/sum``, ``/count``; max ``/max``; min ``/min``."""
    out = dict(a)
    for key, value in b.items():
        _check_key(key)
        if key not in out:
            out[key] = value
        elif key.endswith("/max"):
            out[key] = jnp.maximum(out[key], value)
        elif key.endswith("/min"):
            out[key] = jnp.minimum(out[key], value)
        else:
            out[key] = out[key] + value
    return out


def finalize_metrics(metrics: Mapping[str, jnp.ndarray]) -> dict[str, jnp.ndarray]:
    """``x/sum`` ÷ ``x/count`` → ``x`` (NaN if count is 0); ``x/max``, ``x/min`` kept (±inf → NaN).

    A ``/sum`` without its ``/count`` (or a bare ``/count``) is kept as a total under its key.
    """
    out: dict[str, jnp.ndarray] = {}
    for key, value in metrics.items():
        _check_key(key)
        if key.endswith("/sum"):
            name = key[: -len("/sum")]
            count = metrics.get(f"{name}/count")
            if count is None:
                out[key] = value
            else:
                out[name] = jnp.where(count > 0, value / jnp.where(count > 0, count, 1.0), jnp.nan)
        elif key.endswith(("/max", "/min")):
            out[key] = jnp.where(jnp.isfinite(value), value, jnp.nan)
        elif f"{key[: -len('/count')]}/sum" not in metrics:
            out[key] = value  # a bare count (e.g. tokens seen) is a total
    return out
