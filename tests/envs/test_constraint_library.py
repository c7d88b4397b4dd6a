"""The embedded domain's checker library: criteria read from the prompt text alone."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from rubric_rl.envs import constraint_domain
from rubric_rl.envs import constraints as cf
from rubric_rl.envs.constraint_library import library_constraints, library_criteria, parse_prompt
from rubric_rl.envs.constraint_spec import IMPLICIT_KINDS
from rubric_rl.rubrics.judges import ProgrammaticJudge
from rubric_rl.rubrics.types import Message, Rubric, Task


def _blind(task: Task) -> Task:
    """The task as a controller may see it: no generator parameters, no seed rubric."""
    return dataclasses.replace(task, raw=None, rubric=Rubric(()))


@pytest.mark.parametrize("seed", [0, 3])
@pytest.mark.parametrize(("split", "n"), [("train", 1500), ("heldout", 400), ("ood", 400)])
def test_library_reads_every_requirement_from_the_prompt_alone(seed, split, n):
    for task in cf.ConstraintDomain(seed).tasks(split, n):
        assert library_constraints(_blind(task)) == constraint_domain.task_requirements(task), (
            task.question
        )


def test_library_criteria_judge_like_the_verifier_and_the_seed_rubric():
    judge = ProgrammaticJudge()
    rng = np.random.default_rng(0)
    for task in cf.ConstraintDomain(1).tasks("train", 200):
        crits = library_criteria(_blind(task))
        kinds = [c.kind for c in constraint_domain.task_requirements(task)]
        assert [c.title for c in crits] == kinds
        for c, k in zip(crits, constraint_domain.task_requirements(task)):
            option = {"case": "mode", "end": "punct", "sep": "sep", "order": "order"}.get(k.kind)
            assert c.id == (f"{k.kind}:{dict(k.args)[option]}" if option else k.kind)
        seed = {c.id: c for c in task.rubric.criteria}
        for _ in range(4):
            keep = {k for k in kinds if rng.random() < 0.6}
            flags = {f: bool(rng.random() < 0.2) for f in ("praise", "claim", "pad")}
            response = cf.render_response(task, keep, rng, **flags)
            verdicts = {c.id: judge.check(task, response, c).met for c in crits}
            met = {c.id: (v if c.weight > 0 else not v) for c, v in zip(crits, verdicts.values())}
            assert all(met.values()) == cf.verify(task, response)
            for c in crits:  # a stated clause: the same verdict as the seed criterion
                if c.title in seed:
                    assert judge.check(task, response, seed[c.title]).met == verdicts[c.id]
        # The implicit requirements are what the seed rubric does not state.
        assert {c.title for c in crits} - set(seed) == {k for k in kinds if k in IMPLICIT_KINDS}


def test_library_computes_short_answers_from_the_question():
    cases = {
        "what is 7 minus 3 ?": "four",
        "what is 9 plus 9 ? answer in one word": "eighteen",
        "how many words are in : red cat bus ?": "three",
        "is lynx a animal ? answer yes or no": "yes",
        "is lynx a fruit ? answer yes or no . end with !": "no",
        "which comes first alphabetically : pear or drill ? start with ok": "drill",
    }
    for text, answer in cases.items():
        assert parse_prompt(text)["answer"] == answer, text


def test_parse_prompt_reads_rewrites_and_clauses_in_any_order():
    p = parse_prompt("rewrite : cat red bus replace red with oslo . end with . . use uppercase")
    assert p == {
        "type": "rewrite",
        "words": ["cat", "red", "bus"],
        "transform": "replace",
        "target": "red",
        "other": "oslo",
        "expected": ["cat", "oslo", "bus"],
        "end": ".",
        "case": "upper",
    }
    a = parse_prompt("list 3 tools . include saw . separate them with ; . number the items")
    b = parse_prompt("list 3 tools . number the items . separate them with ; . include saw")
    assert (
        a
        == b
        == {
            "type": "list",
            "category": "tool",
            "n": 3,
            "include": "saw",
            "sep": ";",
            "numbered": True,
        }
    )


@pytest.mark.parametrize(
    "text",
    [
        "list 3 fruits . sing a song",  # an unknown clause
        "list 3 fruits . use uppercase . use lowercase",  # one clause kind twice
        "tell me a story",  # no known head
        "list 3 planets",  # no such category
    ],
)
def test_unreadable_prompts_are_errors_naming_the_task(text):
    task = Task(id="t-42", prompt=(Message("user", text),), rubric=Rubric(()), domain="constraints")
    with pytest.raises(ValueError, match="t-42"):
        library_criteria(task)


def test_library_refuses_other_domains():
    task = Task(id="x", prompt=(Message("user", "list 3 fruits"),), rubric=Rubric(()), domain="sql")
    with pytest.raises(ValueError, match="not a 'constraints' task"):
        library_criteria(task)


def test_parse_prompt_returns_a_copy():
    p = parse_prompt("list 3 fruits")
    p["n"] = 9
    assert parse_prompt("list 3 fruits")["n"] == 3
