"""ARISE reflection: the programmatic miner's ranking, refinement, and the LLM reflection's strict
validation (valid / invalid / duplicate replies through a LocalEngineClient)."""

import json

import numpy as np
import pytest

import rubric_rl.envs.constraint_checkers  # noqa: F401  (registers the cf_* checkers)
from rubric_rl.envs.constraint_lexicon import SKILL_TEXTS
from rubric_rl.methods.arise.arise import PoolEntry
from rubric_rl.methods.arise.reflection import (
    CRITERION_SLOT,
    LLMReflection,
    ProgrammaticReflection,
    RolloutRecord,
    fill_skill,
    parse_proposals,
)
from rubric_rl.rubrics.llm import LocalEngineClient
from rubric_rl.rubrics.types import Criterion, Rubric, Task, Verifier

WORDS = {"sep": "apple", "noise": "pear", "common": "plum", "nocap": "fig", "pit": "lime"}


def _task(tid="t0", ttype="list"):
    crits = (
        Criterion(
            "sep",
            "includes apple",
            2.0,
            capability="lexical",
            verifier=Verifier.rule("cf_includes_word", word="apple"),
        ),
        Criterion(
            "noise",
            "includes pear",
            1.0,
            capability="counting",
            verifier=Verifier.rule("cf_includes_word", word="pear"),
        ),
        Criterion(
            "common",
            "includes plum",
            1.0,
            capability="formatting",
            verifier=Verifier.rule("cf_includes_word", word="plum"),
        ),
        # no capability: nothing to target, never a candidate however well it separates
        Criterion(
            "nocap", "includes fig", 1.0, verifier=Verifier.rule("cf_includes_word", word="fig")
        ),
        # capability the task does not declare
        Criterion(
            "pit",
            "uses lime",
            -1.0,
            capability="verification",
            verifier=Verifier.rule("cf_includes_word", word="lime"),
        ),
    )
    return Task(
        id=tid,
        prompt=({"role": "user", "content": "q"},),
        rubric=Rubric(crits),
        task_type=ttype,
        capabilities=("lexical", "counting", "formatting"),
    )


def _records(n=40, seed=0, task=None):
    """Success iff even index. 'sep' is met in every success and in 1 of 5 failures; 'noise' is a
    coin flip; 'common' is met in 90 % of everything; 'nocap' tracks success exactly."""
    rng = np.random.default_rng(seed)
    task = task or _task()
    out = []
    for i in range(n):
        ok = i % 2 == 0
        words = []
        if ok or i % 10 == 1:
            words.append("apple")
        if rng.random() < 0.5:
            words.append("pear")
        if rng.random() < 0.9:
            words.append("plum")
        if ok:
            words.append("fig")
        out.append(RolloutRecord(0, task, " ".join(words + ["kiwi"]) + " .", ok, {}))
    return out


def _counts(records, word):
    succ = [r for r in records if r.success]
    fail = [r for r in records if not r.success]
    has = lambda r: word in r.response.split()  # noqa: E731
    return len(succ), len(fail), sum(map(has, succ)), sum(map(has, fail))


def test_programmatic_proposes_the_separating_criterion_first():
    recs = _records()
    refl = ProgrammaticReflection(
        SKILL_TEXTS, min_support=8, min_failures=4, min_separation=0.1, rank="separation"
    )
    ranked = refl.rank(recs)
    assert ranked[0].key == "list/lexical/sep"
    # Separation = Laplace-smoothed P(sat | success) − P(sat | failure), by hand:
    ns, nf, ss, sf = _counts(recs, "apple")
    assert (ns, nf, ss, sf) == (20, 20, 20, 4)
    assert ranked[0].separation == pytest.approx(21 / 22 - 5 / 22)
    keys = [s.key for s in ranked]
    assert not any(k.endswith(("/nocap", "/pit")) for k in keys)  # no targetable capability
    proposals = refl.propose(recs, [], max_new=1, step=3)
    assert len(proposals) == 1
    p = proposals[0]
    assert (p.key, p.source_id, p.capability, p.task_types, p.weight) == (
        "list/lexical/sep",
        "sep",
        "lexical",
        ("list",),
        2.0,
    )
    assert p.skill == refl.skill_texts["lexical"]
    assert p.evidence["failures_explained"] == 16
    # Every score equals its hand count, and the order is by separation.
    for s in refl.score_candidates(recs).values():
        word = WORDS[s.key.split("/")[2]]
        assert (s.n_success, s.n_failure, s.sat_success, s.sat_failure) == _counts(recs, word)
    assert [s.separation for s in ranked] == sorted((s.separation for s in ranked), reverse=True)


def test_programmatic_skips_taken_weak_unsupported_and_redundant_candidates():
    recs = _records()
    refl = ProgrammaticReflection(min_separation=0.1, rank="separation")
    # Already in the pool (or retired): the next best comes first.
    nxt = refl.propose(recs, [], max_new=5, step=0, exclude_keys=frozenset({"list/lexical/sep"}))
    assert all(p.key != "list/lexical/sep" for p in nxt)
    # "common" does not separate (met ~90 % everywhere): below min_separation.
    assert "list/formatting/common" not in [
        p.key for p in refl.propose(recs, [], max_new=5, step=0)
    ]
    # Too little support: nothing at all.
    assert refl.propose(recs[:6], [], max_new=5, step=0) == []
    # A criterion that restates the task outcome (agreement 1.0 with both outcomes present) is
    # skipped as redundant; with the filter off it ranks first.
    task = _task()
    crit = task.rubric.by_id("nocap").replace(capability="lexical")
    task2 = Task(
        id="t0",
        prompt=task.prompt,
        rubric=Rubric((crit,) + task.rubric.criteria[:3]),
        task_type="list",
        capabilities=task.capabilities,
    )
    recs2 = _records(task=task2)
    assert refl.rank(recs2)[0].key == "list/lexical/sep"
    assert (
        ProgrammaticReflection(redundant_agreement=1.01, rank="separation").rank(recs2)[0].key
        == "list/lexical/nocap"
    )


def test_programmatic_ranks_by_failures_when_no_success_yet():
    recs = [r for r in _records(80) if not r.success]  # 40 failures, no success
    ranked = ProgrammaticReflection(rank="separation").rank(recs)
    # 'sep' fails in 32 of 40 failures, more than any other: the most frequent gap comes first.
    assert ranked[0].key == "list/lexical/sep"


def _entry(**kw):
    base = dict(
        id="arise-0000",
        key="list/lexical/sep",
        text="includes apple",
        weight=2.0,
        capability="lexical",
        task_types=("list",),
        skill="use only words",
        source_id="sep",
        state="active",
    )
    return PoolEntry(**{**base, **kw})


def test_programmatic_refinement_cites_the_failing_criterion():
    refl = ProgrammaticReflection(SKILL_TEXTS)  # the embedded domain's Domain.skill_texts
    task = _task()
    e = _entry()
    fails = [RolloutRecord(0, task, "x .", False, {"arise-0000": False})]
    passes = [RolloutRecord(0, task, "apple .", True, {"arise-0000": True})]
    assert refl.refine(e, passes, step=5) is None  # nothing observed failing: nothing to cite
    s1 = refl.refine(e, fails + passes, step=5)
    assert s1 == f"{refl.skill_texts['lexical']} ; the last answers missed : {CRITERION_SLOT}"
    src = task.rubric.by_id("sep")
    assert fill_skill(s1, src).endswith("the last answers missed : includes apple")
    e.refinements = 1
    s2 = refl.refine(e, fails, step=6)
    assert s2.startswith(f"remember : {CRITERION_SLOT} ;") and s2 != s1
    e.refinements = 2
    assert refl.refine(e, fails, step=7) is None
    # A pitfall's hint says "avoid".
    assert fill_skill(CRITERION_SLOT, task.rubric.by_id("pit")) == "avoid : uses lime"


# --- LLM reflection ------------------------------------------------------------------------------


def _pair(rubric="lists exactly the asked number of items", **kw):
    return {
        "rubric": rubric,
        "skill": "count before you stop",
        "capability": "counting",
        "task_types": ["list"],
        **kw,
    }


class Scripted:
    def __init__(self, *replies):
        self.replies = list(replies)
        self.calls = []

    def __call__(self, messages, params):
        self.calls.append((messages, params))
        return self.replies.pop(0)


def _llm(*replies):
    fn = Scripted(*replies)
    return LLMReflection(LocalEngineClient(fn)), fn


def test_llm_reflection_valid_reply_becomes_proposals():
    reply = json.dumps(
        {"pairs": [_pair(), _pair("ends with a period", capability="formatting", weight=-1.5)]}
    )
    refl, fn = _llm("```json\n" + reply + "\n```")
    out = refl.propose(_records(), [], max_new=2, step=4)
    assert [(p.text, p.capability, p.task_types, p.weight, p.source_id) for p in out] == [
        ("lists exactly the asked number of items", "counting", ("list",), 1.0, None),
        ("ends with a period", "formatting", ("list",), -1.5, None),
    ]
    messages, params = fn.calls[0]
    assert messages[0]["role"] == "system" and "rubric" in messages[0]["content"]
    assert "outcome failure" in messages[1]["content"] and "at most 2" in messages[1]["content"]
    assert params["json_schema"]["required"] == ["pairs"] and params["seed"] == 4
    assert refl.counts == {"calls": 1, "rejected": 0, "accepted": 2}


@pytest.mark.parametrize(
    "reply, error",
    [
        ("not json", "not valid JSON"),
        (json.dumps({"pairs": [_pair()], "extra": 1}), "unexpected keys"),
        (json.dumps({"pairs": [_pair(), _pair(capability="telepathy")]}), "capability"),
        (json.dumps({"pairs": [_pair(), _pair("other", task_types=["poetry"])]}), "task_types"),
        (json.dumps({"pairs": [_pair(), _pair("other", weight=0)]}), "weight"),
        (json.dumps({"pairs": [_pair(), _pair("other", skill="  ")]}), "skill"),
        (
            json.dumps({"pairs": [_pair(), _pair("  Lists exactly the ASKED number of items ")]}),
            "duplicates",
        ),
        (json.dumps({"pairs": [_pair("a"), _pair("b"), _pair("c")]}), "at most 2"),
    ],
)
def test_llm_reflection_rejects_invalid_replies_whole(reply, error):
    refl, _ = _llm(reply)
    assert refl.propose(_records(), [], max_new=2, step=0) == []  # never half-applied
    assert refl.counts["rejected"] == 1 and error in refl.last_error
    _, direct = parse_proposals(
        reply, task_types=["list"], capabilities=["counting", "formatting"], existing=[], max_new=2
    )
    assert error in direct


def test_llm_reflection_rejects_a_duplicate_of_the_pool_and_refines_strictly():
    pool = [_entry(text="Lists exactly the asked number of items", source_id=None)]
    refl, _ = _llm(json.dumps({"pairs": [_pair()]}))
    assert refl.propose(_records(), pool, max_new=2, step=0) == []
    assert "duplicates" in refl.last_error
    task = _task()
    fails = [RolloutRecord(0, task, "x .", False, {"arise-0000": False})]
    e = _entry()
    refl, fn = _llm(
        json.dumps({"skill": "write apple first"}), json.dumps({"skill": e.skill}), "{}"
    )
    assert refl.refine(e, fails, step=1) == "write apple first"
    assert "includes apple" in fn.calls[0][0][1]["content"]
    assert refl.refine(e, fails, step=2) is None and "identical" in refl.last_error
    assert refl.refine(e, fails, step=3) is None and refl.counts["rejected"] == 2
    assert refl.refine(e, [], step=4) is None and len(fn.calls) == 3  # no failure: no call


def test_llm_reflection_client_error_is_a_rejection():
    def broken(messages, params):
        return "x", {"finish_reason": "length"}

    refl = LLMReflection(LocalEngineClient(broken))
    assert refl.propose(_records(), [], max_new=1, step=0) == []
    assert "truncated" in refl.last_error
    state = json.loads(json.dumps(refl.state_dict()))
    other = LLMReflection(LocalEngineClient(broken))
    other.load_state_dict(state)
    assert other.counts == refl.counts and other.last_error == refl.last_error


def _progress_task():
    def crit(cid, word, cap):
        return Criterion(
            cid, f"includes {word}", 1.0, capability=cap,
            verifier=Verifier.rule("cf_includes_word", word=word),
        )  # fmt: skip

    crits = (
        crit("sep", "apple", "lexical"),
        crit("noise", "pear", "counting"),
        crit("common", "plum", "formatting"),
        crit("never", "grape", "lexical"),  # no rollout ever meets it
    )
    return Task(
        id="t0",
        prompt=({"role": "user", "content": "q"},),
        rubric=Rubric(crits),
        task_type="list",
        capabilities=("lexical", "counting", "formatting"),
    )


def _progress_records():
    task = _progress_task()
    rec = lambda step, words, ok: RolloutRecord(step, task, " ".join(words) + " .", ok, {})  # noqa: E731
    groups = [
        # step 0, all failed: apple 0/4, pear 2/4 (q(1-q) = 1/4), plum 4/4
        [(["plum", "pear"], False), (["plum", "pear"], False)] + [(["plum"], False)] * 2,
        # step 1, all failed: apple 1/4 (3/16), pear 0/4, plum 4/4
        [(["plum", "apple"], False), (["plum"], False), (["plum"], False), (["plum"], False)],
        # step 2: two successes, so not a failing group (no variance counted from it)
        [(["plum", "apple", "pear"], True), (["plum", "apple"], True), (["pear"], False),
         (["apple"], False)],
    ]  # fmt: skip
    return [rec(step, w, ok) for step, g in enumerate(groups) for w, ok in g]


def test_progress_ranking_is_within_group_variance_over_failing_groups():
    recs = _progress_records()
    refl = ProgrammaticReflection(min_support=4, min_failures=2, rank="progress")
    scores = refl.score_candidates(recs)
    # By hand: mean over the two failing groups of q_g (1 - q_g).
    assert scores["list/counting/noise"].fail_group_variance == pytest.approx((1 / 4 + 0) / 2)
    assert scores["list/lexical/sep"].fail_group_variance == pytest.approx((0 + 3 / 16) / 2)
    assert scores["list/formatting/common"].fail_group_variance == 0.0
    assert scores["list/lexical/never"].fail_group_variance == 0.0
    assert {s.fail_groups for s in scores.values()} == {2}
    ranked = [s.key for s in refl.rank(recs)]
    # plum varies in no failing group, grape is met by no rollout (no partial progress): neither
    # is proposed; pear's within-group spread beats apple's.
    assert ranked == ["list/counting/noise", "list/lexical/sep"]
    p = refl.propose(recs, [], max_new=2, step=3)
    assert [x.key for x in p] == ranked
    assert p[0].evidence["rank"] == "progress" and p[0].evidence["fail_groups"] == 2
    assert p[0].evidence["fail_group_variance"] == pytest.approx(1 / 8)
    # The separation ranking (the ablation) puts the never-met criterion among the proposals:
    # it "explains" every failure, so it would take a pool slot that no group can learn from.
    old = ProgrammaticReflection(min_support=4, min_failures=2, rank="separation")
    assert "list/lexical/never" in [s.key for s in old.rank(recs)]
    with pytest.raises(ValueError, match="rank must be one of"):
        ProgrammaticReflection(rank="nope")


def test_progress_mass_ranks_by_the_signal_given_to_all_failing_groups():
    """Default ranking: Σ_g q_g(1 − q_g), the mean times the number of failing groups reached. A
    criterion that varies a little in many failing groups beats one that varies a lot in one
    (by the mean, the other way round)."""
    full = _progress_task()
    only_apple = Task(
        id="t1",
        prompt=full.prompt,
        rubric=Rubric(tuple(c for c in full.rubric.criteria if c.id == "sep")),
        task_type="list",
        capabilities=full.capabilities,
    )

    def group(step, task, words):
        return [RolloutRecord(step, task, " ".join(w) + " .", False, {}) for w in words]

    # pear q = 1/2 (1/4); plum in every rollout (no spread)
    recs = group(0, full, [["pear", "plum"], ["pear", "plum"], ["plum"], ["plum"]])
    for step in (1, 2, 3):  # apple q = 1/4 in each: 3/16
        recs += group(step, only_apple, [["apple"], ["plum"], ["plum"], ["plum"]])
    mass = ProgrammaticReflection(min_support=4, min_failures=2)
    assert mass.rank_by == "progress_mass"
    scores = mass.score_candidates(recs)
    assert scores["list/counting/noise"].fail_group_mass == pytest.approx(1 / 4)
    assert scores["list/lexical/sep"].fail_group_mass == pytest.approx(3 * 3 / 16)
    assert scores["list/lexical/sep"].fail_group_variance == pytest.approx(9 / 16 / 4)
    assert [s.key for s in mass.rank(recs)] == ["list/lexical/sep", "list/counting/noise"]
    by_mean = ProgrammaticReflection(min_support=4, min_failures=2, rank="progress")
    assert [s.key for s in by_mean.rank(recs)] == ["list/counting/noise", "list/lexical/sep"]
    (p,) = mass.propose(recs, [], max_new=1, step=4)
    assert p.evidence["fail_group_mass"] == pytest.approx(9 / 16)


def test_library_bank_proposes_what_the_seed_rubric_lacks():
    """With the domain's checker library as the bank, the reflection can propose the implicit
    requirements (here: distinct items) that no seed criterion states; the seed-rubric bank
    cannot. Every rollout misses the count (so every group fails the task) and repeats an item
    half the time; everything else is met."""
    from rubric_rl.envs import constraint_domain as cd
    from rubric_rl.envs.constraint_library import library_criteria
    from rubric_rl.envs.constraints import ConstraintDomain, render_response

    tasks = [t for t in ConstraintDomain(0).tasks("train", 300) if t.task_type == "list"][:12]
    rng = np.random.default_rng(0)
    recs = []
    for step, task in enumerate(tasks):
        kinds = {c.kind for c in cd.task_requirements(task)}
        for j in range(8):
            response = render_response(
                task, kinds - {"count"} - ({"distinct"} if j % 2 else set()), rng
            )
            recs.append(RolloutRecord(step, task, response, cd.verify(task, response), {}))
    lib = ProgrammaticReflection(min_support=4, min_failures=2, bank=library_criteria)
    seed = ProgrammaticReflection(min_support=4, min_failures=2)
    assert [s.key for s in lib.rank(recs)][:1] == ["list/lexical/distinct"]
    assert not any("distinct" in s.key for s in seed.rank(recs))
    (p,) = lib.propose(recs, [], max_new=1, step=20)
    assert (p.source_id, p.capability, p.text) == ("distinct", "lexical", "no item is repeated")
