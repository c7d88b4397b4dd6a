"""The TrainBatch and TrainConfig: the contract between the controllers and the train step.

Shared by ``train_step.py`` (which re-exports both) and ``step_loss.py``, so neither imports the
other's definitions. All ``[B, T]`` arrays use the prediction layout of ``core/logprobs.py``:
position t is about the token ``input_ids[:, t + 1]``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import flax
import jax

from rubric_rl.core import aggregation, losses

__all__ = ["SCHEDULES", "TrainBatch", "TrainConfig", "is_decoupled"]

Array = jax.Array
SCHEDULES = ("constant", "warmup_cosine")


def is_decoupled(rc: Any) -> bool:
    """Whether a rollout-correction config runs in decoupled mode (PPO ratio against π_old)."""
    return getattr(rc, "mode", "bypass") == "decoupled"


@flax.struct.dataclass
class TrainBatch:
    """DESIGN §4. Leading dim B everywhere; [B, T] arrays in prediction layout (logprobs.py)."""

    input_ids: Array  # [B, T] int
    positions: Array  # [B, T] int
    attention_mask: Array  # [B, T] 1 = real token
    loss_mask: Array  # [B, T] 1 = the token at t+1 is model-generated and counts
    rollout_logps: Array  # [B, T] behaviour log-probs from the engine (at temperature T)
    advantages: Array  # [B] or [B, T]
    seq_weights: Array  # [B] importance / selection weights u
    teacher_input_ids: Array | None = None  # [B, T'] prompt ⊕ privileged context ⊕ completion
    teacher_positions: Array | None = None  # [B, T']
    teacher_attention_mask: Array | None = None  # [B, T']
    teacher_offset: Array | None = None  # [B] student position t ↔ teacher t + offset
    # [B] 1 = this sequence is distilled (it has a non-empty teacher context), or [B, T] (prediction
    # layout, like loss_mask) 1 = this token is, e.g. only the final turn of a multi-turn rollout
    sd_mask: Array | None = None
    sd_coef: Array | None = None  # [B] λ per sequence (RG-SED gate × schedule)
    ref_logps: Array | None = None  # [B, T] frozen-reference log-probs (KL term)
    # [B, T] step-start log-probs: decoupled correction, or a preset that rejects (needs_old_logps)
    old_logps: Array | None = None
    group_id: Array | None = None  # [B] bookkeeping
    weight_version: Array | None = None  # [B] policy version that sampled the sequence
    finish_status: Array | None = None  # [B] stop / length / truncated / aborted codes

    @property
    def teacher_completion_offset(self) -> Array | None:
        return self.teacher_offset


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """Static options of the train step (hashable; closed over by ``make_train_step``)."""

    lr: float = 1e-6
    schedule: str = "constant"  # "constant" | "warmup_cosine"
    warmup_steps: int = 0
    decay_steps: int = 1000  # warmup_cosine: total steps (warm-up included)
    end_lr_ratio: float = 0.0
    weight_decay: float = 0.0
    b1: float = 0.9
    b2: float = 0.999
    eps: float = 1e-8
    max_grad_norm: float | None = 1.0
    temperature: float = 1.0
    clip_eps_low: float = 0.2
    clip_eps_high: float = 0.2  # 0.28 in the DAPO preset
    dual_clip_c: float | None = 3.0
    agg_mode: str = "token-mean"
    agg_constant: float | None = None
    rollout_correction: str = "bypass"  # a name in losses.ROLLOUT_CORRECTION_PRESETS
    kl_beta: float = 0.0  # 0 → no reference term and no reference kept
    kl_kind: str = "k3"
    sd_estimator: str = "none"  # "none" or a name in losses.SD_ESTIMATORS
    sd_topk: int = 20
    sd_jsd_beta: float = 0.5  # "jsd": β, the teacher's weight in the mixture (TRL GKD convention)
    sd_clamp: float = 10.0  # sampled estimator: clamp of lp_θ − lp_T (ARISE-RL code)
    # "sampled": the student's log-probs in lp_θ − lp_T — "live" (the forward being
    # differentiated, under stop-gradient) or "old" (the π_old the ratio uses: the authors' qqr
    # code; in bypass mode the engine's log-probs).
    sd_sampled_logps: str = "live"
    # The per-token-KL estimators' aggregation ("" = ``agg_mode``, the policy loss's): e.g.
    # "seq-mean-token-sum" is ARISE-RL eq. 13's Σ_t per sequence, averaged over sequences.
    sd_agg_mode: str = ""
    chunk_size: int = 128
    num_micro_batches: int = 1
    # A step whose loss or gradient norm is NaN/inf returns the input state unchanged (selected
    # inside the jitted step, so no copy of the state is kept outside it) and reports
    # ``train/skipped`` = 1. Off: the update is applied whatever it is.
    skip_nonfinite: bool = False
    # Train only the top N decoder layers (+ final norm, untied LM head); the embedding and the
    # layers below are frozen and their backward is not run (core/frozen_layers.py). 0 = all.
    trainable_layers: int = 0

    def __post_init__(self):
        if not isinstance(self.trainable_layers, int) or self.trainable_layers < 0:
            raise ValueError(
                f"TrainConfig.trainable_layers must be an int >= 0, got {self.trainable_layers!r}"
            )
        if self.schedule not in SCHEDULES:
            raise ValueError(f"TrainConfig.schedule {self.schedule!r} not in {SCHEDULES}")
        if self.sd_estimator not in losses.sd_estimator_names():
            raise ValueError(
                f"TrainConfig.sd_estimator {self.sd_estimator!r} not in "
                f"{losses.sd_estimator_names()}"
            )
        if self.sd_sampled_logps not in ("live", "old"):
            raise ValueError(
                "TrainConfig.sd_sampled_logps must be 'live' or 'old', got "
                f"{self.sd_sampled_logps!r}"
            )
        if self.sd_agg_mode:
            aggregation.AGGREGATORS.get(self.sd_agg_mode)  # clear error on an unknown mode
            if self.sd_estimator == "sampled":
                raise ValueError(
                    "TrainConfig.sd_agg_mode: the 'sampled' estimator folds into the advantages "
                    "and is aggregated with the policy loss (agg_mode); leave sd_agg_mode empty"
                )
        if not 0.0 <= self.sd_jsd_beta <= 1.0:
            raise ValueError(f"TrainConfig.sd_jsd_beta must be in [0, 1], got {self.sd_jsd_beta}")
        if self.num_micro_batches < 1:
            raise ValueError(
                f"TrainConfig.num_micro_batches must be ≥ 1, got {self.num_micro_batches}"
            )
        if self.temperature <= 0:
            raise ValueError(f"TrainConfig.temperature must be > 0, got {self.temperature}")
        if self.kl_beta < 0:
            raise ValueError(f"TrainConfig.kl_beta must be ≥ 0, got {self.kl_beta}")
        if self.rollout_correction not in losses.ROLLOUT_CORRECTION_PRESETS:
            known = losses.ROLLOUT_CORRECTION_PRESETS.names()
            raise ValueError(
                f"TrainConfig.rollout_correction {self.rollout_correction!r} not in {known}"
            )
        aggregation.AGGREGATORS.get(self.agg_mode)  # clear error on an unknown mode

    @property
    def needs_teacher(self) -> bool:
        return self.sd_estimator != "none"

    @property
    def sd_spec(self) -> losses.SDEstimator | None:
        """The registered SD estimator (None without distillation)."""
        return losses.SD_ESTIMATORS.get(self.sd_estimator) if self.needs_teacher else None

    @property
    def sd_folds_into_advantage(self) -> bool:
        """The estimator enters as a per-token advantage term (``sampled``)."""
        return self.needs_teacher and self.sd_spec.folds_into_advantage

    @property
    def sd_per_token_kl(self) -> bool:
        """The estimator is a per-logit KL fed to ``sd_loss_from_kl`` (``full``, ``topk``,
        ``jsd``)."""
        return self.needs_teacher and not self.sd_spec.folds_into_advantage

    @property
    def decoupled(self) -> bool:
        return is_decoupled(losses.ROLLOUT_CORRECTION_PRESETS.get(self.rollout_correction))

    @property
    def needs_old_logps(self) -> bool:
        """The step needs ``TrainBatch.old_logps`` = the step-start log-probs: decoupled mode
        (the ratio's π_old) or a preset that rejects (in bypass mode its statistics would see
        ``log w ≡ 0`` otherwise; ``RolloutCorrection.rejects``)."""
        return self.decoupled or losses.rejects(self.rollout_correction)
