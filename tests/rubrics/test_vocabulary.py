"""RISED rubric vocabulary: names, validation, files (errors name file / row / field), warm-up."""

import json

import numpy as np
import pytest

from rubric_rl.rubrics.vocabulary import (
    RubricEntry,
    Vocabulary,
    build_vocabulary,
    normalise_name,
)


@pytest.mark.parametrize(
    "name, expected",
    [
        ("Repeated Item!", "repeated_item"),
        ("  praise-opener  ", "praise_opener"),
        ("__Count::Violated__", "count_violated"),
        ("already_ok", "already_ok"),
        ("Step 2 / Retry", "step_2_retry"),
        ("!!!", ""),
    ],
)
def test_normalise_name(name, expected):
    assert normalise_name(name) == expected


def _vocab():
    return Vocabulary(
        (
            RubricEntry("count_ok", "counting", "positive", "Give n items.", ("list",)),
            RubricEntry("praise", "fluff", "negative", "Opening with praise."),
            RubricEntry("count_bad", "counting", "negative", "Wrong number.", ("list", "fmt")),
            RubricEntry("plain", "fluff", "positive", "Answer alone.", ("fmt",)),
        ),
        aliases={"Great Question": "praise", "too_many": "count_bad"},
    )


def test_vocabulary_groups_by_skill_and_answers_queries():
    v = _vocab()
    # Grouped by skill in first-seen order: counting's two rubrics, then fluff's two.
    assert v.ids == ("count_ok", "count_bad", "praise", "plain")
    assert v.skills == ("counting", "fluff")
    assert len(v) == 4 and v.index("praise") == 2 and v.entry("plain").polarity == "positive"
    np.testing.assert_array_equal(v.positive_mask, [True, False, False, True])
    np.testing.assert_array_equal(v.negative_mask, [False, True, True, False])
    assert v.lookup("Count OK") == "count_ok"
    assert v.lookup("great-question!") == "praise"  # alias, normalised
    assert v.lookup("TOO MANY") == "count_bad"
    assert v.lookup("hallucinated_tool") is None
    assert v.for_env("list") == ("count_ok", "count_bad", "praise")
    assert v.for_env("fmt") == ("count_bad", "praise", "plain")
    assert v.for_env("other") == ("praise",)
    with pytest.raises(KeyError, match="nope"):
        v.index("nope")


@pytest.mark.parametrize(
    "kwargs, field",
    [
        (dict(id="Not Normal"), "id"),
        (dict(polarity="good"), "polarity"),
        (dict(description="  "), "description"),
        (dict(skill=""), "skill"),
        (dict(envs="list"), "envs"),
    ],
)
def test_rubric_entry_validation_names_the_field(kwargs, field):
    base = dict(id="x", skill="s", polarity="positive", description="Do x.")
    with pytest.raises(ValueError, match=f"RubricEntry.{field}"):
        RubricEntry(**{**base, **kwargs})


def test_vocabulary_refuses_duplicates_and_bad_aliases():
    a = RubricEntry("a", "s", "positive", "A.")
    with pytest.raises(ValueError, match="duplicate rubric id 'a'"):
        Vocabulary((a, RubricEntry("a", "t", "negative", "B.")))
    with pytest.raises(ValueError, match="not a rubric id"):
        Vocabulary((a,), aliases={"b": "missing"})
    with pytest.raises(ValueError, match="an id itself"):
        Vocabulary((a, RubricEntry("b", "s", "positive", "B.")), aliases={"B": "a"})


def test_save_load_round_trip(tmp_path):
    v = _vocab()
    path = tmp_path / "sub" / "vocab.json"
    v.save(path)
    payload = json.loads(path.read_text())
    assert payload["version"] == 1 and list(payload["skills"]) == ["counting", "fluff"]
    assert payload["skills"]["counting"][1] == {
        "id": "count_bad",
        "polarity": "negative",
        "description": "Wrong number.",
        "envs": ["list", "fmt"],
    }
    assert payload["aliases"] == {"great_question": "praise", "too_many": "count_bad"}
    back = Vocabulary.load(path)
    assert back == v and back.ids == v.ids and back.rubrics == v.rubrics
    assert back.lookup("great question") == "praise"


def _write(tmp_path, skills, **extra):
    path = tmp_path / "v.json"
    path.write_text(json.dumps({"version": 1, "skills": skills, **extra}))
    return path


def _row(**kw):
    return {"id": "a", "polarity": "positive", "description": "Do a.", "envs": [], **kw}


@pytest.mark.parametrize(
    "skills, row, field",
    [
        ({"s": [_row(), _row(id="b", polarity="bad")]}, "skills['s'][1]", "polarity"),
        ({"s": [_row()], "t": [_row(id="b"), _row()]}, "skills['t'][1]", "id"),
        ({"s": [{"id": "a", "polarity": "positive"}]}, "skills['s'][0]", "description"),
        ({"s": [_row(description="")]}, "skills['s'][0]", "description"),
        ({"s": [_row(), _row(id="B b")]}, "skills['s'][1]", "id"),
        ({"s": [_row(envs="list")]}, "skills['s'][0]", "envs"),
    ],
)
def test_load_errors_name_file_row_and_field(tmp_path, skills, row, field):
    path = _write(tmp_path, skills)
    with pytest.raises(ValueError) as err:
        Vocabulary.load(path)
    msg = str(err.value)
    assert str(path) in msg and row in msg and f"field {field!r}" in msg, msg


def test_load_errors_for_the_file_as_a_whole(tmp_path):
    path = tmp_path / "v.json"
    path.write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        Vocabulary.load(path)
    path.write_text(json.dumps({"version": 2, "skills": {}}))
    with pytest.raises(ValueError, match=r"v\.json: field 'version' must be 1"):
        Vocabulary.load(path)
    path = _write(tmp_path, {"s": [_row()]}, aliases={"x": "missing"})
    with pytest.raises(ValueError, match=r"v\.json: .*'missing', not a rubric id"):
        Vocabulary.load(path)


def _catalogue():
    return {
        e.id: e
        for e in (
            RubricEntry("count_ok", "counting", "positive", "Give n items."),
            RubricEntry("count_bad", "counting", "negative", "Wrong number."),
            RubricEntry("praise", "fluff", "negative", "Opening with praise."),
            RubricEntry("plain", "fluff", "positive", "Answer alone."),
            RubricEntry("never_seen", "answer", "positive", "Never emitted."),
        )
    }


def test_build_vocabulary_keeps_observed_entries_with_their_envs():
    weak = [("list", ["count_bad", "Praise"]), ("fmt", ["praise", "made_up_name"])]
    strong = [("list", ["count_ok", "plain"]), ("list", ["plain", "great question"])]
    v = build_vocabulary(weak, strong, _catalogue(), aliases={"great question": "praise"})
    # Observed only (never_seen and the name outside the catalogue are dropped); by skill, id.
    assert v.ids == ("count_bad", "count_ok", "plain", "praise")
    assert v.entry("praise").envs == ("fmt", "list")  # "Praise" + alias "great question"
    assert v.entry("count_bad").envs == ("list",) and v.entry("plain").envs == ("list",)
    assert v.entry("count_ok").description == "Give n items."
    assert v.aliases == {"great_question": "praise"}


def test_build_vocabulary_min_count():
    weak = [("list", ["count_bad", "praise"]), ("fmt", ["praise"])]
    strong = [("list", ["plain"]), ("fmt", ["plain", "praise"])]
    v = build_vocabulary(weak, strong, _catalogue(), min_count=2)
    assert v.ids == ("plain", "praise")  # count_bad once: dropped
    assert v.entry("praise").envs == ("fmt", "list") and v.entry("plain").envs == ("fmt", "list")
    assert build_vocabulary(weak, strong, _catalogue(), min_count=3).ids == ("praise",)
    with pytest.raises(ValueError, match="min_count"):
        build_vocabulary(weak, strong, _catalogue(), min_count=0)
