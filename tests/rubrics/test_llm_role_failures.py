"""A failure-rate stop for every LLM role besides the judge (``rubrics.llm.FailureRateStop``):
RISED's tagger, HarnessRL's attributor and proposer, ARISE's reflection stop the run, naming the
role, when most of their recent calls fail, instead of training on what the failures left empty."""

import json

import numpy as np
import pytest

from rubric_rl.methods.harness_rl.llm_evolver import LLMAttributor, LLMEvolverError
from rubric_rl.methods.rised.rised_llm_tagger import LLMTagger
from rubric_rl.rubrics.llm import (
    FailureRateStop,
    LLMRoleError,
    LocalEngineClient,
    role_max_failure_rate,
)
from rubric_rl.rubrics.types import Message, Rubric, Task
from rubric_rl.rubrics.vocabulary import RubricEntry, Vocabulary

TASK = Task("t", (Message("user", "Name a fruit."),), Rubric(()))
VOCAB = Vocabulary((RubricEntry("a_pos", "s", "positive", "A."),))


def _tagger(fail):
    """A tagger whose model answers garbage for the responses ``fail`` picks."""

    def model(messages, params):
        user = messages[-1]["content"] if isinstance(messages[-1], dict) else messages[-1].content
        return "no json here" if fail(user) else json.dumps({"tags": [{"name": "a_pos"}]})

    return LLMTagger(LocalEngineClient(model, max_concurrency=1), VOCAB)


def test_a_tagger_that_always_fails_stops_the_run_naming_itself():
    # At 100 % failed tagging RISED went on with empty profiles and no SD context, rc 0.
    tagger = _tagger(lambda user: True)
    with pytest.raises(LLMRoleError) as e:
        tagger.tag_batch([TASK] * 8, [f"answer {i}" for i in range(8)], [0.0] * 8, step=1)
    msg = str(e.value)
    assert msg.startswith("RISED LLM tagger: 8 of its last 8 calls failed (> max_failure_rate=0.5)")
    assert "latest error: rised_tag@v2: primary: " in msg


def test_a_tagger_failing_a_quarter_of_the_time_goes_on():
    tagger = _tagger(lambda user: "answer 3" in user or "answer 7" in user)
    tags = tagger.tag_batch([TASK] * 8, [f"answer {i}" for i in range(8)], [1.0] * 8, step=1)
    assert [t.failed for t in tags] == [False] * 3 + [True] + [False] * 3 + [True]
    assert tagger.stats()["failed"] == 2.0


def test_the_attributor_stops_after_its_recent_calls_mostly_fail():
    attributor = LLMAttributor(LocalEngineClient(lambda m, p: "not json", max_concurrency=1))
    args = ("t", ["c1"], [1.0], ["says hello"], np.array([[1.0, 0.0]]), ["hello", "bye"])
    for _ in range(3):  # below min_calls: each failure is the caller's to handle
        with pytest.raises(LLMEvolverError):
            attributor.attribute(*args)
    with pytest.raises(LLMRoleError, match=r"^HarnessRL LLM attributor: 4 of its last 4 calls"):
        attributor.attribute(*args)


def test_the_window_forgets_old_successes():
    stop = FailureRateStop("role", 0.5, window=4, min_calls=4)
    for ok in (True, True, True, True, False, False):
        stop.record(ok, None if ok else "boom")
        stop.check()  # 2 of the last 4: not above one half
    stop.record(False, "bang")
    with pytest.raises(LLMRoleError, match=r"^role: 3 of its last 4 calls failed .*: bang$"):
        stop.check()


@pytest.mark.parametrize(
    "roles,judge,expected", [(-1.0, 0.5, 0.5), (-1.0, 0.2, 0.2), (0.9, 0.2, 0.9), (0.0, 0.5, 0.0)]
)
def test_the_roles_limit_is_the_judges_unless_llm_roles_sets_its_own(roles, judge, expected):
    from configs import grpo

    c = grpo.get_config("smoke")
    c.llm_roles.max_failure_rate, c.judge.max_failure_rate = roles, judge
    assert role_max_failure_rate(c) == expected


@pytest.mark.parametrize("bad", [1.5, -0.5, -2.0])
def test_a_roles_limit_outside_0_1_is_refused_naming_the_key(bad):
    from configs import grpo
    from rubric_rl.config.config_validation import validate_config

    c = grpo.get_config("smoke")
    c.llm_roles.max_failure_rate = bad
    with pytest.raises(ValueError, match=r"^config\.llm_roles\.max_failure_rate: must be in"):
        validate_config(c, num_devices=8)


def test_every_llm_role_takes_the_configured_limit():
    """RISED's tagger, HarnessRL's attributor and proposer and ARISE's reflection, each built
    from its method's config as a run builds it, stop at ``llm_roles.max_failure_rate``."""
    from configs import arise, harness_rl, rised
    from rubric_rl.config.builders import build_domain
    from rubric_rl.methods.arise.arise import domain_kwargs, make_arise_controller
    from rubric_rl.methods.arise.arise_config import arise_controller_kwargs
    from rubric_rl.methods.harness_rl.builder import make_harness_controller
    from rubric_rl.methods.rised import rised_controllers

    def configured(module, **sections):
        c = module.get_config("smoke")
        c.llm_roles.max_failure_rate = 0.25
        for path, value in sections.items():
            section, key = path.split("__")
            c[section][key] = value
        return c

    c = configured(rised, rised__tagger="llm")
    c.judge.llm.update(backend="openai", model="m", base_url="http://127.0.0.1:9")
    (tagger,) = [ctl.tagger for ctl in rised_controllers(c, build_domain(c)) if
                 hasattr(ctl, "tagger")]  # fmt: skip
    assert isinstance(tagger, LLMTagger) and tagger.failure_stop.max_rate == 0.25

    c = configured(harness_rl, harness__evolver="llm")
    client = LocalEngineClient(lambda m, p: "{}", max_concurrency=1)
    ctl = make_harness_controller(c, build_domain(c), llm_client=client)
    assert [r.failure_stop.max_rate for r in ctl.llm] == [0.25, 0.25]
    assert [r.failure_stop.role for r in ctl.llm] == [
        "HarnessRL LLM attributor", "HarnessRL LLM proposer",
    ]  # fmt: skip

    c = configured(arise, arise__reflection="llm")
    domain = build_domain(c)
    kw = arise_controller_kwargs(c)
    ctl = make_arise_controller(
        domain.train, 4, seed=0, llm_client=client, **kw, **domain_kwargs(domain)
    )
    assert ctl.reflection.failure_stop.max_rate == 0.25


def _roundtrip(state):
    return json.loads(json.dumps(state))  # as the checkpoint's run_state stores it


def test_a_resumed_role_remembers_its_recent_failures():
    """The failure window is part of each role's checkpointed state: after three failed calls
    and a checkpoint, a resumed role stops at the fourth failure as the uninterrupted role does
    (with a fresh window it would need four more). A checkpoint without a window (written
    before it was saved) resumes with an empty one."""
    failing = LocalEngineClient(lambda m, p: "not json", max_concurrency=1)
    args = ("t", ["c1"], [1.0], ["says hello"], np.array([[1.0, 0.0]]), ["hello", "bye"])
    before = LLMAttributor(failing)
    for _ in range(3):
        with pytest.raises(LLMEvolverError):
            before.attribute(*args)
    state = _roundtrip(before.state_dict())
    assert state["failure_stop"]["outcomes"] == [False] * 3
    resumed = LLMAttributor(failing)
    resumed.load_state_dict(state)
    assert resumed.stats() == {"calls": 3, "accepted": 0, "rejected": 3}
    with pytest.raises(LLMRoleError, match=r"^HarnessRL LLM attributor: 4 of its last 4 calls"):
        resumed.attribute(*args)
    old = LLMAttributor(failing)
    old.load_state_dict({k: v for k, v in state.items() if k != "failure_stop"})
    with pytest.raises(LLMEvolverError):  # an empty window: below min_calls, no stop yet
        old.attribute(*args)

    tagger = _tagger(lambda user: True)
    tagger.tag_batch([TASK] * 3, [f"answer {i}" for i in range(3)], [0.0] * 3, step=1)
    resumed_tagger = _tagger(lambda user: True)
    resumed_tagger.load_state_dict(_roundtrip(tagger.state_dict()))
    with pytest.raises(LLMRoleError, match=r"^RISED LLM tagger: 4 of its last 4 calls"):
        resumed_tagger.tag_batch([TASK], ["answer 3"], [0.0], step=2)


def test_the_harness_and_arise_controllers_checkpoint_their_roles_windows():
    from configs import arise, harness_rl
    from rubric_rl.config.builders import build_domain
    from rubric_rl.methods.arise.arise import domain_kwargs, make_arise_controller
    from rubric_rl.methods.arise.arise_config import arise_controller_kwargs
    from rubric_rl.methods.harness_rl.builder import make_harness_controller

    client = LocalEngineClient(lambda m, p: "{}", max_concurrency=1)
    c = harness_rl.get_config("smoke")
    c.harness.evolver = "llm"
    domain = build_domain(c)
    ctl = make_harness_controller(c, domain, llm_client=client)
    ctl.attributor.reject("bad reply")
    ctl.proposer.accept()
    state = _roundtrip(ctl.state_dict())
    resumed = make_harness_controller(c, domain, llm_client=client)
    resumed.load_state_dict(state)
    assert resumed.attributor.failure_stop.state_dict() == {
        "outcomes": [False], "last_error": "bad reply",
    }  # fmt: skip
    assert resumed.proposer.failure_stop.state_dict() == {"outcomes": [True], "last_error": None}
    del state["llm"]  # a checkpoint from before the windows were saved
    make_harness_controller(c, domain, llm_client=client).load_state_dict(state)

    c = arise.get_config("smoke")
    c.arise.reflection = "llm"
    domain = build_domain(c)
    kw = arise_controller_kwargs(c)
    ctl = make_arise_controller(
        domain.train, 4, seed=0, llm_client=client, **kw, **domain_kwargs(domain)
    )
    ctl.reflection.reject("bad reply")
    resumed = make_arise_controller(
        domain.train, 4, seed=0, llm_client=client, **kw, **domain_kwargs(domain)
    )
    resumed.load_state_dict(_roundtrip(ctl.state_dict()))
    assert resumed.reflection.failure_stop.outcomes.count(False) == 1
    assert resumed.reflection.last_error == "bad reply"
