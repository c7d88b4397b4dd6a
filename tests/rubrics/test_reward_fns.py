"""Plain Python reward functions as a reward source (rubric_rl/rubrics/reward_fns.py), the ``plain``
task format and tasks given in Python. Advantages are checked against plain numpy."""

from __future__ import annotations

import gzip
import json
import math
import sys

import numpy as np
import pytest

from configs import common, grpo
from rubric_rl import step
from rubric_rl.config import builders
from rubric_rl.controllers.base import Controller, ControllerSet
from rubric_rl.controllers.sampling import UniformSampler
from rubric_rl.rollout.batch import Rollouts
from rubric_rl.rollout.scripted import ScriptedEngine, prompt_words
from rubric_rl.rubrics.dataset_files import DatasetError
from rubric_rl.rubrics.datasets import load_tasks, plain_tasks
from rubric_rl.rubrics.reward_fns import (
    RewardFnError,
    call_reward_fn,
    fields_of,
    import_reward_fn,
    resolve_reward_fns,
)
from rubric_rl.rubrics.types import Criterion, Message, Rubric, Task, Verdict
from tests.trainer_spy import one_device, serve_scripted

# --- numpy references -------------------------------------------------------------------------


def norm_g(r: np.ndarray, estimator: str, eps: float = 1e-6, tol: float = 1e-6) -> np.ndarray:
    """Per group over its defined members: GRPO (r - mean) / (std_ddof1 + eps) or Dr.GRPO
    r - mean; 0 for undefined members and for groups with < 2 defined or spread < tol."""
    out = np.zeros_like(r)
    for g, row in enumerate(r):
        ok = ~np.isnan(row)
        x = row[ok]
        if x.size < 2 or x.max() - x.min() < tol:
            continue
        a = x - x.mean()
        out[g, ok] = a / (x.std(ddof=1) + eps) if estimator == "grpo" else a
    return out


def words_reward(prompts, completions, k, **fields):
    """1 if the completion has k words, 0 if not; None (not applicable) when k is None."""
    return [None if n is None else float(len(c.split()) == n) for c, n in zip(completions, k)]


# --- calling a function -----------------------------------------------------------------------


def _task(i, raw=None, criteria=()):
    return Task(f"t{i}", (Message("user", f"question {i}"),), Rubric(tuple(criteria)), raw=raw)


def test_one_call_gets_questions_completions_and_aligned_fields():
    seen = {}

    def fn(prompts, completions, **fields):
        seen.update(prompts=prompts, completions=completions, **fields)
        return [0.5, None, float("nan")]

    tasks = [_task(0, {"prompt": "p", "id": 7, "k": 3}), _task(1, {"k": 4, "topic": "rain"}),
             _task(2)]  # fmt: skip
    values, error = call_reward_fn("fn", fn, tasks, ["a", "b", "c"], "at step 1")
    assert error is None
    np.testing.assert_array_equal(values, [0.5, np.nan, np.nan])
    assert seen == {
        "prompts": ["question 0", "question 1", "question 2"],
        "completions": ["a", "b", "c"],
        "k": [3, 4, None],  # aligned with the completions; None where a row lacks the column
        "topic": [None, "rain", None],
        "task_id": ["t0", "t1", "t2"],  # the prompt and id columns are not fields
    }
    assert set(fields_of(tasks)) == {"k", "topic", "task_id"}


def test_an_exception_makes_the_calls_values_nan_and_is_returned():
    def broken(prompts, completions, **fields):
        raise KeyError("no such column")

    values, error = call_reward_fn("broken", broken, [_task(0)] * 2, ["a", "b"], "at step 4")
    assert np.isnan(values).all() and values.shape == (2,)
    assert error == "KeyError: 'no such column'"


@pytest.mark.parametrize("code", [0, None, "done"])
def test_sys_exit_in_a_reward_function_is_an_error_not_a_clean_finish(code):
    # SystemExit(0) passed through and ended the run with status 0: a sweep marked it done.
    def leaves(prompts, completions, **fields):
        sys.exit(code)

    with pytest.raises(RewardFnError) as e:
        call_reward_fn("leaves", leaves, [_task(0)] * 2, ["a", "b"], "at step 4")
    assert str(e.value) == (
        f"reward function 'leaves' ({__name__}:test_sys_exit_in_a_reward_function_is_an_error_"
        f"not_a_clean_finish.<locals>.leaves) at step 4 called sys.exit({code!r}); a reward "
        "function returns rewards, it does not end the run"
    )


@pytest.mark.parametrize(
    "returned, match",
    [
        ([1.0], r"returned 1 values for 2 completions: \[1\.0\]"),
        ([1.0, "good"], r"value 1 is str 'good', not a number or None"),
        ([1.0, [0.5]], r"value 1 is list \[0\.5\], not a number"),
        ([float("inf"), 0.0], r"value 0 is inf; a reward must be finite"),
        (0.5, r"returned 0\.5; expected a sequence of 2 floats"),
        ({"a": 1.0, "b": 2.0}, r"returned \{'a': 1\.0, 'b': 2\.0\}; expected a sequence"),
    ],
)
def test_a_result_that_is_no_reward_per_completion_raises_naming_the_function(returned, match):
    def bad_reward(prompts, completions, **fields):
        return returned

    with pytest.raises(RewardFnError, match=match) as e:
        call_reward_fn("bad", bad_reward, [_task(0)] * 2, ["a", "b"], "at step 3")
    msg = str(e.value)
    assert msg.startswith(f"reward function 'bad' ({__name__}:")
    assert "bad_reward) at step 3:" in msg


# --- the reward and advantage stages ----------------------------------------------------------


class _FixedMix(Controller):
    """A controller that sets the trained mix itself (as ARISE's signal_weights does)."""

    name = "fixed_mix"

    def signal_weights(self):
        return {"rubric": 1.0}


def _ctx(tasks, reward_fns, *, extra=(), **loss):
    c = grpo.get_config("smoke")
    c.loss.update(advantage="grpo", **loss)
    controllers = ControllerSet(UniformSampler(tasks, len(tasks)), list(extra))
    domain = builders.Domain("t", tuple(tasks), (), ())
    return step.StepContext(1, c, np.random.default_rng(0), None, controllers, domain,
                            reward_fns=reward_fns)  # fmt: skip


def _rubric_batch(rng, g=3, j=4):
    """Tasks with two criteria (weights 2 and 1), random verdicts and word-count responses."""
    crit = [Criterion("c0", "first", 2.0), Criterion("c1", "second", 1.0)]
    tasks = [_task(i, {"k": int(i + 1)}, crit) for i in range(g)]
    met = rng.random((g, j, 2)) < 0.5
    verdicts = [[[Verdict(f"c{c}", bool(met[a, b, c])) for c in range(2)] for b in range(j)]
                for a in range(g)]  # fmt: skip
    responses = [[" ".join(["w"] * int(rng.integers(1, 4))) for _ in range(j)] for _ in range(g)]
    return tasks, responses, verdicts, (2 * met[..., 0] + met[..., 1]) / 3.0


def _words(tasks, responses):
    return np.array([[float(len(r.split()) == t.raw["k"]) for r in rs]
                     for t, rs in zip(tasks, responses)])  # fmt: skip


def test_a_function_alone_trains_on_its_own_group_normalised_values():
    rng = np.random.default_rng(0)
    tasks, responses, verdicts, _ = _rubric_batch(rng, g=4, j=5)
    calls = []

    def words(prompts, completions, k, **fields):
        calls.append(len(completions))
        out = words_reward(prompts, completions, k)
        out[3] = None  # not applicable: not trained, left out of its group's statistics
        return out

    r = Rollouts.from_responses(1, tasks, responses, verdicts)
    ctx = _ctx(tasks, {"words": words}, reward="words")
    step.advantage(step.reward(r, ctx), ctx)
    want_r = _words(tasks, responses)
    want_r[0, 3] = np.nan
    assert calls == [20]  # one batched call over the step's trajectories
    assert "rubric" not in r.groups[0].trajectories[0].signals  # no rubric reward computed
    np.testing.assert_array_equal(r.signal("words"), want_r)
    np.testing.assert_allclose(r.advantages, norm_g(want_r, "grpo"), rtol=1e-5, atol=1e-6)
    trainable = np.array([[t.trainable for t in g.trajectories] for g in r.groups])
    np.testing.assert_array_equal(trainable, ~np.isnan(want_r))
    assert ctx.metrics["reward_fn/words/undefined"] == pytest.approx(1 / 20)
    assert ctx.metrics["reward_fn/words/failed"] == 0.0


def test_a_mix_of_rubric_and_function_is_the_weighted_sum_of_normalised_signals():
    rng = np.random.default_rng(1)
    tasks, responses, verdicts, rubric = _rubric_batch(rng, g=5, j=6)
    r = Rollouts.from_responses(1, tasks, responses, verdicts)
    weights = {"rubric": 1.0, "words": 0.5}
    ctx = _ctx(tasks, {"words": words_reward}, reward="weighted", reward_weights=weights)
    step.advantage(step.reward(r, ctx), ctx)
    want = norm_g(rubric, "grpo") + 0.5 * norm_g(_words(tasks, responses), "grpo")
    np.testing.assert_allclose(r.signal("rubric"), rubric)
    np.testing.assert_allclose(r.advantages, want, rtol=1e-5, atol=1e-6)
    assert ctx.signal_weights == weights


def test_a_failing_function_in_a_mix_leaves_its_trajectories_untrained():
    rng = np.random.default_rng(2)
    tasks, responses, verdicts, _ = _rubric_batch(rng)

    def flaky(prompts, completions, **fields):
        raise RuntimeError("service down")

    r = Rollouts.from_responses(1, tasks, responses, verdicts)
    ctx = _ctx(tasks, {"flaky": flaky}, reward_weights={"rubric": 1.0, "flaky": 1.0})
    step.advantage(step.reward(r, ctx), ctx)
    assert np.isnan(r.signal("flaky")).all()  # NaN, never 0
    assert not any(t.trainable for g in r.groups for t in g.trajectories)
    assert ctx.metrics["reward_fn/flaky/failed"] == 1.0
    errors = {t.info["reward_fn_errors"]["flaky"] for g in r.groups for t in g.trajectories}
    assert errors == {"RuntimeError: service down"}
    from rubric_rl.loop.step_metrics import rollout_rows

    row = rollout_rows(r, 1)[0]
    assert row["reward_fn_errors"] == {"flaky": "RuntimeError: service down"}
    assert math.isnan(row["signals"]["flaky"])


def test_signal_names_and_mixes_that_cannot_be_trained_are_errors():
    tasks, responses, verdicts, _ = _rubric_batch(np.random.default_rng(3))
    r = Rollouts.from_responses(1, tasks, responses, verdicts)
    ctx = _ctx(tasks, {}, extra=[_FixedMix()], reward_weights={"rubric": 1.0})
    with pytest.raises(ValueError, match=r"^config\.loss\.reward_weights: .*signal_weights"):
        step.advantage(step.reward(r, ctx), ctx)

    class Shadow(Controller):
        name = "shadow"

        def reward_signals(self, rollouts):
            return {"words": np.zeros((len(rollouts.groups), rollouts.group_size))}

    ctx = _ctx(tasks, {"words": words_reward}, extra=[Shadow()])
    with pytest.raises(ValueError, match=r"'words' has the name of a reward function"):
        step.reward(r, ctx)


# --- configs ----------------------------------------------------------------------------------


@pytest.fixture
def reward_module(tmp_path, monkeypatch):
    (tmp_path / "my_rewards.py").write_text(
        "def exact(prompts, completions, answer, **kw):\n"
        "    return [float(c == a) for c, a in zip(completions, answer)]\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "my_rewards"
    sys.modules.pop("my_rewards", None)


def test_config_import_paths_resolve_and_a_bad_one_names_its_key(reward_module):
    c = grpo.get_config("smoke")
    c.update(reward_fns={"exact": "my_rewards:exact"})  # a locked config takes it
    fns = resolve_reward_fns(c, None)
    assert fns["exact"](["q"], ["x", "y"], answer=["x", "x"]) == [1.0, 0.0]
    for path, match in [
        ("my_rewards:nope", r"'my_rewards:nope': .* has no attribute 'nope'"),
        ("no_such_module_xyz:f", r"cannot import module 'no_such_module_xyz'"),
        ("my_rewards.exact", r"expected 'package\.module:function'"),
    ]:
        with pytest.raises(ValueError, match=r"^config\.reward_fns\.exact: " + match):
            import_reward_fn(path, "config.reward_fns.exact")
    c.reward_fns.exact = "my_rewards:nope"
    with pytest.raises(ValueError, match=r"^config\.reward_fns\.exact: "):
        resolve_reward_fns(c, None)


def test_given_callables_are_recorded_by_module_and_qualname():
    c = grpo.get_config("smoke")
    fns = resolve_reward_fns(c, [words_reward])
    assert fns == {"words_reward": words_reward}
    assert dict(c.reward_fns) == {"words_reward": f"{__name__}:words_reward"}
    with pytest.raises(ValueError, match=r"has no usable __name__; give a dict"):
        resolve_reward_fns(grpo.get_config("smoke"), [lambda p, c, **k: [0.0] * len(c)])
    with pytest.raises(ValueError, match=r"'rubric' is a built-in signal"):
        resolve_reward_fns(grpo.get_config("smoke"), {"rubric": words_reward})


@pytest.mark.parametrize(
    "reward, weights, match",
    [
        ("words", {"wrods": 1.0}, r"^config\.loss\.reward_weights\.wrods: names no signal"),
        ("words", {"rubric": 1.0}, r"^config\.loss\.reward: 'words': loss\.reward_weights trains"),
        ("weighted", {"words": math.inf}, r"^config\.loss\.reward_weights\.words: must be a fin"),
        ("nope", {}, r"^config\.loss\.reward: must be one of .*'words'\], got 'nope'"),
    ],
)
def test_validation_names_the_mix_field(reward, weights, match):
    c = grpo.get_config("smoke")
    c.reward_fns = {"words": "tests.test_reward_fns:words_reward"}
    c.loss.update(reward=reward, reward_weights=weights)
    with pytest.raises(ValueError, match=match):
        common.validate_config(c)
    c.loss.reward, c.loss.reward_weights = "words", {}
    common.validate_config(c)  # a reward function's name is a valid loss.reward


# --- the plain format -------------------------------------------------------------------------


def test_the_plain_format_loads_string_and_message_prompts_and_keeps_every_field(tmp_path):
    path = tmp_path / "tasks.jsonl"
    rows = [
        {"prompt": "Write 3 words about rain", "k": 3, "topic": "rain"},
        {"id": "m1", "prompt": [{"role": "system", "content": "Be brief."},
                                {"role": "user", "content": "Say hi"}], "answer": "hi"},
    ]  # fmt: skip
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    tasks = load_tasks(path, format="plain")
    assert [t.prompt for t in tasks] == [
        (Message("user", "Write 3 words about rain"),),
        (Message("system", "Be brief."), Message("user", "Say hi")),
    ]
    assert tasks[0].id.startswith("plain-") and tasks[0].id == load_tasks(path, "plain")[0].id
    assert tasks[1].id == "m1" and len(tasks[0].rubric) == 0
    assert fields_of(tasks) == {
        "k": [3, None],
        "topic": ["rain", None],
        "answer": [None, "hi"],
        "task_id": [tasks[0].id, "m1"],
    }
    assert plain_tasks(rows, "tasks['train']") == tasks  # rows given in Python: the same tasks


@pytest.mark.parametrize(
    "row, field, message",
    [
        ({"k": 3}, "prompt", "missing; expected a string or a list"),
        ({"prompt": 5}, "prompt", "got int 5"),
        ({"prompt": [{"role": "robot", "content": "x"}]}, "prompt[0].role", "system/user"),
        ({"prompt": "x", "id": 1.5}, "id", "expected a string or integer id"),
    ],
)
def test_a_bad_plain_row_names_file_row_and_field(tmp_path, row, field, message):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps({"prompt": "fine"}) + "\n" + json.dumps(row) + "\n")
    with pytest.raises(DatasetError) as e:
        load_tasks(path, format="plain")
    assert (e.value.file, e.value.row, e.value.field) == (str(path), 2, field)
    assert message in e.value.message
    with pytest.raises(DatasetError) as e:
        plain_tasks([{"prompt": "fine"}, row], "tasks['train']")
    assert str(e.value).startswith(f"tasks['train']:2: field '{field}': ")


def test_the_dataset_domain_reads_plain_tasks_and_refuses_to_train_their_rubric(tmp_path):
    (tmp_path / "train.jsonl").write_text(json.dumps({"prompt": "say ok", "answer": "ok"}) + "\n")
    c = grpo.get_config("smoke")
    c.domain.name = "dataset"
    c.domain.dataset.update(format="plain", train=str(tmp_path / "train.jsonl"))
    c.warmstart.steps = 0
    with pytest.raises(ValueError, match=r"^config\.loss\.reward: trains the rubric, but .*plain"):
        common.validate_config(c)
    c.reward_fns = {"words": "tests.test_reward_fns:words_reward"}
    c.loss.reward = "words"
    common.validate_config(c)
    domain = builders.build_domain(c)
    assert [t.raw["answer"] for t in domain.train] == ["ok"]
    assert {"say", "ok"} <= set(domain.vocabulary)  # the embedded tokenizer can write them


# --- a Trainer on tasks given in Python -------------------------------------------------------


class _NoCallJudge:
    """A judge that must never be asked: the tasks have no criteria."""

    name = "no_call"

    def score(self, items):
        raise AssertionError(f"judge called on {len(items)} items")


def test_tasks_in_python_train_on_a_plain_function_without_a_rubric(tmp_path):
    from rubric_rl.metrics import read_metrics
    from rubric_rl.trainer import Trainer

    calls = []

    def count_words(prompts, completions, k, **fields):
        calls.append((list(completions), list(k), list(fields["task_id"])))
        if len(calls) == 2:  # the second step's call
            raise RuntimeError("flaky scorer")
        return words_reward(prompts, completions, k)

    recorded = []

    def record(rollouts, ctx):  # a stage after "advantage": what the step trains
        trainable = [[t.trainable for t in g.trajectories] for g in rollouts.groups]
        recorded.append((rollouts.signal("count_words"), rollouts.advantages, np.array(trainable)))
        return rollouts

    c = grpo.get_config("smoke")
    c.model.update(shape={"num_hidden_layers": 1})  # the fewest compiled layers: Python checked
    c.warmstart.steps = 0
    c.loss.update(reward="count_words", advantage="grpo", mismatch_every=0)
    c.optim.mini_batches = 1  # one update per step, no π_old forward: the test's seconds
    c.logging.tensorboard = False
    c.eval.update(every=2, at_start=False)
    c.train.steps = 2
    c.logging.rollouts_per_step = 32
    train = [{"prompt": f"write {k} words about cats", "k": k} for k in range(1, 9)]
    heldout = [{"prompt": f"write {k} words about dogs", "k": k, "id": f"h{k}"} for k in (1, 2, 3)]
    pipeline = step.default_pipeline().insert_after("advantage", "record", record)
    t = Trainer(c, str(tmp_path), judge=_NoCallJudge(), pipeline=pipeline,
                reward_fns=[count_words], tasks=dict(train=train, heldout=heldout),
                devices=one_device())  # fmt: skip
    # The policy: some of the prompt's words (the function's values vary within a group).
    serve_scripted(t, ScriptedEngine(t.tokenizer, prompt_words))
    try:
        rows = t.run()
    finally:
        t.close()
    assert [len(cs) for cs, _, _ in calls] == [16, 16, 3]  # step 1, step 2, held-out evaluation
    # Step 1: the function's values, trained alone, GRPO-normalised per group (numpy).
    values, adv, trainable = recorded[0]
    completions, k, _ = calls[0]
    want = np.array([float(len(x.split()) == n) for x, n in zip(completions, k)]).reshape(4, 4)
    np.testing.assert_array_equal(values, want)
    np.testing.assert_allclose(adv, norm_g(want, "grpo"), rtol=1e-5, atol=1e-6)
    assert trainable.all() and rows[0]["reward/count_words/mean"] == pytest.approx(want.mean())
    assert rows[0]["reward_fn/count_words/failed"] == 0.0
    assert rows[0]["loss/policy_den"] > 0  # tokens were trained
    # Step 2: the function raised: NaN, untrained, counted, kept in the rollouts file.
    values, adv, trainable = recorded[1]
    assert np.isnan(values).all() and not trainable.any()
    assert rows[1]["reward_fn/count_words/failed"] == 1.0 and rows[1]["reward/undefined"] == 16
    assert rows[1]["loss/policy_den"] == 0  # nothing trained, no zero reward
    with gzip.open(tmp_path / "rollouts" / "step_000002.jsonl.gz", "rt") as f:
        saved = [json.loads(line) for line in f]
    assert len(saved) == 16 and all(
        s["reward_fn_errors"] == {"count_words": "RuntimeError: flaky scorer"} for s in saved
    )
    # Evaluation: the function's mean over the held-out responses; no rubric score (no criteria).
    completions, k, ids = calls[2]
    assert ids == ["h1", "h2", "h3"]
    want_eval = np.mean([float(len(x.split()) == n) for x, n in zip(completions, k)])
    assert rows[1]["eval/heldout/reward_fn/count_words"] == pytest.approx(want_eval)
    assert rows[1]["eval/heldout/reward_fn/count_words/failed"] == 0.0
    assert not any(key.endswith("score") for key in rows[1])
    assert read_metrics(str(tmp_path / "metrics.jsonl"))[1]["step"] == 2
    with open(tmp_path / "config.json") as f:
        assert json.load(f)["reward_fns"] == {
            "count_words": f"{__name__}:test_tasks_in_python_train_on_a_plain_function_without_"
            "a_rubric.<locals>.count_words"
        }


def test_tasks_in_python_are_checked_before_any_model_is_built(tmp_path):
    from rubric_rl.trainer import Trainer

    rows = [{"prompt": "say ok", "answer": "ok"}, {"prompt": "say no", "answer": "no"}]
    c = grpo.get_config("smoke")
    c.warmstart.steps = 0
    # loss.reward is the default rubric reward: nothing to train on tasks without criteria.
    with pytest.raises(ValueError, match=r"^config\.loss\.reward: trains the rubric, but no "):
        Trainer(c, str(tmp_path), reward_fns=[words_reward], tasks=dict(train=rows))
    c.loss.update(reward="words_reward", reward_weights={"rubric": 1.0, "words_reward": 1.0})
    with pytest.raises(ValueError, match=r"^config\.loss\.reward: 'words_reward': loss\.reward_w"):
        Trainer(c, str(tmp_path), reward_fns=[words_reward], tasks=dict(train=rows))
    c.loss.update(reward="weighted")
    with pytest.raises(ValueError, match=r"^config\.loss\.reward_weights\.rubric: trains the "):
        Trainer(c, str(tmp_path), reward_fns=[words_reward], tasks=dict(train=rows))
    c.loss.reward, c.loss.reward_weights = "words_reward", {}
    c.warmstart.steps = 2
    with pytest.raises(ValueError, match=r"^config\.warmstart\.steps: 2, but the tasks given"):
        Trainer(c, str(tmp_path), reward_fns=[words_reward], tasks=dict(train=rows))
    domain = builders.tasks_domain(dict(train=rows))
    with pytest.raises(ValueError, match=r"give tasks= or domain=, not both"):
        Trainer(c, str(tmp_path), tasks=dict(train=rows), domain=domain)


def test_tasks_domain_parses_rows_and_refuses_bad_splits():
    rows = [{"prompt": "say ok", "id": "a"}, {"prompt": "say no", "id": "b"}]
    domain = builders.tasks_domain(dict(train=rows, ood=[{"prompt": "say maybe"}]))
    assert [t.id for t in domain.train] == ["a", "b"] and domain.heldout == ()
    assert domain.vocabulary == ("maybe", "no", "ok", "say") and domain.corpus is None
    for tasks, match in [
        (dict(train=rows, test=rows), r"unknown split 'test'"),
        (dict(heldout=rows), r"tasks\['train'\] holds no tasks"),
        (dict(train=rows, heldout=rows[:1]), r"1 task ids of tasks\['heldout'\] are also in"),
        (dict(train=[{"prompt": "x"}, "y"]), r"^tasks\['train'\]:2: field '<row>': expected a d"),
        (dict(train=rows + rows[:1]), r"^tasks\['train'\]:3: field 'id': duplicate task id 'a'"),
    ]:
        with pytest.raises(ValueError, match=match):
            builders.tasks_domain(tasks)


def test_the_recorded_functions_are_checked_when_a_run_resumes(tmp_path):
    from rubric_rl.rubrics.reward_fns import record_in_run_dir

    c = grpo.get_config("smoke")
    resolve_reward_fns(c, {"words": words_reward})
    path = record_in_run_dir(str(tmp_path), c, resume=False)
    with open(path) as f:
        record = json.load(f)
    assert record["reward_fns"] == {"words": f"{__name__}:words_reward"}
    assert record["train"] == c.train.to_dict()  # the whole config when there was no record

    def words(prompts, completions, **fields):
        return [0.0] * len(completions)

    other = grpo.get_config("smoke")
    resolve_reward_fns(other, {"words": words})
    with pytest.raises(ValueError, match=r"--resume: .*reward_fns\.words: '.*:words_reward' -> "):
        record_in_run_dir(str(tmp_path), other, resume=True)
    with open(path) as f:
        assert json.load(f) == record  # left as it was
    record_in_run_dir(str(tmp_path), other, resume=False)  # a new run may change it
    with open(path) as f:
        assert json.load(f)["reward_fns"]["words"].endswith("<locals>.words")


# --- through the launcher: a config file names the function ------------------------------------

CONFIG_FILE = """
from configs import grpo


def get_config(arg=None):
    c = grpo.get_config("smoke")
    c.model.update(shape={{"num_hidden_layers": 1}})
    c.domain.name = "dataset"
    c.domain.dataset.update(format="plain", train={train!r}, heldout={heldout!r})
    c.reward_fns = dict(words="my_rewards:words")
    c.loss.reward = "words"
    c.warmstart.steps = 0
    c.train.steps = 2
    c.checkpoint.update(every=0, final=False)
    return c
"""

REWARDS_MODULE = """
def words(prompts, completions, k, **fields):
    return [float(len(c.split()) == n) for c, n in zip(completions, k)]
"""


@pytest.fixture
def user_config(tmp_path):
    """A user's config file naming a reward function in a module of theirs (on PYTHONPATH), with
    its train and held-out files; returns ``launch(workdir, *overrides)``, which runs ``python -m
    rubric_rl.launch --config=<that file>``."""
    import os
    import subprocess

    from tests.launch_env import launch_env

    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    rows = [{"prompt": f"write {n} words about {t}", "k": n} for n in (1, 2, 3) for t in "ab"]
    heldout_rows = [{"prompt": f"write {n} words about c", "k": n} for n in (1, 2)]
    for split, part in (("train", rows), ("heldout", heldout_rows)):
        (tmp_path / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in part))
    (tmp_path / "my_rewards.py").write_text(REWARDS_MODULE)
    config = tmp_path / "my_config.py"
    train, heldout = str(tmp_path / "train.jsonl"), str(tmp_path / "heldout.jsonl")
    config.write_text(CONFIG_FILE.format(train=train, heldout=heldout))
    env = launch_env(tmp_path / "jax_cache")
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), repo])

    def launch(workdir, *extra):
        cmd = [sys.executable, "-m", "rubric_rl.launch", f"--config={config}"]
        cmd += [f"--workdir={workdir}", *extra]
        return subprocess.run(cmd, cwd=repo, env=env, capture_output=True, text=True, timeout=600)

    return launch


@pytest.mark.slow
def test_a_config_file_naming_a_reward_function_that_does_not_import_exits_1(tmp_path, user_config):
    """``python -m rubric_rl.launch --config=<file>`` imports the user's config file and checks
    its ``config.reward_fns`` paths: a ``--config.reward_fns.words=`` override to a path that
    does not import exits 1 naming the field, before any run directory is written."""
    import os

    bad = user_config(tmp_path / "bad", "--config.reward_fns.words=my_rewards:nope")
    assert bad.returncode == 1, bad.stderr[-3000:]
    assert "config.reward_fns.words" in bad.stderr and "my_rewards:nope" in bad.stderr
    assert not os.path.exists(tmp_path / "bad" / "metrics.jsonl")


@pytest.mark.e2e
def test_a_config_file_names_a_reward_function_the_launcher_trains_on(tmp_path, user_config):
    """The same config file trains: the function is imported, trained on, logged per step and
    recorded in config.json. (In process, with the function's values checked against numpy:
    ``test_tasks_in_python_train_on_a_plain_function_without_a_rubric``.)"""
    proc = user_config(tmp_path / "run")
    assert proc.returncode == 0, proc.stderr[-6000:]
    metrics = [json.loads(line) for line in open(tmp_path / "run" / "metrics.jsonl")]
    assert [m["step"] for m in metrics] == [0, 1, 2]  # 0: the evaluation before training
    for m in metrics[1:]:
        assert 0.0 <= m["reward/words/mean"] <= 1.0 and m["reward_fn/words/failed"] == 0.0
    for m in (metrics[0], metrics[2]):  # evaluated on the held-out file by the same function
        assert 0.0 <= m["eval/heldout/reward_fn/words"] <= 1.0
        assert m["eval/heldout/reward_fn/words/failed"] == 0.0
    recorded = json.load(open(tmp_path / "run" / "config.json"))
    assert recorded["reward_fns"] == {"words": "my_rewards:words"}
    assert recorded["loss"]["reward"] == "words"


@pytest.mark.parametrize("scale", [1e20, 1e308, -1e308])
def test_a_reward_whose_square_overflows_is_refused_naming_the_function(scale):
    # float32 group statistics: at 1e20 the variance overflowed to inf, so every advantage was
    # 0 and the loss 0 with nothing logged; ±1e308 became inf and a NaN mean.
    rng = np.random.default_rng(0)
    tasks, responses, verdicts, _ = _rubric_batch(rng, g=3, j=4)

    def words(prompts, completions, k, **fields):
        return [scale * v for v in words_reward(prompts, completions, k)]

    r = Rollouts.from_responses(1, tasks, responses, verdicts)
    ctx = _ctx(tasks, {"words": words}, reward="words")
    step.reward(r, ctx)
    with pytest.raises(step.RewardMagnitudeError) as e:
        step.advantage(r, ctx)
    msg = str(e.value)
    assert msg.startswith(f"step 1: reward signal 'words' (reward function {__name__}:")
    assert f"is {scale:.6g} for task " in msg and "|r| <= 4.61e+18" in msg


def test_rewards_up_to_the_limit_give_the_unscaled_advantages():
    """Group-normalised advantages are scale-free: rewards just inside ``reward_limit`` train as
    their unscaled values do (the float32 statistics stay finite)."""
    rng = np.random.default_rng(1)
    tasks, responses, verdicts, _ = _rubric_batch(rng, g=3, j=4)
    scale = step.reward_limit(4)
    assert scale == pytest.approx(np.sqrt(np.finfo(np.float32).max / 4) / 2)

    def words(prompts, completions, k, **fields):
        return [scale * v for v in words_reward(prompts, completions, k)]

    r = Rollouts.from_responses(1, tasks, responses, verdicts)
    ctx = _ctx(tasks, {"words": words}, reward="words")
    step.advantage(step.reward(r, ctx), ctx)
    want = norm_g(_words(tasks, responses), "grpo")
    assert np.abs(want).max() > 0.5  # some contrast to lose
    np.testing.assert_allclose(r.advantages, want, rtol=1e-5, atol=1e-6)


def test_a_step_whose_rewards_are_all_undefined_warns_and_counts(caplog):
    rng = np.random.default_rng(0)
    tasks, responses, verdicts, _ = _rubric_batch(rng, g=3, j=4)

    def nothing(prompts, completions, k, **fields):
        return [None] * len(completions)

    r = Rollouts.from_responses(1, tasks, responses, verdicts)
    ctx = _ctx(tasks, {"nothing": nothing}, reward="nothing")
    with caplog.at_level("WARNING"):
        step.advantage(step.reward(r, ctx), ctx)
    assert r.metrics["reward/all_undefined"] == 1.0
    assert not any(t.trainable for g in r.groups for t in g.trajectories)
    assert (
        "step 1: every reward of the trained signal(s) ['nothing'] is undefined (None / NaN) "
        "for all 12 rollouts; this step trains nothing" in caplog.text
    )
    # A step with one defined reward is not counted.
    r2 = Rollouts.from_responses(1, tasks, responses, verdicts)
    ctx2 = _ctx(tasks, {"words": words_reward}, reward="words")
    step.advantage(step.reward(r2, ctx2), ctx2)
    assert r2.metrics["reward/all_undefined"] == 0.0
