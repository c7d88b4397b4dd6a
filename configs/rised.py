"""RISED (seed 003): rubric-profile online group selection across environments, positive-rubric
self-distillation and negative-rubric anti-patterns (rubric_rl/methods/rised/rised.py).

    python -m rubric_rl.launch --config=configs/rised.py               # embedded default (CPU)
    python -m rubric_rl.launch --config=configs/rised.py:smoke         # seconds, for tests
    python -m rubric_rl.launch --config=configs/rised.py:grpo_k        # a baseline (below)

Each step samples 2k candidate groups with fixed per-environment quotas (the embedded domain's
task types are the environments; ``hard`` adds RISED's deliberately hard one), tags every
rollout with the rubric vocabulary, keeps k groups by the greedy round-robin profile selection,
and trains them with GRPO on the environment's outcome (``loss.reward="task_verifier"``, KL to
the reference) plus self-distillation whose teacher sees the rollout's positive rubrics; an
environment whose rollouts showed more negative than positive rubrics gets an anti-patterns
block in its next prompts.

Variants (comma-separated, big_vision style):
- ``smoke``: seconds on a CPU; ``model=<preset or HF dir>``; ``hard``: the hard environment
  (tasks with >= 5 stated constraints, ``domain.hard_min_constraints``);
- ``protocol``: the evaluation of ``benchmarks/protocol.md`` (held-out every 10 steps, 150
  steps) with RISED's budget: 2k = 32 candidate groups, k = 16 trained;
- baselines (seed §4.2), each tagging its rollouts too (for the behaviour analyses):
  ``grpo_k`` (k groups generated and trained), ``grpo_2k`` (2k generated, all trained),
  ``top_var`` / ``var_target`` (k of 2k by within-group reward variance: the k largest / k
  drawn with probability ∝ variance, per-environment quotas; ``rised.variance_targeting``
  ``pool_multiple`` gives the previous arm, the k closest to 2× the pool mean),
  ``all_rubric_sd`` (k groups, no selection, no anti-patterns, teacher conditioned on all
  tagged rubrics);
- ablations: ``no_select`` (a uniformly random k of the same 2k candidates, per-environment
  quotas, SD and anti-patterns on; ``no_select_k``: the previous reading, k groups generated
  and all trained), ``no_sd``,
  ``positive_only`` (positive-rubric teacher, no anti-patterns), ``all_rubric`` (all-rubric
  teacher, no anti-patterns);
- ``beta=<float>``: the overlap penalty;
- ``tools=<env>[+<env>]`` (``sql``, ``inventory``, ``sql+inventory``): those tool environments
  join the mix (``domain.tool_envs``, envs/mixed_domain.py): their tasks are agent episodes,
  the constraint task types stay single-turn, one step batches both; the warm start gets their
  reference episodes, the vocabulary their behaviours' rubrics
  (envs/tool_behaviours.py), and the token limits are the largest environment's
  (configs/grpo.py ``_TOOL_LIMITS``; every completion, a constraint answer too, may then run to
  its ``max_new_tokens``: ours). Meant for the embedded model (``smoke,tools=sql`` is the CPU
  check) and for the per-environment pass rates of a policy that can run the tools;
- ``single_env=<env>``: the transfer analysis's training run (seed §2.3, C.1: WebShop-only /
  DBBench-only training, every environment evaluated): only ``<env>``'s training tasks are
  sampled (``rised.train_environment``), a checkpoint every 25 steps is kept (the seed's
  analysis steps: 25 the baseline, 50..500 the checkpoints; ``smoke``: every step), and the
  validation split (at least 64 tasks) is evaluated at every checkpoint. It combines with an
  arm: ``single_env=list,grpo_k`` trains plain GRPO, our reading of the seed's preliminary
  analysis (it does not say which trainer its single-environment runs used). Analyse the run
  with ``python -m rubric_rl.methods.rised.rised_transfer <workdir>``.

What the seed states and what is ours: the module docstrings of rubric_rl/methods/rised/rised*.py
and the README's "RISED" section. Ours here: k = 16 of 32 on the embedded default (the seed: 64 of
128 groups of 8 rollouts); sd_estimator "full" (reverse KL over the vocabulary) with sd_coef 0.01,
chosen on the validation split (the seed gives neither; benchmarks/protocol_rised.md amendment 1);
kl_beta 0.001 (HarnessRL's; AgentRL's value is unknown).
"""

from __future__ import annotations

from configs import common, grpo
from rubric_rl.methods.method import section_defaults
from rubric_rl.methods.rised.rised import FROM_OTHER_SECTIONS, RisedConfig

VARIANTS = (
    "smoke", "model", "hard", "protocol", "beta", "grpo_k", "grpo_2k", "top_var", "var_target",
    "all_rubric_sd", "no_select", "no_select_k", "no_sd", "positive_only", "all_rubric",
    "single_env", "tools",
)  # fmt: skip
ARMS = ("grpo_k", "grpo_2k", "top_var", "var_target", "all_rubric_sd", "no_select",
        "no_select_k", "no_sd", "positive_only", "all_rubric")  # fmt: skip
# single_env: the seed's checkpoint spacing (step 25 the baseline, 50..500 analysed); keep is
# "all of them" for any step count (ours: a bound orbax needs).
TRANSFER_EVERY = 25
TRANSFER_KEEP = 1000
TRANSFER_VALIDATION = 64  # ours: validation tasks at least (the pools and pass rates)


def get_rised_section() -> common.ConfigDict:
    """``config.rised`` at its defaults: ``RisedConfig``'s fields (each documented there; k and
    the seed come from ``rollout.train_groups`` and ``train.seed``)."""
    return common.ConfigDict(section_defaults(RisedConfig, *FROM_OTHER_SECTIONS))


def get_config(arg: str | None = None) -> common.ConfigDict:
    variants = common.parse_arg(arg)
    unknown = set(variants) - set(VARIANTS)
    if unknown:
        raise ValueError(
            f"configs/rised.py: unknown variant(s) {sorted(unknown)}; known: {', '.join(VARIANTS)}"
        )
    arms = [a for a in ARMS if a in variants]
    if len(arms) > 1:
        raise ValueError(f"configs/rised.py: one baseline or ablation at a time, got {arms}")
    c = common.get_base_config()
    c.method = "rised"
    c.controllers = dict(sampler="env_quota")
    c.rised = get_rised_section()
    # sd_coef chosen on the validation split (benchmarks/protocol_rised.md, amendment 1): 0.5
    # (RG-SED's λ0) collapsed the policy; of {0.1, 0.03, 0.01} at 50 steps, 0.03 and 0.01 tied
    # (validation env-mean pass rate 0.076 vs 0.020 for 0.1; 0.028 at the warm start), the smaller
    # wins.
    c.loss.update(reward="task_verifier", kl_beta=0.001, sd_estimator="full", sd_coef=0.01)
    c.rollout.update(tasks_per_step=32, train_groups=16)
    if "protocol" in variants:
        common.apply_protocol(c)
        c.rollout.update(tasks_per_step=32, train_groups=16)
    if "smoke" in variants:
        grpo.apply_smoke(c)
        c.rollout.update(tasks_per_step=8, train_groups=4)
        c.eval.n = 8
    if "hard" in variants:
        c.domain.hard_min_constraints = 5
    if "beta" in variants:
        c.rised.beta = float(variants["beta"])
    if arms:
        apply_arm(c, arms[0])
    if "model" in variants:
        c.model.name = variants["model"]
    if "single_env" in variants:
        apply_single_env(c, variants["single_env"], every=1 if "smoke" in variants else None)
    if "tools" in variants:
        apply_tools(c, variants["tools"], smoke="smoke" in variants)
    c.lock()
    return c


def apply_tools(c: common.ConfigDict, names: str | bool, *, smoke: bool) -> None:
    """``tools=sql+inventory``: tool environments mixed into the embedded domain (the module
    docstring). The limits: the largest environment's (grpo.tool_limits) over the constraint
    domain's own prompt buckets."""
    envs = [n for n in str(names if isinstance(names, str) else "").split("+") if n]
    if not envs:
        raise ValueError("configs/rised.py: tools=<env>[+<env>] names tool environments, e.g. "
                         "tools=sql")  # fmt: skip
    for e in envs:
        if e not in grpo.TOOL_DOMAINS:
            raise ValueError(
                f"configs/rised.py: tools={names!r}: {e!r} is not a tool environment; known: "
                f"{', '.join(grpo.TOOL_DOMAINS)}"
            )
    lims = [grpo.tool_limits(e, smoke=smoke) for e in envs]
    lim = max(lims, key=lambda x: x["max_total_tokens"])
    total = lim["max_total_tokens"]
    c.domain.tool_envs = ",".join(envs)
    c.rollout.mode = "auto"  # agent episodes for the tool environments' tasks only
    c.rollout.agent.update(
        max_turns=max(x["max_turns"] for x in lims), max_total_tokens=total, tools_in_system=True
    )
    own = tuple(b for b in c.model.prompt_buckets if b < min(lim["prompt_buckets"]))
    c.model.update(
        max_prompt_len=total,
        prompt_buckets=(*own, int(c.model.max_prompt_len), *lim["prompt_buckets"]),
        max_teacher_prompt_len=total + 256,
    )
    own_rollout = tuple(b for b in c.rollout.buckets if b < lim["max_new_tokens"])
    c.rollout.update(
        max_new_tokens=lim["max_new_tokens"],
        buckets=tuple(sorted({*own_rollout, *lim["buckets"]})),
    )
    ws = tuple(b for b in c.warmstart.prompt_buckets if b < min(lim["prompt_buckets"]))
    c.warmstart.update(
        max_prompt_len=lim["warmstart_prompt_len"],
        prompt_buckets=(*ws, *lim["prompt_buckets"]),
    )


def apply_arm(c: common.ConfigDict, arm: str) -> None:
    """A baseline or ablation of seed §4.2 / §5 on RISED's budget (k trained, 2k generated)."""
    k = int(c.rollout.train_groups)
    no_sd = dict(sd_estimator="none", sd_coef=0.0)
    if arm in ("grpo_k", "grpo_2k"):
        c.rised.update(selection="none", teacher="none", anti_patterns=False)
        c.loss.update(**no_sd)
        c.rollout.update(tasks_per_step=k if arm == "grpo_k" else 2 * k, train_groups=0)
    elif arm in ("top_var", "var_target"):
        sel = "top_variance" if arm == "top_var" else "variance_targeted"
        c.rised.update(selection=sel, teacher="none", anti_patterns=False)
        c.loss.update(**no_sd)
    elif arm == "all_rubric_sd":
        c.rised.update(selection="none", teacher="all", anti_patterns=False)
        c.rollout.update(tasks_per_step=k, train_groups=0)
    elif arm == "no_select":  # a uniformly random k of the same 2k candidates
        c.rised.selection = "random"
    elif arm == "no_select_k":  # the previous reading: only k groups generated, all trained
        c.rised.selection = "none"
        c.rollout.update(tasks_per_step=k, train_groups=0)
    elif arm == "no_sd":
        c.rised.teacher = "none"
        c.loss.update(**no_sd)
    elif arm == "positive_only":
        c.rised.anti_patterns = False
    elif arm == "all_rubric":
        c.rised.update(teacher="all", anti_patterns=False)
    else:
        raise ValueError(f"configs/rised.py: unknown arm {arm!r}")


def apply_single_env(c: common.ConfigDict, env: str | bool, *, every: int | None = None) -> None:
    """Single-environment training for the transfer analysis (module docstring, ``single_env``):
    ``env``'s training tasks only, every evaluation set still covering every environment."""
    if env is True or not str(env).strip():
        raise ValueError("configs/rised.py: single_env needs an environment, single_env=<env>")
    c.rised.train_environment = str(env).strip()
    every = TRANSFER_EVERY if every is None else int(every)
    c.checkpoint.update(every=every, keep=TRANSFER_KEEP, final=True)
    c.domain.n_validation = max(int(c.domain.n_validation), TRANSFER_VALIDATION)
    c.eval.splits.validation = every
