"""HarnessRL's rubric operations: anchors may only be reweighted, positive weights rescale to Λ
with anchors at a fixed share, and rewrite / merge / split change what is checked."""

import numpy as np
import pytest

from rubric_rl.methods.harness_rl.rubric_ops import (
    AnchorError,
    RubricOp,
    anchor_share_of,
    apply_ops,
    checks_the_same,
    rescale,
)
from rubric_rl.rubrics.rewards import weighted_reward
from rubric_rl.rubrics.types import Criterion, Verifier


def rule(cid, checker, weight=1.0, anchor=False, **args):
    return Criterion(cid, f"{cid} text", weight, verifier=Verifier.rule(checker, **args),
                     anchor=anchor)  # fmt: skip


SEED = (
    rule("count", "cf_item_count", 2.0, anchor=True, n=5),
    rule("sep", "cf_separator", 1.0, anchor=True, sep="/"),
    rule("praise", "cf_opens_with_praise", 0.1),
    rule("min_words", "cf_min_words", 0.1, n=9),
    rule("pitfall", "cf_includes_word", -1.0, word="cat"),
)


def _positive(crits, anchor=None):
    return sum(c.weight for c in crits if c.weight > 0 and (anchor is None or c.anchor == anchor))


def apply(ops, crits=SEED, share=None):
    share = anchor_share_of(crits) if share is None else share
    return apply_ops(crits, ops, step=7, total=100.0, anchor_share=share)


def test_rescale_to_lambda_with_the_anchor_share_held_and_pitfalls_scaled_with_their_side():
    share = anchor_share_of(SEED)
    assert share == pytest.approx(3.0 / 3.2)
    out = rescale(SEED, total=100.0, anchor_share=share)
    assert _positive(out) == pytest.approx(100.0)
    assert _positive(out, anchor=True) == pytest.approx(100.0 * share)
    w = {c.id: c.weight for c in out}
    assert w["count"] / w["sep"] == pytest.approx(2.0)  # proportions within a side kept
    f_other = (100.0 * (1 - share)) / 0.2
    assert w["praise"] == pytest.approx(0.1 * f_other)
    assert w["pitfall"] == pytest.approx(-1.0 * f_other)  # a non-anchor pitfall: non-anchor factor
    # The reward is scale-free: rescaling never changes r; Λ·r is in points.
    verdicts = {"count": True, "sep": False, "praise": True, "min_words": False, "pitfall": True}
    assert weighted_reward(out, verdicts).value == pytest.approx(
        weighted_reward(SEED, verdicts).value
    )
    with pytest.raises(ValueError, match="no positive criterion"):
        rescale([rule("p", "cf_includes_word", -1.0, word="x")], total=100, anchor_share=0)


def test_one_sided_rubrics_give_all_of_lambda_to_the_side_that_has_positives():
    only_anchors = tuple(c for c in SEED if c.anchor)
    out = rescale(only_anchors, total=100.0, anchor_share=0.3)
    assert _positive(out) == pytest.approx(100.0)
    no_anchors = tuple(c.replace(anchor=False) for c in SEED)
    out = rescale(no_anchors, total=100.0, anchor_share=0.9)
    assert _positive(out) == pytest.approx(100.0)


def test_anchors_may_only_be_reweighted():
    for op in (
        RubricOp("delete", ("count",)),
        RubricOp("rewrite", ("count",), (rule("count2", "cf_item_count", 2.0, n=4),)),
        RubricOp("merge", ("count", "praise"), (rule("m", "cf_numbered"),)),
        RubricOp("split", ("sep",), (rule("a", "cf_numbered"), rule("b", "cf_sorted"))),
    ):
        with pytest.raises(AnchorError, match="anchor criterion"):
            apply([op])
    out = apply([RubricOp("reweight", ("count",), weight=5.0)])
    w = {c.id: c.weight for c in out}
    share = anchor_share_of(SEED)
    # count 5 : sep 1 within the anchors' fixed share.
    assert w["count"] == pytest.approx(100 * share * 5 / 6)
    assert _positive(out, anchor=True) == pytest.approx(100 * share)
    with pytest.raises(AnchorError, match="cannot be an anchor"):
        apply([RubricOp("create", (), (rule("new", "cf_numbered", anchor=True),))])


def test_rewrite_must_change_the_checker_and_keeps_the_position():
    same = rule("min_words2", "cf_min_words", 0.1, n=9)  # new text and id, same check
    with pytest.raises(ValueError, match="checks the same thing"):
        apply([RubricOp("rewrite", ("min_words",), (same,))])
    new = rule("plain", "cf_plain", 0.1)
    out = apply([RubricOp("rewrite", ("min_words",), (new,))])
    assert [c.id for c in out] == ["count", "sep", "praise", "plain", "pitfall"]
    got = out[3]
    assert got.verifier.checker == "cf_plain" and got.origin == "rewrite"
    assert got.parent_id == "min_words" and got.created_step == 7
    assert _positive(out) == pytest.approx(100.0)
    # Other arguments are another check; the same checker and arguments with a flipped sign too.
    assert not checks_the_same(SEED[3], rule("x", "cf_min_words", 0.1, n=12))
    assert not checks_the_same(SEED[3], rule("x", "cf_min_words", -0.1, n=9))


def test_create_delete_merge_split_and_their_errors():
    created = apply([RubricOp("create", (), (rule("distinct", "cf_distinct", 1.0),))])
    assert created[-1].id == "distinct" and created[-1].origin == "create"
    deleted = apply([RubricOp("delete", ("praise",))])
    assert "praise" not in [c.id for c in deleted]
    both = rule(
        "both",
        "cf_all_of",
        0.2,
        parts=(("cf_opens_with_praise", ()), ("cf_min_words", (("n", 9),))),
    )
    merged = apply([RubricOp("merge", ("praise", "min_words"), (both,))])
    assert [c.id for c in merged] == ["count", "sep", "both", "pitfall"]
    parts = (rule("p1", "cf_opens_with_praise", 0.1), rule("p2", "cf_min_words", 0.1, n=9))
    split = apply([RubricOp("split", ("both",), parts)], crits=merged)
    assert [c.id for c in split] == ["count", "sep", "p1", "p2", "pitfall"]
    assert all(_positive(x) == pytest.approx(100.0) for x in (created, deleted, merged, split))
    with pytest.raises(KeyError, match="no criterion 'nope'"):
        apply([RubricOp("delete", ("nope",))])
    with pytest.raises(ValueError, match=r"ids \['sep'\] already"):
        apply([RubricOp("create", (), (rule("sep", "cf_numbered"),))])
    with pytest.raises(ValueError, match="weight must be non-zero"):
        RubricOp("reweight", ("count",), weight=0.0)
    with pytest.raises(ValueError, match="2 targets"):
        RubricOp("rewrite", ("a", "b"), (rule("c", "cf_numbered"),))
    with pytest.raises(ValueError, match="expected one of"):
        RubricOp("tighten", ("a",))


def test_ops_compose_in_order_and_the_result_is_rescaled_once():
    rng = np.random.default_rng(0)
    crits = SEED
    for step in range(20):
        others = [c for c in crits if not c.anchor]
        op = RubricOp("reweight", (others[rng.integers(len(others))].id,),
                      weight=float(rng.choice([-1, 1]) * rng.uniform(0.1, 5)))  # fmt: skip
        crits = apply_ops(crits, [op], step=step, total=100.0, anchor_share=anchor_share_of(SEED))
        if _positive(crits, anchor=False) > 0:
            assert _positive(crits, anchor=True) == pytest.approx(100 * anchor_share_of(SEED))
        assert _positive(crits) == pytest.approx(100.0)
