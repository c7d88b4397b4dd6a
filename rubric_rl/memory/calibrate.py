"""Calibrating the semantic index's cosine floor η for an embedder.

The seed states η = 0.82 for bge-base-en-v1.5. A cosine floor does not carry over between
embedders (MiniLM's cosines for the same pair of texts run lower), so for any other embedder we
recalibrate on labelled pairs of the training split's distinct criterion texts: two texts are
*related* when they state the same kind of requirement (the criterion id's kind: ``count``,
``category``, ``sep`` …, parameters aside — "the response lists exactly 5 items" and "… 3
items") and *unrelated* otherwise. The floor is the cosine that maximises F_0.5 of retrieving
related pairs (precision weighted over recall, ``BETA``). The labels are coarse (``include`` and
``exclude`` criteria are different kinds but near-identical texts), so precision never reaches
1 at any floor; the table it prints is the evidence. Only training tasks are read; the held-out
split never chooses anything.

    python -m rubric_rl.memory.calibrate --embedder=minilm        # one JSON line
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import numpy as np

# F_0.5: precision weighs twice recall. A wrong neighbour misleads the attributor (its positives
# are taken as evidence about this criterion); a missed one only withholds evidence.
BETA = 0.5


def criterion_kind(criterion_id: str) -> str:
    """``sep:/`` -> ``sep``; ``order:asc`` -> ``order``; ``count`` -> ``count``."""
    return str(criterion_id).split(":", 1)[0]


def fbeta_floor(
    embeddings: np.ndarray, labels: Sequence[str], *, beta: float = BETA
) -> dict[str, float]:
    """The cosine threshold maximising F_β of retrieving related pairs (rows sharing a label)
    among all pairs of distinct rows; ``embeddings``: ``[n, d]`` unit rows.

    Returns floor, precision, recall, f_beta and the pair counts. The floor is the midpoint
    between the best threshold's cosine and the next lower one, so a pair at the threshold is
    retrieved (cosine ≥ floor) and the next one is not.
    """
    e = np.asarray(embeddings, np.float64)
    labels = np.asarray(labels)
    n = len(e)
    if n != len(labels):
        raise ValueError("fbeta_floor: embeddings and labels differ in length")
    if beta <= 0:
        raise ValueError(f"fbeta_floor: beta={beta} must be > 0")
    iu = np.triu_indices(n, k=1)
    cos = (e @ e.T)[iu]
    pos = labels[iu[0]] == labels[iu[1]]
    n_pos, n_neg = int(pos.sum()), int((~pos).sum())
    if n_pos == 0 or n_neg == 0:
        raise ValueError(f"fbeta_floor: {n_pos} related and {n_neg} unrelated pairs; need both")
    order = np.argsort(-cos, kind="stable")
    cos_s, pos_s = cos[order], pos[order]
    tp = np.cumsum(pos_s)  # threshold at cos_s[i]: pairs 0..i retrieved
    precision = tp / np.arange(1, len(cos_s) + 1)
    recall = tp / n_pos
    b2 = beta * beta
    with np.errstate(invalid="ignore", divide="ignore"):
        f = np.where(tp > 0, (1 + b2) * precision * recall / (b2 * precision + recall), 0.0)
    # Only thresholds at the last of a run of equal cosines are attainable.
    last = np.r_[cos_s[1:] != cos_s[:-1], True]
    f = np.where(last, f, -np.inf)
    i = int(np.argmax(f))
    nxt = cos_s[i + 1] if i + 1 < len(cos_s) else cos_s[i] - 1e-3
    return {
        "floor": float((cos_s[i] + nxt) / 2),
        "precision": float(precision[i]),
        "recall": float(recall[i]),
        "f_beta": float(f[i]),
        "beta": float(beta),
        "related_pairs": n_pos,
        "unrelated_pairs": n_neg,
    }


def domain_criterion_texts(n_tasks: int = 200, seed: int = 0):
    """Distinct criterion texts of the embedded domain's training tasks (seed rubric and the
    checker library), as (text, kind) rows. A text that recurs across tasks ("the response has
    at most 40 words") appears once: identical texts say nothing about a floor."""
    from rubric_rl.envs.constraint_domain import task_bank
    from rubric_rl.envs.constraint_library import library_criteria

    kinds: dict[str, str] = {}
    for task in task_bank("train", n=n_tasks, seed=seed):
        for c in (*task.rubric.criteria, *library_criteria(task)):
            kinds.setdefault(c.text, criterion_kind(c.id))
    return sorted(kinds.items())


def calibrate(embedder_spec: str = "minilm", n_tasks: int = 200, seed: int = 0) -> dict:
    from rubric_rl.memory.embedder import make_embedder

    emb = make_embedder(embedder_spec)
    rows = domain_criterion_texts(n_tasks, seed)
    vecs = emb.embed([r[0] for r in rows])
    out = fbeta_floor(vecs, [r[1] for r in rows])
    return {"embedder": emb.name, "tasks": n_tasks, "criteria": len(rows), **out}


def main(argv: Sequence[str] | None = None) -> None:
    import argparse

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--embedder", default="minilm")
    p.add_argument("--tasks", type=int, default=200)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    print(json.dumps(calibrate(a.embedder, a.tasks, a.seed), sort_keys=True))


if __name__ == "__main__":
    main()
