"""The RISED controller (rubric_rl/methods/rised/rised.py): per-rollout teacher contexts (top-n of
the rollout ∪ top-n of its group, exactly no teacher without a positive rubric), anti-pattern
injection and withdrawal per environment, selection through the step's select hook with
per-environment quotas, the embedded descriptions in the policy's own words, the config's arms,
and the scripted-policy check of the RISED pipeline."""

from __future__ import annotations

import dataclasses
import json
from types import SimpleNamespace

import numpy as np
import pytest

from configs import rised as rised_config
from rubric_rl.checks.controller_check import ScriptedPolicy, scripted_run
from rubric_rl.envs.base import GENERIC_STYLE
from rubric_rl.envs.constraint_domain import task_bank
from rubric_rl.envs.constraint_style import ConstraintStyle, embedded_description
from rubric_rl.methods.rised import rised_selection as sel
from rubric_rl.methods.rised.rised import (
    ABSENT_MEANS,
    RisedConfig,
    RisedController,
)
from rubric_rl.methods.rised.rised_tags import Tags, group_profile
from rubric_rl.rollout.batch import Group, Rollouts, Trajectory
from rubric_rl.rubrics.types import Message, Rubric, Task
from rubric_rl.rubrics.vocabulary import RubricEntry, Vocabulary

VOCAB = Vocabulary(
    (
        RubricEntry("p_a", "s1", "positive", "do a"),
        RubricEntry("p_b", "s1", "positive", "do b"),
        RubricEntry("p_c", "s2", "positive", "do c"),
        RubricEntry("p_d", "s2", "positive", "do d"),
        RubricEntry("n_x", "s1", "negative", "doing x"),
        RubricEntry("n_y", "s2", "negative", "doing y"),
        RubricEntry("solved", "outcome", "positive", "solve it"),
        RubricEntry("failed", "outcome", "negative", "fail it"),
    )
)


class ScriptedTagger:
    """Returns the tags written in each response (JSON counts; "FAIL" = a failed tagging): the
    controller's logic is what is under test here, the taggers have their own tests."""

    def tag_batch(self, tasks, responses, rewards=None, *, step=None):
        out = []
        for r in responses:
            out.append(Tags.failure("scripted") if r == "FAIL" else Tags(json.loads(r)))
        return out


def task(i: int, env: str) -> Task:
    return Task(
        id=f"t{i}", prompt=(Message("user", f"question {i}"),), rubric=Rubric(()),
        domain="test", task_type=env, env_name=env,
    )  # fmt: skip


def rollouts(step: int, spec, rewards=None) -> Rollouts:
    """spec: [(task, [counts or "FAIL", ...]), ...]"""
    groups = []
    for gi, (t, tags) in enumerate(spec):
        trajs = []
        for j, c in enumerate(tags):
            resp = c if c == "FAIL" else json.dumps(c)
            rw = 0.0 if rewards is None else rewards[gi][j]
            trajs.append(Trajectory((1,), (-0.1,), "stop", 0, resp, reward=rw))
        groups.append(Group(t, trajectories=trajs))
    return Rollouts(step, groups)


def controller(**kw) -> RisedController:
    cfg = RisedConfig(**{"k": 0, "selection": "none", "retag_every": 0, **kw})
    return RisedController(cfg, VOCAB, ScriptedTagger())


def test_teacher_context_is_the_rollouts_top_n_with_its_groups_and_none_without_positives():
    # The count ranking (hint_rank="count", the previous one): count, ties by vocabulary order.
    ctl = controller(top_n=2, hint_rank="count")
    t0, t1 = task(0, "e1"), task(1, "e1")
    r = rollouts(1, [
        # group 0: counts per rollout
        (t0, [{"p_a": 1, "p_b": 3, "n_x": 5}, {"p_c": 1}, {"n_x": 2}, "FAIL"]),
        # group 1: no positive rubric anywhere
        (t1, [{"n_x": 1}, {"n_y": 2, "failed": 1}]),
    ])  # fmt: skip
    ctl.observe(r)
    ctx = ctl.teacher_contexts(r)
    # group 0's profile: p_b 3, p_a 1, p_c 1 -> top-2 = [p_b, p_a] (p_a before p_c: vocab order)
    want = [["do b", "do a"], ["do c", "do b", "do a"], ["do b", "do a"], ["do b", "do a"]]
    for prompt, pos in zip(ctx[0], want, strict=True):
        assert prompt[-1]["content"] == GENERIC_STYLE.show_and_avoid(t0, pos, ())[-1]["content"]
    # No positive rubric in the rollout nor its group: no teacher, so the SD term is exactly 0.
    assert ctx[1] == [None, None]
    # An unselected group is not trained: no teacher prompt.
    r.groups[0].selected = False
    assert ctl.teacher_contexts(r)[0] == [None] * 4


def test_all_rubric_teacher_shows_negatives_and_never_outcome_rubrics():
    ctl = controller(top_n=2, teacher="all")
    t0 = task(0, "e1")
    r = rollouts(1, [(t0, [{"n_x": 5, "p_a": 1, "solved": 9}, {"failed": 4}])])
    ctl.observe(r)
    first, second = ctl.teacher_contexts(r)[0]
    # top-2 of any polarity without the outcome skill: n_x (5), p_a (1); the group's the same
    assert (
        first[-1]["content"]
        == GENERIC_STYLE.show_and_avoid(t0, ["do a"], ["doing x"])[-1]["content"]
    )
    assert second == first  # the second rollout has only an outcome tag: the group's top-2


def test_teacher_mode_none_gives_no_teacher():
    ctl = controller(teacher="none")
    r = rollouts(1, [(task(0, "e"), [{"p_a": 1}])])
    ctl.observe(r)
    assert ctl.teacher_contexts(r) == [[None]]


def test_anti_patterns_are_injected_per_environment_then_withdrawn():
    # Raw counts (profile_counts="raw", the previous trigger; presence counts: below).
    ctl = controller(anti_top=1, profile_counts="raw")
    a, b = task(0, "ea"), task(1, "eb")
    # ea: negatives 3 (n_y 2, n_x 1) > positives 1 -> its top negative n_y next step;
    # eb: positives 2 = negatives 2 -> nothing. Outcome tags are not counted.
    ctl.observe(rollouts(1, [
        (a, [{"n_y": 2, "p_a": 1, "solved": 5}, {"n_x": 1}]),
        (b, [{"p_a": 2, "failed": 9}, {"n_x": 2}]),
    ]))  # fmt: skip
    assert ctl.anti == {"ea": ["n_y"]}
    out = ctl.decorate([a, b], [a.messages, b.messages])
    assert out[0] == GENERIC_STYLE.show_and_avoid(a, (), ["doing y"])
    assert out[1] == b.messages
    # The teacher keeps the student's anti-patterns and adds its positives.
    r = rollouts(2, [(a, [{"p_c": 1}])])
    r.groups[0].prompt = out[0]
    ctl.observe(r)
    (prompt,) = ctl.teacher_contexts(r)[0]
    assert prompt == GENERIC_STYLE.show_and_avoid(a, ["do c"], ["doing y"])
    # Re-decided every step: ea now shows more positives than negatives -> withdrawn.
    assert ctl.anti == {}
    assert ctl.decorate([a], [a.messages]) == [a.messages]
    # Off by config: never injected.
    off = controller(anti_patterns=False)
    off.observe(rollouts(1, [(a, [{"n_y": 5}])]))
    assert off.anti == {} and off.decorate([a], [a.messages]) == [a.messages]


def test_profile_selection_keeps_k_with_quotas_and_the_greedy_order():
    ctl = controller(selection="profile", k=2)
    spec = [
        (task(0, "e1"), [{"p_a": 2}, {"p_b": 1}]),
        (task(1, "e1"), [{"n_x": 3}]),
        (task(2, "e2"), [{"p_a": 1, "n_x": 1}]),
        (task(3, "e2"), [{"p_c": 4}]),
    ]
    r = rollouts(3, spec)
    m = ctl.observe(r)
    keep = ctl.select(r)
    prof = np.stack([group_profile(ctl._tags[i], VOCAB) for i in range(4)])
    want = sel.select_groups(prof, ["e1", "e1", "e2", "e2"], {"e1": 1, "e2": 1})
    assert keep.tolist() == [i in want for i in range(4)] and keep.sum() == 2
    assert "select/candidates/zero_variance_frac" in m
    # select on rollouts observe did not see is refused
    with pytest.raises(ValueError, match="observe did not see"):
        ctl.select(rollouts(4, spec))
    with pytest.raises(ValueError, match="train_groups"):
        RisedConfig(k=0, selection="profile")


def test_variance_selectors_keep_the_highest_variance_groups():
    ctl = controller(selection="top_variance", k=2)
    spec = [(task(i, "e1" if i < 2 else "e2"), [{"p_a": 1}] * 2) for i in range(4)]
    r = rollouts(1, spec, rewards=[[0, 1], [0, 0], [1, 1], [1, 0]])
    ctl.observe(r)
    assert ctl.select(r).tolist() == [True, False, False, True]


def test_embedded_descriptions_use_the_domains_words_and_the_tasks_values():
    from rubric_rl.envs.constraint_behaviours import constraint_behaviours
    from rubric_rl.envs.constraint_lexicon import domain_vocabulary
    from rubric_rl.methods.rised.rised_tagger import warmup_vocabulary

    vocab = warmup_vocabulary(constraint_behaviours())
    words = set(domain_vocabulary())
    lst = next(t for t in task_bank("train", 50) if t.task_type == "list")
    for rid in vocab.ids:
        text = embedded_description(rid, lst)
        if text is None:  # a stated check this list task does not have
            assert rid.endswith(("_followed", "_violated"))
            continue
        assert set(text.split()) <= words, (rid, text)
    n = dict(next(c for c in lst.rubric.criteria if c.verifier.checker == "cf_item_count")
             .verifier.args)["n"]  # fmt: skip
    assert embedded_description("count_followed", lst) == f"the response lists exactly {n} items"
    assert embedded_description("count_violated", lst).startswith("breaking the rule : ")
    with pytest.raises(ValueError, match="not a rubric"):
        embedded_description("nonsense", lst)
    # The embedded renderer writes the corpus's blocks, in its order.
    p = ConstraintStyle().show_and_avoid(lst, ["a b"], ["c"])[-1]["content"]
    assert p.endswith("<criterion> a b </criterion> <anti_patterns> c </anti_patterns>")


@pytest.mark.parametrize(
    "edit, match",
    [
        (lambda r: r.pop("tagger"), r"config\.rised: missing field\(s\) \['tagger'\]"),
        (lambda r: r.update(k=3), r"config\.rised: unknown field\(s\) \['k'\]"),
        (lambda r: r.update(top_n="3"), r"config\.rised\.top_n must be of type int"),
        (lambda r: r.update(beta=True), r"config\.rised\.beta must be of type float"),
        (lambda r: r["llm"].update(model=7), r"config\.rised\.llm\.model must be of type str"),
    ],
)
def test_section_field_errors_name_the_field(edit, match):
    c = rised_config.get_config().to_dict()
    edit(c["rised"])
    cfg = {**c, "rollout": SimpleNamespace(**c["rollout"]), "train": SimpleNamespace(**c["train"])}
    with pytest.raises(ValueError, match=match):
        RisedConfig.from_config(SimpleNamespace(get=cfg.get, **cfg))


def test_an_absent_key_of_an_archived_config_means_the_old_behaviour():
    c = rised_config.get_config().to_dict()
    for key in ABSENT_MEANS:
        c["rised"].pop(key)
    cfg = {**c, "rollout": SimpleNamespace(**c["rollout"]), "train": SimpleNamespace(**c["train"])}
    got = RisedConfig.from_config(SimpleNamespace(get=cfg.get, **cfg))
    assert {key: getattr(got, key) for key in ABSENT_MEANS} == ABSENT_MEANS
    assert got.k == c["rollout"]["train_groups"] and got.seed == c["train"]["seed"]


def test_config_arms():
    base = rised_config.get_config()
    assert (base.rollout.tasks_per_step, base.rollout.train_groups) == (32, 16)
    assert base.loss.reward == "task_verifier" and base.loss.sd_estimator != "none"
    k = rised_config.get_config("grpo_k")
    assert (k.rollout.tasks_per_step, k.rollout.train_groups, k.loss.sd_coef) == (16, 0, 0.0)
    assert rised_config.get_config("grpo_2k").rollout.tasks_per_step == 32
    tv = rised_config.get_config("top_var")
    assert tv.rised.selection == "top_variance" and tv.rollout.train_groups == 16
    ars = rised_config.get_config("all_rubric_sd")
    r = ars.rised
    assert (r.selection, r.teacher, r.anti_patterns) == ("none", "all", False)
    assert rised_config.get_config("no_sd").loss.sd_estimator == "none"
    assert not rised_config.get_config("positive_only").rised.anti_patterns
    assert rised_config.get_config("hard").domain.hard_min_constraints == 5
    with pytest.raises(ValueError, match="one baseline or ablation"):
        rised_config.get_config("grpo_k,no_sd")
    with pytest.raises(ValueError, match="unknown variant"):
        rised_config.get_config("nope")


def _small(arg="smoke"):
    c = rised_config.get_config(arg)
    c.unlock()
    c.rollout.update(tasks_per_step=16, train_groups=8, samples_per_task=8)
    c.domain.update(n_train=256, hard_min_constraints=5)
    c.lock()
    return c


def test_scripted_policy_check_of_the_rised_pipeline(tmp_path):
    """The real sampler, tagger, selection, anti-patterns and teacher stage on a scripted policy:
    every step trains exactly k groups within the per-environment quotas, anti-patterns reach
    only their environments' prompts, and the teacher prompts are the student's plus a block."""
    run = scripted_run(_small(), ScriptedPolicy(seed=0), str(tmp_path))
    ctl = next(c for c in run.controllers.controllers if isinstance(c, RisedController))
    seen_anti = 0
    for s in range(1, 5):
        anti_before = {e: list(v) for e, v in ctl.anti.items()}
        r, ctx = run.step(s)
        envs = [g.task.env_name for g in r.groups]
        assert sorted(set(envs)) == ["format", "hard", "list", "rewrite", "short_answer"]
        quotas = sel.env_quotas(sorted(set(envs)), 8, {e: envs.count(e) for e in set(envs)})
        kept = [g.task.env_name for g in r.groups if g.selected]
        assert len(kept) == 8 and {e: kept.count(e) for e in quotas} == quotas
        for g in r.groups:
            carries = "<anti_patterns>" in g.messages[-1]["content"]
            assert carries == bool(anti_before.get(g.task.env_name))
            seen_anti += carries
            for t in g.trajectories:
                assert set(t.info["rised_tags"]) == {"counts", "discovered", "withheld", "failed"}
                if t.teacher_prompt is not None:
                    assert g.selected and "<criterion>" in t.teacher_prompt[-1]["content"]
                    assert t.teacher_prompt[:-1] == g.messages[:-1]
        assert ctx.metrics["select/kept_frac"] == 0.5
        assert 0 < ctx.metrics["sd/context_frac"] <= 0.5
    assert seen_anti > 0
    # Deterministic: a second run of the same steps gives the same state.
    again = scripted_run(_small(), ScriptedPolicy(seed=0), str(tmp_path / "again"))
    for s in range(1, 5):
        again.step(s)
    a = json.dumps(run.controllers.state_dict(), sort_keys=True)
    assert a == json.dumps(again.controllers.state_dict(), sort_keys=True)
    rows = [json.loads(x) for x in open(tmp_path / "controllers" / "rised" / "behaviours.jsonl")]
    assert {r["step"] for r in rows} == {1, 2, 3, 4}
    assert all(0 <= f <= 1 for r in rows for f in r["freq"].values())


def test_resume_restores_the_anti_patterns(tmp_path):
    run = scripted_run(_small(), ScriptedPolicy(seed=0), str(tmp_path / "a"))
    for s in range(1, 3):
        run.step(s)
    state = json.loads(json.dumps(run.controllers.state_dict()))
    fresh = scripted_run(_small(), ScriptedPolicy(seed=0), str(tmp_path / "b"))
    fresh.controllers.load_state_dict(state)
    ra, _ = run.step(3)
    rb, _ = fresh.step(3)
    assert [g.messages for g in ra.groups] == [g.messages for g in rb.groups]
    assert [g.selected for g in ra.groups] == [g.selected for g in rb.groups]


def test_a_domain_without_a_vocabulary_or_programmatic_tagger_is_refused(tmp_path):
    from rubric_rl.config import builders

    c = rised_config.get_config("smoke")
    built = builders.build_domain(c)
    dom = dataclasses.replace(built, name="dataset", behaviours=None)
    with pytest.raises(ValueError, match="config.rised.vocabulary"):
        builders.build_controllers(c, dom)
    # A vocabulary file, but no behaviours to tag by code: the LLM tagger is the way.
    from rubric_rl.methods.rised.rised_tagger import warmup_vocabulary

    path = str(tmp_path / "vocab.json")
    warmup_vocabulary(built.behaviours, 0, 8).save(path)
    c.rised.vocabulary = path
    with pytest.raises(ValueError, match="tagger='programmatic'.*lacks"):
        builders.build_controllers(c, dom)


class FlakyTagger(ScriptedTagger):
    """A second tagging (the reliability probe) drops the first tag of every other rollout."""

    def __init__(self):
        self.probes = []

    def retag_batch(self, tasks, responses, rewards=None, *, seed=0):
        self.probes.append((len(responses), seed))
        out = self.tag_batch(tasks, responses, rewards)
        return [
            Tags(dict(list(t.counts.items())[1:])) if i % 2 == 0 and not t.failed else t
            for i, t in enumerate(out)
        ]


def test_reliability_probe_every_n_steps():
    """Every ``retag_every`` steps ``retag_samples`` rollouts (evenly spaced) are tagged again
    and compared (seed C.2: identical sets, Jaccard, profile cosine); other steps: no probe."""
    ctl = RisedController(
        RisedConfig(k=0, selection="none", retag_every=2, retag_samples=2), VOCAB, FlakyTagger()
    )
    two = {"p_a": 1, "n_x": 1}
    spec = [(task(0, "e1"), [two, two, two]), (task(1, "e2"), [{"p_a": 1}, "FAIL", two])]
    assert not any(k.startswith("tag/reliability") for k in ctl.observe(rollouts(1, spec)))
    m = ctl.observe(rollouts(2, spec))
    # rollouts 0 and 5 (evenly spaced of 6); the probe drops rollout 0's first tag only
    assert ctl.tagger.probes == [(2, 1_000_005)]
    assert m["tag/reliability/compared"] == 2.0
    assert m["tag/reliability/identical"] == 0.5
    assert m["tag/reliability/jaccard_mean"] == pytest.approx((0.5 + 1.0) / 2)
    assert m["tag/reliability/cosine_mean"] == pytest.approx((np.sqrt(0.5) + 1.0) / 2)
