"""Shared base config for every method (big_vision style: plain ConfigDicts, no magic).

``get_base_config()`` returns an unlocked ConfigDict; a method's ``get_config(arg)`` changes what
it needs, applies variants from ``arg`` and locks it (``lock_config``) so that a typo in a
``--config.key=value`` override is an error. ``validate_config`` runs at start-up and raises
``ValueError`` naming the offending field.
"""

from __future__ import annotations

import os
from typing import Any

import ml_collections

ConfigDict = ml_collections.ConfigDict

ENGINES = ("jax", "sglang")
JUDGES = ("programmatic", "llm")
LLM_BACKENDS = ("openai", "genai", "local")
SCHEDULES = ("constant", "warmup_cosine")
SD_ESTIMATORS = ("none", "full", "topk", "sampled")


def get_base_config() -> ConfigDict:
    c = ConfigDict()

    # --- policy -------------------------------------------------------------------------------
    # ``name``: a preset of rubric_rl.models.PRESETS or a HF checkpoint directory. The embedded
    # presets (tiny/1m/5m/20m) get their vocabulary from the domain's word-level tokenizer.
    c.model = dict(
        name="1m",
        dtype="float32",
        param_dtype="float32",
        tokenizer="",  # "" = build the embedded word-level tokenizer (cached in the workdir)
        # A prompt (guidance, skills and chat template included) longer than this is an error
        # naming the task, never truncated: a left-truncated prompt loses its instruction.
        max_prompt_len=128,
        # Each batch's prompts are left-padded to the smallest bucket that fits its longest one
        # (the jitted shapes; max_prompt_len is added as the last bucket).
        prompt_buckets=(24, 32, 48, 64, 96),
        # Self-distillation teachers see the prompt plus privileged context (controllers'
        # ``teacher_context``): the same buckets, capped at this.
        max_teacher_prompt_len=192,
        init_seed=0,
    )

    # --- device mesh (DESIGN §8): product must equal the device count (-1 = fill) -------------
    c.mesh = dict(data=-1, fsdp=1, tensor=1)

    # --- optimiser ----------------------------------------------------------------------------
    # Cosine decay to 0 over train.steps: with a constant 3e-4 the embedded default's held-out score
    # swung by 4-7 points between evaluations after step 200 (a count habit flipping back and
    # forth); decayed, it settles (measured 2026-11-30).
    c.optim = dict(
        lr=3e-4,
        schedule="warmup_cosine",
        warmup_steps=0,
        end_lr_ratio=0.0,
        weight_decay=0.0,
        max_grad_norm=1.0,
        # Optimizer updates per RL step = mini_batches x epochs (verl's PPO mini-batches and
        # epochs, GRPO's inner iterations): each epoch deals the step's rollouts into
        # ``mini_batches`` disjoint mini-batches, one update each, all against the same π_old.
        # The lr schedule counts updates. num_micro_batches splits each update further
        # (gradient accumulation, same update). Two updates per step cost no more step time than
        # one on the embedded default and gained +17.6 / +12.3 held-out points (seeds 0 / 1)
        # against +15.0 / +11.2 with one, from the same warm starts (measured 2026-11-30).
        mini_batches=2,
        epochs=1,
        num_micro_batches=1,
    )

    # --- rollouts -----------------------------------------------------------------------------
    c.rollout = dict(
        engine="jax",
        samples_per_task=8,  # J: rollouts per task (a group)
        # 32 x 8 = 256 rollouts per step. On the embedded default the held-out score per rollout
        # is about the same with 16 tasks, but 32 gets there in fewer, steadier steps: +13.8 after
        # 200 steps against +12.7 after 300 with 16 (measured 2026-11-30).
        tasks_per_step=32,
        temperature=1.0,
        top_p=1.0,  # DESIGN §9: keep 1.0 in training rollouts (the trainer scores without it)
        top_k=0,  # 0 = off
        max_new_tokens=24,
        buckets=(8, 16, 24, 32, 64, 128),  # completion lengths are padded up to one of these
        retries=2,  # engine failures retried before the error surfaces
        sglang=dict(
            url="",  # "" = start a server from ``launch`` settings below
            model_path="",
            host="127.0.0.1",
            port=30000,
            mem_fraction=0.8,
            weight_sync_dir="",  # versioned safetensors for /update_weights_from_disk
            timeout_s=600.0,
        ),
    )

    # --- loss (DESIGN §5) ---------------------------------------------------------------------
    c.loss = dict(
        clip_eps_low=0.2,
        clip_eps_high=0.2,
        dual_clip_c=3.0,  # <= 0 turns the dual clip off
        agg_mode="token-mean",
        rollout_correction="bypass",
        kl_beta=0.0,
        kl_kind="k3",
        # Self-distillation (DESIGN §5): "none" | "full" | "topk" | "sampled". The teacher is the
        # policy on the prompt plus the controllers' ``teacher_context``; λ = sd_coef × the
        # controllers' ``sd_gate``. A group without context contributes exactly 0.
        sd_estimator="none",
        sd_coef=0.0,
        sd_topk=20,
        sd_clamp=10.0,  # "sampled": clamp of lp_θ − lp_T
        # Every N steps, recompute π_old at step start to log the engine/trainer mismatch (an
        # extra forward; 0 = never). In bypass mode it only feeds diagnostics.
        mismatch_every=10,
        adv_eps=1e-6,
        zero_var_eps=1e-6,  # a group whose reward std is below this is zero-variance
        reward="weighted",  # a name in rubric_rl.rubrics.rewards.REWARDS
        # A name in rubric_rl.core.advantages.ADVANTAGE_ESTIMATORS. "mean_only" (Dr.GRPO:
        # A = r - mean_g r) keeps the rubric's weights meaningful: with GRPO's division by the
        # group std, a group whose members differ only in a 0.1-weight cue (no genuine criterion
        # varies: a blind rewrite or arithmetic task) gets the same +-1 advantages as one that
        # differs in a weight-3 requirement. Measured on the embedded default (2026-11-30): with
        # "grpo" the compliance claim rose 0.1 -> 0.9 of rollouts even at weight 0.1 (claim rows had
        # mean advantage +0.21 vs -0.12) and the held-out oracle fell; with "mean_only" fluff
        # stays rare and the oracle rises. Adam makes the update size insensitive to the smaller
        # advantage scale, so the lr is unchanged.
        advantage="mean_only",
        chunk_size=128,
    )

    # --- judge --------------------------------------------------------------------------------
    c.judge = dict(
        kind="programmatic",
        retries=2,
        max_failure_rate=0.5,  # a step with more failed verdicts than this is an error
        cache_path="",  # "" = <workdir>/judge_cache.sqlite for the LLM judge; unused otherwise
        llm=dict(
            backend="openai",
            model="",
            base_url="",
            api_key_env="OPENAI_API_KEY",  # the NAME of the env var; the key is never stored
            temperature=0.0,
            max_tokens=512,
            concurrency=32,
            timeout_s=120.0,
        ),
    )

    # --- task domain --------------------------------------------------------------------------
    # ``name``: "constraints" (the embedded synthetic domain; n_* tasks generated per split) or
    # "dataset" (rubric datasets on disk, the papers' setting: see ``dataset`` below).
    c.domain = dict(
        name="constraints",
        seed=0,
        # 4096 training tasks: 150 steps x 32 tasks draw each about once, so RL cannot memorise
        # the training tasks' answers. From the same warm starts (2 updates per step), held-out
        # scores after 150 steps were 67.1 / 65.5 with 4096 against 63.0 / 66.0 with 512 (seeds
        # 0 / 1); at p_keep 0.35 (seed 0, one update) 63.3 against 63.1 (measured 2026-11-30).
        # A sampler that keeps per-task statistics (arise.py's sampler=variance) sees each task
        # about once at this length: give it a smaller pool or more steps.
        n_train=4096,
        n_heldout=64,
        n_ood=64,
        # For name="dataset": files or directories in a rubric_rl.rubrics.datasets format
        # (healthbench, rar, rubrichub, openrubrics, jsonl). No programmatic verifier, oracle or
        # warm-start corpus: judge with judge.kind="llm" (or rule criteria) and train a
        # pretrained checkpoint (warmstart.steps=0). ``limit`` caps each split (0 = all).
        dataset=dict(format="", train="", heldout="", ood="", ood_format="", limit=0),
    )

    # --- supervised warm start (DESIGN §7) ----------------------------------------------------
    # 500 steps at 1e-3 (~65 s on the 2-core CPU): RL starts at a held-out score ~48 (p_keep 0.4)
    # with ~5-15% of tasks passed; 200 steps at 3e-4 left a policy RL could only make hack, and
    # 1500 steps memorise the 2048 demonstrations (loss 0.27, held-out 37.5; measured 2026-11-30).
    c.warmstart = dict(
        # Demonstrations whose prompt is longer than this are left out of the warm start (a few
        # guided ones): it bounds the warm start's sequence length and so its cost.
        max_prompt_len=40,
        steps=500,
        lr=1e-3,
        schedule="constant",  # or "cosine": warm-up over warmup_steps, then decay to 0
        warmup_steps=0,
        batch=32,
        corpus_size=2048,
        # Each unguided demonstration meets each stated constraint with this probability; a
        # violated format falls back to the habit (lowercase, ".", ","): envs/constraint_corpus.py.
        p_keep=0.4,
        # Train each cased word's embedding row as its lowercase row plus a shared vector per case
        # (UPPER, Capitalized) during the warm start; RL then trains every row freely. Without it a
        # from-scratch word-level policy never learns case (rubric_rl/warmstart.py). Tied word
        # embeddings only; never on a pretrained checkpoint (its cased rows would be overwritten).
        tie_case=True,
        # "" = off. A directory shared by runs (a sweep's variants of one seed): finished warm
        # starts are kept there under a hash of what they depend on and reused (warmstart.py).
        cache_dir="",
    )

    # --- evaluation (HarnessRL §3: greedy, no guidance, seed rubrics, frozen judge) ------------
    c.eval = dict(every=25, n=64, greedy=True, at_start=True)

    # --- logging ------------------------------------------------------------------------------
    c.logging = dict(
        every=1,
        tensorboard=True,
        wandb=False,
        wandb_project="rubric_rl",
        rollouts_per_step=8,  # sampled rollouts (with verdicts) written per step
        progress_bar=True,
    )

    c.checkpoint = dict(every=50, keep=3)
    # 150 RL steps of 32 x 8 rollouts: ~4 min in all on the 2-core CPU with tcmalloc (200 steps
    # took 4:57; measured 2026-11-30); the held-out score flattens after step ~100.
    c.train = dict(steps=150, seed=0, max_nonfinite_skips=3)
    return c


def parse_arg(arg: str | None) -> dict[str, Any]:
    """``"smoke,model=5m"`` -> {"smoke": True, "model": "5m"} (big_vision's variant syntax)."""
    out: dict[str, Any] = {}
    for part in (arg or "").split(","):
        part = part.strip()
        if not part:
            continue
        if "=" in part:
            k, v = part.split("=", 1)
            out[k.strip()] = v.strip()
        else:
            out[part] = True
    return out


# ------------------------------------------------------------------------------ validation


def _fail(field: str, msg: str) -> None:
    raise ValueError(f"config.{field}: {msg}")


def mesh_shape(config: ConfigDict, num_devices: int) -> tuple[int, int, int]:
    """(data, fsdp, tensor) with a -1 entry filled so that the product is ``num_devices``."""
    dims = [int(config.mesh.data), int(config.mesh.fsdp), int(config.mesh.tensor)]
    names = ("data", "fsdp", "tensor")
    if dims.count(-1) > 1:
        _fail("mesh", f"at most one axis may be -1, got {dict(zip(names, dims))}")
    for n, d in zip(names, dims):
        if d == 0 or d < -1:
            _fail(f"mesh.{n}", f"must be a positive int or -1, got {d}")
    known = 1
    for d in dims:
        if d != -1:
            known *= d
    if -1 in dims:
        if num_devices % known:
            _fail("mesh", f"{dict(zip(names, dims))} does not divide {num_devices} devices")
        dims[dims.index(-1)] = num_devices // known
    elif known != num_devices:
        _fail("mesh", f"{dict(zip(names, dims))} has {known} devices, the host has {num_devices}")
    return dims[0], dims[1], dims[2]


def _bands(config: ConfigDict, prefix: str = "") -> list[tuple[str, tuple]]:
    """Every field whose name ends in ``band`` (method configs: critic acceptance bands...)."""
    out = []
    for k, v in config.items():
        name = f"{prefix}{k}"
        if isinstance(v, ConfigDict):
            out += _bands(v, name + ".")
        elif k.endswith("band"):
            out.append((name, tuple(v)))
    return out


def validate_config(config: ConfigDict, *, num_devices: int | None = None) -> None:
    """Start-up checks; raises ValueError("config.<field>: ...") on the first problem."""
    r, lo, o = config.rollout, config.loss, config.optim
    if r.engine not in ENGINES:
        _fail("rollout.engine", f"must be one of {ENGINES}, got {r.engine!r}")
    if int(r.samples_per_task) < 2:
        _fail("rollout.samples_per_task", f"J must be > 1 (GRPO groups), got {r.samples_per_task}")
    if int(r.tasks_per_step) < 1:
        _fail("rollout.tasks_per_step", f"must be >= 1, got {r.tasks_per_step}")
    if not 0 < float(r.top_p) <= 1:
        _fail("rollout.top_p", f"must be in (0, 1], got {r.top_p}")
    if float(r.top_p) != 1.0 and r.engine == "jax":
        _fail("rollout.top_p", "the trainer scores without top-p (DESIGN §9); keep 1.0")
    if float(r.temperature) <= 0:
        _fail("rollout.temperature", f"must be > 0, got {r.temperature}")
    if int(r.max_new_tokens) < 1:
        _fail("rollout.max_new_tokens", f"must be >= 1, got {r.max_new_tokens}")
    pb = [int(x) for x in config.model.prompt_buckets]
    if pb != sorted(set(pb)) or (pb and pb[0] < 1):
        _fail("model.prompt_buckets", f"must be strictly increasing positive ints, got {pb}")
    if int(config.model.max_prompt_len) < 1:
        _fail("model.max_prompt_len", f"must be >= 1, got {config.model.max_prompt_len}")
    buckets = list(r.buckets)
    if not buckets or buckets != sorted(buckets) or len(set(buckets)) != len(buckets):
        _fail("rollout.buckets", f"must be strictly increasing and non-empty, got {buckets}")
    if max(buckets) < int(r.max_new_tokens):
        _fail("rollout.buckets", f"largest {max(buckets)} < max_new_tokens {r.max_new_tokens}")
    for f in ("clip_eps_low", "clip_eps_high"):
        if float(lo[f]) < 0:
            _fail(f"loss.{f}", f"must be >= 0, got {lo[f]}")
    if lo.sd_estimator not in SD_ESTIMATORS:
        _fail("loss.sd_estimator", f"must be one of {SD_ESTIMATORS}, got {lo.sd_estimator!r}")
    if float(lo.sd_coef) < 0:
        _fail("loss.sd_coef", f"must be >= 0, got {lo.sd_coef}")
    if lo.sd_estimator != "none" and int(config.model.max_teacher_prompt_len) < int(
        config.model.max_prompt_len
    ):
        _fail(
            "model.max_teacher_prompt_len",
            f"{config.model.max_teacher_prompt_len} < model.max_prompt_len "
            f"{config.model.max_prompt_len}: the teacher sees the prompt plus its context",
        )
    if float(lo.kl_beta) < 0:
        _fail("loss.kl_beta", f"must be >= 0, got {lo.kl_beta}")
    if float(o.lr) <= 0:
        _fail("optim.lr", f"must be > 0, got {o.lr}")
    for f in ("mini_batches", "epochs", "num_micro_batches"):
        if int(o[f]) < 1:
            _fail(f"optim.{f}", f"must be >= 1, got {o[f]}")
    if o.schedule not in SCHEDULES:
        _fail("optim.schedule", f"must be one of {SCHEDULES}, got {o.schedule!r}")
    if config.judge.kind not in JUDGES:
        _fail("judge.kind", f"must be one of {JUDGES}, got {config.judge.kind!r}")
    if config.judge.kind == "llm":
        llm = config.judge.llm
        if llm.backend not in LLM_BACKENDS:
            _fail("judge.llm.backend", f"must be one of {LLM_BACKENDS}, got {llm.backend!r}")
        if not llm.model:
            _fail("judge.llm.model", "is empty; the LLM judge needs a model name")
    if not 0 <= float(config.judge.max_failure_rate) <= 1:
        _fail("judge.max_failure_rate", f"must be in [0, 1], got {config.judge.max_failure_rate}")
    for f in ("every", "n"):
        if int(config.eval[f]) < 0:
            _fail(f"eval.{f}", f"must be >= 0, got {config.eval[f]}")
    for f in ("every", "keep"):
        if int(config.checkpoint[f]) < 1:
            _fail(f"checkpoint.{f}", f"must be >= 1, got {config.checkpoint[f]}")
    if int(config.train.steps) < 0:
        _fail("train.steps", f"must be >= 0, got {config.train.steps}")
    if int(config.warmstart.steps) > 0 and int(config.warmstart.batch) < 1:
        _fail("warmstart.batch", f"must be >= 1, got {config.warmstart.batch}")
    if not 0.0 <= float(config.warmstart.p_keep) <= 1.0:
        _fail("warmstart.p_keep", f"must be in [0, 1], got {config.warmstart.p_keep}")
    if (
        config.warmstart.tie_case
        and int(config.warmstart.steps) > 0
        and os.path.isdir(config.model.name)
    ):
        _fail(
            "warmstart.tie_case",
            f"would overwrite the cased embedding rows of the pretrained checkpoint "
            f"{config.model.name!r}; set it False to warm-start a checkpoint",
        )
    for split in ("n_train", "n_heldout", "n_ood"):
        if int(config.domain[split]) < 1:
            _fail(f"domain.{split}", f"must be >= 1, got {config.domain[split]}")
    if config.domain.name == "dataset":
        _validate_dataset_domain(config)
    # Paths that must exist (a HF checkpoint, a tokenizer directory).
    name = config.model.name
    if ("/" in name or name.startswith(".")) and not os.path.isdir(name):
        _fail("model.name", f"{name!r} is not a preset and the directory does not exist")
    if config.model.tokenizer and not os.path.isdir(config.model.tokenizer):
        _fail("model.tokenizer", f"directory {config.model.tokenizer!r} does not exist")
    if r.engine == "sglang" and not (r.sglang.url or r.sglang.model_path):
        _fail("rollout.sglang.url", "sglang engine needs a server url or a model_path to serve")
    for field, band in _bands(config):
        if len(band) != 2 or float(band[0]) > float(band[1]):
            _fail(field, f"an acceptance band must be (low, high) with low <= high, got {band}")
    if num_devices is not None:
        data, fsdp, _ = mesh_shape(config, num_devices)
        seqs = int(r.tasks_per_step) * int(r.samples_per_task)
        if seqs % (data * fsdp):
            _fail(
                "rollout.tasks_per_step",
                f"tasks_per_step*samples_per_task = {seqs} must be divisible by the mesh's "
                f"data*fsdp = {data * fsdp}",
            )
        if int(config.warmstart.steps) > 0 and int(config.warmstart.batch) % (data * fsdp):
            _fail(
                "warmstart.batch",
                f"{config.warmstart.batch} must be divisible by the mesh's data*fsdp = "
                f"{data * fsdp}",
            )
        if seqs % (data * fsdp * int(o.mini_batches)):
            _fail(
                "optim.mini_batches",
                f"{seqs} sequences do not split into {o.mini_batches} mini-batches of "
                f"{data * fsdp} shards",
            )
        if seqs % (data * fsdp * int(o.mini_batches) * int(o.num_micro_batches)):
            _fail(
                "optim.num_micro_batches",
                f"{seqs // int(o.mini_batches)} sequences per mini-batch do not split into "
                f"{o.num_micro_batches} micro-batches of {data * fsdp} shards",
            )


def _validate_dataset_domain(config: ConfigDict) -> None:
    from rubric_rl.rubrics.datasets import FORMATS

    ds = config.domain.dataset
    for field, fmt in (("format", ds.format), ("ood_format", ds.ood_format or ds.format)):
        if fmt not in FORMATS:
            _fail(f"domain.dataset.{field}", f"must be one of {FORMATS.names()}, got {fmt!r}")
    if not ds.train:
        _fail("domain.dataset.train", "the dataset domain needs a training file or directory")
    for split in ("train", "heldout", "ood"):
        path = ds[split]
        if path and not os.path.exists(path):
            _fail(f"domain.dataset.{split}", f"{path!r} does not exist")
    if int(ds.limit) < 0:
        _fail("domain.dataset.limit", f"must be >= 0 (0 = all), got {ds.limit}")
    if int(config.warmstart.steps) > 0:
        _fail(
            "warmstart.steps",
            "the dataset domain has no warm-start corpus; train a pretrained checkpoint with "
            "warmstart.steps=0",
        )
