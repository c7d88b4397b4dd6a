"""ARISE pool: scripted lifecycle transitions, rubric instantiation and skill injection, the ARISE
reward against a numpy reference, and a simulated run (pool evolves; resume is exact)."""

import dataclasses
import json

import numpy as np
import pytest

from rubric_rl.controllers.base import ControllerSet
from rubric_rl.controllers.sampling import UniformSampler
from rubric_rl.envs.constraint_lexicon import SKILL_TEXTS
from rubric_rl.envs.constraint_style import ConstraintStyle
from rubric_rl.envs.constraints import (
    ConstraintDomain,
    hard_constraints,
    render_response,
    verify,
)
from rubric_rl.methods.arise.arise import (
    ACTIVE,
    ADDED,
    HIDDEN,
    RETIRED,
    AriseConfig,
    AriseController,
    RubricSkillPool,
    arise_advantages,
)
from rubric_rl.methods.arise.capability_sampler import CapabilitySampler, CapabilitySamplerConfig
from rubric_rl.methods.arise.reflection import LLMReflection, ProgrammaticReflection, Proposal
from rubric_rl.rollout.batch import Rollouts
from rubric_rl.rubrics.judges import JudgeItem, ProgrammaticJudge
from rubric_rl.rubrics.llm import LocalEngineClient
from rubric_rl.rubrics.scores import pack_verdicts
from rubric_rl.rubrics.types import CriterionStatus, VerifierKind

# What the embedded constraint domain gives ARISE through the Domain contract.
EMBEDDED = {"task_verifier": verify, "style": ConstraintStyle()}

# --- lifecycle -----------------------------------------------------------------------------------

LIFECYCLE = AriseConfig(
    min_evals=1,
    activate_below=0.5,
    activate_window=2,
    refine_below=0.2,
    refine_window=3,
    max_refinements=1,
    hide_above=0.75,
    hide_window=2,
    retire_above=0.9,
    retire_window=3,
)


def Evidence(step, tasks, prompts, responses, verdicts, scores, rewards, advantages):  # noqa: N802
    """The step record controllers observe, built from plain data (``Rollouts.from_responses``)."""
    return Rollouts.from_responses(
        step, tasks, responses, verdicts or None, prompts=prompts or None, rewards=rewards,
        advantages=advantages,
    )  # fmt: skip


def _proposal(key="list/count", **kw):
    base = dict(
        key=key,
        text="lists n items",
        skill="count",
        capability="counting",
        task_types=("list",),
        source_id="count",
    )
    return Proposal(**{**base, **kw})


def _run_stream(pool, stream, refine=lambda e: f"{e.skill} v{e.skill_version + 1}"):
    """stream: step -> {entry id: passed (of 10)}; returns the events (add events dropped)."""
    pool.pop_events()
    for step, passes in enumerate(stream):
        for eid, passed in passes.items():
            pool.record(eid, passed, 10)
        pool.advance(step, refine)
    return [
        (ev["step"], ev["entry"], ev["event"], ev["from"], ev["to"]) for ev in pool.pop_events()
    ]


def test_scripted_stream_gives_exactly_the_documented_transitions():
    # retire_unlearnable=False: the pair stays after its last refinement (the old rule).
    pool = RubricSkillPool(dataclasses.replace(LIFECYCLE, retire_unlearnable=False))
    a = pool.add(_proposal(), step=0).id
    assert pool.events[0]["event"] == "add" and pool.events[0]["to"] == ADDED
    stream = [3, 4, 1, 1, 1, 1, 1, 1, 9, 9, 10, 10, 9, 0, 0]
    events = _run_stream(pool, [{a: x} for x in stream])
    assert events == [
        (1, a, "activate", ADDED, ACTIVE),  # (3 + 4) / 20 = 0.35 < 0.5 over 2 observations
        (4, a, "refine", ACTIVE, ACTIVE),  # 3 / 30 = 0.1 < 0.2 over 3 since activation
        # steps 5-7: 0.1 again, but max_refinements = 1 is reached: no further event
        (9, a, "hide", ACTIVE, HIDDEN),  # (9 + 9) / 20 = 0.9 ≥ 0.75 (step 8: (1 + 9)/20 = 0.5)
        (12, a, "retire", HIDDEN, RETIRED),  # 29 / 30 ≥ 0.9 over 3 since hiding
    ]  # steps 13-14: a retired entry records nothing
    e = pool.entries[a]
    assert (e.skill, e.skill_version, e.parent_id, e.refinements) == ("count v2", 2, f"{a}@s1", 1)
    assert e.obs == [] and pool.totals == {
        "added": 1,
        "retired": 1,
        "refined": 1,
        "retired_unlearnable": 0,
    }
    assert not pool.record(a, 0, 10)


def test_a_pair_still_failing_after_its_last_refinement_retires():
    pool = RubricSkillPool(LIFECYCLE)  # retire_unlearnable=True (the default)
    a = pool.add(_proposal(), step=0).id  # never improves
    b = pool.add(_proposal("list/b"), step=0).id  # improves after its rewrite: stays
    stream = [(3, 3), (4, 4), (1, 1), (1, 1), (1, 1), (1, 3), (1, 3), (1, 3), (0, 9), (0, 9)]
    events = _run_stream(pool, [{a: x, b: y} for x, y in stream])
    assert events == [
        (1, a, "activate", ADDED, ACTIVE),
        (1, b, "activate", ADDED, ACTIVE),
        (4, a, "refine", ACTIVE, ACTIVE),  # 3 / 30 = 0.1 < 0.2
        (4, b, "refine", ACTIVE, ACTIVE),
        # a: 3 / 30 again over the 3 observations since its last (max_refinements = 1) rewrite
        (7, a, "retire", ACTIVE, RETIRED),
        (9, b, "hide", ACTIVE, HIDDEN),  # b: 9 / 30 = 0.3 >= 0.2 at step 7, then 18 / 20
    ]
    assert pool.totals == {"added": 2, "retired": 1, "refined": 2, "retired_unlearnable": 1}
    # The event says why, and the checkpointed totals round-trip (old checkpoints lack the key).
    pool2 = RubricSkillPool(LIFECYCLE)
    c = pool2.add(_proposal(), step=0).id
    pool2.pop_events()
    for step, x in enumerate([3, 4, 1, 1, 1, 1, 1, 1]):
        pool2.record(c, x, 10)
        pool2.advance(step, lambda e: "rewritten")
    ev = pool2.pop_events()[-1]
    assert ev["event"] == "retire" and ev["evidence"]["reason"] == "unlearnable"
    assert ev["evidence"]["refinements"] == 1
    state = pool2.state_dict()
    del state["totals"]["retired_unlearnable"]
    pool2.load_state_dict(state)
    assert pool2.totals["retired_unlearnable"] == 0 and pool2.totals["retired"] == 1


def test_other_paths_and_threshold_boundaries():
    pool = RubricSkillPool(LIFECYCLE)
    m = pool.add(_proposal("list/a"), 0).id  # mastered before any skill: added -> retired
    b = pool.add(_proposal("list/b"), 0).id  # exactly at thresholds
    c = pool.add(_proposal("list/c"), 0).id  # hidden, then regresses: hidden -> active
    stream = [
        {m: 10, b: 5, c: 0},
        {m: 9, b: 5, c: 0},  # b: 10/20 = 0.5 is not < 0.5; c: 0 < 0.5 activates
        {m: 9, b: 5, c: 8},  # m: 28/30 ≥ 0.9 retires
        {b: 5, c: 7},  # c: 15/20 = 0.75 ≥ 0.75 hides
        {b: 5, c: 4},
        {b: 5, c: 4},  # c: 8/20 < 0.5 re-activates (before its retire window fills)
    ]
    events = _run_stream(pool, stream)
    assert events == [
        (1, c, "activate", ADDED, ACTIVE),
        (2, m, "retire", ADDED, RETIRED),
        (3, c, "hide", ACTIVE, HIDDEN),
        (5, c, "activate", HIDDEN, ACTIVE),
    ]
    assert pool.entries[b].state == ADDED and len(pool.entries[b].obs) == 6
    # Fewer than min_evals verdicts in a step: not an observation at all.
    strict = RubricSkillPool(dataclasses.replace(LIFECYCLE, min_evals=11))
    s = strict.add(_proposal(), 0).id
    assert _run_stream(strict, [{s: 0}] * 5) == [] and strict.entries[s].obs == []


def test_windows_slide_and_restart_at_each_transition():
    pool = RubricSkillPool(LIFECYCLE)
    a = pool.add(_proposal(), 0).id
    # Whole-history mean stays ≥ 0.5 (36/60 at step 5): only the last-2 window (0.2) activates.
    # After activation the window restarts: at step 6 the last 3 observations would be
    # (2, 2, 0) → 0.13 < 0.2, but only one was made with the skill shown; refine waits for 3.
    events = _run_stream(pool, [{a: x} for x in (8, 8, 8, 8, 2, 2, 0, 0, 0)])
    assert events == [(5, a, "activate", ADDED, ACTIVE), (8, a, "refine", ACTIVE, ACTIVE)]


def test_refine_without_a_rewrite_is_not_an_event_and_cap_and_keys_hold():
    cfg = dataclasses.replace(LIFECYCLE, pool_cap=2)
    pool = RubricSkillPool(cfg)
    a = pool.add(_proposal("k1"), 0).id
    pool.add(_proposal("k2"), 0)
    with pytest.raises(ValueError, match="full"):
        pool.add(_proposal("k3"), 0)
    events = _run_stream(pool, [{a: 0}] * 5, refine=lambda e: None)
    assert events == [(1, a, "activate", ADDED, ACTIVE)]  # refinement declined: no event
    assert pool.entries[a].skill_version == 1 and pool.entries[a].obs == []
    pool.entries[a].state = RETIRED
    assert "k1" in pool.excluded_keys()  # retired keys are not re-proposed by default
    with pytest.raises(ValueError, match="thresholds"):
        AriseConfig(hide_above=0.4, activate_below=0.5)


# --- instantiation and skill injection -----------------------------------------------------------


@pytest.fixture(scope="module")
def tasks():
    return ConstraintDomain(0).tasks("train", 24)


def _controller(tasks, config=None, sampler=None, reflection=None):
    config = config or AriseConfig()
    sampler = sampler or UniformSampler(tasks, 6, seed=0)
    reflection = reflection or ProgrammaticReflection(SKILL_TEXTS)
    return AriseController(tasks, sampler, reflection, config, **EMBEDDED)


def test_pool_rubric_and_skills_target_type_and_criterion(tasks):
    ctl = _controller(tasks)
    assert ctl.with_pool_rubric(tasks[0]).rubric.criteria == ()  # empty pool: task reward only
    e = ctl.pool.add(_proposal(skill=SKILL_TEXTS["counting"]), 0)
    has = [t for t in tasks if t.task_type == "list" and "count" in t.rubric.ids]
    other = [t for t in tasks if t.task_type != "list"]
    assert has and other
    crit = ctl.with_pool_rubric(has[0]).rubric.criteria[0]
    src = has[0].rubric.by_id("count")
    assert (crit.id, crit.text, crit.weight, crit.verifier) == (
        e.id,
        src.text,
        src.weight,
        src.verifier,
    )
    assert crit.status == CriterionStatus.ACTIVE and crit.origin == "arise" and crit.tags == ()
    assert ctl.with_pool_rubric(other[0]).rubric.criteria == ()
    prompts = [t.messages for t in (has[0], other[0])]
    # Added (dormant) skill: not injected.
    assert ctl.decorate([has[0], other[0]], prompts) == prompts
    e.state = ACTIVE
    out = ctl.decorate([has[0], other[0]], prompts)
    assert out[0][-1]["content"] == prompts[0][-1]["content"] + (
        " <skills> " + SKILL_TEXTS["counting"] + " </skills>"
    )
    assert out[1] == prompts[1]
    assert ControllerSet(ctl).decorate([has[0]], prompts[:1]) == out[:1]
    no_inject = _controller(tasks, AriseConfig(inject_skills=False))
    no_inject.pool.load_state_dict(ctl.pool.state_dict())
    assert no_inject.decorate([has[0]], prompts[:1]) == prompts[:1]
    e.state = HIDDEN
    assert ctl.with_pool_rubric(has[0]).rubric.criteria[0].status == CriterionStatus.HIDDEN
    assert ctl.with_pool_rubric(has[0]).rubric.evaluated().ids == (e.id,)  # still judged
    assert ctl.decorate([has[0]], prompts[:1]) == prompts[:1]
    e.state = RETIRED
    assert ctl.with_pool_rubric(has[0]).rubric.criteria == ()


class _PromptCap:
    """Services' prompt check (``encode_prompt``): ValueError past ``cap`` words in the prompt."""

    def __init__(self, cap):
        self.cap = cap

    def encode_prompt(self, messages, what="prompt", field="max_prompt_len"):
        n = sum(len(m["content"].split()) for m in messages)
        if n > self.cap:
            raise ValueError(f"{what}: {n} tokens > config.model.{field}={self.cap}")
        return tuple(range(n))


def test_skills_are_capped_then_dropped_from_the_end_until_the_prompt_fits(tasks):
    task = next(t for t in tasks if len({c.capability for c in t.rubric.criteria}) >= 3)
    crits = list({c.capability: c for c in task.rubric.criteria if c.capability}.values())[:3]
    skills = [f"skill number {i} for {c.capability}" for i, c in enumerate(crits)]

    def controller(config):
        ctl = _controller(tasks, config)
        for c, skill in zip(crits, skills, strict=True):
            key = f"{task.task_type}/{c.capability}/{c.id}"
            e = ctl.pool.add(
                _proposal(key, capability=c.capability, task_types=(task.task_type,),
                          source_id=c.id, skill=skill), 0)  # fmt: skip
            e.state = ACTIVE
        return ctl

    def shown(ctl):
        out = ctl.decorate([task], [task.messages])[0][-1]["content"]
        return [s for s in skills if s in out]

    assert shown(controller(AriseConfig())) == skills  # every active skill, pool order
    capped = controller(AriseConfig(max_skills=2))
    assert shown(capped) == skills[:2]
    words = sum(len(m["content"].split()) for m in task.messages)
    block = len(" <skills> </skills>".split()) + sum(len(s.split()) + 1 for s in skills) - 1
    ctl = controller(AriseConfig())
    ctl.services = _PromptCap(words + block - 1)  # one word short of all three
    assert shown(ctl) == skills[:2]
    ctl.services = _PromptCap(words)  # not even one fits: the prompt as it was
    assert ctl.decorate([task], [task.messages])[0] == task.messages
    m = ctl.observe(Evidence(1, [task], [task.messages], [["x"]], None, None, None, None))
    assert m["skills_dropped_length"] == 1 + 3 and m["skills_dropped_cap"] == 0
    m = ctl.observe(Evidence(2, [task], [task.messages], [["x"]], None, None, None, None))
    assert m["skills_dropped_length"] == 0  # reset each step
    capped.decorate([task], [task.messages])
    m = capped.observe(Evidence(1, [task], [task.messages], [["x"]], None, None, None, None))
    assert m["skills_dropped_cap"] == 2  # two decorate calls above, one skill over each
    with pytest.raises(ValueError, match="max_skills"):
        AriseConfig(max_skills=-1)


def test_bound_entry_targets_its_own_capability_cell(tasks):
    ctl = _controller(tasks)
    e = ctl.pool.add(
        _proposal("short_answer/counting/answer", task_types=("short_answer",), source_id="answer"),
        0,
    )
    caps = {t.rubric.by_id("answer").capability for t in tasks if t.task_type == "short_answer"}
    assert {"counting"} < caps  # the same criterion id carries several capabilities
    for t in tasks:
        crits = ctl.with_pool_rubric(t).rubric.criteria
        hit = t.task_type == "short_answer" and t.rubric.by_id("answer").capability == "counting"
        assert [c.id for c in crits] == ([e.id] if hit else [])


def test_library_entry_binds_to_the_criterion_read_from_each_prompt():
    """With the checker library as the bank, an entry for "case:upper" on lists is judged on the
    list tasks that ask for uppercase only, with that task's own checker; "distinct" (which no
    seed criterion states) on every list task; and the skill cites the task's criterion."""
    from rubric_rl.envs.constraint_library import library_criteria

    tasks = ConstraintDomain(0).tasks("train", 120)
    ctl = AriseController(
        tasks, UniformSampler(tasks, 6, seed=0), ProgrammaticReflection(SKILL_TEXTS),
        bank=library_criteria, **EMBEDDED,
    )  # fmt: skip
    upper = ctl.pool.add(
        _proposal("list/formatting/case:upper", source_id="case:upper", capability="formatting",
                  skill="check the case ; the last answers missed : {criterion}"),
        0,
    )  # fmt: skip
    distinct = ctl.pool.add(
        _proposal("list/lexical/distinct", source_id="distinct", capability="lexical"), 0
    )
    upper.state = ACTIVE
    lists = [t for t in tasks if t.task_type == "list"]
    asks_upper = [t for t in lists if "use uppercase" in t.question]
    assert asks_upper and len(asks_upper) < len(lists)
    for t in tasks:
        crits = {c.id: c for c in ctl.with_pool_rubric(t).rubric.criteria}
        want = ([upper.id] if t in asks_upper else []) + ([distinct.id] if t in lists else [])
        assert sorted(crits) == sorted(want), t.question
        if t in asks_upper:
            assert crits[upper.id].verifier.checker == "cf_case"
            assert crits[upper.id].verifier.kwargs == {"mode": "upper"}
            assert ctl.pool.skills_for(t) == [
                "check the case ; the last answers missed : every word is in uppercase"
            ]
        if t in lists:
            assert crits[distinct.id].verifier.checker == "cf_distinct"
            assert "distinct" not in t.rubric.ids  # the seed rubric does not state it
    # The seed-rubric bank (the ablation) finds neither on any task.
    seed = _controller(tasks)
    seed.pool.load_state_dict(ctl.pool.state_dict())
    assert all(not seed.with_pool_rubric(t).rubric.criteria for t in tasks)


def test_free_text_entry_is_llm_judged_and_capability_targeted(tasks):
    ctl = _controller(tasks)
    ctl.pool.add(
        _proposal(
            "llm/x", source_id=None, text="is concise", capability="ordering", task_types=("list",)
        ),
        0,
    )
    for t in tasks:
        crits = ctl.with_pool_rubric(t).rubric.criteria
        targeted = t.task_type == "list" and "ordering" in t.capabilities
        assert len(crits) == int(targeted)
        if crits:
            assert crits[0].verifier.kind == VerifierKind.LLM and crits[0].text == "is concise"


# --- reward --------------------------------------------------------------------------------------


def _np_norm(r, eps=1e-6, tol=1e-6):
    out = np.zeros_like(r)
    for g in range(r.shape[0]):
        ok = ~np.isnan(r[g])
        x = r[g, ok]
        if x.size < 2 or x.max() - x.min() < tol:
            continue
        out[g, ok] = (x - x.mean()) / (x.std(ddof=1) + eps)
    return out


def test_arise_reward_matches_numpy_reference():
    rng = np.random.default_rng(0)
    task = (rng.random((6, 5)) < 0.5).astype(float)
    task[0] = 1.0  # zero-variance task group
    task[1, 2] = np.nan  # verifier failure
    rubric = rng.random((6, 5))
    rubric[2] = np.nan  # no pool criterion on this task
    rubric[3, :4] = np.nan  # a single defined rubric reward: no contrast
    adv, zv = arise_advantages(task, rubric, w_rubric=0.7)
    np.testing.assert_allclose(adv, _np_norm(task) + 0.7 * _np_norm(rubric), atol=1e-5)
    assert zv["task"][0] and zv["rubric"][2] and zv["rubric"][3] and not zv["rubric"][4]
    # Empty pool (no rubric reward anywhere): the task term alone.
    for empty in (None, np.full(task.shape, np.nan)):
        adv, zv = arise_advantages(task, empty, w_rubric=0.7)
        np.testing.assert_allclose(adv, _np_norm(task), atol=1e-5)
        assert set(zv) == {"task"}


# --- simulated run -------------------------------------------------------------------------------


def _simulate(ctl, steps, *, start=0, J=4, seed=0):
    """A synthetic policy on the constraint domain: each stated constraint is kept with a
    probability that grows with the step, and with the skill of its capability in the prompt."""
    judge = ProgrammaticJudge()
    log = []
    for step in range(start, start + steps):
        batch = ctl.sample_tasks(step, np.random.default_rng([seed, step]))
        prompts = ctl.decorate(batch.tasks, [t.messages for t in batch.tasks])
        rng = np.random.default_rng([seed, 99, step])
        responses = []
        for task, prompt in zip(batch.tasks, prompts):
            group = []
            for _ in range(J):
                keep = set()
                for c in hard_constraints(ctl.base_task(task)):
                    p = (
                        0.35
                        + 0.04 * step
                        + (0.3 if SKILL_TEXTS[c.capability] in prompt[-1]["content"] else 0.0)
                    )
                    if c.capability == "counting":
                        p -= 0.25  # a persistent gap
                    if rng.random() < p:
                        keep.add(c.kind)
                group.append(render_response(ctl.base_task(task), keep, rng))
            responses.append(tuple(group))
        items = [JudgeItem(t, r) for t, g in zip(batch.tasks, responses) for r in g]
        flat = judge.score(items)
        verdicts = tuple(tuple(tuple(flat[g * J + j]) for j in range(J)) for g in range(len(batch)))
        scores = pack_verdicts(
            [[{v.criterion_id: v for v in vs} for vs in group] for group in verdicts],
            [t.rubric.evaluated() for t in batch.tasks],
        )
        rewards = ctl.arise_signals(batch.tasks, responses, scores)
        adv = arise_advantages(rewards["task"], rewards["rubric"], w_rubric=ctl.config.w_rubric)[0]
        ev = Evidence(
            step,
            batch.tasks,
            tuple(prompts),
            tuple(responses),
            verdicts,
            scores,
            rewards["task"],
            adv,
        )
        metrics = ctl.observe(ev)
        log.append(
            (
                [t.id for t in batch.tasks],
                batch.weights.tolist(),
                metrics,
                ctl.pop_events(),
                adv.tolist(),
            )
        )
    return log


def _arise(tasks):
    cfg = AriseConfig(
        pool_cap=6,
        max_add_per_reflection=2,
        reflection_window_steps=3,
        min_reflection_rollouts=24,
        min_evals=4,
        activate_window=1,
        hide_window=2,
        refine_window=2,
        retire_window=2,
    )
    sampler = CapabilitySampler(tasks, CapabilitySamplerConfig(batch_size=8, decay=0.9))
    return _controller(tasks, cfg, sampler, ProgrammaticReflection(min_support=8))


def test_simulated_run_evolves_the_pool_and_resume_is_exact(tasks):
    full = _simulate(_arise(tasks), 12)
    events = [ev for step in full for ev in step[3]]
    kinds = {ev["event"] for ev in events}
    assert {"add", "activate", "hide"} <= kinds, kinds
    assert all(set(ev) == {"step", "entry", "event", "from", "to", "evidence"} for ev in events)
    json.dumps(events)  # JSON-able for controllers/arise.jsonl
    # The pool starts empty: step 0 is judged on no rubric and trains on the task reward alone.
    assert "rubric/pass_rate" not in full[0][2] and "rubric/pass_rate" in full[-1][2]
    # Metrics: finite numbers, the all-failure group rate matches the step's verdicts.
    assert all(np.isfinite(v) for step in full for v in step[2].values())
    assert all(0.0 <= step[2]["task/all_fail_groups"] <= 1.0 for step in full)
    assert any(k.startswith("rubric/arise-") for k in full[-1][2])
    adds = [ev for ev in events if ev["event"] == "add"]
    # The default ranking proposes only criteria that vary inside failing groups.
    assert adds and all(ev["evidence"]["rank"] == "progress_mass" for ev in adds)
    assert all(ev["evidence"]["fail_group_variance"] > 0 for ev in adds)
    assert full[-1][2]["pool/added_total"] == len(adds) <= 6 + full[-1][2]["pool/retired_total"]
    # Resume: state after 5 steps, through JSON, into a fresh controller = uninterrupted run.
    part = _arise(tasks)
    _simulate(part, 5)
    state = json.loads(json.dumps(part.state_dict()))
    resumed = _arise(tasks)
    resumed.load_state_dict(state)
    assert _simulate(resumed, 7, start=5) == full[5:]


def test_retirement_drops_the_rubric_evidence_from_the_sampler(tasks):
    ctl = _arise(tasks)
    _simulate(ctl, 4)
    held = [e for e in ctl.pool.live() if e.id in ctl.sampler.evidence]
    assert len(held) >= 2
    gone, kept = held[0], held[1:]
    reference = CapabilitySampler(tasks, ctl.sampler.config)
    reference.load_state_dict(ctl.sampler.state_dict())
    reference.forget([gone.id])
    gone.state, gone.obs = HIDDEN, [[10.0, 10.0]] * ctl.config.retire_window
    ctl._evolve(4)
    assert ("retire", gone.id) in [(ev["event"], ev["entry"]) for ev in ctl.pop_events()]
    assert gone.id not in ctl.sampler.evidence
    assert all(e.id in ctl.sampler.evidence for e in kept)  # unchanged rubrics keep evidence
    assert ctl.sampler.estimates() == reference.estimates()


def test_events_are_written_as_jsonl(tasks, tmp_path):
    ctl = _controller(tasks)
    ctl.pool.add(_proposal(), 3)
    path = tmp_path / "controllers" / "arise.jsonl"
    assert ctl.write_events(path) == 1 and ctl.write_events(path) == 0
    ctl.pool.add(_proposal("k2"), 4)
    ctl.write_events(path)
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    assert [(e["step"], e["event"], e["to"]) for e in lines] == [
        (3, "add", ADDED),
        (4, "add", ADDED),
    ]


def test_frozen_pool_never_changes_and_llm_pairs_join_the_pool(tasks):
    source = _arise(tasks)
    _simulate(source, 6)
    frozen = _controller(tasks, AriseConfig(evolve=False), reflection=None)
    frozen.load_pool(source.pool.state_dict())
    before = frozen.pool.state_dict()
    log = _simulate(frozen, 3)
    assert frozen.pool.state_dict() == before and all(not s[3] for s in log)
    # The whole lifecycle pool (the default): a pair the source run retired is judged again,
    # hidden (no skill shown); "final" installs the pool as it stood.
    state = source.pool.state_dict()
    gone = state["entries"][0]
    state["entries"][0] = {**gone, "state": RETIRED}
    whole = _controller(tasks, AriseConfig(evolve=False), reflection=None)
    whole.load_pool(state)
    final = _controller(tasks, AriseConfig(evolve=False), reflection=None)
    final.load_pool(state, "final")
    assert whole.pool.entries[gone["id"]].state == HIDDEN
    assert final.pool.entries[gone["id"]].state == RETIRED
    assert len(whole.pool.live()) == len(final.pool.live()) + 1
    others = [e for e in state["entries"][1:]]
    assert [whole.pool.entries[e["id"]].state for e in others] == [e["state"] for e in others]
    with pytest.raises(ValueError, match="entries must be one of"):
        whole.load_pool(state, "all")
    # LLM reflection: a valid reply adds free-text pairs; an invalid one adds nothing.
    reply = json.dumps(
        {
            "pairs": [
                {
                    "rubric": "is concise",
                    "skill": "be brief",
                    "capability": "counting",
                    "task_types": ["list"],
                }
            ]
        }
    )
    replies = ["{bad", reply]
    refl = LLMReflection(LocalEngineClient(lambda m, p: replies.pop(0)))
    cfg = AriseConfig(min_reflection_rollouts=4, max_add_per_reflection=1, reflect_every=1)
    ctl = _controller(tasks, cfg, reflection=refl)
    _simulate(ctl, 1)
    assert ctl.pool.entries == {} and refl.counts["rejected"] == 1
    log = _simulate(ctl, 1, start=1)
    assert [e.text for e in ctl.pool.live()] == ["is concise"]
    assert log[0][3][0]["event"] == "add"


def test_task_metrics_with_a_custom_verifier(tasks):
    generic = [dataclasses.replace(t, domain="other", raw=None) for t in tasks[:2]]
    with pytest.raises(ValueError, match="the task verifier .* is required"):
        AriseController(
            generic, UniformSampler(generic, 2), None, AriseConfig(evolve=False), task_verifier=None
        )
    ctl = AriseController(
        generic,
        UniformSampler(generic, 2),
        None,
        AriseConfig(evolve=False),
        task_verifier=lambda t, r: None if r == "?" else r == "ok",
    )
    batch = ctl.sample_tasks(0, None)
    responses = (("ok", "no", "?"), ("no", "no", "?"))
    scores = pack_verdicts([[{}] * 3] * 2, [(), ()])
    np.testing.assert_array_equal(
        ctl.task_rewards(batch.tasks, responses), [[1, 0, np.nan], [0, 0, np.nan]]
    )
    ev = Evidence(0, batch.tasks, (), responses, (((),) * 3,) * 2, scores, np.zeros((2, 3)), None)
    m = ctl.observe(ev)
    assert m["task/pass_rate"] == 0.25 and m["task/all_fail_groups"] == 0.5
    assert "rubric/pass_rate" not in m and m["pool/live"] == 0.0


def test_factory_builds_the_configured_parts(tasks):
    from rubric_rl.methods.arise.arise import make_arise_controller

    ctl = make_arise_controller(
        tasks, 4, seed=2, sampler_options={"discovery_share": 0.5}, pool_cap=3, **EMBEDDED
    )
    assert isinstance(ctl.sampler, CapabilitySampler) and ctl.sampler.config.discovery_share == 0.5
    assert isinstance(ctl.reflection, ProgrammaticReflection) and ctl.config.pool_cap == 3
    ablation = make_arise_controller(tasks, 4, sampler="uniform", evolve=False, **EMBEDDED)
    assert isinstance(ablation.sampler, UniformSampler) and ablation.reflection is None
    with pytest.raises(ValueError, match="llm_client"):
        make_arise_controller(tasks, 4, reflection="llm", **EMBEDDED)
    assert len(ctl.sample_tasks(0, np.random.default_rng(0))) == 4
