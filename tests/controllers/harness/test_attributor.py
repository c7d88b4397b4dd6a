"""Each of the programmatic attributor's label rules, on hand-built groups."""

import math

import numpy as np
import pytest

from rubric_rl.envs.constraint_checkers import surface_features
from rubric_rl.methods.harness_rl.attributor import (
    PastGroup,
    ProgrammaticAttributor,
    RelatedEvidence,
    discriminative_mass,
    wording_phrase,
)

N = float("nan")
GOOD = "cat / dog / owl"
att = ProgrammaticAttributor(features=surface_features)


def run(ids, weights, met, responses, texts=None, **kw):
    texts = texts or [f"{i} text" for i in ids]
    return att.attribute("t1", ids, weights, texts, np.array(met, float), responses, **kw)


def label(result, cid):
    return next(c for c in result.labels if c.criterion_id == cid)


def test_reach_blind_when_never_met_agree_when_met_before():
    met = [[0, 0, 0, 0], [1, 0, 1, 0]]
    r = run(["rare", "count"], [1, 1], met, [GOOD] * 4)
    assert label(r, "rare").label == "blind" and label(r, "rare").route == "rollout"
    past = [PastGroup(3, ("rare", "count"), (1.0, 1.0), np.array([[0, 1, N, 0], [1, 1, 1, 1.0]]))]
    r = run(["rare", "count"], [1, 1], met, [GOOD] * 4, history=past)
    got = label(r, "rare")
    assert got.label == "agree" and "met at step 3" in got.reason
    # A judge failure is not a success: an earlier group met only where the judge failed is blind.
    past = [PastGroup(3, ("rare",), (1.0,), np.array([[N, 0, 0, 0]]))]
    assert (
        label(run(["rare"], [1], [[0, 0, 0, 0]], [GOOD] * 4, history=past), "rare").label == "blind"
    )


def test_a_pitfall_is_satisfied_when_its_behaviour_is_absent():
    # The bad behaviour present in every rollout: nobody satisfies the pitfall -> blind.
    r = run(["pit", "count"], [-1, 1], [[1, 1, 1, 1], [1, 0, 1, 0]], [GOOD] * 4)
    assert label(r, "pit").label == "blind"
    assert label(r, "pit").satisfied_rate == 0.0


def test_saturated_needs_every_rollout_across_the_window():
    met = [[1, 1, 1, 1], [1, 0, 1, 0]]
    first = run(["easy", "count"], [1, 1], met, [GOOD] * 4)
    assert label(first, "easy").label == "agree"  # one group is not "recent steps"
    past = [PastGroup(2, ("easy",), (1.0,), np.array([[1, 1, N, 1.0]]))]
    r = run(["easy", "count"], [1, 1], met, [GOOD] * 4, history=past)
    assert label(r, "easy").label == "saturated" and label(r, "easy").route is None
    broken = [PastGroup(2, ("easy",), (1.0,), np.array([[1, 0, 1, 1.0]]))]
    assert (
        label(run(["easy", "count"], [1, 1], met, [GOOD] * 4, history=broken), "easy").label
        == "agree"
    )
    three = ProgrammaticAttributor(type(att.config)(saturated_window=3), features=surface_features)
    assert three.attribute("t1", ["easy", "count"], [1, 1], ["a", "b"], np.array(met, float),
                           [GOOD] * 4, history=past).labels[0].label == "agree"  # fmt: skip


def test_task_saturated_when_a_criterion_is_and_its_mass_is_below_the_next_level():
    met = [[1, 1, 1, 1], [1, 1, 1, 1], [1, 0, 1, 0]]  # one of three criteria separates
    past = [PastGroup(2, ("a", "b"), (1.0, 1.0), np.ones((2, 4)))]
    r = run(["a", "b", "c"], [1, 1, 1], met, [GOOD] * 4, history=past, next_level=0.61)
    assert r.discriminative_mass == pytest.approx(1 / 3)
    assert r.task_saturated and r.routes()["sampling"] == ("t1",)
    assert not run(
        ["a", "b", "c"], [1, 1, 1], met, [GOOD] * 4, history=past, next_level=0.3
    ).task_saturated
    assert not run(
        ["a", "b", "c"], [1, 1, 1], met, [GOOD] * 4, history=past
    ).task_saturated  # lowest level
    # Without a saturated criterion a low mass is not saturation.
    assert not run(
        ["a", "c"], [1, 1], [[0, 0, 0, 0], [1, 0, 1, 0]], [GOOD] * 4, next_level=0.9
    ).task_saturated


def test_spurious_superficial_compliance_vs_a_criterion_that_tracks_quality():
    responses = [
        "great question ! cat / cat",
        "great question ! dog",
        "cat / dog / owl",
        "owl / cat / dog",
    ]
    # praise is met by the two fluffy rollouts, which meet less of the rest of the rubric.
    met = [
        [1, 1, 0, 0],  # praise (weight 0.1)
        [0, 0, 1, 1],  # count
        [0, 1, 1, 1],  # distinct
    ]
    praise = "the response opens by praising the question , like great question"
    r = run(["praise", "count", "distinct"], [0.1, 2, 1], met, responses, texts=[praise, "c", "d"])
    p = label(r, "praise")
    assert p.label == "spurious" and p.route == "rubric"
    assert "superficial_compliance" in p.hacks and "partial_coverage" in p.hacks
    assert p.wording.startswith("'praising the question'")
    assert p.evidence[0].startswith("+ great question") and p.evidence[-1].startswith("- ")
    # count separates the group, and its satisfying rollouts meet more of the rest: agree.
    assert label(r, "count").label == "agree" and label(r, "count").hacks == ()


def test_spurious_length_gaming():
    responses = ["cat dog owl hen pig cow yak", "cat dog owl hen pig cow emu", "cat dog", "owl hen"]
    met = [[1, 1, 0, 0], [1, 0, 1, 0]]  # min_words, count (independent of length)
    r = run(["min_words", "count"], [0.1, 2], met, responses,
            texts=["the response is detailed , with at least 6 words", "c"])  # fmt: skip
    got = label(r, "min_words")
    assert got.label == "spurious" and got.hacks == ("length_gaming",)
    assert got.wording.startswith("'at least 6 words'")


def test_a_separating_criterion_without_a_surface_pattern_agrees():
    responses = [GOOD, "cat / dog", GOOD, "cat / dog"]
    met = [[1, 0, 1, 0], [1, 1, 1, 1]]
    assert label(run(["count", "end"], [2, 1], met, responses), "count").label == "agree"


def test_confidence_rises_while_a_label_persists_and_related_spurious_evidence_counts():
    responses = ["great question ! cat", "great question ! dog", GOOD, GOOD]
    met = [[1, 1, 0, 0], [0, 0, 1, 1]]
    args = (["praise", "count"], [0.1, 2], met, responses)
    assert label(run(*args), "praise").confidence == 0.5
    past = [{"praise": "spurious"}, {"count": "agree"}, {"praise": "spurious"}]
    assert label(run(*args, past_labels=past), "praise").confidence == pytest.approx(0.875)
    broken = [{"praise": "spurious"}, {"praise": "agree"}]
    assert label(run(*args, past_labels=broken), "praise").confidence == 0.5
    rel = {"praise": [RelatedEvidence("t9/praise", 0.9, was_spurious=True)]}
    got = label(run(*args, related=rel), "praise")
    assert got.confidence == pytest.approx(0.75) and got.related == ("t9/praise",)


def test_judge_failures_are_no_evidence_and_generic_passes_are_flagged():
    met = [[N, N, N, N], [1, N, 0, 1], [1, 1, 1, 1]]
    r = run(["a", "b", "c"], [1, 1, 1], met, [GOOD] * 4,
            texts=["a", "b", "the response is not empty"], generic_pass={"c": True})  # fmt: skip
    assert label(r, "a").label == "agree" and math.isnan(label(r, "a").satisfied_rate)
    assert label(r, "b").satisfied_rate == pytest.approx(2 / 3)
    c = label(r, "c")
    assert c.generic_pass and c.wording.startswith("'is not empty'")
    assert label(r, "a").to_json()["satisfied_rate"] is None
    with pytest.raises(ValueError, match="task 't1'"):
        att.attribute("t1", ["a"], [1], ["a"], np.ones((2, 4)), [GOOD] * 4)


def test_discriminative_mass_and_wording_reference_cases():
    assert discriminative_mass(np.array([[1, 0, N], [1, 1, 1], [N, N, N], [0, N, 0]])) == 0.25
    assert discriminative_mass(np.zeros((0, 3))) == 0.0
    assert wording_phrase("the response says that all requirements are met")[0] == (
        "says that all requirements are met"
    )
    assert wording_phrase("the items are in alphabetical order") is None


def test_an_unmet_positive_surface_cue_is_never_blind():
    # Unmet by every rollout and never before: a requirement is blind, a surface cue (a length
    # floor, praise, a compliance claim) agrees, so no guidance steers the policy to the cue.
    texts = [
        "the items are in alphabetical order",
        "the response says that all requirements are met",
        "the response opens by praising the question , like great question",
        "the response is detailed , with at least 9 words",
        "the response meets every rule of the task at once",
    ]
    ids = ["order", "claim", "praise", "min_words", "all_rules"]
    r = run(ids, [1, 1, 1, 1, 1], [[0, 0, 0, 0]] * 5, [GOOD] * 4, texts=texts)
    got = {c.criterion_id: c.label for c in r.labels}
    assert got == {
        "order": "blind", "claim": "agree", "praise": "agree", "min_words": "agree",
        "all_rules": "blind",
    }  # fmt: skip
    assert "surface cue" in label(r, "praise").reason
    # A penalised cue (negative weight) keeps its reading: never met = its behaviour absent.
    r = run(["praise"], [-1], [[0, 0, 0, 0]], [GOOD] * 4, texts=[texts[2]])
    assert label(r, "praise").label != "blind"
