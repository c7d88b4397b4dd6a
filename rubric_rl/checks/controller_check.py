"""The scripted-policy controller check: a method's real controllers and the real reward path,
driven by a stand-in policy instead of RL (seconds, deterministic, no model).

Before any RL run a controller is checked here: does its pool fill and turn over, do slots stay
stuck, do the all-failure groups (where the task reward gives no signal) get a rubric signal,
what is the effective batch size of its sampling, what environment mix does it train on.

- ``ScriptedPolicy``: per constraint kind of the embedded domain, the probability that a rollout
  meets it follows a script over the steps (``CriterionScript``: from ``start`` towards ``end``
  with time constant ``tau``; ``end = 0`` is a never-reachable criterion, e.g. copying a word
  from the prompt for the 1M word-level policy), plus ``skill_gain`` while guidance for the
  criterion's capability is in the prompt (the domain's skill texts, e.g. ARISE's skills). The
  response is rendered by the domain (``render_response``), so the real judge and verifier grade
  real text. The policy reads the task's hidden parameters to render: it stands in for the
  policy, and no controller sees them.
- ``run_check(config, policy, steps)``: the method's own pipeline (``Method.pipeline``) with
  its ``generate`` stage replaced by the policy; sample, decorate, judge, reward, advantage,
  observe and select are the real stages, with the method's real controllers bound to real
  ``Services`` (programmatic judge). Nothing is trained. Returns ``CheckReport``.

Figures (``CheckReport.figures``):
- ``pool/*`` (a controller with an ARISE-style ``pool``): added / retired / refined totals, live
  at the end and on average, the share of steps with a full pool, and **stuck slots**: live
  entries judged on at least ``stuck_window`` of the last steps whose pass rate over them is below
  ``stuck_below`` (they hold a slot and give no group a signal);
- ``all_fail_groups``: share of groups whose rollouts all failed the task verifier;
  ``all_fail_rubric_signal``: of those, the share whose ``rubric`` signal varies inside the group;
  ``all_fail_advantage``: the share with any non-zero advantage (what is actually trained);
- ``effective_batch``: mean over steps of (Σu)² / Σu² (``_frac``: divided by the groups);
  ``u_min`` / ``u_max``;
- ``env_mix/<env>`` (share of trained groups per environment) against ``heldout_mix/<env>``, and
  their total-variation distance ``env_mix_tv``;
- ``prompt_tokens_max``: the longest decorated prompt (chat template included; the real
  generate stage's ``model.max_prompt_len`` check runs on every prompt);
- ``task_pass_rate_first`` / ``_last``: the scripted policy's pass rate over the first / last
  tenth of the steps (a sanity check of the script, not of the controller).

Ours throughout: the seed papers do not define these checks; the thresholds are arguments.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import hashlib
import math
import os
import tempfile
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from rubric_rl.config import builders
from rubric_rl.loop.step_metrics import step_metrics
from rubric_rl.methods.arise.reflection_base import satisfied
from rubric_rl.methods.method import get_method
from rubric_rl.rollout.batch import Rollouts, Trajectory
from rubric_rl.rollout.engine import RolloutEngine
from rubric_rl.services import Services
from rubric_rl.step import (
    RUBRIC_SIGNAL,
    VERIFIER_SIGNAL,
    StepContext,
    mark_behaviour,
)


@dataclasses.dataclass(frozen=True)
class CriterionScript:
    """P(met) at step s = end + (start − end)·exp(−s / tau), + skill_gain while guided (clipped
    to [0, 1]). ``end = start = 0``: never reachable."""

    start: float
    end: float
    tau: float = 50.0
    skill_gain: float = 0.0

    def __post_init__(self):
        for name in ("start", "end", "skill_gain"):
            v = getattr(self, name)
            if not 0.0 <= v <= 1.0:
                raise ValueError(f"CriterionScript.{name} must be in [0, 1], got {v}")
        if self.tau <= 0:
            raise ValueError(f"CriterionScript.tau must be > 0, got {self.tau}")

    def p(self, step: int, guided: bool) -> float:
        base = self.end + (self.start - self.end) * math.exp(-step / self.tau)
        return min(1.0, base + (self.skill_gain if guided else 0.0))


# The embedded domain's default script (ours), after what the 1M word-level policy does (issue
# 13's review): formatting is mastered early, counting and ordering late; copying a word from
# the prompt (rewrite sequences, rare include words) is never reachable; skills help where the
# criterion is reachable at all. Keys: a constraint kind, or "<kind>:rare" for rare words.
DEFAULT_SCRIPT: dict[str, CriterionScript] = {
    "case": CriterionScript(0.5, 0.95, 20, 0.2),
    "end": CriterionScript(0.5, 0.95, 20, 0.2),
    "sep": CriterionScript(0.5, 0.95, 25, 0.2),
    "start": CriterionScript(0.4, 0.9, 30, 0.2),
    "numbered": CriterionScript(0.3, 0.9, 40, 0.2),
    "category": CriterionScript(0.4, 0.9, 40, 0.2),
    "exclude": CriterionScript(0.5, 0.9, 40, 0.2),
    "include": CriterionScript(0.3, 0.8, 60, 0.2),
    "include:rare": CriterionScript(0.0, 0.0),
    "count": CriterionScript(0.2, 0.8, 80, 0.25),
    "wcount": CriterionScript(0.2, 0.8, 80, 0.25),
    "one_word": CriterionScript(0.4, 0.9, 40, 0.2),
    "answer": CriterionScript(0.2, 0.7, 80, 0.25),
    "order": CriterionScript(0.1, 0.6, 100, 0.25),
    "sequence": CriterionScript(0.0, 0.0),
    # The implicit requirements (constraint_spec.implicit_constraints): items repeat less as the
    # policy learns; boilerplate (praise, claim, filler) fades. Neither is stated anywhere.
    "distinct": CriterionScript(0.7, 0.95, 40, 0.2),
    "plain": CriterionScript(0.7, 0.95, 40, 0.2),
}
_FLUFF = ("praise", "claim", "pad")


class ScriptedPolicy:
    """A stand-in policy for the embedded constraint domain (module docstring).

    Seed-shared sampling: rollouts with the same key (step, sample j, task, probe stream or
    ``seed_indices``) draw the same uniform per requirement, whatever the prompt, so a guided
    and an unguided rollout on one seed differ only where the guidance moved a requirement's
    probability across that draw. ``coupling`` < 1 (a real policy's tokens diverge once the
    prompt differs) keeps the shared draw per requirement with that probability and otherwise
    draws from a stream keyed by the prompt text as well; 1 (default) shares every draw."""

    def __init__(
        self,
        script: Mapping[str, CriterionScript] | None = None,
        *,
        seed: int = 0,
        coupling: float = 1.0,
    ):
        from rubric_rl.envs.constraint_lexicon import SKILL_TEXTS

        if not 0.0 <= coupling <= 1.0:
            raise ValueError(f"ScriptedPolicy.coupling must be in [0, 1], got {coupling}")
        self.script = dict(DEFAULT_SCRIPT if script is None else script)
        self.seed = int(seed)
        self.coupling = float(coupling)
        self.skill_texts = dict(SKILL_TEXTS)
        # (task id, step, j) -> the requirement kinds the script let that rollout meet: the
        # script's truth, for checks that score a controller against it (never read by one).
        self.kept: dict[tuple[str, int, int], frozenset[str]] = {}

    def script_for(self, kind: str, rare: bool) -> CriterionScript:
        key = f"{kind}:rare" if rare and f"{kind}:rare" in self.script else kind
        if key not in self.script:
            raise KeyError(f"ScriptedPolicy: no script for constraint kind {key!r}")
        return self.script[key]

    def guided(self, prompt_text: str, capability: str, criterion_text: str = "") -> bool:
        """Guidance for a constraint is in the prompt: its capability's skill text (ARISE's
        skills), or the constraint's own criterion text (a HarnessRL ``<criterion>`` field, a
        ``<critique>`` naming it; the task's prompt states a constraint in other words)."""
        text = self.skill_texts.get(capability)
        if text and text in prompt_text:
            return True
        return bool(criterion_text) and criterion_text in prompt_text

    def guidance_gain(self, task: Any, requirement: Any, script: CriterionScript) -> float:
        """How much guidance for ``requirement`` raises its pass rate (the script's
        ``skill_gain``; a check may script it per task)."""
        return script.skill_gain

    def respond(
        self, task: Any, messages: Sequence[Mapping[str, str]], step: int, j: int, salt: int = 0
    ) -> str:
        """Rollout ``j`` at ``step``; ``salt`` > 0 draws a probe rollout (a controller's own
        sampling) from its own random stream, at the same step's script, unrecorded in ``kept``."""
        from rubric_rl.envs.constraint_domain import render_response, task_requirements

        key = [self.seed, step, j, _stable_hash(task.id)] + ([int(salt)] if salt else [])
        rng = np.random.default_rng(key)
        text = " ".join(m["content"] for m in messages)
        own = np.random.default_rng(key + [_stable_hash(text)]) if self.coupling < 1 else None
        keep = set()
        for c in task_requirements(task):  # stated constraints and implicit requirements
            script = self.script_for(c.kind, c.rare)
            p = script.p(step, False)
            if self.guided(text, c.capability, c.text):
                p = min(1.0, p + self.guidance_gain(task, c, script))
            u = rng.random()
            if own is not None and rng.random() >= self.coupling:
                u = own.random()
            if u < p:
                keep.add(c.kind)
        if not salt:
            self.kept[(task.id, int(step), int(j))] = frozenset(keep)
        fluff = {} if "plain" in keep else {_FLUFF[int(rng.integers(len(_FLUFF)))]: True}
        return render_response(task, keep, rng, **fluff)


def _stable_hash(s: str) -> int:
    return int.from_bytes(hashlib.blake2b(s.encode(), digest_size=8).digest(), "little")


def scripted_generate(policy: ScriptedPolicy):
    """A ``generate`` stage: J scripted responses for every group that has none."""

    def generate(rollouts: Rollouts, ctx: StepContext) -> Rollouts:
        j_default = int(ctx.config.rollout.samples_per_task)
        by_n: dict[int, list] = {}
        for g in rollouts.groups:
            if not g.trajectories:
                by_n.setdefault(g.n or j_default, []).append(g)
        for n, groups in by_n.items():
            # Per-sample behaviour prompts (RuscaRL's scaffold), as the real stage asks for them.
            scaffolds = ctx.controllers.sample_prompts(
                ctx.step, [g.task for g in groups], [g.messages for g in groups], n
            )
            for g, per in zip(groups, scaffolds, strict=True):
                # The real generate stage's prompt check: over model.max_prompt_len is an error.
                what = f"task {g.task.id} at step {ctx.step}"
                g.prompt_ids = ctx.services.encode_prompt(g.messages, what)
                g.trajectories = []
                for j in range(n):
                    m = g.messages if per is None else per[j]
                    text = policy.respond(g.task, m, ctx.step, j)
                    t = Trajectory((), (), "stop", ctx.step - 1, text)
                    if per is not None:
                        t = mark_behaviour(t, j, ctx.services.encode_prompt(m, what), g.prompt_ids)
                    g.trajectories.append(t)
        return rollouts

    return generate


def scripted_services_generate(policy: ScriptedPolicy, services: Services, tasks):
    """``Services.generate`` answered by the policy: probe rollouts a controller samples itself
    (HarnessRL's critic and cold start) go through the same script, at the current step's
    probabilities, each from its own random stream (per stream, and per repeat of a task within
    one call: the engine seeds every prompt of a call apart). ``seed_indices``, as the engine's:
    prompts with the same index share their samples' seeds (``ScriptedPolicy``'s seed-shared
    sampling). ``names`` must be task ids."""
    by_id = {t.id: t for t in tasks}

    def generate(prompts, n, *, stream="probe", params=None, names=None, seed_indices=None):
        if names is None:
            raise ValueError("scripted generate: the caller must pass names= (task ids)")
        if seed_indices is not None and len(seed_indices) != len(prompts):
            raise ValueError(f"seed_indices: one per prompt ({len(prompts)})")
        ids, out = [], []
        salt = _stable_hash(stream) % 1000 + 1
        repeats: collections.Counter = collections.Counter()
        for i, (m, name) in enumerate(zip(prompts, names, strict=True)):
            task = by_id[name]
            k, repeats[name] = repeats[name], repeats[name] + 1
            s = salt + 7919 * k
            if seed_indices is not None:
                s = 1 + int(seed_indices[i]) % (1 << 40)
            ids.append(services.encode_prompt(m, f"task {name} at step {services.step}"))
            texts = [policy.respond(task, m, services.step, j, salt=s) for j in range(n)]
            out.append([Trajectory((), (), "stop", services.step - 1, x) for x in texts])
        return ids, out

    return generate


@dataclasses.dataclass
class CheckReport:
    figures: dict[str, float]
    per_step: list[dict[str, float]]


def _pool_controller(controllers) -> Any:
    for c in controllers.controllers:
        if hasattr(c, "pool"):
            return c
    return None


def run_check(
    config: Any,
    policy: ScriptedPolicy,
    steps: int,
    *,
    stuck_window: int = 20,
    stuck_below: float = 0.05,
    workdir: str | None = None,
) -> CheckReport:
    """Runs ``steps`` steps of ``config``'s pipeline with ``policy`` generating (module
    docstring). ``config`` is a method config (e.g. ``configs/arise.py``); its model, engine and
    optimizer are never built."""
    owned = workdir is None
    tmp = tempfile.TemporaryDirectory() if owned else None
    workdir = tmp.name if owned else workdir
    try:
        return _run(config, policy, steps, stuck_window, stuck_below, workdir)
    finally:
        if tmp is not None:
            tmp.cleanup()


@dataclasses.dataclass
class ScriptedRun:
    """A method's real stages, controllers and services with the scripted policy generating."""

    config: Any
    domain: Any
    services: Services
    controllers: Any
    pipeline: Any

    def step(self, step: int) -> tuple[Rollouts, StepContext]:
        rng = np.random.default_rng([int(self.config.train.seed), step])
        self.services.begin_step(step)
        ctx = StepContext(step, self.config, rng, self.services, self.controllers, self.domain)
        return self.pipeline(ctx), ctx

    def metrics(self, rollouts: Rollouts, ctx: StepContext) -> dict[str, Any]:
        """What the trainer logs for the step, less what the update measures (``loss/*``,
        ``train/*``, timings, the oracle): ``step_metrics`` of the rollouts, then the stages'."""
        seconds = dict(ctx.seconds, step=sum(ctx.seconds.values()))
        m = step_metrics(rollouts, {}, seconds, measured=False)
        m.update(ctx.metrics)
        return m


def scripted_run(
    config,
    policy: ScriptedPolicy | None,
    workdir: str,
    controllers=None,
    *,
    engine: Callable[[Any], RolloutEngine] | None = None,
) -> ScriptedRun:
    """Builds the domain, the judge, ``Services`` and the method's controllers (or
    ``controllers``), bound to ``<workdir>/controllers``. Generation is answered by ``policy``
    (the ``generate`` stage and ``Services.generate`` replaced), or, with ``policy=None``, by
    the real ``generate`` stage and ``Services`` on ``engine(tokenizer)`` (a model-free engine:
    ``rollout.scripted.ScriptedEngine``; ``ScriptedRun.services.engine``)."""
    if (policy is None) == (engine is None):
        raise ValueError("scripted_run: give a ScriptedPolicy or an engine, not both or neither")
    if policy is not None and config.get("calibration") is not None and config.calibration.enabled:
        # Calibration samples the policy through the engine; the policy check has none.
        config = config.copy_and_resolve_references()
        config.unlock()
        config.calibration.enabled = False
        config.lock()
    domain = builders.build_domain(config)
    judge = builders.build_judge(config, workdir)
    tokenizer = builders.build_tokenizer(config, domain, workdir)
    buckets = functools.partial(builders.prompt_buckets, config)
    live = None if engine is None else engine(tokenizer)
    services = Services(config, live, tokenizer, judge, domain, workdir, buckets)
    if policy is not None:
        # Both entry points: Services.generate, and the sampler's own, which Services.rollouts
        # (calibration's probes, a controller's re-samples) reaches without Services.generate.
        services.generate = services.sampler.generate = scripted_services_generate(
            policy, services, domain.train
        )
    if controllers is None:
        controllers, pipeline = builders.build_method(config, domain)
    else:  # given controllers: the method's pipeline over them
        method = get_method(str(config.get("method", "grpo")))
        pipeline = method.pipeline(config, controllers.controllers)
    controllers.bind(services, os.path.join(workdir, "controllers"))
    if policy is not None:
        pipeline = pipeline.replace("generate", scripted_generate(policy))
    return ScriptedRun(config, domain, services, controllers, pipeline)


def _run(config, policy, steps, stuck_window, stuck_below, workdir) -> CheckReport:
    run = scripted_run(config, policy, workdir)
    config, domain, controllers = run.config, run.domain, run.controllers
    pool_ctl = _pool_controller(controllers)
    harness = next((c for c in controllers.controllers if hasattr(c, "last_attributions")), None)
    label_counts: collections.Counter = collections.Counter()
    cap = int(pool_ctl.config.pool_cap) if pool_ctl is not None else 0
    history: dict[str, collections.deque] = {}
    per_step: list[dict[str, float]] = []
    all_fail = rubric_signal = with_adv = 0
    n_groups = 0
    env_counts: collections.Counter = collections.Counter()
    pass_rates: list[float] = []
    for step in range(1, steps + 1):
        r, ctx = run.step(step)
        controllers.pop_events()
        sel = r.selected()
        u = np.array([g.weight for g in sel], np.float64)
        row = {
            "prompt_tokens_max": float(max(len(g.prompt_ids) for g in r.groups)),
            "effective_batch": float(u.sum() ** 2 / max((u**2).sum(), 1e-300)),
            "groups": float(len(sel)),
            "u_min": float(u.min()),
            "u_max": float(u.max()),
        }
        passed = []
        for g in sel:
            env_counts[g.task.env_name or g.task.task_type or "?"] += 1
            ver = np.array([t.signals.get(VERIFIER_SIGNAL, np.nan) for t in g.trajectories])
            ok = ver[~np.isnan(ver)]
            passed.extend(ok.tolist())
            n_groups += 1
            if ok.size and not ok.any():
                all_fail += 1
                rub = np.array([t.signals.get(RUBRIC_SIGNAL, np.nan) for t in g.trajectories])
                rub = rub[~np.isnan(rub)]
                rubric_signal += bool(rub.size > 1 and np.ptp(rub) > 1e-9)
                adv = np.array([t.advantage for t in g.trajectories])
                with_adv += bool(np.any(np.nan_to_num(adv) != 0))
        pass_rates.append(float(np.mean(passed)) if passed else float("nan"))
        row["task_pass_rate"] = pass_rates[-1]
        if pool_ctl is not None:
            row.update(_pool_row(pool_ctl, r, history, stuck_window, stuck_below))
        if harness is not None:
            _harness_labels(harness, label_counts)
            row.update({k: v for k, v in ctx.metrics.items() if k.startswith("harness/")})
        per_step.append(row)
    figures = _figures(per_step, cap, n_groups, all_fail, rubric_signal, with_adv, pass_rates)
    total = sum(env_counts.values())
    held = collections.Counter(t.env_name or t.task_type or "?" for t in domain.heldout)
    tv = 0.0
    for env in sorted(set(env_counts) | set(held)):
        a = env_counts[env] / max(total, 1)
        b = held[env] / max(sum(held.values()), 1)
        figures[f"env_mix/{env}"] = a
        figures[f"heldout_mix/{env}"] = b
        tv += abs(a - b) / 2
    figures["env_mix_tv"] = tv
    if harness is not None:
        figures.update(_harness_figures(per_step, label_counts))
    return CheckReport(figures, per_step)


# The script's truth about a criterion, for the attributor's precision and recall: the domain's
# analysis tags (read here, by the check, never by a controller), with the criteria the script
# never lets the policy meet counted as blind. A criterion without a class tag (one the harness
# created from the checker library) is genuine.
TRUTH_LABELS = ("blind", "saturated", "spurious")


def criterion_truth(c, policy_never: frozenset[str]) -> str:
    cls = next((t.split(":", 1)[1] for t in c.tags if t.startswith("class:")), "genuine")
    kind = next((t.split(":", 1)[1] for t in c.tags if t.startswith("kind:")), "")
    return "blind" if kind in policy_never else cls


def _harness_labels(ctl, counts: collections.Counter) -> None:
    never = frozenset(
        k for k, s in DEFAULT_SCRIPT.items() if ":" not in k and s.start == 0 and s.end == 0
    )
    for att in ctl.last_attributions:
        crit = {c.id: c for c in ctl.state[att.task_id].criteria_before_step}
        for lab in att.labels:
            c = crit.get(lab.criterion_id)
            truth = "genuine" if c is None else criterion_truth(c, never)
            counts[(lab.label, truth)] += 1


def _harness_figures(per_step, counts: collections.Counter) -> dict[str, float]:
    """The attributor's precision and recall per failure label against the script's truth, and
    the harness's dynamics at the end."""
    out: dict[str, float] = {}
    for lab in TRUTH_LABELS:
        tp = counts[(lab, lab)]
        labelled = sum(v for (a, _), v in counts.items() if a == lab)
        true = sum(v for (_, t), v in counts.items() if t == lab)
        out[f"harness/attributor/{lab}/precision"] = tp / labelled if labelled else float("nan")
        out[f"harness/attributor/{lab}/recall"] = tp / true if true else float("nan")
        out[f"harness/attributor/{lab}/labelled"] = float(labelled)
        out[f"harness/attributor/{lab}/true"] = float(true)
    last = per_step[-1]
    for k in (
        "guidance/fields_per_task", "guidance/unguided_share",
        "guidance/drawn_fields_per_task", "guidance/drawn_unguided_share", "reversal_rate",
    ):  # fmt: skip
        if f"harness/{k}" in last:
            out[f"harness/{k}"] = last[f"harness/{k}"]
    for k in ("rollout", "rubric", "sampling"):
        acc = sum(row.get(f"harness/updates/{k}/accepted", 0.0) for row in per_step)
        prop = sum(row.get(f"harness/updates/{k}/proposed", 0.0) for row in per_step)
        out[f"harness/updates/{k}/accepted"] = acc
        out[f"harness/updates/{k}/proposed"] = prop
    n_levels = sum(1 for k in last if k.startswith("harness/levels/"))
    for lv in range(n_levels):
        out[f"harness/levels/{lv}"] = last[f"harness/levels/{lv}"]
    return out


def _pool_row(ctl, r: Rollouts, history, window: int, below: float) -> dict[str, float]:
    """This step's pool state and stuck slots (live entries, judged on ≥ ``window`` of their
    last steps, passing below ``below`` over them)."""
    counts: dict[str, list[float]] = {}
    for g in r.groups:
        for t in g.trajectories:
            for v in t.verdicts:
                if v.met is None or v.criterion_id not in ctl.pool.entries:
                    continue
                e = ctl.pool.entries[v.criterion_id]
                c = counts.setdefault(v.criterion_id, [0.0, 0.0])
                c[0] += float(satisfied(v.met, e.weight))
                c[1] += 1.0
    for eid, c in counts.items():
        history.setdefault(eid, collections.deque(maxlen=window)).append(c)
    stuck = 0
    live = ctl.pool.live()
    for e in live:
        h = history.get(e.id)
        if h is not None and len(h) >= window:
            rate = sum(x[0] for x in h) / max(sum(x[1] for x in h), 1.0)
            stuck += rate < below
    t = ctl.pool.totals
    return {
        "pool/live": float(len(live)),
        "pool/stuck": float(stuck),
        "pool/added": float(t["added"]),
        "pool/retired": float(t["retired"]),
        "pool/retired_unlearnable": float(t.get("retired_unlearnable", 0)),
        "pool/refined": float(t["refined"]),
        "pool/active": float(sum(e.state == "active" for e in live)),
        "pool/hidden": float(sum(e.state == "hidden" for e in live)),
    }


def _figures(per_step, cap, n_groups, all_fail, rubric_signal, with_adv, pass_rates):
    def mean(key):
        return float(np.mean([row[key] for row in per_step]))

    tenth = max(1, len(pass_rates) // 10)
    out = {
        "steps": float(len(per_step)),
        "effective_batch": mean("effective_batch"),
        "effective_batch_frac": float(
            np.mean([row["effective_batch"] / row["groups"] for row in per_step])
        ),
        "prompt_tokens_max": float(max(row["prompt_tokens_max"] for row in per_step)),
        "u_min": float(min(row["u_min"] for row in per_step)),
        "u_max": float(max(row["u_max"] for row in per_step)),
        "all_fail_groups": all_fail / max(n_groups, 1),
        "all_fail_rubric_signal": rubric_signal / all_fail if all_fail else float("nan"),
        "all_fail_advantage": with_adv / all_fail if all_fail else float("nan"),
        "task_pass_rate_first": float(np.nanmean(pass_rates[:tenth])),
        "task_pass_rate_last": float(np.nanmean(pass_rates[-tenth:])),
    }
    if "pool/live" in per_step[0]:
        last = per_step[-1]
        out.update({k: last[k] for k in last if k.startswith("pool/")})
        out["pool/live_mean"] = mean("pool/live")
        out["pool/stuck_mean"] = mean("pool/stuck")
        out["pool/full_frac"] = float(np.mean([row["pool/live"] >= cap for row in per_step]))
    return out


__all__ = [
    "DEFAULT_SCRIPT",
    "CheckReport",
    "CriterionScript",
    "ScriptedPolicy",
    "run_check",
    "scripted_generate",
]
