"""Per-turn cost of multi-turn agent rollouts in the JAX engine, prefix reuse on vs off.

Prints ONE JSON line. Workload (random weights, preset ``--preset``): ``--batch`` conversations of
``--turns`` turns; turn k generates ``--new`` tokens per conversation (``ignore_eos``, so every turn
has exactly that many on both paths) and then appends an ``--obs``-token observation, so the
history before turn k is ``prompt + k·(new + obs)`` tokens. "off": every turn is
`JaxEngine.generate` on the whole conversation (a re-prefill of the history); "on": the same
requests through ``engine.prefix_session()`` (rollout/prefix_reuse.py), which prefills only the
tokens appended since the last turn. The two paths sample the same tokens (asserted here).

Figures: ``turn_s_on`` / ``turn_s_off`` — seconds per turn index, each the best of ``--repeats``
timed episodes after one untimed warm-up episode per path (compiles every bucket); ``growth_*``
= last turn ÷ first turn (1.0 = cost flat in the history); ``ms_per_100_history_tokens_*`` = the
least-squares slope of turn seconds against history length. With reuse the remaining growth is
decode attention over the cache (the cache length of both paths is the same,
``bucket(context) + new - 1``), not prefill; ``speedup_last_turn`` = off ÷ on at the
last turn; ``prefilled_tokens_per_turn_*`` per conversation. Runs alternate on/off so load from
other processes hits both alike; absolute times only mean something on a quiet machine.

Usage: python benchmarks/agent_turns.py [--preset 1m] [--batch 8] [--turns 8] [--new 32] [--obs 31]
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="1m")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--turns", type=int, default=8)
    ap.add_argument("--prompt", type=int, default=64)
    ap.add_argument("--new", type=int, default=32)
    ap.add_argument("--obs", type=int, default=31)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()

    import jax
    from flax import nnx

    from rubric_rl.models.qwen3 import PRESETS, Qwen3ForCausalLM
    from rubric_rl.rollout.engine import GenerationRequest, SamplingParams
    from rubric_rl.rollout.jax_engine import JaxEngine, JaxEngineConfig

    cfg = PRESETS[args.preset]
    engine = JaxEngine(
        Qwen3ForCausalLM(cfg, rngs=nnx.Rngs(0)),
        JaxEngineConfig(batch_buckets=(args.batch,)),
    )
    params = SamplingParams(max_new_tokens=args.new, temperature=1.0, ignore_eos=True)
    rs = np.random.RandomState(0)
    prompts = [list(rs.randint(1, cfg.vocab_size, args.prompt)) for _ in range(args.batch)]
    observations = rs.randint(1, cfg.vocab_size, (args.turns, args.batch, args.obs))

    prefilled_on: list[float] = []  # measured: the session's prefilled tokens per conversation

    def episode(reuse: bool) -> tuple[list[float], list[list[tuple[int, ...]]]]:
        convs = [list(p) for p in prompts]
        times, tokens = [], []
        prefilled_on.clear()
        session = engine.prefix_session() if reuse else None
        keys = list(range(args.batch))
        for k in range(args.turns):
            reqs = [
                GenerationRequest(tuple(c), f"c{i}/t{k}", task_index=i, sample_offset=k)
                for i, c in enumerate(convs)
            ]
            t0 = time.perf_counter()
            gens = session.generate(reqs, params, keys) if reuse else engine.generate(reqs, params)
            times.append(time.perf_counter() - t0)
            if reuse:
                done = sum(prefilled_on) * args.batch
                prefilled_on.append((session.stats["prefilled_tokens"] - done) / args.batch)
            tokens.append([g[0].token_ids for g in gens])
            for i, g in enumerate(gens):
                convs[i] += list(g[0].token_ids) + observations[k, i].tolist()
        if session is not None:
            session.close()
        return times, tokens

    t0 = time.perf_counter()
    _, tok_on = episode(True)
    _, tok_off = episode(False)
    warmup_s = time.perf_counter() - t0
    assert tok_on == tok_off, "prefix reuse changed the sampled tokens"
    traces = engine.num_traces
    best = {True: [np.inf] * args.turns, False: [np.inf] * args.turns}
    for _ in range(args.repeats):
        for reuse in (False, True):
            times, _ = episode(reuse)
            best[reuse] = [min(a, b) for a, b in zip(best[reuse], times, strict=True)]
    assert engine.num_traces == traces, "timed episodes recompiled"
    on, off = best[True], best[False]
    hist = [args.prompt + k * (args.new + args.obs) for k in range(args.turns)]

    def slope(times: list[float]) -> float:
        """Least-squares growth of a turn's seconds with its history, in ms per 100 tokens."""
        return round(float(np.polyfit(hist, times, 1)[0]) * 1e5, 3)

    print(
        json.dumps(
            {
                "benchmark": "agent_turns",
                "backend": jax.default_backend(),
                "preset": args.preset,
                "batch": args.batch,
                "turns": args.turns,
                "new_tokens": args.new,
                "obs_tokens": args.obs,
                "history_tokens_per_turn": hist,
                "prefilled_tokens_per_turn_on": prefilled_on,
                "prefilled_tokens_per_turn_off": hist,
                "turn_s_on": [round(x, 4) for x in on],
                "turn_s_off": [round(x, 4) for x in off],
                "ms_per_100_history_tokens_on": slope(on),
                "ms_per_100_history_tokens_off": slope(off),
                "growth_on": round(on[-1] / on[0], 3),
                "growth_off": round(off[-1] / off[0], 3),
                "speedup_last_turn": round(off[-1] / on[-1], 3),
                "episode_s_on": round(sum(on), 3),
                "episode_s_off": round(sum(off), 3),
                "compiled_programs": traces,
                "warmup_s": round(warmup_s, 1),
            }
        )
    )
    engine.close()


if __name__ == "__main__":
    main()
