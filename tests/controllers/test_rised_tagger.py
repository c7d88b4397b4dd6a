"""RISED tagging: profiles, top rubrics, reliability, the programmatic tagger of the embedded
domain (exact tags on hand-written responses; no hidden field read), the embedded warm-up and the
LLM tagger (through a LocalEngineClient: parsing, discovered names, retry, failure)."""

import dataclasses
import json
import math
import re

import numpy as np
import pytest

from rubric_rl.envs.constraint_behaviours import constraint_behaviours
from rubric_rl.envs.constraint_domain import task_bank
from rubric_rl.methods.rised.rised_tagger import (
    LLMTagger,
    ProgrammaticTagger,
    Tags,
    group_profile,
    parse_tags,
    profile,
    reliability,
    tagger_catalogue,
    top_negative,
    top_positive,
    warmup_vocabulary,
)
from rubric_rl.rubrics.llm import LocalEngineClient
from rubric_rl.rubrics.vocabulary import RubricEntry, Vocabulary

EMBEDDED = constraint_behaviours()


def _small_vocab():
    return Vocabulary(
        (
            RubricEntry("a_pos", "s", "positive", "A."),
            RubricEntry("b_neg", "s", "negative", "B."),
            RubricEntry("c_pos", "s", "positive", "C."),
            RubricEntry("d_pos", "t", "positive", "D."),
            RubricEntry("e_neg", "t", "negative", "E."),
        ),
        aliases={"alias_of_b": "b_neg"},
    )


# --- Tags, profiles, top rubrics, reliability ----------------------------------------------------


def test_tags_validate_and_failures_are_explicit():
    with pytest.raises(ValueError, match="integer >= 1"):
        Tags({"a_pos": 0})
    with pytest.raises(ValueError, match="failed tagging has an error and no tags"):
        Tags({"a_pos": 1}, failed=True, error="x")
    with pytest.raises(ValueError, match="failed tagging has an error"):
        Tags({}, failed=True)
    t = Tags.failure("judge down")
    assert t.failed and t.error == "judge down" and t.counts == {}


def test_profile_and_group_profile():
    v = _small_vocab()
    t1 = Tags({"a_pos": 2, "e_neg": 1}, {"new_thing": 3})
    t2 = Tags({"a_pos": 1, "b_neg": 4})
    np.testing.assert_array_equal(profile(t1, v), [2, 0, 0, 0, 1])
    assert profile(t1, v).dtype == np.float64
    failed = Tags.failure("x")
    np.testing.assert_array_equal(profile(failed, v), np.zeros(5))
    np.testing.assert_array_equal(group_profile([t1, failed, t2], v), [3, 4, 0, 0, 1])
    with pytest.raises(ValueError, match="'zzz' is not a rubric id"):
        profile(Tags({"zzz": 1}), v)


def test_top_positive_orders_by_count_then_vocabulary_index():
    v = _small_vocab()
    t = Tags({"d_pos": 2, "c_pos": 2, "a_pos": 1, "b_neg": 9, "e_neg": 2})
    assert top_positive(t, v) == ["c_pos", "d_pos", "a_pos"]  # c before d: tie, lower index
    assert top_positive(t, v, k=2) == ["c_pos", "d_pos"]
    assert top_negative(t, v) == ["b_neg", "e_neg"]
    assert top_positive({"d_pos": 1, "a_pos": 1, "c_pos": 0}, v) == ["a_pos", "d_pos"]
    assert top_positive(np.array([0, 5, 1, 3, 0.0]), v, k=1) == ["d_pos"]
    assert top_positive(Tags.failure("x"), v) == [] and top_positive(Tags({}), v) == []


def test_reliability_by_hand():
    v = _small_vocab()
    a = [
        Tags({"a_pos": 1, "b_neg": 1}),  # vs {a_pos: 1}: J = 1/2, cos = 1/sqrt(2)
        Tags({"c_pos": 2}),  # vs {c_pos: 1}: identical set, J = 1, cos = 1
        Tags({}),  # vs {}: identical, J = 1, cos = 1 (both zero)
        Tags({"a_pos": 1}),  # vs failed: not compared
    ]
    b = [Tags({"a_pos": 1}), Tags({"c_pos": 1}), Tags({}), Tags.failure("x")]
    r = reliability(a, b, v)
    assert r["compared"] == 3
    assert r["identical"] == pytest.approx(2 / 3)
    assert r["jaccard_mean"] == pytest.approx((0.5 + 1 + 1) / 3)
    assert r["jaccard_median"] == pytest.approx(1.0)
    assert r["cosine_mean"] == pytest.approx((1 / math.sqrt(2) + 1 + 1) / 3)
    # Disjoint sets, and one side empty: J = 0, cos = 0.
    r = reliability([Tags({"a_pos": 1}), Tags({})], [Tags({"b_neg": 2}), Tags({"d_pos": 1})], v)
    assert r == {
        "identical": 0.0,
        "jaccard_mean": 0.0,
        "jaccard_median": 0.0,
        "cosine_mean": 0.0,
        "compared": 2.0,
    }
    assert math.isnan(reliability([Tags.failure("x")], [Tags({})], v)["identical"])
    with pytest.raises(ValueError, match="1 taggings against 2"):
        reliability([Tags({})], [Tags({}), Tags({})], v)


# --- the programmatic tagger ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def tasks():
    ts = task_bank("train", 30, seed=0)
    by_prompt = {t.question: t for t in ts}
    return {
        "list_5_animals": by_prompt[
            "list 5 animals . end with ! . separate them with / . sort them alphabetically"
        ],
        "list_5_tools": by_prompt[
            "list 5 tools . do not use saw . sort them in reverse alphabetical order"
        ],
        "plus": by_prompt["what is 3 plus 9 ? use uppercase"],
        "colors": by_prompt["list 5 colors . use lowercase . include gray"],
        "reverse": by_prompt["rewrite : london oslo delhi black tiger in reverse order"],
    }


def test_programmatic_tags_a_list_answer_with_a_repeat_and_praise(tasks):
    tagger = ProgrammaticTagger(EMBEDDED, discovery=True)
    got = tagger.tag(
        tasks["list_5_animals"], "great question ! cat / dog / dog / lion / tiger !", 0
    )
    assert got.counts == {
        "praise_opener": 1,
        "repeated_item": 1,
        "count_followed": 1,
        "category_followed": 1,
        "end_followed": 1,
        "sep_followed": 1,
        "order_followed": 1,
        "task_failed": 1,  # reward 0 < solved_threshold
    }
    assert not got.failed and got.discovered == {}


def test_programmatic_counts_violations(tasks):
    tagger = ProgrammaticTagger(EMBEDDED, discovery=True)
    got = tagger.tag(tasks["list_5_tools"], "wrench , saw , Knife , saw , axe .", None)
    assert got.counts == {
        "count_followed": 1,
        "category_followed": 1,
        "repeated_item": 1,
        "exclude_violated": 2,  # the forbidden word, twice
        "order_violated": 1,
        "answer_alone": 1,
    }  # no reward: no outcome tag
    got = tagger.tag(tasks["plus"], "twelve as you can see . all requirements met .", 1.0)
    assert got.counts == {
        "answer_followed": 1,
        "case_violated": 5,  # every body word is lowercase, the filler too
        "compliance_claim": 1,
        "filler": 4,  # "as you can see"
        "task_solved": 1,  # reward-informed: the reward decides, not the checks
    }
    got = tagger.tag(tasks["colors"], "red , blue , tiger .", 0.0)
    assert got.counts == {
        "count_violated": 2,  # 3 items for 5
        "category_violated": 1,  # tiger
        "include_violated": 1,
        "case_followed": 1,
        "distinct_items": 1,
        "answer_alone": 1,
        "task_failed": 1,
    }


def test_programmatic_empty_and_overlong(tasks):
    tagger = ProgrammaticTagger(
        constraint_behaviours(overlong_words=6), discovery=True, solved_threshold=None
    )
    got = tagger.tag(tasks["colors"], "", 0.0)
    assert got.counts == {
        "empty_answer": 1,
        "count_violated": 5,
        "category_violated": 1,
        "case_violated": 1,
        "include_violated": 1,
    }  # nothing "followed" by an empty answer; solved_threshold=None: reward unused
    got = tagger.tag(tasks["reverse"], "tiger black delhi oslo london tiger black .", None)
    assert got.counts == {"sequence_violated": 1, "answer_alone": 1, "overlong": 1}


class _Hidden:
    """Stands in for a hidden field: any use of it fails the test."""

    def __getattr__(self, name):
        raise AssertionError(f"hidden field read ({name})")

    def __getitem__(self, key):
        raise AssertionError(f"hidden field read ([{key!r}])")

    def __contains__(self, key):
        raise AssertionError("hidden field read (in)")

    def __bool__(self):
        raise AssertionError("hidden field read (bool)")

    def __iter__(self):
        raise AssertionError("hidden field read (iter)")


def test_programmatic_never_reads_hidden_fields(tasks, monkeypatch):
    from rubric_rl.envs import constraint_domain

    for name in ("hard_constraints", "oracle_quality", "task_requirements", "verify"):
        monkeypatch.setattr(constraint_domain, name, _Hidden())
    tagger = ProgrammaticTagger(EMBEDDED, discovery=True)
    for task in tasks.values():
        hidden = dataclasses.replace(
            task, raw=_Hidden(), rubric=_Hidden(), reference_answer=_Hidden()
        )
        for response in (task.reference_answer, "happy to help ! red red .", ""):
            assert tagger.tag(hidden, response, 0.3) == tagger.tag(task, response, 0.3)
            assert not tagger.tag(hidden, response, 0.3).failed


def test_programmatic_maps_through_the_vocabulary_and_records_failures(tasks):
    vocab = Vocabulary(
        (
            RubricEntry("count_followed", "counting", "positive", "Give n items."),
            RubricEntry("praise_opener", "conciseness", "negative", "Praise."),
        )
    )
    tagger = ProgrammaticTagger(EMBEDDED, vocab)
    got = tagger.tag(tasks["list_5_animals"], "great question ! cat / dog / dog / lion / tiger !")
    assert got.counts == {"count_followed": 1, "praise_opener": 1}
    assert got.discovered == {
        "repeated_item": 1,
        "category_followed": 1,
        "end_followed": 1,
        "sep_followed": 1,
        "order_followed": 1,
    }
    other = dataclasses.replace(tasks["plus"], domain="elsewhere")
    bad = tagger.tag(other, "twelve .", 1.0)
    assert bad.failed and "not a 'constraints' task" in bad.error and bad.counts == {}
    out = tagger.tag_batch([other, tasks["plus"]], ["x", "TWELVE ."], [0.0, 1.0])
    assert [t.failed for t in out] == [True, False]
    with pytest.raises(ValueError, match="2 tasks, 1 responses, 2 rewards"):
        tagger.tag_batch([other, other], ["x"], [0.0, 1.0])
    with pytest.raises(ValueError, match="vocabulary is needed"):
        ProgrammaticTagger(EMBEDDED)


def test_embedded_vocabulary_and_its_cache(tmp_path):
    path = tmp_path / "rised_vocabulary.json"
    vocab = warmup_vocabulary(EMBEDDED, 0, 60, cache_path=path)
    catalogue = tagger_catalogue(EMBEDDED)
    assert len(catalogue) == 38 and set(vocab.ids) <= set(catalogue)
    assert len(vocab) >= 30 and len(vocab.skills) == 10
    assert vocab.entry("count_followed").envs == ("list",)
    assert vocab.entry("sequence_violated").envs == ("rewrite",)
    assert set(vocab.entry("task_failed").envs) == {"format", "list", "rewrite", "short_answer"}
    assert (
        vocab.entry("count_followed").description == "Give exactly the number of items asked for."
    )
    assert (
        vocab.lookup("great question praise") is None and vocab.lookup("praise") == "praise_opener"
    )
    assert Vocabulary.load(path) == vocab
    assert warmup_vocabulary(EMBEDDED, 0, 60, cache_path=path) == vocab  # from the cache
    assert warmup_vocabulary(EMBEDDED, 0, 60) == vocab  # deterministic
    # A cache written with other settings is rebuilt, not reused.
    assert warmup_vocabulary(EMBEDDED, 0, 8, cache_path=path).provenance["n"] == 8
    assert Vocabulary.load(path).provenance["n"] == 8


# --- the LLM tagger ------------------------------------------------------------------------------


def _reply(*tags):
    return json.dumps({"tags": [{"name": n, "count": c} for n, c in tags]})


def _llm(vocab, *replies, **kw):
    """An LLMTagger on an in-process judge answering ``replies`` in order, and its calls."""
    queue, calls = iter(replies), []

    def judge(messages, params):
        calls.append((messages, params))
        return next(queue)

    return LLMTagger(LocalEngineClient(judge, max_concurrency=1), vocab, **kw), calls


def test_parse_tags():
    v = _small_vocab()
    tags, err = parse_tags(
        "```json\n" + _reply(("A Pos", 2), ("alias of b", 1), ("b_neg", 2), ("Brand New!", 1))
        + "\n```",
        v,
    )  # fmt: skip
    assert err is None and tags.counts == {"a_pos": 2, "b_neg": 3}
    assert tags.discovered == {"brand_new": 1}
    assert parse_tags(_reply(), v) == (Tags({}), None)  # nothing applies: a valid answer
    for bad, why in (
        ("not json", "not valid JSON"),
        ('{"tags": {}}', "'tags' list"),
        (_reply(("a_pos", 0)), r"tags\[0\].count"),
        (json.dumps({"tags": [{"count": 1}]}), r"tags\[0\] must be an object"),
        (_reply(("a_pos", 1), ("!!", 1)), r"tags\[1\].name"),
    ):
        tags, err = parse_tags(bad, v)
        assert tags is None and err is not None
        assert re.search(why, err), err


def test_llm_tagger_prompt_and_discovered_names(tasks):
    v = _small_vocab()
    tagger, calls = _llm(v, _reply(("a_pos", 1), ("mystery", 2)), _reply(("e_neg", 1)))
    task = tasks["plus"]
    out = tagger.tag_batch([task, task], ["TWELVE .", "eleven ."], [1.0, 0.0], step=3)
    assert [t.counts for t in out] == [{"a_pos": 1}, {"e_neg": 1}]
    assert out[0].discovered == {"mystery": 2}
    system, user = calls[0][0][0]["content"], calls[0][0][1]["content"]
    assert '{"tags": [{"name": "...", "count": 1}]}' in system
    assert "### s\n- a_pos (positive)\n- b_neg (negative)\n- c_pos (positive)\n### t" in user
    assert task.question in user and "TWELVE ." in user and "## Reward\n1" in user
    assert "short_answer" in user  # the environment
    assert calls[0][1]["json_schema"]["required"] == ["tags"]
    s = tagger.stats()
    assert s["calls"] == 2 and s["tagged"] == 2 and s["retries"] == 0 and s["failed"] == 0
    assert s["discovered_share"] == pytest.approx(1 / 3)  # 1 discovered of 3 names


def test_llm_tagger_attributes_tags_by_outcome(tasks):
    # The judge answers against the prompt (a failure with a positive, a success with a
    # negative): those tags are withheld, never attributed; outcome_threshold=None keeps them.
    v = _small_vocab()
    replies = (_reply(("a_pos", 1), ("b_neg", 2)), _reply(("c_pos", 1), ("e_neg", 1)))
    task = tasks["plus"]
    out = _llm(v, *replies)[0].tag_batch([task, task], ["TWELVE .", "eleven ."], [1.0, 0.0])
    assert [(t.counts, t.withheld) for t in out] == [
        ({"a_pos": 1}, {"b_neg": 2}),
        ({"e_neg": 1}, {"c_pos": 1}),
    ]
    raw = _llm(v, *replies, outcome_threshold=None)[0]
    out = raw.tag_batch([task, task], ["TWELVE .", "eleven ."], [1.0, 0.0])
    assert [t.counts for t in out] == [{"a_pos": 1, "b_neg": 2}, {"c_pos": 1, "e_neg": 1}]
    assert all(not t.withheld for t in out)


def test_llm_tagger_retry_uses_the_shorter_refreshed_list(tasks):
    v = _small_vocab()
    tagger, calls = _llm(
        v,
        "this is not json",
        _reply(("d_pos", 1)),
        retry_candidates=2,
        refresh_every=10,
    )
    # Before any refresh: the first ids. A refresh ranks by counts (ties by index).
    assert tagger.candidates == ("a_pos", "b_neg")
    assert tagger.refresh(0, {"e_neg": 5, "c_pos": 1, "d_pos": 1})
    assert tagger.candidates == ("e_neg", "c_pos")
    assert not tagger.refresh(9, {"a_pos": 100})  # within refresh_every: unchanged
    assert tagger.candidates == ("e_neg", "c_pos")
    got = tagger.tag(tasks["plus"], "TWELVE .", 1.0, step=9)
    assert got.counts == {"d_pos": 1} and not got.failed
    retry_user = calls[1][0][1]["content"]
    assert "- e_neg (negative)" in retry_user and "- c_pos (positive)" in retry_user
    assert "a_pos" not in retry_user and "b_neg" not in retry_user and "d_pos" not in retry_user
    assert "a_pos" in calls[0][0][1]["content"]  # the primary showed the whole vocabulary
    assert tagger.stats()["retries"] == 1 and tagger.stats()["calls"] == 2
    # Own running counts (default): d_pos was tagged once.
    assert tagger.refresh(10) and tagger.candidates == ("d_pos", "a_pos")
    # tag_batch(step=...) refreshes from the tagger's own counts when due.
    tagger, calls = _llm(v, _reply(("e_neg", 2)), _reply(), retry_candidates=2)
    tagger.tag(tasks["plus"], "x", 0.0, step=0)
    assert tagger.refreshed_at == 0 and tagger.candidates == ("a_pos", "b_neg")
    tagger.tag(tasks["plus"], "x", 0.0, step=10)
    assert tagger.refreshed_at == 10 and tagger.candidates == ("e_neg", "a_pos")


def test_llm_tagger_failure_is_recorded_as_failed(tasks):
    v = _small_vocab()
    tagger, calls = _llm(v, ("x", {"finish_reason": "length"}), _reply(("a_pos", -1)))
    got = tagger.tag(tasks["plus"], "TWELVE .", 1.0)
    assert got.failed and got.counts == {}
    assert "primary: client error" in got.error and "truncated" in got.error
    assert "retry: tags[0].count" in got.error
    s = tagger.stats()
    assert s["failed"] == 1 and s["retries"] == 1 and s["calls"] == 2 and s["tagged"] == 0
    state = json.loads(json.dumps(tagger.state_dict()))
    other, _ = _llm(v)
    other.load_state_dict(state)
    assert other.stats() == s and other.candidates == tagger.candidates


def test_llm_tagger_probe_leaves_its_state_alone(tasks):
    """The reliability probe (``retag_batch``): a second call under another seed; the tagger's
    counts, running profile and retry list stay as they were."""
    from rubric_rl.methods.rised.rised_tags import reliability

    v = _small_vocab()
    # The judge's tags as given (outcome conditioning would withhold b_neg from a success).
    tagger, calls = _llm(
        v, _reply(("a_pos", 1), ("b_neg", 1)), _reply(("a_pos", 1)), outcome_threshold=None
    )
    task = tasks["plus"]
    first = tagger.tag_batch([task], ["TWELVE ."], [1.0], step=4)
    before = (tagger.stats(), tagger.running.copy(), tagger.candidates)
    again = tagger.retag_batch([task], ["TWELVE ."], [1.0], seed=99)
    assert again[0].counts == {"a_pos": 1}
    assert calls[1][1]["seed"] == 99 and calls[0][1]["seed"] == 4
    assert tagger.stats() == before[0] and tagger.candidates == before[2]
    np.testing.assert_array_equal(tagger.running, before[1])
    rel = reliability(first, again, v)
    assert rel["identical"] == 0.0 and rel["jaccard_mean"] == pytest.approx(0.5)
