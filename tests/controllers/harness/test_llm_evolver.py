"""HarnessRL's LLM attributor and proposer (harness/llm.py) through a LocalEngineClient: valid
replies become labels and candidates; every kind of invalid reply is rejected whole; and the
controller records a failed attribution as a failure (no labels, no candidates), never a
default label."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from configs import harness_rl
from rubric_rl.checks.controller_check import ScriptedPolicy, scripted_run
from rubric_rl.config.builders import build_domain
from rubric_rl.controllers.base import ControllerSet
from rubric_rl.methods.harness_rl.attributor import CriterionLabel, TaskAttribution
from rubric_rl.methods.harness_rl.builder import make_harness_controller
from rubric_rl.methods.harness_rl.llm_evolver import LLMAttributor, LLMEvolverError, LLMProposer
from rubric_rl.methods.harness_rl.proposer import ProposalContext
from rubric_rl.rubrics.llm import LocalEngineClient
from rubric_rl.rubrics.types import Criterion, Rubric, Task, Verifier

RESPONSES = ("great question ! cat dog", "cat dog cow", "cow")
IDS = ("count", "praise", "start")
TEXTS = ("the response lists exactly 2 items", "the response opens by praising the question",
         "the response starts with the word cat")  # fmt: skip
MET = np.array([[1, 0, 0], [1, 0, 0], [0, 1, 0]], float)


def client(reply):
    """A client answering every request with ``reply(messages)`` (a str, or an exception)."""
    seen = []

    def fn(messages, params):
        seen.append((messages, params))
        out = reply(messages)
        if isinstance(out, Exception):
            raise out
        return out

    c = LocalEngineClient(fn)
    c.seen = seen
    return c


def label(cid, lab="agree", **kw):
    return {"id": cid, "label": lab, "hacks": [], "quotes": [], "wording": None,
            "reason": "r", **kw}  # fmt: skip


def attribute(att, **kw):
    return att.attribute("t1", IDS, (2.0, 0.1, 1.0), TEXTS, MET, RESPONSES, **kw)


def test_a_valid_attribution_becomes_labels_with_computed_confidence_and_sides():
    reply = {
        "labels": [
            label("count"),
            label("praise", "spurious", hacks=["superficial_compliance"],
                  quotes=["great question !", "cat dog cow"], wording="praising the question"),
            label("start", "blind"),
        ],
        "task_saturated": False,
    }  # fmt: skip
    att = LLMAttributor(client(lambda m: json.dumps(reply)))
    out = attribute(att, past_labels=[{"praise": "agree"}, {"praise": "spurious"}])
    by = {c.criterion_id: c for c in out.labels}
    assert [by[c].label for c in IDS] == ["agree", "spurious", "blind"]
    # held for this group and the previous one: k = 2 -> 1 - 2^-2
    assert by["praise"].confidence == pytest.approx(0.75)
    assert by["count"].confidence == pytest.approx(0.5)
    # the side of a quote comes from the verdicts, not from the model
    assert by["praise"].evidence == ("+ great question !", "- cat dog cow")
    assert by["praise"].wording == "praising the question"
    assert by["praise"].satisfied_rate == pytest.approx(1 / 3)
    assert att.stats() == {"calls": 1, "accepted": 1, "rejected": 0}
    # The prompt shows what was computed: satisfied counts per criterion and the rollouts.
    user = att.client.seen[0][0][1]["content"]
    assert "id=praise weight=0.1 satisfied now=1/3" in user and '[2] "cow"' in user


@pytest.mark.parametrize(
    "reply,why",
    [
        ("not json", "not JSON"),
        ({"labels": [label("count"), label("praise")], "task_saturated": False}, "not labelled"),
        ({"labels": [label("count"), label("count"), label("praise"), label("start")],
          "task_saturated": False}, "twice"),
        ({"labels": [label("count", "great"), label("praise"), label("start")],
          "task_saturated": False}, "label 'great'"),
        ({"labels": [label("count", quotes=["a horse"]), label("praise"), label("start")],
          "task_saturated": False}, "not in a rollout"),
        ({"labels": [label("count", wording="detailed"), label("praise"), label("start")],
          "task_saturated": False}, "not in the criterion"),
        ({"labels": [label("count", hacks=["flattery"]), label("praise"), label("start")],
          "task_saturated": False}, "hacks"),
        ({"labels": [label("count"), label("praise"), label("start")]}, "task_saturated"),
    ],
)  # fmt: skip
def test_an_invalid_attribution_is_rejected_whole(reply, why):
    text = reply if isinstance(reply, str) else json.dumps(reply)
    att = LLMAttributor(client(lambda m: text))
    with pytest.raises(LLMEvolverError, match=why):
        attribute(att)
    assert att.stats() == {"calls": 1, "accepted": 0, "rejected": 1}


def test_a_client_error_is_a_failure_not_a_label():
    att = LLMAttributor(client(lambda m: RuntimeError("down")))
    with pytest.raises(LLMEvolverError, match="client error"):
        attribute(att)


def crit(cid, w=1.0, anchor=False, text=None):
    return Criterion(id=cid, text=text or f"text of {cid}", weight=w,
                     verifier=Verifier.rule("cf_non_empty"), anchor=anchor)  # fmt: skip


TASK = Task(id="t1", prompt=({"role": "user", "content": "q"},), rubric=Rubric((crit("a"),)))
CRITS = (crit("anc", 50.0, anchor=True), crit("sp", 30.0), crit("bl", 20.0))


def context(**kw):
    base = dict(
        task=TASK, criteria=CRITS, fields={"critique": {"text": "x", "target": "bl"}}, level=0,
        n_levels=4, cap=2, responses=RESPONSES, satisfied={},
        donors={"bl": ("cat dog cow", "t9/bl")},
    )  # fmt: skip
    return ProposalContext(**{**base, **kw})


ATT = TaskAttribution(
    "t1",
    tuple(
        CriterionLabel(c, lab, 0.5, 0.5, "")
        for c, lab in (("anc", "agree"), ("sp", "spurious"), ("bl", "blind"))
    ),  # fmt: skip
    0.3,
    True,
)


def propose(reply, **kw):
    ctx = kw.pop("ctx", context())
    p = LLMProposer(client(lambda m: json.dumps(reply)), **kw)
    return p, p.propose(ctx, ATT)


def test_valid_proposals_become_candidates():
    reply = {
        "sampling": {"level": 1},
        "rollout": {"ops": [{"op": "drop", "field": "critique"},
                            {"op": "add", "field": "reference", "target": "bl",
                             "text": "a good answer : cat dog cow"}]},
        "rubric": {"ops": [{"op": "rewrite", "targets": ["sp"],
                            "new": [{"id": "sp2", "text": "the items are animals", "weight": 30}]},
                           {"op": "reweight", "targets": ["anc"], "weight": 25.0}]},
    }  # fmt: skip
    p, out = propose(reply)
    assert out["sampling"].level == 1
    r = out["rollout"]
    assert [(g.op, g.field) for g in r.guidance] == [("drop", "critique"), ("add", "reference")]
    assert r.grounded and r.guidance[1].donor == "t9/bl" and r.label == "blind"
    c = out["rubric"]
    assert [o.op for o in c.rubric] == ["rewrite", "reweight"] and c.label == "spurious"
    new = c.rubric[0].new[0]
    assert (new.id, new.verifier.kind.value, new.parent_id) == ("llm:sp2", "llm", "sp")
    assert p.stats()["accepted"] == 1


@pytest.mark.parametrize(
    "reply,kw",
    [
        ({"rubric": {"ops": [{"op": "delete", "targets": ["anc"]}]}}, {}),  # anchors: reweight
        ({"rollout": {"ops": [{"op": "add", "field": "reference", "target": "bl",
                               "text": "the hidden reference"}]}}, {}),  # no donor quoted
        ({"rollout": {"ops": [{"op": "add", "field": "criterion", "target": "bl",
                               "text": "t"}, {"op": "add", "field": "reference", "target": "bl",
                               "text": "cat dog cow"}]}}, {}),  # 3 fields over the cap of 2
        ({"rollout": {"ops": [{"op": "add", "field": "criterion", "target": "bl",
                               "text": "t"}]}},
         {"ctx": context(rejected=frozenset({("criterion", "bl")}))}),  # retried after rejection
        ({"sampling": {"level": 0}}, {}),  # not a move
        ({"sampling": {"level": 1}}, {"interfaces": ("rubric",)}),  # interface not open
        ({"rubric": {"ops": [{"op": "reweight", "targets": ["sp"], "weight": 0}]}}, {}),
        ({"rubric": {"ops": [{"op": "rewrite", "targets": ["nope"],
                              "new": [{"text": "x", "weight": 1}]}]}}, {}),  # unknown target
    ],
)  # fmt: skip
def test_invalid_proposals_are_rejected_whole(reply, kw):
    full = {"sampling": None, "rollout": None, "rubric": None, **reply}
    if "sampling" not in reply:  # a valid part next to the invalid one is not used either
        full["sampling"] = {"level": 2}
    p, out = propose(full, **kw)
    assert out == {"sampling": None, "rollout": None, "rubric": None}
    assert p.stats() == {"calls": 1, "accepted": 0, "rejected": 1}


def _smoke_config():
    c = harness_rl.get_config("smoke")
    c.unlock()
    c.rollout.update(tasks_per_step=8, samples_per_task=8)
    c.domain.n_train = 32
    c.train.steps = 40
    c.harness.evolver = "llm"
    c.lock()
    return c


def test_the_controller_runs_on_llm_replies_and_records_failures(tmp_path):
    """The real stages, judge and memory on the scripted policy, with the LLM evolver: every
    criterion labelled by the model's reply, a blind criterion's <criterion> field proposed and
    measured by the critic; one task's attribution reply is invalid on each step — that task
    gets no labels and no candidates, counted and logged."""
    pytest.importorskip("chromadb")
    calls = {"bad": 0}

    def reply(messages):
        system, user = messages[0]["content"], messages[1]["content"]
        ids = re.findall(r"^- id=(\S+) weight=(\S+) satisfied now=(\d+)/(\d+)", user, re.M)
        if "Label every criterion" in system:
            if calls["bad"] == 0 or "sequence" in user:  # the first call, and rewrite tasks
                calls["bad"] += 1
                return "{not json"
            labels = [label(i, "blind" if int(n) == 0 and float(w) > 0 else "agree")
                      for i, w, n, _ in ids]  # fmt: skip
            return json.dumps({"labels": labels, "task_saturated": False})
        blind = re.findall(r"^- id=(\S+) weight=\S+ anchor=\S+ label=blind", user, re.M)
        fields = json.loads(user.split("## Guidance (cap ")[1].split("): ", 1)[1].splitlines()[0])
        if blind and "criterion" not in fields:
            op = {"op": "add", "field": "criterion", "target": blind[0], "text": "be exact"}
            return json.dumps({"sampling": None, "rollout": {"ops": [op]}, "rubric": None})
        return json.dumps({"sampling": None, "rollout": None, "rubric": None})

    c = _smoke_config()
    ctl = make_harness_controller(
        c, build_domain(c), llm_client=LocalEngineClient(lambda m, p: reply(m))
    )
    run = scripted_run(c, ScriptedPolicy(seed=0), str(tmp_path), controllers=ControllerSet(ctl))
    not_attr = proposed = 0
    for step in range(1, 4):
        _, ctx = run.step(step)
        not_attr += ctx.metrics["harness/attributor/not_attributed"]
        proposed += ctx.metrics["harness/updates/rollout/proposed"]
        events = ctl.pop_events()
        failed = {e["task_id"] for e in events if e.get("event") == "attributor_failed"}
        updated = {e["task_id"] for e in events if e.get("event") == "update"}
        assert not failed & updated
        assert all(a.task_id not in failed for a in ctl.last_attributions)
    assert not_attr >= 1 and proposed >= 1
    assert ctx.metrics["harness/llm/attributor/rejected"] == not_attr
    assert ctx.metrics["harness/llm/proposer/rejected"] == 0


def test_the_llm_evolver_needs_a_client():
    c = _smoke_config()
    with pytest.raises(ValueError, match="harness.llm.backend and harness.llm.model"):
        make_harness_controller(c, build_domain(c))
