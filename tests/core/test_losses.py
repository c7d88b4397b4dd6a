"""PPO loss, KL estimators and self-distillation vs the numpy reference."""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rubric_rl.core import losses
from rubric_rl.core import variants as registry
from rubric_rl.core.aggregation import finalize_metrics
from rubric_rl.core.losses import (
    ROLLOUT_CORRECTION_PRESETS,
    RolloutCorrection,
    generalized_jsd_from_logits,
    kl_penalty_loss,
    kl_per_token,
    policy_loss,
    ppo_per_token,
    rejects,
    reverse_kl_from_logits,
    rollout_correction,
    sampled_sd_advantage,
    sd_estimator_names,
    sd_loss_from_kl,
    topk_tail_reverse_kl,
)
from tests.core import reference as ref

f32 = functools.partial(jnp.asarray, dtype=jnp.float32)

# The tests call jitted versions: it proves the API jit-able (static options keyword-only), and one
# compile per function, at XLA's lowest optimisation level, is the cheapest way to run them on a
# busy 2-core machine (compilation dominates these tests).
jit = functools.partial(jax.jit, compiler_options={"xla_backend_optimization_level": 0})
ppo = jit(ppo_per_token, static_argnames=("clip_eps_low", "clip_eps_high", "dual_clip_c"))
pol = jit(
    policy_loss,
    static_argnames=("agg_mode", "agg_constant", "clip_eps_low", "clip_eps_high", "dual_clip_c"),
)
klt = jit(kl_per_token, static_argnames=("kind", "clamp"))
kll = jit(kl_penalty_loss, static_argnames=("kind", "clamp", "agg_mode", "agg_constant"))
rkl = jit(reverse_kl_from_logits, static_argnames=("temperature",))
topk = jit(topk_tail_reverse_kl, static_argnames=("k", "temperature"))
jsd = jit(generalized_jsd_from_logits, static_argnames=("beta", "temperature"))
sdl = jit(sd_loss_from_kl, static_argnames=("agg_mode", "agg_constant"))
ssa = jit(sampled_sd_advantage, static_argnames=("clamp",))


def jgrad(fn):
    return jit(jax.grad(fn))


def _logps(seed, batch=5, length=7, spread=0.6):
    rng = np.random.default_rng(seed)
    old = -rng.uniform(0.1, 3.0, size=(batch, length)).astype(np.float32)
    new = (old + rng.normal(scale=spread, size=(batch, length))).astype(np.float32)
    mask = ref.random_mask(rng, batch, length, empty_rows=(1,))
    return rng, new, old, mask


# ----------------------------------------------------------------------------- PPO


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("per_token_adv", [False, True])
@pytest.mark.parametrize("clip", [(0.2, 0.2, 3.0), (0.2, 0.28, None), (0.1, 0.3, 1.5)])
def test_ppo_matches_reference(seed, per_token_adv, clip):
    rng, new, old, _ = _logps(seed)
    shape = new.shape if per_token_adv else new.shape[:1]
    adv = rng.normal(scale=1.5, size=shape).astype(np.float32)
    lo, hi, c = clip
    loss, parts = ppo(
        f32(new), f32(old), f32(adv), clip_eps_low=lo, clip_eps_high=hi, dual_clip_c=c
    )
    want, flags, ratio = ref.ppo_per_token(new, old, adv, lo, hi, c)
    np.testing.assert_allclose(np.asarray(loss), want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(parts["ratio"]), ratio, rtol=1e-5)
    for key, name in (("low", "clipped_low"), ("high", "clipped_high"), ("dual", "dual_clipped")):
        np.testing.assert_array_equal(np.asarray(parts[name]), flags[key])


# (advantage, ratio, loss, clipped_low, clipped_high, dual) with ε_lo = 0.2, ε_hi = 0.28, c = 3
PPO_HAND = [
    (1.0, 1.5, -1.28, False, True, False),  # A > 0 above the clip: flat at 1 + ε_hi
    (1.0, 1.2, -1.2, False, False, False),  # A > 0 inside
    (1.0, 0.5, -0.5, False, False, False),  # A > 0 below 1 − ε: unclipped (still has gradient)
    (-1.0, 0.5, 0.8, True, False, False),  # A < 0 below the clip: flat at 1 − ε_lo
    (-1.0, 1.5, 1.5, False, False, False),  # A < 0 above 1 + ε: unclipped, below the dual clip
    (-1.0, 4.0, 3.0, False, False, True),  # A < 0, ρ > c: dual clip caps at −cA
    (-0.5, 3.0, 1.5, False, False, False),  # exactly at the dual clip: not counted as clipped
    (2.0, 4.0, -2.56, False, True, False),  # dual clip never applies to A > 0
    (0.0, 7.0, 0.0, False, False, False),
]


def test_ppo_hand_computed_cases_and_gradients():
    adv = f32([row[0] for row in PPO_HAND])
    log_ratio = f32([math.log(row[1]) for row in PPO_HAND])[:, None]
    old = jnp.zeros_like(log_ratio)
    kwargs = dict(clip_eps_low=0.2, clip_eps_high=0.28, dual_clip_c=3.0)
    loss, parts = ppo(log_ratio, old, adv, **kwargs)
    np.testing.assert_allclose(np.asarray(loss[:, 0]), [r[2] for r in PPO_HAND], rtol=1e-5)
    for col, name in ((3, "clipped_low"), (4, "clipped_high"), (5, "dual_clipped")):
        np.testing.assert_array_equal(np.asarray(parts[name][:, 0]), [r[col] for r in PPO_HAND])
    # d loss / d lp = −A ρ where the unclipped branch is active, 0 on every clipped branch
    grad = jgrad(lambda lp: jnp.sum(ppo_per_token(lp, old, adv, **kwargs)[0]))(log_ratio)
    active = [not (r[3] or r[4] or r[5]) for r in PPO_HAND]
    want = [(-r[0] * r[1] if a else 0.0) for r, a in zip(PPO_HAND, active)]
    np.testing.assert_allclose(np.asarray(grad[:, 0]), want, rtol=1e-5, atol=1e-7)
    with pytest.raises(ValueError, match="dual_clip_c must be > 1"):
        ppo(log_ratio, old, adv, dual_clip_c=1.0)
    with pytest.raises(ValueError, match=r"advantages must be \[B\]"):
        ppo(log_ratio, old, adv[:3])


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "dr-grpo"])
def test_policy_loss_aggregates_with_is_and_seq_weights(mode):
    rng, new, old, mask = _logps(3)
    adv = rng.normal(size=new.shape[:1]).astype(np.float32)
    is_w = rng.uniform(0.5, 2.0, size=new.shape).astype(np.float32)
    u = rng.uniform(0.5, 2.0, size=new.shape[:1]).astype(np.float32)
    num, den, metrics = pol(
        f32(new),
        f32(old),
        f32(adv),
        f32(mask),
        is_weights=f32(is_w),
        seq_weights=f32(u),
        agg_mode=mode,
        agg_constant=8.0,
    )
    per_token, flags, ratio = ref.ppo_per_token(new, old, adv)
    want_num, want_den = ref.aggregate(per_token * is_w, mask, mode, u, 8.0)
    np.testing.assert_allclose([float(num), float(den)], [want_num, want_den], rtol=1e-5)
    m = finalize_metrics(metrics)
    on = mask != 0
    np.testing.assert_allclose(float(m["actor/clip_frac_low"]), flags["low"][on].mean(), rtol=1e-6)
    np.testing.assert_allclose(float(m["actor/clip_frac_high"]), flags["high"][on].mean())
    np.testing.assert_allclose(float(m["actor/dual_clip_frac"]), flags["dual"][on].mean())
    np.testing.assert_allclose(float(m["actor/ratio"]), ratio[on].mean(), rtol=1e-5)
    np.testing.assert_allclose(float(m["actor/ratio/max"]), ratio[on].max(), rtol=1e-5)
    lr = np.clip(new - old, -20, 20)
    np.testing.assert_allclose(
        float(m["actor/approx_kl_old"]), (np.exp(lr) - 1 - lr)[on].mean(), rtol=1e-4
    )
    # IS weights are constants: no gradient flows into them
    g = jgrad(lambda w: policy_loss(f32(new), f32(old), f32(adv), f32(mask), is_weights=w)[0])(
        f32(is_w)
    )
    assert np.all(np.asarray(g) == 0.0)


# ----------------------------------------------------------------------------- KL to reference


@pytest.mark.parametrize("kind", ["k1", "k2", "k3"])
def test_kl_per_token_matches_reference_including_clamp(kind):
    rng = np.random.default_rng(2)
    lp = -rng.uniform(0, 4, size=(3, 5)).astype(np.float32)
    ref_lp = (lp + rng.normal(scale=2.0, size=(3, 5))).astype(np.float32)
    ref_lp[0, 0] = lp[0, 0] + 15.0  # beyond the clamp: d = −15 → −10
    ref_lp[0, 1] = lp[0, 1] - 15.0
    got = klt(f32(lp), f32(ref_lp), kind=kind, clamp=10.0)
    np.testing.assert_allclose(
        np.asarray(got), ref.kl_per_token(lp, ref_lp, kind), rtol=1e-5, atol=1e-6
    )
    assert np.all(np.isfinite(np.asarray(got)))
    mask = ref.random_mask(rng, 3, 5)
    num, den, metrics = kll(f32(lp), f32(ref_lp), f32(mask), kind=kind)
    want = ref.aggregate(ref.kl_per_token(lp, ref_lp, kind), mask, "token-mean")
    np.testing.assert_allclose([float(num), float(den)], want, rtol=1e-5)
    np.testing.assert_allclose(float(metrics[f"kl_ref/{kind}/sum"]), want[0], rtol=1e-5)


def test_kl_estimator_gradients_on_policy():
    """Exact expectation over y ~ π_θ of ∇ k(y): k1 → 0, k2 → ∇KL(π‖ref), k3 → ∇KL(ref‖π)."""
    theta = f32([0.3, -1.2, 0.8, 0.0, 2.0])
    ref_logp = jax.nn.log_softmax(f32([1.0, 0.5, -0.5, 0.2, 0.0]))

    def expected_grad(kind):
        def surrogate(th):
            lp = jax.nn.log_softmax(th)
            weights = jax.lax.stop_gradient(jnp.exp(lp))  # the sampling distribution, held fixed
            return jnp.sum(weights * kl_per_token(lp, ref_logp, kind=kind))

        return jgrad(surrogate)(theta)

    reverse = jgrad(
        lambda th: jnp.sum(jnp.exp(jax.nn.log_softmax(th)) * (jax.nn.log_softmax(th) - ref_logp))
    )(theta)
    forward = jgrad(lambda th: jnp.sum(jnp.exp(ref_logp) * (ref_logp - jax.nn.log_softmax(th))))(
        theta
    )
    np.testing.assert_allclose(np.asarray(expected_grad("k1")), 0.0, atol=1e-6)
    np.testing.assert_allclose(np.asarray(expected_grad("k2")), np.asarray(reverse), atol=1e-6)
    np.testing.assert_allclose(np.asarray(expected_grad("k3")), np.asarray(forward), atol=1e-6)


# ----------------------------------------------------------------------------- self-distillation


def _logits(seed, shape=(3, 4, 11), scale=2.0):
    rng = np.random.default_rng(seed)
    return rng.normal(scale=scale, size=shape).astype(np.float32), rng


def test_full_and_topk_reverse_kl_match_reference():
    temperature = 0.7
    s, rng = _logits(0)
    t = (s + rng.normal(scale=1.0, size=s.shape)).astype(np.float32)
    full = rkl(f32(s), f32(t), temperature)
    np.testing.assert_allclose(
        np.asarray(full), ref.reverse_kl(s, t, temperature), rtol=1e-4, atol=1e-6
    )
    for k in (1, 3, 10):
        got = topk(f32(s), f32(t), k, temperature)
        want = ref.topk_tail_reverse_kl(s, t, k, temperature)
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-4, atol=1e-6)
    # k = V − 1 leaves one token in the tail: the buckets are the vocabulary, so it equals full
    np.testing.assert_allclose(
        np.asarray(topk(f32(s), f32(t), 10, temperature)),
        np.asarray(full),
        rtol=1e-4,
        atol=1e-6,
    )
    assert np.all(
        np.asarray(topk(f32(s), f32(t), 3, temperature)) <= np.asarray(full) + 1e-5
    )  # data processing
    with pytest.raises(ValueError, match="need 1 ≤ k < V=11"):
        topk(f32(s), f32(t), 11)


@pytest.mark.default_codegen
def test_empty_teacher_context_and_sd_mask_give_exactly_zero():
    s, rng = _logits(1)
    assert np.all(np.asarray(rkl(f32(s), f32(s), 0.8)) == 0.0)
    assert np.all(np.asarray(topk(f32(s), f32(s), 4, 0.8)) == 0.0)
    lp = f32(ref._log_softmax(s)[..., 0])
    coef = f32([0.5, 0.5, 0.5])
    assert np.all(np.asarray(ssa(lp, lp, coef, jnp.ones(3))) == 0.0)
    # sd_mask = 0: exactly zero term AND exactly zero gradient, even with a distant teacher
    t = f32(s + 3.0 * rng.normal(size=s.shape))
    off = jnp.zeros(3)
    mask = jnp.ones(s.shape[:2])

    for kl_fn in (
        reverse_kl_from_logits,
        functools.partial(topk_tail_reverse_kl, k=3),
        functools.partial(generalized_jsd_from_logits, beta=0.3),
    ):
        sd_value = lambda z, kl_fn=kl_fn: sd_loss_from_kl(kl_fn(z, t), mask, coef, off)[0]
        assert float(jit(sd_value)(f32(s))) == 0.0
        assert np.all(np.asarray(jgrad(sd_value)(f32(s))) == 0.0)
    assert np.all(np.asarray(ssa(lp, lp + 1.0, coef, off)) == 0.0)


def _no_stopgrad_full(student_logits, teacher_logits):  # the variant the code must NOT be
    ls, lt = jax.nn.log_softmax(student_logits), jax.nn.log_softmax(teacher_logits)
    return jnp.sum(jnp.exp(ls) * (ls - lt), axis=-1)


def _no_stopgrad_topk(student_logits, teacher_logits, k):  # ditto, tail as log(1 − Σ top-k)
    ls, lt = jax.nn.log_softmax(student_logits), jax.nn.log_softmax(teacher_logits)
    _, idx = jax.lax.top_k(ls, k)
    buckets = []
    for lp in (ls, lt):
        top = jnp.take_along_axis(lp, idx, axis=-1)
        tail = jnp.log1p(-jnp.sum(jnp.exp(top), axis=-1, keepdims=True))
        buckets.append(jnp.concatenate([top, tail], axis=-1))
    return jnp.sum(jnp.exp(buckets[0]) * (buckets[0] - buckets[1]), axis=-1)


def _no_stopgrad_jsd(student_logits, teacher_logits, beta):  # ditto, M from the probabilities
    ls, lt = jax.nn.log_softmax(student_logits), jax.nn.log_softmax(teacher_logits)
    log_m = jnp.log(beta * jnp.exp(lt) + (1 - beta) * jnp.exp(ls))
    terms = beta * jnp.exp(lt) * (lt - log_m) + (1 - beta) * jnp.exp(ls) * (ls - log_m)
    return jnp.sum(terms, axis=-1)


@pytest.mark.parametrize("estimator", ["full", "topk", "jsd", "sampled"])
def test_sd_gradient_treats_teacher_as_constant(estimator):
    """Same parameters θ feed student (prompt) and teacher (prompt ⊕ context) logits."""
    theta, rng = _logits(2, shape=(2, 3, 9))
    context_shift = f32(rng.normal(size=theta.shape))
    tokens = jnp.asarray(rng.integers(0, 9, size=theta.shape[:2]))

    def term(student_logits, teacher_logits, stop=True):
        if estimator == "full":
            return (
                reverse_kl_from_logits(student_logits, teacher_logits)
                if stop
                else _no_stopgrad_full(student_logits, teacher_logits)
            )
        if estimator == "topk":
            if not stop:
                return _no_stopgrad_topk(student_logits, teacher_logits, 4)
            return topk_tail_reverse_kl(student_logits, teacher_logits, 4)
        if estimator == "jsd":
            if not stop:
                return _no_stopgrad_jsd(student_logits, teacher_logits, 0.3)
            return generalized_jsd_from_logits(student_logits, teacher_logits, 0.3)
        pick = lambda z: jnp.take_along_axis(jax.nn.log_softmax(z), tokens[..., None], -1)[..., 0]
        if not stop:
            return pick(student_logits) - pick(teacher_logits)
        ones = jnp.ones(2)
        return sampled_sd_advantage(pick(student_logits), pick(teacher_logits), ones, ones)

    loss = lambda th: jnp.sum(term(th, th + context_shift))
    g_sg = jgrad(loss)(f32(theta))
    teacher_const = np.asarray(f32(theta) + context_shift)  # numpy: no path back to θ
    g_const = jgrad(lambda th: jnp.sum(term(th, f32(teacher_const))))(f32(theta))
    np.testing.assert_allclose(np.asarray(g_sg), np.asarray(g_const), rtol=1e-6, atol=1e-7)
    g_no_sg = jgrad(lambda th: jnp.sum(term(th, th + context_shift, stop=False)))(f32(theta))
    assert np.max(np.abs(np.asarray(g_no_sg) - np.asarray(g_sg))) > 1e-2
    # the plain formula with the teacher as a numpy constant has the same gradient as ours
    g_plain = jgrad(lambda th: jnp.sum(term(th, f32(teacher_const), stop=False)))(f32(theta))
    np.testing.assert_allclose(np.asarray(g_plain), np.asarray(g_sg), rtol=1e-4, atol=1e-6)
    if estimator == "full":  # and it is the analytic reverse-KL gradient
        want = ref.reverse_kl_grad(theta, np.asarray(teacher_const))
        np.testing.assert_allclose(np.asarray(g_sg), want, rtol=1e-4, atol=1e-6)


# ------------------------------------------------------------------ generalised JSD (GKD, TRL)
JSD_BETAS = (0.0, 0.1, 0.5, 0.9, 1.0)  # the endpoints are TRL's forward / reverse KL


@pytest.mark.parametrize("beta", JSD_BETAS)
def test_generalized_jsd_matches_reference_and_is_symmetric(beta):
    temperature = 0.7
    s, rng = _logits(3)
    t = (s + rng.normal(scale=1.5, size=s.shape)).astype(np.float32)
    got = np.asarray(jsd(f32(s), f32(t), beta, temperature))
    want = ref.generalized_jsd(s, t, beta, temperature)
    assert got.shape == s.shape[:-1] and got.dtype == np.float32
    assert np.all(want > 1e-3)  # not a comparison of near-zeros
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)
    # symmetry on the values: JSD_β(p_S, p_T) = JSD_{1−β}(p_T, p_S) (endpoints included)
    swapped = np.asarray(jsd(f32(t), f32(s), 1.0 - beta, temperature))
    np.testing.assert_allclose(got, swapped, rtol=1e-5, atol=1e-6)
    if beta == 0.0:  # TRL: forward KL(p_T ‖ p_S)
        np.testing.assert_allclose(got, ref.reverse_kl(t, s, temperature), rtol=1e-4, atol=1e-6)
    elif beta == 1.0:  # TRL: reverse KL(p_S ‖ p_T), the `full` estimator
        np.testing.assert_array_equal(got, np.asarray(rkl(f32(s), f32(t), temperature)))
    else:  # JSD_β ≤ the entropy of (β, 1 − β); the endpoints are the limits of JSD_β / β etc.
        assert np.all(got <= -beta * math.log(beta) - (1 - beta) * math.log1p(-beta) + 1e-6)
        assert np.all(got < ref.reverse_kl(s, t, temperature))


def test_generalized_jsd_hand_computed_and_endpoint_limits():
    p_s, p_t = np.array([0.7, 0.2, 0.1]), np.array([0.1, 0.3, 0.6])
    s, t = f32(np.log(p_s)), f32(np.log(p_t))
    kl = lambda p, q: sum(a * math.log(a / b) for a, b in zip(p, q))
    m = [0.64, 0.21, 0.15]  # β = 0.1 weighs the TEACHER: 0.1 p_T + 0.9 p_S
    assert float(jsd(s, t, 0.1)) == pytest.approx(0.1 * kl(p_t, m) + 0.9 * kl(p_s, m), rel=1e-5)
    m = [0.4, 0.25, 0.35]  # β = 0.5
    assert float(jsd(s, t, 0.5)) == pytest.approx(0.5 * kl(p_t, m) + 0.5 * kl(p_s, m), rel=1e-5)
    assert abs(float(jsd(s, t, 0.1)) - float(jsd(s, t, 0.9))) > 5e-3  # β's side matters
    assert float(jsd(s, t, 0.0)) == pytest.approx(kl(p_t, p_s), rel=1e-5)
    assert float(jsd(s, t, 1.0)) == pytest.approx(kl(p_s, p_t), rel=1e-5)
    # TRL's endpoints are the limits of the rescaled JSD: JSD_β/β → KL(p_T‖p_S) as β → 0 and
    # JSD_β/(1 − β) → KL(p_S‖p_T) as β → 1 (JSD_β itself → 0 at both ends)
    eps = 1e-4
    lo = ref.generalized_jsd(np.log(p_s), np.log(p_t), eps) / eps
    hi = ref.generalized_jsd(np.log(p_s), np.log(p_t), 1 - eps) / eps
    assert float(lo) == pytest.approx(kl(p_t, p_s), rel=1e-3)
    assert float(hi) == pytest.approx(kl(p_s, p_t), rel=1e-3)


@pytest.mark.parametrize("beta", [*JSD_BETAS, 0.3])
def test_generalized_jsd_is_exactly_zero_for_identical_logits(beta):
    s, _ = _logits(4, scale=8.0)  # wide logits: some probabilities are tiny
    s[0, 1, :4] = -np.inf  # masked vocabulary entries: p = 0
    value = lambda z: generalized_jsd_from_logits(z, z, beta, 0.8)
    assert np.all(np.asarray(jit(value)(f32(s))) == 0.0)
    g = np.asarray(jgrad(lambda z: jnp.sum(value(z)))(f32(s)))
    assert np.all(np.isfinite(g))
    if 0.0 < beta < 1.0:  # each entry's term has derivative 0 at p_S = p_T: exactly 0
        assert np.all(g == 0.0)
    else:  # a KL's per-entry derivative is not 0; it cancels only up to rounding (as `full`)
        assert np.abs(g).max() < 1e-6


def test_generalized_jsd_with_masked_vocabulary_entries():
    """p = 0 on one side, the other, or both: finite values equal to the reference, finite
    gradients (0 < β < 1; the endpoints are KLs, infinite when the support is not covered)."""
    s, rng = _logits(7)
    t = (s + rng.normal(scale=1.5, size=s.shape)).astype(np.float32)
    s[0, 0, :2] = -np.inf  # student only
    t[0, 1, 2:4] = -np.inf  # teacher only
    s[1, 2, 4:7] = t[1, 2, 4:7] = -np.inf  # both
    for beta in (0.1, 0.9):
        got = np.asarray(jsd(f32(s), f32(t), beta))
        np.testing.assert_allclose(got, ref.generalized_jsd(s, t, beta), rtol=1e-4, atol=1e-6)
        g = jgrad(lambda z, b=beta: jnp.sum(generalized_jsd_from_logits(z, f32(t), b)))(f32(s))
        assert np.all(np.isfinite(np.asarray(g)))


@pytest.mark.parametrize("beta", [-0.1, 1.5, float("nan")])
def test_generalized_jsd_rejects_beta_outside_the_unit_interval(beta):
    s, _ = _logits(5)
    with pytest.raises(ValueError, match="need 0 ≤ beta ≤ 1"):
        generalized_jsd_from_logits(f32(s), f32(s), beta)


@pytest.mark.parametrize("beta", JSD_BETAS)
def test_generalized_jsd_gradients_match_finite_differences(beta):
    """d/d student logits = a central finite difference of the numpy reference; the teacher
    logits get exactly no gradient (stop_gradient)."""
    temperature = 0.8
    s, rng = _logits(6, shape=(2, 3, 7))
    t = (s + rng.normal(scale=1.5, size=s.shape)).astype(np.float32)
    w = rng.normal(size=s.shape[:-1])  # a different weight per position

    def loss(z_s, z_t):
        return jnp.sum(f32(w) * generalized_jsd_from_logits(z_s, z_t, beta, temperature))

    g_s, g_t = jit(jax.grad(loss, argnums=(0, 1)))(f32(s), f32(t))
    assert np.all(np.asarray(g_t) == 0.0)
    fd = ref.numerical_grad(
        lambda z: float(np.sum(w * ref.generalized_jsd(z, t, beta, temperature))), s
    )
    assert np.abs(fd).max() > 1e-2
    np.testing.assert_allclose(np.asarray(g_s), fd, rtol=1e-3, atol=2e-6)


def test_sd_loss_from_kl_and_sampled_advantage_match_reference():
    rng = np.random.default_rng(8)
    kl = rng.uniform(0, 2, size=(4, 6)).astype(np.float32)
    mask = ref.random_mask(rng, 4, 6, empty_rows=(3,))
    coef = np.array([0.5, 0.2, 0.7, 0.1], np.float32)
    sd_mask = np.array([1, 0, 1, 1], np.float32)
    num, den, metrics = sdl(
        f32(kl), f32(mask), f32(coef), f32(sd_mask), agg_mode="seq-mean-token-mean"
    )
    per_token = kl * (coef * sd_mask)[:, None]
    np.testing.assert_allclose(
        [float(num), float(den)], ref.aggregate(per_token, mask, "seq-mean-token-mean"), rtol=1e-5
    )
    m = finalize_metrics(metrics)
    distilled = (mask != 0) & (sd_mask[:, None] != 0)
    np.testing.assert_allclose(float(m["sd/kl"]), kl[distilled].mean(), rtol=1e-5)
    assert float(m["sd/active_frac"]) == pytest.approx(2 / 3)  # rows 0, 2 of the 3 non-empty
    assert float(m["sd/coef"]) == pytest.approx(0.6)
    lp = -rng.uniform(0, 5, size=(4, 6)).astype(np.float32)
    t_lp = (lp - rng.normal(scale=4, size=(4, 6))).astype(np.float32)
    t_lp[0, 0] = lp[0, 0] - 15.0  # log-ratio 15 → clamped to 10
    t_lp[0, 1] = lp[0, 1] + 15.0  # log-ratio −15 → not clamped below
    got = ssa(f32(lp), f32(t_lp), f32(coef), f32(sd_mask))
    want = ref.sampled_sd_advantage(lp, t_lp, coef, sd_mask)
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-6)
    assert float(got[0, 0]) == pytest.approx(5.0) and float(got[0, 1]) == pytest.approx(
        -7.5, rel=1e-5
    )


def _per_token_sd_mask(rng, loss_mask, sd_rows):
    """A [B, T] SD mask: on the rows ``sd_rows`` say, a random subset of positions (inside and
    outside the loss mask); row 2 is distilled only where the loss mask is 0 (no distilled
    token, so not active)."""
    mask = (rng.random(loss_mask.shape) < 0.6) & (sd_rows[:, None] != 0)
    mask[2] = loss_mask[2] == 0
    return mask.astype(np.float32)


@pytest.mark.parametrize("rank", [1, 2])
@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "dr-grpo"])
def test_sd_loss_with_sequence_or_token_mask_matches_reference(rank, mode):
    rng = np.random.default_rng(11)
    b, t = 6, 9
    kl = rng.uniform(0, 2, size=(b, t)).astype(np.float32)
    mask = ref.random_mask(rng, b, t, empty_rows=(4,))
    coef = rng.uniform(0.1, 1.0, size=b).astype(np.float32)
    seq_w = rng.uniform(0.5, 2.0, size=b).astype(np.float32)
    sd_rows = np.array([1, 0, 1, 1, 1, 1], np.float32)
    sd_mask = sd_rows if rank == 1 else _per_token_sd_mask(rng, mask, sd_rows)
    constant = 5.0 if mode == "dr-grpo" else None
    num, den, metrics = jit(sd_loss_from_kl, static_argnames=("agg_mode", "agg_constant"))(
        f32(kl), f32(mask), f32(coef), f32(sd_mask), seq_weights=f32(seq_w), agg_mode=mode,
        agg_constant=constant,
    )  # fmt: skip
    want_num, want_den, want = ref.sd_loss(kl, mask, coef, sd_mask, mode, seq_w, constant)
    np.testing.assert_allclose([float(num), float(den)], [want_num, want_den], rtol=1e-5)
    got = finalize_metrics(metrics)
    for key in ("sd/kl", "sd/active_frac", "sd/coef"):
        np.testing.assert_allclose(float(got[key]), want[key], rtol=1e-5, err_msg=key)
    # rows 0, 3, 5 distilled among the 5 with loss tokens; row 2's distilled tokens (if any)
    # lie outside the loss mask under a [B, T] mask
    assert float(got["sd/active_frac"]) == pytest.approx((4 if rank == 1 else 3) / 5)


def test_sequence_mask_equals_its_token_broadcast_bit_for_bit():
    """A [B] SD mask and the same mask broadcast to [B, T]: identical values, metrics and
    gradients (the [B] path is unchanged by per-token masks)."""
    rng = np.random.default_rng(12)
    kl = rng.uniform(0, 2, size=(5, 8)).astype(np.float32)
    mask = ref.random_mask(rng, 5, 8, empty_rows=(1,))
    coef = rng.uniform(0.1, 1.0, size=5).astype(np.float32)
    rows = np.array([1, 1, 0, 1, 0], np.float32)
    full = np.broadcast_to(rows[:, None], kl.shape).copy()

    def sd_value(k, sd_mask):
        num, den, metrics = sd_loss_from_kl(k, f32(mask), f32(coef), sd_mask)
        return num / den, metrics

    for fn in (jit(sd_value), jit(jax.grad(lambda k, m: sd_value(k, m)[0]))):
        a, b = fn(f32(kl), f32(rows)), fn(f32(kl), f32(full))
        for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
            np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    lp = -rng.uniform(0, 5, size=kl.shape).astype(np.float32)
    t_lp = (lp - rng.normal(scale=2, size=kl.shape)).astype(np.float32)
    np.testing.assert_array_equal(
        np.asarray(ssa(f32(lp), f32(t_lp), f32(coef), f32(rows))),
        np.asarray(ssa(f32(lp), f32(t_lp), f32(coef), f32(full))),
    )
    token_mask = _per_token_sd_mask(rng, mask, rows)
    np.testing.assert_allclose(
        np.asarray(ssa(f32(lp), f32(t_lp), f32(coef), f32(token_mask))),
        ref.sampled_sd_advantage(lp, t_lp, coef, token_mask),
        rtol=1e-5,
        atol=1e-6,
    )
    with pytest.raises(ValueError, match="sd_mask"):
        sd_loss_from_kl(f32(kl), f32(mask), f32(coef), f32(full[:, :3]))


# Every preset, by hand: does it filter anything (band, token veto)?
_PRESET_REJECTS = {
    "off": False,
    "bypass": False,
    "decoupled_token_tis": False,
    "decoupled_seq_tis": False,
    "geo_mask": True,
    "geo_mask_wide": True,
    "seq_sum_mask_tis": True,
    "seq_mean_k3": True,
}


@pytest.mark.parametrize("name", sorted(ROLLOUT_CORRECTION_PRESETS.names()))
def test_rejects_says_whether_a_preset_filters(name):
    base = name.removesuffix("_veto")
    assert set(ROLLOUT_CORRECTION_PRESETS.names()) == {
        *_PRESET_REJECTS, *(f"{n}_veto" for n in _PRESET_REJECTS)
    }  # fmt: skip
    want = _PRESET_REJECTS[base] or name.endswith("_veto")
    assert rejects(name) is want
    assert ROLLOUT_CORRECTION_PRESETS.get(name).rejects is want
    # and it is what the preset does: a trainer 12 nats below the engine on every token (ratio
    # e^-12) is rejected by every band and the veto, while log w ≡ 0 (bypass with old :=
    # rollout) is rejected by none
    rng = np.random.default_rng(13)
    roll = -rng.uniform(0.1, 3.0, size=(3, 6)).astype(np.float32)
    mask = ref.random_mask(rng, 3, 6, empty_rows=())
    config = ROLLOUT_CORRECTION_PRESETS.get(name)
    _, drifted, _ = rollout_correction(f32(roll - 12.0), f32(roll), f32(mask), config=config)
    assert bool(np.any(np.asarray(drifted) != mask)) is want
    _, same, _ = rollout_correction(f32(roll), f32(roll), f32(mask), config=config)
    np.testing.assert_array_equal(np.asarray(same), mask)
    with pytest.raises(KeyError, match="unknown rollout-correction preset"):
        rejects("bogus")


def test_registries():
    assert not hasattr(losses, "LOSSES")  # the loss parts are called directly, not looked up
    assert sd_estimator_names() == ("none", "full", "jsd", "sampled", "topk")
    assert registry.sd_estimator_names is sd_estimator_names
    assert set(sd_estimator_names()) == {"none", *losses.SD_ESTIMATORS.names()}
    assert registry.get_sd_estimator("full").per_token_kl is reverse_kl_from_logits
    assert registry.get_sd_estimator("topk").per_token_kl is topk_tail_reverse_kl
    assert registry.get_sd_estimator("jsd").per_token_kl is generalized_jsd_from_logits
    assert not registry.get_sd_estimator("jsd").folds_into_advantage
    assert registry.get_sd_estimator("sampled").folds_into_advantage
    assert registry.get_kl_estimator("k3")(f32(0.5)) == pytest.approx(math.exp(-0.5) + 0.5 - 1)
    presets = registry.ROLLOUT_CORRECTION_PRESETS
    assert presets.get("geo_mask").rejections == (("seq_geo_mean", 0.999, 1.001),)
    assert presets.get("geo_mask_wide").rejections == (("seq_geo_mean", 0.99, 1.01),)
    assert presets.get("seq_sum_mask_tis") == RolloutCorrection(
        tis="sequence", tis_cap=2.0, rejections=(("seq_sum", 0.5, 2.0),)
    )
    assert presets.get("seq_mean_k3_veto").token_veto == 1e-4
    with pytest.raises(KeyError, match="unknown self-distillation estimator 'none'"):
        registry.get_sd_estimator("none")


def test_geo_mask_wide_keeps_what_a_bf16_mismatch_drops_from_geo_mask():
    """A sequence whose trainer log-probs sit 0.003 nats per token below the engine's (ratio
    e^-0.003 = 0.997) leaves geo_mask's [0.999, 1.001] and stays in geo_mask_wide's
    [0.99, 1.01]; 0.02 nats per token leaves both."""
    roll = np.full((3, 5), -1.0, np.float32)
    mask = np.ones((3, 5), np.float32)
    old = roll - np.array([[0.003], [0.02], [0.0005]], np.float32)
    kept = {}
    for name in ("geo_mask", "geo_mask_wide"):
        config = ROLLOUT_CORRECTION_PRESETS.get(name)
        _, out, _ = rollout_correction(f32(old), f32(roll), f32(mask), config=config)
        kept[name] = np.asarray(out).max(axis=1).tolist()
    assert kept == {"geo_mask": [0.0, 0.0, 1.0], "geo_mask_wide": [1.0, 0.0, 1.0]}
