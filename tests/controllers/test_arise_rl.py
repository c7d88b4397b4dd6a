"""ARISE-RL's controller: the cycle schedule, the solver and generator rewards of a
step, the pool refresh, RG-SED's memories / memory rollouts / Δr / gates / teachers, and the
scripted-policy check — the real pipeline, Services, agent loop, tokenizer and programmatic judge
with a scripted engine standing in for the policy (deterministic, seconds)."""

import copy
import dataclasses
import functools
import math

import numpy as np
import pytest

from configs import arise_rl as arise_rl_config
from rubric_rl.checks.controller_check import scripted_run
from rubric_rl.config import builders
from rubric_rl.config.config_validation import validate_config
from rubric_rl.envs.constraint_lexicon import units
from rubric_rl.envs.constraint_writer import COACH_HINTS as GENERATOR_HINTS
from rubric_rl.envs.constraint_writer import (
    format_generated,
    generator_vocabulary,
    lookup_text,
)
from rubric_rl.envs.tool_calls import render_tool_call
from rubric_rl.loop.trainer_batch import rollouts_to_batch
from rubric_rl.methods.arise_rl import arise_rl_config as section_of
from rubric_rl.methods.arise_rl import rgsed
from rubric_rl.methods.arise_rl.arise_rl import (
    SIGNAL,
    AriseRLConfig,
    AriseRLController,
    GeneratorScore,
    final_turn_mask,
    generator_memory,
    grouped_advantages,
    met_matrix,
    phase,
    proposer_reward,
    solver_rewards,
)
from rubric_rl.rollout.scripted import ScriptedEngine
from rubric_rl.rubrics.types import Criterion, Message, Rubric, Task, Verdict
from rubric_rl.services import Services

# --- the schedule --------------------------------------------------------------------------------


def test_phase_schedule_hand_values():
    cfg = AriseRLConfig(cycles=2, generator_steps=2, solver_steps=3)
    got = [(p.cycle, p.role, p.offset, p.refreshes) for p in (phase(s, cfg) for s in range(1, 13))]
    assert got == [
        (0, "generator", 0, False), (0, "generator", 1, False),
        (0, "solver", 0, True), (0, "solver", 1, False), (0, "solver", 2, False),
        (1, "generator", 0, False), (1, "generator", 1, False),
        (1, "solver", 0, True), (1, "solver", 1, False), (1, "solver", 2, False),
        # beyond the last cycle: its solver phase goes on
        (1, "solver", 3, False), (1, "solver", 4, False),
    ]  # fmt: skip
    assert cfg.total_steps == 10
    no_gen = AriseRLConfig(cycles=2, generator_steps=0, solver_steps=2)
    assert [phase(s, no_gen).role for s in (1, 2, 3)] == ["solver"] * 3
    assert phase(3, no_gen).refreshes and phase(3, no_gen).cycle == 1
    with pytest.raises(ValueError, match="step must be >= 1"):
        phase(0, cfg)


@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(cycles=0), "cycles must be an integer >= 1"),
        (dict(pool_fill="web"), "pool_fill must be one of"),
        (dict(gate="sometimes"), "gate must be one of"),
        (dict(shape="mine"), "shape must be one of"),
        (dict(rgsed_roles=("critic",)), "unknown roles"),
        (dict(pool_min=600), "pool_min"),
        (dict(alpha=1.5), "alpha"),
    ],
)
def test_config_errors_name_the_field(kw, match):
    with pytest.raises(ValueError, match=match):
        AriseRLConfig(**kw)


def test_section_defaults_are_the_dataclass_defaults():
    # One source of each default: the base section is AriseRLConfig's fields, and the run's
    # config object is AriseRLConfig() itself (a second default in the config file would differ).
    c = arise_rl_config.get_config()
    assert c.arise_rl.to_dict() == dataclasses.asdict(AriseRLConfig())
    assert section_of(c) == AriseRLConfig()
    smoke = section_of(arise_rl_config.get_config("smoke"))
    assert smoke != AriseRLConfig() and isinstance(smoke.tau, float)


@pytest.mark.parametrize(
    "edit, match",
    [
        (lambda a: a.pop("pool_min"), r"config\.arise_rl: missing field\(s\) \['pool_min'\]"),
        (lambda a: a.update(pool_mni=3), r"config\.arise_rl: unknown field\(s\) \['pool_mni'\]"),
        (lambda a: a.update(cycles="3"), r"config\.arise_rl\.cycles must be of type int"),
        (lambda a: a.update(placebo=1), r"config\.arise_rl\.placebo must be of type bool"),
        (lambda a: a.update(n_negatives=2.0), r"config\.arise_rl\.n_negatives must be of type int"),
        (lambda a: a.update(tau="0.1"), r"config\.arise_rl\.tau must be of type float"),
        (
            lambda a: a.update(rgsed_roles="solver"),
            r"config\.arise_rl\.rgsed_roles must be of type tuple",
        ),
        (lambda a: a.update(gate=None), r"config\.arise_rl\.gate must be of type str"),
        (lambda a: a.update(gate="sometimes"), r"config\.arise_rl\.gate must be one of"),
    ],
)
def test_section_field_errors_name_the_field(edit, match):
    section = dataclasses.asdict(AriseRLConfig())
    edit(section)
    with pytest.raises(ValueError, match=match):
        AriseRLConfig.from_config({"arise_rl": section})


def test_start_up_validation_names_an_unknown_field():
    c = arise_rl_config.get_config("smoke")
    c.unlock()
    c.arise_rl.solver_step = 3
    with pytest.raises(ValueError, match=r"config\.arise_rl: unknown field\(s\) \['solver_step'\]"):
        validate_config(c)


def test_every_config_variant_builds():
    for v in ("", "smoke", "protocol", "seed_scale", *arise_rl_config.ARMS, "hard_gate",
              "final_turn", "placement=last_user", "estimator=full", "current_solver",
              "shape=absolute_zero"):  # fmt: skip
        c = arise_rl_config.get_config(v)
        a = c.arise_rl
        assert c.train.steps == a.cycles * (a.generator_steps + a.solver_steps)
        AriseRLConfig(**{**a.to_dict(), "rgsed_roles": tuple(a.rgsed_roles)})
    assert arise_rl_config.get_config("no_rgsed").loss.sd_estimator == "none"
    dz = arise_rl_config.get_config("dr_zero")
    assert (dz.arise_rl.proposer_reward, dz.arise_rl.advantage_grouping) == ("dr_zero", "hrpo")
    az = arise_rl_config.get_config("absolute_zero")
    assert (az.arise_rl.proposer_reward, az.arise_rl.advantage_grouping) == (
        "absolute_zero",
        "trr++",
    )
    for base in (dz, az):  # their frameworks: no self-distillation
        assert base.loss.sd_estimator == "none" and base.loss.sd_coef == 0.0
    assert arise_rl_config.get_config("shape=dr_zero").arise_rl.shape == "dr_zero"
    assert arise_rl_config.get_config("opcd").loss.sd_agg_mode == "seq-mean-token-mean"
    assert not arise_rl_config.get_config("no_tool").arise_rl.tool_grounding
    grpo = arise_rl_config.get_config("solver_grpo")
    assert grpo.method == "grpo" and grpo.loss.reward == "arise_rl_solver_weighted"
    assert grpo.train.steps == arise_rl_config.get_config("").train.steps
    with pytest.raises(ValueError, match="one ablation or baseline at a time"):
        arise_rl_config.get_config("no_gate,no_tool")
    with pytest.raises(ValueError, match="unknown variant"):
        arise_rl_config.get_config("frozen")


# --- rewards of a group -------------------------------------------------------------------------


def _task(weights=(2.0, 1.0, -1.0)):
    crits = tuple(Criterion(f"c{i}", f"rule {i}", w) for i, w in enumerate(weights))
    return Task("t", (Message("user", "q"),), Rubric(crits))


def _row(*met):
    return tuple(Verdict(f"c{i}", m) for i, m in enumerate(met))


def test_solver_rewards_eq7_unweighted_or_weighted_and_skip_failed_verdicts():
    task = _task()
    rows = [
        _row(True, True, False),  # all satisfied (pitfall absent): s = 1 -> r = 1
        _row(True, False, False),  # weighted s = (2 + 1) / 4 = 0.75; eq. 7's mean 2/3
        _row(False, True, True),  # pitfall present: weighted s = 1 / 4; mean 1/3
        _row(None, True, False),  # failed verdict left out: s = 1 either way -> r = 1
        _row(None, None, None),  # nothing valid: NaN, never 0
    ]
    r = solver_rewards(task, rows, alpha=0.8, satisfaction="weighted")
    np.testing.assert_allclose(r[:4], [1.0, 0.8 * 0.75, 0.8 * 0.25, 1.0])
    assert math.isnan(r[4])
    r = solver_rewards(task, rows, alpha=0.8)  # the default: eq. 7's unweighted mean
    np.testing.assert_allclose(r[:4], [1.0, 0.8 * 2 / 3, 0.8 * 1 / 3, 1.0])
    assert math.isnan(r[4])
    with pytest.raises(ValueError, match="satisfaction must be one of"):
        solver_rewards(task, rows, satisfaction="mine")
    assert np.isnan(met_matrix(task, rows)[3, 0])
    with pytest.raises(ValueError, match="not in its rubric"):
        met_matrix(task, [(Verdict("zz", True),)])


def test_registered_weighted_solver_reward_is_the_controllers():
    from rubric_rl.rollout.batch import Rollouts
    from rubric_rl.rubrics.rewards import batch_rewards

    task = _task()
    rows = [_row(True, True, False), _row(True, False, False), _row(False, True, True)]
    r = Rollouts.from_responses(0, [task], [["a", "b", "c"]], [rows])
    got = batch_rewards("arise_rl_solver_weighted", r.scores).values[0]
    np.testing.assert_allclose(got, solver_rewards(task, rows, satisfaction="weighted"))


def test_generator_memory_rules_and_vocabulary():
    def s(reason=None, tool=True, c=None, reward=0.0, q="q"):
        return GeneratorScore(reward, reason, tool, None, q, c)

    def coach(*names):
        return " ; ".join(f"remember : {GENERATOR_HINTS[n]}" for n in names)

    assert generator_memory([], 8, GENERATOR_HINTS) is None
    # every group (the default): the failures any episode made, most common first, at most 2
    assert generator_memory([s(c=4), s(c=3), s("no_question")], 8, GENERATOR_HINTS) == coach(
        "format"
    )
    tool = generator_memory(
        [s(tool=False), s(tool=False), s(c=8), s(c=8), s(c=8)], 8, GENERATOR_HINTS
    )
    assert tool == coach("too_easy", "tool")
    both = generator_memory([s(tool=False, c=None), s(tool=False, c=0), s(c=0)], 8, GENERATOR_HINTS)
    assert both == coach("tool", "too_hard")  # 2 each: the order format, tool, easy, hard
    # no failure: the best episode's question, restated
    keep = generator_memory(
        [s(c=4, reward=3.0, q="list 3 fruits"), s(c=2, reward=2.0)], 8, GENERATOR_HINTS
    )
    assert keep == "remember : " + GENERATOR_HINTS["keep"].format(question="list 3 fruits")
    # the majority rule: only the failures of most of the group
    maj = functools.partial(generator_memory, hints=GENERATOR_HINTS, rule="majority")
    assert maj([s(c=4), s(c=3), s("no_question")], 8) is None
    assert maj([s("no_question"), s("no_rubric"), s(c=4)], 8) == coach("format")
    assert maj([s(tool=False), s(tool=False), s(c=8), s(c=8), s(c=8)], 8) == coach("too_easy")
    assert maj([s(tool=False, c=None), s(tool=False, c=0), s(c=0)], 8) == coach("tool", "too_hard")
    with pytest.raises(ValueError, match="rule must be one of"):
        generator_memory([s()], 8, GENERATOR_HINTS, rule="sometimes")
    vocab = set(generator_vocabulary())
    for text in GENERATOR_HINTS.values():
        text = text.format(question="list 3 fruits")
        assert set(units(text)) <= vocab, set(units(text)) - vocab


def test_final_turn_mask():
    assert final_turn_mask((1, 1, 0, 0, 1, 1, 1, 0), 8) == (0, 0, 0, 0, 1, 1, 1, 0)
    assert final_turn_mask(None, 3) == (1, 1, 1)
    assert final_turn_mask((0, 0), 2) == (0, 0)


# --- the scripted-policy check ------------------------------------------------------------------

QUESTION = "list 3 fruits"
CRITERION = "the response lists exactly 3 items"
FINAL = format_generated(QUESTION, [CRITERION])
LOOKUP = render_tool_call("lookup", {"category": "fruit"})
FRUITS = lookup_text("fruit").split(" : ")[1].split(" , ")
SUCCESS = " , ".join(FRUITS[:3])
FAIL = FRUITS[0]
K = 4
MAX_TURNS = 3
J = 5


class ScriptEngine(ScriptedEngine):
    """The stand-in policy. Generator sample j of 5: 0 looks up fruits, then writes FINAL
    (grounded); 2 writes FINAL without a lookup; 1, 3, 4 write no question (a majority: the coach
    writes a format memory), and with a <coach> block every sample is grounded. Solver: with a
    <coach> block always right; a K-attempt probe right on even samples (c = K/2); a trained
    rollout right on sample 0 only (so the coach writes a memory)."""

    def reply(self, request, prompt_text, k):
        # an agent turn's sample j is its episode, sample_offset = j * max_turns + turn
        j = request.sample_offset // MAX_TURNS if "/turn" in request.request_id else k
        return self.respond(request, prompt_text, j)

    def respond(self, r, text, j):
        if "write a task" in text:
            if "fruits :" in text:
                return FINAL
            if "<coach>" in text:
                return LOOKUP
            return (LOOKUP, "hello", FINAL, "hello", "hello")[j % 5]
        if "<coach>" in text:
            return SUCCESS
        if "arise_rl/attempts" in r.request_id:
            return SUCCESS if j % 2 == 0 else FAIL
        return SUCCESS if j == 0 else FAIL


def _config():
    c = arise_rl_config.get_config("smoke")
    c.unlock()
    c.calibration.enabled = False
    c.rollout.update(samples_per_task=J, tasks_per_step=2)
    c.rollout.agent.max_turns = MAX_TURNS
    c.arise_rl.update(
        cycles=2, generator_steps=1, solver_steps=2, k_attempts=K, pool_min=1, refresh_rollouts=6,
        refresh_batch=3, memory_rollouts=2, warmup_steps=0, generator_max_new_tokens=64,
        solver_policy="frozen", base_probe_tasks=1,
    )  # fmt: skip
    c.domain.update(n_train=16, n_heldout=8, n_ood=8)
    c.lock()
    return c


def scripted_steps(workdir: str, config, engine_cls, steps):
    """Runs the real pipeline for ``steps`` on a ``engine_cls(tokenizer)`` scripted engine;
    returns (services, controllers, domain, {step: (rollouts, ctx, engine requests)}, engine)."""
    run = scripted_run(config, None, workdir, engine=engine_cls)
    engine = run.services.engine
    out = {}
    for step in steps:
        engine.requests.clear()
        rollouts, ctx = run.step(step)
        out[step] = (rollouts, ctx, list(engine.requests))
    return run.services, run.controllers, run.domain, out, engine


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    config = _config()
    workdir = str(tmp_path_factory.mktemp("arise_rl"))
    services, controllers, _, steps, engine = scripted_steps(
        workdir, config, ScriptEngine, (1, 2, 3)
    )
    yield config, services, controllers, steps
    engine.close()


def _ctl(controllers) -> AriseRLController:
    (ctl,) = controllers.controllers
    return ctl


def test_generator_step_rewards_and_metrics(run):
    config, _, controllers, steps = run
    rollouts, ctx, requests = steps[1]
    assert [g.role for g in rollouts.groups] == ["generator", "generator"]
    # the K attempts and the memory rollouts are not in the step
    assert [len(g) for g in rollouts.groups] == [J, J]
    nq = "no_question"
    for g in rollouts.groups:
        infos = [t.info["arise_rl"] for t in g.trajectories]
        # grounded + c = K/2 (R_diff = 2): 3; no question: 0 (reason counted); no lookup: 0
        assert [i["r_g"] for i in infos] == [3.0, 0.0, 0.0, 0.0, 0.0]
        assert [i["fmt_reason"] for i in infos] == [None, nq, None, nq, nq]
        assert [i["tool"] for i in infos] == [True, False, False, False, False]
        assert [i["c"] for i in infos] == [K // 2, None, None, None, None]
        assert [t.reward for t in g.trajectories] == [3.0, 0.0, 0.0, 0.0, 0.0]
        assert all(math.isnan(t.signals["task_verifier"]) for t in g.trajectories)
        assert g.trajectories[0].info["tool_calls"] == 1  # the agent loop ran the tool
    m = ctx.metrics
    assert m["arise_rl/generator/fmt_rate"] == pytest.approx(2 / 5)
    assert m["arise_rl/generator/tool_rate"] == pytest.approx(1 / 5)
    assert m["arise_rl/generator/gates_rate"] == pytest.approx(1 / 5)
    assert m["arise_rl/generator/reason/no_question"] == pytest.approx(3 / 5)
    assert m[f"arise_rl/generator/c/{K // 2}"] == 1.0
    assert m["arise_rl/generator_phase"] == 1.0
    # Only grounded tasks are solved: one K-sample probe request per trained grounded episode
    # (2), then one per memory rollout (2 groups x J' = 2, all grounded under the memory).
    probes = [(rid, held) for rid, _, held in requests if "arise_rl/attempts" in rid]
    assert len(probes) == 2 + 4
    # ... all on the solver frozen at the cycle's first generator step (the second snapshot of
    # step 1: the first is the frozen base policy); the trained episodes on the live policy.
    assert {held for _, held in probes} == {"snapshot2"}
    assert {held for rid, _, held in requests if "/turn" in rid} == {None}
    # Most of each group wrote no question, one no lookup: the coach's memory; the memory
    # rollouts (R_G 3 each) measure Δr = 3 − 3/5; their episodes ran in the system message's memory.
    assert m["arise_rl/rgsed/memory_frac"] == 1.0
    assert m["arise_rl/rgsed/delta_r"] == pytest.approx(3.0 - 3.0 / 5.0)
    memory_eps = [t for _, t, _ in requests if "write a task" in t and "<coach>" in t]
    assert len(memory_eps) == 2 * 2 * 2  # 4 episodes, a lookup turn and a final turn each
    # (every group's memory: its failures, most common first: format 3, tool 1)
    coach = "<coach> remember : " + GENERATOR_HINTS["format"] + " ; remember : "
    coach += GENERATOR_HINTS["tool"]
    for g in rollouts.groups:
        for t in g.trajectories:
            system = t.teacher_prompt[0]
            assert system["role"] == "system" and system["content"].endswith(coach + " </coach>")
            assert system["content"].startswith(g.messages[0]["content"])
            assert t.sd_coef > 0.5 * config.loss.sd_coef  # the soft gate is open (Δr ≫ τ)
    # the generator's effective λ: λ0 · gate(Δr) · w · d at its phase's first step (t = 0)
    want = rgsed.rgsed_coef([3.0 - 3.0 / 5.0], 0, warmup_steps=0, lambda0=config.loss.sd_coef)
    assert m["arise_rl/rgsed/generator/lambda_mean"] == pytest.approx(float(want[0]))
    assert m["arise_rl/rgsed/generator/lambda_active_frac"] == 1.0
    assert _ctl(controllers).recent[-1] == QUESTION


def test_pool_refresh_deduplicates(run):
    _, _, controllers, steps = run
    rollouts, ctx, requests = steps[2]
    ctl = _ctl(controllers)
    assert [t.prompt[-1].content for t in ctl.pool] == [QUESTION]
    stats = ctl.pool_stats
    assert stats == {
        "rollouts": 6.0, "generated": 1.0, "filled": 0.0, "parse_rate": 1.0, "duplicates": 5.0,
        "ungrounded": 0.0, "base_pass_rate": 1.0, "base_probe_tasks": 1.0,
    }  # fmt: skip
    # The base probe ran on the frozen base policy (step 1's first snapshot); the frozen solver
    # is released when the solver phase begins (held only while needed).
    (probe,) = [held for rid, _, held in requests if "arise_rl/base_probe" in rid]
    assert probe == "snapshot1"
    services = ctx.services
    assert services.held_step("arise_rl_base") == 1
    assert services.held_step("arise_rl_frozen_solver") is None
    # 6 refresh episodes (one rollout per prompt), each a lookup turn and a final turn
    assert sum("write a task" in text for _, text, _ in requests) == 12
    assert [g.task.id for g in rollouts.groups] == [ctl.pool[0].id] * 2
    assert [g.role for g in rollouts.groups] == ["solver", "solver"]


def test_solver_step_rgsed(run):
    config, services, controllers, steps = run
    rollouts, ctx, requests = steps[2]
    for g in rollouts.groups:
        # the generated rubric is completed with the question's library criteria: a single
        # fruit misses "exactly 3 items" and satisfies the 3 others (eq. 7: s = 3/4, r = 0.6)
        assert len(g.task.rubric.criteria) == 4
        assert [t.signals[SIGNAL] for t in g.trajectories] == pytest.approx([1.0] + [0.6] * 4)
        assert len(g) == J  # memory rollouts are never in the step
    mem = [rid for rid, _, _ in requests if "arise_rl/memory" in rid]
    assert len(mem) == 2  # one request per group, J' = 2 samples each
    # both groups hold the same (only) pool task: no placebo donor
    assert not [rid for rid, _, _ in requests if "arise_rl/placebo" in rid]
    # Δr = mean(memory) − mean(standard) = 1 − (1 + 4 · 0.6)/5 per group; soft gate ≈ 1
    dr = 1.0 - (1.0 + 4 * 0.6) / 5.0
    m = ctx.metrics
    assert m["arise_rl/rgsed/delta_r"] == pytest.approx(dr)
    assert m["arise_rl/rgsed/above"] == 1.0 and m["arise_rl/rgsed/memory_frac"] == 1.0
    # The schedule's clock restarts at each role phase: step 2 is the solver phase's first (t = 0).
    want = rgsed.rgsed_coef([dr], 0, gate="soft", warmup_steps=0, lambda0=config.loss.sd_coef)
    assert m["arise_rl/rgsed/solver/delta_r"] == pytest.approx(dr)
    assert m["arise_rl/rgsed/solver/lambda_mean"] == pytest.approx(float(want[0]))
    assert m["arise_rl/rgsed/solver/lambda_active_frac"] == 1.0
    assert "arise_rl/rgsed/generator/delta_r" not in m
    for g in rollouts.groups:
        for t in g.trajectories:
            assert t.sd_coef == pytest.approx(float(want[0]))
            system = t.teacher_prompt[0]
            assert system["role"] == "system" and "<coach> remember :" in system["content"]
            assert t.teacher_prompt[1:] == [dict(m) for m in g.messages]
    # Teacher alignment: each row's teacher completion tokens are exactly the student's, after
    # the group's prompt with the memory in its system message.
    tb = rollouts_to_batch(rollouts, services, True, None)
    ids, tids = np.asarray(tb.input_ids), np.asarray(tb.teacher_input_ids)
    p = services.prompt_len([len(g.prompt_ids) for g in rollouts.groups])
    rows = [t for g in rollouts.groups for t in g.trajectories]
    assert len(rows) == ids.shape[0] == 2 * J
    for b, t in enumerate(rows):
        n, tp = len(t.tokens), p + int(np.asarray(tb.teacher_offset)[b])
        assert list(ids[b, p : p + n]) == list(t.tokens)
        assert list(tids[b, tp : tp + n]) == list(t.tokens)
        assert list(tids[b, tp - len(t.teacher_prompt_ids) : tp]) == list(t.teacher_prompt_ids)
        assert services.encode_prompt(t.teacher_prompt, "t", "max_teacher_prompt_len") == (
            t.teacher_prompt_ids
        )


def test_generator_sd_waits_for_a_positive_mean_delta_r(run):
    """generator_sd="after_positive": a generator step whose groups' mean Δr is not > 0 distils
    none of them (even a group above τ); "always" leaves the per-group gate alone."""
    config, services, controllers, steps = run
    rollouts = steps[1][0]
    ctl = _ctl(controllers)
    for mode, dr, want_open in (
        ("after_positive", [0.5, -0.6], False),
        ("after_positive", [0.5, -0.4], True),
        ("always", [0.5, -0.6], True),
    ):
        other = AriseRLController(
            dataclasses.replace(ctl.cfg, generator_sd=mode, warmup_steps=0),
            fallback_tasks=ctl.fallback_tasks, tasks_per_step=2,
            generator_domain=ctl.generator_domain, style=ctl.style,
        )  # fmt: skip
        other._memory = {0: "m", 1: "m"}
        other._dr = np.array(dr)
        gate = other.sd_gate(rollouts)
        assert gate[1] == pytest.approx(0.0, abs=1e-12)  # Δr < −τ: closed either way
        assert (gate[0] > 0.9) == want_open, (mode, dr, gate)


def test_baseline_proposer_rewards_on_the_scripted_episodes(run):
    """Dr. Zero's and Absolute Zero's own proposer rewards on step 1's generator episodes
    (grounded + c = K/2; no question; parsed without a lookup; no question; no question)."""
    config, services, controllers, steps = run
    ctl = _ctl(controllers)
    responses = [t.response for t in steps[1][0].groups[0].trajectories]
    k = K
    want = {
        # 0.5·(1 + think 1 + tool + ans 1)/4 + (K − c)/(K − 1), c = K/2; 0 without a parse
        "dr_zero": [0.5 + 2 / 3, 0.0, 0.5 * 0.75 + 2 / 3, 0.0, 0.0],
        # 1 − c/K on a valid task (no tool gate); −1 for a format error
        "absolute_zero": [0.5, -1.0, 0.5, -1.0, -1.0],
    }
    for name, rewards in want.items():
        other = AriseRLController(
            dataclasses.replace(ctl.cfg, proposer_reward=name, solver_policy="current"),
            fallback_tasks=ctl.fallback_tasks, tasks_per_step=2,
            generator_domain=ctl.generator_domain, style=ctl.style,
        )  # fmt: skip
        other.bind(services, None)
        scores = other.score_generator(responses)
        assert [sc.c for sc in scores] == [k // 2, None, k // 2, None, None]
        assert [sc.reward for sc in scores] == pytest.approx(rewards), name
    invalid = GeneratorScore(0.0, "unknown_head", True, None, "q", None)
    assert proposer_reward("absolute_zero", invalid, 8) == -0.5
    with pytest.raises(ValueError, match="unknown proposer reward"):
        proposer_reward("sec", invalid, 8)


def test_grouped_advantages_match_numpy():
    r = np.array([[1.0, 0.0, np.nan], [3.0, 1.0, 2.0], [0.5, 0.5, 0.5]])
    keys = [("generator", "a"), ("generator", "a"), ("solver", "b")]
    a = r[:2][~np.isnan(r[:2])]  # the key's pooled rollouts: 1, 0, 3, 1, 2
    hrpo = grouped_advantages(r, keys, "hrpo")
    np.testing.assert_allclose(hrpo[0, :2], (r[0, :2] - a.mean()) / (a.std() + 1e-6))
    np.testing.assert_allclose(hrpo[1], (r[1] - a.mean()) / (a.std() + 1e-6))
    assert hrpo[0, 2] == 0.0 and np.all(hrpo[2] == 0.0)  # NaN reward; a constant key
    trr = grouped_advantages(r, keys, "trr++")
    centred = np.array([1.0, 0.0, 3.0, 1.0, 2.0]) - a.mean()
    scale = np.concatenate([centred, np.zeros(3)]).std() + 1e-6
    np.testing.assert_allclose(trr[0, :2], centred[:2] / scale)
    np.testing.assert_allclose(trr[1], centred[2:] / scale)
    with pytest.raises(ValueError, match="mode must be"):
        grouped_advantages(r, keys, "grpo")


def test_hrpo_shapes_generator_groups_only(run):
    config, services, controllers, steps = run
    ctl = _ctl(controllers)
    rollouts = copy.deepcopy(steps[2][0])  # solver groups
    rollouts.groups[0].role = "generator"
    given = np.full((2, J), 7.0)
    for mode in ("hrpo", "trr++"):
        other = AriseRLController(
            dataclasses.replace(ctl.cfg, advantage_grouping=mode),
            fallback_tasks=ctl.fallback_tasks, tasks_per_step=2,
            generator_domain=ctl.generator_domain, style=ctl.style,
        )  # fmt: skip
        got = other.shape_advantages(rollouts, given)
        r = rollouts.signal(SIGNAL)
        keys = [(g.role, g.task.task_type) for g in rollouts.groups]
        want = grouped_advantages(r, keys, mode)
        np.testing.assert_allclose(got[0], want[0])
        np.testing.assert_allclose(got[1], 7.0 if mode == "hrpo" else want[1])
    assert (
        AriseRLController(
            ctl.cfg,
            fallback_tasks=ctl.fallback_tasks,
            generator_domain=ctl.generator_domain,
            style=ctl.style,
        ).shape_advantages(rollouts, given)
        is None
    )


def test_state_round_trip(run):
    config, _, controllers, _ = run
    ctl = _ctl(controllers)
    fresh = AriseRLController(
        ctl.cfg,
        fallback_tasks=ctl.fallback_tasks,
        generator_domain=ctl.generator_domain,
        forbidden=ctl.forbidden,
        tasks_per_step=2,
        style=ctl.style,
    )
    fresh.load_state_dict(ctl.state_dict())
    assert [t.id for t in fresh.pool] == [t.id for t in ctl.pool]
    assert fresh.pool[0] == ctl.pool[0] and fresh.pool_cycle == ctl.pool_cycle
    assert fresh.recent == ctl.recent and fresh.pool_stats == ctl.pool_stats


def test_held_policies_must_survive_a_resume(run, tmp_path):
    """A run resumed without its held policies (a checkpoint that lacks them) stops naming them
    instead of probing the wrong parameters; with a checkpoint's held policies it has them."""
    config, services, controllers, _ = run
    ctl = _ctl(controllers)
    other = Services(
        config, services.engine, services.tokenizer, services.judge_impl, services.domain,
        str(tmp_path), functools.partial(builders.prompt_buckets, config),
    )  # fmt: skip
    fresh = AriseRLController(
        ctl.cfg,
        fallback_tasks=ctl.fallback_tasks,
        generator_domain=ctl.generator_domain,
        tasks_per_step=2,
        style=ctl.style,
    )
    fresh.bind(other, None)
    other.begin_step(3)
    with pytest.raises(RuntimeError, match="frozen base policy"):
        fresh.sample_tasks(3, np.random.default_rng(0))
    # What a checkpoint keeps of the held policies brings them back (run_state save / restore).
    meta, params = services.sampler.held_state()
    assert meta["arise_rl_base"] == {"step": 1, "version": 0}
    other.sampler.load_held(meta, params)
    assert other.held_step("arise_rl_base") == 1
    assert other.sampler._held_snapshot("arise_rl_base") == "snapshot1"
    fresh.sample_tasks(3, np.random.default_rng(0))  # the base policy is held: no error


def test_external_teacher_modes(run):
    """OPCD / GKD (an external teacher): no memory rollouts and no gate (λ = λ0 on every group);
    OPCD's teacher sees the memory, GKD's the student's own prompt."""
    config, services, controllers, steps = run
    ctl = _ctl(controllers)
    for mode in ("opcd", "gkd"):
        rollouts = copy.deepcopy(steps[2][0])
        for g in rollouts.groups:
            for t in g.trajectories:
                t.teacher_prompt = None
        other = AriseRLController(
            dataclasses.replace(ctl.cfg, teacher=mode), fallback_tasks=ctl.fallback_tasks,
            tasks_per_step=2, generator_domain=ctl.generator_domain, style=ctl.style,
        )  # fmt: skip
        other.bind(services, None)
        before = len(services.engine.requests)
        m = other.run_rgsed(rollouts)
        assert len(services.engine.requests) == before  # nothing sampled
        assert m["rgsed/memory_frac"] == (1.0 if mode == "opcd" else 0.0)
        other.set_teachers(rollouts)
        np.testing.assert_array_equal(other.sd_gate(rollouts), [1.0, 1.0])
        for g in rollouts.groups:
            for t in g.trajectories:
                if mode == "gkd":
                    assert t.teacher_prompt == [dict(x) for x in g.messages]
                else:
                    assert "<coach> remember :" in t.teacher_prompt[0]["content"]
    opcd = arise_rl_config.get_config("smoke,opcd")
    with pytest.raises(ValueError, match="need an external teacher"):
        builders.build_controllers(opcd, builders.build_domain(opcd))
