"""Shared parts of every method config (big_vision style: plain ConfigDicts, no magic).

``get_base_config()`` (``rubric_rl.config.defaults``, re-exported here, so that an installed package
has every default without ``configs/``) returns an unlocked ConfigDict; a method's
``get_config(arg)`` changes what it needs, applies variants from ``arg`` and locks it
(``lock_config``) so that a typo in a ``--config.key=value`` override is an error.
``validate_config`` (``rubric_rl.config.config_validation``, re-exported here) runs at start-up and
raises ``ValueError`` naming the offending field.
"""

from __future__ import annotations

from typing import Any

import ml_collections

# The base config and the start-up checks live in the package (configs/ imports the package,
# never the reverse).
from rubric_rl.config.config_validation import mesh_shape, validate_config  # noqa: F401
from rubric_rl.config.defaults import get_base_config  # noqa: F401

ConfigDict = ml_collections.ConfigDict


def apply_method_default(c: ConfigDict) -> None:
    """The embedded default of a method config (ARISE's is the README's quick start: at most
    five minutes on a 2-core CPU, warm start included). ARISE's prompts carry skills, which
    makes its steps about twice as long as GRPO's per rollout, so it trains 70 steps of 16 tasks
    x 8 rollouts (75 took 5:03 on a fresh clone). Held-out figures are read on 512 tasks, the
    protocol's held-out size, so a change over the warm start is not the noise of 128 tasks, at
    steps 0, 35 and 70 (each evaluation about 5 s). The ``protocol`` variant sets the
    comparison's own budget."""
    c.rollout.tasks_per_step = 16
    c.train.steps = 70
    c.domain.n_heldout = 512
    c.eval.n = 512
    c.eval.every = 35


def apply_protocol(c: ConfigDict) -> None:
    """The ``protocol`` variant: the evaluation and budget that ``benchmarks/protocol.md``
    pre-registers for every arm of a comparison on the embedded benchmark (the sweep adds the
    seed and the shared warm-start cache). Held-out 512 tasks (greedy, unguided) every 10 steps;
    validation 256 (the only set a choice may be made on) and OOD 256 every 50; 150 steps of
    32 tasks x 8 rollouts; one advantage estimator for every arm (GRPO's, the papers')."""
    c.domain.update(n_heldout=512, n_validation=256, n_ood=256)
    c.eval.update(every=10, n=512, at_start=True, greedy=True)
    c.eval.splits.update(heldout=10, validation=50, ood=50)
    c.rollout.update(tasks_per_step=32, samples_per_task=8)
    c.loss.advantage = "grpo"
    c.train.steps = 150
    c.checkpoint.every = 50


def apply_ruscarl(c: ConfigDict) -> None:
    """RuscaRL's rubric scaffold (rubric_rl/methods/harness_rl/ruscarl.py): the released script's
    linear intra-group ratio and sigmoid decay (x0 = 0.2, κ = 125), at most 3 criteria shown
    (ours: the warm start's shape); π_old recomputed on the unscaffolded prompt, no importance
    correction (``rollout_correction="off"``), as its verl code does."""
    c.ruscarl = dict(
        group_rule="linear", full_reveal_count=1, step_rule="sigmoid", x0=0.2, kappa=125.0,
        max_shown=3,
    )  # fmt: skip
    c.loss.rollout_correction = "off"


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
