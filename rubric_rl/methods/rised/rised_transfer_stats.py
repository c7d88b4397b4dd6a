"""RISED's cross-environment transfer analysis, its signals and statistics (seed §2.3, C.1-C.2).
Pure numpy; the model side and the CLI are
``rubric_rl/methods/rised/rised_transfer.py``.

A single-environment run (``configs/rised.py:single_env=<env>``) trains on one environment's tasks
and evaluates every environment. At each kept checkpoint the analysis (``rised_transfer``)
rolls out the training pool and each environment's validation pool, tags them, and compares the
training pool with each validation pool by

- rubric-profile similarity: a pool's profile is its rollouts' summed count vector over the
  vocabulary (seed: "count vectors compared with cosine similarity"), restricted to positive
  rubrics (``rubric_pos``), negative ones (``rubric_neg``) or both (``rubric_all``, the seed's
  "combined"); ``skill_*``: the same counts summed per skill first (seed: "skill-level
  aggregation");
- gradient similarity (``gradient``): the cosine between the pools' average reward-weighted
  policy gradients (seed C.1; ``core/pool_gradient.py``),

against the environment's improvement: its pass rate at the checkpoint minus its pass rate at
the baseline checkpoint (seed: steps 50-500 relative to step 25). The statistics are pure
functions here: :func:`pooled_correlation` pools every (checkpoint, environment) pair into one
Spearman (and Pearson) coefficient, over all environments or the held-out ones (the training
environment left out); :func:`most_improved_hits` counts the checkpoints at which a signal's
most similar environment is the most improved one (seed: 19 checkpoints for combined rubric
profiles against 8 for gradients); :func:`retag_agreement` gives the tagger-reliability figures of
seed C.2 when the rollouts were tagged twice (``--retag_seed``).

    python -m rubric_rl.methods.rised.rised_transfer <run_dir> [--split validation]
        [--pool_tasks 16] [--retag_seed 1]

writes ``<run_dir>/transfer/transfer.jsonl`` (one row per checkpoint x environment: step, env,
held_out, pass rates, improvement, each signal) and ``transfer/transfer_summary.json``.

Ours (the seed does not state them): an empty (all-zero) profile or gradient has cosine 0 with
anything (``rised_selection.cosine``); outcome rubrics (``task_solved`` / ``task_failed``, the
reward-informed tags of seed E.4) count in the profiles as they do in the controller's; a pair
with an undefined value (NaN) is left out of a correlation; most-improved: the signal's argmax
over the environments (ties to the first environment by name) is a hit when that environment's
improvement equals the largest one (ties in improvement all count), and a checkpoint counts as
evaluated only when at least two environments have both values and their improvements are not
all equal (else any choice would be a "hit").
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from rubric_rl.analysis.stats import pearson, spearman
from rubric_rl.methods.rised.rised_selection import cosine
from rubric_rl.methods.rised.rised_tags import Tags, group_profile
from rubric_rl.rubrics.vocabulary import Vocabulary

POLARITIES = ("pos", "neg", "all")
PROFILE_SIGNALS = tuple(f"{level}_{p}" for level in ("rubric", "skill") for p in POLARITIES)
SIGNALS = (*PROFILE_SIGNALS, "gradient")
TRANSFER_DIR = "transfer"
ROWS_FILE = "transfer.jsonl"
SUMMARY_FILE = "transfer_summary.json"
RETAG_PREFIX = "retag/"  # a profile signal from the second tagging (seed C.2)

__all__ = [
    "POLARITIES",
    "PROFILE_SIGNALS",
    "RETAG_PREFIX",
    "ROWS_FILE",
    "SIGNALS",
    "SUMMARY_FILE",
    "TRANSFER_DIR",
    "improvements",
    "most_improved_hits",
    "pool_profile",
    "pooled_correlation",
    "profile_similarities",
    "retag_agreement",
    "skill_matrix",
    "summarize",
    "transfer_rows",
    "write_outputs",
]


# ------------------------------------------------------------------------------ profiles


def pool_profile(tags: Sequence[Tags], vocab: Vocabulary) -> np.ndarray:
    """A pool's count vector [V]: the sum over its rollouts whose tagging did not fail."""
    return group_profile(tags, vocab)


def _polarity_mask(vocab: Vocabulary, polarity: str) -> np.ndarray:
    if polarity == "pos":
        return np.asarray(vocab.positive_mask, bool)
    if polarity == "neg":
        return np.asarray(vocab.negative_mask, bool)
    if polarity == "all":
        return np.ones(len(vocab), bool)
    raise ValueError(f"polarity must be one of {POLARITIES}, got {polarity!r}")


def skill_matrix(vocab: Vocabulary) -> np.ndarray:
    """[S, V] 0/1: row s marks the rubrics of skill ``vocab.skills[s]`` (skill-level profiles
    are ``skill_matrix @ profile``)."""
    skills = vocab.skills
    out = np.zeros((len(skills), len(vocab)), np.float64)
    for i, rid in enumerate(vocab.ids):
        out[skills.index(vocab.entry(rid).skill), i] = 1.0
    return out


def profile_similarities(
    train: np.ndarray, validation: np.ndarray, vocab: Vocabulary
) -> dict[str, float]:
    """Cosine of the training and a validation pool profile ([V] counts) for each of
    ``PROFILE_SIGNALS``: rubric or skill level, positive / negative rubrics only or all."""
    train, validation = np.asarray(train, np.float64), np.asarray(validation, np.float64)
    s = skill_matrix(vocab)
    out = {}
    for p in POLARITIES:
        m = _polarity_mask(vocab, p)
        a, b = np.where(m, train, 0.0), np.where(m, validation, 0.0)
        out[f"rubric_{p}"] = cosine(a, b)
        out[f"skill_{p}"] = cosine(s @ a, s @ b)
    return out


# ------------------------------------------------------------------------------ statistics


def improvements(
    pass_rates: Mapping[int, Mapping[str, float]], baseline_step: int
) -> dict[int, dict[str, float]]:
    """``{step: {env: pass rate at step - pass rate at baseline_step}}`` for every step after
    the baseline (seed: relative to the step-25 checkpoint); NaN where either is undefined."""
    if baseline_step not in pass_rates:
        raise ValueError(f"improvements: no pass rates at the baseline step {baseline_step}")
    base = pass_rates[baseline_step]
    out: dict[int, dict[str, float]] = {}
    for step in sorted(s for s in pass_rates if s > baseline_step):
        out[step] = {
            env: float(rate) - float(base.get(env, math.nan))
            for env, rate in sorted(pass_rates[step].items())
        }
    return out


def transfer_rows(
    similarities: Mapping[int, Mapping[str, Mapping[str, float]]],
    pass_rates: Mapping[int, Mapping[str, float]],
    baseline_step: int,
    train_env: str,
) -> list[dict[str, Any]]:
    """One row per (analysed checkpoint, environment): ``step``, ``env``, ``held_out`` (not the
    training environment), ``pass_rate``, ``baseline_pass_rate``, ``improvement`` and each
    signal of ``similarities[step][env]``."""
    gains = improvements(pass_rates, baseline_step)
    rows = []
    for step in sorted(gains):
        for env in sorted(gains[step]):
            sims = similarities.get(step, {}).get(env, {})
            rows.append(
                {
                    "step": int(step),
                    "env": env,
                    "held_out": env != train_env,
                    "pass_rate": float(pass_rates[step][env]),
                    "baseline_pass_rate": float(pass_rates[baseline_step].get(env, math.nan)),
                    "improvement": gains[step][env],
                    **{k: float(v) for k, v in sims.items()},
                }
            )
    return rows


def _selected(rows: Iterable[Mapping[str, Any]], held_out: bool) -> list[Mapping[str, Any]]:
    return [r for r in rows if r["held_out"] or not held_out]


def pooled_correlation(
    rows: Sequence[Mapping[str, Any]],
    signal: str,
    *,
    held_out: bool = False,
    method: str = "spearman",
) -> tuple[float | None, int]:
    """(coefficient, pairs) of ``signal`` against ``improvement`` over every (checkpoint,
    environment) row pooled (``held_out``: the training environment's rows left out); pairs
    with an undefined value are left out; None when undefined (constant side, < 2 pairs)."""
    fn = {"spearman": spearman, "pearson": pearson}.get(method)
    if fn is None:
        raise ValueError(f"pooled_correlation: method must be spearman or pearson, got {method!r}")
    sel = _selected(rows, held_out)
    x = np.array([float(r.get(signal, math.nan)) for r in sel], np.float64)
    y = np.array([float(r["improvement"]) for r in sel], np.float64)
    n = int(np.sum(~(np.isnan(x) | np.isnan(y))))
    return fn(x, y), n


def most_improved_hits(
    rows: Sequence[Mapping[str, Any]], signal: str, *, held_out: bool = False
) -> tuple[int, int]:
    """(hits, evaluated checkpoints): at how many checkpoints the environment most similar by
    ``signal`` is the most improved one (module docstring: ties and what counts)."""
    by_step: dict[int, list[tuple[str, float, float]]] = {}
    for r in _selected(rows, held_out):
        s, g = float(r.get(signal, math.nan)), float(r["improvement"])
        if not (math.isnan(s) or math.isnan(g)):
            by_step.setdefault(int(r["step"]), []).append((str(r["env"]), s, g))
    hits = evaluated = 0
    for pairs in by_step.values():
        gains = [g for _, _, g in pairs]
        if len(pairs) < 2 or max(gains) == min(gains):
            continue
        evaluated += 1
        pairs = sorted(pairs)  # by environment name: the first of tied signals wins
        best = max(range(len(pairs)), key=lambda i: (pairs[i][1], -i))
        hits += pairs[best][2] == max(gains)
    return hits, evaluated


def summarize(
    rows: Sequence[Mapping[str, Any]], signals: Sequence[str] = SIGNALS
) -> dict[str, Any]:
    """Per signal and subset (``all`` environments, ``held_out``): pooled Spearman and Pearson
    with the number of pairs, and the most-improved hits out of the evaluated checkpoints."""
    out: dict[str, Any] = {}
    for subset, held in (("all", False), ("held_out", True)):
        per: dict[str, Any] = {}
        for sig in signals:
            rho, n = pooled_correlation(rows, sig, held_out=held)
            r, _ = pooled_correlation(rows, sig, held_out=held, method="pearson")
            hits, evaluated = most_improved_hits(rows, sig, held_out=held)
            per[sig] = {
                "spearman": rho, "pearson": r, "pairs": n,
                "most_improved_hits": hits, "checkpoints": evaluated,
            }  # fmt: skip
        out[subset] = per
    return out


def retag_agreement(
    rows: Sequence[Mapping[str, Any]], signals: Sequence[str] = PROFILE_SIGNALS
) -> dict[str, Any]:
    """Seed C.2 (Table 8): the same rollouts tagged a second time (``retag/<signal>`` in the
    rows). Per profile signal: its agreement over the (checkpoint, environment) pairs
    (``pearson`` between the two taggings' similarities, ``mean_abs_diff``) and, per subset, the
    pooled Spearman of the retagged signal and its change from the first tagging's (``delta``);
    ``max_abs_delta`` over all (the seed: at most 0.060). Signals without ``retag/`` values are
    left out."""
    out: dict[str, Any] = {"signals": {}, "max_abs_delta": None}
    deltas = []
    for sig in signals:
        key = RETAG_PREFIX + sig
        if not any(key in r for r in rows):
            continue
        a = np.array([float(r.get(sig, math.nan)) for r in rows], np.float64)
        b = np.array([float(r.get(key, math.nan)) for r in rows], np.float64)
        ok = ~(np.isnan(a) | np.isnan(b))
        per: dict[str, Any] = {
            "pearson": pearson(a, b),
            "mean_abs_diff": float(np.mean(np.abs(a[ok] - b[ok]))) if ok.any() else None,
        }
        for subset, held in (("all", False), ("held_out", True)):
            rho, _ = pooled_correlation(rows, sig, held_out=held)
            rho2, _ = pooled_correlation(rows, key, held_out=held)
            delta = None if rho is None or rho2 is None else rho2 - rho
            per[subset] = {"spearman": rho2, "delta": delta}
            if delta is not None:
                deltas.append(abs(delta))
        out["signals"][sig] = per
    out["max_abs_delta"] = max(deltas) if deltas else None
    return out


# ------------------------------------------------------------------------------ files, CLI


def write_outputs(
    out_dir: str, rows: Sequence[Mapping[str, Any]], summary: Mapping[str, Any]
) -> tuple[str, str]:
    """Writes ``transfer.jsonl`` and ``transfer_summary.json`` into ``out_dir`` (NaN as null)."""

    def clean(v):
        if isinstance(v, float) and math.isnan(v):
            return None
        if isinstance(v, Mapping):
            return {k: clean(x) for k, x in v.items()}
        return v

    os.makedirs(out_dir, exist_ok=True)
    rows_path = os.path.join(out_dir, ROWS_FILE)
    with open(rows_path + ".tmp", "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(clean(r), sort_keys=True) + "\n")
    os.replace(rows_path + ".tmp", rows_path)
    summary_path = os.path.join(out_dir, SUMMARY_FILE)
    with open(summary_path + ".tmp", "w", encoding="utf-8") as f:
        json.dump(clean(summary), f, indent=1, sort_keys=True)
    os.replace(summary_path + ".tmp", summary_path)
    return rows_path, summary_path
