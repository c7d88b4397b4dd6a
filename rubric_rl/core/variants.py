"""Name -> variant registries of the training core, chosen by config strings.

- ``ADVANTAGE_ESTIMATORS``: ``"grpo"``, ``"mean_only"`` (alias ``"dr-grpo"``).
- ``AGGREGATORS``: ``"token-mean"``, ``"seq-mean-token-mean"``, ``"seq-mean-token-sum"``,
  ``"dr-grpo"`` (alias ``"seq-mean-token-sum-norm"``).
- ``ROLLOUT_CORRECTION_PRESETS``: ``RolloutCorrection`` configs (``"off"``, ``"bypass"``, ...; each
  also as ``"<name>_veto"``); ``REJECTION_STATISTICS``: the statistics their bands use.
- ``KL_ESTIMATORS``: ``"k1"``, ``"k2"``, ``"k3"`` on the log-ratio.
- ``SD_ESTIMATORS``: ``"full"``, ``"topk"``, ``"sampled"`` as ``SDEstimator`` specs
  (``sd_estimator_names()`` adds ``"none"``: the values an ``sd_estimator`` option takes).

The loss parts themselves (``losses.policy_loss``, ``kl_penalty_loss``, ``sd_loss_from_kl``) are
not variants: the step always combines the same three, so they are called directly.
"""

from __future__ import annotations

from collections.abc import Callable

from rubric_rl.core.advantages import ADVANTAGE_ESTIMATORS
from rubric_rl.core.aggregation import AGGREGATORS
from rubric_rl.core.losses import KL_ESTIMATORS, SD_ESTIMATORS, SDEstimator, sd_estimator_names
from rubric_rl.core.rollout_correction import (
    REJECTION_STATISTICS,
    ROLLOUT_CORRECTION_PRESETS,
    RolloutCorrection,
)

__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "AGGREGATORS",
    "KL_ESTIMATORS",
    "REJECTION_STATISTICS",
    "ROLLOUT_CORRECTION_PRESETS",
    "SD_ESTIMATORS",
    "get_advantage_estimator",
    "get_aggregator",
    "get_kl_estimator",
    "get_rollout_correction",
    "get_sd_estimator",
    "sd_estimator_names",
]


def get_advantage_estimator(name: str) -> Callable:
    return ADVANTAGE_ESTIMATORS.get(name)


def get_aggregator(name: str) -> Callable:
    return AGGREGATORS.get(name)


def get_rollout_correction(name: str) -> RolloutCorrection:
    return ROLLOUT_CORRECTION_PRESETS.get(name)


def get_kl_estimator(name: str) -> Callable:
    return KL_ESTIMATORS.get(name)


def get_sd_estimator(name: str) -> SDEstimator:
    return SD_ESTIMATORS.get(name)
