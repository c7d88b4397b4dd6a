"""RuscaRL (Zhou et al., arXiv 2508.16949): rubric-scaffolded rollouts — each sample of a group
sees a random part of the task's rubric as a checklist, less within the group and less over
training; the loss is taken on the unscaffolded prompt with no importance correction, as its
released code does (``../shared/notes/baselines.md`` §1).

- **Intra-group differentiation** (``group_rule="linear"``, the default):
  λ_group(i) = (G − 1 − i) / (G − 1) for sample i of G — the first sees the whole rubric, the
  last none; ``"binary"``: the first ``full_reveal_count`` samples 1, the rest 0.
- **Inter-step decay** (``step_rule="sigmoid"``, the paper's script):
  x = clip((t − 1)/(T − 1), 0, 1), λ_step = 1 / (1 + exp(κ (x − x0))) with x0 = 0.2, κ = 125
  (the released Qwen2.5-7B HealthBench script; the config defaults there are 0.3 and 10);
  ``"linear"``: (T − t)/(T − 1); ``"none"``: 1.
- **Shown criteria**: m_i = round(K · λ_group(i) · λ_step) of the task's K criteria, drawn
  uniformly without replacement from all of them, positive and negative.
- **Scaffold** (ours for the embedded domain): the shown criteria are written as the domain
  writes guidance — ``<criterion>`` blocks through the domain's guidance style (a pitfall as
  "avoid : …"), the prompt shape the warm start taught — instead of RuscaRL's system-message
  checklist, and at most ``max_shown`` (3, the most the warm start showed) are mounted. With
  m_i = 0 the sample gets the plain prompt.
- **Loss**: the group's prompt (unscaffolded) is trained (``Controller.sample_prompts``); the
  method's config sets ``loss.rollout_correction="off"``, so π_old is recomputed on that prompt
  and the PPO ratio starts at 1, as verl's recomputation does in RuscaRL. Evaluation never
  scaffolds.

The draw of sample i of task τ at step t uses ``default_rng([seed, t, crc32(τ), i])``: a resumed
run scaffolds exactly as the uninterrupted one, and the controller has no state.
"""

from __future__ import annotations

import dataclasses
import math
import zlib
from collections.abc import Sequence

import numpy as np

from rubric_rl.controllers.base import Controller
from rubric_rl.rollout.batch import Messages
from rubric_rl.rubrics.types import Task

GROUP_RULES = ("linear", "binary")
STEP_RULES = ("sigmoid", "linear", "none")


@dataclasses.dataclass(frozen=True)
class RuscaRLConfig:
    total_steps: int
    group_rule: str = "linear"
    full_reveal_count: int = 1  # binary rule
    step_rule: str = "sigmoid"
    x0: float = 0.2  # the released script (config default 0.3)
    kappa: float = 125.0  # the released script (config default 10)
    max_shown: int = 3  # ours: the most guidance blocks the warm start showed
    seed: int = 0

    def __post_init__(self):
        if self.total_steps < 1:
            raise ValueError(f"ruscarl: total_steps={self.total_steps} must be >= 1")
        if self.group_rule not in GROUP_RULES:
            raise ValueError(f"ruscarl.group_rule={self.group_rule!r}: expected {GROUP_RULES}")
        if self.step_rule not in STEP_RULES:
            raise ValueError(f"ruscarl.step_rule={self.step_rule!r}: expected {STEP_RULES}")
        if self.max_shown < 1:
            raise ValueError(f"ruscarl.max_shown={self.max_shown}: must be >= 1")
        if self.full_reveal_count < 0:
            raise ValueError(f"ruscarl.full_reveal_count={self.full_reveal_count}: must be >= 0")


def group_ratio(i: int, size: int, rule: str = "linear", full_reveal_count: int = 1) -> float:
    """λ_group of sample ``i`` in a group of ``size``."""
    if rule == "binary":
        return 1.0 if i < full_reveal_count else 0.0
    if size <= 1:
        return 1.0
    return (size - 1 - i) / (size - 1)


def step_ratio(step: int, total: int, rule: str = "sigmoid", x0=0.2, kappa=125.0) -> float:
    """λ_step at training step ``step`` (1-based) of ``total``."""
    if rule == "none":
        return 1.0
    if rule == "linear":
        return 1.0 if total <= 1 else (total - step) / (total - 1)
    x = 0.0 if total <= 1 else min(1.0, max(0.0, (step - 1) / (total - 1)))
    z = kappa * (x - x0)
    if z > 700:  # exp overflows; the ratio is 0 to double precision
        return 0.0
    return 1.0 / (1.0 + math.exp(z))


def shown_count(k: int, ratio: float) -> int:
    """m = round(K · ratio) (Python's round, half to even, as the released code's ``round``)."""
    return int(round(k * ratio))


class RuscaRLController(Controller):
    """The rubric scaffold as per-sample behaviour prompts (no sampling, no state)."""

    name = "ruscarl"

    def __init__(self, config: RuscaRLConfig, style):
        self.config = config
        self.style = style

    def ratios(self, step: int, n: int) -> list[float]:
        c = self.config
        s = step_ratio(step, c.total_steps, c.step_rule, c.x0, c.kappa)
        return [group_ratio(i, n, c.group_rule, c.full_reveal_count) * s for i in range(n)]

    def shown(self, step: int, task: Task, i: int, m: int) -> list[int]:
        """The indices (into the task's evaluated criteria) sample ``i`` is shown."""
        k = len(task.rubric.evaluated().criteria)
        rng = np.random.default_rng(
            [self.config.seed, int(step), zlib.crc32(task.id.encode()), int(i)]
        )
        picked = rng.choice(k, size=m, replace=False)
        return sorted(int(x) for x in picked[: self.config.max_shown])

    def sample_prompts(
        self, step: int, tasks: Sequence[Task], prompts: Sequence[Messages], n: int
    ) -> list[list[Messages] | None] | None:
        ratios = self.ratios(step, n)
        out: list[list[Messages] | None] = []
        any_shown = False
        for task, prompt in zip(tasks, prompts, strict=True):
            if list(prompt) != task.messages:
                raise ValueError(
                    f"ruscarl: task {task.id!r}'s prompt was decorated by another controller; "
                    "the scaffold is mounted on the task's own prompt (run RuscaRL without "
                    "other guidance)"
                )
            crits = task.rubric.evaluated().criteria
            per: list[Messages] = []
            shown_any = False
            for i, r in enumerate(ratios):
                m = shown_count(len(crits), r)
                if m == 0:
                    per.append(list(prompt))
                    continue
                hints = [self.style.hint(crits[k].text, crits[k].weight)
                         for k in self.shown(step, task, i, m)]  # fmt: skip
                per.append(self.style.mount(task, {"criterion": hints}))
                shown_any = True
            out.append(per if shown_any else None)
            any_shown |= shown_any
        return out if any_shown else None


def ruscarl_controllers(config, domain) -> list[Controller]:
    """RuscaRL's rubric scaffold (``config.ruscarl``, when the config has that section): a GRPO
    baseline and HarnessRL's g_t <- RuscaRL switching arm."""
    if config.get("ruscarl") is None:
        return []
    from rubric_rl.methods.harness_rl.style import style_for
    from rubric_rl.methods.method import from_section

    if str(config.loss.rollout_correction) == "bypass":
        raise ValueError(
            "config.loss.rollout_correction='bypass' with config.ruscarl: the scaffolded "
            "samples' engine log-probs are under another prompt; use 'off' (π_old recomputed "
            "on the trained prompt, as RuscaRL's verl does)"
        )
    rc = from_section(
        RuscaRLConfig, config, "ruscarl",
        total_steps=int(config.train.steps), seed=int(config.train.seed),
    )  # fmt: skip
    return [RuscaRLController(rc, style_for(domain))]


__all__ = [
    "ruscarl_controllers",
    "RuscaRLConfig",
    "RuscaRLController",
    "group_ratio",
    "shown_count",
    "step_ratio",
]
