"""The rubric value types: validation, immutability, derived properties."""

import dataclasses

import pytest

from rubric_rl.rubrics.types import (
    Criterion,
    CriterionStatus,
    Message,
    Polarity,
    Rubric,
    Task,
    Verdict,
    Verifier,
    VerifierKind,
    messages_from,
    verdict_failed,
)


def test_criterion_weight_polarity_and_validation():
    assert Criterion("a", "t", weight=2).weight == 2.0
    assert Criterion("a", "t", weight=2).polarity == Polarity.POSITIVE
    assert Criterion("a", "t", weight=-0.5).polarity == Polarity.PITFALL
    for bad in (0, 0.0, float("nan")):
        with pytest.raises(ValueError, match="weight must be non-zero"):
            Criterion("a", "t", weight=bad)
    with pytest.raises(ValueError, match="id must be non-empty"):
        Criterion("", "t")
    with pytest.raises(ValueError, match="text must be a non-empty string"):
        Criterion("a", "  ")
    with pytest.raises(ValueError, match="two answer choices"):
        Criterion("a", "t", choices=("yes",))
    with pytest.raises(ValueError):
        Criterion("a", "t", status="deleted")
    c = Criterion("a", "t", tags=["x"], status="hidden")
    assert c.tags == ("x",) and c.status is CriterionStatus.HIDDEN
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.weight = 3.0
    assert c.replace(weight=-1.0).weight == -1.0 and c.weight == 1.0


def test_verifier_rule_and_llm():
    v = Verifier.rule("word_count", max_words=50, min_words=3)
    assert v.kind is VerifierKind.RULE and v.checker == "word_count"
    assert v.args == (("max_words", 50), ("min_words", 3))  # sorted: hashable, order-free
    assert v.kwargs == {"max_words": 50, "min_words": 3}
    assert v == Verifier.rule("word_count", min_words=3, max_words=50)
    assert hash(v) == hash(Verifier.rule("word_count", min_words=3, max_words=50))
    assert Verifier().kind is VerifierKind.LLM
    with pytest.raises(ValueError, match="needs a checker"):
        Verifier(kind="rule")
    with pytest.raises(ValueError, match="takes no checker"):
        Verifier(kind="llm", checker="x")


def test_rubric_ids_lookup_duplicates_and_evaluated():
    cs = [
        Criterion("a", "t", status="active"),
        Criterion("b", "t", status="hidden"),
        Criterion("c", "t", status="proposed"),
        Criterion("d", "t", status="retired"),
    ]
    r = Rubric(cs)
    assert len(r) == 4 and r.ids == ("a", "b", "c", "d") and r.aggregation == "weighted"
    assert r.by_id("c") is cs[2]
    with pytest.raises(KeyError, match="no criterion 'z'"):
        r.by_id("z")
    assert r.evaluated().ids == ("a", "b")
    with pytest.raises(ValueError, match=r"duplicate criterion ids: \['a'\]"):
        Rubric([cs[0], cs[0]])


def test_task_message_and_question():
    rubric = Rubric([Criterion("a", "t")])
    t = Task("t1", [{"role": "system", "content": "s"}, Message("user", "q?")], rubric)
    assert t.prompt == (Message("system", "s"), Message("user", "q?"))
    assert t.messages == [{"role": "system", "content": "s"}, {"role": "user", "content": "q?"}]
    assert t.question == "q?"
    assert Task("t2", [Message("system", "only")], rubric).question == "only"
    # raw is provenance only: not compared.
    assert Task("t1", t.prompt, rubric, raw={"x": 1}) == Task("t1", t.prompt, rubric, raw={"y": 2})
    with pytest.raises(ValueError, match="no messages"):
        Task("t3", [], rubric)
    with pytest.raises(ValueError, match="role"):
        Message("robot", "x")
    with pytest.raises(ValueError, match="content must be a string"):
        Message("user", 3)
    assert messages_from("hello") == (Message("user", "hello"),)
    assert messages_from([{"role": "user", "content": "x"}]) == (Message("user", "x"),)


def test_verdict_failure_is_none_never_false():
    assert Verdict("a", True).failed is False
    assert Verdict("a", False).failed is False
    f = verdict_failed("a", "timeout", judge_model="m")
    assert f.met is None and f.failed and f.error == "timeout" and f.judge_model == "m"
    with pytest.raises(ValueError, match="bool or None"):
        Verdict("a", 0)
    assert Verdict("a", True, usage={"out": 2, "in": 5}).usage == (("in", 5), ("out", 2))


def test_append_to_last_user_copies_and_names_the_prompt_without_a_user_message():
    from rubric_rl.rubrics.types import append_to_last_user

    msgs = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
            {"role": "user", "content": "c"}, {"role": "tool", "content": "d"}]  # fmt: skip
    out = append_to_last_user(msgs, "<skills> x </skills>", what="task t1")
    assert [m["content"] for m in out] == ["a", "b", "c <skills> x </skills>", "d"]
    assert msgs[2]["content"] == "c"  # the input is not modified
    with pytest.raises(ValueError, match="task t1 has no user message"):
        append_to_last_user([{"role": "system", "content": "s"}], "x", what="task t1")
