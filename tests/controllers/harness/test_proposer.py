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
    blind_targets,
    criterion_state,
    expected_gain,
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
    other = next(x.id for x in TASK.rubric.criteria if x.weight > 0 and x.id != "praise")
    c = crits(anchor_ids={"praise", other})
    cand = PROP.propose(ctx(c), att({"praise": "spurious"}))["rubric"]
    (op,) = cand.rubric
    assert op.op == "reweight" and op.weight == c[[x.id for x in c].index("praise")].weight / 2
    # Beside another anchor, the halving survives the Λ rescale (the anchors' share is fixed,
    # their proportions are not): praise's weight falls in the rescaled rubric.
    share = sum(x.weight for x in c if x.anchor) / sum(x.weight for x in c if x.weight > 0)
    before = apply_ops(c, (), step=1, total=100.0, anchor_share=share)
    after = apply_ops(c, cand.rubric, step=1, total=100.0, anchor_share=share)
    w = {x.id: x.weight for x in before}
    w2 = {x.id: x.weight for x in after}
    assert w2["praise"] < 0.6 * w["praise"]


def test_a_tasks_only_positive_anchor_is_not_halved_into_a_noop():
    # The rescale would give a lone positive anchor its share of Λ back: halving it is a no-op
    # (numpy: its weight after the op equals its weight before), so no rubric op is proposed.
    c = crits(anchor_ids={"praise"})
    share = next(x.weight for x in c if x.id == "praise") / sum(x.weight for x in c if x.weight > 0)
    half = tuple(x.replace(weight=x.weight / 2) if x.id == "praise" else x for x in c)
    from rubric_rl.methods.harness_rl.rubric_ops import rescale

    np_w = [x.weight for x in rescale(c, total=100.0, anchor_share=share)]
    assert [x.weight for x in rescale(half, total=100.0, anchor_share=share)] == np_w
    assert PROP.propose(ctx(c), att({"praise": "spurious"}))["rubric"] is None


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


def blind_att(rates):
    """Blind labels with the given (satisfied rate, confidence) per criterion id."""
    return TaskAttribution(
        TASK.id,
        tuple(CriterionLabel(cid, "blind", conf, rate, "") for cid, (rate, conf) in rates.items()),
        0.3,
        False,
    )


def test_blind_targets_by_expected_gain_then_rarity_never_by_id():
    c = crits()
    w = {x.id: x.weight for x in c}
    # count (2.0) and all_rules (2.0) tie on weight; order (1.0) is lighter; category (3.0) the
    # heaviest but half its group already meets it: gain 1.5.
    rates = {"order": (0.0, 0.5), "count": (0.0, 0.5), "all_rules": (0.0, 0.75),
             "category": (0.5, 0.5)}  # fmt: skip
    got = [lab.criterion_id for lab in blind_targets(blind_att(rates), c)]
    gains = {k: expected_gain(w[k], r) for k, (r, _) in rates.items()}
    assert gains == {"order": 1.0, "count": 2.0, "all_rules": 2.0, "category": 1.5}
    # The tie at 2.0 goes to the rarer (longer blind: higher confidence), not to the id order.
    assert got == ["all_rules", "count", "category", "order"]
    cand = PROP.propose(ctx(c), blind_att(rates))["rollout"]
    assert cand.target == "all_rules"


def test_no_measurement_is_spent_on_a_target_below_the_band():
    c = crits()
    rates = {x.id: (0.0, 0.5) for x in c if x.weight > 0}
    # After the Λ rescale (total 100) a criterion's weight is its points; the band's lower bound
    # 20 leaves only the targets that could move the group by 20 points.
    scaled = apply_ops(c, (), step=1, total=100.0, anchor_share=0.0)
    ok = {x.id for x in scaled if x.weight >= 20.0}
    assert ok and len(ok) < len(rates)
    seen = set()
    rejected: set = set()
    for _ in range(30):  # the proposer's successive proposals as each is rejected
        cand = PROP.propose(
            ctx(scaled, min_points=20.0, rejected=frozenset(rejected)), blind_att(rates)
        )["rollout"]
        if cand is None:
            break
        seen.add(cand.target)
        rejected |= {(g.field, cand.target) for g in cand.guidance}
    assert seen == ok


def test_a_field_that_overflows_the_prompt_is_skipped_for_the_next():
    c = crits()
    target = next(x for x in c if x.id == "count")
    # The <criterion> hint does not fit; the next field (<critique>, no donor for <reference>)
    # is proposed instead; when nothing fits, no candidate.
    fits_short = lambda fields: len(fields.get("criterion", "")) == 0  # noqa: E731
    cand = PROP.propose(ctx(c, fits=fits_short), att({target.id: "blind"}))["rollout"]
    assert [g.field for g in cand.guidance] == ["critique"]
    cand = PROP.propose(ctx(c, fits=lambda f: False), att({target.id: "blind"}))["rollout"]
    assert cand is None


def test_a_blind_conjunction_is_stated_by_its_failing_parts():
    from rubric_rl.methods.harness_rl.proposer import conjunction_parts

    task = next(
        t for t in task_bank("train", n=200, seed=0)
        if any(c.id == "all_rules" for c in t.rubric.criteria)
        and any(c.weight < 0 for c in t.rubric.criteria)
    )  # fmt: skip
    c = tuple(task.rubric.criteria)
    conj = next(x for x in c if x.id == "all_rules")
    parts = {p for p in conj.verifier.kwargs["parts"]}
    # Each stated rule (the negative one through its exclusion part) is a part; cues are not.
    rules = [x for x in c if x.id != "all_rules" and ("class:genuine" in x.tags or x.weight < 0)]
    assert len(parts) == len(rules) >= 3
    none_met = {x.id: (0.0, 0.0) for x in c}
    assert {x.id for x in conjunction_parts(conj, c, none_met)} == {x.id for x in rules}
    # Reach per rule over 4 rollouts: all met but two, one of them missed by more.
    reach = {x.id: (1.0, 1.0, 1.0, 1.0) for x in c}
    a, b = rules[0].id, rules[-1].id
    reach[a], reach[b], reach["all_rules"] = (1.0, 0.0, 1.0, 1.0), (0.0, 0.0, 0.0, 1.0), (0,) * 4
    got = conjunction_parts(conj, c, reach)
    assert [x.id for x in got] == [b, a]  # least satisfied first; met parts left out
    assert conjunction_parts(rules[0], c, reach) == []  # not a conjunction
    base = dict(task=task, criteria=c, fields={}, level=0, n_levels=4, cap=3,
                responses=("a", "b", "c", "d"), satisfied=reach)  # fmt: skip
    labels = TaskAttribution(
        task.id, (CriterionLabel("all_rules", "blind", 0.5, 0.0, ""),), 0.3, False
    )
    cand = PROP.propose(ProposalContext(**base), labels)["rollout"]
    (op,) = cand.guidance
    assert cand.target == "all_rules" and op.field == "criterion"
    by_id = {x.id: x for x in c}
    want = [guidance_hint(by_id[i].text, by_id[i].weight) for i in (b, a)]
    assert op.text == " ; ".join(want)
    assert conj.text not in op.text  # its own text names no behaviour
    # A critique names the parts in the conjunction's place.
    crit = PROP._add("critique", conj, ProposalContext(**base))
    assert crit.text == format_critique(want)
