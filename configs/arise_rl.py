"""ARISE-RL (seed 002): generator–solver co-evolution on one policy, difficulty-shaped generator
reward, tool-grounded rubrics and reward-gated self-evolution distillation (RG-SED).

    python -m rubric_rl.launch --config=configs/arise_rl.py              # embedded default (CPU)
    python -m rubric_rl.launch --config=configs/arise_rl.py:smoke        # seconds, for tests
    python -m rubric_rl.launch --config=configs/arise_rl.py:no_rgsed     # an ablation (below)

The run is ``arise_rl.cycles`` co-evolution cycles (rubric_rl/methods/arise_rl/arise_rl.py): each
trains the generator role (agent episodes with a ``lookup`` tool writing ``<question>`` +
``<rubric>``; R_G = R_tool · R_fmt · (1 + R_diff) from K = 8 solver attempts, γ = 0.9), refreshes
the solver's pool of generated tasks (deduplicated, the 10 most recent as in-context negatives),
then trains the solver role on it (r = 0.8 s + 0.2·1[s = 1] with s the weighted satisfaction of
the generated rubric). RG-SED for both roles: a coach's memory m, memory rollouts measuring Δr
(never trained), SD toward the same policy with m in the system message, gated
λ = λ0 · sigmoid((Δr − τ)/T) · w(t) · d(t), λ0 = ``loss.sd_coef`` = 0.5, τ = 0.05, T = 0.0125,
cosine warm-up 20 steps, cosine decay over 120 steps to 0.1, the ``sampled`` estimator (the
authors' code). The solver is evaluated on the domain's held-out designed tasks.

Variants (comma-separated, big_vision style):
- ``smoke``: seconds on a CPU; ``model=<preset>``; ``protocol``: the evaluation of
  ``benchmarks/protocol.md`` (held-out 512 every 10 steps, validation, OOD);
- ``seed_scale``: the seed's schedule (3 cycles of 120 solver steps, pool 500, 1000 refresh
  rollouts, 16 rollouts per query at temperature 0.8) — hours on a CPU;
- ablations (seed Table 2): ``no_rgsed`` (no SD, no memory rollouts), ``no_gate`` (gate ≡ 1:
  "w/o reward gating"), ``no_tool`` (R_tool ≡ 1), ``no_difficulty`` (R_diff := 0);
- self-evolution baselines as their frameworks (notes/baselines.md §6), SD off: ``dr_zero``
  (its proposer reward 0.5·f + difficulty, HRPO's task-type-grouped baseline) and
  ``absolute_zero`` (format-aware learnability with −0.5 / −1, TRR++ per-role baselines);
  ``shape=<dr_zero|absolute_zero>``: only their difficulty shape in R_diff's place (RG-SED on);
  distillation baselines with an EXTERNAL teacher (§7; give
  ``--config.teacher.model=<preset> --config.teacher.params=<orbax dir>``, e.g. a larger preset's
  ``warmstart/params`` from a longer warm start): ``opcd`` (the teacher sees the memory, reverse
  KL, constant λ) and ``gkd`` (the teacher sees the student's prompt, JSD β = 0.5);
  ``solver_grpo``: solver-only GRPO on the designed training tasks with the same warm start,
  reward shape and step count;
- options: ``current_solver`` (K attempts on the live policy instead of the solver frozen at
  the cycle's start), ``hard_gate`` (the seed's eq. 12 gate 1[Δr > τ], not the authors' sigmoid),
  ``final_turn`` (distil only the last assistant turn of a multi-turn rollout), ``placement=
  last_user`` (m appended to the last user message instead of the system message),
  ``estimator=full|topk|sampled``;
- ``sql``: the generator role over the SQL env (``arise_rl.generator_domain="sql"``,
  rubric_rl/envs/sql_writer.py): the generator explores a training-split database
  with the env's read-only tools and writes ``<question>`` + ``<rubric>`` of checkable items
  (``answer_equals`` grounded in its own tool observations, ``queried_tables``, ``no_write``…);
  the solver runs agent episodes in the SQL env (``rollout.mode="agent"``, configs/grpo.py's
  ``apply_tool_domain``) for its trained rollouts, K attempts, memory rollouts and base probe.
  Meant for a real model: ``sql,gpu`` (``gpu=<checkpoint dir>`` or $QWEN3_4B_PATH, SGLang, as
  configs/grpo.py:gpu); ``sql,smoke`` is the CPU check. Ours: the whole variant (the seed's
  tools are web search / maps / OTA tools), its generator turn budget (160 tokens embedded,
  ``rollout.max_new_tokens`` with ``gpu``), no generator warm-start demonstrations.

Ours on the embedded default (the seed states none of it): 3 cycles of 10 generator and 30
solver steps, 16 tasks x 8 rollouts per step, pool 128 from 256 refresh rollouts, 4 memory
rollouts per group, 25 % of the warm-start corpus given to generator demonstrations (3
in-context negatives: a 10-negative role prompt is ~285 tokens, longer than the tiny policy's
other prompts by 5x), generator turns up to 96 tokens, a 1500-step warm start at batch 16
without the copy phase (the generator's parse rate: benchmarks/protocol_arise_rl.md).
"""

from __future__ import annotations

from configs import common, grpo
from rubric_rl.methods.arise_rl.arise_rl import AriseRLConfig
from rubric_rl.methods.method import section_defaults

VARIANTS = (
    "smoke", "model", "protocol", "seed_scale", "no_rgsed", "no_gate", "no_tool", "no_difficulty",
    "dr_zero", "absolute_zero", "hard_gate", "final_turn", "placement", "estimator",
    "current_solver", "opcd", "gkd", "solver_grpo", "sql", "gpu", "shape",
)  # fmt: skip
ARMS = (
    "no_rgsed", "no_gate", "no_tool", "no_difficulty", "dr_zero", "absolute_zero", "opcd", "gkd",
    "solver_grpo",
)  # fmt: skip


def get_arise_rl_section() -> common.ConfigDict:
    """``config.arise_rl``: ``AriseRLConfig``'s defaults (each field's comment in
    rubric_rl/methods/arise_rl/arise_rl.py says what is the seed's and what is ours)."""
    return common.ConfigDict(section_defaults(AriseRLConfig))


def get_config(arg: str | None = None) -> common.ConfigDict:
    variants = common.parse_arg(arg)
    unknown = set(variants) - set(VARIANTS)
    if unknown:
        raise ValueError(
            f"configs/arise_rl.py: unknown variant(s) {sorted(unknown)}; known: "
            f"{', '.join(VARIANTS)}"
        )
    arms = [a for a in ARMS if a in variants]
    if len(arms) > 1:
        raise ValueError(f"configs/arise_rl.py: one ablation or baseline at a time, got {arms}")
    c = common.get_base_config()
    c.method = "arise_rl"
    c.controllers = dict(sampler="arise_rl")
    c.arise_rl = get_arise_rl_section()
    c.loss.update(reward="arise_rl_solver", sd_estimator="sampled", sd_coef=0.5)
    c.rollout.update(tasks_per_step=16, samples_per_task=8)
    c.rollout.agent.update(max_turns=3, max_total_tokens=512, tools_in_system=False)
    c.domain.update(generator_demos=0.25, generator_negatives=3)
    c.model.update(
        max_prompt_len=256, prompt_buckets=(32, 64, 128, 192), max_teacher_prompt_len=320
    )
    # Generator answers (question + rubric) run to ~80 tokens: demonstrations are kept whole
    # (solver rollouts keep rollout.max_new_tokens).
    c.warmstart.update(max_prompt_len=256, prompt_buckets=(64, 128, 192), completion_len=96)
    # Measured on the generator's parse rate alone (benchmarks/protocol_arise_rl.md, amendment 1):
    # the default 500 steps (200 of them copy demonstrations, batch 32) left 0 of 128 generator
    # episodes parseable; 1500 steps of the mixed corpus at batch 16 without the copy phase give
    # 24 of 64 parseable, 60 of 64 tool-grounded (benchmarks/generator_parse_rate.py).
    # copy_fraction stays at the 0.1 this was measured (and the comparison ran) with; the base
    # default is 0.2, for the constraint domain's copy criteria (defaults.py).
    c.warmstart.update(steps=1500, batch=16, copy_steps=0, copy_fraction=0.1)
    c.rollout.buckets = (8, 16, 24, 32, 64, 96)
    if "seed_scale" in variants:
        c.arise_rl.update(solver_steps=120, pool_size=500, refresh_rollouts=1000, n_negatives=10)
        c.domain.generator_negatives = 10
        c.rollout.update(samples_per_task=16, temperature=0.8)
        c.model.update(max_prompt_len=384, prompt_buckets=(64, 128, 256, 320),
                       max_teacher_prompt_len=448)  # fmt: skip
        c.warmstart.update(max_prompt_len=384, prompt_buckets=(64, 128, 256, 320))
    if "protocol" in variants:
        common.apply_protocol(c)
        c.rollout.update(tasks_per_step=16, samples_per_task=8)
    if "gpu" in variants:
        if "sql" not in variants:
            raise ValueError(
                "configs/arise_rl.py: 'gpu' is for the 'sql' variant (the constraint generator "
                "domain needs the embedded tokenizer); use 'sql,gpu'"
            )
        grpo.apply_gpu(c, variants["gpu"])
    if "smoke" in variants:
        grpo.apply_smoke(c)
        c.model.update(max_prompt_len=192, prompt_buckets=(32, 64, 128), max_teacher_prompt_len=256)
        c.warmstart.update(max_prompt_len=192, completion_len=16)
        c.rollout.update(samples_per_task=2, tasks_per_step=2)
        c.arise_rl.update(
            cycles=2, generator_steps=1, solver_steps=2, pool_size=4, pool_min=2,
            refresh_rollouts=4, refresh_batch=4, n_negatives=1, generator_max_new_tokens=16,
            k_attempts=2, memory_rollouts=2, warmup_steps=0, base_probe_tasks=2,
        )  # fmt: skip
        c.domain.generator_negatives = 1
        c.rollout.agent.max_total_tokens = 256
    if "sql" in variants:
        c.arise_rl.generator_domain = "sql"
        grpo.apply_tool_domain(c, "sql", embedded="gpu" not in variants, smoke="smoke" in variants)
        c.domain.update(generator_demos=0.0, generator_negatives=0)  # the constraint domain's
        if "gpu" not in variants:
            # The embedded tokenizer: the generator's words are tokens (builders._tool_domain),
            # and an episode has room for the role prompt (~550 tokens with the tools block and
            # the negatives; ours) and 3 turns.
            c.domain.generator_units = True
            c.rollout.agent.max_total_tokens = 1152
            c.model.update(
                max_prompt_len=1152, max_teacher_prompt_len=1408,
                prompt_buckets=(512, 640, 896, 1152),
            )  # fmt: skip
        c.arise_rl.generator_max_new_tokens = (
            int(c.rollout.max_new_tokens) if "gpu" in variants else 160
        )
        if "smoke" in variants:
            c.rollout.agent.update(max_turns=3)
        # Every criterion of an SQL task (designed or generated) is a rule checker: no LLM judge.
        c.judge.kind = "programmatic"
    if "no_rgsed" in variants:
        c.loss.update(sd_estimator="none", sd_coef=0.0)
    if "no_gate" in variants:
        c.arise_rl.gate = "none"
    if "no_tool" in variants:
        c.arise_rl.tool_grounding = False
    if "no_difficulty" in variants:
        c.arise_rl.difficulty = False
    if "dr_zero" in variants:
        # Dr. Zero as its framework (notes/baselines.md §6.1): its proposer reward 0.5·f +
        # difficulty, HRPO's baseline shared by the generator groups of a task type (its hop
        # count), no self-distillation. Approximated where the rubric setting has no counterpart
        # (arise_rl.proposer_reward documents each term); J rollouts per prompt, not one.
        c.arise_rl.update(proposer_reward="dr_zero", advantage_grouping="hrpo")
        c.loss.update(sd_estimator="none", sd_coef=0.0)
    if "absolute_zero" in variants:
        # Absolute Zero as its framework (§6.2): format-aware learnability (−0.5 invalid, −1 a
        # format error), TRR++ (a baseline per role x task type, one std), no self-distillation.
        c.arise_rl.update(proposer_reward="absolute_zero", advantage_grouping="trr++")
        c.loss.update(sd_estimator="none", sd_coef=0.0)
    if "shape" in variants:
        # A baseline's difficulty shape in R_diff's place, inside ARISE-RL (RG-SED on): the
        # comparison of the difficulty shapes alone, not of the frameworks.
        c.arise_rl.shape = variants["shape"]
    if "opcd" in variants:
        # OPCD (notes/baselines.md §7.1, ours where inferred): the external teacher sees the
        # coach's memory, the student the plain prompt; reverse KL, constant λ = λ0, no gate.
        c.arise_rl.teacher = "opcd"
        # OPCD's loss is the per-token reverse KL averaged over each sequence, then over
        # sequences; the coach writes memory for every group, so every group has its context.
        c.loss.update(sd_estimator="full", sd_agg_mode="seq-mean-token-mean")
    if "gkd" in variants:
        # GKD (§7.2): the external teacher sees the student's own prompt; generalised JSD with
        # β = 0.5 (TRL's default) on the on-policy rollouts, constant λ = λ0.
        c.arise_rl.teacher = "gkd"
        c.loss.update(sd_estimator="jsd", sd_jsd_beta=0.5)
    if "solver_grpo" in variants:
        # Solver-only GRPO (the baseline): the domain's designed training tasks and seed
        # rubrics, ARISE-RL's weighted solver reward, the same warm start (generator
        # demonstrations included: the arms of a seed share it) and number of steps; no generator
        # role, no self-distillation.
        c.method = "grpo"
        c.controllers.sampler = "uniform"
        c.loss.update(reward="arise_rl_solver_weighted", sd_estimator="none", sd_coef=0.0)
    if "current_solver" in variants:
        c.arise_rl.solver_policy = "current"
    if "hard_gate" in variants:
        c.arise_rl.gate = "hard"
    if "final_turn" in variants:
        c.arise_rl.sd_scope = "final_turn"
    if "placement" in variants:
        c.arise_rl.memory_placement = variants["placement"]
    if "estimator" in variants:
        c.loss.sd_estimator = variants["estimator"]
    if "model" in variants:
        c.model.name = variants["model"]
    a = c.arise_rl
    c.train.steps = a.cycles * (a.generator_steps + a.solver_steps)
    c.lock()
    return c
