"""RISED's cross-environment transfer analysis of a single-environment run (seed §2.3, C.1):
checkpoints, pools, tags, gradients, and the CLI.

    python -m rubric_rl.methods.rised.rised_transfer <run_dir> [--split validation]
        [--pool_tasks 16] [--samples N] [--baseline STEP] [--steps 50,75] [--out DIR]
        [--retag_seed S]

writes ``<run_dir>/transfer/transfer.jsonl`` and ``transfer_summary.json`` (the signals, the
statistics and what they leave to us: ``rised_transfer_stats``).

:func:`transfer_analysis` builds the run's parts once (a ``Trainer`` from the run's
``config.json`` over a scratch directory: its model, engine, services, domain and RISED
controller, so the rollouts, rewards, tags and vocabulary are the trainer's own), then for each
kept checkpoint restores the parameters from ``<run_dir>/checkpoints``, reads the per-environment
pass rates the run logged there (``eval/<split>/env/<env>/pass_rate``; evaluated afresh with
``evaluation.evaluate`` when the run did not log them at that step), and

- samples the training pool (the training environment's tasks) and each environment's pool of
  the evaluation set ``split`` through ``Services.generate`` / ``run_agent`` at the training
  sampling settings, rewarded by the task verifier (the outcome reward RISED trains on);
- tags every rollout with the run's tagger (rewards given) and sums the pools' profiles;
- computes each pool's mean reward-weighted policy gradient (:func:`pool_gradient`, the core's
  ``reward_weighted_logp_grad`` on the trainer's packing, ``trainer_batch.build_train_batch``).

Ours (the seed does not state them): the pass rates and the pools come from the ``validation`` split
by default (the seed's "validation pools"; ``--split``); the baseline is the first kept checkpoint
(the seed's step 25 with ``single_env``'s spacing; ``--baseline``); a pool is the first
``pool_tasks`` (16) tasks of its environment in the split's order (the same tasks at every
checkpoint) with ``rollout.samples_per_task`` rollouts each; sampling is seeded by the checkpoint
step (the services' streams ``transfer/train_pool`` and ``transfer/env/<env>``); one padded prompt
length and completion bucket for all pools of a checkpoint (one gradient program); a rollout whose
reward is undefined (NaN) is left out of its pool's gradient; an empty pool's gradient is NaN (its
similarity too); the gradient is the policy term's alone (no KL or distillation term).
A flattened gradient is model-sized (float32): two are held at a time (the training pool's and
one validation pool's).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import tempfile
from collections.abc import Sequence
from typing import Any

import jax
import ml_collections
import numpy as np

from rubric_rl.analysis import read_config
from rubric_rl.core.pool_gradient import reward_weighted_logp_grad
from rubric_rl.loop import evaluation
from rubric_rl.loop.policy_loading import load_policy
from rubric_rl.loop.trainer_batch import build_train_batch
from rubric_rl.methods.rised.rised_transfer_stats import (
    RETAG_PREFIX,
    TRANSFER_DIR,
    pool_profile,
    profile_similarities,
    retag_agreement,
    summarize,
    transfer_rows,
    write_outputs,
)
from rubric_rl.metrics import read_metrics
from rubric_rl.rollout.batch import Group, Rollouts, Trajectory
from rubric_rl.runs.run_dir import checkpoint_steps
from rubric_rl.util.buckets import round_up_to_bucket

__all__ = [
    "PoolRow",
    "load_run_config",
    "main",
    "pool_gradient",
    "sample_pool",
    "transfer_analysis",
]


@dataclasses.dataclass(frozen=True)
class PoolRow:
    """One rollout of a pool: prompt token ids, completion token ids, its reward, and the
    completion's loss mask (None: every token; agent rollouts mask tool outputs)."""

    prompt_ids: tuple[int, ...]
    tokens: tuple[int, ...]
    reward: float
    loss_mask: tuple[int, ...] | None = None


_GRAD_FNS: dict[tuple[int, float, int], Any] = {}


def _grad_fn(graphdef, temperature: float, chunk_size: int):
    key = (id(graphdef), float(temperature), int(chunk_size))
    if key not in _GRAD_FNS:
        _GRAD_FNS[key] = jax.jit(
            lambda p, r, ids, pos, attn, lm, w: reward_weighted_logp_grad(
                graphdef,
                p,
                r,
                ids,
                pos,
                attn,
                lm,
                w,
                temperature=temperature,
                chunk_size=chunk_size,
            )
        )
    return _GRAD_FNS[key]


def pool_gradient(
    graphdef: Any,
    params: Any,
    rest: Any,
    rows: Sequence[PoolRow],
    *,
    prompt_len: int,
    buckets: Sequence[int],
    pad_id: int,
    temperature: float = 1.0,
    chunk_size: int = 128,
    rows_per_call: int = 32,
    mesh: jax.sharding.Mesh | None = None,
) -> np.ndarray | None:
    """The pool's mean reward-weighted policy gradient, flattened float32:
    ``(1/N) Σ_i r_i ∇ log π(y_i | x_i)`` over its N rows with a defined reward, ``log π(y | x)``
    the sum of the completion's trained tokens' log-probs (``core/pool_gradient.py``). Rows are
    packed as the trainer packs them (prompts left-padded to ``prompt_len``, completions to a
    bucket) in calls of ``rows_per_call`` rows (the last padded with reward-0 rows, which add
    exactly 0); ``rows_per_call`` must divide over ``mesh``'s batch shards. None for a pool
    without a defined reward."""
    rows = [r for r in rows if math.isfinite(float(r.reward))]
    if not rows:
        return None
    fn = _grad_fn(graphdef, temperature, chunk_size)
    total = None
    for start in range(0, len(rows), rows_per_call):
        chunk = list(rows[start : start + rows_per_call])
        chunk += [dataclasses.replace(chunk[0], reward=0.0)] * (rows_per_call - len(chunk))
        groups = [
            Group(
                task=None,
                prompt_ids=tuple(r.prompt_ids),
                trajectories=[
                    Trajectory(
                        tuple(r.tokens),
                        (0.0,) * len(r.tokens),
                        "stop",
                        0,
                        "",
                        loss_mask=r.loss_mask,
                        reward=float(r.reward),
                        advantage=float(r.reward),
                    )
                ],
            )
            for r in chunk
        ]
        tb = build_train_batch(
            Rollouts(0, groups), prompt_len=prompt_len, buckets=tuple(buckets), pad_id=pad_id,
            mesh=mesh,
        )  # fmt: skip
        g = fn(params, rest, tb.input_ids, tb.positions, tb.attention_mask, tb.loss_mask,
               tb.advantages)  # fmt: skip
        g = np.asarray(jax.device_get(g), np.float32)
        total = g.copy() if total is None else np.add(total, g, out=total)
    return total / np.float32(len(rows))


def _gradient_cosine(a: np.ndarray | None, b: np.ndarray | None, chunk: int = 1 << 22) -> float:
    """cos(a, b); NaN when a pool has no gradient, 0 when one is all-zero (ours). Float64 sums
    over float32 chunks: no float64 copy of a model-sized vector."""
    if a is None or b is None:
        return math.nan
    ab = aa = bb = 0.0
    for i in range(0, a.size, chunk):
        x, y = a[i : i + chunk].astype(np.float64), b[i : i + chunk].astype(np.float64)
        ab, aa, bb = ab + float(x @ y), aa + float(x @ x), bb + float(y @ y)
    if aa == 0.0 or bb == 0.0:
        return 0.0
    return ab / math.sqrt(aa * bb)


def sample_pool(services: Any, tasks: Sequence[Any], n: int, stream: str):
    """``n`` rollouts per task at the training sampling settings through the trainer's services,
    rewarded by the task verifier: (tasks, responses, rewards, rows), flat, task-major."""
    prompt_ids, trajs = services.rollouts(tasks, n, stream=stream)
    flat_tasks, responses, rewards, rows = [], [], [], []
    for task, pids, group in zip(tasks, prompt_ids, trajs, strict=True):
        for tr in group:
            r = services.task_verifier(task, tr.response)
            flat_tasks.append(task)
            responses.append(tr.response)
            rewards.append(r)
            rows.append(PoolRow(tuple(pids), tuple(tr.tokens), r, tr.loss_mask))
    return flat_tasks, responses, rewards, rows


def load_run_config(run_dir: str) -> tuple[ml_collections.ConfigDict, str]:
    """(the run's config, its training environment) from ``<run_dir>/config.json``; a run that
    is not a single-environment one (``configs/rised.py:single_env=<env>``) is refused."""
    record = read_config(run_dir)
    if not record:
        raise FileNotFoundError(f"{os.path.join(run_dir, 'config.json')}: no run config")
    config = ml_collections.ConfigDict(record)
    env = str((record.get("rised") or {}).get("train_environment", "") or "")
    if record.get("method") != "rised" or not env:
        raise ValueError(
            f"{run_dir}: config.json is not a single-environment RISED run (method "
            f"{record.get('method')!r}, rised.train_environment {env!r}); train one with "
            "--config=configs/rised.py:single_env=<env>"
        )
    return config, env


def _pass_rates(rows, step: int, split: str) -> dict[str, float] | None:
    prefix, suffix = f"eval/{split}/env/", "/pass_rate"
    for r in rows:
        if r.get("step") == step:
            got = {
                k[len(prefix) : -len(suffix)]: float(v)
                for k, v in r.items()
                if k.startswith(prefix) and k.endswith(suffix) and v is not None
            }
            if got:
                return got
    return None


def transfer_analysis(
    run_dir: str,
    *,
    split: str = "validation",
    pool_tasks: int = 16,
    samples: int | None = None,
    baseline_step: int | None = None,
    steps: Sequence[int] | None = None,
    out_dir: str | None = None,
    rows_per_call: int = 32,
    retag_seed: int | None = None,
) -> dict[str, Any]:
    """Runs the analysis over the run's kept checkpoints (``steps``: a subset; the baseline,
    default the first kept step, is always included). ``retag_seed``: the rollouts are tagged a
    second time (``tagger.retag_batch`` under that seed) and the summary gets the reliability
    figures of seed C.2 (``retag_agreement``). Writes ``transfer.jsonl`` and
    ``transfer_summary.json`` into ``out_dir`` (default ``<run_dir>/transfer``) and returns the
    summary (``rised_transfer`` module docstring)."""
    from tqdm.auto import tqdm

    from rubric_rl.trainer import Trainer

    run_dir = os.path.abspath(run_dir)
    config, train_env = load_run_config(run_dir)
    kept = checkpoint_steps(run_dir)
    if not kept:
        raise FileNotFoundError(f"{run_dir}/checkpoints: no checkpoint to analyse")
    baseline = kept[0] if baseline_step is None else int(baseline_step)
    wanted = sorted({baseline, *(kept if steps is None else map(int, steps))})
    missing = [s for s in wanted if s not in kept]
    if missing:
        raise ValueError(f"{run_dir}/checkpoints: no checkpoint at steps {missing}; kept: {kept}")
    if len(wanted) < 2:
        raise ValueError(f"{run_dir}: the analysis needs checkpoints after the baseline {baseline}")
    n = int(samples or config.rollout.samples_per_task)
    metrics_path = os.path.join(run_dir, "metrics.jsonl")
    logged = read_metrics(metrics_path) if os.path.exists(metrics_path) else []
    config.logging.update(tensorboard=False, wandb=False, progress_bar=False)

    with tempfile.TemporaryDirectory(prefix="rised_transfer_") as scratch:
        trainer = Trainer(config, scratch)
        try:
            rised = next(c for c in trainer.controllers.controllers if c.name == "rised")
            vocab, tagger = rised.vocab, rised.tagger
            domain, services = trainer.domain, trainer.services
            split_tasks = list(getattr(domain, split, None) or ())
            if not split_tasks:
                raise ValueError(f"{run_dir}: the domain has no {split!r} tasks to pool")
            envs = sorted({evaluation.env_of(t) for t in split_tasks})
            pools = {e: [t for t in split_tasks if evaluation.env_of(t) == e][:pool_tasks]
                     for e in envs}  # fmt: skip
            train_pool = [t for t in domain.train if evaluation.env_of(t) == train_env]
            train_pool = train_pool[:pool_tasks]
            shards = int(trainer.mesh.shape["data"] * trainer.mesh.shape["fsdp"])
            per_call = -(-int(rows_per_call) // shards) * shards
            rates: dict[int, dict[str, float]] = {}
            sims: dict[int, dict[str, dict[str, float]]] = {}
            bar = tqdm(total=len(wanted), desc="transfer", dynamic_ncols=True)
            for step in wanted:
                load_policy(trainer, step, os.path.join(run_dir, "checkpoints"))
                services.begin_step(step)
                got = _pass_rates(logged, step, split)
                if got is None:
                    m = evaluation.evaluate(services, domain, config, [split], step=step)
                    got = _pass_rates([{"step": step, **m}], step, split) or {}
                rates[step] = got
                if step != baseline:
                    sims[step] = _checkpoint_similarities(
                        trainer, vocab, tagger, train_pool, pools, n, per_call, retag_seed
                    )
                bar.update(1)
            bar.close()
        finally:
            trainer.close()
    rows = transfer_rows(sims, rates, baseline, train_env)
    summary = {
        "run_dir": run_dir, "train_env": train_env, "split": split, "baseline_step": baseline,
        "steps": [s for s in wanted if s != baseline], "pool_tasks": int(pool_tasks),
        "samples_per_task": n, "signals": summarize(rows),
    }  # fmt: skip
    if retag_seed is not None:
        summary["retag"] = {"seed": int(retag_seed), **retag_agreement(rows)}
    write_outputs(out_dir or os.path.join(run_dir, TRANSFER_DIR), rows, summary)
    return summary


def _checkpoint_similarities(
    trainer, vocab, tagger, train_pool, pools, n: int, per_call: int, retag_seed: int | None
):
    """{env: {signal: similarity, pool_reward}} at the trainer's current parameters (with
    ``retag_seed``: also ``retag/<profile signal>`` from a second tagging)."""
    services, cfg = trainer.services, trainer.config
    names = [None, *pools]  # None: the training pool
    sampled = {
        name: sample_pool(
            services,
            train_pool if name is None else pools[name],
            n,
            "transfer/train_pool" if name is None else f"transfer/env/{name}",
        )
        for name in names
    }
    # One padded prompt length for every pool of the checkpoint: one gradient program (ours).
    prompt_len = services.prompt_len([len(r.prompt_ids) for s in sampled.values() for r in s[3]])
    # The largest completion bucket that any pool needs, for all of them (likewise).
    longest = max((len(r.tokens) for s in sampled.values() for r in s[3]), default=1)
    bucket = round_up_to_bucket(max(longest, 1), tuple(cfg.rollout.buckets))
    train_grad, train_profile, train_retag, out = None, None, None, {}
    # The training pool first; a validation pool's gradient is dropped once compared (only two
    # flattened gradients are held at a time).
    for name in names:
        tasks_f, responses, rews, rows = sampled[name]
        profile = pool_profile(tagger.tag_batch(tasks_f, responses, rews), vocab)
        retag = None
        if retag_seed is not None:
            again = tagger.retag_batch(tasks_f, responses, rews, seed=int(retag_seed))
            retag = pool_profile(again, vocab)
        grad = pool_gradient(
            trainer.graphdef, trainer.state.params, trainer.state.rest, rows,
            prompt_len=prompt_len, buckets=(bucket,), pad_id=int(services.tokenizer.pad_id or 0),
            temperature=trainer.tcfg.temperature, chunk_size=trainer.tcfg.chunk_size,
            rows_per_call=per_call, mesh=trainer.mesh,
        )  # fmt: skip
        if name is None:
            train_grad, train_profile, train_retag = grad, profile, retag
            continue
        defined = [r for r in rews if math.isfinite(r)]
        out[name] = {
            **profile_similarities(train_profile, profile, vocab),
            "gradient": _gradient_cosine(train_grad, grad),
            "pool_reward": float(np.mean(defined)) if defined else math.nan,
        }
        if retag is not None:
            sims = profile_similarities(train_retag, retag, vocab)
            out[name].update({RETAG_PREFIX + k: v for k, v in sims.items()})
    return out


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(
        prog="python -m rubric_rl.methods.rised.rised_transfer",
        description="RISED's transfer analysis of a single-environment run (module docstring).",
    )
    parser.add_argument("run_dir", help="the run directory of a configs/rised.py:single_env run")
    parser.add_argument("--split", default="validation", help="the pools' and pass rates' set")
    parser.add_argument("--pool_tasks", type=int, default=16, help="tasks per pool (ours: 16)")
    parser.add_argument(
        "--samples", type=int, default=0, help="rollouts per task (0: rollout.samples_per_task)"
    )
    parser.add_argument("--baseline", type=int, default=None, help="default: the first kept step")
    parser.add_argument("--steps", default="", help="comma-separated checkpoints (default: all)")
    parser.add_argument("--out", default="", help=f"default: <run_dir>/{TRANSFER_DIR}")
    parser.add_argument(
        "--retag_seed", type=int, default=None, help="tag a second time (seed C.2); default off"
    )
    a = parser.parse_args(argv)
    steps = [int(s) for s in a.steps.split(",") if s.strip()] or None
    summary = transfer_analysis(
        a.run_dir, split=a.split, pool_tasks=a.pool_tasks, samples=a.samples or None,
        baseline_step=a.baseline, steps=steps, out_dir=a.out or None, retag_seed=a.retag_seed,
    )  # fmt: skip
    for subset in ("all", "held_out"):
        for sig, v in summary["signals"][subset].items():
            rho = "n/a" if v["spearman"] is None else f"{v['spearman']:+.3f}"
            print(
                f"{subset:8s} {sig:11s} spearman {rho} over {v['pairs']} pairs, most improved "
                f"{v['most_improved_hits']}/{v['checkpoints']}"
            )
    if "retag" in summary:
        print(f"retag: max |change of a pooled Spearman| {summary['retag']['max_abs_delta']}")
    return summary


if __name__ == "__main__":
    main()
