"""Train step: exact micro-batching, sharded == 1 device, stop-gradient, bypass vs decoupled."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from rubric_rl.core import losses, sharding
from rubric_rl.core import train_step as ts
from rubric_rl.models.qwen3 import PRESETS, Qwen3ForCausalLM

B, T, TT = 16, 16, 20
# Tiny programs: XLA optimisation buys nothing here and halves the compile time.
FAST = {"xla_backend_optimization_level": 0}
# One decoder layer: every property here is of the loss and step around the model, not of depth.
CFG = dataclasses.replace(PRESETS["tiny"], num_hidden_layers=1)
BASE = ts.TrainConfig(sd_estimator="full", chunk_size=5, temperature=0.8, lr=1e-3)


def make_batch(seed=0, **overrides):
    """Student = prompt ⊕ completion (right-padded); teacher = prompt ⊕ context ⊕ completion."""
    rng = np.random.default_rng(seed)
    v = CFG.vocab_size
    ids = rng.integers(0, v, (B, T)).astype(np.int32)
    attn = np.ones((B, T), np.int32)
    lm = np.zeros((B, T), np.float32)
    offsets = rng.integers(0, TT - T + 1, B).astype(np.int32)
    tids = rng.integers(0, v, (B, TT)).astype(np.int32)
    tattn = np.ones((B, TT), np.int32)
    for b in range(B):
        end = T - (b % 3)  # some right padding
        attn[b, end:] = 0
        lm[b, 4 : end - 1] = 1  # prediction layout: position t scores token t + 1
        tids[b, offsets[b] + 4 : offsets[b] + T] = ids[b, 4:]
    lm[1] = 0  # a fully masked row
    fields = dict(
        input_ids=ids,
        positions=np.broadcast_to(np.arange(T, dtype=np.int32), (B, T)).copy(),
        attention_mask=attn,
        loss_mask=lm,
        rollout_logps=-rng.uniform(0.5, 6.0, (B, T)).astype(np.float32),
        advantages=rng.normal(size=B).astype(np.float32),
        seq_weights=rng.uniform(0.5, 2.0, B).astype(np.float32),
        teacher_input_ids=tids,
        teacher_positions=np.broadcast_to(np.arange(TT, dtype=np.int32), (B, TT)).copy(),
        teacher_attention_mask=tattn,
        teacher_offset=offsets,
        sd_mask=(np.arange(B) % 4 != 0).astype(np.float32),
        sd_coef=rng.uniform(0.2, 1.0, B).astype(np.float32),
        ref_logps=-rng.uniform(0.5, 6.0, (B, T)).astype(np.float32),
    )
    fields.update(overrides)
    return ts.TrainBatch(**fields)


@pytest.fixture(scope="module")
def tiny_state():
    mesh1 = sharding.make_mesh(1, 1, 1, devices=jax.devices()[:1])
    model = sharding.init_sharded(lambda: Qwen3ForCausalLM(CFG, rngs=nnx.Rngs(0)), mesh1)
    graphdef, state = ts.init_train_state(model, BASE, mesh1)
    return graphdef, state, mesh1


_CACHE = {}


def loss_grads_fn(graphdef, config, mesh=None):
    """Jitted (params, rest, batch) -> (loss, grads, metrics), cached per config and mesh."""
    key = (config, None if mesh is None else mesh.devices.shape)
    if key not in _CACHE:
        _CACHE[key] = jax.jit(
            lambda p, r, b: ts.loss_and_grads(config, graphdef, p, r, b, mesh=mesh),
            compiler_options=FAST,
        )
    return _CACHE[key]


def compute_logps_fn(graphdef, mesh1):
    """``make_compute_logps`` on one device, built once: the π_old forward reads only the
    temperature, chunk size and micro-batch count, which every config using it here takes from
    BASE."""
    if "compute_logps" not in _CACHE:
        _CACHE["compute_logps"] = ts.make_compute_logps(
            BASE, graphdef, mesh1, compiler_options=FAST
        )
    return _CACHE["compute_logps"]


def max_abs_diff(a, b):
    pairs = zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True)
    return max(float(np.max(np.abs(np.asarray(x) - np.asarray(y)))) for x, y in pairs)


@pytest.mark.parametrize("agg_mode", ["token-mean", "seq-mean-token-mean"])
def test_micro_batched_equals_full_batch(tiny_state, agg_mode):
    graphdef, state, _ = tiny_state
    batch = make_batch()
    results = []
    for m in (1, 2, 4):
        config = dataclasses.replace(BASE, agg_mode=agg_mode, num_micro_batches=m)
        results.append(loss_grads_fn(graphdef, config)(state.params, state.rest, batch))
    (loss1, g1, m1), *rest = results
    assert abs(float(m1["loss/sd"])) > 1e-5 and abs(float(m1["loss/policy"])) > 1e-3
    for loss, g, metrics in rest:
        assert abs(float(loss) - float(loss1)) <= 1e-6
        assert max_abs_diff(g, g1) <= 1e-7
        for key in ("loss/policy", "loss/sd", "loss/policy_den", "entropy", "actor/clip_frac_low"):
            np.testing.assert_allclose(metrics[key], m1[key], rtol=1e-5, atol=1e-7)
    # the denominator is the global one: token-mean counts every loss token of the batch
    lm = np.asarray(batch.loss_mask)
    want = lm.sum() if agg_mode == "token-mean" else (lm.sum(1) > 0).sum()
    assert float(m1["loss/policy_den"]) == want


# (1, 4, 2) is the mesh of test_jitted_step_matches_manual_update_and_skips_nonfinite_on_a_mesh
@pytest.mark.parametrize("shape", [(8, 1, 1), (1, 8, 1), (2, 2, 2)])
def test_sharded_equals_one_device(tiny_state, shape):
    graphdef, state, _ = tiny_state
    config = dataclasses.replace(
        BASE, kl_beta=0.1, rollout_correction="decoupled_token_tis", num_micro_batches=2
    )
    batch = make_batch(old_logps=make_batch().rollout_logps + 0.05)
    loss1, g1, m1 = loss_grads_fn(graphdef, config)(state.params, state.rest, batch)
    mesh = sharding.make_mesh(*shape)
    sh = ts.train_state_shardings(state, mesh)
    params = jax.device_put(state.params, sh.params)
    sbatch = sharding.shard_batch(batch, mesh)
    loss, g, m = loss_grads_fn(graphdef, config, mesh)(params, state.rest, sbatch)
    assert abs(float(loss) - float(loss1)) <= 1e-5
    assert max_abs_diff(g, g1) <= 1e-6
    for key in ("loss/kl_ref", "loss/sd", "rollout_corr/is_weight", "entropy"):
        np.testing.assert_allclose(m[key], m1[key], rtol=1e-5)
    assert float(m1["loss/kl_ref"]) > 0 and float(m1["rollout_corr/is_weight/max"]) > 1.0


def test_jitted_step_matches_manual_update_and_skips_nonfinite_on_a_mesh(tiny_state):
    """make_train_step on a (1, 4, 2) mesh == optax applied to the 1-device gradients.
    skip_nonfinite: a NaN loss returns the input state bit for bit (params, Adam moments, step
    count) and reports train/skipped = 1; a finite batch updates as above and reports 0."""
    graphdef, state, _ = tiny_state
    config = dataclasses.replace(
        BASE, eps=1e-3, max_grad_norm=0.05, weight_decay=0.1, skip_nonfinite=True
    )
    batch = make_batch()
    # the optimiser fields do not enter the loss: reuse BASE's compiled loss
    loss1, g1, _ = loss_grads_fn(graphdef, BASE)(state.params, state.rest, batch)
    tx = ts.make_optimizer(config)
    updates, _ = tx.update(g1, state.opt_state, state.params)
    want = optax.apply_updates(state.params, updates)
    mesh = sharding.make_mesh(1, 4, 2)
    sh = ts.train_state_shardings(state, mesh)
    host = jax.tree.map(np.asarray, state)
    step = ts.make_train_step(config, graphdef, mesh, compiler_options=FAST)
    poisoned = make_batch(advantages=np.full(B, np.nan, np.float32))
    same, m = step(jax.device_put(host, sh), sharding.shard_batch(poisoned, mesh))  # donated
    assert not np.isfinite(float(m["loss"])) and float(m["train/skipped"]) == 1.0
    got = jax.tree.map(np.asarray, same)
    assert all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(host), jax.tree.leaves(got)))
    new, metrics = step(jax.device_put(host, sh), sharding.shard_batch(batch, mesh))
    assert float(metrics["train/skipped"]) == 0.0
    assert int(new.step) == int(state.step) + 1 == 1
    assert abs(float(metrics["loss"]) - float(loss1)) <= 1e-5
    assert float(metrics["grad_norm"]) == pytest.approx(float(optax.global_norm(g1)), rel=1e-5)
    assert float(metrics["lr"]) == pytest.approx(config.lr)
    assert max_abs_diff(new.params, want) <= 1e-6
    assert max_abs_diff(new.params, state.params) > 1e-4  # it did move
    assert new.params["layers"][0]["mlp"]["up_proj"]["kernel"].value.sharding == (
        sh.params["layers"][0]["mlp"]["up_proj"]["kernel"].value
    )


def _sd_only(batch):
    """Advantages 0 → the PPO term and its gradient vanish; what is left is λ·SD."""
    return batch.replace(advantages=np.zeros(B, np.float32))


def _sd_weights(batch):
    """The token-mean SD term's weights λ_b u_b m_bt sd_bt / Σ m (``sd_mask`` [B] or [B, T])."""
    lm = np.asarray(batch.loss_mask)
    sd_mask = np.asarray(batch.sd_mask)
    sd_mask = sd_mask[:, None] if sd_mask.ndim == 1 else sd_mask
    return ((batch.sd_coef * batch.seq_weights)[:, None] * sd_mask * lm / lm.sum()).astype(
        np.float32
    )


def _reverse_kl(ls, lt):
    return jnp.sum(jnp.exp(ls) * (ls - lt), -1)


def _sd_by_hand(graphdef, rest, batch, w, divergence=_reverse_kl):
    """The token-mean SD term written out with full-vocabulary logits:
    ``(sd(params, teacher_logits), teacher_logits(params))``, the self-teacher's logits on the
    teacher rows aligned by offset. ``divergence(log_s, log_t) -> [B, T]``."""
    temp = BASE.temperature
    idx = jnp.arange(T)[None, :] + batch.teacher_offset[:, None]

    def teacher_logits(params):
        model = nnx.merge(graphdef, params, rest)
        logits = model(batch.teacher_input_ids, batch.teacher_positions, None)
        return jnp.take_along_axis(logits, idx[..., None], axis=1)

    def sd(params, t_logits):
        model = nnx.merge(graphdef, params, rest)
        ls = jax.nn.log_softmax(
            model(batch.input_ids, batch.positions, batch.attention_mask) / temp
        )
        lt = jax.nn.log_softmax(t_logits / temp)
        return jnp.sum(w * divergence(ls, lt))

    return sd, teacher_logits


def sd_reference(graphdef, state, batch):
    """``(value, grad, grad_without_sg)`` of the hand-written reverse-KL SD term: ``grad`` with
    the teacher's logits computed first and fed in as a constant (an argument that is not
    differentiated), ``grad_without_sg`` through the teacher too. One program for every batch."""
    if "sd_reference" not in _CACHE:

        def fn(params, rest, batch, w):
            sd, teacher_logits = _sd_by_hand(graphdef, rest, batch, w)
            value, g_const = jax.value_and_grad(sd)(params, teacher_logits(params))
            g_nosg = jax.grad(lambda p: sd(p, teacher_logits(p)))(params)
            return value, g_const, g_nosg

        _CACHE["sd_reference"] = jax.jit(fn, compiler_options=FAST)
    # the reference reads the masks only through w: a [B] sd_mask keeps one input layout
    w, batch = _sd_weights(batch), batch.replace(sd_mask=np.ones(B, np.float32))
    value, g, g_nosg = _CACHE["sd_reference"](state.params, state.rest, batch, w)
    return float(value), g, g_nosg


def test_sd_stop_gradient(tiny_state):
    """∇(SD term) == ∇ with the teacher distribution fed in as a constant, != without sg."""
    graphdef, state, _ = tiny_state
    batch = _sd_only(make_batch())
    _, g, metrics = loss_grads_fn(graphdef, BASE)(state.params, state.rest, batch)
    value, g_const, g_nosg = sd_reference(graphdef, state, batch)
    assert float(metrics["loss/sd"]) == pytest.approx(value, rel=1e-5)
    assert max_abs_diff(g, g_const) <= 1e-6
    assert max_abs_diff(g, g_nosg) > 1e-5


def test_jsd_estimator_uses_the_configured_beta(tiny_state):
    """sd_estimator="jsd": the SD term and its gradient are the generalised JSD of the
    full-vocabulary logits at ``sd_jsd_beta`` (which reaches the step: near p_S = p_T,
    JSD_β ≈ β(1 − β)/2 · χ², so 0.1 and 0.5 differ by far)."""
    graphdef, state, _ = tiny_state
    batch = _sd_only(make_batch())
    betas = (0.1, 0.5)

    def reference(params, rest, batch, w):  # one program for both betas
        out = []
        for beta in betas:
            # log-softmax outputs are their own log-softmax: feed them as logits at temperature 1
            jsd = lambda ls, lt, b=beta: losses.generalized_jsd_from_logits(ls, lt, b)
            sd, teacher_logits = _sd_by_hand(graphdef, rest, batch, w, divergence=jsd)
            out.append(jax.value_and_grad(sd)(params, teacher_logits(params)))
        return out

    hand = jax.jit(reference, compiler_options=FAST)(
        state.params, state.rest, batch, _sd_weights(batch)
    )
    values = {}
    for beta, (value, g_hand) in zip(betas, hand, strict=True):
        config = dataclasses.replace(BASE, sd_estimator="jsd", sd_jsd_beta=beta)
        _, g, metrics = loss_grads_fn(graphdef, config)(state.params, state.rest, batch)
        assert float(metrics["loss/sd"]) == pytest.approx(float(value), rel=1e-5)
        assert max_abs_diff(g, g_hand) <= 1e-6
        values[beta] = float(value)
    assert values[0.5] > 2 * values[0.1]


def _first_half_off(batch):
    """A [B, T] SD mask: the sequence's own SD mask, off on the first half of its completion."""
    lm = np.asarray(batch.loss_mask)
    mask = np.broadcast_to(np.asarray(batch.sd_mask)[:, None], lm.shape).copy()
    for b in range(B):
        tokens = np.flatnonzero(lm[b])
        mask[b, tokens[: len(tokens) // 2]] = 0.0
    return mask


@pytest.mark.parametrize("estimator", ["full", "sampled"])
def test_per_token_sd_mask(tiny_state, estimator):
    """A [B, T] SD mask equal to the [B] mask broadcast changes nothing, bit for bit; one that
    distils only the second half of each completion equals the hand-written SD term, also
    micro-batched."""
    graphdef, state, _ = tiny_state
    config = dataclasses.replace(BASE, sd_estimator=estimator)
    batch = make_batch()
    per_seq = loss_grads_fn(graphdef, config)(state.params, state.rest, batch)
    broadcast = np.broadcast_to(batch.sd_mask[:, None], (B, T)).astype(np.float32)
    per_token = loss_grads_fn(graphdef, config)(
        state.params, state.rest, batch.replace(sd_mask=broadcast)
    )
    assert max_abs_diff(per_seq, per_token) == 0.0
    if estimator == "sampled":  # the per-token path of sd/logp_gap, against its own [B] value
        assert abs(float(per_token[2]["sd/logp_gap"])) > 1e-3
        return
    half = _sd_only(batch).replace(sd_mask=_first_half_off(batch))
    _, g, metrics = loss_grads_fn(graphdef, config)(state.params, state.rest, half)
    value, g_hand, _ = sd_reference(graphdef, state, half)
    assert float(metrics["loss/sd"]) == pytest.approx(value, rel=1e-5)
    assert max_abs_diff(g, g_hand) <= 1e-6
    # it is not the whole-sequence term (the test can fail)
    whole = loss_grads_fn(graphdef, config)(state.params, state.rest, _sd_only(batch))[2]
    assert float(whole["loss/sd"]) > float(metrics["loss/sd"]) + 1e-6
    # sd/active_frac: rows with a distilled token, of the rows with loss tokens
    lm = np.asarray(batch.loss_mask)
    active = ((_first_half_off(batch) * lm).sum(1) > 0).sum() / (lm.sum(1) > 0).sum()
    assert float(metrics["sd/active_frac"]) == pytest.approx(active)
    micro = dataclasses.replace(config, num_micro_batches=2)
    loss2, g2, m2 = loss_grads_fn(graphdef, micro)(state.params, state.rest, half)
    assert float(m2["loss/sd"]) == pytest.approx(float(metrics["loss/sd"]), rel=1e-6)
    assert max_abs_diff(g2, g) <= 1e-7


def test_out_of_range_teacher_positions_are_counted(tiny_state):
    """sd/out_of_range_frac = share of distilled loss tokens whose teacher position t + offset
    falls outside the teacher row (they get no SD term); 0 for a proper batch."""
    graphdef, state, _ = tiny_state
    batch = make_batch()
    _, _, metrics = loss_grads_fn(graphdef, BASE)(state.params, state.rest, batch)
    assert float(metrics["sd/out_of_range_frac"]) == 0.0
    shifted = batch.replace(teacher_offset=np.asarray(batch.teacher_offset) + 3)
    lm = np.asarray(batch.loss_mask)
    distilled = (lm != 0) & (np.asarray(batch.sd_mask)[:, None] != 0)
    outside = np.arange(T)[None, :] + np.asarray(shifted.teacher_offset)[:, None] >= TT
    want = (distilled & outside).sum() / distilled.sum()
    assert 0.0 < want < 1.0
    for m in (1, 2):  # summed over micro-batches as parts, divided once
        config = dataclasses.replace(BASE, num_micro_batches=m)
        _, _, metrics = loss_grads_fn(graphdef, config)(state.params, state.rest, shifted)
        assert float(metrics["sd/out_of_range_frac"]) == pytest.approx(want, rel=1e-6)


def test_needs_old_logps():
    """The step-start log-probs are needed by decoupled presets and by every preset that
    rejects, bypass_veto included (bypass would feed the veto log w ≡ 0)."""
    for name, want in (("bypass", False), ("bypass_veto", True), ("off", True)):
        assert ts.TrainConfig(rollout_correction=name).needs_old_logps is want


@pytest.mark.default_codegen
def test_empty_teacher_context_contributes_exactly_zero(tiny_state):
    graphdef, state, _ = tiny_state
    batch = make_batch()
    off = batch.replace(sd_mask=np.zeros(B, np.float32))
    no_sd = dataclasses.replace(BASE, sd_estimator="none")
    loss, g, m = loss_grads_fn(graphdef, BASE)(state.params, state.rest, off)
    loss0, g0, _ = loss_grads_fn(graphdef, no_sd)(state.params, state.rest, batch)
    assert float(m["loss/sd"]) == 0.0
    assert float(loss) == pytest.approx(float(loss0), abs=1e-7)
    assert max_abs_diff(g, g0) <= 1e-8
    # with distillation on, the gradient changes (the test can fail)
    _, g_on, _ = loss_grads_fn(graphdef, BASE)(state.params, state.rest, batch)
    assert max_abs_diff(g_on, g0) > 1e-6


def test_sampled_estimator_folds_into_advantage(tiny_state):
    graphdef, state, mesh1 = tiny_state
    sampled = dataclasses.replace(BASE, sd_estimator="sampled")
    batch = make_batch()
    loss, _, m = loss_grads_fn(graphdef, sampled)(state.params, state.rest, batch)
    assert "loss/sd" not in m and abs(float(m["sd/logp_gap"])) > 1e-3
    # no sequence distilled -> plain GRPO
    off = batch.replace(sd_mask=np.zeros(B, np.float32))
    loss_off = loss_grads_fn(graphdef, sampled)(state.params, state.rest, off)[0]
    no_sd = dataclasses.replace(BASE, sd_estimator="none")
    loss0 = loss_grads_fn(graphdef, no_sd)(state.params, state.rest, batch)[0]
    assert float(loss_off) == pytest.approx(float(loss0), abs=1e-7)
    assert abs(float(loss) - float(loss0)) > 1e-4


def test_bypass_equals_decoupled_when_engine_matches_trainer(tiny_state):
    graphdef, state, mesh1 = tiny_state
    bypass = dataclasses.replace(BASE, rollout_correction="bypass")
    decoupled = dataclasses.replace(BASE, rollout_correction="decoupled_token_tis")
    trainer_lp = compute_logps_fn(graphdef, mesh1)(state, make_batch())
    batch = make_batch(rollout_logps=trainer_lp)
    loss_b, g_b, _ = loss_grads_fn(graphdef, bypass)(state.params, state.rest, batch)
    loss_d, g_d, m_d = loss_grads_fn(graphdef, decoupled)(
        state.params, state.rest, batch.replace(old_logps=trainer_lp)
    )
    assert float(loss_b) == pytest.approx(float(loss_d), abs=1e-5)
    assert max_abs_diff(g_b, g_d) <= 1e-5
    assert float(m_d["actor/ratio"]) == pytest.approx(1.0, abs=1e-5)
    # engine drift: decoupled keeps the ratio against old (IS weight exp(+0.1) < C) while bypass
    # takes the ratio against the engine's log-probs -> the two now differ
    drift = batch.replace(rollout_logps=trainer_lp - 0.1)
    loss_b2 = loss_grads_fn(graphdef, bypass)(state.params, state.rest, drift)[0]
    _, _, m_d2 = loss_grads_fn(graphdef, decoupled)(
        state.params, state.rest, drift.replace(old_logps=trainer_lp)
    )
    assert float(m_d2["actor/ratio"]) == pytest.approx(1.0, abs=1e-5)
    assert float(m_d2["rollout_corr/is_weight"]) == pytest.approx(np.exp(0.1), rel=1e-4)
    assert abs(float(loss_b2) - float(loss_b)) > 1e-3


def test_errors_name_the_field(tiny_state):
    graphdef, state, _ = tiny_state
    with pytest.raises(ValueError, match="num_micro_batches"):
        ts.loss_and_grads(
            dataclasses.replace(BASE, num_micro_batches=3), graphdef, state.params,
            state.rest, make_batch(),
        )  # fmt: skip
    for preset in ("off", "bypass_veto"):  # decoupled, or a bypass preset that rejects
        with pytest.raises(ValueError, match="old_logps is required by rollout_correction"):
            ts.loss_and_grads(
                dataclasses.replace(BASE, rollout_correction=preset), graphdef, state.params,
                state.rest, make_batch(),
            )  # fmt: skip
    with pytest.raises(ValueError, match="sd_estimator"):
        ts.TrainConfig(sd_estimator="bogus")
    with pytest.raises(ValueError, match="rollout_correction"):
        ts.TrainConfig(rollout_correction="bogus")
    with pytest.raises(ValueError, match="TrainBatch.sd_mask"):
        ts.loss_and_grads(
            BASE, graphdef, state.params, state.rest,
            make_batch(sd_mask=np.ones((B, T - 1), np.float32)),
        )  # fmt: skip


def test_reference_params_equal_precomputed_ref_logps(tiny_state):
    """KL to a frozen reference: ref_params inside the step == ref_logps computed beforehand."""
    graphdef, state, mesh1 = tiny_state
    config = dataclasses.replace(BASE, kl_beta=0.1, sd_estimator="none", kl_kind="k2")
    ref_params = jax.tree.map(lambda x: x * 1.5, state.params)
    ref_state = state.replace(params=ref_params)
    ref_lp = compute_logps_fn(graphdef, mesh1)(ref_state, make_batch())
    with_lp = make_batch(ref_logps=ref_lp)
    loss_a, g_a, m_a = loss_grads_fn(graphdef, config)(state.params, state.rest, with_lp)
    fn = jax.jit(
        lambda p, r, b, rp: ts.loss_and_grads(config, graphdef, p, r, b, rp),
        compiler_options=FAST,
    )
    loss_b, g_b, m_b = fn(state.params, state.rest, make_batch(ref_logps=None), ref_params)
    assert float(m_a["loss/kl_ref"]) > 1e-4
    assert float(loss_b) == pytest.approx(float(loss_a), abs=1e-6)
    assert max_abs_diff(g_a, g_b) <= 1e-6


# ------------------------------------------------------------------------------ external teacher

# A bigger model of the same family and vocabulary: another hidden size, depth, and an untied
# LM head (the teacher's own ``unembed()`` must be used, not the student's).
TEACHER_CFG = dataclasses.replace(
    CFG, hidden_size=96, intermediate_size=192, num_hidden_layers=2, tie_word_embeddings=False
)


@pytest.fixture(scope="module")
def big_teacher():
    mesh1 = sharding.make_mesh(1, 1, 1, devices=jax.devices()[:1])
    model = sharding.init_sharded(lambda: Qwen3ForCausalLM(TEACHER_CFG, rngs=nnx.Rngs(7)), mesh1)
    tgraphdef, tparams, trest = nnx.split(model, nnx.Param, ...)
    return tgraphdef, tparams, trest


def teacher_loss_grads_fn(graphdef, config, tgraphdef, mesh=None):
    """Jitted (params, rest, batch, teacher) -> (loss, grads, metrics) with an external teacher."""
    key = ("teacher", config, tgraphdef, None if mesh is None else mesh.devices.shape)
    if key not in _CACHE:
        _CACHE[key] = jax.jit(
            lambda p, r, b, t: ts.loss_and_grads(
                config, graphdef, p, r, b, mesh=mesh, teacher=t, teacher_graphdef=tgraphdef
            ),
            compiler_options=FAST,
        )
    return _CACHE[key]


@pytest.mark.parametrize("estimator", ["full", "sampled"])
def test_external_teacher_copy_equals_self_teacher(tiny_state, estimator):
    """An external teacher that is a copy of the student's parameters (same graphdef) gives the
    self-teacher's loss, metrics and gradients exactly."""
    graphdef, state, _ = tiny_state
    config = dataclasses.replace(BASE, sd_estimator=estimator)
    batch = make_batch()
    want = loss_grads_fn(graphdef, config)(state.params, state.rest, batch)
    copy = jax.tree.map(jnp.copy, (state.params, state.rest))
    got = teacher_loss_grads_fn(graphdef, config, graphdef)(state.params, state.rest, batch, copy)
    assert set(got[2]) == set(want[2])
    assert max_abs_diff(got, want) == 0.0
    # the comparison can fail: a perturbed copy moves the SD term
    moved = (jax.tree.map(lambda x: x * 1.1, copy[0]), copy[1])
    other = teacher_loss_grads_fn(graphdef, config, graphdef)(
        state.params, state.rest, batch, moved
    )
    key = "loss/sd" if estimator == "full" else "sd/logp_gap"
    assert abs(float(other[2][key]) - float(want[2][key])) > 1e-5


def test_external_teacher_of_another_shape(tiny_state, big_teacher):
    """A bigger teacher (hidden 96, 2 layers, untied head; same vocabulary): the SD term is the
    reverse KL of the two models' full-vocabulary softmaxes at the batch's temperature on the
    same rows (masked and weighted like the step), the student's gradient is the hand-written
    one with the teacher as a constant, and no gradient reaches the teacher's parameters."""
    graphdef, state, _ = tiny_state
    tgraphdef, tparams, trest = big_teacher
    batch = _sd_only(make_batch())
    fn = teacher_loss_grads_fn(graphdef, BASE, tgraphdef)
    _, g, metrics = fn(state.params, state.rest, batch, (tparams, trest))
    value = float(metrics["loss/sd"])
    assert np.isfinite(value) and value > 1e-4
    self_sd = float(loss_grads_fn(graphdef, BASE)(state.params, state.rest, batch)[2]["loss/sd"])
    assert abs(value - self_sd) > 1e-4
    # reference: the teacher model's own logits on the teacher rows, aligned by offset
    idx = jnp.arange(T)[None, :] + jnp.asarray(batch.teacher_offset)[:, None]

    def teacher_logits(tp):
        logits = nnx.merge(tgraphdef, tp, trest)(
            batch.teacher_input_ids, batch.teacher_positions, batch.teacher_attention_mask
        )
        return jnp.take_along_axis(logits, idx[..., None], axis=1)

    def reference(params, tp):  # one program
        sd, _ = _sd_by_hand(graphdef, state.rest, batch, _sd_weights(batch))
        const = teacher_logits(tp)
        value, g_hand = jax.value_and_grad(sd)(params, const)
        # d loss / d teacher params through the whole step loss
        g_teacher = jax.grad(
            lambda t: ts.loss_and_grads(
                BASE, graphdef, params, state.rest, batch,
                teacher=(t, trest), teacher_graphdef=tgraphdef,
            )[0]
        )(tp)  # fmt: skip
        # the hand-written term without stop_gradient, through the teacher's parameters
        g_nosg = jax.grad(lambda t: sd(params, teacher_logits(t)))(tp)
        return const, value, g_hand, g_teacher, g_nosg

    const, want, g_hand, g_teacher, g_nosg = jax.jit(reference, compiler_options=FAST)(
        state.params, tparams
    )
    assert const.shape == (B, T, CFG.vocab_size)
    assert value == pytest.approx(float(want), rel=1e-5)
    assert max_abs_diff(g, g_hand) <= 1e-6
    # no gradient reaches the teacher: exactly zero ...
    assert all(np.all(np.asarray(x) == 0.0) for x in jax.tree.leaves(g_teacher))
    # ... where the hand-written term without stop_gradient does depend on them (can fail)
    assert max(float(np.abs(np.asarray(x)).max()) for x in jax.tree.leaves(g_nosg)) > 1e-6


def test_jitted_step_with_reference_and_external_teacher_on_a_mesh(tiny_state, big_teacher):
    """make_train_step(teacher_graphdef=...) on a (2, 2, 2) mesh, with ref_params positional and
    a sharded teacher: the loss and update == 1-device loss_and_grads with the same inputs; the
    teacher is not donated; the same step still runs without a teacher (self-teacher)."""
    graphdef, state, _ = tiny_state
    tgraphdef, tparams, trest = big_teacher
    # eps 1e-3 (as in the test above): with a tiny eps Adam's first step ≈ lr·sign(g), which
    # turns rounding differences of near-zero gradients into full-size update differences
    config = dataclasses.replace(BASE, kl_beta=0.1, kl_kind="k2", eps=1e-3)
    batch = make_batch(ref_logps=None)
    ref_params = jax.tree.map(lambda x: x * 1.5, state.params)
    loss1, g1, m1 = jax.jit(
        lambda p, r, b, rp, t: ts.loss_and_grads(
            config, graphdef, p, r, b, rp, teacher=t, teacher_graphdef=tgraphdef
        ),
        compiler_options=FAST,
    )(state.params, state.rest, batch, ref_params, (tparams, trest))
    tx = ts.make_optimizer(config)
    want = optax.apply_updates(state.params, tx.update(g1, state.opt_state, state.params)[0])
    mesh = sharding.make_mesh(2, 2, 2)
    sh = ts.train_state_shardings(state, mesh)
    steacher = jax.device_put(
        (tparams, trest),
        (sharding.param_shardings(tparams, mesh), sharding.param_shardings(trest, mesh)),
    )
    sref = jax.device_put(ref_params, sh.params)
    step = ts.make_train_step(
        config, graphdef, mesh, compiler_options=FAST, teacher_graphdef=tgraphdef
    )
    sbatch = sharding.shard_batch(batch, mesh)
    fresh = lambda: jax.device_put(jax.tree.map(np.asarray, state), sh)  # donated
    new, metrics = step(fresh(), sbatch, sref, teacher=steacher)
    assert abs(float(metrics["loss"]) - float(loss1)) <= 1e-5
    for key in ("loss/sd", "loss/kl_ref"):
        assert float(metrics[key]) == pytest.approx(float(m1[key]), rel=1e-5)
    assert max_abs_diff(new.params, want) <= 1e-6
    assert not any(x.is_deleted() for x in jax.tree.leaves(steacher))
    # same step object, no teacher: the self-teacher's loss (another compiled step)
    _, m_self = step(fresh(), sbatch, sref)
    assert abs(float(m_self["loss/sd"]) - float(m1["loss/sd"])) > 1e-4


def test_external_teacher_errors(tiny_state, big_teacher):
    graphdef, state, _ = tiny_state
    tgraphdef, tparams, trest = big_teacher
    batch = make_batch()
    teacher = (tparams, trest)
    with pytest.raises(ValueError, match="teacher_graphdef"):
        ts.loss_and_grads(BASE, graphdef, state.params, state.rest, batch, teacher=teacher)
    mesh1 = sharding.make_mesh(1, 1, 1, devices=jax.devices()[:1])
    step = ts.make_train_step(BASE, graphdef, mesh1, compiler_options=FAST)
    with pytest.raises(ValueError, match="teacher_graphdef"):
        step(state, batch, teacher=teacher)
    no_sd = dataclasses.replace(BASE, sd_estimator="none")
    with pytest.raises(ValueError, match="uses no teacher"):
        ts.loss_and_grads(
            no_sd, graphdef, state.params, state.rest, batch,
            teacher=teacher, teacher_graphdef=tgraphdef,
        )  # fmt: skip
    # another vocabulary: refused, naming both sizes
    other_vocab = dataclasses.replace(TEACHER_CFG, vocab_size=2 * CFG.vocab_size)
    abstract = nnx.eval_shape(lambda: Qwen3ForCausalLM(other_vocab, rngs=nnx.Rngs(0)))
    vgraphdef, vparams, vrest = nnx.split(abstract, nnx.Param, ...)
    with pytest.raises(ValueError, match=rf"vocabulary size {2 * CFG.vocab_size}.*128"):
        jax.eval_shape(
            lambda p, r: ts.loss_and_grads(
                BASE, graphdef, state.params, state.rest, batch,
                teacher=(p, r), teacher_graphdef=vgraphdef,
            ),
            vparams,
            vrest,
        )  # fmt: skip


def test_sd_sequence_sum_aggregation(tiny_state):
    """``sd_agg_mode="seq-mean-token-sum"`` (ARISE-RL eq. 13's Σ_t per sequence): the same
    numerator as today's token mean over a denominator of the sequences with a loss token."""
    graphdef, state, _ = tiny_state
    batch = _sd_only(make_batch())
    seq = dataclasses.replace(BASE, sd_agg_mode="seq-mean-token-sum")
    _, _, m_tok = loss_grads_fn(graphdef, BASE)(state.params, state.rest, batch)
    _, g_seq, m_seq = loss_grads_fn(graphdef, seq)(state.params, state.rest, batch)
    lm = np.asarray(batch.loss_mask)
    n_seq = int((lm.sum(1) > 0).sum())
    want = float(m_tok["loss/sd"]) * lm.sum() / n_seq
    assert float(m_seq["loss/sd"]) == pytest.approx(want, rel=1e-5)
    # the policy term keeps agg_mode: with A = 0 the gradient is the SD term's, rescaled
    _, g_tok, _ = loss_grads_fn(graphdef, BASE)(state.params, state.rest, batch)
    scaled = jax.tree.map(lambda g: g * lm.sum() / n_seq, g_tok)
    assert max_abs_diff(g_seq, scaled) <= 1e-5
    with pytest.raises(ValueError, match="folds into the advantages"):
        dataclasses.replace(BASE, sd_estimator="sampled", sd_agg_mode="seq-mean-token-sum")
    with pytest.raises(ValueError, match="sd_sampled_logps"):
        dataclasses.replace(BASE, sd_sampled_logps="stale")


def test_sampled_estimator_on_old_logps(tiny_state):
    """``sd_sampled_logps="old"`` (the authors' qqr): lp_θ in lp_θ − lp_T is π_old's. With π_old
    equal to the live forward it is today's estimator; with another π_old it differs."""
    graphdef, state, mesh1 = tiny_state
    live = dataclasses.replace(BASE, sd_estimator="sampled")
    old = dataclasses.replace(live, sd_sampled_logps="old")
    batch = make_batch()
    # bypass: old = rollout
    same = batch.replace(rollout_logps=compute_logps_fn(graphdef, mesh1)(state, batch))
    l_live, g_live, _ = loss_grads_fn(graphdef, live)(state.params, state.rest, same)
    l_old, g_old, _ = loss_grads_fn(graphdef, old)(state.params, state.rest, same)
    assert float(l_old) == pytest.approx(float(l_live), abs=1e-6)
    assert max_abs_diff(g_old, g_live) <= 1e-6
    l_live2 = loss_grads_fn(graphdef, live)(state.params, state.rest, batch)[0]
    l_old2 = loss_grads_fn(graphdef, old)(state.params, state.rest, batch)[0]
    assert abs(float(l_old2) - float(l_live2)) > 1e-4
