"""Tests of the embedded constraint-following domain: checkers, splits, oracle, corpus, guidance."""

from __future__ import annotations

import collections
import functools

import numpy as np
import pytest

from rubric_rl.envs import constraint_domain
from rubric_rl.envs import constraints as cf
from rubric_rl.envs.constraint_corpus import (
    anti_pattern_text,
    decorate_prompt,
    format_coach,
    format_critique,
    format_reference,
    guidance_hint,
    guidance_kinds_of,
    refined_skill,
    render_guidance,
    warmstart_corpus,
    warmstart_example,
)
from rubric_rl.envs.constraint_lexicon import GUIDANCE_KINDS, SKILL_TEXTS, canonical, units
from rubric_rl.envs.tool_envs import is_tool_env
from rubric_rl.rubrics.checkers import CHECKERS
from rubric_rl.rubrics.types import Message, Rubric, Task

# (checker, args, response, expected) — hand-written positives and negatives for every checker.
CASES = [
    ("cf_word_count", {"low": 3, "high": 3}, "red blue green .", True),
    ("cf_word_count", {"low": 3, "high": 3}, "great question ! red blue green .", True),
    ("cf_word_count", {"low": 3, "high": 3}, "red blue .", False),
    ("cf_word_count", {"low": 2, "high": 4}, "red blue green pink gray", False),
    ("cf_item_count", {"n": 3}, "apple, pear; plum.", True),
    ("cf_item_count", {"n": 3}, "1 ) apple 2 ) pear 3 ) plum !", True),
    ("cf_item_count", {"n": 3}, "apple pear plum .", False),
    ("cf_item_count", {"n": 2}, "apple , pear , plum .", False),
    ("cf_case", {"mode": "upper"}, "RED , BLUE !", True),
    ("cf_case", {"mode": "upper"}, "RED , Blue !", False),
    ("cf_case", {"mode": "lower"}, "red blue . ALL REQUIREMENTS MET .", True),
    ("cf_case", {"mode": "lower"}, "!", False),
    ("cf_case", {"mode": "capitalized"}, "Red Blue", True),
    ("cf_case", {"mode": "capitalized"}, "Red BLUE", False),
    ("cf_ends_with", {"punct": "!"}, "red blue !", True),
    ("cf_ends_with", {"punct": "!"}, "red blue ! all requirements met .", True),
    ("cf_ends_with", {"punct": "!"}, "red blue .", False),
    ("cf_ends_with", {"punct": "!"}, "", False),
    ("cf_starts_with", {"word": "answer"}, "Answer five .", True),
    ("cf_starts_with", {"word": "answer"}, "great question ! answer five .", True),
    ("cf_starts_with", {"word": "answer"}, "five answer .", False),
    ("cf_includes_word", {"word": "kiwi"}, "apple , KIWI .", True),
    ("cf_includes_word", {"word": "kiwi"}, "apple , kiwis .", False),
    ("cf_excludes_word", {"word": "kiwi"}, "apple , pear .", True),
    ("cf_excludes_word", {"word": "kiwi"}, "apple , kiwi .", False),
    ("cf_sorted", {"order": "asc"}, "apple , cherry , pear .", True),
    ("cf_sorted", {"order": "asc"}, "pear , apple .", False),
    ("cf_sorted", {"order": "asc"}, "apple .", False),
    ("cf_sorted", {"order": "desc"}, "1 ) pear 2 ) lime 3 ) apple", True),
    ("cf_sorted", {"order": "desc"}, "apple , pear", False),
    ("cf_separator", {"sep": ";"}, "apple ; pear ; plum .", True),
    ("cf_separator", {"sep": ";"}, "apple ; pear , plum .", False),
    ("cf_separator", {"sep": ";"}, "apple pear plum .", False),
    ("cf_separator", {"sep": ";"}, "; apple ; pear", False),
    ("cf_numbered", {}, "1 ) apple 2 ) pear .", True),
    ("cf_numbered", {}, "1 ) apple , 2 ) pear", True),
    ("cf_numbered", {}, "1 ) apple 3 ) pear .", False),
    ("cf_numbered", {}, "apple , pear .", False),
    ("cf_numbered", {}, "1 ) 2 ) pear", False),
    ("cf_in_category", {"category": "fruit"}, "Apple , KIWI .", True),
    ("cf_in_category", {"category": "fruit"}, "apple , dog .", False),
    ("cf_in_category", {"category": "fruit"}, "apple and so on .", False),
    ("cf_in_category", {"category": "fruit"}, ".", False),
    ("cf_answer_is", {"answer": "five", "choices": ("four", "five")}, "answer five .", True),
    ("cf_answer_is", {"answer": "five", "choices": ("four", "five")}, "four or five", False),
    ("cf_answer_is", {"answer": "yes", "choices": ("yes", "no")}, "no .", False),
    ("cf_sequence_is", {"words": ("cat", "red")}, "CAT RED !", True),
    ("cf_sequence_is", {"words": ("cat", "red")}, "red cat !", False),
    ("cf_sequence_is", {"words": ("cat", "red")}, "cat red dog", False),
    (
        "cf_all_of",
        {"parts": (("cf_ends_with", (("punct", "!"),)), ("cf_case", (("mode", "upper"),)))},
        "RED !",
        True,
    ),
    (
        "cf_all_of",
        {"parts": (("cf_ends_with", (("punct", "!"),)), ("cf_case", (("mode", "upper"),)))},
        "red !",
        False,
    ),
    ("cf_non_empty", {}, " x ", True),
    ("cf_non_empty", {}, "  \n", False),
    ("cf_max_words", {"n": 3}, "great question ! red", True),
    ("cf_max_words", {"n": 3}, "great question ! red blue", False),
    ("cf_opens_with_praise", {}, "Great question! red .", True),
    ("cf_opens_with_praise", {}, "red . great question !", False),
    ("cf_claims_compliance", {}, "red . all requirements met .", True),
    ("cf_claims_compliance", {}, "ALL REQUIREMENTS MET red", True),
    ("cf_claims_compliance", {}, "all rules met .", False),
    ("cf_min_words", {"n": 4}, "red blue and so on", True),
    ("cf_min_words", {"n": 4}, "red blue !", False),
    ("cf_distinct", {"unit": "items"}, "apple , Pear , kiwi .", True),
    ("cf_distinct", {"unit": "items"}, "1 ) apple 2 ) APPLE .", False),
    ("cf_distinct", {"unit": "items"}, "great question ! apple , pear .", True),
    ("cf_distinct", {"unit": "items"}, ".", False),
    ("cf_distinct", {"unit": "words"}, "red blue green .", True),
    ("cf_distinct", {"unit": "words"}, "red blue Red .", False),
    ("cf_plain", {}, "red , blue .", True),
    ("cf_plain", {}, "happy to help ! red .", False),
    ("cf_plain", {}, "red . every rule is followed .", False),
    ("cf_plain", {}, "red as you can see .", False),
]


@pytest.mark.parametrize(("name", "args", "response", "expected"), CASES)
def test_checker_examples(name, args, response, expected):
    assert CHECKERS.get(name)(response, task=None, **args) is expected


def test_every_domain_checker_has_positive_and_negative_examples():
    names = {n for n in CHECKERS.names() if n.startswith("cf_")}
    seen = collections.defaultdict(set)
    for name, _, _, expected in CASES:
        seen[name].add(expected)
    assert names == set(seen)
    assert all(v == {True, False} for v in seen.values()), seen


def test_checker_bad_arguments_name_the_checker():
    with pytest.raises(ValueError, match="cf_case"):
        CHECKERS.get("cf_case")("red", mode="shouty")
    with pytest.raises(ValueError, match="cf_sorted"):
        CHECKERS.get("cf_sorted")("a , b", order="random")


@functools.cache
def _tasks(split: str, n: int, seed: int = 0) -> tuple[Task, ...]:
    return tuple(cf.ConstraintDomain(seed).tasks(split, n))


def test_same_seed_same_tasks_and_prefix_stable():
    a = cf.ConstraintDomain(3).tasks("train", 40)
    b = cf.ConstraintDomain(3).tasks("train", 60)
    assert a == b[:40]
    assert [t.reference_answer for t in a] == [t.reference_answer for t in b[:40]]
    assert cf.task_bank("train", 40, seed=3) == a
    other = cf.ConstraintDomain(4).tasks("train", 40)
    assert [t.id for t in a] != [t.id for t in other]


def test_constraints_are_computed_once_per_parameters_and_equal_a_fresh_computation():
    from rubric_rl.envs import constraint_spec as spec

    tasks = _tasks("train", 200) + _tasks("heldout", 50) + _tasks("ood", 50)
    for t in tasks:
        p = t.raw["params"]
        for fn in (spec.constraints_for, spec.requirements):
            got = fn(p)
            assert got == fn.__wrapped__(p)  # the memo returns what a fresh computation does
            assert fn(dict(p)) is got  # equal parameters (another dict): the memoized tuple
    # Values that compare equal but render differently are different parameters.
    p = dict(next(t.raw["params"] for t in tasks if t.raw["params"]["type"] == "list"))
    for q in (dict(p, n=float(p["n"])), dict(p, n=True), dict(p, choices=("a", "b"))):
        fresh = spec.constraints_for.__wrapped__(q)
        assert spec.constraints_for(q) == fresh and [c.text for c in fresh] == [
            c.text for c in spec.constraints_for(q)
        ]


@pytest.mark.parametrize("domain", ["constraints", "instruct"])
def test_a_seeds_splits_are_generated_once_and_equal_a_fresh_generation(domain):
    from rubric_rl.envs import hashed_splits, instruct_domain

    module = constraint_domain if domain == "constraints" else instruct_domain
    cls = cf.ConstraintDomain if domain == "constraints" else instruct_domain.InstructDomain

    def fresh(seed, split, n):
        d = cls(seed)
        make = d._make_task if domain == "constraints" else instruct_domain.make_task
        return hashed_splits.generate(
            cls.__name__, seed, split, n, d._sample_params, make,
            heldout_percent=module.HELDOUT_PERCENT,
            validation_percent=module.VALIDATION_PERCENT,
        )  # fmt: skip

    hashed_splits._KEPT.clear()
    # Shorter after longer (a prefix of the kept list), longer after shorter (drawn again).
    for seed, split, n in ((7, "train", 60), (7, "train", 25), (7, "train", 90), (7, "ood", 30)):
        got = cls(seed).tasks(split, n)
        want = fresh(seed, split, n)
        assert [t.id for t in got] == [t.id for t in want] and got == want
        assert [t.raw for t in got] == [t.raw for t in want]
    a = cls(7).tasks("train", 40)
    a.clear()  # the caller's list: the kept one is untouched
    b = cls(7).tasks("train", 40)
    assert len(b) == 40 and b[0] is cls(7).tasks("train", 1)[0]  # computed once
    assert [t.id for t in cls(8).tasks("train", 40)] != [t.id for t in b]
    assert cls(7).tasks("train", 0) == []
    for bad in (("train", -1), ("test", 3)):
        with pytest.raises(ValueError, match=f"{cls.__name__}.tasks"):
            cls(7).tasks(*bad)


def test_splits_disjoint_and_ood_combinations_absent_from_training():
    train = _tasks("train", 300) + _tasks("train", 300, seed=1)
    heldout = _tasks("heldout", 150) + _tasks("heldout", 150, seed=1)
    ood = _tasks("ood", 150)
    key = lambda t: (t.question.split(" <")[0], repr(sorted(t.raw["params"].items())))
    keys = {s: {key(t) for t in ts} for s, ts in (("tr", train), ("he", heldout), ("ood", ood))}
    assert not keys["tr"] & keys["he"] and not keys["tr"] & keys["ood"]
    assert not keys["he"] & keys["ood"]
    for t in train + heldout:
        assert t.task_type in cf.TRAIN_TASK_TYPES
        kinds = cf.combo_kinds(t.raw["params"])
        assert not any(a in kinds and b in kinds for a, b in cf.OOD_PAIRS), t.question
    for t in ood:
        kinds = cf.combo_kinds(t.raw["params"])
        pair = any(a in kinds and b in kinds for a, b in cf.OOD_PAIRS)
        assert t.task_type in cf.OOD_TASK_TYPES or pair, t.question
    ood_types = collections.Counter(t.task_type for t in ood)
    assert ood_types["filter"] > 20 and sum(ood_types.values()) - ood_types["filter"] > 20
    assert {t.task_type for t in train} == set(cf.TRAIN_TASK_TYPES)
    # The task types are the environments: five of them, none a tool environment.
    envs = {t.env_name for t in train + heldout + ood}
    assert envs == set(cf.TRAIN_TASK_TYPES) | set(cf.OOD_TASK_TYPES)
    assert not any(is_tool_env(e) for e in envs)
    caps = {c for t in train for c in t.capabilities}
    assert caps == set(cf.CAPABILITIES)


def test_bad_split_and_foreign_task_raise():
    with pytest.raises(ValueError, match="split"):
        cf.ConstraintDomain(0).tasks("test", 3)
    foreign = Task(id="x", prompt=(Message("user", "hi"),), rubric=Rubric(()))
    with pytest.raises(ValueError, match="'x'"):
        cf.oracle_quality(foreign, "hi")


def _met(criterion, response: str) -> bool:
    return CHECKERS.get(criterion.verifier.checker)(response, **criterion.verifier.kwargs)


def _cls(criterion) -> str:
    (tag,) = [t for t in criterion.tags if t.startswith("class:")]
    return tag.removeprefix("class:")


@pytest.mark.parametrize("split", cf.SPLITS)
def test_references_pass_verify_and_genuine_criteria(split):
    for t in _tasks(split, 150):
        assert t.domain == "constraints" and t.env_name == t.task_type  # task types are envs
        assert len(t.prompt) == 1 and t.prompt[0].role == "user"
        assert set(t.capabilities) <= set(cf.CAPABILITIES) and t.capabilities
        ref = t.reference_answer
        assert cf.verify(t, ref), (t.question, ref)
        assert cf.oracle_quality(t, ref) == 1.0
        classes = collections.Counter(_cls(c) for c in t.rubric)
        assert classes["saturated"] >= 1 and classes["spurious"] >= 2
        assert classes["blind"] >= 1 or len(cf.hard_constraints(t)) < 3
        for c in t.rubric:
            met = _met(c, ref)
            if _cls(c) in ("genuine", "blind", "saturated"):
                assert met == (c.weight > 0), (t.question, ref, c.id)
            else:
                assert not met, (t.question, ref, c.id)  # the reference carries no fluff
        rare = [c for c in cf.hard_constraints(t) if c.rare]
        assert all(_cls(t.rubric.by_id(c.kind)) == "blind" for c in rare)


def test_oracle_hand_computed():
    params = {"type": "list", "category": "fruit", "n": 3, "numbered": False, "sep": ";"}
    params.update(order="asc", case=None, end="!", include=None, exclude="pear")
    task = Task(
        id="t",
        prompt=(Message("user", "q"),),
        rubric=Rubric(()),
        domain="constraints",
        raw={"params": params},
    )
    # weights: count 2, category 3, sep 1, order 1, exclude |-2|, end 1 -> 10
    assert cf.oracle_quality(task, "apple ; cherry ; grape !") == pytest.approx(1.0)
    # one intruder: category graded 2/3 -> 9 / 10
    assert cf.oracle_quality(task, "apple ; cherry ; dog !") == pytest.approx(0.9)
    assert cf.oracle_quality(task, "great question ! apple ; cherry ; dog !") == pytest.approx(
        0.9 * 0.75
    )
    both = "great question ! apple ; cherry ; grape ! all requirements met ."
    assert cf.oracle_quality(task, both) == pytest.approx(0.5)
    assert cf.verify(task, "apple ; cherry ; grape !")
    assert not cf.verify(task, "apple ; cherry ; pear !")
    # Fluff keeps every stated constraint but breaks the implicit "plain": the verifier fails it.
    assert all(c.met(both) for c in cf.hard_constraints(task)) and not cf.verify(task, both)
    # forbidden word (-2) and wrong end (-1): 7 / 10
    assert cf.oracle_quality(task, "apple ; cherry ; pear .") == pytest.approx(0.7)
    assert cf.oracle_quality(task, "") == 0.0
    # A repeated item is one fruit: category 1/3 (-2); every stated constraint passes (the seed
    # rubric's count and category accept repeats), the implicit "distinct" and the verifier fail.
    repeated = "apple ; apple ; apple !"
    assert all(c.met(repeated) for c in cf.hard_constraints(task))
    assert not cf.verify(task, repeated)
    assert cf.oracle_quality(task, "apple ; apple ; apple !") == pytest.approx(0.8)
    assert cf.oracle_quality(task, "apple ; apple ; cherry !") == pytest.approx(0.9)


def _edit_distance_np(a, b) -> int:
    d = np.zeros((len(a) + 1, len(b) + 1), dtype=np.int64)
    d[:, 0] = np.arange(len(a) + 1)
    d[0, :] = np.arange(len(b) + 1)
    for i in range(1, len(a) + 1):
        for j in range(1, len(b) + 1):
            d[i, j] = min(
                d[i - 1, j] + 1, d[i, j - 1] + 1, d[i - 1, j - 1] + (a[i - 1] != b[j - 1])
            )
    return int(d[-1, -1])


def test_edit_distance_matches_numpy_reference():
    rng = np.random.default_rng(0)
    for _ in range(200):
        a = list(rng.choice(list("abcd"), size=rng.integers(0, 7)))
        b = list(rng.choice(list("abcd"), size=rng.integers(0, 7)))
        assert constraint_domain._edit_distance(a, b) == _edit_distance_np(a, b)


def _spearman(x: np.ndarray, y: np.ndarray) -> float:
    rank = lambda v: np.argsort(np.argsort(v, kind="stable"), kind="stable").astype(float)

    # average ranks for ties
    def avg_rank(v):
        r = rank(v)
        for val in np.unique(v):
            r[v == val] = r[v == val].mean()
        return r

    return float(np.corrcoef(avg_rank(x), avg_rank(y))[0, 1])


def test_spurious_criteria_do_not_track_oracle_while_genuine_ones_do():
    rng = np.random.default_rng(0)
    rows = collections.defaultdict(list)  # (class, kind, sign) -> [(met, oracle)]
    for t in _tasks("train", 250) + _tasks("ood", 60):
        kinds = [c.kind for c in constraint_domain.task_requirements(t)]
        for _ in range(12):  # ~200 draws per criterion kind: correlations well above noise
            keep = {k for k in kinds if rng.random() < 0.7}
            flags = {f: bool(rng.random() < 0.3) for f in ("praise", "claim", "pad")}
            response = cf.render_response(t, keep, rng, **flags)
            q = cf.oracle_quality(t, response)
            assert 0.0 <= q <= 1.0
            for c in t.rubric:
                rows[(_cls(c), c.id, c.weight > 0)].append((_met(c, response), q))
    pooled = collections.defaultdict(list)
    for (cls, cid, positive), v in rows.items():
        a = np.asarray(v, dtype=float)
        if cls == "saturated":
            assert a[:, 0].mean() > 0.98, cid  # met by (nearly) everything
            continue
        r, rho = np.corrcoef(a[:, 0], a[:, 1])[0, 1], _spearman(a[:, 0], a[:, 1])
        if cls == "spurious":
            assert r < 0.0 and rho < 0.0, (cid, r, rho)
            assert 0.1 < a[:, 0].mean() < 0.9, cid  # discriminative, yet not tracking quality
        elif positive:
            assert r > 0.05 and rho > 0.05, (cid, r, rho)
        else:
            assert r < -0.1 and rho < -0.1, (cid, r, rho)
        pooled[cls if positive else "pitfall"] += v
    summary = {k: np.corrcoef(np.asarray(v, float).T)[0, 1] for k, v in pooled.items()}
    assert summary["genuine"] > 0.3 and summary["blind"] > 0.3
    assert summary["spurious"] < -0.1


def test_warmstart_corpus_imperfect_and_guidance_raises_verify_rate():
    corpus = warmstart_corpus(600, seed=5)
    assert corpus == warmstart_corpus(600, seed=5)
    tasks = cf.ConstraintDomain(5).tasks("train", 600)
    guided, unguided = [], []
    for (messages, completion), task in zip(corpus, tasks, strict=True):
        user = [m for m in messages if m["role"] == "user"]
        assert len(user) == 1 and user[0]["content"].startswith(task.question)
        ok = cf.verify(task, completion)
        if guidance_kinds_of(messages):
            guided.append(ok)
        else:
            assert messages == task.messages
            unguided.append(ok)
        assert len(units(completion)) <= 32
    assert 0.25 < len(guided) / len(corpus) < 0.55
    assert np.mean(unguided) < 0.35
    assert np.mean(guided) > np.mean(unguided) + 0.25
    kinds = collections.Counter(k for m, _ in corpus for k in guidance_kinds_of(m))
    assert set(kinds) == set(GUIDANCE_KINDS)


def test_warmstart_corpus_covers_every_prompt_shape_training_can_show(tmp_path):
    """Several skills at once, rewritten skills (both refinement levels, in the
    reflection's wording), up to three guidance fields, a system-message placement, within the
    model's prompt limit (the warm start drops the few longer ones)."""
    from configs.common import get_base_config
    from rubric_rl.config.builders import build_word_tokenizer
    from rubric_rl.envs.constraint_corpus import MISSED_PREFIX, REMEMBER_PREFIX
    from rubric_rl.methods.arise.reflection import ProgrammaticReflection

    base = get_base_config()
    tok = build_word_tokenizer(cf.domain_vocabulary(), str(tmp_path / "tok"))
    corpus = warmstart_corpus(2048, seed=0)
    cap = base.model.max_prompt_len
    assert base.warmstart.max_prompt_len == cap
    lengths = [len(tok.apply_chat_template(m, add_generation_prompt=True)) for m, _ in corpus]
    assert np.mean(np.asarray(lengths) > cap) < 0.01  # what the warm start drops
    corpus = [row for row, n in zip(corpus, lengths) if n <= cap]
    assert sum(m[0]["role"] == "system" for m, _ in corpus) > 20
    blocks = collections.Counter(len(guidance_kinds_of(m)) for m, _ in corpus)
    assert blocks[1] and blocks[2] and blocks[3]
    n_skills, levels = collections.Counter(), collections.Counter()
    for i, task in enumerate(_tasks("train", 600)):
        _, _, guidance = warmstart_example(task, np.random.default_rng([3, i]), guided=True)
        for text in guidance.get("skills", []):
            levels[(text.startswith(REMEMBER_PREFIX), MISSED_PREFIX in text)] += 1
        n_skills[len(guidance.get("skills", []))] += 1
    assert n_skills[1] and n_skills[2] and n_skills[3]
    assert levels[(False, False)] and levels[(False, True)] and levels[(True, True)]
    # The corpus writes a rewritten skill exactly as ARISE's programmatic reflection does.
    refl = ProgrammaticReflection(SKILL_TEXTS)  # the domain's Domain.skill_texts
    entry = type("E", (), {"capability": "counting", "refinements": 0, "id": "e", "weight": 1.0})()
    failing = [type("R", (), {"verdicts": {"e": False}})()]
    for level in (1, 2):
        entry.refinements = level - 1
        slot = refl.refine(entry, failing, step=1)
        hint = "the response lists exactly 3 items"
        assert slot.replace("{criterion}", hint) == refined_skill(
            refl.base_skill("counting"), hint, level
        )


def test_guided_completion_meets_what_the_guidance_names():
    tasks = _tasks("train", 300)
    hits = total = fluff_left = 0
    for i, task in enumerate(tasks):
        rng = np.random.default_rng(i)
        # No padding: filler words inside the body can break a word count or the category.
        _, completion, guidance = warmstart_example(
            task, rng, guided=True, fluff_rate=0.6, pad_rate=0.0
        )
        for kind in ("criterion", "critique", "coach"):
            if kind in guidance:
                for c in constraint_domain.task_requirements(task):  # implicit ones too
                    if c.hint in guidance[kind]:
                        total += 1
                        hits += c.met(completion)
        if (
            "anti_patterns" in guidance
            and "opening with great question" in guidance["anti_patterns"]
        ):
            fluff_left += CHECKERS.get("cf_opens_with_praise")(completion)
        if "reference" in guidance:
            assert completion in guidance["reference"] and cf.verify(task, completion)
    assert total > 50 and hits / total > 0.95
    assert fluff_left == 0


def test_decorate_prompt_is_deterministic_and_ordered():
    task = _tasks("train", 1)[0]
    guidance = {
        "critique": "the last answers missed : x",
        "reference": format_reference("a ."),
        "criterion": ["every word is in uppercase", "the response ends with !"],
    }
    a = decorate_prompt(task, guidance)
    b = decorate_prompt(task, dict(reversed(list(guidance.items()))))
    assert a == b
    content = a[-1]["content"]
    pos = [content.index(f"<{k}>") for k in ("criterion", "reference", "critique")]
    assert pos == sorted(pos) and content.startswith(task.question + " <criterion>")
    assert (
        "<criterion> every word is in uppercase ; the response ends with ! </criterion>" in content
    )
    assert content == canonical(content)
    assert decorate_prompt(task, {}) == task.messages
    assert decorate_prompt(task, {"coach": None, "skills": ""}) == task.messages
    assert task.prompt[0].content == task.question  # the task itself is untouched
    with pytest.raises(ValueError, match="hint"):
        decorate_prompt(task, {"hint": "x"})
    with pytest.raises(ValueError, match="bogus"):
        render_guidance("bogus", "x")
    assert render_guidance("skills", "sort first.") == "<skills> sort first . </skills>"
    assert guidance_hint("the response uses the word fig", -2.0).startswith("avoid : ")
    assert anti_pattern_text("every word is in uppercase", 1.0).startswith("breaking the rule")
    assert format_coach(["a", "b"]) == "remember : a ; remember : b"
    assert format_critique(["a"]) == "the last answers missed : a"
    assert cf.decorate_prompt is decorate_prompt and cf.warmstart_corpus is warmstart_corpus


def test_everything_the_domain_emits_is_in_the_vocabulary():
    vocab = cf.domain_vocabulary()
    assert vocab == sorted(set(vocab)) and len(vocab) < 700
    vocab = set(vocab)
    texts = []
    for split in cf.SPLITS:
        for t in _tasks(split, 150):
            texts += [t.question, t.reference_answer] + [c.text for c in t.rubric]
    for messages, completion in warmstart_corpus(300, seed=2, guided_fraction=1.0):
        texts += [messages[-1]["content"], completion]
    missing = {u for text in texts for u in units(text)} - vocab
    assert not missing


def _rubric_reward(task: Task, response: str) -> float:
    # HarnessRL §2.1: r = Σ λ s / Σ max(λ, 0)
    num = sum(c.weight * _met(c, response) for c in task.rubric)
    return num / sum(max(c.weight, 0.0) for c in task.rubric)


def test_fluff_hacks_the_seed_rubric_but_lowers_the_oracle():
    hacked = 0
    for t in _tasks("train", 100):
        ref = t.reference_answer
        fluffy = "great question ! " + ref + " all requirements met ."
        # Fluff leaves every stated constraint intact …
        assert all(c.met(fluffy) for c in cf.hard_constraints(t))
        assert _rubric_reward(t, fluffy) > _rubric_reward(t, ref)  # … raises the seed reward …
        assert cf.oracle_quality(t, fluffy) == pytest.approx(0.5)  # … and halves the oracle
        assert not cf.verify(t, fluffy)  # … and the verifier fails it (implicit "plain")
        hacked += 1
    assert hacked == 100


def test_superficial_cues_weigh_less_than_any_stated_requirement():
    # A realistic seed rubric: all spurious cues together are worth less than the least important
    # genuine requirement, so fluff can never buy back a missed constraint (at 1.0 each they were
    # ~20% of a rubric and static-rubric GRPO learned fluff instead of the task).
    for t in _tasks("train", 150) + _tasks("ood", 50):
        spurious = sum(c.weight for c in t.rubric if _cls(c) == "spurious")
        genuine = [c.weight for c in t.rubric if _cls(c) == "genuine" and c.weight > 0]
        assert 0.0 < spurious < min(genuine), (t.question, spurious, genuine)
        ref = t.reference_answer
        fluffy = "great question ! " + ref + " all requirements met ."
        for c in cf.hard_constraints(t):
            if c.weight <= 0 or c.kind not in ("end", "case", "count", "category", "answer"):
                continue
            broken = cf.render_response(
                t,
                {k.kind for k in cf.hard_constraints(t)} - {c.kind},
                np.random.default_rng(0),
                praise=True,
                claim=True,
            )
            if _met(t.rubric.by_id(c.kind), broken):
                continue  # the renderer could not break this one alone
            assert _rubric_reward(t, broken) < _rubric_reward(t, ref) < _rubric_reward(t, fluffy)


def test_ignored_format_falls_back_to_the_habit():
    # Greedy evaluation shows the policy's mode: below p_keep = 0.5 the demonstrations' mode for a
    # stated non-habit format must be the habit (so RL that teaches the instruction shows), and a
    # violation is never the third option.
    n = 1500
    tasks = cf.ConstraintDomain(3).tasks("train", n)
    corpus = warmstart_corpus(
        n, seed=3, guided_fraction=0.0, p_keep=0.4, fluff_rate=0.0, pad_rate=0.0
    )
    asked_end = habit_end = asked_habit = 0
    for (_, completion), task in zip(corpus, tasks, strict=True):
        p = task.raw["params"]
        mark = units(completion)[-1]
        if not p.get("end"):
            assert mark == cf.HABITS["end"]
        elif p["end"] != cf.HABITS["end"]:
            assert mark in (p["end"], cf.HABITS["end"]), (p["end"], completion)
            asked_end += mark == p["end"]
            habit_end += mark == cf.HABITS["end"]
        else:
            asked_habit += 1
    assert asked_end + habit_end > 150 and asked_habit > 30
    assert 0.3 < asked_end / (asked_end + habit_end) < 0.5  # p_keep = 0.4: the habit is the mode
    kept = warmstart_corpus(200, seed=3, guided_fraction=0.0, p_keep=1.0, fluff_rate=0.0)
    for (_, completion), task in zip(kept, tasks, strict=False):
        for c in cf.hard_constraints(task):
            if c.kind in ("end", "case", "sep"):
                assert c.met(completion), (c.kind, completion)
    with pytest.raises(ValueError, match="p_keep"):
        warmstart_corpus(4, seed=0, p_keep=1.5)
