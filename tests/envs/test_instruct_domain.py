"""Tests of the English instruction-following domain: checkers against hand-written answers
(near misses included), generation and splits, seed rubrics, verifier, oracle, library, guidance
and its registration as ``domain.name=instruct``."""

from __future__ import annotations

import collections
import functools
import json

import pytest

from rubric_rl.envs import instruct
from rubric_rl.envs import instruct_checkers as ic
from rubric_rl.envs.instruct_domain import Requirement, oracle_quality, verify
from rubric_rl.envs.instruct_guidance import criterion_guidance, mount, skill_guidance
from rubric_rl.envs.instruct_library import library_criteria, library_requirements, parse_prompt
from rubric_rl.envs.instruct_spec import (
    OOD_PAIRS,
    OOD_TYPES,
    TRAIN_TYPES,
    TYPE_BY_ID,
    TYPES,
    compatible,
    has_ood_pair,
)
from rubric_rl.rubrics.checkers import CHECKERS
from rubric_rl.rubrics.judges import JudgeItem, ProgrammaticJudge
from rubric_rl.rubrics.types import Message, Rubric, Task

# (checker, args, response, expected): a passing answer, then failing ones, near misses first.
CASES = [
    ("if_words_max", {"n": 5}, "Bees make honey from nectar.", True),
    ("if_words_max", {"n": 5}, "Bees make sweet honey from nectar.", False),  # 6 words
    ("if_words_max", {"n": 3}, "* Bees - make it", True),  # markup is not a word
    ("if_words_min", {"n": 4}, "Don't eat well-known food.", True),  # 4: apostrophe, hyphen
    ("if_words_min", {"n": 5}, "Don't eat well-known food.", False),
    ("if_sentences_max", {"n": 2}, "Rain falls. Clouds form!", True),
    ("if_sentences_max", {"n": 2}, "Rain falls. Clouds form! Then what?", False),
    ("if_sentences_max", {"n": 2}, "", False),  # no sentence at all
    ("if_sentences_max", {"n": 1}, "P.S. Water is good for you.", True),  # P.S. ends nothing
    ("if_sentences_max", {"n": 2}, "<<Rain>>\nRain falls. Clouds form.", True),  # title: none
    ("if_sentences_max", {"n": 2}, "* one item\n* two item\n* three item", False),
    ("if_paragraphs", {"n": 2}, "First part here.\n\nSecond part here.", True),
    ("if_paragraphs", {"n": 2}, "First part here.\nSecond line, same block.", False),
    ("if_paragraphs", {"n": 2}, "One.\n\nTwo.\n\nThree.", False),
    ("if_paragraphs", {"n": 2}, "<<T>>\n\nOne.\n\n  \n\nTwo.\n\nP.S. Bye.", True),
    ("if_lowercase", {}, "all small letters, 3 digits 123.", True),
    ("if_lowercase", {}, "all small letters except One.", False),
    ("if_lowercase", {}, "123 !!", False),  # no letter: not written in lowercase
    ("if_uppercase", {}, "ALL CAPS HERE 42!", True),
    ("if_uppercase", {}, "ALL CAPS HERe", False),
    ("if_capital_words", {"n": 2}, "This is VERY IMPORTANT.", True),
    ("if_capital_words", {"n": 2}, "This is VERY Important. A I", False),  # one-letter words
    ("if_no_commas", {}, "No commas here; none at all.", True),
    ("if_no_commas", {}, "One comma, here.", False),
    ("if_keywords", {"words": ("nectar", "hive")}, "The HIVE holds nectar.", True),
    ("if_keywords", {"words": ("nectar", "hive")}, "The hives hold nectar.", False),  # plural
    ("if_forbidden", {"word": "honey"}, "Bees make something sweet: honeycomb.", True),
    ("if_forbidden", {"word": "honey"}, "Bees make Honey.", False),
    ("if_forbidden", {"word": "honey"}, "Bees make honey-like syrup.", False),
    ("if_keyword_count", {"word": "tea", "n": 2}, "Tea is hot. I like tea.", True),
    ("if_keyword_count", {"word": "tea", "n": 2}, "Tea is hot. I like teas.", False),
    ("if_bullets", {"n": 2}, "Intro line\n* first\n- second", True),
    ("if_bullets", {"n": 2}, "* first\n* second\n* third", False),
    ("if_bullets", {"n": 2}, "*first\n*second", False),  # no space after the mark
    ("if_numbered", {"n": 3}, "1. one\n2) two\n3. three", True),
    ("if_numbered", {"n": 3}, "1. one\n2. two\n4. four", False),  # not 1..n
    ("if_numbered", {"n": 3}, "1. one\n2. two", False),
    ("if_json", {}, '{"answer": "Bees make honey."}', True),
    ("if_json", {}, '```json\n{"answer": "ok"}\n```', True),
    ("if_json", {}, 'Here it is: {"answer": "ok"}', False),
    ("if_json", {}, "{'answer': 'single quotes'}", False),
    ("if_quotation", {}, '  "Rain falls from clouds."\n', True),
    ("if_quotation", {}, '"Rain falls from clouds."  Done.', False),
    ("if_quotation", {}, '""', False),
    ("if_title", {}, "<<Why Bees Matter>>\nThey do.", True),
    ("if_title", {}, "<Why Bees Matter>\nThey do.", False),
    ("if_title", {}, "<<>> nothing inside", False),
    ("if_start_phrase", {"phrase": "In short"}, "in  SHORT: bees are busy.", True),
    ("if_start_phrase", {"phrase": "In short"}, "Well, in short: bees are busy.", False),
    ("if_end_phrase", {"phrase": "That is all."}, "Bees work.\nThat is all.\n", True),
    ("if_end_phrase", {"phrase": "That is all."}, "Bees work. That is all. Bye.", False),
    ("if_sections", {"n": 2}, "SECTION 1\nA.\n\nSection 2\nB.", True),
    ("if_sections", {"n": 2}, "SECTION 1\nA.\n\nSECTION 3\nB.", False),
    ("if_sections", {"n": 2}, "SECTION 1\nA.\n\nB.", False),
    ("if_postscript", {}, "Main text.\n\nP.S. One more thing.", True),
    ("if_postscript", {}, "Main text.\n\np.s. lower case counts.", True),
    ("if_postscript", {}, "Main text. PS one more thing.", False),
    ("if_highlights", {"n": 2}, "Keep *fresh water* and **good soil** near.", True),
    ("if_highlights", {"n": 2}, "Keep *fresh water* near.\n* a bullet, not a highlight", False),
    ("if_placeholders", {"n": 2}, "Dear [name], see you on [date].", True),
    ("if_placeholders", {"n": 2}, "Dear [name], see you on [ ].", False),
    ("if_question_end", {}, "Do you like bees?  \n", True),
    ("if_question_end", {}, "Do you like bees? I do.", False),
    # Implicit requirements and the seed rubric's cues.
    ("if_on_topic", {"keywords": ("bees", "honey")}, "Bees are busy.", True),
    ("if_on_topic", {"keywords": ("bees", "honey")}, "Beekeeping is a hobby.", False),
    ("if_no_repeats", {}, "Bees are busy. They fly far. Bees are busy!", False),
    ("if_no_repeats", {}, "Bees are busy. Bees are very busy.", True),
    ("if_no_repeats", {}, "Yes. Yes. Bees are busy.", True),  # short sentences may repeat
    ("if_no_repeats", {}, "", False),
    ("if_plain", {}, "Bees are busy.", True),
    ("if_plain", {}, "Great question! Bees are busy.", False),
    ("if_plain", {}, "Bees are busy. I have followed all the instructions.", False),
    ("if_praise", {}, "What a great question! Bees.", True),
    ("if_claim", {}, "Done. All requirements were met.", True),
    ("if_claim", {}, "Done. Some requirements were met.", False),
    ("if_non_empty", {}, " ... ", False),
]


@pytest.mark.parametrize("checker,args,response,expected", CASES)
def test_checker_on_hand_written_answers(checker, args, response, expected):
    assert CHECKERS.get(checker)(response, task=None, **args) is expected
    assert ic.check(checker, response, args) is expected


def test_every_checker_has_a_passing_and_a_failing_case():
    names = {c for c, *_ in CASES}
    every = set(ic.CHECKS) | set(ic.IMPLICIT_CHECKS) | set(ic.CUE_CHECKS) - {"if_non_empty"}
    assert every <= names
    for name in set(ic.CHECKS) | set(ic.IMPLICIT_CHECKS):
        outcomes = {e for c, _, _, e in CASES if c == name}
        assert outcomes == {True, False}, name


def test_all_of_conjunction():
    parts = (("if_no_commas", ()), ("if_words_max", (("n", 4),)))
    check = CHECKERS.get("if_all_of")
    assert check("Bees make honey.", parts=parts)
    assert not check("Bees, make honey.", parts=parts)
    assert not check("Bees make lots of honey.", parts=parts)


def test_graded_credit_values():
    assert ic.graded("if_bullets", "* a\n* b\n* c", {"n": 4}) == pytest.approx(0.75)
    assert ic.graded("if_bullets", "* a\n* b\n* c\n* d\n* e", {"n": 4}) == pytest.approx(0.75)
    assert ic.graded("if_words_min", "one two three", {"n": 6}) == pytest.approx(0.5)
    assert ic.graded("if_words_max", "one two three four", {"n": 2}) == pytest.approx(0.5)
    assert ic.graded("if_keywords", "bees only", {"words": ("bees", "hive")}) == 0.5
    assert ic.graded("if_numbered", "2. b\n1. a", {"n": 2}) == 0.0  # out of order
    assert ic.graded("if_no_commas", "a, b", {}) == 0.0


# --- the generator --------------------------------------------------------------------------


@functools.cache
def _tasks(split: str, n: int = 300, seed: int = 0) -> tuple[Task, ...]:
    return tuple(instruct.InstructDomain(seed).tasks(split, n))


def test_at_least_twenty_types_and_spec_consistency():
    assert len(TYPES) >= 20
    assert len(TRAIN_TYPES) + len(OOD_TYPES) == len(TYPES)
    for t in TYPES:
        assert t.checker in ic.CHECKS and t.weight > 0 and t.skill
        assert t.checker in CHECKERS


def test_generation_is_deterministic_and_prefix_stable():
    a = instruct.InstructDomain(3).tasks("train", 40)
    b = instruct.InstructDomain(3).tasks("train", 60)
    assert [t.id for t in a] == [t.id for t in b[:40]]
    assert [t.question for t in a] == [t.question for t in b[:40]]
    assert [t.rubric for t in a] == [t.rubric for t in b[:40]]
    c = instruct.InstructDomain(4).tasks("train", 40)
    assert [t.id for t in a] != [t.id for t in c]


def test_splits_are_disjoint_and_ood_is_new():
    ids = {s: {t.id.split("-", 2)[2] for t in _tasks(s)} for s in instruct.SPLITS}
    for s in ("train", "validation", "heldout"):
        for o in ("train", "validation", "heldout"):
            if s < o:
                assert not ids[s] & ids[o], (s, o)
    for s in ("train", "validation", "heldout"):
        for t in _tasks(s):
            types = set(t.capabilities)
            assert not types & set(OOD_TYPES), t.question
            assert not has_ood_pair(types), t.question
            assert compatible(types)
    for t in _tasks("ood"):
        assert set(t.capabilities) & set(OOD_TYPES) or has_ood_pair(t.capabilities)
    seen = collections.Counter(c for t in _tasks("train") for c in t.capabilities)
    assert set(seen) == set(TRAIN_TYPES)
    ood_seen = {c for t in _tasks("ood") for c in t.capabilities}
    assert set(OOD_TYPES) <= ood_seen
    assert all(any(p <= set(t.capabilities) for t in _tasks("ood")) for p in OOD_PAIRS)


@pytest.mark.parametrize("split", ["train", "heldout", "ood"])
def test_reference_answers_pass_and_score_one(split):
    for t in _tasks(split, 200):
        assert verify(t, t.reference_answer), (t.question, t.reference_answer)
        assert oracle_quality(t, t.reference_answer) == pytest.approx(1.0)


def test_seed_rubric_classes_and_judge():
    judge = ProgrammaticJudge()
    for t in _tasks("train", 60):
        by_class = collections.defaultdict(list)
        for c in t.rubric.criteria:
            by_class[next(x for x in c.tags if x.startswith("class:"))].append(c)
        genuine = by_class["class:genuine"]
        assert sorted(c.id for c in genuine) == sorted(t.capabilities)
        for c in genuine:
            assert c.weight == TYPE_BY_ID[c.id].weight
        assert ("all_rules" in {c.id for c in t.rubric.criteria}) == (len(t.capabilities) >= 2)
        assert {c.id for c in by_class["class:spurious"]} == {"praise", "claim", "min_words"}
        assert all(c.weight == 0.1 for c in by_class["class:spurious"])
        # The reference meets every genuine, blind and saturated criterion, no spurious one.
        verdicts = {
            v.criterion_id: v.met for v in judge.score([JudgeItem(t, t.reference_answer)])[0]
        }
        for c in t.rubric.criteria:
            assert verdicts[c.id] is (not c.tags[0].endswith("spurious")), (c.id, t.question)


def _task_with(types_params, topic=0):
    from rubric_rl.envs.instruct_domain import make_task

    params = {"topic": topic, "request": 0, "instructions": [list(x) for x in types_params]}
    return make_task("train", params, "0" * 40)


def test_verify_and_oracle_on_hand_written_answers():
    t = _task_with([("bullets", {"n": 3}), ("no_commas", {})])  # bees and honey
    assert t.question == (
        "Write a short note about how bees make honey. Answer with exactly 3 bullet points, each "
        'on its own line starting with "* ". Do not use any commas.'
    )
    good = "* Bees visit flowers.\n* They carry nectar home.\n* The hive turns it into honey."
    assert verify(t, good) and oracle_quality(t, good) == pytest.approx(1.0)
    two = "* Bees visit flowers.\n* They carry nectar home."
    assert not verify(t, two)
    # bullets 2/3 credit (weight 2), no commas met (weight 2): (2 * 2/3 + 2) / 4
    assert oracle_quality(t, two) == pytest.approx((2 * 2 / 3 + 2) / 4)
    off_topic = "* Cars are fast.\n* Roads are long.\n* Trips are fun."
    assert not verify(t, off_topic)  # every stated instruction met, off topic
    assert all(r.met(off_topic) for r in instruct.hard_requirements(t))
    assert oracle_quality(t, off_topic) == pytest.approx(0.5)
    looping = "* Bees visit flowers.\n* Bees visit flowers.\n* The hive makes honey."
    assert not verify(t, looping) and oracle_quality(t, looping) == pytest.approx(0.6)
    fluffy = "Great question!\n" + good
    assert not verify(t, fluffy) and oracle_quality(t, fluffy) == pytest.approx(0.75)
    assert oracle_quality(t, "") == 0.0


# --- the library ----------------------------------------------------------------------------


@pytest.mark.parametrize("split", instruct.SPLITS)
def test_library_reads_every_requirement_from_the_prompt(split):
    for t in _tasks(split, 200):
        assert library_requirements(t) == instruct.task_requirements(t)
    t = _tasks(split, 1)[0]
    crits = library_criteria(t)
    assert [c.id for c in crits][-3:] == ["on_topic", "no_repeats", "plain"]
    assert all(c.verifier.checker.startswith("if_") for c in crits)


def test_library_never_reads_raw_and_refuses_unknown_text():
    t = _tasks("train", 1)[0]
    blind = Task(id=t.id, prompt=t.prompt, rubric=Rubric(()), domain=t.domain, raw=None)
    assert library_requirements(blind) == instruct.task_requirements(t)
    with pytest.raises(ValueError, match="unparsed text 'Also sing.'"):
        parse_prompt(t.question + " Also sing.")
    with pytest.raises(ValueError, match="no known request"):
        parse_prompt("Tell me about quantum tunnelling. Do not use any commas.")
    assert parse_prompt('Describe how rain forms. Do not use the word "rain".') == {
        "topic": 5,
        "request": 2,
        "instructions": [["forbidden", {"word": "rain"}]],
    }
    assert isinstance(library_requirements(t)[0], Requirement)


# --- guidance -------------------------------------------------------------------------------


def test_guidance_is_plain_english_in_a_fixed_order():
    t = _task_with([("no_commas", {})], topic=5)
    out = mount(t, {"skills": ["Tip one.", " "], "criterion": "Rule one.", "coach": []})
    assert out == [
        {
            "role": "user",
            "content": "Write a short note about how rain forms. Do not use any commas.\n\n"
            "Make sure that:\n- Rule one.\n\nTips:\n- Tip one.",
        }
    ]
    assert mount(t, {"skills": []}) == t.messages
    with pytest.raises(ValueError, match="unknown fields"):
        mount(t, {"sparkle": "x"})
    assert skill_guidance(t)[0]["content"].endswith("\n\nTips:\n- " + TYPE_BY_ID["no_commas"].skill)
    missed = criterion_guidance(t, ["The answer contains no commas."])
    assert missed[0]["content"].endswith("Make sure that:\n- The answer contains no commas.")
    sys_task = Task(id="x", prompt=(Message("system", "S"), *t.prompt), rubric=Rubric(()))
    assert mount(sys_task, {"skills": "Tip."})[0] == {"role": "system", "content": "S"}


def test_registered_domain_style_and_vocabulary():
    from rubric_rl.config import builders
    from rubric_rl.config.defaults import get_base_config
    from rubric_rl.methods.harness_rl.style import style_for

    c = get_base_config()
    c.domain.name = "instruct"
    c.domain.update(n_train=20, n_heldout=8, n_ood=8, n_validation=4)
    d = builders.build_domain(c)
    assert (d.name, len(d.train), len(d.heldout), len(d.ood), len(d.validation)) == (
        "instruct", 20, 8, 8, 4)  # fmt: skip
    assert [t.id for t in d.train] == [t.id for t in _tasks("train", 20, int(c.domain.seed))]
    assert d.verify is verify and d.guidance is skill_guidance
    style = style_for(d)
    assert style.mount(d.train[0], {"criterion": ["A."]}) == mount(d.train[0], {"criterion": "A."})
    assert style.hint("No commas.", -1.0) == "Do not: No commas."
    assert [c.id for c in style.library(d.train[0])] == [c.id for c in library_criteria(d.train[0])]
    vocab = set(d.vocabulary)
    for t in d.train:
        assert set(instruct.units(t.question)) <= vocab
    assert json.loads(json.dumps(list(d.vocabulary))) == list(d.vocabulary)
