"""TrainState and the jitted, sharded GRPO (+ self-distillation, + KL-to-reference) train step.

Functional NNX (notes/jax-on-cpu.md): ``graphdef`` is static (closed over), the parameters are a
pytree in ``TrainState``, and ``nnx.merge`` rebuilds the model inside ``jit``.

One step (DESIGN §3, §5):
1. Rollout correction once on the whole batch (it depends only on ``old_logps``, the engine's
   ``rollout_logps`` and the masks, not on the live parameters): IS weights + rejection mask.
   *bypass*: ``old := rollout`` (no extra forward, no extra IS weights); *decoupled*: ``old`` is
   ``batch.old_logps`` from ``compute_logps`` with the step-start parameters (DESIGN §9).
2. Denominators of every loss part per micro-batch, summed (they depend on masks and weights only).
3. Micro-batches under ``lax.scan``: loss_mb = Σ_part num_part,mb / D_part; gradients summed.
   Hence grad = Σ_mb ∇num_mb / Σ_mb den_mb exactly — micro-batching changes nothing
   (Tunix-style deferred reduction; aggregation.py defines the modes).
4. Global-norm clipping + AdamW (optax) with the learning-rate schedule.

Loss (DESIGN §5): ``L = L_PPO + Σ_b λ_b L_SD + β KL(π_θ ‖ π_ref)``, with λ_b = ``sd_coef``
(gates and schedules computed outside) and the teacher = the same parameters under
``stop_gradient`` run on ``teacher_input_ids``, aligned to the student by ``teacher_offset`` —
or an external frozen teacher (``make_train_step(..., teacher_graphdef=...)`` and
``step(..., teacher=(teacher_params, teacher_rest))``): another parameter set, possibly a larger
model of the same family with the same vocabulary, whose own LM head gives the teacher logits.

All ``[B, T]`` arrays use the prediction layout of ``core/logprobs.py``: position t is about the
token ``input_ids[:, t + 1]``. ``TrainBatch`` and ``TrainConfig`` are defined in ``batch_types.py``
(shared with ``step_loss.py``) and re-exported here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import flax
import jax
import jax.numpy as jnp
import optax
from flax import nnx
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from rubric_rl.core import sharding
from rubric_rl.core.batch_types import TrainBatch, TrainConfig
from rubric_rl.core.frozen_layers import mask_frozen_updates
from rubric_rl.core.logprobs import chunked_token_stats, shift_targets
from rubric_rl.core.step_loss import check_teacher, loss_and_grads, split_micro_batches

__all__ = [
    "TrainBatch",
    "TrainConfig",
    "TrainState",
    "init_train_state",
    "loss_and_grads",
    "make_compute_logps",
    "make_optimizer",
    "make_schedule",
    "make_train_step",
    "train_state_shardings",
]

Array = jax.Array


@flax.struct.dataclass
class TrainState:
    step: Array  # int32 scalar
    params: nnx.State  # nnx.Param leaves
    opt_state: Any  # optax state
    rest: nnx.State  # non-trainable model state (usually empty)


# ------------------------------------------------------------------------------ optimizer


def make_schedule(config: TrainConfig) -> optax.Schedule:
    if config.schedule == "constant":
        return optax.constant_schedule(config.lr)
    return optax.warmup_cosine_decay_schedule(
        init_value=0.0,
        peak_value=config.lr,
        warmup_steps=config.warmup_steps,
        decay_steps=max(config.decay_steps, config.warmup_steps + 1),
        end_value=config.lr * config.end_lr_ratio,
    )


def make_optimizer(config: TrainConfig) -> optax.GradientTransformation:
    """Global-norm clipping, then AdamW; weight decay only on matrices (not norms' scales)."""
    decay_mask = lambda params: jax.tree.map(lambda x: x.ndim >= 2, params)
    adamw = optax.adamw(
        make_schedule(config),
        b1=config.b1,
        b2=config.b2,
        eps=config.eps,
        weight_decay=config.weight_decay,
        mask=decay_mask,
    )
    if config.max_grad_norm is None:
        return adamw
    return optax.chain(optax.clip_by_global_norm(config.max_grad_norm), adamw)


def train_state_shardings(state: Any, mesh: Mesh) -> Any:
    """NamedShardings of a (concrete or abstract) TrainState per the parameters' metadata."""
    return TrainState(
        step=NamedSharding(mesh, P()),
        params=sharding.param_shardings(state.params, mesh),
        opt_state=sharding.param_shardings(state.opt_state, mesh),
        rest=sharding.param_shardings(state.rest, mesh),
    )


def init_train_state(
    model: nnx.Module, config: TrainConfig, mesh: Mesh
) -> tuple[nnx.GraphDef, TrainState]:
    """Splits ``model`` and builds its sharded TrainState. Returns ``(graphdef, state)``."""
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    tx = make_optimizer(config)

    def build(p, r):
        return TrainState(step=jnp.zeros((), jnp.int32), params=p, opt_state=tx.init(p), rest=r)

    shardings = train_state_shardings(jax.eval_shape(build, params, rest), mesh)
    return graphdef, jax.jit(build, out_shardings=shardings)(params, rest)


# ------------------------------------------------------------------------------ jitted step


def make_train_step(
    config: TrainConfig,
    graphdef: nnx.GraphDef,
    mesh: Mesh,
    *,
    state_shardings: Any = None,
    compiler_options: dict[str, Any] | None = None,
    teacher_graphdef: nnx.GraphDef | None = None,
) -> Callable[..., tuple[TrainState, dict[str, Array]]]:
    """Returns ``step(state, batch, ref_params=None, teacher=None) -> (state, metrics)``, jitted
    with explicit shardings and the state donated. When the correction needs them (decoupled
    mode, or a preset that rejects: ``TrainConfig.needs_old_logps``) and ``batch.old_logps`` is
    None, ``old_logps`` are first computed with the step-start parameters (``compute_logps``).
    ``compiler_options`` go to XLA (tests use ``{"xla_backend_optimization_level": 0}``).

    External SD teacher: build the step with ``teacher_graphdef`` (the graphdef of the teacher
    model, e.g. ``nnx.split(teacher_model, nnx.Param, ...)[0]``) and pass
    ``teacher=(teacher_params, teacher_rest)`` to each call; the teacher is frozen (under
    stop_gradient, never donated) and sharded by its own metadata. Without ``teacher`` the SD
    teacher is the student itself. Each combination of ``ref_params`` / ``teacher`` given or not
    has its own compiled step. ``step.loss_and_grads(state, batch, ref_params=None,
    teacher=None)`` is the unjitted loss/gradient with the same arguments."""
    tx = make_optimizer(config)
    schedule = make_schedule(config)
    batch_sh = sharding.batch_sharding(mesh)
    replicated = NamedSharding(mesh, P())

    def step_fn(state: TrainState, batch: TrainBatch, ref_params=None, teacher=None):
        loss, grads, metrics = step_loss_and_grads(state, batch, ref_params, teacher)
        grads = jax.tree.map(lambda g, p: g.astype(p.dtype), grads, state.params)
        updates, opt_state = tx.update(grads, state.opt_state, state.params)
        updates = mask_frozen_updates(updates, state.params, config.trainable_layers)
        params = optax.apply_updates(state.params, updates)
        metrics["grad_norm"] = optax.global_norm(grads)
        metrics["lr"] = schedule(state.step)
        new = TrainState(step=state.step + 1, params=params, opt_state=opt_state, rest=state.rest)
        if config.skip_nonfinite:
            ok = jnp.isfinite(loss) & jnp.isfinite(metrics["grad_norm"])
            new = jax.tree.map(lambda n, o: jnp.where(ok, n, o), new, state)
            metrics["train/skipped"] = 1.0 - ok.astype(jnp.float32)
        return new, metrics

    jitted: dict[tuple[bool, bool], Any] = {}
    compute_logps = make_compute_logps(
        config,
        graphdef,
        mesh,
        state_shardings=state_shardings,
        compiler_options=compiler_options,
    )

    def get(with_ref: bool, state: TrainState, teacher=None):
        key = (with_ref, teacher is not None)
        if key not in jitted:
            sh = state_shardings or train_state_shardings(state, mesh)
            in_sh = (sh, batch_sh) + ((sh.params,) if with_ref else ())
            if teacher is not None:
                # the teacher's own layout (its metadata), not the student's
                in_sh += (
                    (
                        sharding.param_shardings(teacher[0], mesh),
                        sharding.param_shardings(teacher[1], mesh),
                    ),
                )
            fns = {
                (False, False): lambda s, b: step_fn(s, b),
                (True, False): lambda s, b, r: step_fn(s, b, r),
                (False, True): lambda s, b, t: step_fn(s, b, None, t),
                (True, True): lambda s, b, r, t: step_fn(s, b, r, t),
            }
            jitted[key] = jax.jit(
                fns[key],
                in_shardings=in_sh,
                out_shardings=(sh, replicated),
                donate_argnums=(0,),  # the state only: the teacher (and reference) are kept
                compiler_options=compiler_options,
            )
        return jitted[key]

    def jitted_call(state: TrainState, batch: TrainBatch, ref_params, teacher):
        """(the jitted step for this combination of arguments, its positional arguments)."""
        teacher = check_teacher(config, teacher, teacher_graphdef)
        args = (state, batch) + ((ref_params,) if ref_params is not None else ())
        args += (teacher,) if teacher is not None else ()
        return get(ref_params is not None, state, teacher), args

    def step(state: TrainState, batch: TrainBatch, ref_params=None, teacher=None):
        if config.needs_old_logps and batch.old_logps is None:
            batch = batch.replace(old_logps=compute_logps(state, batch))
        fn, args = jitted_call(state, batch, ref_params, teacher)
        return fn(*args)

    def step_loss_and_grads(state: TrainState, batch: TrainBatch, ref_params=None, teacher=None):
        return loss_and_grads(
            config,
            graphdef,
            state.params,
            state.rest,
            batch,
            ref_params,
            mesh=mesh,
            teacher=teacher,
            teacher_graphdef=teacher_graphdef,
        )

    def lower(state: TrainState, batch: TrainBatch, ref_params=None, teacher=None):
        """The jitted step lowered for these arguments (concrete, or abstract: shapes and
        dtypes), not run; ``.compile()`` on it gives the program and its memory analysis
        (benchmarks/aot_fit.py). ``batch.old_logps`` must be given where the step needs them."""
        fn, args = jitted_call(state, batch, ref_params, teacher)
        return fn.lower(*args)

    step.compute_logps = compute_logps  # type: ignore[attr-defined]
    step.lower = lower  # type: ignore[attr-defined]
    step.loss_and_grads = step_loss_and_grads  # type: ignore[attr-defined]
    return step


def make_compute_logps(
    config: TrainConfig,
    graphdef: nnx.GraphDef,
    mesh: Mesh,
    *,
    state_shardings: Any = None,
    compiler_options: dict[str, Any] | None = None,
) -> Callable[[TrainState, TrainBatch], Array]:
    """Jitted ``compute_logps(state, batch) -> logps [B, T]`` (prediction layout, temperature T,
    chunked, micro-batched like the step). Use it at step start for ``old_logps`` (decoupled
    correction) — never with parameters already updated in this step."""
    batch_sh = sharding.batch_sharding(mesh)

    def fn(state: TrainState, batch: TrainBatch) -> Array:
        model = nnx.merge(graphdef, state.params, state.rest)
        m = config.num_micro_batches
        xs = {
            "input_ids": split_micro_batches(batch.input_ids, m),
            "positions": split_micro_batches(batch.positions, m),
            "attention_mask": split_micro_batches(batch.attention_mask, m),
        }

        def one(mb):
            hidden = model.hidden_states(mb["input_ids"], mb["positions"], mb["attention_mask"])
            return chunked_token_stats(
                hidden,
                model.unembed(),
                shift_targets(mb["input_ids"]),
                temperature=config.temperature,
                chunk_size=config.chunk_size,
            )["logps"]

        out = jax.lax.map(one, xs)  # [m, B/m, T]
        b, t = batch.input_ids.shape
        out = jnp.swapaxes(out, 0, 1).reshape(b, t)
        return out.at[:, -1].set(0.0)  # the last position has no target

    jitted = {}

    def compute_logps(state: TrainState, batch: TrainBatch) -> Array:
        if "f" not in jitted:
            sh = state_shardings or train_state_shardings(state, mesh)
            jitted["f"] = jax.jit(
                fn,
                in_shardings=(sh, batch_sh),
                out_shardings=batch_sh,
                compiler_options=compiler_options,
            )
        return jitted["f"](state, batch)

    return compute_logps
