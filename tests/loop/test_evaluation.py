"""Evaluation cadence per set and per-environment metrics (rubric_rl/loop/evaluation.py)."""

from __future__ import annotations

import math

import ml_collections
import numpy as np
import pytest

from configs import common, grpo
from rubric_rl.loop.evaluation import EVAL_SPLITS, due_splits, split_every, split_metrics
from rubric_rl.rubrics.rewards import POINTS_SCALE
from rubric_rl.rubrics.types import Message, Rubric, Task


def _task(i: int, env: str | None) -> Task:
    return Task(id=f"t{i}", prompt=(Message("user", "q"),), rubric=Rubric(()), env_name=env)


# --- cadence ----------------------------------------------------------------------------------


def _cfg(every=25, at_start=True, heldout=-1, ood=-1):
    return ml_collections.ConfigDict(
        dict(eval=dict(every=every, at_start=at_start, splits=dict(heldout=heldout, ood=ood)))
    )


def _schedule(config, steps: int, with_validation: bool = False) -> dict[str, list[int]]:
    """Steps at which each set is evaluated, as the trainer asks: step 0 before training (not
    final), then each training step with final = (step == steps)."""
    out = {s: [] for s in EVAL_SPLITS}
    for step in range(steps + 1):
        for s in due_splits(config, step, final=step > 0 and step == steps):
            out[s].append(step)
    # The validation set follows the same rules (an empty one is skipped by evaluate); the
    # tables below list the two sets every domain has.
    return {s: out[s] for s in ("heldout", "ood")} if not with_validation else out


def test_default_config_evaluates_both_sets_at_0_every_25_and_150():
    c = grpo.get_config()
    assert c.train.steps == 150 and c.eval.every == 25
    assert dict(c.eval.splits) == {"heldout": -1, "validation": -1, "ood": -1}
    assert c.domain.n_validation == 0  # no validation set unless a comparison asks for one
    want = [0, 25, 50, 75, 100, 125, 150]
    assert _schedule(c, 150, True) == {"heldout": want, "validation": want, "ood": want}


@pytest.mark.parametrize(
    "cfg, steps, heldout, ood",
    [
        # every 40 over 150 steps: the last step is evaluated although 150 % 40 != 0.
        (_cfg(every=40), 150, [0, 40, 80, 120, 150], [0, 40, 80, 120, 150]),
        (_cfg(every=40, at_start=False), 150, [40, 80, 120, 150], [40, 80, 120, 150]),
        # every = 0 turns evaluation off: not at the start, not at the end.
        (_cfg(every=0), 150, [], []),
        # OOD every 50 while held-out follows eval.every = 25.
        (_cfg(ood=50), 150, [0, 25, 50, 75, 100, 125, 150], [0, 50, 100, 150]),
        # OOD never; held-out on its own period although eval.every = 0.
        (_cfg(every=0, heldout=10, ood=0), 25, [0, 10, 20, 25], []),
        (_cfg(every=7, heldout=3), 10, [0, 3, 6, 9, 10], [0, 7, 10]),
    ],
)
def test_cadence_table(cfg, steps, heldout, ood):
    assert _schedule(cfg, steps) == {"heldout": heldout, "ood": ood}


@pytest.mark.parametrize("every", [0, 1, 3, 25, 200])
@pytest.mark.parametrize("at_start", [True, False])
@pytest.mark.parametrize("steps", [1, 10, 150])
def test_default_splits_reproduce_the_single_schedule(every, at_start, steps):
    # The trainer's schedule before per-set cadences: step 0 if at_start and every > 0; a
    # training step if every > 0 and (step % every == 0 or step == steps).
    old = [0] if at_start and every > 0 else []
    old += [s for s in range(1, steps + 1) if every > 0 and (s % every == 0 or s == steps)]
    sched = _schedule(_cfg(every=every, at_start=at_start), steps)
    assert sched == {"heldout": old, "ood": old}


def test_split_every_and_a_config_without_splits():
    assert split_every(_cfg(every=25, ood=0), "ood") == 0
    assert split_every(_cfg(every=25, ood=-1), "ood") == 25
    assert split_every(_cfg(every=25, ood=5), "ood") == 5
    bare = ml_collections.ConfigDict(dict(eval=dict(every=5, at_start=True)))  # older runs
    assert due_splits(bare, 10, final=False) == ["heldout", "validation", "ood"]
    with pytest.raises(ValueError, match=r"config\.eval\.splits\.ood"):
        split_every(_cfg(ood=-2), "ood")


def test_validate_config_names_the_bad_split_period():
    c = grpo.get_config("smoke")
    c.eval.splits.ood = -2
    with pytest.raises(ValueError, match=r"config\.eval\.splits\.ood: must be >= -1"):
        common.validate_config(c, num_devices=1)
    c.eval.splits.ood = 0
    common.validate_config(c, num_devices=1)


# --- metrics ----------------------------------------------------------------------------------


def test_per_environment_rates_and_their_unweighted_mean():
    # env "a" has 3 tasks, env "b" 1: pooled and per-environment means differ.
    tasks = [_task(0, "a"), _task(1, "a"), _task(2, "a"), _task(3, "b")]
    rewards = np.array([1.0, np.nan, 0.5, 0.0])  # task 1's judgement failed: left out
    passed = [True, False, False, True]
    oracle = [0.2, None, 0.4, 1.0]
    m = split_metrics("heldout", tasks, ["r"] * 4, rewards, passed, oracle, {"c1": 0.25})
    assert m == pytest.approx(
        {
            "eval/heldout/criteria/c1": 0.25,
            "eval/heldout/score": 50.0,  # 100 * (1 + .5 + 0) / 3
            "eval/heldout/pass_rate": 0.5,  # 2 / 4 pooled
            "eval/heldout/oracle": 1.6 / 3,  # undefined oracle left out
            "eval/heldout/env/a/score": 75.0,  # 100 * (1 + .5) / 2
            "eval/heldout/env/a/pass_rate": 1 / 3,
            "eval/heldout/env/b/score": 0.0,
            "eval/heldout/env/b/pass_rate": 1.0,
            "eval/heldout/env_mean/score": 37.5,  # (75 + 0) / 2, not the pooled 50
            "eval/heldout/env_mean/pass_rate": 2 / 3,  # (1/3 + 1) / 2, not the pooled 0.5
        },
        rel=1e-12,
    )


def test_nan_rewards_none_env_and_missing_verifier_or_oracle():
    tasks = [_task(0, None), _task(1, None), _task(2, "x")]
    rewards = np.array([np.nan, 0.25, np.nan])
    m = split_metrics("ood", tasks, ["a", "b", "c"], rewards, None, None, {})
    assert set(m) == {
        "eval/ood/score",
        "eval/ood/env/default/score",  # env_name None
        "eval/ood/env/x/score",
        "eval/ood/env_mean/score",
    }
    assert m["eval/ood/score"] == 25.0 and m["eval/ood/env/default/score"] == 25.0
    assert math.isnan(m["eval/ood/env/x/score"])  # every reward of x undefined
    assert m["eval/ood/env_mean/score"] == 25.0  # an undefined environment is left out
    all_nan = split_metrics("ood", tasks[:1], ["a"], np.array([np.nan]), [None], [None], {})
    for k in ("score", "pass_rate", "oracle", "env_mean/score", "env_mean/pass_rate"):
        assert math.isnan(all_nan[f"eval/ood/{k}"]), k


def test_pooled_values_equal_the_previous_computation_bit_for_bit():
    # Trainer.evaluate before this module: score = Λ·nanmean(r), pass_rate = mean(verify),
    # oracle = mean(oracle), criteria as given.
    rng = np.random.default_rng(0)
    for n in (1, 7, 64, 301):
        r = rng.random(n)
        r[rng.random(n) < 0.1] = np.nan
        passed = [bool(b) for b in rng.random(n) < 0.6]
        oracle = [float(x) for x in rng.random(n)]
        tasks = [_task(i, str(rng.integers(3))) for i in range(n)]
        rates = {f"c{i}": float(x) for i, x in enumerate(rng.random(4))}
        m = split_metrics("heldout", tasks, [""] * n, r, passed, oracle, rates)
        old_score = float(POINTS_SCALE * np.nanmean(r)) if np.any(~np.isnan(r)) else float("nan")
        assert np.array_equal(m["eval/heldout/score"], old_score, equal_nan=True)
        assert m["eval/heldout/pass_rate"] == float(np.mean(passed))
        assert m["eval/heldout/oracle"] == float(np.mean(oracle))
        assert {k: v for k, v in m.items() if "/criteria/" in k} == {
            f"eval/heldout/criteria/{c}": v for c, v in rates.items()
        }


def test_length_mismatch_is_an_error():
    with pytest.raises(ValueError, match=r"2 rewards for 1 tasks"):
        split_metrics("heldout", [_task(0, "a")], ["r"], np.zeros(2), None, None, {})


def test_a_criterion_whose_checker_raises_is_reported_not_dropped_unseen():
    """A failed verdict leaves the score (it is no 'unmet'): the evaluation reports the share
    of failed verdicts, overall and per criterion (there was no failure metric in evaluation)."""
    from rubric_rl.loop.evaluation import judge_failure_metrics
    from rubric_rl.rubrics.judges import JudgeItem, ProgrammaticJudge
    from rubric_rl.rubrics.types import Criterion, Message, Rubric, Verifier
    from rubric_rl.util.registry import Registry

    reg = Registry("checker")
    reg.register("has")(lambda response, *, task=None, word: word in response)
    reg.register("broken")(lambda response, *, task=None: 1 / 0)
    crits = (
        Criterion("ok", "has x", 1.0, verifier=Verifier.rule("has", word="x")),
        Criterion("bad", "broken", 1.0, verifier=Verifier.rule("broken")),
    )
    tasks = [Task(f"t{i}", (Message("user", "q"),), Rubric(crits)) for i in range(3)]
    judge = ProgrammaticJudge(reg)
    rows = judge.score([JudgeItem(t, r) for t, r in zip(tasks, ["x", "y", "x"], strict=True)])
    verdicts = [[row] for row in rows]  # one response per task, as evaluate() judges them
    assert judge_failure_metrics("heldout", verdicts) == {
        "eval/heldout/judge/failed": 0.5,
        "eval/heldout/judge/failed/bad": 1.0,
    }
    assert judge_failure_metrics("heldout", []) == {}
