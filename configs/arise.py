"""ARISE (seed 000): rubric–skill pool co-evolving with the policy + capability-based sampling.

    python -m rubric_rl.launch --config=configs/arise.py                  # embedded default
    python -m rubric_rl.launch --config=configs/arise.py:smoke            # seconds, for tests
    python -m rubric_rl.launch --config=configs/arise.py:no_skills        # ablations below
    python -m rubric_rl.launch --config=configs/arise.py:frozen_rubrics=runs/arise/seed0

Variants (comma-separated, big_vision style):
- ``smoke``: seconds on a CPU, with lifecycle thresholds low enough that the pool changes;
- ``protocol``: the evaluation and budget of ``benchmarks/protocol.md`` (every arm of the ARISE
  comparison: ``protocol``, ``protocol,outcome_only``, ``protocol,no_skills``,
  ``protocol,sampler=uniform``, ``protocol,frozen_rubrics=<ARISE run of another seed>``, and
  ``configs/grpo.py:protocol``);
- ``model=<preset or HF dir>``; ``gpu`` / ``gpu=<ckpt>`` (as configs/grpo.py, LLM reflection);
- ``no_skills``: the pool evolves, its skills are never injected (ablation "no skill injection");
- ``frozen_rubrics=<run dir>``: the whole lifecycle rubric set of that run, kept fixed (ablation
  "frozen rubrics": "even the full lifecycle rubric pool, when kept fixed, does not replace
  dynamic evolution"), from ANOTHER seed's run (checked against its ``config.json``: a same-seed
  run mined its pairs from the same warm start and draws). It is read from the run's last
  complete checkpoint (``run_state`` JSON: ``controllers.arise.pool``, see
  ``rubric_rl.analysis.final_pool_state``) — a full pool state, exact;
  ``controllers/arise.jsonl`` holds transitions only, not rubric/skill texts, so it cannot
  rebuild a pool. Every pair the run ever added is judged from step 1; no pair is added or
  retired (``arise.fixed_rubrics``), while every skill starts as its capability's base text in
  the "added" state and keeps its lifecycle (activate, hide, refine) — ours: the seed fixes the
  rubric pool and says nothing of the skills' state, and the source run's refined, always-on
  skills would be more than rubrics (``arise.frozen_mode="rubrics"``).
  ``frozen_rubrics=<dir>,frozen_pool_and_skills`` is the earlier arm: live pairs keep their
  final state and skill text (retired ones come back hidden), no reflection, no transitions.
  ``--config.arise.frozen_pool_entries=final`` installs the final pool as it stood instead
  (retired pairs neither judged nor shown);
- ``sampler=uniform|variance|capability``: alternative task sampling (ARISE's ablation:
  ``uniform`` = the epoch-shuffled uniform sampler; ``variance`` = the reward-variance selector,
  SAMPLERS name ``reward_variance``, options ``arise.variance``, scoring the task reward);
- ``outcome_only``: task (verifier) reward only: no pool, no skills, uniform sampling — the
  outcome-only RL baseline under the same per-step rollout budget;
- ``smollm2``: SmolLM2-135M-Instruct on the English instruction-following domain, on a CPU
  (``configs/grpo.py:apply_smollm2``); ``smollm2,outcome_only`` is its outcome-only arm. The
  pool's criteria come from the domain's checker library; a capability (an instruction type)
  has no text in the reflection's ``skill_texts`` (the embedded domain's), so its skill is the
  criterion's own text.

Builders: ``make_arise_controller(domain.train, config.rollout.tasks_per_step,
seed=config.train.seed, llm_client=..., criteria_library=<the domain's checker library>,
**arise_controller_kwargs(config))`` (without the library, ``arise.bank="auto"`` falls back to
the seed rubric's criteria) and, when
``config.arise.frozen_pool_from`` is set, ``controller.load_pool(final_pool_state(<dir>))``.
"""

from __future__ import annotations

from configs import common, grpo

# The section's defaults and checks, and the controller's keyword arguments, live in the package
# (the package never imports configs/); re-exported here for callers of configs.arise.
from rubric_rl.methods.arise.arise_config import (  # noqa: F401
    AriseSection,
    arise_controller_kwargs,
    frozen_arm_settings,
    validate_arise,
)
from rubric_rl.methods.method import section_defaults

VARIANTS = (
    "smoke",
    "model",
    "gpu",
    "no_skills",
    "frozen_rubrics",
    "frozen_pool_and_skills",
    "sampler",
    "outcome_only",
    "protocol",
    "smollm2",
)
SAMPLER_CHOICES = {"capability": "capability", "uniform": "uniform", "variance": "reward_variance"}


def get_arise_section() -> common.ConfigDict:
    """``config.arise`` at ``AriseSection``'s defaults (rubric_rl/methods/arise/arise_config.py
    says what each field does, what is the seed's and what is ours)."""
    return common.ConfigDict(section_defaults(AriseSection))


def apply_smoke(c: common.ConfigDict) -> None:
    grpo.apply_smoke(c)
    # 4 tasks x 4 rollouts a step: thresholds such that pairs are added, activated and
    # retired within a handful of steps (a pair activates below 0.9).
    c.arise.update(
        pool_cap=4,
        max_add_per_reflection=2,
        reflect_every=1,
        activate_below=0.9,
        hide_above=0.95,
        retire_above=0.95,
        reflection_window_steps=2,
        min_reflection_rollouts=8,
        min_evals=2,
        activate_window=1,
        refine_window=2,
        hide_window=1,
        retire_window=2,
    )
    c.arise.programmatic.update(min_support=4, min_failures=2, min_separation=0.05)
    c.arise.capability.min_cell_evidence = 1.0


def get_config(arg: str | None = None) -> common.ConfigDict:
    variants = common.parse_arg(arg)
    unknown = set(variants) - set(VARIANTS)
    if unknown:
        raise ValueError(
            f"configs/arise.py: unknown variant(s) {sorted(unknown)}; known: {', '.join(VARIANTS)}"
        )
    c = common.get_base_config()
    c.method = "arise"
    # The ARISE controller is the step's sampler: it wraps arise.sampler and owns the pool.
    c.controllers = dict(sampler="arise")
    c.arise = get_arise_section()
    # ARISE normalises each signal of its mix by its group's std (GRPO), as the paper does; the
    # advantage stage honours loss.advantage (the base default "mean_only" is for the GRPO run).
    c.loss.advantage = "grpo"
    common.apply_method_default(c)
    if "protocol" in variants:
        common.apply_protocol(c)
    if "gpu" in variants:
        grpo.apply_gpu(c, variants["gpu"])
        c.arise.reflection = "llm"
        # ARISE trains "with importance-ratio filtering": sequences whose geometric-mean
        # trainer/engine ratio leaves [0.999, 1.001] are masked (rollout_correction.py).
        c.loss.rollout_correction = "geo_mask"
    if "smoke" in variants:
        apply_smoke(c)
    if "smollm2" in variants:
        grpo.apply_smollm2(c)
    if "model" in variants:
        c.model.name = variants["model"]
    if "no_skills" in variants:
        c.arise.inject_skills = False
    if "sampler" in variants:
        choice = variants["sampler"]
        if choice not in SAMPLER_CHOICES:
            raise ValueError(
                f"configs/arise.py: sampler={choice!r}; expected one of {sorted(SAMPLER_CHOICES)}"
            )
        c.arise.sampler = SAMPLER_CHOICES[choice]
    if "frozen_rubrics" in variants:
        src = variants["frozen_rubrics"]
        if src is True or not src:
            raise ValueError("configs/arise.py: frozen_rubrics needs a run dir: frozen_rubrics=DIR")
        c.arise.frozen_pool_from = src
        earlier = "frozen_pool_and_skills" in variants  # the earlier frozen arm
        c.arise.update(**frozen_arm_settings("frozen_pool_and_skills" if earlier else "rubrics"))
    elif "frozen_pool_and_skills" in variants:
        raise ValueError("configs/arise.py: frozen_pool_and_skills needs frozen_rubrics=DIR")
    if "outcome_only" in variants:
        if "frozen_rubrics" in variants:
            raise ValueError("configs/arise.py: outcome_only and frozen_rubrics exclude each other")
        c.arise.update(evolve=False, inject_skills=False, pool_cap=0, sampler="uniform")
    c.lock()
    return c
