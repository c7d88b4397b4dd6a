"""RISED (seed 003; DESIGN §6): rubric profiles for online group selection across environments,
positive-rubric self-distillation and negative-rubric anti-patterns.

One controller, bound after the sampler (``EnvQuotaSampler``: fixed per-environment quotas of the
2k candidate groups), does all of RISED's per-step work on the step record:

- ``observe``: the tagger (``rised_tagger``: programmatic for the embedded domain, an LLM call per
  rollout for real runs) tags every rollout with vocabulary ids and counts (stored in
  ``Trajectory.info["rised_tags"]``, so the rollouts files keep them), outcome-conditioned:
  positive rubrics from rollouts that pass, negative ones from failures; group profiles are the
  summed per-rollout presence vectors (``profile_counts``); the selection of k of the 2k
  groups is made here (so its figures are logged with the step) and returned by ``select``;
  each environment's anti-patterns for the next step are re-decided; behaviour frequencies
  per environment go to ``<run_dir>/behaviours.jsonl`` (the analyses' input).
- ``select``: the k groups the selection kept — RISED's greedy round-robin over environments with
  their quotas (``rised_selection.select_groups``: alignment with the candidate pool's profile
  minus β · the largest overlap with a group already picked; an untagged group only after every
  tagged one of its environment), or a baseline selector (``top_variance``,
  ``variance_targeted``: Var-Target, ∝ variance), or ``random`` (the "w/o selection" ablation: a
  uniformly random k of the same 2k), or none (every group trained).
- ``decorate``: a task's prompt gets its environment's anti-patterns block (its top negative
  rubrics) when, in the previous step, that environment's rollouts showed more negative than
  positive rubric occurrences; re-decided every step, never at evaluation (evaluation does not
  call controllers: ``rubric_rl/loop/evaluation.py``).
- ``teacher_contexts``: per rollout, the rollout's top-3 positive rubrics ∪ its group's top-3
  (``hint_rank``: by success/failure contrast, then rarity in the step, then a seeded random
  order), as descriptions; a group without a positive rubric (with outcome-conditioned tags: one
  without a success) gets no teacher prompt, so its SD term is exactly 0 (seed E.6).
  ``teacher="all"``: every polarity, ranked by count (the All-Rubric SD baseline and the
  all-rubric conditioning ablation). The RISED step pipeline (the rised ``Method``'s,
  ``rubric_rl/methods/rised/__init__.py``) replaces the per-group teacher stage with a
  per-trajectory one (``teacher_stage``) that places these contexts.

What the seed does not state and is ours (also in ``configs/rised.py`` and the README): β = 1;
the max (not mean) overlap; environment order and quota rounding; an environment's anti-patterns
are its ``anti_top`` = 3 most frequent negative rubrics of the step; "violations outnumber
positive behaviours" counted as rubric occurrences (presence per rollout, every behaviour shown
whatever the outcome: ``anti_counts``) over the environment's rollouts of the step; "w/o
selection" is a uniformly random k of the same 2k candidates; the contrast ranking of the
teacher's rubrics; presence counts, unit-norm profiles in the batch profile and untagged groups
picked last. Every one of these keeps the earlier rule as a flag (docs/rised_mechanism.md).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from rubric_rl.controllers.base import Controller
from rubric_rl.envs.base import GENERIC_STYLE, Style
from rubric_rl.methods.method import complete_section
from rubric_rl.methods.rised import rised_selection as sel
from rubric_rl.methods.rised.rised_tags import (
    PROFILE_COUNTS,
    Tags,
    group_profile,
    profile,
    reliability,
    top_any,
    top_negative,
    top_positive,
)
from rubric_rl.rollout.batch import Messages, Rollouts
from rubric_rl.rubrics.types import Task
from rubric_rl.rubrics.vocabulary import Vocabulary
from rubric_rl.runs import run_files

SELECTIONS = ("profile", "none", "random", "top_variance", "variance_targeted")
TEACHERS = ("positive", "all", "none")
# How the teacher's positive rubrics are ranked (a rollout's top-n and its group's). "contrast"
# (ours, from the seed's tagger: positives are what made successes succeed): by how much more
# often the behaviour appears in the group's successes than in its failures, then the rarer in
# the whole step's rollouts first, then a seeded random order — never the vocabulary's order.
# "count": by tag count, ties by vocabulary order (the ranking before; with presence counts
# or the programmatic tagger's counts of 1 it falls to vocabulary order).
HINT_RANKS = ("contrast", "count")
# What the anti-pattern trigger ("violations outnumber positive behaviours") counts. "detected"
# (ours): every behaviour the rollouts showed, whatever their outcome (``Tags.withheld``
# included): a failure that met four checks and broke one showed four positive behaviours.
# "attributed": the tags as attributed; with outcome-conditioned tags that sets failures'
# negatives against successes' positives, so the trigger fires whenever most rollouts fail (on
# the scripted policy 0.94 of environment-steps, against 0.28 for "detected").
ANTI_COUNTS = ("detected", "attributed")


TAGGERS = ("programmatic", "llm")
TAGGINGS = ("outcome", "unconditioned")
# Set from other sections (rollout.train_groups, train.seed), never in ``config.rised``.
FROM_OTHER_SECTIONS = ("k", "seed")
# A key missing from a run's config (a config.json written before the key existed) means the
# behaviour the code had then, so an archived config reruns as it ran. Not a second default: a
# config file starts the section from every field's default (``section_defaults``).
ABSENT_MEANS = {
    "tagging": "unconditioned",
    "variance_targeting": "pool_multiple",
    "profile_counts": "raw",
    "batch_profile": "sum",
    "untagged": "score0",
    "hint_rank": "count",
    "retag_every": 0,
}


@dataclasses.dataclass(frozen=True)
class RisedLLM:
    """``config.rised.llm``: the LLM tagger's client (empty fields: ``judge.llm``'s) and its
    retry path."""

    backend: str = ""
    model: str = ""
    base_url: str = ""
    retry_candidates: int = 24  # vocabulary entries shown on the retry call
    refresh_every: int = 10  # steps between refreshes of the tagger's vocabulary prompt


@dataclasses.dataclass(frozen=True)
class RisedConfig:
    """The ``config.rised`` section (every field but ``k`` and ``seed``, which come from
    ``rollout.train_groups`` and ``train.seed``): the one default of each field, checked here.
    ``configs/rised.py`` starts the section from ``section_defaults(RisedConfig, ...)`` and the
    method builds it back with ``RisedConfig.from_config``."""

    k: int = 0  # groups trained per step (rollout.train_groups); 0 with selection "none"
    selection: str = "profile"  # SELECTIONS
    beta: float = 1.0  # overlap penalty (ours: the seed gives no value)
    overlap: str = "max"  # "max" | "mean" over the groups already selected (ours: max)
    teacher: str = "positive"  # positive rubrics (RISED) | all tagged rubrics | none (no SD)
    top_n: int = 3  # the seed's top-3 of the rollout ∪ top-3 of its group
    anti_patterns: bool = True
    anti_top: int = 3  # negative rubrics in an environment's anti-patterns block (ours)
    variance_target: float = 2.0  # variance_targeting "pool_multiple": multiple of the pool mean
    variance_targeting: str = "proportional"  # Var-Target (rised_selection.VARIANCE_TARGETS)
    profile_counts: str = "presence"  # rised_tags.PROFILE_COUNTS: selection and anti-patterns
    batch_profile: str = "unit"  # rised_selection.BATCH_PROFILES
    untagged: str = "last"  # rised_selection.UNTAGGED
    hint_rank: str = "contrast"  # HINT_RANKS
    anti_counts: str = "detected"  # ANTI_COUNTS
    solved_threshold: float = 0.5  # a rollout's reward at or above it is a success (ours)
    # The reliability probe (seed C.2): every ``retag_every`` steps (0 = never) ``retag_samples``
    # of the step's rollouts are tagged a second time under another seed and compared (ours: the
    # seed reports the figures, not the schedule).
    retag_every: int = 10
    retag_samples: int = 16
    # The programmatic taggers: "outcome" = positives from successes only, negatives from
    # failures only (the seed's tagger); "unconditioned" = every detected rubric whatever the
    # outcome.
    tagging: str = "outcome"
    # The tagger: "programmatic" (the embedded domain: checkers and fluff detectors) or "llm"
    # (one call per rollout through judge.llm's endpoint unless ``llm`` overrides it).
    tagger: str = "programmatic"
    # A vocabulary file (rubric_rl/rubrics/vocabulary.py format); "" = the embedded domain's.
    vocabulary: str = ""
    # The transfer analysis's single-environment runs (``single_env=<env>``): only this
    # environment's training tasks are sampled; "" = every environment. Not ``train_env``: a
    # config key ending in ``_env`` names an environment variable (rubrics/llm.py).
    train_environment: str = ""
    llm: RisedLLM = RisedLLM()
    seed: int = 0

    def __post_init__(self):
        if isinstance(self.llm, Mapping):  # from a config section
            try:
                object.__setattr__(self, "llm", RisedLLM(**self.llm))
            except TypeError as e:
                raise ValueError(f"rised.llm: {e}") from e
        if self.tagger not in TAGGERS:
            raise ValueError(f"rised.tagger={self.tagger!r}: expected 'programmatic' or 'llm'")
        if self.tagging not in TAGGINGS:
            raise ValueError(
                f"rised.tagging={self.tagging!r}: expected 'outcome' or 'unconditioned'"
            )
        if self.selection not in SELECTIONS:
            raise ValueError(f"rised.selection={self.selection!r}: expected one of {SELECTIONS}")
        if self.teacher not in TEACHERS:
            raise ValueError(f"rised.teacher={self.teacher!r}: expected one of {TEACHERS}")
        if self.selection != "none" and self.k <= 0:
            raise ValueError(
                f"rised.selection={self.selection!r} keeps k of the sampled groups: set "
                "rollout.train_groups = k > 0 (RISED: k = tasks_per_step / 2)"
            )
        if self.top_n < 1 or self.anti_top < 1:
            raise ValueError("rised.top_n and rised.anti_top must be >= 1")
        if self.retag_every < 0 or self.retag_samples < 1:
            raise ValueError("rised.retag_every must be >= 0 and rised.retag_samples >= 1")
        if self.overlap not in ("max", "mean"):
            raise ValueError(f"rised.overlap={self.overlap!r}: expected 'max' or 'mean'")
        for name, allowed in (
            ("variance_targeting", sel.VARIANCE_TARGETS),
            ("profile_counts", PROFILE_COUNTS),
            ("batch_profile", sel.BATCH_PROFILES),
            ("untagged", sel.UNTAGGED),
            ("hint_rank", HINT_RANKS),
            ("anti_counts", ANTI_COUNTS),
        ):
            if getattr(self, name) not in allowed:
                raise ValueError(f"rised.{name}={getattr(self, name)!r}: expected one of {allowed}")

    @classmethod
    def from_config(cls, config: Any) -> RisedConfig:
        """``config.rised`` with ``k`` = ``rollout.train_groups`` and ``seed`` = ``train.seed``
        (a key absent from the section: ``ABSENT_MEANS``); a missing, unknown or wrong-typed
        field (``method.complete_section``) or a refused value is an error naming
        ``config.rised``."""
        fixed = dict(k=int(config.rollout.train_groups), seed=int(config.train.seed))
        try:
            return complete_section(cls, config, "rised", fixed=fixed, absent=ABSENT_MEANS)
        except TypeError as e:
            raise ValueError(f"config.rised: {e}") from e


# A renderer writes RISED's blocks into a prompt: (task, positive descriptions, anti-pattern
# descriptions) -> messages: the domain's ``Style.show_and_avoid`` (the embedded domain's are its
# corpus's own <criterion> and <anti_patterns> blocks, the wording the warm start teaches).
Renderer = Callable[[Task, Sequence[str], Sequence[str]], Messages]


# Rubrics of this skill describe the outcome, not a behaviour: they count in the profiles (the
# seed's tagger is reward-informed, E.4) but are never shown as a teacher's context or an
# anti-pattern ("meet every requirement" is no behaviour to imitate or avoid). Ours.
OUTCOME_SKILL = "outcome"


class RisedController(Controller):
    name = "rised"

    def __init__(
        self,
        config: RisedConfig,
        vocabulary: Vocabulary,
        tagger: Any,
        *,
        quotas: Mapping[str, int] | None = None,
        style: Style = GENERIC_STYLE,
        describe: Callable[[str, Task], str | None] | None = None,
    ):
        self.config = config
        self.vocab = vocabulary
        self.tagger = tagger
        self.quotas = dict(quotas) if quotas else None
        self.render: Renderer = style.show_and_avoid  # the domain's Style
        # A rubric's description for one task, by the domain's style (the embedded domain states
        # it with the task's own values: "the response lists exactly 3 items"; the generic style:
        # the vocabulary's text); ``describe`` overrides it.
        self.describe = describe or (
            lambda rid, task: style.describe(rid, task, self.vocab.entry(rid).description)
        )
        self.anti: dict[str, list[str]] = {}  # env -> negative rubric ids for the next prompts
        self._tags: list[list[Tags]] = []
        self._keep: np.ndarray | None = None
        # Per group: its top-n teacher rubrics and each rollout's own top-n (set by observe).
        self._hints: list[tuple[list[str], list[list[str]]]] = []
        self._step = -1
        self._shown: dict[str, list[str]] = {}  # task id -> anti-patterns its prompt carried
        self.totals = {"tagged": 0, "failed": 0, "discovered": 0, "names": 0}

    # ------------------------------------------------------------------ decorate

    def decorate(self, tasks: Sequence[Task], prompts: Sequence[Messages]) -> list[Messages]:
        out = []
        self._shown = {}
        for task, prompt in zip(tasks, prompts, strict=True):
            neg = self.anti.get(task.env_name) if self.config.anti_patterns else None
            if not neg:
                out.append([dict(m) for m in prompt])
                continue
            self._shown[task.id] = self._describe_all(neg, task)
            if list(prompt) != list(task.messages):
                raise ValueError(
                    f"rised: task {task.id!r} was decorated by another controller before RISED's "
                    "anti-patterns; RISED renders the prompt from the task itself"
                )
            if not self._shown[task.id]:
                out.append([dict(m) for m in prompt])
                continue
            out.append(self.render(task, (), self._shown[task.id]))
        return out

    def _describe_all(self, ids: Sequence[str], task: Task) -> list[str]:
        texts = [self.describe(r, task) for r in ids]
        return list(dict.fromkeys(t for t in texts if t))

    def _behaviour(self, rid: str) -> bool:
        return self.vocab.entry(rid).skill != OUTCOME_SKILL

    # ------------------------------------------------------------------ observe

    def observe(self, rollouts: Rollouts) -> dict[str, float]:
        self._step = int(rollouts.step)
        groups = rollouts.groups
        tasks = [g.task for g in groups for _ in g.trajectories]
        responses = [t.response for g in groups for t in g.trajectories]
        rewards = [t.reward for g in groups for t in g.trajectories]
        flat = self.tagger.tag_batch(tasks, responses, rewards, step=self._step)
        if len(flat) != len(tasks):
            raise ValueError(
                f"rised: the tagger returned {len(flat)} tags for {len(tasks)} rollouts"
            )
        it = iter(flat)
        self._tags = [[next(it) for _ in g.trajectories] for g in groups]
        for g, tags in zip(groups, self._tags, strict=True):
            for t, tg in zip(g.trajectories, tags, strict=True):
                t.info["rised_tags"] = {
                    "counts": dict(tg.counts), "discovered": dict(tg.discovered),
                    "withheld": dict(tg.withheld), "failed": tg.failed,
                }  # fmt: skip
        m = self._tag_metrics(flat)
        m.update(self._reliability_probe(tasks, responses, rewards, flat))
        rewards_gj = rollouts.rewards
        self._keep = self._select(groups, rewards_gj, m)
        self._hints = self._hint_ids(
            [np.array([t.reward for t in g.trajectories], np.float64)
             for g in groups]
        )  # fmt: skip
        if self._keep is not None:
            for key, v in sel.selection_stats(rewards_gj, self._keep).items():
                m[f"select/{key}"] = float(v)
        else:
            for key, v in sel.selection_stats(rewards_gj, np.ones(len(groups), bool)).items():
                if key.startswith("candidates/"):
                    m[f"select/{key}"] = float(v)
        m.update(self._decide_anti_patterns(groups))
        self._write_behaviours(groups)
        return m

    def _reliability_probe(self, tasks, responses, rewards, flat) -> dict[str, float]:
        """Every ``retag_every`` steps: ``retag_samples`` rollouts (evenly spaced over the step's)
        tagged again under another seed, against their first tags (``tag/reliability/*``)."""
        n, every = len(flat), self.config.retag_every
        if not every or self._step % every or not n:
            return {}
        idx = sorted({int(i) for i in np.linspace(0, n - 1, min(self.config.retag_samples, n))})
        again = self.tagger.retag_batch(
            [tasks[i] for i in idx], [responses[i] for i in idx], [rewards[i] for i in idx],
            seed=1_000_003 + self._step,
        )  # fmt: skip
        rel = reliability([flat[i] for i in idx], again, self.vocab)
        return {f"tag/reliability/{k}": float(v) for k, v in rel.items()}

    def _tag_metrics(self, flat: Sequence[Tags]) -> dict[str, float]:
        failed = sum(t.failed for t in flat)
        names = sum(sum(t.counts.values()) + sum(t.discovered.values()) for t in flat)
        disc = sum(sum(t.discovered.values()) for t in flat)
        self.totals["tagged"] += len(flat)
        self.totals["failed"] += failed
        self.totals["names"] += names
        self.totals["discovered"] += disc
        return {
            "tag/failed_frac": failed / len(flat) if flat else 0.0,
            "tag/discovered_frac": disc / names if names else 0.0,
            "tag/names_per_rollout": names / len(flat) if flat else 0.0,
            "tag/empty_frac": (
                sum(1 for t in flat if not t.failed and not t.counts) / len(flat) if flat else 0.0
            ),
        }

    def _select(self, groups, rewards: np.ndarray, m: dict[str, float]) -> np.ndarray | None:
        c = self.config
        if c.selection == "none":
            return None
        envs = [g.task.env_name for g in groups]
        quotas = self.quotas_for(envs)
        rng = np.random.default_rng((c.seed, self._step))
        if c.selection == "profile":
            prof = np.stack(
                [group_profile(tags, self.vocab, c.profile_counts) for tags in self._tags]
            )
            picks = sel.greedy_picks(
                prof, envs, quotas, beta=c.beta, overlap=c.overlap, batch=c.batch_profile,
                untagged=c.untagged,
            )  # fmt: skip
            picked = picks.order
            m["select/untagged_candidates"] = float(picks.untagged_candidates)
            m["select/untagged_selected"] = float(picks.untagged_picked)
        elif c.selection == "random":
            picked = sel.random_keep(envs, quotas, c.k, rng)
        elif c.selection == "top_variance":
            picked = sel.top_variance(rewards, envs, quotas, c.k, rng=rng)
        else:
            picked = sel.var_target(
                rewards, envs, quotas, c.k, rng, c.variance_targeting, c.variance_target
            )
        keep = np.zeros(len(groups), dtype=bool)
        keep[list(picked)] = True
        if int(keep.sum()) != c.k:
            raise ValueError(f"rised: selection kept {int(keep.sum())} groups, expected k={c.k}")
        return keep

    def quotas_for(self, envs: Sequence[str]) -> dict[str, int]:
        """Per-environment quotas of the k kept groups: the configured ones, else k split over
        the environments present in proportion to their candidates (the sampler's quotas)."""
        if self.quotas is not None:
            return dict(self.quotas)
        present = sorted(set(envs))
        weights = {e: float(envs.count(e)) for e in present}
        return sel.env_quotas(present, self.config.k, weights)

    def _decide_anti_patterns(self, groups) -> dict[str, float]:
        """Per environment: when its rollouts' negative behaviour-rubric occurrences outnumber
        positive ones this step (outcome rubrics not counted; occurrences as ``profile_counts``
        scales them: presence by default), its top negatives become the next step's
        anti-patterns; else none. ``anti_counts``: the attributed tags, or every detected one."""
        pos_mask, neg_mask = self.vocab.positive_mask, self.vocab.negative_mask
        per_env: dict[str, np.ndarray] = {}
        for g, tags in zip(groups, self._tags, strict=True):
            if self.config.anti_counts == "detected":
                tags = [t if t.failed else Tags({**t.counts, **t.withheld}) for t in tags]
            p = group_profile(tags, self.vocab, self.config.profile_counts)
            per_env[g.task.env_name] = per_env.get(g.task.env_name, 0) + p
        anti: dict[str, list[str]] = {}
        m: dict[str, float] = {}
        behaviour = self._behaviour_mask()
        for env in sorted(per_env):
            p = per_env[env] * behaviour  # outcome tags are no behaviour (OUTCOME_SKILL)
            n_pos, n_neg = float(p[pos_mask].sum()), float(p[neg_mask].sum())
            m[f"anti/{env}/neg_minus_pos"] = n_neg - n_pos
            if self.config.anti_patterns and n_neg > n_pos:
                anti[env] = top_negative(p, self.vocab, k=self.config.anti_top)
            m[f"anti/{env}/items"] = float(len(anti.get(env, ())))
        m["anti/env_share"] = len(anti) / len(per_env) if per_env else 0.0
        self.anti = anti
        return m

    def _write_behaviours(self, groups) -> None:
        """``behaviours.jsonl``: per environment, the share of rollouts showing each rubric."""
        if self.run_dir is None:
            return
        rows: dict[str, dict[str, Any]] = {}
        for g, tags in zip(groups, self._tags, strict=True):
            r = rows.setdefault(g.task.env_name, {"n": 0, "failed": 0, "seen": {}})
            for tg in tags:
                if tg.failed:
                    r["failed"] += 1
                    continue
                r["n"] += 1
                for rid in tg.counts:
                    r["seen"][rid] = r["seen"].get(rid, 0) + 1
        path = os.path.join(self.run_dir, "behaviours.jsonl")
        for env in sorted(rows):
            r = rows[env]
            freq = {rid: c / r["n"] for rid, c in sorted(r["seen"].items())} if r["n"] else {}
            run_files.append_jsonl(
                path, self._step, {"env": env, "rollouts": r["n"], "failed": r["failed"],
                                   "freq": freq},
            )  # fmt: skip

    # ------------------------------------------------------------------ select / teacher

    def select(self, rollouts: Rollouts) -> np.ndarray | None:
        if self._keep is None:
            return None
        if len(self._keep) != len(rollouts.groups) or rollouts.step != self._step:
            raise ValueError("rised: select called on rollouts that observe did not see")
        return self._keep

    def teacher_contexts(self, rollouts: Rollouts) -> list[list[Messages | None]]:
        """Per group and rollout: the teacher prompt (the student's prompt with the rollout's
        privileged rubric block: its top-n ∪ its group's top-n), or None when that union is
        empty — no positive rubric in the rollout nor its group: no SD term (seed E.6). A
        rollout with none of its own in a group with some gets the group's (the union).
        Unselected groups get None (they are not trained)."""
        c = self.config
        out: list[list[Messages | None]] = []
        if len(self._hints) != len(rollouts.groups) or rollouts.step != self._step:
            raise ValueError("rised: teacher_contexts called on rollouts that observe did not see")
        for g, (group_top, own_rows) in zip(rollouts.groups, self._hints, strict=True):
            if c.teacher == "none" or not g.selected:
                out.append([None] * len(g.trajectories))
                continue
            row = []
            for own in own_rows:
                ids = list(dict.fromkeys([*own, *group_top]))
                row.append(self._teacher_prompt(g, ids) if ids else None)
            out.append(row)
        return out

    def group_hints(self, group: int) -> list[str]:
        """The step's top-n teacher rubrics of group ``group`` (every rollout's context holds
        them), as ranked by ``hint_rank``."""
        return list(self._hints[group][0])

    def _hint_ids(self, rewards: list[np.ndarray]) -> list[tuple[list[str], list[list[str]]]]:
        """Per group: its top-n teacher rubrics, and per rollout its own top-n (``HINT_RANKS``).
        "count" and the all-rubric teacher rank by tag count, ties by vocabulary order."""
        c = self.config
        if c.hint_rank == "count" or c.teacher == "all":
            return [
                (
                    self._top(group_profile(tags, self.vocab)),
                    [[] if tg.failed else self._top(profile(tg, self.vocab)) for tg in tags],
                )
                for tags in self._tags
            ]
        n = len(self.vocab)
        eligible = np.asarray(self.vocab.positive_mask, bool) & (self._behaviour_mask() > 0)
        seen = [[self._seen(tg) for tg in tags] for tags in self._tags]
        rows = [s for group in seen for s in group if s is not None]
        batch_freq = np.mean(rows, axis=0) if rows else np.zeros(n)
        tiebreak = np.random.default_rng((c.seed, self._step, 1)).permutation(n)
        out = []
        for tags, group_seen, r in zip(self._tags, seen, rewards, strict=True):
            pairs = [(x, v) for x, v in zip(group_seen, r, strict=True) if x is not None]
            ok = [x for x, v in pairs if v >= c.solved_threshold]
            bad = [x for x, v in pairs if v < c.solved_threshold]  # an undefined reward: neither
            contrast = (np.mean(ok, axis=0) if ok else np.zeros(n)) - (
                np.mean(bad, axis=0) if bad else np.zeros(n)
            )

            def ranked(ids, contrast=contrast):
                idx = sorted(
                    (self.vocab.index(i) for i in ids if eligible[self.vocab.index(i)]),
                    key=lambda i: (-contrast[i], batch_freq[i], tiebreak[i]),
                )
                return [self.vocab.ids[i] for i in idx[: c.top_n]]

            own = [[] if tg.failed else ranked(tg.counts) for tg in tags]
            attributed = {i for tg in tags if not tg.failed for i in tg.counts}
            out.append((ranked(attributed), own))
        return out

    def _seen(self, tags: Tags) -> np.ndarray | None:
        """Where the rollout showed each rubric, attributed or withheld, 0/1 over the
        vocabulary; None for a failed tagging."""
        if tags.failed:
            return None
        out = np.zeros(len(self.vocab))
        for rid in (*tags.counts, *tags.withheld):
            out[self.vocab.index(rid)] = 1.0
        return out

    def _behaviour_mask(self) -> np.ndarray:
        return np.array([self._behaviour(r) for r in self.vocab.ids], dtype=np.float64)

    def _top(self, p: np.ndarray) -> list[str]:
        p = p * self._behaviour_mask()
        if self.config.teacher == "all":
            return top_any(p, self.vocab, k=self.config.top_n)
        return top_positive(p, self.vocab, k=self.config.top_n)

    def _teacher_prompt(self, g, ids: Sequence[str]) -> Messages | None:
        task = g.task
        pol = {r: self.vocab.entry(r).polarity for r in ids}
        pos = self._describe_all([r for r in ids if pol[r] == "positive"], task)
        neg = self._describe_all([r for r in ids if pol[r] == "negative"], task)
        if not pos and not neg:
            return None
        # The student's own anti-patterns stay in the teacher's prompt: the teacher is the
        # student's input plus the privileged rubrics, nothing removed.
        shown = self._shown.get(task.id, [])
        return self.render(task, pos, [*shown, *[n for n in neg if n not in shown]])

    # ------------------------------------------------------------------ state

    def state_dict(self) -> dict[str, Any]:
        out = {"anti": {e: list(v) for e, v in self.anti.items()}, "totals": dict(self.totals)}
        if hasattr(self.tagger, "state_dict"):
            out["tagger"] = self.tagger.state_dict()
        return out

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.anti = {str(e): [str(x) for x in v] for e, v in state.get("anti", {}).items()}
        self.totals.update({k: int(v) for k, v in state.get("totals", {}).items()})
        if "tagger" in state and hasattr(self.tagger, "load_state_dict"):
            self.tagger.load_state_dict(state["tagger"])


def teacher_stage(controller: RisedController):
    """The RISED pipeline's teacher stage over its controller: each trained rollout's own
    teacher prompt from ``controller.teacher_contexts`` (None: no SD term)."""

    def rised_teacher(rollouts: Rollouts, ctx: Any) -> Rollouts:
        if not ctx.needs_teacher:
            return rollouts
        prompts = controller.teacher_contexts(rollouts)
        for g, row in zip(rollouts.groups, prompts, strict=True):
            for t, p in zip(g.trajectories, row, strict=True):
                t.teacher_prompt = p
        return rollouts

    return rised_teacher


__all__ = [
    "SELECTIONS",
    "TEACHERS",
    "RisedConfig",
    "RisedLLM",
    "RisedController",
    "teacher_stage",
]
