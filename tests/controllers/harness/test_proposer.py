"""The programmatic proposer: one candidate or noop per interface; anchors only reweighted;
rewrites into a library criterion that checks something new; no retry of a rejected (op,
target); no reversal of a recent update; guidance fields in order under the cap, drops once the
target leaves blind; sampling one level down."""

from rubric_rl.envs.constraint_corpus import format_critique, format_reference
from rubric_rl.envs.constraint_domain import task_bank
from rubric_rl.envs.constraint_library import library_criteria
from rubric_rl.envs.constraint_spec import guidance_hint
from rubric_rl.methods.harness_rl.attributor import CriterionLabel, TaskAttribution
from rubric_rl.methods.harness_rl.proposer import (
    ProgrammaticProposer,
    ProposalContext,
    criterion_state,
)
from rubric_rl.methods.harness_rl.rubric_ops import apply_ops, checks_the_same

TASK = next(t for t in task_bank("train", n=50, seed=0) if t.task_type == "list")
PROP = ProgrammaticProposer(
    hint=guidance_hint, reference=format_reference, critique=format_critique,
    library=library_criteria,
)  # fmt: skip


def crits(anchor_ids=()):
    return tuple(c.replace(anchor=c.id in anchor_ids) for c in TASK.rubric.criteria)


def att(labels, saturated=False):
    return TaskAttribution(
        TASK.id,
        tuple(CriterionLabel(cid, lab, 0.5, 0.5, "") for cid, lab in labels.items()),
        0.3,
        saturated,
    )


def ctx(criteria, **kw):
    base = dict(
        task=TASK, criteria=criteria, fields={}, level=0, n_levels=4, cap=3,
        responses=("a", "b"), satisfied={c.id: (1.0, 0.0) for c in criteria},
    )  # fmt: skip
    base.update(kw)
    return ProposalContext(**base)


def test_noop_everywhere_when_every_label_agrees():
    c = crits()
    out = PROP.propose(ctx(c), att({x.id: "agree" for x in c}))
    assert out == {"sampling": None, "rollout": None, "rubric": None}


def test_a_spurious_criterion_is_rewritten_into_a_missing_library_check():
    c = crits()
    out = PROP.propose(ctx(c), att({"praise": "spurious"}))
    cand = out["rubric"]
    (op,) = cand.rubric
    assert op.op == "rewrite" and op.targets == ("praise",)
    new = op.new[0]
    lib = library_criteria(TASK)
    assert any(checks_the_same(new, x) for x in lib)  # a check the prompt states or implies
    assert not any(checks_the_same(new, x) for x in c)  # that the rubric did not check
    after = apply_ops(c, cand.rubric, step=1, total=100.0, anchor_share=0.0)
    assert "praise" not in [x.id for x in after]
    # The requirement replacing a small surface cue counts like the task's other criteria.
    pos = sorted(x.weight for x in c if x.weight > 0)
    assert new.weight == pos[len(pos) // 2] > next(x for x in c if x.id == "praise").weight


def test_a_spurious_anchor_is_only_reweighted():
    c = crits(anchor_ids={"praise"})
    cand = PROP.propose(ctx(c), att({"praise": "spurious"}))["rubric"]
    (op,) = cand.rubric
    assert op.op == "reweight" and op.weight == c[[x.id for x in c].index("praise")].weight / 2


def test_rejected_ops_are_not_retried_and_reversals_are_avoided():
    c = crits()
    first = PROP.propose(ctx(c), att({"praise": "spurious"}))["rubric"].rubric[0]
    # The rewrite was rejected: the next proposal penalises the cue instead.
    second = PROP.propose(
        ctx(c, rejected=frozenset({("rewrite", "praise")})), att({"praise": "spurious"})
    )["rubric"].rubric[0]
    assert first.op == "rewrite" and second.op == "reweight" and second.weight < 0
    # A penalty that an accepted update replaced within two draws would reverse it: delete.
    praise = next(x for x in c if x.id == "praise")
    flipped = criterion_state(praise.replace(weight=-praise.weight))
    third = PROP.propose(
        ctx(
            c,
            rejected=frozenset({("rewrite", "praise")}),
            replaced={"praise": frozenset({flipped})},
        ),
        att({"praise": "spurious"}),
    )["rubric"].rubric[0]
    assert third.op == "delete"


def test_guidance_fields_in_order_under_the_cap_and_drops_when_the_target_leaves_blind():
    c = crits()
    target = next(x for x in c if x.weight > 0 and x.id not in ("praise", "claim"))
    cand = PROP.propose(ctx(c), att({target.id: "blind"}))["rollout"]
    (op,) = cand.guidance
    assert (op.op, op.field, op.target) == ("add", "criterion", target.id)
    assert op.text == guidance_hint(target.text, target.weight)
    # <criterion> mounted: <reference> needs a donor; without one, <critique>.
    fields = {"criterion": {"text": op.text, "target": target.id}}
    cand = PROP.propose(ctx(c, fields=fields), att({target.id: "blind"}))["rollout"]
    assert cand.guidance[0].field == "critique"
    donors = {target.id: ("cat / dog", "t9/count")}
    cand = PROP.propose(ctx(c, fields=fields, donors=donors), att({target.id: "blind"}))["rollout"]
    assert cand.guidance[0].field == "reference" and cand.grounded
    assert cand.guidance[0].text.startswith("good : cat / dog")
    # At the cap: nothing to add.
    assert PROP.propose(ctx(c, fields=fields, cap=1), att({target.id: "blind"}))["rollout"] is None
    # The target left blind: the field is dropped.
    cand = PROP.propose(ctx(c, fields=fields), att({target.id: "agree"}))["rollout"]
    assert cand.drop_only and cand.guidance[0].field == "criterion"


def test_sampling_lowers_one_level_and_stops_at_the_last():
    c = crits()
    labels = {x.id: "agree" for x in c}
    assert PROP.propose(ctx(c, level=1), att(labels, saturated=True))["sampling"].level == 2
    assert PROP.propose(ctx(c, level=3), att(labels, saturated=True))["sampling"] is None
    assert PROP.propose(ctx(c), att(labels, saturated=False))["sampling"] is None
    # A saturated task's rubric is tightened with a library criterion it lacks.
    rub = PROP.propose(ctx(c), att(labels, saturated=True))["rubric"]
    assert rub.rubric[0].op == "create" and rub.label == "saturated"


def test_interfaces_can_be_restricted():
    only_g = ProgrammaticProposer(
        hint=guidance_hint, reference=format_reference, critique=format_critique,
        library=library_criteria, interfaces=("rollout",),
    )  # fmt: skip
    c = crits()
    out = only_g.propose(ctx(c), att({"praise": "spurious", c[0].id: "blind"}, saturated=True))
    assert out["rubric"] is None and out["sampling"] is None and out["rollout"] is not None


def test_a_library_id_already_in_the_rubric_is_not_created_again():
    # Regression (protocol run w/o critic, seed 2, step 142): ``lib:<id>`` was created, later
    # penalised (sign flipped, so it no longer "checks the same"), and the saturated task's
    # tightening proposed creating ``lib:<id>`` again — an id clash that raised in apply_ops.
    c = crits()
    labels = {x.id: "agree" for x in c}
    first = PROP.propose(ctx(c), att(labels, saturated=True))["rubric"].rubric[0]
    assert first.op == "create"
    c1 = apply_ops(c, (first,), step=1, total=100.0, anchor_share=0.0)
    made = first.new[0].id
    penalised = tuple(x.replace(weight=-abs(x.weight)) if x.id == made else x for x in c1)
    again = PROP.propose(ctx(penalised), att({x.id: "agree" for x in penalised}, saturated=True))
    ops = again["rubric"].rubric if again["rubric"] is not None else ()
    assert all(n.id != made for op in ops for n in op.new)
    # Whatever it proposes now applies.
    apply_ops(penalised, ops, step=2, total=100.0, anchor_share=0.0)
