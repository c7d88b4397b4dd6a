"""The ``config.harness`` section: ``HarnessSection`` holds the one default of each field (with
what is the seed's and what is ours); ``configs/harness_rl.py`` builds the section from
``section_defaults(HarnessSection)`` and sets only what a variant changes, and
``HarnessSection.from_config`` reads it back, refusing a missing, unknown or wrong-typed field
with an error naming ``config.harness.<field>``."""

from __future__ import annotations

import dataclasses
from typing import Any

from rubric_rl.methods.harness_rl.attributor import AttributorConfig
from rubric_rl.methods.harness_rl.proposer import INTERFACES
from rubric_rl.methods.harness_rl.sec import SECConfig
from rubric_rl.methods.method import complete_section


@dataclasses.dataclass(frozen=True)
class ColdStartSection:
    """``config.harness.cold_start``. The memory cold start (§3): the warm-started policy on
    ``tasks`` training tasks, ``groups`` independent groups each, ``regradings`` fresh gradings of
    one group per task (ours: 256 tasks, so that the paired rule's 95th percentile rests on 256
    null values, one per task; the seed states no number). The rubric band's lower bound with a
    deterministic judge (every regrading identical) is ``deterministic_floor`` (ours: the seed's
    3.1); ``band_floor`` (ours): every band's least lower bound and least width, so none
    collapses to a point. ``cache_dir``: reuse across runs (keyed by the warm start's key and
    this section)."""

    tasks: int = 256
    groups: int = 3
    regradings: int = 2
    deterministic_floor: float = 3.1
    band_floor: float = 3.1
    cache_dir: str = ""


@dataclasses.dataclass(frozen=True)
class LLMSection:
    """``config.harness.llm``: the attributor's and proposer's client when ``evolver="llm"``;
    empty fields fall back to ``judge.llm``."""

    backend: str = ""
    model: str = ""
    base_url: str = ""
    api_key_env: str = ""


@dataclasses.dataclass(frozen=True)
class HarnessSection:
    """``config.harness``."""

    # The seed's cold-start values (§3), used until the cold start calibrates them (and when
    # cold_start.tasks = 0): levels w0 = 1 ≥ γ1 ≥ γ2 ≥ γ3, acceptance bands in points.
    levels: tuple[float, ...] = (1.0, 0.61, 0.38, 0.17)
    rollout_band: tuple[float, ...] = (10.2, 28.0)
    rubric_band: tuple[float, ...] = (3.1, 28.0)
    total_weight: float = 100.0  # Λ: positive weights sum to it, so Λ·r̄ is the group mean
    interfaces: tuple[str, ...] = INTERFACES
    critic: bool = True
    memory: str = "full"  # full | task (time index only) | none
    # Anchors (reweight-only criteria), ours for rule domains: "library" = seed criteria the
    # checker library derives from the prompt (stated requirements); "seed" = every seed
    # criterion; "none".
    anchors: str = "library"
    retry_after: int = 2  # draws of a task during which a rejected (op, target) is not proposed
    # Rollout candidates the critic re-samples per step (J rollouts each; ours, a cost bound):
    # the rest wait for their task's next draw, unrecorded.
    max_rollout_measurements: int = 32
    # The training tasks the harness draws from: 0 = the whole split (the protocol's choice);
    # N = a seeded sample of N, so that each recurs ~steps × tasks_per_step / N times (e.g. 512:
    # ~9 draws per task over 150 steps of 32).
    task_bank: int = 0
    cold_start: ColdStartSection = dataclasses.field(default_factory=ColdStartSection)
    # The bands re-measured on the current policy at the start of each training quarter
    # ("quarter", ours: the policy sharpens and its null variation shrinks) or frozen at the
    # cold start ("never", the seed's).
    recalibrate: str = "quarter"
    # The critic's rollout measurement: "paired" (ours) re-samples the candidate's group and the
    # current harness's group, paired_samples (J') each on shared seeds, against a band
    # calibrated for 5 % false acceptance and 80 % power (cold_start.paired_band); "unpaired"
    # is the seed's rule (one re-sampled group of J against the recorded group).
    measurement: str = "paired"
    paired_samples: int = 16
    # The in-step proposer-critic loop: proposals per task and step; a rollout candidate rejected
    # on its measurement returns to the proposer, which tries the next field or target (within
    # max_rollout_measurements). 1 = one proposal per draw.
    in_step_rounds: int = 1
    attributor: AttributorConfig = dataclasses.field(default_factory=AttributorConfig)
    # The semantic index: embedder (minilm | bge-base:<dir> | <dir>), top-k, and the cosine
    # floor (-1: the embedder's calibrated floor, rubric_rl/memory/embedder.FLOORS).
    embedder: str = "minilm"
    top_k: int = 4
    floor: float = -1.0
    # Switching arms: a published rule on one interface (harness = HarnessRL's own evolver).
    sampling_rule: str = "harness"  # harness | sec
    rollout_rule: str = "harness"  # harness | ruscarl (its scaffold: config.ruscarl)
    rubric_rule: str = "harness"  # harness | evorubric
    # SEC (p_t <- SEC): α and τ of the paper's runs; arms = task type x positive criteria (ours,
    # sec.bins="type_count") or quantile bins of the warm start's pass rates ("pass_rate").
    sec: SECConfig = dataclasses.field(default_factory=SECConfig)
    # The attributor and proposer: programmatic (rule-judged domains) or an LLM through the
    # LLMClient (llm_evolver.py; its new criteria are LLM criteria, so the judge must grade
    # them).
    evolver: str = "programmatic"
    llm: LLMSection = dataclasses.field(default_factory=LLMSection)

    @classmethod
    def from_config(cls, config: Any) -> HarnessSection:
        """``config.harness`` as a ``HarnessSection`` (``method.complete_section``)."""
        return complete_section(cls, config, "harness")


__all__ = ["ColdStartSection", "HarnessSection", "LLMSection"]
