"""benchmarks/peer_step.py and benchmarks/peers/workload.py: the workload every peer
imports is the example's (same rows, rewards and token ids); the aggregation's medians, ratios and
goals on fixed inputs; rounds alternate the sides; a side whose Python is missing is skipped.

Needs neither peer environment: the sides run here are small scripts written by the test.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import sys
import types

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLE = os.path.join(ROOT, "examples", "peer_workload.py")


def _load(name: str, path: str) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


peer_step = _load("peer_step_under_test", os.path.join(ROOT, "benchmarks", "peer_step.py"))
workload = _load(
    "peer_workload_under_test", os.path.join(ROOT, "benchmarks", "peers", "workload.py")
)


def _example_definitions() -> types.SimpleNamespace:
    """TOPICS, ROWS, peer_reward and byte_bpe exactly as examples/peer_workload.py defines them,
    executed from its source without its other library imports (jax, the Trainer), which the
    workload definitions do not use (byte_bpe calls rubric_rl.models.tokenizer.train_byte_bpe)."""
    if not os.path.isfile(EXAMPLE):  # our side of the workload; peer_step skips it the same way
        pytest.skip(f"{EXAMPLE} is not in this checkout")
    tree = ast.parse(open(EXAMPLE).read(), EXAMPLE)
    wanted = {"TOPICS", "ROWS", "peer_reward", "byte_bpe"}
    keep = []
    for node in tree.body:
        if isinstance(node, ast.Import) or (
            isinstance(node, ast.ImportFrom)
            and node.module in ("tokenizers", "transformers", "rubric_rl.models.tokenizer")
        ):
            keep.append(node)
        elif (
            isinstance(node, ast.Assign) and {getattr(t, "id", None) for t in node.targets} & wanted
        ):
            keep.append(node)
        elif isinstance(node, ast.FunctionDef) and node.name in wanted:
            keep.append(node)
    namespace: dict = {}
    exec(compile(ast.Module(body=keep, type_ignores=[]), EXAMPLE, "exec"), namespace)
    missing = wanted - namespace.keys()
    assert not missing, f"{EXAMPLE} no longer defines {sorted(missing)}"
    return types.SimpleNamespace(**{k: namespace[k] for k in wanted})


def test_workload_rows_and_reward_are_the_examples():
    ex = _example_definitions()
    assert ex.TOPICS == workload.TOPICS and ex.ROWS == workload.ROWS
    assert len(workload.ROWS) == 64 and len({r["prompt"] for r in workload.ROWS}) == 64
    assert workload.ROWS[0] == dict(
        prompt="Write 2 words about cats ending with !", k=2, topic="cats"
    )
    completions = [
        "hot cats!",
        "Cats purr",
        "one two three !",
        "  ",
        "RAIN falls down now!  ",
        "x",
        "snow",
    ]
    k = [2, 2, 3, 0, 4, 1, 2]
    topic = ["cats", "cats", "music", "trees", "rain", "bread", "snow"]
    # By hand: (words == k) + ends with "!" + mentions the topic, over 3.
    expected = [3 / 3, 2 / 3, 1 / 3, 1 / 3, 3 / 3, 1 / 3, 1 / 3]
    prompts = ["p"] * len(completions)
    assert workload.peer_reward(prompts, completions, k, topic) == pytest.approx(expected)
    assert ex.peer_reward(prompts, completions, k, topic, trainer_state=None) == pytest.approx(
        expected
    )


def test_workload_tokenizer_is_the_examples(tmp_path):
    from tokenizers import Tokenizer

    ex = _example_definitions()
    ours = workload.byte_bpe(str(tmp_path / "workload"))
    theirs = ex.byte_bpe(str(tmp_path / "example"))
    vocab = Tokenizer.from_file(os.path.join(ours, "tokenizer.json")).get_vocab()
    assert vocab == Tokenizer.from_file(os.path.join(theirs, "tokenizer.json")).get_vocab()
    assert len(vocab) == 512 and (vocab["<pad>"], vocab["<eos>"], vocab["<bos>"]) == (0, 1, 2)
    ids = workload.prompt_ids(ours)
    assert ids == workload.prompt_ids(theirs)
    assert workload.tokenizer_digest(ours) == workload.tokenizer_digest(theirs)
    assert {len(x) for x in ids} == {workload.PROMPT_TOKENS} and 2 not in sum(ids, [])  # no BOS
    # The shape gives the note's parameter count (tied embeddings, q/k norms per head_dim).
    s = workload.SHAPE
    d, f, hd = s["hidden_size"], s["intermediate_size"], s["head_dim"]
    q, kv = s["num_attention_heads"] * hd, s["num_key_value_heads"] * hd
    layer = d * q + 2 * d * kv + q * d + 3 * d * f + 2 * hd + 2 * d
    assert (
        s["vocab_size"] * d + s["num_hidden_layers"] * layer + d
        == workload.PARAMS
        == peer_step.PARAMS
    )
    assert workload.NEW_TOKENS == peer_step.NEW_TOKENS


def test_step_flops_by_hand():
    # Per layer: q 256·256 + k, v 2·256·128 + o 256·256 + MLP 3·256·768 = 786 432 weights, ×4
    # layers = 3 145 728; head 256·512 = 131 072. A row: 71 positions through the layers (8 + 64
    # − 1), the head at 64; attention 4 layers · 2·4 heads·64·71·72 = 10 469 376.
    # Forward per row: 2·3 145 728·71 + 2·131 072·64 + 10 469 376 = 473 939 968; ×32 rows.
    assert workload.step_flops() == dict(
        generation=15_166_078_976, train=3 * 15_166_078_976, step=4 * 15_166_078_976
    )


def test_roofline_fractions_by_hand():
    sides = {
        "ours": _row(0.5, 0.2, 0.3),
        "tunix@1": _row(0.8, 0.3, 0.5),
        "tunix@2": _row(0.6, 0.3, 0.3),
        "trl": _row(1.0, 0.6, 0.4),
        "broken": dict(status="failed", step_s_median=None),
    }
    flops = dict(step=400, generation=100, train=300)
    out = peer_step.roofline(sides, flops, [800.0, 1000.0])
    assert out["matmul_flops_s"] == 1000.0 and out["matmul_flops_s_per_round"] == [800.0, 1000.0]
    assert out["bound_s"] == pytest.approx(dict(step=0.4, generation=0.1, train=0.3))
    assert out["peak_fraction"]["ours"] == pytest.approx(dict(step=0.8, generation=0.5, train=1.0))
    assert out["peak_fraction"]["trl"]["step"] == pytest.approx(0.4)
    assert "broken" not in out["peak_fraction"]
    # Goals against each peer's best configuration: Tunix 0.8 × 0.6 s, TRL 0.5 × 1.0 s.
    assert out["peak_fraction_needed"] == pytest.approx(dict(tunix=0.4 / 0.48, trl=0.4 / 0.5))
    assert peer_step.roofline(sides, flops, []) == dict(flops=flops, matmul_flops_s_per_round=[])


def test_matmul_peak_reports_a_missing_python_as_an_error(tmp_path):
    """(Its line from a real Python: test_missing_peer_venvs_are_skipped_not_errors.)"""
    bad = peer_step.matmul_peak(str(tmp_path / "no-python"), dict(os.environ))
    assert set(bad) == {"error"} and "no-python" in bad["error"]


def _row(step, gen, train, **extra):
    return dict(status="ok", step_s_median=step, gen_s_median=gen, train_s_median=train, **extra)


def test_aggregate_medians_ratios_and_goals():
    runs = {
        "ours": [_row(1.0, 0.4, 0.6), _row(0.7, 0.3, 0.4), _row(0.8, 0.35, 0.45)],
        "tunix": [_row(1.0, 0.4, 0.6), _row(1.2, 0.5, 0.7), _row(0.9, 0.4, 0.5)],
        "trl": [
            _row(2.0, 1.2, 0.8),
            dict(status="failed", error="trl: exit code 1"),
            _row(1.5, 0.9, 0.6),
        ],
    }
    out = peer_step.aggregate(runs, {})
    # Medians over ok rounds, by hand: ours 0.8 / 0.35 / 0.45; tunix 1.0 / 0.4 / 0.6;
    # trl 1.75 / 1.05 / 0.7.
    assert out["sides"]["ours"]["step_s_median"] == pytest.approx(0.8)
    assert out["sides"]["trl"]["step_s_median"] == pytest.approx(1.75)
    assert out["sides"]["trl"]["rounds_ok"] == 2 and out["sides"]["trl"]["errors"] == [
        "trl: exit code 1"
    ]
    assert out["sides"]["trl"]["step_s_per_round"] == [2.0, None, 1.5]
    assert out["ours_over_tunix"]["step"] == pytest.approx(0.8)
    assert out["ours_over_tunix"]["gen"] == pytest.approx(0.35 / 0.4)
    assert out["ours_over_tunix"]["train"] == pytest.approx(0.45 / 0.6)
    assert out["ours_over_tunix"]["step_per_round"] == pytest.approx([1.0, 0.7 / 1.2, 0.8 / 0.9])
    assert out["ours_over_trl"]["step"] == pytest.approx(0.8 / 1.75)
    assert out["ours_over_trl"]["step_per_round"] == pytest.approx(
        [0.5, 0.8 / 1.5]
    )  # round 1 failed
    assert out["goal_step_le_0.8x_tunix"] is True  # 0.8 <= 0.8
    assert out["goal_step_le_0.5x_trl"] is True  # 0.457 <= 0.5
    runs["ours"] = [_row(0.9, 0.4, 0.5)]
    out = peer_step.aggregate(runs, {})
    assert out["goal_step_le_0.8x_tunix"] is False and out["ours_over_tunix"][
        "step"
    ] == pytest.approx(0.9)
    assert out["goal_step_le_0.5x_trl"] is False  # 0.9 / 1.75 = 0.51


def test_workload_checks():
    good = dict(
        completion_tokens_mean=64,
        completion_tokens_min=64,
        completion_tokens_max=64,
        reward_mean=0.1,
        reward_min=0.0,
        reward_max=1.0,
        params=3_279_616,
        tokenizer_digest="abc",
        max_param_change=5e-5,
    )
    assert peer_step.workload_checks(good, "abc") == dict(
        tokens_64=True, reward_in_0_1=True, params=True, params_updated=True, tokenizer=True
    )
    assert peer_step.workload_checks(dict(good, max_param_change=0.0))["params_updated"] is False
    assert (
        peer_step.workload_checks(dict(good, completion_tokens_min=63), "abc")["tokens_64"] is False
    )
    assert peer_step.workload_checks(dict(good, reward_max=1.5), "abc")["reward_in_0_1"] is False
    assert peer_step.workload_checks(dict(good, params=3_279_617), "abc")["params"] is False
    assert peer_step.workload_checks(good, "abd")["tokenizer"] is False
    # The example reports means only: judged on those.
    assert peer_step.workload_checks(
        dict(completion_tokens_mean=64.0, reward_mean=0.2, params=3_279_616)
    ) == dict(tokens_64=True, reward_in_0_1=True, params=True)


SIDE_SCRIPT = """
import json, os, re, sys
name, log = sys.argv[1], sys.argv[2]
args = dict(a.lstrip("-").split("=", 1) for a in sys.argv[3:])
open(log, "a").write(f"{name} {args['steps']} {args['warmup']}\\n")
if name == "broken":
    sys.exit("broken side: no model")
print("some log line")
step = {"ours": 0.5, "tunix": 1.0}[name]
count = re.search(r"host_platform_device_count=(\\d+)", os.environ.get("XLA_FLAGS", ""))
devices = int(count.group(1)) if count else 1
print(json.dumps(dict(step_s_median=step, gen_s_median=step / 2, train_s_median=step / 2,
                      devices=devices)))
"""


def _script_side(tmp_path, name: str, devices: int | None = None) -> peer_step.Side:
    """A side that is a small script (sys.argv: its name and the log it appends to, then the
    runner's flags); run through the real subprocess runner."""
    script = tmp_path / "side.py"
    script.write_text(SIDE_SCRIPT)
    wrapper = tmp_path / f"{name}.py"
    wrapper.write_text(
        f"import runpy, sys\n"
        f"sys.argv = [{str(script)!r}, {name!r}, {str(tmp_path / 'log')!r}] + sys.argv[1:]\n"
        f"runpy.run_path({str(script)!r}, run_name='__main__')\n"
    )
    return peer_step.Side(name, sys.executable, str(wrapper), devices=devices)


def test_rounds_alternate_the_sides_and_report_failures(tmp_path):
    sides = [_script_side(tmp_path, n, devices=2) for n in ("ours", "tunix", "broken")]
    sides.append(
        peer_step.Side(
            "trl", str(tmp_path / "no-venv" / "bin" / "python"), str(tmp_path / "ours.py")
        )
    )
    out = peer_step.run_rounds(
        sides,
        rounds=2,
        steps=3,
        warmup=1,
        workdir=str(tmp_path / "runs"),
        env=dict(os.environ),
        timeout_s=60,
    )
    assert (tmp_path / "log").read_text().split("\n")[:-1] == [
        "ours 3 1",
        "tunix 3 1",
        "broken 3 1",
    ] * 2
    assert out["order"] == ["ours", "tunix", "broken"]
    assert out["failed"] == ["broken"] and out["skipped"] == ["trl"]
    assert out["sides"]["trl"] == dict(
        status="skipped", reason=f"no Python at {tmp_path / 'no-venv' / 'bin' / 'python'}"
    )
    assert out["sides"]["broken"]["status"] == "failed" and out["sides"]["broken"]["rounds_ok"] == 0
    assert (
        "exit code 1" in out["sides"]["broken"]["errors"][0]
        and "no model" in out["sides"]["broken"]["errors"][0]
    )
    assert out["sides"]["ours"]["step_s_per_round"] == [0.5, 0.5]
    # Each side saw the two host devices the environment gave it (the script reads XLA_FLAGS).
    assert out["sides"]["ours"]["checks"] == out["sides"]["tunix"]["checks"] == dict(devices=True)
    assert [r["devices"] for r in out["sides"]["ours"]["runs"]] == [2, 2]
    assert (
        out["ours_over_tunix"]["step"] == pytest.approx(0.5)
        and out["goal_step_le_0.8x_tunix"] is True
    )
    assert out["ours_over_trl"]["step"] is None and out["goal_step_le_0.5x_trl"] is None


def test_missing_peer_venvs_are_skipped_not_errors(tmp_path, capsys, monkeypatch):
    """Also the roofline's calibration: benchmarks/peers/matmul_peak.py run with this Python
    (one JAX device), its line read back by `matmul_peak`."""
    peaks = []
    real_peak = peer_step.matmul_peak

    def recorded_peak(python, env, *args, **kw):
        peaks.append((python, real_peak(python, env, *args, **kw)))
        return peaks[-1][1]

    monkeypatch.setattr(peer_step, "matmul_peak", recorded_peak)
    venvs = tmp_path / "peer-venvs"
    out = peer_step.main(
        [
            "--sides=tunix,trl",
            f"--venvs={venvs}",
            "--rounds=1",
            "--steps=1",
            f"--workdir={tmp_path}",
        ]
    )
    line = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert line == json.loads(json.dumps(out))
    for name in ("tunix", "trl"):
        assert line["sides"][name] == dict(
            status="skipped", reason=f"no Python at {venvs / name / 'bin' / 'python'}"
        )
    assert (
        line["order"] == []
        and line["goal_step_le_0.8x_tunix"] is None
        and line["goal_step_le_0.5x_trl"] is None
    )
    # The roofline ran (one calibration per round) though no side had figures.
    roof = line["roofline"]
    assert len(roof["matmul_flops_s_per_round"]) == 1 and roof["errors"] == []
    assert roof["bound_s"]["step"] == pytest.approx(
        workload.step_flops()["step"] / roof["matmul_flops_s"]
    )
    assert roof["peak_fraction"] == {} and roof["peak_fraction_needed"] == {}
    [(python, row)] = peaks
    assert python == sys.executable and roof["matmul_flops_s_per_round"] == [row["matmul_flops_s"]]
    assert row["matmul_flops_s"] == max(row["by_shape"].values()) > 1e8
    assert row["shapes"]["mlp_up"] == [32 * 72, 256, 768] and row["devices"] == 1
    assert line["tokenizer_digest"] == workload.tokenizer_digest(
        workload.byte_bpe(str(tmp_path / "bpe"))
    )
    with pytest.raises(SystemExit):
        peer_step.main(["--sides=ours,deepspeed"])


def test_host_devices_per_side(tmp_path, capsys):
    flag = "--xla_force_host_platform_device_count"
    environ = {"XLA_FLAGS": f"--xla_cpu_foo=1 {flag}=8", "OTHER": "x"}
    assert peer_step.with_host_devices(environ, 2) == {
        "XLA_FLAGS": f"--xla_cpu_foo=1 {flag}=2",
        "OTHER": "x",
    }
    assert peer_step.with_host_devices({}, 1) == {"XLA_FLAGS": f"{flag}=1"}
    # A side reporting other devices than its environment gave it fails the check.
    assert peer_step.workload_checks(dict(devices=1, given_devices=2)) == dict(devices=False)
    assert peer_step.workload_checks(dict(devices=2, given_devices=2)) == dict(devices=True)
    assert peer_step.workload_checks(dict(devices=2)) == {}
    known = peer_step.default_sides(str(tmp_path))
    sides, bad = peer_step.parse_sides("ours@2, tunix,tunix@cores,trl", known, host_devices=1)
    assert [(s.name, s.base, s.devices) for s in sides] == [
        ("ours@2", "ours", 2),
        ("tunix", "tunix", 1),
        ("tunix@cores", "tunix", os.cpu_count()),
        ("trl", "trl", 1),
    ]
    assert sides[0].script == known["ours"].script and sides[0].env == known["ours"].env
    for text, wrong in (
        ("ours@0,trl", ["ours@0"]),
        ("ours@two", ["ours@two"]),
        ("ours,deepspeed@2", ["deepspeed@2"]),
        ("ours@2,ours@2", ["ours@2"]),
    ):
        assert peer_step.parse_sides(text, known, host_devices=1)[1] == wrong
    common = ["--sides=tunix,tunix@2", f"--venvs={tmp_path}", "--rounds=1", "--steps=1"]
    common.append("--roofline=off")  # the calibration: test_missing_peer_venvs_are_skipped...
    line = peer_step.main([*common, "--host_devices=cores", f"--workdir={tmp_path}"])
    assert sorted(line["sides"]) == ["tunix", "tunix@2"]
    for bad_count in ("0", "two"):
        with pytest.raises(SystemExit):
            peer_step.main([*common, f"--host_devices={bad_count}"])
    assert "--host_devices" in capsys.readouterr().err


def test_each_side_is_compared_at_its_best_configuration():
    runs = {
        "ours": [_row(1.0, 0.4, 0.6), _row(1.0, 0.4, 0.6)],
        "ours@2": [_row(0.7, 0.2, 0.5), _row(0.8, 0.3, 0.5)],
        "tunix@1": [_row(1.0, 0.4, 0.6), _row(0.8, 0.3, 0.5)],
        "tunix@2": [_row(1.2, 0.5, 0.7), _row(1.0, 0.5, 0.5)],
        "trl": [_row(2.0, 1.2, 0.8), _row(1.6, 1.0, 0.6)],
    }
    out = peer_step.aggregate(runs, {})
    # Medians by hand: ours 1.0, ours@2 0.75, tunix@1 0.9, tunix@2 1.1, trl 1.8.
    assert out["ours_over_tunix"]["sides"] == ["ours@2", "tunix@1"]
    assert out["ours_over_tunix"]["step"] == pytest.approx(0.75 / 0.9)
    assert out["ours_over_tunix"]["gen"] == pytest.approx(0.25 / 0.35)
    assert out["ours_over_tunix"]["step_per_round"] == pytest.approx([0.7, 1.0])
    assert out["ours_over_tunix"]["step_by_side"] == pytest.approx(
        {"tunix@1": 0.75 / 0.9, "tunix@2": 0.75 / 1.1}
    )
    assert out["goal_step_le_0.8x_tunix"] is False  # 0.833 against Tunix at its best
    assert out["ours_over_trl"]["sides"] == ["ours@2", "trl"]
    assert out["ours_over_trl"]["step"] == pytest.approx(0.75 / 1.8)
    assert out["goal_step_le_0.5x_trl"] is True
