"""Step time with asynchronous rollouts (``rollout.max_staleness=k``) against the synchronous loop,
on the same config in one sitting; prints ONE JSON line.

    python benchmarks/async_check.py [--config configs/grpo.py] [--variant sglang_cpu]
        [--steps 20] [--rounds 2] [--k 1] [--set key=value ...]

Each round runs the config twice through ``python -m rubric_rl.launch`` (its own process, the
public entry point), synchronous then asynchronous (the order alternates between rounds so
machine load hits both alike), with no evaluation or checkpoint until the last step (the only
sync point, so every later step can overlap). The warm start is computed once and shared
(``warmstart.cache_dir``). Per run: the median of ``time/step`` over steps 3..N (steps 1-2
compile), of ``time/rollout_wait`` (the trainer waiting for the next pipeline; with full
overlap ≈ max(0, pipeline − update)), and the mean ``rollout/staleness``. Figures: the median
over rounds of each, and ``step_ratio`` = async ÷ sync (below 1: the overlap pays).

Where it can pay: generation and the update must run on different resources — the SGLang engine
(its own process) or a GPU; with the in-process JAX engine on a CPU both share the same cores.
Absolute times on a shared machine mean little; the ratio from alternating rounds is the figure.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from rubric_rl.metrics import read_metrics  # noqa: E402


def _run(workdir: str, config: str, steps: int, k: int, sets: list[str], cache: str) -> dict:
    cmd = [
        sys.executable, "-m", "rubric_rl.launch", f"--config={config}", f"--workdir={workdir}",
        f"--config.train.steps={steps}", "--config.eval.every=0", "--config.eval.at_start=False",
        "--config.checkpoint.every=0", "--config.checkpoint.final=False",
        f"--config.rollout.max_staleness={k}", f"--config.warmstart.cache_dir={cache}",
        "--config.logging.progress_bar=False", *(f"--config.{s}" for s in sets),
    ]  # fmt: skip
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    rows = read_metrics(os.path.join(workdir, "metrics.jsonl"))
    timed = [r for r in rows if r["step"] >= 3]
    if not timed:
        raise RuntimeError(f"{workdir}: no step >= 3 logged (use --steps >= 3)")
    return {
        "step_s": statistics.median(r["time/step"] for r in timed),
        "wait_s": statistics.median(r.get("time/rollout_wait", 0.0) for r in timed),
        "train_s": statistics.median(r["time/train"] for r in timed),
        "staleness": statistics.mean(r.get("rollout/staleness", 0.0) for r in timed),
        "wall_s": time.perf_counter() - t0,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", default="configs/grpo.py")
    ap.add_argument("--variant", default="", help="the config's variant string, e.g. sglang_cpu")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--k", type=int, default=1, help="rollout.max_staleness of the async side")
    ap.add_argument("--set", action="append", default=[], help="key=value for both sides")
    args = ap.parse_args()
    if args.k < 1 or args.steps < 3 or args.rounds < 1:
        ap.error("need --k >= 1, --steps >= 3, --rounds >= 1")
    config = f"{args.config}:{args.variant}" if args.variant else args.config
    out: dict = {"config": config, "steps": args.steps, "k": args.k, "rounds": []}
    with tempfile.TemporaryDirectory(prefix="async_check_") as tmp:
        cache = os.path.join(tmp, "ws_cache")
        for i in range(args.rounds):
            sides = ("sync", "async") if i % 2 == 0 else ("async", "sync")
            rnd = {}
            for side in sides:
                wd = os.path.join(tmp, f"r{i}_{side}")
                k = args.k if side == "async" else 0
                rnd[side] = _run(wd, config, args.steps, k, args.set, cache)
            out["rounds"].append(rnd)
    for side in ("sync", "async"):
        for key in ("step_s", "wait_s", "train_s", "staleness"):
            out[f"{side}_{key}"] = statistics.median(r[side][key] for r in out["rounds"])
    out["step_ratio"] = out["async_step_s"] / out["sync_step_s"]
    out["step_ratio_per_round"] = [
        r["async"]["step_s"] / r["sync"]["step_s"] for r in out["rounds"]
    ]
    print(json.dumps(out, sort_keys=True))


if __name__ == "__main__":
    main()
