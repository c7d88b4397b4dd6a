"""RISED's transfer analysis (rubric_rl/methods/rised/rised_transfer.py, rised_transfer_stats.py;
seed §2.3, C.1): profile similarities against numpy, improvements relative to the baseline
checkpoint, pooled Spearman / Pearson (all and held-out) and most-improved hits against
hand-computed values, the single-environment config variant, and one tiny run analysed end to
end."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from configs import rised as rised_config
from rubric_rl.methods.rised import rised_transfer_stats as rt
from rubric_rl.methods.rised.rised_tags import Tags
from rubric_rl.rubrics.vocabulary import RubricEntry, Vocabulary

VOCAB = Vocabulary(
    (
        RubricEntry("p_a", "s1", "positive", "do a"),
        RubricEntry("p_b", "s1", "positive", "do b"),
        RubricEntry("p_c", "s2", "positive", "do c"),
        RubricEntry("n_x", "s1", "negative", "doing x"),
        RubricEntry("n_y", "s2", "negative", "doing y"),
    )
)


def _cos(a, b):
    na, nb = np.linalg.norm(a), np.linalg.norm(b)
    return 0.0 if na == 0 or nb == 0 else float(a @ b / (na * nb))


def test_pool_profile_sums_counts_and_skips_failed_taggings():
    tags = [Tags({"p_a": 2, "n_x": 1}), Tags.failure("boom"), Tags({"p_a": 1, "n_y": 3})]
    # vocabulary order: p_a, p_b, n_x, p_c, n_y
    np.testing.assert_array_equal(rt.pool_profile(tags, VOCAB), [3, 0, 1, 0, 3])


def test_profile_similarities_match_numpy_per_polarity_and_skill_level():
    rng = np.random.default_rng(0)
    for _ in range(20):
        a = rng.integers(0, 4, len(VOCAB)).astype(float)
        b = rng.integers(0, 4, len(VOCAB)).astype(float)
        got = rt.profile_similarities(a, b, VOCAB)
        # vocabulary order groups by skill: s1 = p_a, p_b, n_x; s2 = p_c, n_y
        assert VOCAB.ids == ("p_a", "p_b", "n_x", "p_c", "n_y")
        pos = np.array([1, 1, 0, 1, 0], bool)
        for p, m in {"pos": pos, "neg": ~pos, "all": np.ones(5, bool)}.items():
            am, bm = a * m, b * m
            assert got[f"rubric_{p}"] == pytest.approx(_cos(am, bm), abs=1e-12)
            sa = np.array([am[:3].sum(), am[3:].sum()])
            sb = np.array([bm[:3].sum(), bm[3:].sum()])
            assert got[f"skill_{p}"] == pytest.approx(_cos(sa, sb), abs=1e-12)
    # an empty profile has similarity 0 (ours)
    assert rt.profile_similarities(np.zeros(5), np.ones(5), VOCAB)["rubric_all"] == 0.0


def test_improvements_are_relative_to_the_baseline_checkpoint():
    rates = {25: {"a": 0.1, "b": 0.5}, 50: {"a": 0.3, "b": 0.4}, 75: {"a": 0.2, "b": float("nan")}}
    got = rt.improvements(rates, 25)
    assert got[50] == pytest.approx({"a": 0.2, "b": -0.1})
    assert got[75]["a"] == pytest.approx(0.1) and math.isnan(got[75]["b"])
    assert set(got) == {50, 75}
    with pytest.raises(ValueError, match="baseline step 10"):
        rt.improvements(rates, 10)


def _rows():
    """3 checkpoints x 3 environments, "w" the training environment."""
    sim = {
        50: {"w": (0.9, 0.2), "x": (0.5, 0.4), "y": (0.1, 0.3)},
        75: {"w": (0.8, 0.9), "x": (0.6, 0.1), "y": (0.3, 0.5)},
        100: {"w": (0.7, 0.6), "x": (0.2, 0.8), "y": (0.4, 0.7)},
    }
    rates = {
        25: {"w": 0.1, "x": 0.1, "y": 0.1},
        50: {"w": 0.5, "x": 0.3, "y": 0.05},
        75: {"w": 0.4, "x": 0.35, "y": 0.2},
        100: {"w": 0.32, "x": 0.15, "y": 0.25},  # no tied gains (plain ranks below)
    }
    sims = {s: {e: {"rubric_all": v[0], "gradient": v[1]} for e, v in d.items()}
            for s, d in sim.items()}  # fmt: skip
    return rt.transfer_rows(sims, rates, 25, "w"), sim, rates


def _np_spearman(x, y):
    """No ties here: the ranks are argsort of argsort."""
    rx, ry = np.argsort(np.argsort(x)), np.argsort(np.argsort(y))
    return float(np.corrcoef(rx, ry)[0, 1])


def test_transfer_rows_and_pooled_correlations_against_numpy():
    rows, sim, rates = _rows()
    assert [(r["step"], r["env"]) for r in rows] == [
        (s, e) for s in (50, 75, 100) for e in ("w", "x", "y")
    ]
    assert [r["held_out"] for r in rows] == [False, True, True] * 3
    for r in rows:
        assert r["improvement"] == pytest.approx(rates[r["step"]][r["env"]] - 0.1)
    for held in (False, True):
        sel = [(s, e) for s in sim for e in sim[s] if e != "w" or not held]
        gain = np.array([rates[s][e] - 0.1 for s, e in sel])
        for k, sig in enumerate(("rubric_all", "gradient")):
            x = np.array([sim[s][e][k] for s, e in sel])
            rho, n = rt.pooled_correlation(rows, sig, held_out=held)
            assert n == len(sel) == (6 if held else 9)
            assert rho == pytest.approx(_np_spearman(x, gain), abs=1e-12)
            r, _ = rt.pooled_correlation(rows, sig, held_out=held, method="pearson")
            assert r == pytest.approx(float(np.corrcoef(x, gain)[0, 1]), abs=1e-12)
    # an undefined value drops its pair
    rows[0]["gradient"] = float("nan")
    assert rt.pooled_correlation(rows, "gradient")[1] == 8


def test_most_improved_hits_by_hand():
    rows, _, _ = _rows()
    # all environments: w is the most improved at every step
    #   step 50: gains w .4 x .2 y -.05 -> w; rubric argmax w -> hit; gradient argmax x -> miss
    #   step 75: gains w .3 x .25 y .1 -> w; rubric w -> hit; gradient w -> hit
    #   step 100: gains w .22 x .05 y .15 -> w; rubric w -> hit; gradient x -> miss
    assert rt.most_improved_hits(rows, "rubric_all") == (3, 3)
    assert rt.most_improved_hits(rows, "gradient") == (1, 3)
    # held-out: x, y only
    #   50: x .2 > y -.05; rubric x hit; gradient x hit
    #   75: x .25 > y .1; rubric x hit; gradient y miss
    #   100: y .15 > x .05; rubric y hit; gradient x miss
    assert rt.most_improved_hits(rows, "rubric_all", held_out=True) == (3, 3)
    assert rt.most_improved_hits(rows, "gradient", held_out=True) == (1, 3)
    # a checkpoint whose improvements are all equal is not evaluated
    flat = [dict(r, improvement=0.0) if r["step"] == 50 else r for r in rows]
    assert rt.most_improved_hits(flat, "rubric_all") == (2, 2)


def test_summary_has_every_signal_and_subset():
    rows, _, _ = _rows()
    s = rt.summarize(rows, ("rubric_all", "gradient"))
    assert set(s) == {"all", "held_out"}
    assert s["held_out"]["gradient"]["most_improved_hits"] == 1
    assert s["all"]["rubric_all"]["pairs"] == 9
    assert s["all"]["rubric_all"]["spearman"] == rt.pooled_correlation(rows, "rubric_all")[0]


def test_retag_agreement_against_numpy():
    rows, _, _ = _rows()
    noise = np.array([0.05, -0.02, 0.0, 0.01, 0.03, -0.04, 0.02, 0.0, -0.01])
    for r, d in zip(rows, noise, strict=True):
        r[rt.RETAG_PREFIX + "rubric_all"] = r["rubric_all"] + d
    got = rt.retag_agreement(rows)
    assert set(got["signals"]) == {"rubric_all"}  # only signals with a second tagging
    a = np.array([r["rubric_all"] for r in rows])
    per = got["signals"]["rubric_all"]
    assert per["pearson"] == pytest.approx(float(np.corrcoef(a, a + noise)[0, 1]), abs=1e-12)
    assert per["mean_abs_diff"] == pytest.approx(float(np.mean(np.abs(noise))), abs=1e-12)
    deltas = []
    for subset, held in (("all", False), ("held_out", True)):
        sel = [i for i, r in enumerate(rows) if r["held_out"] or not held]
        gain = np.array([rows[i]["improvement"] for i in sel])
        before = _np_spearman(a[sel], gain)
        after = _np_spearman(a[sel] + noise[sel], gain)
        assert per[subset]["spearman"] == pytest.approx(after, abs=1e-12)
        assert per[subset]["delta"] == pytest.approx(after - before, abs=1e-12)
        deltas.append(abs(after - before))
    assert got["max_abs_delta"] == pytest.approx(max(deltas), abs=1e-12)


@pytest.fixture(scope="module")
def tiny_model():
    import jax
    from flax import nnx

    from rubric_rl.core import sharding
    from rubric_rl.core import train_step as ts
    from rubric_rl.models.qwen3 import PRESETS, Qwen3ForCausalLM

    mesh1 = sharding.make_mesh(1, 1, 1, devices=jax.devices()[:1])
    model = sharding.init_sharded(
        lambda: Qwen3ForCausalLM(PRESETS["tiny"], rngs=nnx.Rngs(1)), mesh1
    )
    graphdef, state = ts.init_train_state(model, ts.TrainConfig(), mesh1)
    return graphdef, state, PRESETS["tiny"].vocab_size


def test_pool_gradient_of_rows_is_the_mean_over_unpadded_sequences(tiny_model):
    """The trainer's packing (left-padded prompts, bucketed completions, calls of 3 rows with
    reward-0 padding) against jax.grad of mean_i r_i Σ_t log π on each row alone, unpadded;
    a row with an undefined reward is left out of the mean."""
    import jax
    import jax.numpy as jnp
    from flax import nnx
    from jax.flatten_util import ravel_pytree

    from rubric_rl.methods.rised.rised_transfer import PoolRow, _gradient_cosine, pool_gradient

    graphdef, state, vocab_size = tiny_model
    rng = np.random.default_rng(3)
    rows = []
    for i in range(4):
        prompt = tuple(int(x) for x in rng.integers(1, vocab_size, 2 + i % 3))
        tokens = tuple(int(x) for x in rng.integers(1, vocab_size, 1 + (i * 2) % 5))
        rows.append(PoolRow(prompt, tokens, float(rng.normal())))
    rows.append(PoolRow((1, 2), (3, 4), float("nan")))

    def reference(params):
        total = 0.0
        for r in rows[:-1]:
            ids = jnp.asarray([r.prompt_ids + r.tokens], jnp.int32)
            model = nnx.merge(graphdef, params, state.rest)
            logp = jax.nn.log_softmax(model(ids)[0] / 0.7, axis=-1)
            p = len(r.prompt_ids)
            picked = logp[jnp.arange(p - 1, ids.shape[1] - 1), ids[0, p:]]
            total = total + r.reward * jnp.sum(picked)
        return total / (len(rows) - 1)

    fast = {"xla_backend_optimization_level": 0}  # a tiny program: compile time is the cost
    want = jax.jit(jax.grad(reference), compiler_options=fast)(state.params)
    want = np.asarray(ravel_pytree(want)[0])
    got = pool_gradient(
        graphdef, state.params, state.rest, rows, prompt_len=8, buckets=(4, 8), pad_id=0,
        temperature=0.7, chunk_size=5, rows_per_call=3,
    )  # fmt: skip
    assert got.dtype == np.float32 and np.abs(want).max() > 1e-3
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)
    nan_only = [PoolRow((1,), (2,), float("nan"))]
    assert pool_gradient(graphdef, state.params, state.rest, nan_only, prompt_len=8,
                         buckets=(4,), pad_id=0) is None  # fmt: skip
    b = np.random.default_rng(0).normal(size=got.shape).astype(np.float32)
    want_cos = _cos(got.astype(np.float64), b.astype(np.float64))
    assert _gradient_cosine(got, b, chunk=1000) == pytest.approx(want_cos, abs=1e-12)
    assert _gradient_cosine(got, 0 * b) == 0.0 and math.isnan(_gradient_cosine(None, b))


def test_single_env_variant_trains_one_environment_and_evaluates_all():
    from rubric_rl.config import builders
    from rubric_rl.loop import evaluation

    c = rised_config.get_config("smoke,single_env=list")
    assert c.rised.train_environment == "list"
    assert rised_config.get_config("smoke").rised.train_environment == ""
    assert c.checkpoint.every == 1 and c.checkpoint.keep >= c.train.steps
    assert rised_config.get_config("single_env=format").checkpoint.every == 25
    assert c.eval.splits.validation == c.checkpoint.every and c.domain.n_validation >= 64
    domain = builders.build_domain(c)
    assert len({evaluation.env_of(t) for t in domain.train}) > 1
    sampler = builders.build_controllers(c, domain).controllers[0]
    for step in range(1, 6):
        batch = sampler.sample_tasks(step, None)
        assert len(batch.tasks) == c.rollout.tasks_per_step
        assert {evaluation.env_of(t) for t in batch.tasks} == {"list"}
    # every environment is still evaluated at every checkpoint
    assert {evaluation.env_of(t) for t in domain.validation} == {
        "format", "list", "rewrite", "short_answer",
    }  # fmt: skip
    assert "validation" in evaluation.due_splits(c, 3, final=False)
    bad = rised_config.get_config("smoke,single_env=webshop")
    with pytest.raises(ValueError, match="train_environment='webshop': no training task"):
        builders.build_controllers(bad, builders.build_domain(bad))
    with pytest.raises(ValueError, match="single_env needs an environment"):
        rised_config.get_config("single_env")


@pytest.mark.slow
def test_tiny_single_env_run_analysed_end_to_end(tmp_path, monkeypatch):
    """A 3-step single-environment run (launch), then the analysis: the pass rates the run
    logged (rewritten here to distinct values; removed at step 3, where the fresh evaluation must
    give what the run logged) give the improvements, a stand-in verifier gives non-zero rewards
    so the pool gradients are not 0, and the files hold what summarize says."""
    from rubric_rl.methods.rised.rised_transfer import main
    from rubric_rl.metrics import read_metrics
    from rubric_rl.services import Services
    from tests.launch_env import launch_train

    w = tmp_path / "w"
    launch_train(
        w, 3, "--config=configs/rised.py:smoke,single_env=list,grpo_k",
        "--config.eval.splits.heldout=0", "--config.eval.splits.ood=0",
        "--config.calibration.enabled=False", "--config.eval.n=16",
        "--config.logging.tensorboard=False", "--config.warmstart.steps=0",
    )  # fmt: skip
    assert sorted(int(p.name) for p in (w / "checkpoints").iterdir()) == [1, 2, 3]
    envs = ("format", "list", "rewrite", "short_answer")
    logged = read_metrics(str(w / "metrics.jsonl"))
    rates = {s: {e: round(0.05 * ((s * 7 + i * 3) % 11), 2) for i, e in enumerate(envs)}
             for s in range(4)}  # fmt: skip
    run_rates = {e: logged[3][f"eval/validation/env/{e}/pass_rate"] for e in envs}
    with open(w / "metrics.jsonl", "w") as f:
        for r in logged:
            if r["step"] == 3:  # not logged at step 3: the analysis evaluates it afresh
                r = {k: v for k, v in r.items() if not k.startswith("eval/validation/")}
            else:
                r.update(
                    {f"eval/validation/env/{e}/pass_rate": v for e, v in rates[r["step"]].items()}
                )
            f.write(json.dumps(r) + "\n")
    rates[3] = run_rates
    monkeypatch.setattr(
        Services, "task_verifier", lambda self, task, response: float(len(response) % 2)
    )
    summary = main([str(w), "--pool_tasks=2", "--samples=2", "--retag_seed=1"])  # in-process
    rows = [json.loads(x) for x in open(w / "transfer" / "transfer.jsonl")]
    assert summary["train_env"] == "list" and summary["baseline_step"] == 1
    assert summary["steps"] == [2, 3]
    assert [(r["step"], r["env"]) for r in rows] == [(s, e) for s in (2, 3) for e in envs]
    for r in rows:
        assert r["held_out"] == (r["env"] != "list")
        assert r["improvement"] == pytest.approx(rates[r["step"]][r["env"]] - rates[1][r["env"]])
        for sig in rt.PROFILE_SIGNALS:
            assert 0.0 <= r[sig] <= 1.0 + 1e-12
        assert -1.0 <= r["gradient"] <= 1.0
    assert any(r["rubric_all"] > 0 for r in rows)
    # the programmatic tagger is deterministic: a second tagging changes nothing (seed C.2)
    assert all(r[rt.RETAG_PREFIX + s] == r[s] for r in rows for s in rt.PROFILE_SIGNALS)
    assert summary["retag"]["max_abs_delta"] in (0.0, None)
    assert any(abs(r["gradient"]) > 1e-6 for r in rows)
    on_disk = json.loads((w / "transfer" / "transfer_summary.json").read_text())
    assert on_disk["signals"] == json.loads(json.dumps(rt.summarize(rows)))
    assert on_disk["signals"] == json.loads(json.dumps(summary["signals"]))
