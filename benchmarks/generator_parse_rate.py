"""Parse rate of ARISE-RL generator episodes after the embedded warm start with generator
demonstrations: the warm-started policy must emit parseable tasks at a measured rate.

Warm start: the embedded default (``configs/grpo.py``, preset ``--preset``, its constraint corpus)
with ``constraint_writer_corpus.with_generator_demonstrations`` (share ``--fraction`` of the corpus,
``--negatives`` in-context negatives at most) for ``--steps`` steps of ``--batch`` rows, no copy
steps, prompts up to 256 tokens and completions of 112. Then ``--episodes`` generator episodes
(``GeneratorEnv`` through the agent loop with the JAX engine, ``--temperature``) over the
training task types, each with 0..--negatives pool questions (training tasks of another seed) as
in-context negatives. Prints ONE JSON line: the R_fmt rate (``parse_rate``), the R_tool rate,
both, the reasons for R_fmt = 0, the share of parsed tasks of the asked type, distinct parsed
questions, three final answers, and the warm start's seconds. ``--workdir`` reuses a warm start.

Measured on the tiny preset, 300 steps, batch 16, 2 loaded CPU cores (~200 s warm start):
fraction 0.5: greedy parse 0/48 (tool 0.98; answers open <question> but never close it);
fraction 1.0: greedy parse 0/48 (every answer has both tags; the questions repeat clauses or
lack a head), sampled (T = 1) parse 3/96 = 0.031, parse and tool 1/96.

Usage: PYTHONPATH=. python benchmarks/generator_parse_rate.py [--preset tiny] [--steps 300]
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import tempfile
import time

import numpy as np


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="1m")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--fraction", type=float, default=0.5)
    ap.add_argument("--negatives", type=int, default=3)
    ap.add_argument("--episodes", type=int, default=64)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--copy_steps", type=int, default=0)
    ap.add_argument("--workdir", default="", help="reuse its warm start (default: a fresh one)")
    args = ap.parse_args()

    import jax
    from absl import logging
    from flax import nnx

    from configs import grpo
    from rubric_rl.config import builders
    from rubric_rl.core.train_step import init_train_state
    from rubric_rl.envs.constraint_domain import ConstraintDomain
    from rubric_rl.envs.constraint_writer import (
        GENERATOR_TASK_TYPES,
        ConstraintTaskWriter,
        GeneratorEnv,
        generator_task,
    )
    from rubric_rl.envs.constraint_writer_corpus import with_generator_demonstrations
    from rubric_rl.methods.arise_rl.arise_rl_domain import GeneratorRole
    from rubric_rl.methods.arise_rl.arise_rl_rewards import r_fmt, r_tool, tool_observed
    from rubric_rl.pre_rl import warmstart
    from rubric_rl.rollout.agent import AgentConfig, ChatFormat, run_agent
    from rubric_rl.rollout.engine import SamplingParams

    c = grpo.get_config(f"model={args.preset}")
    c.model.update(max_prompt_len=256, prompt_buckets=(64, 128, 192))
    c.warmstart.update(max_prompt_len=256, prompt_buckets=(64, 128, 192), steps=args.steps)
    c.warmstart.update(batch=args.batch, copy_steps=args.copy_steps)
    c.rollout.update(max_new_tokens=112, buckets=(32, 112))
    c.domain.seed = args.seed
    logging.set_verbosity(logging.INFO)
    workdir = args.workdir or tempfile.mkdtemp(prefix="gen_parse_rate_")
    domain = with_generator_demonstrations(
        builders.build_domain(c), fraction=args.fraction, n_negatives=args.negatives
    )
    mesh = builders.build_mesh(c)
    tok = builders.build_tokenizer(c, domain, workdir)
    with jax.set_mesh(mesh):
        model = builders.build_model(c, tok, mesh)
    graphdef, state = init_train_state(model, builders.train_config(c), mesh)
    t0 = time.perf_counter()
    params = warmstart.run_or_load(c, workdir, domain, tok, graphdef, state, mesh)
    ws_s = time.perf_counter() - t0
    engine = builders.build_engine(c, nnx.merge(graphdef, params, state.rest), tok, mesh)

    pool = [t.prompt[-1].content for t in ConstraintDomain(args.seed + 1).tasks("train", 200)]
    rng = np.random.default_rng(args.seed)
    tasks = []
    for i in range(args.episodes):
        k = int(rng.integers(0, args.negatives + 1))
        recent = [pool[j] for j in rng.permutation(len(pool))[:k]]
        ttype = GENERATOR_TASK_TYPES[i % len(GENERATOR_TASK_TYPES)]
        tasks.append(generator_task(ttype, recent, index=i))
    envs = [GeneratorEnv() for _ in tasks]
    sp = SamplingParams(max_new_tokens=112, temperature=args.temperature)
    t1 = time.perf_counter()
    trajs = run_agent(
        engine,
        ChatFormat(tok, tools_in_system=False),
        envs,
        tasks,
        sp,
        AgentConfig(max_turns=3, max_total_tokens=512),
        step=1,
    )
    gen_s = time.perf_counter() - t1
    role = GeneratorRole(ConstraintTaskWriter(observed=tool_observed))
    outs = [role.episode_outcome(tr.response, forbidden=frozenset()) for tr in trajs]
    fmt = np.array([r_fmt(o) for _, o in outs])
    tool = np.array([r_tool(o) for _, o in outs])
    parsed = [(g, t) for (g, _), t in zip(outs, tasks, strict=True) if g.task is not None]
    print(
        json.dumps(
            {
                "preset": args.preset,
                "warmstart_steps": args.steps,
                "generator_fraction": args.fraction,
                "episodes": len(outs),
                "temperature": args.temperature,
                "parse_rate": float(fmt.mean()),
                "tool_rate": float(tool.mean()),
                "parse_and_tool_rate": float((fmt * tool).mean()),
                "reasons": dict(collections.Counter(g.reason for g, _ in outs if g.reason)),
                "asked_type_share": float(
                    np.mean([g.task.task_type == t.task_type for g, t in parsed])
                )
                if parsed
                else None,
                "mean_unknown_criteria": float(np.mean([g.num_unknown for g, _ in outs])),
                "distinct_questions": len({g.question for g, _ in parsed}),
                "warmstart_s": round(ws_s, 1),
                "generation_s": round(gen_s, 1),
                "cpu_count": os.cpu_count(),
                "workdir": workdir,
                "examples": [tr.turns[-1][:160] for tr in trajs[:3]],
            }
        )
    )


if __name__ == "__main__":
    main()
