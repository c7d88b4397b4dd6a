"""RISED's tagger over the tool environments' behaviours (exact tags on replayed episodes), the
mixed domain's routing, the vocabulary's warm-up with tool environments, and the mixed renderer /
descriptions."""

import dataclasses

import pytest

from rubric_rl.envs.constraint_behaviours import constraint_behaviours
from rubric_rl.envs.constraint_domain import task_bank as constraint_tasks
from rubric_rl.envs.constraint_style import MixedStyle, embedded_description
from rubric_rl.envs.inventory import InventoryEnv
from rubric_rl.envs.sql import SqlEnv
from rubric_rl.envs.tool_behaviours import MALFORMED_CALL as _MALFORMED_CALL
from rubric_rl.envs.tool_behaviours import WRITE_CALL as _WRITE_CALL
from rubric_rl.envs.tool_behaviours import catalogue as tool_catalogue
from rubric_rl.envs.tool_behaviours import describe as tool_description
from rubric_rl.envs.tool_behaviours import episode as _episode
from rubric_rl.envs.tool_behaviours import mixed_behaviours, tool_behaviours
from rubric_rl.methods.rised.rised_tagger import ProgrammaticTagger, warmup_vocabulary
from rubric_rl.rubrics.vocabulary import Vocabulary

TOOLS = tool_behaviours(("sql", "inventory"))
MIXED = mixed_behaviours(constraint_behaviours(), ("sql", "inventory"))


def ToolTagger(vocab=None, **kw):  # noqa: N802 - the tool environments' tagger
    return ProgrammaticTagger(TOOLS, vocab, **kw)


@pytest.fixture(scope="module")
def vocab():
    return warmup_vocabulary(MIXED, 0, 60)


@pytest.fixture(scope="module")
def sql_task():
    task = SqlEnv.task_bank("train", 2, 0)[1]
    assert [c.id for c in task.rubric.criteria] == [
        "answer_correct", "read_required_tables", "explored_schema", "write_attempted",
        "answer_format", "malformed_tool_call", "tool_call_after_answer",
    ]  # fmt: skip
    return task


def test_reference_episode_tags(sql_task):
    ref = _episode("sql", sql_task, SqlEnv.reference_turns(sql_task))
    tags = ToolTagger(discovery=True).tag(sql_task, ref, 1.0)
    assert dict(tags.counts) == {
        "answer_correct": 1, "read_required_tables": 1, "explored_schema": 1,
        "answer_format": 1, "task_solved": 1,
    }  # fmt: skip


def test_degenerate_episodes_tags(sql_task):
    tagger = ToolTagger(discovery=True)
    at_once = _episode("sql", sql_task, ["Answer: 3"])
    assert dict(tagger.tag(sql_task, at_once, 0.0).counts) == {
        "missed_answer_correct": 1, "missed_read_required_tables": 1,
        "missed_explored_schema": 1, "answer_format": 1, "no_tool_call": 1, "task_failed": 1,
    }  # fmt: skip
    turns = SqlEnv.reference_turns(sql_task)
    bad = _episode("sql", sql_task, [_MALFORMED_CALL, _WRITE_CALL, *turns])
    counts = dict(tagger.tag(sql_task, bad, 1.0).counts)
    # Two failed calls (the malformed one and the refused write); the rest as the reference.
    assert counts["tool_error"] == 2
    assert counts["malformed_tool_call"] == 1 and counts["write_attempted"] == 1
    assert counts["answer_correct"] == 1 and counts["task_solved"] == 1
    unanswered = _episode("sql", sql_task, turns[:-1])
    counts = dict(tagger.tag(sql_task, unanswered, None).counts)
    assert counts["no_final_answer"] == 1 and "no_tool_call" not in counts
    assert "task_solved" not in counts and "task_failed" not in counts  # no reward given


def test_tool_tagger_maps_through_the_vocabulary_and_refuses_other_tasks(vocab, sql_task):
    ref = _episode("sql", sql_task, SqlEnv.reference_turns(sql_task))
    tags = ToolTagger(vocab).tag(sql_task, ref, 1.0)
    assert not tags.failed and not tags.discovered and set(tags.counts) <= set(vocab.ids)
    small = Vocabulary(tuple(e for e in vocab.rubrics if e.id != "explored_schema"))
    tags = ToolTagger(small).tag(sql_task, ref, 1.0)
    assert dict(tags.discovered) == {"explored_schema": 1}
    constraint = constraint_tasks("train", 1, seed=0)[0]
    failed = ToolTagger(vocab).tag(constraint, "a b c", 1.0)
    assert failed.failed and "not a tool environment" in failed.error
    with pytest.raises(ValueError, match="vocabulary"):
        ToolTagger()


def test_mixed_behaviours_route_each_rollout_in_order(vocab, sql_task):
    constraint = constraint_tasks("train", 2, seed=0)
    ref = _episode("sql", sql_task, SqlEnv.reference_turns(sql_task))
    tasks = [constraint[0], sql_task, constraint[1]]
    responses = [constraint[0].reference_answer, ref, "x y"]
    rewards = [1.0, 1.0, 0.0]
    prog = ProgrammaticTagger(constraint_behaviours(), vocab)
    tool = ToolTagger(vocab)
    mixed = ProgrammaticTagger(MIXED, vocab)
    got = mixed.tag_batch(tasks, responses, rewards, step=3)
    assert got[1] == tool.tag(sql_task, ref, 1.0)
    assert got[0] == prog.tag(constraint[0], responses[0], 1.0)
    assert got[2] == prog.tag(constraint[1], "x y", 0.0)
    assert mixed.retag_batch(tasks, responses, rewards, seed=5) == got


def test_vocabulary_with_tool_envs(vocab):
    plain = warmup_vocabulary(constraint_behaviours(), 0, 60)
    assert plain.provenance["behaviours"] == "constraints"
    assert vocab.provenance["behaviours"] == "constraints+sql+inventory"
    tool_ids = set(vocab.ids) - set(plain.ids)
    # The warm-up saw every rubric of the catalogue but the pitfalls no stand-in episode shows
    # (inventory's over-budget and unrequested purchases, a tool call after the answer).
    assert tool_ids == {
        "answer_correct", "missed_answer_correct", "read_required_tables",
        "missed_read_required_tables", "explored_schema", "missed_explored_schema",
        "answer_format", "missed_answer_format", "write_attempted", "malformed_tool_call",
        "no_tool_call", "no_final_answer", "tool_error", "order_correct",
        "missed_order_correct", "looked_up_items", "missed_looked_up_items",
    }  # fmt: skip
    assert set(tool_ids) <= set(tool_catalogue(("sql", "inventory")))
    assert vocab.entry("explored_schema").envs == ("sql",)
    assert vocab.entry("looked_up_items").envs == ("inventory",)
    assert vocab.entry("answer_correct").skill == "outcome"
    assert set(vocab.entry("task_solved").envs) >= {"sql", "inventory", "list"}
    for rid in plain.ids:  # the constraint part is unchanged but for the environments
        a, b = plain.entry(rid), vocab.entry(rid)
        assert dataclasses.replace(a, envs=()) == dataclasses.replace(b, envs=())


def test_descriptions_and_renderer(sql_task):
    assert tool_description("read_required_tables", sql_task) == (
        "Successfully queried every table the question needs: orders."
    )
    assert tool_description("missed_explored_schema", sql_task) == (
        "Not done: looked at the schema (tables or columns) before querying the data."
    )
    assert tool_description("no_tool_call", sql_task) == "Answering without calling any tool."
    assert tool_description("order_correct", sql_task) is None  # an inventory criterion
    constraint = constraint_tasks("train", 1, seed=0)[0]
    style = MixedStyle()  # the constraint domain's with tool environments mixed in
    mixed_renderer = style.show_and_avoid
    assert style.describe("read_required_tables", sql_task, "unused").startswith("Successfully")
    assert style.describe("task_solved", constraint, "unused") == embedded_description(
        "task_solved", constraint
    )
    assert MIXED.describe("read_required_tables", sql_task).startswith("Successfully")
    assert MIXED.describe("task_solved", constraint) is None  # the corpus's words: RISED's
    assert embedded_description("task_solved", constraint) != MIXED.describe(
        "task_solved", sql_task
    )
    msgs = mixed_renderer(sql_task, ["Be exact."], ["Guessing."])
    assert msgs[-1]["content"].endswith(
        "Behaviours to show:\n- Be exact.\n\nAnti-patterns to avoid:\n- Guessing."
    )
    assert "<anti_patterns>" in str(mixed_renderer(constraint, [], ["breaking the rule"]))
    inv = InventoryEnv.task_bank("train", 1, 0)[0]
    assert tool_description("looked_up_items", inv) is not None
