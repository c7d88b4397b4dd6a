"""The critic's stated power on the scripted policy (``harness_critic_check.critic_power``):
the real controller's cold start calibrates the paired rule on 256 tasks, and candidates whose
true effect is the band's lower bound, or 0, go through the real critic."""

from __future__ import annotations

import numpy as np
import pytest

from configs import harness_rl
from rubric_rl.checks.controller_check import ScriptedPolicy, scripted_run

pytest.importorskip("chromadb")


def power_config(measurement: str = "paired"):
    c = harness_rl.get_config("smoke")
    c.unlock()
    c.rollout.update(tasks_per_step=8, samples_per_task=8)
    c.domain.n_train = 256
    c.train.steps = 40
    c.harness.cold_start.update(tasks=256, groups=2)
    c.harness.measurement = measurement
    c.harness.max_rollout_measurements = 64
    c.lock()
    return c


def test_paired_critic_accepts_the_lower_bound_and_rejects_no_effect():
    from rubric_rl.checks.harness_critic_check import critic_power

    r = critic_power(power_config(), coupling=0.5, n_tasks=48, repeats=4)
    cal = r.calibrated
    assert cal["measurement"] == "paired" and cal["tasks"] == 256
    assert cal["rollout_power"]["pairs"] == 256
    assert r.threshold is not None and 0 < r.threshold < r.band[0]
    assert r.trials >= 160
    # The bar, on candidates that went through the real critic.
    assert r.acceptance["lower"] >= 0.8, r
    assert r.acceptance["0.0"] <= 0.10, r
    # The unpaired rule's band is reported beside it, with its power of about one half.
    assert 0.4 <= cal["unpaired"]["rollout_power"]["at_lower"] <= 0.6


def test_seed_shared_sampling_pairs_the_stand_in(tmp_path):
    """Prompts on one seed index draw the same requirements; with coupling 1 a placebo field
    changes nothing, with coupling 0 it redraws most of them."""
    from rubric_rl.checks.controller_check import scripted_services_generate
    from rubric_rl.checks.harness_critic_check import NamedGainPolicy
    from rubric_rl.methods.harness_rl.cold_start import PLACEBO_TEXT

    c = power_config()
    run = scripted_run(c, ScriptedPolicy(seed=0), str(tmp_path))
    ctl = run.controllers.sampler
    run.services.begin_step(3)
    tasks = list(ctl.tasks[:6])
    placebo = [ctl.style.mount(t, {"criterion": PLACEBO_TEXT}) for t in tasks]
    names = [t.id for t in tasks]
    seeds = list(range(100, 106))
    out = {}
    for coupling in (1.0, 0.0):
        policy = NamedGainPolicy(seed=0, coupling=coupling)
        gen = scripted_services_generate(policy, run.services, run.domain.train)
        _, a = gen([t.messages for t in tasks], 16, names=names, seed_indices=seeds)
        _, b = gen(placebo, 16, names=names, seed_indices=seeds)
        same = [x.response == y.response for ga, gb in zip(a, b) for x, y in zip(ga, gb)]
        out[coupling] = float(np.mean(same))
    assert out[1.0] == 1.0 and out[0.0] < 0.5
    # Without seed indices, repeats of a prompt in one call are drawn apart.
    policy = NamedGainPolicy(seed=0, coupling=1.0)
    gen = scripted_services_generate(policy, run.services, run.domain.train)
    _, (g1, g2) = gen([tasks[0].messages] * 2, 16, names=[names[0]] * 2)
    assert [x.response for x in g1] != [x.response for x in g2]
