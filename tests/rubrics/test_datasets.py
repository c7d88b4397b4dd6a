"""Dataset loaders: exact parsed values on the fixtures, errors naming file/row/field, lenient
mode, our JSONL round trip, directory splits and limits."""

import json
import logging
import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rubric_rl.rubrics.datasets import (
    HARD_RULE_WEIGHT,
    PRINCIPLE_WEIGHT,
    DatasetError,
    LoadReport,
    dump_tasks,
    load_tasks,
    load_tasks_with_report,
)
from rubric_rl.rubrics.types import CriterionStatus, Verifier

DATA = os.path.join(os.path.dirname(__file__), "..", "data")
FIXTURES = {
    "healthbench": "healthbench_sample.jsonl",
    "rar": "rar_sample.json",
    "rubrichub": "rubrichub_sample.jsonl",
    "openrubrics": "openrubrics_sample.jsonl",
    "jsonl": "tasks_sample.jsonl",
}


def _load(fmt, **kw):
    return load_tasks(os.path.join(DATA, FIXTURES[fmt]), fmt, **kw)


def _weights(task):
    return [c.weight for c in task.rubric]


def test_healthbench_fixture():
    t0, t1 = _load("healthbench")
    assert t0.id == "hb-0001" and t1.id == "hb-0002"
    assert _weights(t0) == [7.0, -8.0, 2.0]
    assert [c.id for c in t0.rubric] == ["hb-0001/c0", "hb-0001/c1", "hb-0001/c2"]
    assert t0.rubric.criteria[1].text == "Recommends giving aspirin to the child."
    assert t0.rubric.criteria[1].polarity == "pitfall"
    assert t0.rubric.criteria[2].tags == (
        "level:cluster",
        "cluster:communication",
        "axis:communication_quality",
    )
    assert t0.rubric.aggregation == "healthbench"
    assert t0.reference_answer == "Please see a pediatrician today."
    assert t0.task_type == "emergency_referrals"
    assert t0.capabilities == (
        "theme:emergency_referrals",
        "physician_agreed_category:not-emergent",
    )
    assert [m.role for m in t1.prompt] == ["system", "user", "assistant", "user"]
    assert t1.question == "No, none."
    assert _weights(t1) == [5.5] and t1.reference_answer is None
    assert all(c.verifier == Verifier() for c in t0.rubric)


def test_rar_fixture_numeric_category_and_list_weights():
    t0, t1, t2 = _load("rar")
    assert _weights(t0) == [5.0, 3.0, -2.0]
    assert t0.rubric.criteria[0].title == "Names a first-line class"
    assert (
        t0.rubric.criteria[0].text
        == "Essential Criteria: Names at least one first-line drug class."
    )
    assert t0.reference_answer.startswith("A thiazide diuretic")
    assert t0.task_type == "medical_o1" and t0.question.startswith("Which drug")
    # Category strings: Essential 5, Important 4, Optional 1, Pitfall -1.
    assert _weights(t1) == [5.0, 4.0, 1.0, -1.0]
    assert t2.id == "rar-list-1"
    assert _weights(t2) == [5.0, 2.0, -1.0]
    assert t2.rubric.criteria[1].text == "Gives its atomic number."
    # Content-hash ids are deterministic and differ across rows.
    assert t0.id.startswith("rar-") and len(t0.id) == 16 and t0.id != t1.id
    assert [t.id for t in _load("rar")] == [t0.id, t1.id, t2.id]


def test_rubrichub_fixture_routes_rule_verifiers():
    t0, t1, t2 = _load("rubrichub")
    assert _weights(t0) == [10.0, 3.0, 2.0, -5.0]
    assert t0.domain == "rubrichub_math" and t0.task_type == "math"
    c = t0.rubric.criteria
    assert c[0].verifier == Verifier.rule("math_verify", answer="42")
    assert c[1].verifier == Verifier.rule("word_count_max", max_words=50)  # JSON-string params
    assert c[0].tags == ("function:math_verify", "verifier:rule")
    assert c[2].verifier == Verifier() and c[2].tags == ("verifier:llm",)
    assert c[3].verifier == Verifier() and c[3].tags == ()
    # reward_model as a JSON string with the rubric list in ground_truth; string prompt.
    assert t1.question == "Write a haiku about rain." and t1.prompt[0].role == "user"
    assert _weights(t1) == [4.0, 6.0]
    assert t1.rubric.criteria[0].verifier == Verifier.rule("line_count")
    assert t1.rubric.criteria[1].tags == ("axis:content",)
    assert t1.reference_answer == "Soft rain on the roof"
    assert t2.id == "rh-3" and t2.question == "Say hello." and _weights(t2) == [1.0]


def test_rule_args_with_lists_stay_hashable_and_round_trip(tmp_path):
    tags = {"verifier": "rule", "function": "contains_all", "parameters": {"words": ["a", "b"]}}
    row = {
        "prompt": "p",
        "reward_model": {"rubrics": [{"criterion": "c", "points": 2, "tags": tags}]},
    }
    (t,) = load_tasks(_write_jsonl(tmp_path / "r.jsonl", [row]), "rubrichub")
    assert t.rubric.criteria[0].verifier.kwargs == {"words": ("a", "b")}
    assert isinstance(hash(t), int)
    assert load_tasks(dump_tasks([t], str(tmp_path / "o.jsonl")), "jsonl") == [t]


def test_rubrichub_verl_parquet(tmp_path):
    tags_t = pa.struct(
        [("verifier", pa.string()), ("function", pa.string()), ("parameters", pa.string())]
    )
    item_t = pa.struct([("criterion", pa.string()), ("points", pa.int64()), ("tags", tags_t)])
    schema = pa.schema(
        [
            ("prompt", pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))),
            ("data_source", pa.string()),
            ("ability", pa.string()),
            ("reward_model", pa.struct([("style", pa.string()), ("rubrics", pa.list_(item_t))])),
            ("extra_info", pa.struct([("index", pa.int64())])),
        ]
    )
    rows = [
        {
            "prompt": [{"role": "user", "content": f"Q{i}"}],
            "data_source": "rubrichub",
            "ability": "science",
            "reward_model": {
                "style": "rubric",
                "rubrics": [
                    {
                        "criterion": "Exact.",
                        "points": 10,
                        "tags": {
                            "verifier": "rule",
                            "function": "exact_match",
                            "parameters": '{"target": "4"}',
                        },
                    },
                    {
                        "criterion": "Rude.",
                        "points": -3,
                        "tags": {"verifier": "llm", "function": "", "parameters": ""},
                    },
                ],
            },
            "extra_info": {"index": i},
        }
        for i in range(3)
    ]
    path = str(tmp_path / "train-00000-of-00001.parquet")
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), path)
    tasks = load_tasks(tmp_path, "rubrichub", split="train")
    assert [t.question for t in tasks] == ["Q0", "Q1", "Q2"]
    assert _weights(tasks[0]) == [10.0, -3.0]
    assert tasks[0].rubric.criteria[0].verifier == Verifier.rule("exact_match", target="4")
    assert tasks[0].rubric.criteria[1].verifier == Verifier()
    assert len({t.id for t in tasks}) == 3
    assert len(load_tasks(path, "rubrichub", limit=2)) == 2


def test_openrubrics_fixture():
    t0, t1 = _load("openrubrics")
    assert t0.id == "or-1" and t0.domain == "ultrafeedback"
    texts = [c.text for c in t0.rubric]
    assert texts == [
        "The response must list exactly three colours.",
        "The response must put each colour on its own line.",
        "The response should be concise and avoid unnecessary explanation.",  # wrapped item
        "The response should use consistent formatting.",  # marker at the start
    ]
    assert _weights(t0) == [HARD_RULE_WEIGHT] * 2 + [PRINCIPLE_WEIGHT] * 2 == [3.0, 3.0, 1.0, 1.0]
    assert [c.tags for c in t0.rubric] == [("hard_rule",)] * 2 + [("principle",)] * 2
    assert [c.text for c in t1.rubric] == [
        "The response must mention sunlight.",
        "The response should use simple words.",
    ]
    assert t1.domain == "openrubrics" and t1.question.startswith("Explain photosynthesis")


def test_our_jsonl_fixture_keeps_lifecycle_fields():
    (t,) = _load("jsonl")
    c0, c1 = t.rubric.criteria
    assert c0.verifier == Verifier.rule("item_count", n=2)
    assert (c0.anchor, c0.capability, c0.title, c0.tags) == (
        True,
        "counting",
        "count",
        ("counting",),
    )
    assert c1.weight == -1.5 and c1.status == CriterionStatus.PROPOSED
    assert (c1.origin, c1.created_step, c1.parent_id, c1.skill) == (
        "harness",
        12,
        "ours-1/c0",
        "Only list fruits.",
    )
    assert (t.domain, t.task_type, t.capabilities, t.reference_answer) == (
        "constraints",
        "list",
        ("counting",),
        "apple, pear",
    )


def test_env_name_is_the_rows_category_else_the_format(tmp_path):
    # healthbench: theme tag; rar: question_source; rubrichub: data_source; openrubrics:
    # source/domain; jsonl: its env_name, else its domain, else the format name.
    envs = {fmt: [t.env_name for t in _load(fmt)] for fmt in FIXTURES}
    assert envs["healthbench"][0] == "emergency_referrals"
    assert envs["rar"][0] == "medical_o1"
    assert envs["rubrichub"][0] == "rubrichub_math"
    assert envs["openrubrics"] == ["ultrafeedback", "openrubrics"]
    assert envs["jsonl"] == ["constraints"]  # env_name null in the file -> its domain
    assert all(e for es in envs.values() for e in es)
    bare = {"prompt": "p", "reward_model": {"rubrics": [{"criterion": "c", "points": 1}]}}
    (t,) = load_tasks(_write_jsonl(tmp_path / "rh.jsonl", [bare]), "rubrichub")
    assert t.env_name == "rubrichub"
    hb = {"prompt_id": "p1", "prompt": "hi", "rubrics": [{"criterion": "c", "points": 1}]}
    (t,) = load_tasks(_write_jsonl(tmp_path / "hb.jsonl", [hb]), "healthbench")
    assert t.env_name == "healthbench"
    criterion = {"id": "c", "text": "t", "weight": 1}
    ours = {
        "id": "o",
        "prompt": [{"role": "user", "content": "q"}],
        "rubric": {"criteria": [criterion]},
    }
    rows = [ours, dict(ours, id="o2", domain="d"), dict(ours, id="o3", domain="d", env_name="sql")]
    loaded = load_tasks(_write_jsonl(tmp_path / "ours.jsonl", rows), "jsonl")
    assert [t.env_name for t in loaded] == ["jsonl", "d", "sql"]


@pytest.mark.parametrize("suffix", [".jsonl", ".jsonl.gz"])
def test_jsonl_round_trip_of_every_fixture(tmp_path, suffix):
    tasks = [t for fmt in FIXTURES for t in _load(fmt)]
    path = dump_tasks(tasks, str(tmp_path / f"all{suffix}"))
    again = load_tasks(path, "jsonl")
    assert again == tasks
    assert [t.rubric.aggregation for t in again] == [t.rubric.aggregation for t in tasks]


# --- malformed rows ---------------------------------------------------------------------------

HB_GOOD = {
    "prompt_id": "p1",
    "prompt": [{"role": "user", "content": "hi"}],
    "rubrics": [{"criterion": "Greets.", "points": 3, "tags": []}],
}


def _write_jsonl(path, rows):
    with open(path, "w") as f:
        for r in rows:
            f.write(r if isinstance(r, str) else json.dumps(r))
            f.write("\n")
    return str(path)


def _with(row, **changes):
    row = json.loads(json.dumps(row))
    for k, v in changes.items():
        if v is None:
            row.pop(k)
        else:
            row[k] = v
    return row


BAD_HEALTHBENCH = [
    (_with(HB_GOOD, prompt_id="p2", rubrics=None), "rubrics", "missing"),
    (
        _with(HB_GOOD, prompt_id="p2", rubrics=[{"criterion": "x", "points": "seven"}]),
        "rubrics[0].points",
        "non-zero number",
    ),
    (
        _with(
            HB_GOOD,
            prompt_id="p2",
            rubrics=[{"criterion": "x", "points": 2}, {"criterion": "y", "points": 0}],
        ),
        "rubrics[1].points",
        "λ ≠ 0",
    ),
    (
        _with(HB_GOOD, prompt_id="p2", rubrics=[{"criterion": "x", "points": True}]),
        "rubrics[0].points",
        "bool",
    ),
    (
        _with(HB_GOOD, prompt_id="p2", rubrics=[{"criterion": "", "points": 1}]),
        "rubrics[0].criterion",
        "non-empty",
    ),
    (
        _with(HB_GOOD, prompt_id="p2", prompt=[{"role": "robot", "content": "x"}]),
        "prompt[0].role",
        "role",
    ),
    (_with(HB_GOOD, prompt_id="p2", prompt=[]), "prompt", "at least one message"),
    (_with(HB_GOOD, rubrics=[{"criterion": "x", "points": 1}]), "id", "duplicate task id 'p1'"),
    ('{"prompt_id": "p2", "prompt": [', "<json>", "invalid JSON"),
    ("[1, 2]", "<row>", "JSON object"),
]


@pytest.mark.parametrize("bad,field,expected", BAD_HEALTHBENCH)
def test_malformed_healthbench_row_names_file_row_field(tmp_path, bad, field, expected):
    path = _write_jsonl(tmp_path / "hb.jsonl", [HB_GOOD, "", bad])  # blank line 2: bad is row 3
    with pytest.raises(DatasetError) as info:
        load_tasks(path, "healthbench")
    err = info.value
    assert (err.file, err.row, err.field) == (path, 3, field)
    assert str(err).startswith(f"{path}:3: field {field!r}")
    assert expected in str(err)


@pytest.mark.parametrize(
    "fmt,row,field",
    [
        (
            "rar",
            {"question": "q", "rubric": [{"description": "d", "weight": "Critical"}]},
            "rubric[0].weight",
        ),
        (
            "rar",
            {"question": "q", "rubric": [{"description": "d", "weight": 0}]},
            "rubric[0].weight",
        ),
        ("rar", {"question": "q", "rubric_list": ["no prefix"]}, "rubric_list[0]"),
        ("rar", {"rubric": [{"description": "d", "weight": 1}]}, "question"),
        (
            "rubrichub",
            {
                "prompt": "p",
                "reward_model": {
                    "rubrics": [{"criterion": "c", "points": 1, "tags": {"verifier": "rule"}}]
                },
            },
            "reward_model.rubrics[0].tags.function",
        ),
        (
            "rubrichub",
            {
                "prompt": "p",
                "reward_model": {
                    "rubrics": [{"criterion": "c", "points": 1, "tags": {"verifier": "human"}}]
                },
            },
            "reward_model.rubrics[0].tags.verifier",
        ),
        ("rubrichub", {"prompt": "p", "reward_model": "{not json"}, "reward_model"),
        ("rubrichub", {"prompt": "p", "reward_model": {"style": "rubric"}}, "reward_model.rubrics"),
        ("rubrichub", {"reward_model": {"rubrics": []}}, "prompt"),
        (
            "openrubrics",
            {"instruction": "i", "rubric": "1. Be nice.\n2. Be short. [Principle]"},
            "rubric[item 1]",
        ),
        ("openrubrics", {"instruction": "i", "rubric": "Be nice."}, "rubric"),
        (
            "jsonl",
            {
                "id": "t",
                "prompt": [{"role": "user", "content": "x"}],
                "rubric": {"criteria": []},
                "colour": 1,
            },
            "colour",
        ),
        (
            "jsonl",
            {
                "id": "t",
                "prompt": [{"role": "user", "content": "x"}],
                "rubric": {"criteria": [{"id": "a", "text": "b", "weight": 0}]},
            },
            "rubric.criteria[0].weight",
        ),
        (
            "jsonl",
            {
                "id": "t",
                "prompt": [{"role": "user", "content": "x"}],
                "rubric": {"criteria": [{"id": "a", "text": "b", "status": "gone", "weight": 1}]},
            },
            "rubric.criteria[0].status",
        ),
        (
            "jsonl",
            {
                "id": "t",
                "prompt": [{"role": "user", "content": "x"}],
                "rubric": {
                    "criteria": [
                        {"id": "a", "text": "b", "verifier": {"kind": "rule"}, "weight": 1}
                    ]
                },
            },
            "rubric.criteria[0].verifier",
        ),
    ],
)
def test_malformed_rows_other_formats(tmp_path, fmt, row, field):
    path = _write_jsonl(tmp_path / "bad.jsonl", [row])
    with pytest.raises(DatasetError) as info:
        load_tasks(path, fmt)
    assert (info.value.file, info.value.row, info.value.field) == (path, 1, field)
    assert f"{path}:1: field {field!r}" in str(info.value)


def test_lenient_skips_are_counted_and_logged(tmp_path, caplog):
    rows = [
        HB_GOOD,
        "{bad json",
        _with(HB_GOOD, prompt_id="p2", rubrics=[{"criterion": "x", "points": 0}]),
        _with(HB_GOOD, prompt_id="p3"),
    ]
    path = _write_jsonl(tmp_path / "hb.jsonl", rows)
    with pytest.raises(DatasetError):
        load_tasks(path, "healthbench")
    with caplog.at_level(logging.WARNING):
        tasks, report = load_tasks_with_report(path, "healthbench", lenient=True)
    assert [t.id for t in tasks] == ["p1", "p3"]
    assert (report.rows_read, report.tasks_loaded, report.num_skipped) == (4, 2, 2)
    assert [(s.row, s.field) for s in report.skipped] == [(2, "<json>"), (3, "rubrics[0].points")]
    assert f"{path}:3 field 'rubrics[0].points'" in caplog.text
    assert "skipped 2 malformed rows" in caplog.text
    report2 = LoadReport()
    assert len(load_tasks(path, "healthbench", lenient=True, report=report2)) == 2
    assert report2.num_skipped == 2 and report2.files == [path]


def test_directory_split_limit_and_errors(tmp_path):
    _write_jsonl(tmp_path / "train.jsonl", [HB_GOOD, _with(HB_GOOD, prompt_id="p2")])
    _write_jsonl(tmp_path / "test.jsonl", [_with(HB_GOOD, prompt_id="p9")])
    assert [t.id for t in load_tasks(tmp_path, "healthbench", split="train")] == ["p1", "p2"]
    assert [t.id for t in load_tasks(tmp_path, "healthbench", split="test")] == ["p9"]
    assert [t.id for t in load_tasks(tmp_path, "healthbench", limit=1)] == ["p9"]  # sorted files
    assert load_tasks(tmp_path, "healthbench", limit=0) == []
    with pytest.raises(DatasetError, match="split"):
        load_tasks(tmp_path, "healthbench", split="val")
    with pytest.raises(KeyError, match="unknown dataset format 'csv'"):
        load_tasks(tmp_path, "csv")
    with pytest.raises(FileNotFoundError):
        load_tasks(tmp_path / "nope.jsonl", "healthbench")


def test_content_ids_do_not_depend_on_row_order(tmp_path):
    with open(os.path.join(DATA, FIXTURES["openrubrics"])) as f:
        lines = [ln for ln in f.read().splitlines() if ln.strip()]
    fwd = load_tasks(_write_jsonl(tmp_path / "a.jsonl", lines), "openrubrics")
    rev = load_tasks(_write_jsonl(tmp_path / "b.jsonl", lines[::-1]), "openrubrics")
    assert {t.id: t for t in fwd} == {t.id: t for t in rev}
