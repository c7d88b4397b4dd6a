"""RG-SED (seed 002 eq. 11–12, the authors' soft gate and schedules) against hand values and numpy
references, and the programmatic coach on real embedded tasks."""

import functools
import math

import numpy as np
import pytest

from rubric_rl.envs.constraint_corpus import decorate_prompt, format_coach
from rubric_rl.envs.constraint_domain import task_bank
from rubric_rl.envs.constraint_lexicon import domain_vocabulary, units
from rubric_rl.envs.constraint_spec import guidance_hint
from rubric_rl.envs.constraint_style import ConstraintStyle
from rubric_rl.methods.arise_rl import rgsed, rgsed_coach
from rubric_rl.methods.arise_rl.rgsed import (
    coefficients_to_sd_gate,
    decay,
    delta_r,
    gate_regions,
    hard_gate,
    reward_gate,
    rgsed_coef,
    sd_gate_multipliers,
    soft_gate,
    warmup,
)
from rubric_rl.methods.arise_rl.rgsed_coach import missed_shares
from rubric_rl.rollout.batch import Group, Rollouts, Trajectory
from rubric_rl.rubrics.types import Verdict

# The coach as the embedded constraint domain's style writes it (Domain.style).
coach_memory = functools.partial(rgsed_coach.coach_memory, style=ConstraintStyle())
coach_memories = functools.partial(rgsed_coach.coach_memories, style=ConstraintStyle())

NAN = math.nan
TAU, T = 0.05, 0.0125
EPS = 1e-9


def test_defaults_are_the_seeds_and_the_authors():
    assert (rgsed.LAMBDA0, rgsed.TAU, rgsed.TEMPERATURE) == (0.5, 0.05, 0.0125)
    assert (rgsed.WARMUP_STEPS, rgsed.DECAY_STEPS, rgsed.DECAY_FLOOR) == (20, 120, 0.1)


# --- Δr ------------------------------------------------------------------------------------------


def test_delta_r_nan_aware_ragged_and_undefined():
    memory = [[1.0, 0.5, NAN], [NAN, NAN, NAN], [0.2, 0.2, 0.2], [0.0, 0.0, 0.0]]
    standard = [[0.5, 0.5], [0.1, 0.3], [NAN, NAN], [0.25, 0.75]]
    dr = delta_r(memory, standard)
    np.testing.assert_allclose(dr, [0.75 - 0.5, NAN, NAN, -0.5])
    # A numpy reference on random rewards with holes.
    rng = np.random.default_rng(0)
    mem = rng.random((6, 8))
    std = rng.random((6, 8))
    mem[rng.random(mem.shape) < 0.2] = NAN
    std[0] = NAN
    with np.errstate(invalid="ignore"), pytest.warns(RuntimeWarning):
        ref = np.nanmean(mem, axis=1) - np.nanmean(std, axis=1)
    np.testing.assert_allclose(delta_r(mem, std), ref)
    with pytest.raises(ValueError, match="share G"):
        delta_r(np.zeros((2, 3)), np.zeros((3, 3)))


# --- gates ---------------------------------------------------------------------------------------


def test_hard_gate_at_and_around_tau():
    assert hard_gate(TAU) == 0.0  # strict: Δr = τ does not fire
    assert hard_gate(TAU + EPS) == 1.0
    assert hard_gate(TAU - EPS) == 0.0
    assert hard_gate(NAN) == 0.0
    np.testing.assert_array_equal(hard_gate([0.2, -0.2, NAN, 0.05]), [1, 0, 0, 0])


def test_soft_gate_values_and_numpy_reference():
    assert soft_gate(TAU) == 0.5
    assert soft_gate(TAU + EPS) > 0.5 > soft_gate(TAU - EPS)
    assert soft_gate(TAU + T) == pytest.approx(1 / (1 + math.exp(-1)))  # 0.7311
    assert soft_gate(TAU - T) == pytest.approx(1 / (1 + math.exp(1)))
    assert soft_gate(NAN) == 0.0
    with np.errstate(over="raise", invalid="raise"):  # no overflow for far-off Δr
        assert soft_gate(1e6) == 1.0 and soft_gate(-1e6) == 0.0
    dr = np.linspace(-0.3, 0.3, 41)
    np.testing.assert_allclose(soft_gate(dr), 1 / (1 + np.exp(-(dr - TAU) / T)), rtol=1e-12)
    # → the hard gate as T → 0 (away from τ).
    np.testing.assert_array_equal(
        np.round(soft_gate(dr[dr != TAU], temperature=1e-6)), hard_gate(dr[dr != TAU])
    )
    with pytest.raises(ValueError, match="temperature"):
        soft_gate(0.1, temperature=0.0)


def test_reward_gate_names_and_no_gating_ablation():
    dr = [0.2, 0.0, -0.2, NAN]
    np.testing.assert_array_equal(reward_gate(dr, gate="hard"), [1, 0, 0, 0])
    np.testing.assert_allclose(reward_gate(dr, gate="soft"), soft_gate(dr))
    # "w/o reward gating": 1 for every measured group, harmful ones included.
    np.testing.assert_array_equal(reward_gate(dr, gate="none"), [1, 1, 1, 0])
    with pytest.raises(ValueError, match="gate must be one of"):
        reward_gate(dr, gate="sigmoid")


# --- schedules ------------------------------------------------------------------------------------


def test_warmup_boundaries():
    assert warmup(0) == 0.0
    assert warmup(5) == pytest.approx(0.5 * (1 - math.cos(math.pi / 4)))  # 0.1464
    assert warmup(10) == pytest.approx(0.5)
    assert warmup(20) == 1.0
    assert warmup(21) == 1.0 and warmup(10_000) == 1.0
    assert warmup(3, steps=0) == 1.0
    with pytest.raises(ValueError, match="step"):
        warmup(-1)


def test_decay_boundaries():
    assert decay(0) == 1.0
    assert decay(30) == pytest.approx(0.1 + 0.45 * (1 + math.cos(math.pi / 4)))  # 0.8682
    assert decay(60) == pytest.approx(0.55)
    assert decay(120) == pytest.approx(0.1)
    assert decay(121) == pytest.approx(0.1) and decay(10_000) == pytest.approx(0.1)
    assert decay(50, steps=0) == 1.0
    assert decay(120, floor=0.0) == pytest.approx(0.0, abs=1e-15)
    with pytest.raises(ValueError, match="floor"):
        decay(0, floor=1.5)


def test_schedules_are_monotone():
    w = [warmup(t) for t in range(30)]
    d = [decay(t) for t in range(130)]
    assert all(b >= a for a, b in zip(w, w[1:]))
    assert all(b <= a for a, b in zip(d, d[1:]))


# --- λ and the sd_gate hook -----------------------------------------------------------------------


def _reference_coef(dr, t, lambda0=0.5, gate="soft"):
    dr = np.asarray(dr, float)
    if gate == "hard":
        g = np.where(np.isnan(dr), 0.0, (np.nan_to_num(dr, nan=-1) > TAU).astype(float))
    else:
        g = np.where(np.isnan(dr), 0.0, 1 / (1 + np.exp(-(np.nan_to_num(dr) - TAU) / T)))
    w = 0.5 * (1 - np.cos(np.pi * min(t / 20, 1)))
    d = 0.1 + 0.9 * 0.5 * (1 + np.cos(np.pi * min(t / 120, 1)))
    return lambda0 * g * w * d


def test_rgsed_coef_is_the_product():
    dr = [0.1, 0.05, NAN, -0.2]
    # Hand value, hard gate at t = 10: 0.5 · 1 · 0.5 · d(10).
    d10 = 0.1 + 0.45 * (1 + math.cos(math.pi / 12))
    np.testing.assert_allclose(rgsed_coef(dr, 10, gate="hard"), [0.25 * d10, 0, 0, 0])
    for t in (0, 1, 10, 19, 20, 60, 120, 500):
        for gate in ("soft", "hard"):
            np.testing.assert_allclose(
                rgsed_coef(dr, t, gate=gate), _reference_coef(dr, t, gate=gate), atol=1e-15
            )
    assert np.all(rgsed_coef(dr, 0) == 0.0)  # w(0) = 0
    d20 = decay(20)
    np.testing.assert_allclose(rgsed_coef(dr, 20, lambda0=1.0, gate="none"), [d20, d20, 0, d20])
    assert rgsed_coef(0.3, 20).shape == (1,)
    with pytest.raises(ValueError, match="lambda0"):
        rgsed_coef(dr, 10, lambda0=-0.5)


def test_multipliers_times_sd_coef_give_lambda():
    # step.gate: λ = loss.sd_coef × sd_gate(rollouts); with sd_coef = λ0 that is eq. 12.
    dr = np.array([0.3, 0.06, 0.05, 0.0, -0.1, NAN])
    for t in (3, 20, 90):
        mult = sd_gate_multipliers(dr, t)
        assert mult.shape == (6,) and np.all(np.isfinite(mult)) and np.all(mult >= 0)
        np.testing.assert_allclose(0.5 * mult, rgsed_coef(dr, t, lambda0=0.5))
        coefs = rgsed_coef(dr, t, lambda0=0.5)
        np.testing.assert_allclose(coefficients_to_sd_gate(coefs, 0.5), mult)
        np.testing.assert_allclose(0.25 * coefficients_to_sd_gate(coefs, 0.25), coefs)
    with pytest.raises(ValueError, match="sd_coef"):
        coefficients_to_sd_gate([0.1], 0.0)
    with pytest.raises(ValueError, match="finite and >= 0"):
        coefficients_to_sd_gate([NAN], 0.5)
    with pytest.raises(ValueError, match="finite and >= 0"):
        coefficients_to_sd_gate([-0.1], 0.5)


# --- gate regions ---------------------------------------------------------------------------------


def test_gate_regions_on_a_designed_array():
    # Seed fig. 5's shares, 1000 groups: 721 above τ, 196 within |Δr| ≤ τ (both edges included),
    # 83 below −τ; plus 5 undefined groups left out of the shares.
    dr = np.concatenate(
        [
            np.full(700, 0.2),
            np.full(21, TAU + EPS),
            np.full(100, 0.0),
            np.full(48, TAU),
            np.full(48, -TAU),
            np.full(80, -0.3),
            np.full(3, -TAU - EPS),
            np.full(5, NAN),
        ]
    )
    regions = gate_regions(dr)
    assert regions["above"] == pytest.approx(0.721)
    assert regions["within"] == pytest.approx(0.196)
    assert regions["below"] == pytest.approx(0.083)
    assert regions["num_undefined"] == 5
    assert regions["above"] + regions["within"] + regions["below"] == pytest.approx(1.0)
    # "above" is exactly where the hard gate fires.
    defined = dr[~np.isnan(dr)]
    assert regions["above"] == pytest.approx(hard_gate(defined).mean())
    empty = gate_regions([NAN, NAN])
    assert math.isnan(empty["above"]) and empty["num_undefined"] == 2


# --- the programmatic coach -----------------------------------------------------------------------


def _task_with(pred):
    for task in task_bank("train", n=200, seed=0):
        if pred(task):
            return task
    raise AssertionError("no such task in the bank")


def test_coach_memory_on_a_real_task():
    task = _task_with(
        lambda t: any(c.weight < 0 for c in t.rubric) and sum(c.weight > 0 for c in t.rubric) >= 2
    )
    crits = list(task.rubric)
    pitfall = next(c for c in crits if c.weight < 0)
    a, b = [c for c in crits if c.weight > 0][:2]
    rows = []
    for j in range(4):
        row = {c.id: True for c in crits}
        row[pitfall.id] = j < 3  # the bad behaviour present in 3 of 4: missed by 0.75
        row[a.id] = False  # missed by all 4
        row[b.id] = j < 2  # missed by 2 of 4: not "most"
        rows.append(row)
    text = coach_memory(task, ["r"] * 4, rows)
    assert text == f"remember : {a.text} ; remember : avoid : {pitfall.text}"
    np.testing.assert_allclose(
        missed_shares(task, rows),
        [{a.id: 1.0, pitfall.id: 0.75, b.id: 0.5}.get(c.id, 0.0) for c in crits],
    )
    assert coach_memory(task, ["r"] * 4, rows, max_hints=1) == f"remember : {a.text}"
    assert coach_memory(task, ["r"] * 4, rows, miss_share=0.4).count("remember :") == 2
    # The trajectory's Verdict tuples read the same as the mappings.
    verdict_rows = [tuple(Verdict(cid, m) for cid, m in row.items()) for row in rows]
    assert coach_memory(task, ["r"] * 4, verdict_rows) == text
    # Mounted as the corpus mounts a <coach> block: every unit is in the domain vocabulary.
    vocab = set(domain_vocabulary())
    mounted = decorate_prompt(task, {"coach": text})[-1]["content"]
    assert "<coach>" in mounted and set(units(mounted)) <= vocab


def test_coach_memory_failed_verdicts_nothing_missed_and_errors():
    task = task_bank("train", n=1, seed=0)[0]
    crits = list(task.rubric)
    target = max(crits, key=lambda c: c.weight)
    ok = {c.id: c.weight > 0 for c in crits}  # everything satisfied
    assert coach_memory(task, ["r"] * 3, [ok] * 3, rule="majority") is None
    # every group (the default): nothing missed -> the best rollout's behaviours, the
    # criteria it satisfied by |weight| then rubric order
    order = sorted(range(len(crits)), key=lambda i: (-abs(crits[i].weight), i))
    hints = [guidance_hint(crits[i].text, crits[i].weight) for i in order[:2]]
    assert coach_memory(task, ["r"] * 3, [ok] * 3) == format_coach(hints)
    # one miss in three is named under every_group, not under majority
    other = crits[order[-1]]
    one_miss = [dict(ok, **{other.id: not (other.weight > 0)}), ok, ok]
    assert coach_memory(task, ["r"] * 3, one_miss, rule="majority") is None
    assert coach_memory(task, ["r"] * 3, one_miss, max_hints=1) == format_coach(
        [guidance_hint(other.text, other.weight)]
    )
    with pytest.raises(ValueError, match="rule must be one of"):
        coach_memory(task, ["r"] * 3, [ok] * 3, rule="sometimes")
    # One valid verdict (unsatisfied), two failed: the failed ones do not dilute it.
    rows = [dict(ok, **{target.id: not (target.weight > 0)}), dict(ok, **{target.id: None})]
    rows.append({k: v for k, v in ok.items() if k != target.id})  # a missing verdict
    shares = missed_shares(task, rows)
    assert shares[crits.index(target)] == 1.0
    assert coach_memory(task, ["r"] * 3, rows) is not None
    # Every verdict on it failed: no evidence, no hint.
    all_failed = [dict(ok, **{target.id: None})] * 3
    assert math.isnan(missed_shares(task, all_failed)[crits.index(target)])
    assert coach_memory(task, ["r"] * 3, all_failed, rule="majority") is None
    assert guidance_hint(target.text, target.weight) not in coach_memory(
        task, ["r"] * 3, all_failed
    )
    none_valid = [{c.id: None for c in crits}] * 3
    assert coach_memory(task, ["r"] * 3, none_valid) is None  # nothing to summarise
    with pytest.raises(ValueError, match="2 responses but 3 verdict rows"):
        coach_memory(task, ["r"] * 2, [ok] * 3)
    with pytest.raises(ValueError, match="not in the task's rubric"):
        coach_memory(task, ["r"], [dict(ok, bogus=True)])


def test_coach_words_are_in_the_domain_vocabulary_for_every_criterion():
    vocab = set(domain_vocabulary())
    for task in task_bank("train", n=60, seed=1):
        crits = list(task.rubric)
        missed_all = [{c.id: c.weight < 0 for c in crits}] * 2
        text = coach_memory(task, ["r"] * 2, missed_all, max_hints=len(crits))
        assert text is not None and text.count("remember :") == len(crits)
        assert set(units(text)) <= vocab, set(units(text)) - vocab


def test_coach_memories_reads_a_judged_step():
    tasks = task_bank("train", n=2, seed=0)
    groups = []
    for k, task in enumerate(tasks):
        crits = list(task.rubric)
        trajs = [
            Trajectory(
                tokens=(1,),
                logprobs=(0.0,),
                finish_reason="stop",
                weight_version=0,
                response="r",
                verdicts=tuple(Verdict(c.id, (c.weight > 0) == (k == 0)) for c in crits),
            )
            for _ in range(3)
        ]
        groups.append(Group(task, trajectories=trajs))
    memories = coach_memories(Rollouts(0, groups), rule="majority")
    assert memories[0] is None  # group 0 satisfied everything
    assert coach_memories(Rollouts(0, groups))[0].startswith("remember : ")
    assert memories[1] == coach_memory(
        tasks[1], ["r"] * 3, [t.verdicts for t in groups[1].trajectories], rule="majority"
    )
    assert memories[1].startswith("remember : ")
