"""Gated DeltaNet: the linear-attention layer of Qwen3.5's hybrid text stack, in JAX / Flax NNX.

Reference: `transformers` 5.24 `models/qwen3_5/modeling_qwen3_5.py` (`Qwen3_5GatedDeltaNet`,
`torch_chunk_gated_delta_rule`, `torch_recurrent_gated_delta_rule`, `causal_conv1d_fn/_update`);
Yang, Kautz & Hatamizadeh, "Gated Delta Networks" (2024).

The gated delta rule, per value head, with state S ∈ R^{dk×dv} (keys index rows):
    S_t = exp(g_t)·S_{t-1}
    S_t = S_t + k_t ⊗ β_t (v_t − S_tᵀ k_t)          (delta rule on the decayed state)
    o_t = S_tᵀ q_t,   q_t already scaled by dk^-1/2 (and q, k L2-normalised in Qwen3.5)
with g_t ≤ 0 the log decay and β_t ∈ (0, 1) the write strength.

Three forms of it, all float32 inside whatever the input dtype:
  `recurrent_gated_delta_rule` — lax.scan over time (the plain definition);
  `gated_delta_step`           — one token (decode);
  `chunk_gated_delta_rule`     — chunks of C tokens: within a chunk the C updates are folded into
      one unit-lower-triangular solve (the UT transform / WY representation of the product of
      Householder-like factors), across chunks a lax.scan carries S. O(T·C·d + T·d²) work and
      matmul-shaped; the form for training and prefill.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from rubric_rl.models.qwen3 import Dense

__all__ = [
    "GatedDeltaNet",
    "GatedDeltaNetCache",
    "GatedDeltaNetConfig",
    "causal_conv1d",
    "causal_conv1d_step",
    "chunk_gated_delta_rule",
    "gated_delta_step",
    "gated_rms_norm",
    "hf_to_nnx_params",
    "l2_normalize",
    "load_hf_weights",
    "recurrent_gated_delta_rule",
]

Array = jax.Array


# ----------------------------------------------------------------------------- the rule


def l2_normalize(x: Array, eps: float = 1e-6) -> Array:
    """x·rsqrt(Σx² + eps) over the last axis (the FLA / transformers `l2norm`, eps inside)."""
    return x * jax.lax.rsqrt(jnp.sum(x * x, axis=-1, keepdims=True) + eps)


def _check_rule_inputs(name, q, k, v, g, beta, initial_state):
    if q.ndim != 4 or k.ndim != 4 or v.ndim != 4:
        raise ValueError(
            f"{name}: q, k [B, T, Hk, dk] and v [B, T, Hv, dv] must be 4-D; got "
            f"q {q.shape}, k {k.shape}, v {v.shape}"
        )
    b, t, hk, dk = k.shape
    hv, dv = v.shape[2:]
    if q.shape != k.shape:
        raise ValueError(f"{name}: q {q.shape} and k {k.shape} must have the same shape")
    if v.shape[:2] != (b, t):
        raise ValueError(f"{name}: v {v.shape} must share [B, T] = {(b, t)} with k")
    if hv % hk:
        raise ValueError(
            f"{name}: value heads ({hv}) must be a multiple of key heads ({hk}); each key head "
            "serves Hv/Hk consecutive value heads"
        )
    for arr, label in ((g, "g"), (beta, "beta")):
        if arr.shape != (b, t, hv):
            raise ValueError(f"{name}: {label} {arr.shape} must be [B, T, Hv] = {(b, t, hv)}")
    if initial_state is not None and initial_state.shape != (b, hv, dk, dv):
        raise ValueError(
            f"{name}: initial_state {initial_state.shape} must be [B, Hv, dk, dv] = "
            f"{(b, hv, dk, dv)}"
        )


def _prepare(q, k, v, g, beta, use_qk_l2norm):
    """Heads-major float32 [B, Hv, T, ·]; k heads repeated to the value heads; q scaled."""
    hk, hv = k.shape[2], v.shape[2]
    if hv != hk:  # transformers: repeat_interleave — key head j serves value heads j·r … j·r+r-1
        q = jnp.repeat(q, hv // hk, axis=2)
        k = jnp.repeat(k, hv // hk, axis=2)
    q, k, v = (x.astype(jnp.float32).transpose(0, 2, 1, 3) for x in (q, k, v))
    g, beta = (x.astype(jnp.float32).transpose(0, 2, 1) for x in (g, beta))
    if use_qk_l2norm:
        q, k = l2_normalize(q), l2_normalize(k)
    q = q * (q.shape[-1] ** -0.5)
    return q, k, v, g, beta


def _zero_state(v: Array, dk: int) -> Array:
    b, _, hv, dv = v.shape
    return jnp.zeros((b, hv, dk, dv), jnp.float32)


def _delta_step(state, q, k, v, g, beta):
    """One prepared token: state [B, H, dk, dv]; q, k [B, H, dk]; v [B, H, dv]; g, beta [B, H]."""
    state = state * jnp.exp(g)[..., None, None]
    predicted = jnp.einsum("bhkv,bhk->bhv", state, k)
    state = state + k[..., :, None] * (beta[..., None] * (v - predicted))[..., None, :]
    return state, jnp.einsum("bhkv,bhk->bhv", state, q)


def recurrent_gated_delta_rule(
    q: Array,
    k: Array,
    v: Array,
    g: Array,
    beta: Array,
    initial_state: Array | None = None,
    *,
    use_qk_l2norm: bool = False,
) -> tuple[Array, Array]:
    """The gated delta rule token by token (lax.scan over T).

    q, k [B, T, Hk, dk]; v [B, T, Hv, dv]; g (log decay, ≤ 0), beta [B, T, Hv];
    initial_state [B, Hv, dk, dv] (default zeros). use_qk_l2norm: L2-normalise q and k first (in
    float32; Qwen3.5 does). q is always scaled by dk^-1/2.
    Returns (outputs [B, T, Hv, dv] in v.dtype, final state [B, Hv, dk, dv] float32).
    """
    _check_rule_inputs("recurrent_gated_delta_rule", q, k, v, g, beta, initial_state)
    out_dtype = v.dtype
    state = _zero_state(v, k.shape[-1]) if initial_state is None else initial_state
    qp, kp, vp, gp, bp = _prepare(q, k, v, g, beta, use_qk_l2norm)
    xs = tuple(jnp.moveaxis(x, 2, 0) for x in (qp, kp, vp, gp, bp))  # time leading

    def step(s, x):
        return _delta_step(s, *x)

    state, out = jax.lax.scan(step, state.astype(jnp.float32), xs)
    return jnp.moveaxis(out, 0, 1).astype(out_dtype), state  # [T, B, H, dv] -> [B, T, H, dv]


def gated_delta_step(
    state: Array,
    q: Array,
    k: Array,
    v: Array,
    g: Array,
    beta: Array,
    *,
    use_qk_l2norm: bool = False,
) -> tuple[Array, Array]:
    """One decode token: state [B, Hv, dk, dv]; q, k [B, Hk, dk]; v [B, Hv, dv]; g, beta [B, Hv].

    Returns (output [B, Hv, dv] in v.dtype, new state float32) — `recurrent_gated_delta_rule` with
    T = 1.
    """
    if q.ndim != 3 or v.ndim != 3 or g.ndim != 2 or beta.ndim != 2:
        raise ValueError(
            f"gated_delta_step: one token per row — q, k [B, Hk, dk], v [B, Hv, dv], g, beta "
            f"[B, Hv]; got q {q.shape}, v {v.shape}, g {g.shape}, beta {beta.shape}"
        )
    out, state = recurrent_gated_delta_rule(
        q[:, None],
        k[:, None],
        v[:, None],
        g[:, None],
        beta[:, None],
        state,
        use_qk_l2norm=use_qk_l2norm,
    )
    return out[:, 0], state


def _forward_substitution(strict: Array, rhs: Array) -> Array:
    """X with (I + strict) X = rhs by forward substitution, one row per ``fori_loop`` step."""
    c = strict.shape[-1]
    cols = jnp.arange(c)

    def row(i, x):
        a_i = jnp.where(cols < i, jax.lax.dynamic_index_in_dim(strict, i, -2, keepdims=False), 0)
        b_i = jax.lax.dynamic_index_in_dim(rhs, i, -2, keepdims=False)
        x_i = b_i - jnp.einsum("...j,...jd->...d", a_i, x)
        return jax.lax.dynamic_update_index_in_dim(x, x_i, i, -2)

    return jax.lax.fori_loop(0, c, row, jnp.zeros_like(rhs))


# "custom": `solve_unit_lower`'s hand-written backward; "autodiff": jax differentiates the loop
# (the carry kept at every step; what benchmarks/aot_fit.py --before compiles).
SOLVE_BACKWARD = "custom"


@jax.custom_vjp
def solve_unit_lower(strict: Array, rhs: Array) -> Array:
    """X with (I + strict) X = rhs, ``strict`` strictly lower-triangular [..., C, C] (its
    diagonal and upper triangle are ignored), ``rhs`` [..., C, D]: forward substitution,
    x_i = rhs_i − Σ_{j<i} strict_ij x_j, one row per step of a ``fori_loop`` (the row order of
    transformers' torch rule).

    Not ``lax.linalg.triangular_solve``: on XLA:CPU that is a LAPACK custom call which, with the
    batch sharded over several host devices (``--xla_force_host_platform_device_count``), hung
    about every other run on a 2-core machine (a sharded forward of a Qwen3.5 model: 3 of 3 runs
    hung at T = 64, 0 of 4 with this loop). Plain matmuls partition like every other op.

    Backward by hand (custom VJP): differentiating the loop would keep its [..., C, D] carry at
    every one of its C steps (C× the solution: 8 GiB per Qwen3.5-4B layer at 2 × 2048 tokens
    per device). With A = I + strict and X = A⁻¹ rhs: d rhs = A⁻ᵀ dX (one more substitution,
    on the reversed rows) and d strict = −strict_lower(d rhs · Xᵀ); only ``strict`` and X are
    kept."""
    return _forward_substitution(strict, rhs)


def _solve_fwd(strict: Array, rhs: Array) -> tuple[Array, tuple[Array, Array]]:
    x = _forward_substitution(strict, rhs)
    return x, (strict, x)


def _solve_bwd(res: tuple[Array, Array], dx: Array) -> tuple[Array, Array]:
    strict, x = res
    # Aᵀ is unit upper-triangular; reversing rows and columns makes it unit lower-triangular:
    # (I + strict)ᵀ Y = dX  ⇔  (I + R strictᵀ R)(R Y) = R dX, R the row reversal.
    flipped = jnp.flip(jnp.swapaxes(strict, -1, -2), (-2, -1))
    d_rhs = jnp.flip(_forward_substitution(flipped, jnp.flip(dx, -2)), -2)
    c = strict.shape[-1]
    below = jnp.tril(jnp.ones((c, c), bool), -1)
    d_strict = jnp.where(below, -jnp.einsum("...id,...jd->...ij", d_rhs, x), 0).astype(strict.dtype)
    return d_strict, d_rhs.astype(x.dtype)


solve_unit_lower.defvjp(_solve_fwd, _solve_bwd)


def chunk_gated_delta_rule(
    q: Array,
    k: Array,
    v: Array,
    g: Array,
    beta: Array,
    initial_state: Array | None = None,
    *,
    chunk_size: int = 64,
    use_qk_l2norm: bool = False,
) -> tuple[Array, Array]:
    """The gated delta rule in chunks: parallel within a chunk, lax.scan across chunks.

    Same arguments and results as `recurrent_gated_delta_rule`, plus `chunk_size` (any positive
    int; T need not be a multiple: the tail is padded with k = v = q = 0, g = β = 0, steps that
    leave the state unchanged, and the padded outputs are dropped). All arithmetic is float32.

    Within a chunk (positions i, j; γ_i = Σ_{s≤i} g_s the cumulative log decay, D_ij =
    exp(γ_i − γ_j) for j ≤ i else 0; S the state entering the chunk):
      A = I + strict_lower((β_i k_i·k_j) D_ij)             (unit lower triangular)
      U = A⁻¹ (β v),  W = A⁻¹ (β exp(γ) k)                  (the UT transform)
      V' = U − W S                                          (what S does not already predict)
      O  = (exp(γ) q) S + ((q kᵀ) ⊙ D) V'
      S' = exp(γ_C) S + (exp(γ_C − γ) k)ᵀ V'
    """
    if not isinstance(chunk_size, int) or isinstance(chunk_size, bool) or chunk_size < 1:
        raise ValueError(
            f"chunk_gated_delta_rule: chunk_size must be a positive int, got {chunk_size!r}"
        )
    _check_rule_inputs("chunk_gated_delta_rule", q, k, v, g, beta, initial_state)
    out_dtype = v.dtype
    b, t, _, dk = k.shape
    state = _zero_state(v, dk) if initial_state is None else initial_state.astype(jnp.float32)
    q, k, v, g, beta = _prepare(q, k, v, g, beta, use_qk_l2norm)
    h, dv = v.shape[1], v.shape[-1]
    c = chunk_size
    pad = -t % c
    if pad:
        q, k, v = (jnp.pad(x, ((0, 0), (0, 0), (0, pad), (0, 0))) for x in (q, k, v))
        g, beta = (jnp.pad(x, ((0, 0), (0, 0), (0, pad))) for x in (g, beta))
    n = (t + pad) // c
    q, k, v = (x.reshape(b, h, n, c, x.shape[-1]) for x in (q, k, v))
    g, beta = (x.reshape(b, h, n, c) for x in (g, beta))

    # Intra-chunk quantities, all chunks at once.
    gamma = jnp.cumsum(g, axis=-1)  # [B, H, N, C]
    lower = jnp.tril(jnp.ones((c, c), bool))
    # `where` before exp: the upper triangle would be exp(positive) — overflow, and NaN gradients.
    diff = jnp.where(lower, gamma[..., :, None] - gamma[..., None, :], -jnp.inf)
    decay = jnp.exp(diff)  # D [B, H, N, C, C], 0 above the diagonal
    k_beta = k * beta[..., None]
    strict = jnp.einsum("...id,...jd->...ij", k_beta, k) * decay * (~jnp.eye(c, dtype=bool))
    rhs = jnp.concatenate([v * beta[..., None], k_beta * jnp.exp(gamma)[..., None]], axis=-1)
    solve = solve_unit_lower if SOLVE_BACKWARD == "custom" else _forward_substitution
    solved = solve(strict, rhs)  # A⁻¹ rhs, A = I + strict
    u, w = solved[..., :dv], solved[..., dv:]
    attn = jnp.einsum("...id,...jd->...ij", q, k) * decay  # [B, H, N, C, C]
    q_decayed = q * jnp.exp(gamma)[..., None]
    gamma_last = gamma[..., -1:]  # [B, H, N, 1]
    k_to_end = k * jnp.exp(gamma_last - gamma)[..., None]
    chunk_decay = jnp.exp(gamma_last)[..., None]  # [B, H, N, 1, 1]

    def across(s, xs):
        u_i, w_i, attn_i, qd_i, ke_i, cd_i = xs
        v_new = u_i - jnp.einsum("bhck,bhkv->bhcv", w_i, s)
        o = jnp.einsum("bhck,bhkv->bhcv", qd_i, s) + jnp.einsum("bhij,bhjv->bhiv", attn_i, v_new)
        s = s * cd_i + jnp.einsum("bhck,bhcv->bhkv", ke_i, v_new)
        return s, o

    xs = tuple(
        jnp.moveaxis(x, 2, 0) for x in (u, w, attn, q_decayed, k_to_end, chunk_decay)
    )  # chunk axis leading
    state, out = jax.lax.scan(across, state, xs)  # out [N, B, H, C, dv]
    out = out.transpose(1, 0, 3, 2, 4).reshape(b, n * c, h, dv)[:, :t]
    return out.astype(out_dtype), state


# ----------------------------------------------------------------------------- convolution


def _check_conv(name, x, kernel, conv_state):
    if kernel.ndim != 2 or x.shape[-1] != kernel.shape[1]:
        raise ValueError(
            f"{name}: kernel must be [K, C] with C = x.shape[-1] = {x.shape[-1]}; got "
            f"kernel {kernel.shape}"
        )
    kk = kernel.shape[0]
    if conv_state is not None and conv_state.shape != (x.shape[0], kk - 1, x.shape[-1]):
        raise ValueError(
            f"{name}: conv_state {conv_state.shape} must be [B, K-1, C] = "
            f"{(x.shape[0], kk - 1, x.shape[-1])}"
        )


def causal_conv1d(
    x: Array, kernel: Array, conv_state: Array | None = None, mask: Array | None = None
) -> tuple[Array, Array]:
    """Causal depthwise convolution over time: out_t = Σ_j kernel[j]·x_{t-K+1+j} (per channel).

    x [B, T, C]; kernel [K, C] (transformers' conv1d.weight [C, 1, K], transposed); conv_state
    [B, K-1, C], the K-1 inputs before x (default zeros: the sequence starts here); mask [B, T]
    (1 = real token). Padding: inputs at mask-0 positions are zeroed before the convolution, so a
    padded position never reaches a later token (transformers zeroes padded hidden states before
    the projections, which has the same effect on a bias-free projection).
    Returns (out [B, T, C] in x.dtype, computed in float32; new conv state [B, K-1, C]: the K-1
    inputs ending at each row's last real token, so right-padded rows continue from their last
    real token; a row with no real token keeps its old state).
    """
    if x.ndim != 3:
        raise ValueError(f"causal_conv1d: x must be [B, T, C], got {x.shape}")
    _check_conv("causal_conv1d", x, kernel, conv_state)
    b, t, ch = x.shape
    kk = kernel.shape[0]
    if mask is not None:
        if mask.shape != (b, t):
            raise ValueError(f"causal_conv1d: mask {mask.shape} must be [B, T] = {(b, t)}")
        x = jnp.where(mask[..., None] > 0, x, jnp.zeros((), x.dtype))
    if conv_state is None:
        conv_state = jnp.zeros((b, kk - 1, ch), x.dtype)
    xs = jnp.concatenate([conv_state.astype(x.dtype), x], axis=1)  # [B, K-1+T, C]
    w = kernel.astype(jnp.float32)
    out = sum(xs[:, j : j + t].astype(jnp.float32) * w[j] for j in range(kk))
    if mask is None:
        last = jnp.full((b,), t - 1, jnp.int32)
    else:  # index of each row's last real token, -1 if none
        pos = jnp.arange(t, dtype=jnp.int32)
        last = jnp.max(jnp.where(mask > 0, pos, -1), axis=1)
    # x index i is xs index i + K-1; inputs i = last-K+2 … last are xs[last+1 : last+K].
    new_state = jax.vmap(lambda row, s: jax.lax.dynamic_slice_in_dim(row, s, kk - 1, axis=0))(
        xs, last + 1
    )
    return out.astype(x.dtype), new_state


def causal_conv1d_step(x: Array, conv_state: Array, kernel: Array) -> tuple[Array, Array]:
    """One decode token of `causal_conv1d`: x [B, C]; conv_state [B, K-1, C] (the previous K-1
    inputs, oldest first); kernel [K, C]. Returns (out [B, C] in x.dtype, new conv state)."""
    if x.ndim != 2:
        raise ValueError(f"causal_conv1d_step: x must be [B, C] (one token), got {x.shape}")
    _check_conv("causal_conv1d_step", x, kernel, conv_state)
    window = jnp.concatenate([conv_state.astype(x.dtype), x[:, None]], axis=1)  # [B, K, C]
    out = jnp.einsum("bkc,kc->bc", window.astype(jnp.float32), kernel.astype(jnp.float32))
    return out.astype(x.dtype), window[:, 1:]


# ----------------------------------------------------------------------------- layer


def gated_rms_norm(x: Array, gate: Array, scale: Array, eps: float) -> Array:
    """transformers Qwen3_5RMSNormGated: scale·RMSNorm(x) (statistics in float32, cast back to
    x.dtype before the scale) times silu(gate) in float32; returned in x.dtype."""
    x32 = x.astype(jnp.float32)
    normed = (x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)).astype(
        x.dtype
    )
    out = (scale.astype(x.dtype) * normed).astype(jnp.float32)
    return (out * jax.nn.silu(gate.astype(jnp.float32))).astype(x.dtype)


@dataclasses.dataclass(frozen=True)
class GatedDeltaNetConfig:
    """The Qwen3.5 text-config fields a Gated DeltaNet layer reads (transformers' names)."""

    hidden_size: int
    linear_num_key_heads: int = 16
    linear_num_value_heads: int = 32
    linear_key_head_dim: int = 128
    linear_value_head_dim: int = 128
    linear_conv_kernel_dim: int = 4
    rms_norm_eps: float = 1e-6
    hidden_act: str = "silu"

    def __post_init__(self):
        for f in dataclasses.fields(self):
            val = getattr(self, f.name)
            if f.type == "int" and (not isinstance(val, int) or val < 1):
                raise ValueError(
                    f"GatedDeltaNetConfig.{f.name} must be a positive int, got {val!r}"
                )
        if self.linear_num_value_heads % self.linear_num_key_heads:
            raise ValueError(
                f"GatedDeltaNetConfig: linear_num_value_heads ({self.linear_num_value_heads}) must "
                f"be a multiple of linear_num_key_heads ({self.linear_num_key_heads})"
            )
        if self.linear_conv_kernel_dim < 2:
            raise ValueError(
                f"GatedDeltaNetConfig.linear_conv_kernel_dim must be >= 2, got "
                f"{self.linear_conv_kernel_dim}"
            )
        if not self.rms_norm_eps > 0:
            raise ValueError(
                f"GatedDeltaNetConfig.rms_norm_eps must be > 0, got {self.rms_norm_eps!r}"
            )
        if self.hidden_act != "silu":
            raise ValueError(
                f"GatedDeltaNetConfig.hidden_act: only 'silu' (Qwen3.5) is implemented, got "
                f"{self.hidden_act!r}"
            )

    @classmethod
    def from_hf(cls, hf_config: Any) -> GatedDeltaNetConfig:
        """From a transformers Qwen3_5TextConfig (or its dict)."""
        get = hf_config.get if isinstance(hf_config, dict) else lambda k: getattr(hf_config, k)
        return cls(**{f.name: get(f.name) for f in dataclasses.fields(cls)})

    @property
    def key_dim(self) -> int:
        return self.linear_num_key_heads * self.linear_key_head_dim

    @property
    def value_dim(self) -> int:
        return self.linear_num_value_heads * self.linear_value_head_dim

    @property
    def conv_dim(self) -> int:
        return 2 * self.key_dim + self.value_dim


@flax.struct.dataclass
class GatedDeltaNetCache:
    """Decode state of one Gated DeltaNet layer.

    conv_state [B, K-1, conv_dim]: the last K-1 pre-convolution q/k/v inputs (compute dtype);
    recurrent_state [B, Hv, dk, dv]: the delta-rule state S, always float32.
    """

    conv_state: Array
    recurrent_state: Array


def _silu(x: Array) -> Array:
    # In float32, rounded once (as torch's bf16 silu): jax.nn.silu on bf16 rounds the sigmoid too.
    return jax.nn.silu(x.astype(jnp.float32)).astype(x.dtype)


def _vector_param(value, sharding):
    # eager_sharding=False, as in qwen3.py: built unsharded, placed by rubric_rl.core.sharding.
    return nnx.Param(value, out_sharding=sharding, eager_sharding=False)


class DepthwiseConv1d(nnx.Module):
    """Holds the causal depthwise convolution kernel [K, C] (see `causal_conv1d`)."""

    def __init__(self, kernel_size: int, channels: int, *, rngs: nnx.Rngs, param_dtype: Any):
        # torch Conv1d default init: U(±1/sqrt(fan_in)), fan_in = K for a depthwise kernel.
        bound = kernel_size**-0.5
        w = jax.random.uniform(rngs.params(), (kernel_size, channels), jnp.float32, -bound, bound)
        self.kernel = _vector_param(w.astype(param_dtype), (None, "tensor"))


class GatedRMSNorm(nnx.Module):
    """Holds the per-head gated RMSNorm scale [dv] (see `gated_rms_norm`)."""

    def __init__(self, dim: int, *, param_dtype: Any):
        self.scale = _vector_param(jnp.ones((dim,), param_dtype), (None,))


class GatedDeltaNet(nnx.Module):
    """Qwen3.5 Gated DeltaNet token mixer (transformers `Qwen3_5GatedDeltaNet`), Flax NNX.

    Parameters, one per transformers tensor of `model.layers[i].linear_attn`
    (D = hidden_size, Hk/Hv = linear_num_key/value_heads, dk/dv = linear_key/value_head_dim,
    Kd = Hk·dk, Vd = Hv·dv, C = 2·Kd + Vd, K = linear_conv_kernel_dim):
      HF name (shape)               here (shape)                       out_sharding
      in_proj_qkv.weight [C, D]     in_proj_qkv.kernel [D, C]  (ᵀ)     ('fsdp', 'tensor')
      in_proj_z.weight  [Vd, D]     in_proj_z.kernel [D, Vd]   (ᵀ)     ('fsdp', 'tensor')
      in_proj_b.weight  [Hv, D]     in_proj_b.kernel [D, Hv]   (ᵀ)     ('fsdp', 'tensor')
      in_proj_a.weight  [Hv, D]     in_proj_a.kernel [D, Hv]   (ᵀ)     ('fsdp', 'tensor')
      conv1d.weight     [C, 1, K]   conv1d.kernel [K, C]  (w[:, 0, :]ᵀ) (None, 'tensor')
      dt_bias           [Hv]        dt_bias [Hv]                       ('tensor',)
      A_log             [Hv]        A_log [Hv]                         ('tensor',)
      norm.weight       [dv]        norm.scale [dv]                    replicated
      out_proj.weight   [D, Vd]     out_proj.kernel [Vd, D]    (ᵀ)     ('tensor', 'fsdp')
    `hf_to_nnx_params` does the conversion. The qkv columns are [q | k | v] (head-major inside
    each), so a 'tensor' split of C does not fall on head boundaries; the split into q/k/v then
    reshards (correct, not the fastest layout; a per-head interleaved layout is a later step).

    Forward (per token): x → qkv, z, b, a; qkv → causal depthwise conv (K taps) → silu → q, k, v;
    β = sigmoid(b); g = −exp(A_log)·softplus(a + dt_bias); gated delta rule with L2-normalised
    q, k (`chunk_gated_delta_rule` for sequences, `gated_delta_step` for decode); per-head
    gated RMSNorm with z; out_proj.
    """

    def __init__(
        self,
        config: GatedDeltaNetConfig,
        *,
        rngs: nnx.Rngs,
        dtype: Any = jnp.float32,
        param_dtype: Any = jnp.float32,
        chunk_size: int = 64,
    ):
        c = config
        kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype)
        self.in_proj_qkv = Dense(c.hidden_size, c.conv_dim, ("fsdp", "tensor"), **kw)
        self.in_proj_z = Dense(c.hidden_size, c.value_dim, ("fsdp", "tensor"), **kw)
        self.in_proj_b = Dense(c.hidden_size, c.linear_num_value_heads, ("fsdp", "tensor"), **kw)
        self.in_proj_a = Dense(c.hidden_size, c.linear_num_value_heads, ("fsdp", "tensor"), **kw)
        self.out_proj = Dense(c.value_dim, c.hidden_size, ("tensor", "fsdp"), **kw)
        self.conv1d = DepthwiseConv1d(
            c.linear_conv_kernel_dim, c.conv_dim, rngs=rngs, param_dtype=param_dtype
        )
        hv = c.linear_num_value_heads
        self.dt_bias = _vector_param(jnp.ones((hv,), param_dtype), ("tensor",))
        # transformers: A ~ U(0.01, 16), A_log = log A.
        a = jax.random.uniform(rngs.params(), (hv,), jnp.float32, 0.01, 16.0)
        self.A_log = _vector_param(jnp.log(a).astype(param_dtype), ("tensor",))
        self.norm = GatedRMSNorm(c.linear_value_head_dim, param_dtype=param_dtype)
        self.config = config
        self.dtype = dtype
        self.chunk_size = chunk_size

    def init_cache(self, batch: int, dtype: Any = None) -> GatedDeltaNetCache:
        """Zeroed decode state (the state before any token)."""
        c = self.config
        return GatedDeltaNetCache(
            conv_state=jnp.zeros(
                (batch, c.linear_conv_kernel_dim - 1, c.conv_dim), dtype or self.dtype
            ),
            recurrent_state=jnp.zeros(
                (batch, c.linear_num_value_heads, c.linear_key_head_dim, c.linear_value_head_dim),
                jnp.float32,
            ),
        )

    def _gates(self, b: Array, a: Array) -> tuple[Array, Array]:
        beta = jax.nn.sigmoid(b.astype(jnp.float32))
        a_param = self.A_log[...].astype(jnp.float32)
        g = -jnp.exp(a_param) * jax.nn.softplus(a.astype(jnp.float32) + self.dt_bias[...])
        return g, beta

    def _split_heads(self, qkv: Array) -> tuple[Array, Array, Array]:
        c = self.config
        lead = qkv.shape[:-1]
        q = qkv[..., : c.key_dim].reshape(*lead, c.linear_num_key_heads, c.linear_key_head_dim)
        k = qkv[..., c.key_dim : 2 * c.key_dim].reshape(
            *lead, c.linear_num_key_heads, c.linear_key_head_dim
        )
        v = qkv[..., 2 * c.key_dim :].reshape(
            *lead, c.linear_num_value_heads, c.linear_value_head_dim
        )
        return q, k, v

    def _output(self, o: Array, z: Array) -> Array:
        c = self.config
        z = z.reshape(*z.shape[:-1], c.linear_num_value_heads, c.linear_value_head_dim)
        o = gated_rms_norm(o.astype(self.dtype), z, self.norm.scale[...], c.rms_norm_eps)
        return self.out_proj(o.reshape(*o.shape[:-2], c.value_dim))

    def prefill(
        self, x: Array, mask: Array | None = None, cache: GatedDeltaNetCache | None = None
    ) -> tuple[Array, GatedDeltaNetCache]:
        """Full-sequence forward from `cache` (default: zero state), returning the new cache.

        x [B, T, D]; mask [B, T] (1 = real token; default all real). Padding: padded positions'
        inputs are zeroed (as transformers does) and their β and g set to 0, so they leave the
        recurrent state unchanged — left padding, right padding and holes all give the state
        after the real tokens (transformers instead lets right-pad steps decay and write the
        state; its outputs at real positions are the same). Outputs at padded positions are
        zero-gated garbage (exactly 0 here: z = 0 there) for the caller to mask.
        Returns (y [B, T, D] in the compute dtype, GatedDeltaNetCache).
        """
        if x.ndim != 3 or x.shape[-1] != self.config.hidden_size:
            raise ValueError(
                f"GatedDeltaNet: x must be [B, T, hidden_size={self.config.hidden_size}], "
                f"got {x.shape}"
            )
        b, t, _ = x.shape
        if mask is not None:
            if mask.shape != (b, t):
                raise ValueError(f"GatedDeltaNet: mask {mask.shape} must be [B, T] = {(b, t)}")
            real = mask > 0
            x = jnp.where(real[..., None], x, jnp.zeros((), x.dtype))
        if cache is None:
            cache = self.init_cache(b)
        x = x.astype(self.dtype)
        qkv, z = self.in_proj_qkv(x), self.in_proj_z(x)
        g, beta = self._gates(self.in_proj_b(x), self.in_proj_a(x))
        qkv, conv_state = causal_conv1d(qkv, self.conv1d.kernel[...], cache.conv_state, mask)
        q, k, v = self._split_heads(_silu(qkv))
        if mask is not None:
            g = jnp.where(real[..., None], g, 0.0)
            beta = jnp.where(real[..., None], beta, 0.0)
        o, state = chunk_gated_delta_rule(
            q,
            k,
            v,
            g,
            beta,
            cache.recurrent_state,
            chunk_size=self.chunk_size,
            use_qk_l2norm=True,
        )
        return self._output(o, z), GatedDeltaNetCache(
            conv_state.astype(cache.conv_state.dtype), state
        )

    def __call__(self, x: Array, mask: Array | None = None) -> Array:
        """Full-sequence forward from the zero state (training, scoring): y [B, T, D]."""
        return self.prefill(x, mask)[0]

    def decode_step(
        self, x: Array, cache: GatedDeltaNetCache, step_mask: Array | None = None
    ) -> tuple[Array, GatedDeltaNetCache]:
        """One token per row: x [B, 1, D] → (y [B, 1, D], new cache). Rows with step_mask 0
        (finished or padding) keep their cache unchanged."""
        if x.ndim != 3 or x.shape[1] != 1 or x.shape[-1] != self.config.hidden_size:
            raise ValueError(
                f"GatedDeltaNet.decode_step: x must be [B, 1, hidden_size="
                f"{self.config.hidden_size}], got {x.shape}"
            )
        x = x[:, 0].astype(self.dtype)
        qkv, z = self.in_proj_qkv(x), self.in_proj_z(x)
        g, beta = self._gates(self.in_proj_b(x), self.in_proj_a(x))
        qkv, conv_state = causal_conv1d_step(qkv, cache.conv_state, self.conv1d.kernel[...])
        q, k, v = self._split_heads(_silu(qkv))
        o, state = gated_delta_step(cache.recurrent_state, q, k, v, g, beta, use_qk_l2norm=True)
        new = GatedDeltaNetCache(conv_state.astype(cache.conv_state.dtype), state)
        if step_mask is not None:
            keep = step_mask > 0
            new = jax.tree.map(
                lambda n, o_: jnp.where(keep.reshape(-1, *([1] * (n.ndim - 1))), n, o_), new, cache
            )
        return self._output(o, z)[:, None], new


def hf_to_nnx_params(hf: dict[str, Any]) -> dict[str, np.ndarray]:
    """transformers `linear_attn.*` tensors (names without the layer prefix, numpy/torch values)
    → {our parameter path: numpy array} (see the `GatedDeltaNet` table). Unknown or missing
    names raise, naming them."""
    expected = {
        "in_proj_qkv.weight": ("in_proj_qkv.kernel", lambda w: w.T),
        "in_proj_z.weight": ("in_proj_z.kernel", lambda w: w.T),
        "in_proj_b.weight": ("in_proj_b.kernel", lambda w: w.T),
        "in_proj_a.weight": ("in_proj_a.kernel", lambda w: w.T),
        "conv1d.weight": ("conv1d.kernel", lambda w: w[:, 0, :].T),
        "dt_bias": ("dt_bias", lambda w: w),
        "A_log": ("A_log", lambda w: w),
        "norm.weight": ("norm.scale", lambda w: w),
        "out_proj.weight": ("out_proj.kernel", lambda w: w.T),
    }
    unknown, missing = set(hf) - set(expected), set(expected) - set(hf)
    if unknown or missing:
        raise ValueError(
            f"hf_to_nnx_params: unexpected {sorted(unknown)}, missing {sorted(missing)} "
            f"(expected the {len(expected)} Qwen3.5 linear_attn tensors)"
        )
    out = {}
    for name, (ours, convert) in expected.items():
        w = hf[name]
        w = w.detach().float().numpy() if hasattr(w, "detach") else np.asarray(w)
        out[ours] = np.ascontiguousarray(convert(w))
    return out


def load_hf_weights(layer: GatedDeltaNet, hf: dict[str, Any]) -> None:
    """Copies transformers `linear_attn.*` tensors (see `hf_to_nnx_params`) into `layer`, in
    place, checking every shape and keeping each parameter's dtype."""
    for path, value in hf_to_nnx_params(hf).items():
        owner, name = layer, path
        if "." in path:
            sub, name = path.split(".")
            owner = getattr(layer, sub)
        param = getattr(owner, name)
        if tuple(param.shape) != value.shape:
            raise ValueError(
                f"load_hf_weights: {path} has shape {tuple(param.shape)}, the checkpoint gives "
                f"{value.shape}"
            )
        param.value = jnp.asarray(value, param.dtype)
