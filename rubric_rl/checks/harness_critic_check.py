"""The critic's power on a scripted policy: the real HarnessRL controller (cold start, bands,
critic) with a stand-in policy where guidance on a named criterion raises its pass rate by a
scripted amount, so that the true effect d of each candidate (points) is known.

- The stand-in (``ScriptedPolicy``): every reachable requirement passes with probability 1/2 at
  every step (a static policy, so the cold start's null is the critic's); a ``<criterion>``
  field stating a task's named requirement raises that requirement's pass rate by g_t; every
  other requirement is unaffected.
- The true effect is linear in g_t: a requirement's draws are independent of the others', so
  E[r] = P(met)·E[r | met] + (1 − P(met))·E[r | unmet] and d_t(g) = g · s_t with
  s_t = E[r | met] − E[r | unmet]. s_t is estimated per task from ``slope_samples`` seed-shared
  pairs (the requirement always met against p = 1/2, doubled), and g_t = d / s_t; a task whose
  s_t is below ``2 d`` cannot reach d (g ≤ 1/2) and is not used.
- Each trial: one ``add(<criterion>)`` candidate per task through ``HarnessController._critic``
  (the unpaired rule compares with a recorded group of J, drawn on the training stream), on
  ``repeats`` steps (fresh seeds each).

``critic_power(config, coupling, effects)`` returns the calibrated band and, per effect d (a
number, or ``"lower"`` for the band's lower bound), the share of candidates accepted. Ours: the
seed defines no such check.
"""

from __future__ import annotations

import dataclasses
import tempfile
from collections.abc import Sequence
from typing import Any

import numpy as np

from rubric_rl.checks.controller_check import DEFAULT_SCRIPT, CriterionScript, ScriptedPolicy

STATIC_P = 0.5


def static_script() -> dict[str, CriterionScript]:
    """Every reachable requirement at P(met) = 1/2 at every step, no skill gain."""
    return {
        k: v if v.end == 0 else CriterionScript(STATIC_P, STATIC_P, tau=1e9)
        for k, v in DEFAULT_SCRIPT.items()
    }


class NamedGainPolicy(ScriptedPolicy):
    """``ScriptedPolicy`` where guidance raises only the named requirement of each task, by
    ``gains[task id] = (requirement kind, g)``."""

    def __init__(self, *, seed: int = 0, coupling: float = 1.0):
        super().__init__(static_script(), seed=seed, coupling=coupling)
        self.gains: dict[str, tuple[str, float]] = {}

    def guidance_gain(self, task, requirement, script) -> float:
        kind, g = self.gains.get(task.id, ("", 0.0))
        return g if requirement.kind == kind else 0.0


@dataclasses.dataclass(frozen=True)
class PowerReport:
    measurement: str
    band: tuple[float, float]
    threshold: float | None
    calibrated: dict[str, Any]
    tasks: int  # tasks used per trial round
    trials: int  # candidates per effect
    acceptance: dict[str, float]  # effect label -> share accepted
    effects: dict[str, float]  # effect label -> d (points)


def _named_requirement(task, st):
    """The task's requirement whose rubric criterion (same text) weighs most, and it."""
    from rubric_rl.envs.constraint_domain import task_requirements

    by_text = {c.text: c for c in st.criteria if c.weight > 0}
    pairs = [(by_text[r.text], r) for r in task_requirements(task) if r.text in by_text]
    pairs = [(c, r) for c, r in pairs if DEFAULT_SCRIPT.get(r.kind, CriterionScript(0, 0)).end]
    return max(pairs, key=lambda x: x[0].weight, default=(None, None))


def _mean_reward(ctl, task, responses) -> float:
    from rubric_rl.methods.harness_rl.state import mean_points, row_reward

    ht = ctl.harness_task(task)
    rows = ctl.services.judge([ht], [list(responses)])[0]
    return mean_points([row_reward(ht.rubric.criteria, row) for row in rows])


def critic_power(
    config: Any,
    *,
    coupling: float = 1.0,
    effects: Sequence[float | str] = ("lower", 0.0),
    n_tasks: int = 48,
    repeats: int = 4,
    slope_samples: int = 64,
    seed: int = 0,
) -> PowerReport:
    """The critic's acceptance of scripted candidates of true effect d (module docstring)."""
    from rubric_rl.checks.controller_check import scripted_run
    from rubric_rl.methods.harness_rl.attributor import CriterionLabel, TaskAttribution
    from rubric_rl.methods.harness_rl.proposer import Candidate, GuidanceOp

    policy = NamedGainPolicy(seed=seed, coupling=coupling)
    with tempfile.TemporaryDirectory() as workdir:
        run = scripted_run(config, policy, workdir)
        ctl = run.controllers.sampler
        run.services.begin_step(1)
        ctl.sample_tasks(1, np.random.default_rng(seed))  # the cold start calibrates
        band = (ctl.rollout_band.lower, ctl.rollout_band.upper)
        ds = {str(e): band[0] if e == "lower" else float(e) for e in effects}
        need = 2.0 * max(ds.values())
        chosen = []  # (task, state, criterion, requirement, slope s_t)
        for task in ctl.tasks:
            st = ctl._task_state(task)
            crit, req = _named_requirement(task, st)
            if crit is None:
                continue
            policy.gains[task.id] = (req.kind, 1.0)
            guided = ctl.style.mount(task, {"criterion": req.text})
            salt = 10_007 + ctl.index[task.id]
            on = [policy.respond(task, guided, 1, j, salt=salt) for j in range(slope_samples)]
            off = [
                policy.respond(task, task.messages, 1, j, salt=salt) for j in range(slope_samples)
            ]
            policy.gains.pop(task.id)
            slope = 2.0 * (_mean_reward(ctl, task, on) - _mean_reward(ctl, task, off))
            if slope >= need:
                chosen.append((task, st, crit, req, slope))
            if len(chosen) == n_tasks:
                break
        if len(chosen) > ctl.config.max_rollout_measurements:
            raise ValueError(
                f"critic_power: {len(chosen)} candidates a step, over "
                f"harness.max_rollout_measurements={ctl.config.max_rollout_measurements}"
            )
        if not chosen:
            raise ValueError(f"critic_power: no task can reach an effect of {need / 2:.1f} points")
        acceptance = {}
        for label, d in ds.items():
            accepted = []
            for rep in range(repeats):
                step = 2 + rep
                run.services.begin_step(step)
                work = []
                for task, st, crit, req, slope in chosen:
                    policy.gains[task.id] = (req.kind, d / slope)
                    op = GuidanceOp("add", "criterion", req.text, crit.id)
                    cand = Candidate("rollout", task.id, "blind", crit.id, (op,))
                    lab = CriterionLabel(crit.id, "blind", 0.5, STATIC_P, "scripted")
                    att = TaskAttribution(task.id, (lab,), 0.5, False)
                    recorded = [
                        policy.respond(task, task.messages, step, j)
                        for j in range(int(config.rollout.samples_per_task))
                    ]
                    baseline = _mean_reward(ctl, task, recorded)
                    work.append((task, st, att, {"rollout": cand}, tuple(recorded), baseline))
                verdicts = ctl._critic(step, work)
                accepted += [verdicts[(w[0].id, "rollout")].accepted for w in work]
            policy.gains.clear()
            acceptance[label] = float(np.mean(accepted))
        return PowerReport(
            measurement=ctl.config.measurement,
            band=band,
            threshold=ctl.rollout_threshold,
            calibrated=dict(ctl.calibrated or {}),
            tasks=len(chosen),
            trials=len(chosen) * repeats,
            acceptance=acceptance,
            effects=ds,
        )


__all__ = ["NamedGainPolicy", "PowerReport", "critic_power", "static_script"]
