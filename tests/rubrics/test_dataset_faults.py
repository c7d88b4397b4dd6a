"""Bad rubric data and unreadable dataset files are errors at load time naming the file, the row
(or line / byte offset) and the field: unknown rule checkers, rubrics with no positive weight,
missing weights, non-UTF-8 bytes, gzip under a .jsonl name, truncated .gz and parquet files."""

import gzip
import json
import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rubric_rl.rubrics.checkers import load_builtin_checkers
from rubric_rl.rubrics.datasets import DatasetError, load_tasks, load_tasks_with_report

DATA = os.path.join(os.path.dirname(__file__), "..", "data")
CHECKERS = frozenset(load_builtin_checkers().names())
USER = [{"role": "user", "content": "q"}]


def _ours(task_id, *criteria):
    return {"id": task_id, "prompt": USER, "rubric": {"criteria": list(criteria)}}


def _write_jsonl(path, rows):
    with open(path, "w") as f:
        for r in rows:
            f.write((r if isinstance(r, str) else json.dumps(r)) + "\n")
    return str(path)


def _error(path, fmt, **kw) -> DatasetError:
    with pytest.raises(DatasetError) as info:
        load_tasks(path, fmt, **kw)
    return info.value


# --- rubric data ------------------------------------------------------------------------------

GOOD = {"id": "a", "text": "Answers.", "weight": 2}
MISSPELT = {
    "id": "b",
    "text": "The answer is 4.",
    "weight": 3,
    "verifier": {"kind": "rule", "checker": "cf_answer_iz", "args": {"answer": "4"}},
}


def test_misspelt_rule_checker_names_file_row_field_and_the_close_match(tmp_path):
    path = _write_jsonl(tmp_path / "t.jsonl", [_ours("t1", GOOD), _ours("t2", GOOD, MISSPELT)])
    err = _error(path, "jsonl", checkers=CHECKERS)
    assert (err.file, err.row, err.field) == (path, 2, "rubric.criteria[1].verifier.checker")
    assert str(err).startswith(f"{path}:2: field 'rubric.criteria[1].verifier.checker'")
    assert "unknown checker 'cf_answer_iz'" in str(err)
    assert "did you mean 'cf_answer_is'" in str(err)
    # The right name loads; without the registered names (inspection) nothing is checked.
    fixed = dict(MISSPELT, verifier=dict(MISSPELT["verifier"], checker="cf_answer_is"))
    ok = _write_jsonl(tmp_path / "ok.jsonl", [_ours("t2", GOOD, fixed)])
    (task,) = load_tasks(ok, "jsonl", checkers=CHECKERS)
    assert task.rubric.criteria[1].verifier.checker == "cf_answer_is"
    assert len(load_tasks(path, "jsonl")) == 2


def test_unknown_rubrichub_rule_function_names_its_tags_field(tmp_path):
    rubrichub = os.path.join(DATA, "rubrichub_sample.jsonl")  # RuscaRL's math_verify, ...
    err = _error(rubrichub, "rubrichub", checkers=CHECKERS)
    assert (err.row, err.field) == (1, "reward_model.rubrics[0].tags.function")
    assert "unknown checker 'math_verify'" in str(err)
    row = {
        "prompt": "p",
        "reward_model": {
            "rubrics": [
                {"criterion": "c", "points": 1, "tags": {"verifier": "rule", "function": "x"}},
                {"criterion": "d", "points": 2, "tags": ["verifier:rule", "function:cf_plain"]},
            ]
        },
    }
    (task,) = load_tasks(_write_jsonl(tmp_path / "ok.jsonl", [row]), "rubrichub")
    row["reward_model"]["rubrics"][0]["tags"]["function"] = "cf_non_empty"
    (task,) = load_tasks(_write_jsonl(tmp_path / "ok.jsonl", [row]), "rubrichub", checkers=CHECKERS)
    assert [c.verifier.checker for c in task.rubric] == ["cf_non_empty", "cf_plain"]


NO_POSITIVE = [
    (
        "healthbench",
        {"prompt_id": "p", "prompt": "q", "rubrics": [{"criterion": "Bad.", "points": -5}]},
        "rubrics",
    ),
    ("rar", {"question": "q", "rubric": [{"description": "d", "weight": "Pitfall"}]}, "rubric"),
    ("rar", {"question": "q", "rubric_list": ["[-2] Rude."]}, "rubric_list"),
    (
        "rubrichub",
        {"prompt": "p", "reward_model": {"rubrics": [{"criterion": "c", "points": -1}]}},
        "reward_model.rubrics",
    ),
    (
        "jsonl",
        _ours("t", {"id": "a", "text": "Rude.", "weight": -1}, dict(GOOD, id="b", weight=-2)),
        "rubric.criteria",
    ),
    # The only positive criterion is not judged (retired): every reward would still be NaN.
    (
        "jsonl",
        _ours("t", dict(GOOD, status="retired"), {"id": "b", "text": "Rude.", "weight": -1}),
        "rubric.criteria",
    ),
    ("jsonl", _ours("t"), "rubric.criteria"),
]


@pytest.mark.parametrize("fmt,row,field", NO_POSITIVE)
def test_rubric_without_positive_weight_names_file_row_field(tmp_path, fmt, row, field):
    good = _ours("ok", GOOD) if fmt == "jsonl" else None
    path = _write_jsonl(tmp_path / "neg.jsonl", [r for r in (good, row) if r])
    err = _error(path, fmt)
    assert (err.file, err.row, err.field) == (path, 2 if good else 1, field)
    assert "no judged criterion has a positive weight" in str(err) and "NaN" in str(err)


def test_missing_weight_in_our_jsonl_is_an_error_not_one(tmp_path):
    rows = [_ours("t1", GOOD), _ours("t2", GOOD, {"id": "b", "text": "Short."})]
    path = _write_jsonl(tmp_path / "t.jsonl", rows)
    err = _error(path, "jsonl")
    assert (err.file, err.row, err.field) == (path, 2, "rubric.criteria[1].weight")
    assert "missing" in str(err)
    rows[1]["rubric"]["criteria"][1]["weight"] = None
    assert _error(_write_jsonl(tmp_path / "t.jsonl", rows), "jsonl").field == (
        "rubric.criteria[1].weight"
    )


# --- unreadable files -------------------------------------------------------------------------

HB = {"prompt_id": "p1", "prompt": "hi", "rubrics": [{"criterion": "Greets.", "points": 3}]}


def _hb(i):
    return json.dumps(dict(HB, prompt_id=f"p{i}")).encode() + b"\n"


def test_non_utf8_byte_names_file_line_and_byte_offset(tmp_path):
    path = str(tmp_path / "hb.jsonl")
    bad = b'{"prompt_id": "p2", "prompt": "caf\xe9", "rubrics": []}\n'
    with open(path, "wb") as f:
        f.write(_hb(1) + b"\n" + bad + _hb(3))  # blank line 2: the bad row is line 3
    err = _error(path, "healthbench")
    offset = len(_hb(1)) + 1 + bad.index(b"\xe9")
    assert (err.file, err.row, err.field) == (path, 3, "<bytes>")
    assert "byte 0xe9" in str(err) and f"byte offset {offset}" in str(err)
    assert str(err).startswith(f"{path}:3:")
    tasks, report = load_tasks_with_report(path, "healthbench", lenient=True)
    assert [t.id for t in tasks] == ["p1", "p3"]
    assert [(s.row, s.field) for s in report.skipped] == [(3, "<bytes>")]


def test_non_utf8_byte_in_a_json_file_names_line_and_offset(tmp_path):
    path = str(tmp_path / "rar.json")
    good = b'{"question": "q", "rubric": [{"description": "d", "weight": 1}]}'
    text = b"[\n" + good + b',\n{"question": "\xff"}]'
    with open(path, "wb") as f:
        f.write(text)
    err = _error(path, "rar")
    assert (err.file, err.row, err.field) == (path, 3, "<bytes>")
    offset = text.index(b"\xff")
    assert f"byte offset {offset}" in str(err)


def test_gzip_file_named_jsonl_is_named_and_told_to_be_renamed(tmp_path):
    path = str(tmp_path / "hb.jsonl")
    with gzip.open(path, "wb") as f:
        f.write(_hb(1))
    err = _error(path, "healthbench")
    assert (err.file, err.row, err.field) == (path, None, "<file>")
    assert "gzip-compressed" in str(err) and f"{path}.gz" in str(err)
    os.rename(path, path + ".gz")
    assert [t.id for t in load_tasks(path + ".gz", "healthbench")] == ["p1"]


def test_truncated_gzip_names_file_and_the_line_reached(tmp_path):
    path = str(tmp_path / "hb.jsonl.gz")
    with gzip.open(path, "wb") as f:
        for i in range(2000):
            f.write(_hb(i))
    data = open(path, "rb").read()
    with open(path, "wb") as f:
        f.write(data[: len(data) // 2])
    err = _error(path, "healthbench")
    assert err.file == path and err.field == "<file>" and 1 < err.row <= 2000
    assert "truncated" in str(err) and str(err).startswith(f"{path}:{err.row}:")


def test_truncated_parquet_names_the_file(tmp_path):
    path = str(tmp_path / "train.parquet")
    rows = [{"prompt": f"p{i}", "reward_model": json.dumps({"rubrics": []})} for i in range(3000)]
    pq.write_table(pa.Table.from_pylist(rows), path)
    data = open(path, "rb").read()
    with open(path, "wb") as f:
        f.write(data[: len(data) // 2])
    err = _error(path, "rubrichub")
    assert (err.file, err.field) == (path, "<parquet>")
    assert str(err).startswith(f"{path}: field '<parquet>': not a readable parquet file")


def test_split_matches_a_word_of_the_path_not_a_substring(tmp_path):
    _write_jsonl(tmp_path / "train.jsonl", [HB])
    _write_jsonl(tmp_path / "latest.jsonl", [dict(HB, prompt_id="p2")])  # "test" in "latest"
    (tmp_path / "test").mkdir()
    _write_jsonl(tmp_path / "test" / "part0.jsonl", [dict(HB, prompt_id="p3")])
    assert [t.id for t in load_tasks(tmp_path, "healthbench", split="test")] == ["p3"]
    assert [t.id for t in load_tasks(tmp_path, "healthbench", split=("train", "test"))] == [
        "p3",
        "p1",
    ]


def test_a_bom_is_dropped_and_counted_in_the_byte_offset(tmp_path):
    path = str(tmp_path / "hb.jsonl")
    with open(path, "wb") as f:
        f.write(b"\xef\xbb\xbf" + _hb(1) + _hb(2))
    assert [t.id for t in load_tasks(path, "healthbench")] == ["p1", "p2"]
    bad = b"\xef\xbb\xbf" + b'{"prompt_id": "\xfe"}\n'
    with open(path, "wb") as f:
        f.write(bad)
    err = _error(path, "healthbench")
    assert (err.row, err.field) == (1, "<bytes>")
    at = bad.index(b"\xfe")
    assert f"byte 0xfe at column {at + 1}" in str(err)
    assert f"byte offset {at} of the file" in str(err)


@pytest.mark.parametrize(
    "args, problem",
    [
        ({"answer": "4"}, "missing a required argument: 'choices'"),
        ({"answer": "4", "choices": ["4", "5"], "strict": True}, "got an unexpected keyword"),
        ({"answer": 4, "choices": ["4", "5"]}, "argument 'answer' is int 4, expected str"),
    ],
)
def test_rule_checker_arguments_are_checked_at_load_naming_file_row_criterion(
    tmp_path, args, problem
):
    # They used to fail only inside the judge: every verdict of the criterion failed.
    crit = dict(MISSPELT, verifier={"kind": "rule", "checker": "cf_answer_is", "args": args})
    path = _write_jsonl(tmp_path / "t.jsonl", [_ours("t1", GOOD), _ours("t2", GOOD, crit)])
    err = _error(path, "jsonl", checkers=load_builtin_checkers())
    assert (err.file, err.row, err.field) == (path, 2, "rubric.criteria[1].verifier.args")
    assert f"checker 'cf_answer_is': {problem}" in str(err)
    # Right arguments load; names only (no signatures) check the name alone.
    good = dict(crit, verifier=dict(crit["verifier"], args={"answer": "4", "choices": ["4"]}))
    ok = _write_jsonl(tmp_path / "ok.jsonl", [_ours("t2", GOOD, good)])
    assert len(load_tasks(ok, "jsonl", checkers=load_builtin_checkers())) == 1
    assert len(load_tasks(path, "jsonl", checkers=CHECKERS)) == 2


def test_rubrichub_rule_parameters_are_checked_at_load(tmp_path):
    row = {
        "prompt": "p",
        "reward_model": {"rubrics": [
            {"criterion": "c", "points": 1, "tags": {"verifier": "rule",
                                                     "function": "cf_includes_word"}},
        ]},
    }  # fmt: skip
    path = _write_jsonl(tmp_path / "r.jsonl", [row])
    err = _error(path, "rubrichub", checkers=load_builtin_checkers())
    assert (err.row, err.field) == (1, "reward_model.rubrics[0].tags.parameters")
    assert "checker 'cf_includes_word': missing a required argument: 'word'" in str(err)
