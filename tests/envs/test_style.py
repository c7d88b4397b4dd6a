"""The Domain contract's ``style`` (envs/base.py ``Style``): the embedded constraint domain's
style writes exactly the bytes its methods wrote before it existed (pinned below); a new domain
with only the generic style works with every method's renderer (ARISE's skills, HarnessRL's
fields, RISED's behaviours and descriptions, ARISE-RL's coach memory); and the method modules that
render text import nothing from envs/ but the contract (tools/import_cycles.py)."""

import types

import numpy as np
import pytest

from rubric_rl.config import builders
from rubric_rl.config.defaults import get_base_config
from rubric_rl.envs.base import GENERIC_STYLE, TEXT_KINDS, Domain, Style
from rubric_rl.envs.constraint_domain import task_bank
from rubric_rl.envs.constraint_style import ConstraintStyle, MixedStyle
from rubric_rl.envs.instruct_guidance import InstructStyle
from rubric_rl.methods.arise.arise import domain_kwargs, make_arise_controller
from rubric_rl.methods.arise_rl.arise_rl import AriseRLConfig, AriseRLController
from rubric_rl.methods.arise_rl.rgsed_coach import coach_memory
from rubric_rl.methods.harness_rl.style import style_for
from rubric_rl.methods.rised.rised import RisedConfig, RisedController
from rubric_rl.rollout.batch import Group
from rubric_rl.rubrics.types import Criterion, Message, Rubric, Task
from rubric_rl.rubrics.vocabulary import RubricEntry, Vocabulary
from tools.import_cycles import PENDING_CROSSINGS, import_graph

# A list task of the embedded domain and its prompt.
LIST_ID = "cf-train-38634fa9dd2f"
PROMPT = "list 5 animals . end with ! . separate them with / . sort them alphabetically"


@pytest.fixture(scope="module")
def list_task():
    task = next(t for t in task_bank("train", 50) if t.task_type == "list")
    assert (task.id, task.messages[-1]["content"]) == (LIST_ID, PROMPT)
    return task


def _last(messages):
    return messages[-1]["content"]


def test_the_constraint_style_writes_the_corpus_bytes(list_task):
    s = ConstraintStyle()
    t = list_task
    # ARISE's skills block
    skills = s.add_block(t, t.messages, "skills", ["list the items", "use commas"])
    assert _last(skills) == f"{PROMPT} <skills> list the items ; use commas </skills>"
    # HarnessRL's fields, in the corpus order whatever the dict order
    fields = {
        "critique": s.critique(["x y"]),
        "reference": s.reference("good one", "bad one"),
        "criterion": ["a b", s.hint("no fluff", -1.0)],
    }
    assert _last(s.mount(t, fields)) == (
        f"{PROMPT} <criterion> a b ; avoid : no fluff </criterion> <reference> good : good one "
        "bad : bad one </reference> <critique> the last answers missed : x y </critique>"
    )
    # RISED's behaviours and a vocabulary rubric stated with the task's values
    rised = s.show_and_avoid(
        t, ["the response lists exactly 3 items"], ["opening with great question"]
    )
    assert _last(rised) == (
        f"{PROMPT} <criterion> the response lists exactly 3 items </criterion> "
        "<anti_patterns> opening with great question </anti_patterns>"
    )
    assert s.describe("count_followed", t, "unused") == "the response lists exactly 5 items"
    assert s.show_and_avoid(t, [], []) == t.messages and s.mount(t, {}) == t.messages
    # ARISE-RL's coach memory, written and mounted
    missed = [{c.id: False for c in t.rubric.criteria}] * 2
    memory = coach_memory(t, ["r"] * 2, missed, style=s)
    assert memory == (
        "remember : every word is one of the animals ; "
        "remember : the response meets every rule of the task at once"
    )
    assert s.coach(s.coach_notes(memory)) == memory
    assert (
        _last(s.add_block(t, t.messages, "coach", memory)) == f"{PROMPT} <coach> {memory} </coach>"
    )
    system = s.add_block(t, t.messages, "coach", memory, placement="system")
    assert system[0] == {"role": "system", "content": f"<coach> {memory} </coach>"}


def test_the_generic_style_keeps_the_plain_formats(list_task):
    s, t = GENERIC_STYLE, list_task
    got = s.mount(t, {"critique": s.critique(["x"]), "criterion": ["a", "b"]})
    assert _last(got) == (
        f"{PROMPT} <criterion> a ; b </criterion>\n<critique> The previous answers missed: x "
        "</critique>"
    )
    assert _last(s.show_and_avoid(t, ["p"], ["n"])) == (
        f"{PROMPT} Behaviours to show:\n- p\n\nAnti-patterns to avoid:\n- n"
    )
    assert s.hint("x", -0.5) == "Avoid: x" and s.hint("x", 1.0) == "x"
    assert s.describe("any", t, "the vocabulary's text") == "the vocabulary's text"
    with pytest.raises(ValueError, match="unknown kinds of method text \\['sparkle'\\]"):
        s.mount(t, {"sparkle": "x"})
    with pytest.raises(ValueError, match="placement"):
        s.add_block(t, t.messages, "skills", "x", placement="middle")


def test_each_domain_carries_its_style():
    c = get_base_config()
    c.domain.update(n_train=8, n_heldout=4, n_ood=4, n_validation=2)
    embedded = builders.build_domain(c)
    assert isinstance(embedded.style, ConstraintStyle) and embedded.skill_texts["counting"]
    c.domain.tool_envs = "sql"
    assert isinstance(builders.build_domain(c).style, MixedStyle)
    c.domain.tool_envs, c.domain.name = "", "instruct"
    instruct = builders.build_domain(c)
    assert isinstance(instruct.style, InstructStyle)
    t = instruct.train[0]
    got = instruct.style.add_block(
        t, t.messages, "skills", [instruct.skill_texts[t.capabilities[0]]]
    )
    assert (
        _last(got) == f"{_last(t.messages)}\n\nTips:\n- {instruct.skill_texts[t.capabilities[0]]}"
    )
    memory = instruct.style.coach(["No commas.", "Be brief."])
    assert _last(instruct.style.add_block(t, t.messages, "coach", memory)).endswith(
        "\n\nRemember:\n- No commas.\n- Be brief."
    )
    c.domain.name = "sql"
    sql = builders.build_domain(c)
    assert type(sql.style) is Style and sql.skill_texts == {}


def test_the_mixed_style_gives_a_tool_task_the_generic_prompts(list_task):
    from rubric_rl.envs.sql import SqlEnv

    sql_task = SqlEnv.task_bank("train", 1, 0)[0]
    s = MixedStyle()
    assert s.show_and_avoid(sql_task, ["p"], []) == GENERIC_STYLE.show_and_avoid(
        sql_task, ["p"], []
    )
    assert s.add_block(sql_task, sql_task.messages, "skills", "k") == GENERIC_STYLE.add_block(
        sql_task, sql_task.messages, "skills", "k"
    )
    assert s.show_and_avoid(list_task, ["p"], []) == ConstraintStyle().show_and_avoid(
        list_task, ["p"], []
    )


# --- a new domain with only the generic style --------------------------------------------------


def _toy_domain() -> Domain:
    """A domain none of the methods knows: plain English tasks, one rule criterion each."""
    crit = Criterion(id="brief", text="Answers in one sentence.", capability="brevity")
    tasks = tuple(
        Task(
            id=f"toy-{i}",
            prompt=(Message("user", f"Why is the sky blue? ({i})"),),
            rubric=Rubric((crit,)),
            domain="toy",
            task_type="why",
            capabilities=("brevity",),
            env_name="why",
        )
        for i in range(4)
    )
    return Domain(
        name="toy", train=tasks, heldout=(), ood=(), verify=lambda task, r: len(r.split()) < 12
    )


def test_a_new_domain_works_with_every_methods_renderer():
    domain = _toy_domain()
    task = domain.train[0]
    question = _last(task.messages)
    assert domain.style is GENERIC_STYLE and domain.skill_texts == {}

    # ARISE: the skills block of the pool's active skills
    arise = make_arise_controller(domain.train, 2, evolve=False, **domain_kwargs(domain))
    arise.pool.skills_for = lambda t: ["Keep it short."]
    (prompt,) = arise.decorate([task], [task.messages])
    assert _last(prompt) == f"{question} <skills> Keep it short. </skills>"
    assert arise.task_rewards([task], [["Short.", " ".join(["word"] * 20)]]).tolist() == [[1, 0]]

    # HarnessRL: the guidance fields, through the domain's style
    harness = style_for(domain)
    hint = harness.hint(task.rubric.criteria[0].text, -1.0)
    assert _last(harness.mount(task, {"criterion": hint})) == (
        f"{question} <criterion> Avoid: Answers in one sentence. </criterion>"
    )
    assert harness.library is None

    # RISED: anti-patterns on the decorated prompt and the teacher's context
    vocab = Vocabulary(
        (
            RubricEntry("short", "brevity", "positive", "Answering in one sentence.", ("why",)),
            RubricEntry("ramble", "brevity", "negative", "Rambling on.", ("why",)),
        )
    )
    rised = RisedController(RisedConfig(k=0, selection="none"), vocab, None, style=domain.style)
    assert rised.describe("ramble", task) == "Rambling on."
    assert _last(rised.render(task, ["Answering in one sentence."], ["Rambling on."])) == (
        f"{question} Behaviours to show:\n- Answering in one sentence.\n\n"
        "Anti-patterns to avoid:\n- Rambling on."
    )

    # ARISE-RL: the solver's coach memory, written and mounted
    memory = coach_memory(task, ["a", "b"], [{"brief": False}, {"brief": True}], style=domain.style)
    assert memory == "remember : Answers in one sentence."
    # (the toy domain writes no tasks: a stand-in generator role, never used by the solver's coach)
    arise_rl = AriseRLController(
        AriseRLConfig(),
        fallback_tasks=domain.train,
        generator_domain=types.SimpleNamespace(),
        style=domain.style,
    )
    group = Group(task=task)
    got = arise_rl.memory_prompt(group, memory)
    assert got[0] == {"role": "system", "content": f"<coach> {memory} </coach>"}
    assert got[1:] == task.messages


def test_text_kinds_are_the_corpus_guidance_kinds():
    from rubric_rl.envs.constraint_lexicon import GUIDANCE_KINDS

    assert TEXT_KINDS == GUIDANCE_KINDS


# --- the import rules ---------------------------------------------------------------------------

RENDERING_MODULES = (
    "rubric_rl.controllers.sampling",
    "rubric_rl.methods.arise.arise",
    "rubric_rl.methods.arise.reflection",
    "rubric_rl.methods.harness_rl.style",
    "rubric_rl.methods.rised.rised",
    "rubric_rl.methods.arise_rl.rgsed_coach",
    "rubric_rl.methods.arise_rl.arise_rl",
    "rubric_rl.methods.arise_rl.arise_rl_domain",
)


def test_the_renderers_import_of_envs_only_the_contract():
    graph = import_graph()
    for module in RENDERING_MODULES:
        envs = sorted(t for t in graph[module] if t.startswith("rubric_rl.envs"))
        assert set(envs) <= {"rubric_rl.envs.base"}, (module, envs)
        assert not [p for p in PENDING_CROSSINGS if p[0] == module], module
    # the check itself would name such an import
    assert np.all([m in graph for m in RENDERING_MODULES])
