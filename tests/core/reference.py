"""Plain-numpy references for rubric_rl.core (advantages, losses, aggregation, rollout correction).

Written independently of the jnp code: float64, explicit loops, the formulas as the papers and
DESIGN.md §5 state them (ratio-scale comparisons, 1 − Σ top-k for the tail bucket).
"""

from __future__ import annotations

import math

import numpy as np


def random_mask(rng: np.random.Generator, batch: int, length: int, *, empty_rows=(0,)):
    """Prompt-then-completion-then-padding masks of random lengths; ``empty_rows`` fully masked."""
    mask = np.zeros((batch, length), np.float32)
    for b in range(batch):
        if b in empty_rows:
            continue
        start = rng.integers(0, length // 2)
        stop = rng.integers(start + 1, length + 1)
        mask[b, start:stop] = 1.0
    return mask


# ----------------------------------------------------------------------------- aggregation


def aggregate(per_token, mask, mode, seq_weights=None, constant=None):
    batch, length = per_token.shape
    u = np.ones(batch) if seq_weights is None else np.asarray(seq_weights, np.float64)
    num = 0.0
    den = 0.0
    for b in range(batch):
        tok_sum = 0.0
        tok_count = 0.0
        for t in range(length):
            if mask[b, t] != 0:
                tok_sum += float(per_token[b, t]) * float(mask[b, t])
                tok_count += float(mask[b, t])
        if mode == "token-mean":
            num += u[b] * tok_sum
            den += tok_count
        elif mode == "seq-mean-token-mean":
            if tok_count > 0:
                num += u[b] * tok_sum / tok_count
                den += 1
        elif mode == "seq-mean-token-sum":
            num += u[b] * tok_sum
            den += tok_count > 0
        elif mode == "dr-grpo":
            num += u[b] * tok_sum
            den += constant
        else:
            raise ValueError(mode)
    return num, den


# ----------------------------------------------------------------------------- advantages


def group_advantages(rewards, *, eps=1e-6, tol=1e-6, valid=None, mean_only=False):
    groups, j = rewards.shape
    valid = np.ones((groups, j), bool) if valid is None else valid
    adv = np.zeros((groups, j))
    zero_variance = np.zeros(groups, bool)
    for g in range(groups):
        vals = [float(rewards[g, i]) for i in range(j) if valid[g, i]]
        if len(vals) < 2 or max(vals) - min(vals) < tol:
            zero_variance[g] = True
            continue
        mean = sum(vals) / len(vals)
        std = math.sqrt(sum((v - mean) ** 2 for v in vals) / (len(vals) - 1))
        for i in range(j):
            if valid[g, i]:
                centred = float(rewards[g, i]) - mean
                adv[g, i] = centred if mean_only else centred / (std + eps)
    return adv, zero_variance


def importance_weights(probs, drawn_ids):
    return np.array([1.0 / (len(probs) * probs[i]) for i in drawn_ids])


# ----------------------------------------------------------------------------- PPO


def ppo_per_token(logps, old_logps, advantages, eps_lo=0.2, eps_hi=0.2, dual_c=3.0):
    batch, length = logps.shape
    adv = advantages if advantages.ndim == 2 else np.repeat(advantages[:, None], length, 1)
    loss = np.zeros((batch, length))
    flags = {k: np.zeros((batch, length), bool) for k in ("low", "high", "dual")}
    ratio = np.zeros((batch, length))
    for b in range(batch):
        for t in range(length):
            a = float(adv[b, t])
            r = math.exp(min(max(float(logps[b, t]) - float(old_logps[b, t]), -20.0), 20.0))
            ratio[b, t] = r
            unclipped = -a * r
            clipped = -a * min(max(r, 1 - eps_lo), 1 + eps_hi)
            value = max(unclipped, clipped)
            flags["low"][b, t] = a < 0 and r < 1 - eps_lo
            flags["high"][b, t] = a > 0 and r > 1 + eps_hi
            if dual_c is not None and a < 0 and -dual_c * a < value:
                flags["dual"][b, t] = True
                value = -dual_c * a
            loss[b, t] = value
    return loss, flags, ratio


# ----------------------------------------------------------------------------- KL


def kl_per_token(logps, ref_logps, kind, clamp=10.0):
    d = np.clip(logps.astype(np.float64) - ref_logps, -clamp, clamp)
    return {"k1": d, "k2": 0.5 * d**2, "k3": np.exp(-d) + d - 1}[kind]


# ----------------------------------------------------------------------------- rollout correction


def rollout_correction(old, roll, mask, *, mode, tis=None, cap=2.0, rejections=(), veto=None):
    batch, length = mask.shape
    on = mask != 0
    keep = on.copy()
    weights = np.ones((batch, length))
    for b in range(batch):
        toks = [t for t in range(length) if on[b, t]]
        lw = [float(old[b, t]) - float(roll[b, t]) for t in toks]
        for name, lo, hi in rejections:
            outside = lambda s: (lo is not None and s < lo) or (hi is not None and s > hi)  # noqa: B023
            if name == "token_ratio":
                for t, x in zip(toks, lw):
                    if outside(math.exp(x)):
                        keep[b, t] = False
                continue
            if not toks:
                continue
            n = len(lw)
            stat = {
                "seq_geo_mean": lambda: math.exp(sum(lw) / n),  # noqa: B023
                "seq_sum": lambda: math.exp(sum(lw)),  # noqa: B023
                "seq_mean_k1": lambda: sum(-x for x in lw) / n,  # noqa: B023
                "seq_mean_k2": lambda: sum(0.5 * x * x for x in lw) / n,  # noqa: B023
                "seq_mean_k3": lambda: sum(math.exp(x) - 1 - x for x in lw) / n,  # noqa: B023
            }[name]()
            if outside(stat):
                keep[b, :] = False
        if veto is not None and any(math.exp(x) < veto for x in lw):
            keep[b, :] = False
        if mode == "decoupled" and tis == "token":
            for t, x in zip(toks, lw):
                weights[b, t] = min(math.exp(x), cap)
        elif mode == "decoupled" and tis == "sequence":
            seq_w = min(math.exp(sum(lw)), cap) if toks else 1.0
            for t in range(length):
                weights[b, t] = seq_w
    weights = np.where(keep, weights, 1.0)
    return weights, np.where(keep, mask, 0.0)


# ----------------------------------------------------------------------------- self-distillation


def _log_softmax(x):
    x = x.astype(np.float64)
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def reverse_kl(student_logits, teacher_logits, temperature=1.0):
    ls = _log_softmax(student_logits / temperature)
    lt = _log_softmax(teacher_logits / temperature)
    return (np.exp(ls) * (ls - lt)).sum(-1)


def topk_tail_reverse_kl(student_logits, teacher_logits, k, temperature=1.0):
    ps = np.exp(_log_softmax(student_logits / temperature))
    pt = np.exp(_log_softmax(teacher_logits / temperature))
    flat_s = ps.reshape(-1, ps.shape[-1])
    flat_t = pt.reshape(-1, pt.shape[-1])
    out = np.zeros(flat_s.shape[0])
    for n in range(flat_s.shape[0]):
        top = np.argsort(-flat_s[n], kind="stable")[:k]
        bs = list(flat_s[n, top]) + [1.0 - flat_s[n, top].sum()]
        bt = list(flat_t[n, top]) + [1.0 - flat_t[n, top].sum()]
        out[n] = sum(p * (math.log(p) - math.log(q)) for p, q in zip(bs, bt) if p > 0)
    return out.reshape(ps.shape[:-1])


def generalized_jsd(student_logits, teacher_logits, beta, temperature=1.0):
    """GKD's JSD_β in TRL's convention (notes/baselines.md §7.2), from the probabilities:
    M = β p_T + (1 − β) p_S, JSD_β = β KL(p_T ‖ M) + (1 − β) KL(p_S ‖ M); β = 0 is KL(p_T ‖ p_S)
    and β = 1 is KL(p_S ‖ p_T)."""
    ps = np.exp(_log_softmax(student_logits / temperature))
    pt = np.exp(_log_softmax(teacher_logits / temperature))
    flat_s = ps.reshape(-1, ps.shape[-1])
    flat_t = pt.reshape(-1, pt.shape[-1])

    def kl(p, q):
        return sum(a * math.log(a / b) for a, b in zip(p, q) if a > 0)

    out = np.zeros(flat_s.shape[0])
    for n in range(flat_s.shape[0]):
        s, t = flat_s[n], flat_t[n]
        if beta == 0:
            out[n] = kl(t, s)
        elif beta == 1:
            out[n] = kl(s, t)
        else:
            m = beta * t + (1 - beta) * s
            out[n] = beta * kl(t, m) + (1 - beta) * kl(s, m)
    return out.reshape(ps.shape[:-1])


def numerical_grad(fn, x, eps=1e-5):
    """Central finite differences of the scalar ``fn`` at ``x`` (float64)."""
    x = np.asarray(x, np.float64)
    grad = np.zeros_like(x)
    for i in np.ndindex(x.shape):
        up, down = x.copy(), x.copy()
        up[i] += eps
        down[i] -= eps
        grad[i] = (fn(up) - fn(down)) / (2 * eps)
    return grad


def reverse_kl_grad(student_logits, teacher_logits):
    """d KL(softmax(z) ‖ q) / d z_j = p_j (log p_j − log q_j − KL), temperature 1."""
    ls = _log_softmax(student_logits)
    lt = _log_softmax(teacher_logits)
    p = np.exp(ls)
    kl = (p * (ls - lt)).sum(-1, keepdims=True)
    return p * (ls - lt - kl)


def _sd_on(sd_mask, b, t):
    """The SD mask at (b, t): a [B] mask holds per sequence, a [B, T] mask per token."""
    return bool(sd_mask[b] if np.ndim(sd_mask) == 1 else sd_mask[b, t])


def sampled_sd_advantage(logps, teacher_logps, coef, sd_mask, clamp=10.0):
    out = np.zeros(logps.shape)
    for b in range(logps.shape[0]):
        for t in range(logps.shape[1]):
            if _sd_on(sd_mask, b, t):
                out[b, t] = coef[b] * min(float(logps[b, t]) - float(teacher_logps[b, t]), clamp)
    return out


def sd_loss(kl, mask, coef, sd_mask, mode="token-mean", seq_weights=None, constant=None):
    """``(num, den, metrics)`` of ``sd_loss_from_kl``: λ_b · KL_bt where the SD mask is on,
    aggregated over the whole loss mask; metrics as finalized means (NaN when nothing counts)."""
    batch, length = kl.shape
    per_token = np.zeros((batch, length))
    kl_sum, kl_count = 0.0, 0
    rows_with_tokens, active_rows, coef_sum = 0, 0, 0.0
    for b in range(batch):
        distilled_here = False
        for t in range(length):
            if _sd_on(sd_mask, b, t):
                per_token[b, t] = float(coef[b]) * float(kl[b, t])
                if mask[b, t] != 0:
                    kl_sum += float(kl[b, t])
                    kl_count += 1
                    distilled_here = True
        if any(mask[b, t] != 0 for t in range(length)):
            rows_with_tokens += 1
            if distilled_here:
                active_rows += 1
                coef_sum += float(coef[b])
    num, den = aggregate(per_token, mask, mode, seq_weights, constant)
    mean = lambda total, count: total / count if count else float("nan")
    metrics = {
        "sd/kl": mean(kl_sum, kl_count),
        "sd/active_frac": mean(active_rows, rows_with_tokens),
        "sd/coef": mean(coef_sum, active_rows),
    }
    return num, den, metrics
