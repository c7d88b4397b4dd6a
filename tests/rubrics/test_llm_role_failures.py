"""A failure-rate stop for every LLM role besides the judge (``rubrics.llm.FailureRateStop``):
RISED's tagger, HarnessRL's attributor and proposer, ARISE's reflection stop the run, naming the
role, when most of their recent calls fail, instead of training on what the failures left empty."""

import json

import numpy as np
import pytest

from rubric_rl.methods.harness_rl.llm_evolver import LLMAttributor, LLMEvolverError
from rubric_rl.methods.rised.rised_llm_tagger import LLMTagger
from rubric_rl.rubrics.llm import FailureRateStop, LLMRoleError, LocalEngineClient
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
