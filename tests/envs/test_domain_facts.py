"""A new domain gives the methods what they read of its responses without editing any method:
its surface features (HarnessRL's attributor), its behaviours (RISED's programmatic tagger and
vocabulary warm-up) and a task writer (ARISE-RL's generator role). The toy domain here is
defined in this file only; the methods see it through the Domain contract (envs/base.py)."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest

from rubric_rl.envs.base import Behaviours, Env, SurfaceFeatures, ToolOutput
from rubric_rl.envs.tool_calls import Param, ToolSpec, render_tool_call
from rubric_rl.methods.arise_rl.arise_rl_domain import build_generator_domain
from rubric_rl.methods.arise_rl.arise_rl_rewards import r_fmt, r_tool
from rubric_rl.methods.harness_rl.attributor import ProgrammaticAttributor
from rubric_rl.methods.rised.rised_tagger import ProgrammaticTagger, warmup_vocabulary
from rubric_rl.rubrics.types import Criterion, Message, Rubric, Task
from rubric_rl.rubrics.vocabulary import RubricEntry

# --- the toy domain: answer with colour words; "please" is its fluff ---------------------------

COLOURS = ("red", "blue", "green")


def task(i: int, env: str = "colours") -> Task:
    return Task(
        id=f"toy-{i}",
        prompt=(Message("user", f"name {1 + i % 3} colours"),),
        rubric=Rubric(()),
        domain="toy",
        env_name=env,
        reference_answer=" ".join(COLOURS[: 1 + i % 3]),
    )


def surface(response: str) -> SurfaceFeatures:
    return SurfaceFeatures(fluff="please" in response, length=len(response.split()))


def detect(t: Task, response: str) -> dict[str, int]:
    words = response.split()
    if "unreadable" in words:
        raise ValueError("the toy domain cannot read this response")
    want = int(t.prompt[-1].content.split()[1])
    colours = [w for w in words if w in COLOURS]
    out = {"colour_count_right" if len(colours) == want else "colour_count_wrong": 1}
    if "please" in words:
        out["pleading"] = words.count("please")
    return out


def catalogue() -> dict[str, RubricEntry]:
    return {
        "colour_count_right": RubricEntry("colour_count_right", "count", "positive", "Right."),
        "colour_count_wrong": RubricEntry("colour_count_wrong", "count", "negative", "Wrong."),
        "pleading": RubricEntry("pleading", "style", "negative", "Saying please."),
    }


def warmup(seed: int, n: int, weak_per_task: int):
    tasks = [task(seed + i) for i in range(n)]
    weak = [
        ("colours", t, "please " + "red " * 4, 0.0) for t in tasks for _ in range(weak_per_task)
    ]
    strong = [("colours", t, t.reference_answer, 1.0) for t in tasks]
    return weak, strong


BEHAVIOURS = Behaviours("toy", detect, catalogue, aliases={"begging": "pleading"}, warmup=warmup)


class PaletteEnv(Env):
    """The writer's tool: ``palette()`` lists the colours."""

    name = "toy_writer"
    TOOLS = (ToolSpec("palette", "the colours", (("kind", Param("string", "any")),)),)

    def _setup(self, task: Task, seed: int | None) -> None:
        return None

    def _tool_palette(self, kind: str) -> ToolOutput:
        return ToolOutput(" ".join(COLOURS))

    @classmethod
    def reference_turns(cls, task: Task) -> list[str]:
        return [render_tool_call("palette", {"kind": "all"}), "name 2 colours"]


@dataclasses.dataclass
class Parsed:
    task: Task | None
    question: str
    num_unknown: int = 0
    reason: str | None = None


class ToyWriter:
    """The toy domain's task writer: the final answer is a question "name <n> colours"."""

    name = "toy"
    env_name = PaletteEnv.name
    solver_agent = False
    hints = {"format": "ask name n colours", "tool": "look at the palette", "too_easy": "more",
             "too_hard": "fewer"}  # fmt: skip

    def __init__(self, *, observed, complete: bool = True):
        self.observed, self.complete = observed, complete

    def generator_tasks(self, rng, n, recent, *, first_index, n_negatives) -> list[Task]:
        return [
            dataclasses.replace(task(first_index + g), env_name=self.env_name) for g in range(n)
        ]

    def make_env(self, t: Task) -> Env:
        return PaletteEnv()

    def episode_outcome(self, response: str, *, forbidden: frozenset[str]) -> tuple[Any, bool]:
        from rubric_rl.envs.trajectory import transcript_of

        tr = transcript_of(response)
        answer = tr.final_answer or ""
        words = answer.split()
        ok = len(words) == 3 and words[0] == "name" and words[2] == "colours"
        written = dataclasses.replace(
            task(0), rubric=Rubric((Criterion("count", f"names {words[1:2]} colours", 1.0),))
        )
        parsed = Parsed(written if ok else None, answer, reason=None if ok else "no_question")
        seen = self.observed(tr.tool_calls, final_turn=len(tr.turns))
        return parsed, seen

    def signature(self, t: Task) -> str:
        return t.prompt[-1].content

    def forbidden_signatures(self, tasks) -> frozenset[str]:
        return frozenset(self.signature(t) for t in tasks)

    def task_record(self, t: Task) -> dict[str, Any]:
        return {"id": t.id}

    def task_from_record(self, rec, forbidden) -> Task | None:
        return None


@dataclasses.dataclass(frozen=True)
class ToyDomain:
    """What the methods read here of a ``Domain`` (envs/base.py)."""

    name: str = "toy"
    surface_features: Any = surface
    behaviours: Behaviours = BEHAVIOURS
    task_writer: Any = ToyWriter


# --- the methods on it --------------------------------------------------------------------------


def test_the_attributor_reads_the_domains_surface_features():
    att = ProgrammaticAttributor(features=ToyDomain().surface_features)
    met = np.array([[1.0, 1.0, 0.0, 0.0]])  # satisfied by the pleading responses only
    responses = ["please red", "please blue", "red", "blue"]
    out = att.attribute("t", ["c"], [1.0], ["names a colour"], met, responses)
    assert out.labels[0].label == "spurious" and "superficial" in out.labels[0].reason
    with pytest.raises(TypeError, match="features"):
        ProgrammaticAttributor()


def test_rised_tags_and_warms_up_on_the_domains_behaviours():
    b = ToyDomain().behaviours
    vocab = warmup_vocabulary(b, 0, 6)
    assert set(vocab.ids) == {"colour_count_right", "colour_count_wrong", "pleading"} | {
        "task_solved", "task_failed",
    }  # fmt: skip
    assert vocab.provenance["behaviours"] == "toy" and vocab.lookup("begging") == "pleading"
    tagger = ProgrammaticTagger(b, vocab)
    tags = tagger.tag(task(1), "please please red blue", 0.0)  # failed: negatives only
    assert dict(tags.counts) == {"pleading": 2, "task_failed": 1}
    assert dict(tags.withheld) == {"colour_count_right": 1}
    assert tagger.tag(task(1), "unreadable", 1.0).failed
    no_warmup = dataclasses.replace(b, warmup=None)
    with pytest.raises(ValueError, match="no warm-up"):
        warmup_vocabulary(no_warmup)


def _episode(turns: list[str]) -> str:
    env = PaletteEnv()
    env.reset(dataclasses.replace(task(0), env_name=PaletteEnv.name))
    for turn in turns:
        if env.step(turn).done:
            break
    return env.response()


def test_arise_rls_generator_role_runs_on_the_domains_task_writer():
    role = build_generator_domain("toy", ToyDomain())
    assert role.env_name == "toy_writer" and role.hints["tool"] == "look at the palette"
    tasks = role.generator_tasks(np.random.default_rng(0), 2, [], first_index=3, n_negatives=0)
    assert [t.env_name for t in tasks] == ["toy_writer"] * 2
    # the method's R_tool event (a real observation before the final answer) reaches the writer
    call = render_tool_call("palette", {"kind": "all"})
    parsed, out = role.episode_outcome(_episode([call, "name 2 colours"]))
    assert parsed.task is not None and r_fmt(out) == 1.0 and r_tool(out) == 1.0
    parsed, out = role.episode_outcome(_episode(["name 2 colours"]))
    assert r_fmt(out) == 1.0 and r_tool(out) == 0.0  # no tool call
    parsed, out = role.episode_outcome(_episode([call, "colours please"]))
    assert out.reason == "no_question" and r_fmt(out) == 0.0 and out.num_criteria == 0
    with pytest.raises(ValueError, match="another domain.*writer is 'toy'"):
        build_generator_domain("constraint", ToyDomain())


# --- the contract itself ------------------------------------------------------------------------


def test_the_ready_made_domain_implements_exactly_the_contract_and_the_builders_return_one():
    from configs import grpo
    from rubric_rl.config import builders
    from rubric_rl.envs.base import CONTRACT_MEMBERS, Domain, DomainContract

    assert {f.name for f in dataclasses.fields(Domain)} == set(CONTRACT_MEMBERS)
    config = grpo.get_config("smoke")
    for name in ("constraints", "instruct"):
        with config.unlocked():
            config.domain.name = name
        assert isinstance(builders.build_domain(config), DomainContract), name


class _OwnDomain:
    """A domain written without envs.base.Domain: any object with the contract's members."""

    def __init__(self, **absent: Any):
        from rubric_rl.envs.base import CONTRACT_MEMBERS, GENERIC_STYLE

        for m in CONTRACT_MEMBERS:
            setattr(self, m, None)
        self.name, self.embedded_tokenizer = "own", "word"
        self.train = self.heldout = self.ood = tuple(task(i) for i in range(3))
        self.validation, self.skill_texts, self.style = (), {}, GENERIC_STYLE
        for m, value in absent.items():
            if value is _DELETE:
                delattr(self, m)
            else:
                setattr(self, m, value)


_DELETE = object()


def test_a_trainer_takes_any_object_with_the_contracts_members_and_names_what_one_lacks():
    from configs import grpo
    from rubric_rl.config.builders import given_or_configured_domain
    from rubric_rl.envs.base import DomainContract

    config = grpo.get_config("smoke")
    with config.unlocked():
        config.warmstart.steps = 0
    own = _OwnDomain()
    assert isinstance(own, DomainContract)
    assert given_or_configured_domain(config, None, own) is own
    lacking = _OwnDomain(style=_DELETE, skill_texts=_DELETE)
    assert not isinstance(lacking, DomainContract)
    with pytest.raises(TypeError, match=r"Trainer\(domain=\).*lacks style, skill_texts"):
        given_or_configured_domain(config, None, lacking)
    with pytest.raises(TypeError, match=r"_OwnDomain.style is str, not an envs.base.Style"):
        given_or_configured_domain(config, None, _OwnDomain(style="plain"))
