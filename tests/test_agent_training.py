"""Agent mode end to end: the SQL tool environment trains through ``python -m rubric_rl.launch``
(``configs/grpo.py:smoke,domain=sql``): multi-turn episodes, tool outputs masked out of the loss,
judged and verified, evaluated per split."""

import os
import subprocess
import sys

import pytest

from rubric_rl.metrics import read_metrics, read_rollouts
from tests.launch_env import launch_env
from tests.trainer_spy import one_device, record_train_batches

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.slow
@pytest.mark.e2e
def test_sql_domain_trains_through_launch_in_agent_mode(tmp_path):
    work = tmp_path / "sql"
    cmd = [
        sys.executable, "-m", "rubric_rl.launch", "--config=configs/grpo.py:smoke,domain=sql",
        "--config.train.steps=2", "--config.eval.every=2",
        # One padded prompt shape (model.max_prompt_len: an agent turn's prompt is the episode
        # so far, which would otherwise cross every bucket) and the warm start without its copy
        # phase: fewer programs to compile; the episodes are the agent loop's all the same.
        "--config.model.prompt_buckets=()", "--config.warmstart.copy_steps=0",
        f"--workdir={work}",
    ]  # fmt: skip
    env = launch_env(tmp_path / "jax_cache")
    subprocess.run(cmd, cwd=REPO, env=env, check=True, timeout=600, capture_output=True)
    rows = read_metrics(str(work / "metrics.jsonl"))
    assert [r["step"] for r in rows] == [0, 1, 2]
    for r in rows[1:]:
        # The barely warm-started smoke policy rarely writes a valid tool call (the test below
        # trains on episodes that do); its episodes still run through the agent loop.
        assert 0 < r["rollout/model_token_frac"] <= 1 and r["rollout/turns_mean"] >= 1
        assert r["judge/failed"] == 0 and r["reward/undefined"] == 0
        assert "reward/task_verifier/mean" in r and r["train/updates"] >= 1
    assert "eval/heldout/pass_rate" in rows[2] and "eval/ood/pass_rate" in rows[2]
    logged = read_rollouts(str(work / "rollouts" / "step_000001.jsonl.gz"))
    assert logged and all(x["task_id"].startswith("sql") for x in logged)


class _ReferencePolicy:
    """A scripted stand-in policy: each model turn is the env's reference solution turn (and
    the stop token), with the current policy's own log-probs of those tokens (the real engine's
    ``score``), so the step trains on teacher-forced episodes that call the tools."""

    def __init__(self, engine, tokenizer, env_cls, max_turns, temperature):
        self.engine, self.tok, self.env_cls = engine, tokenizer, env_cls
        self.max_turns, self.temperature = max_turns, temperature
        self.tasks = []  # the episodes' tasks, by the trained stream's task index

    def generate(self, requests, params):
        from rubric_rl.rollout.engine import Generation

        out = []
        for req in requests:
            task = self.tasks[req.task_index]
            assert task.question in self.tok.decode(list(req.prompt_ids))
            turn = self.env_cls.reference_turns(task)[req.sample_offset % self.max_turns]
            ids = [*self.tok.encode(turn), self.tok.eos_id]
            (lps,) = self.engine.score([(req.prompt_ids, ids)], temperature=self.temperature)
            version = self.engine.weight_version
            out.append([Generation(tuple(ids), tuple(lps), "stop", version, req.request_id)])
        return out


def test_agent_steps_train_model_turns_and_mask_tool_outputs(tmp_path):
    import numpy as np

    from configs import grpo
    from rubric_rl.envs.sql import SqlEnv
    from rubric_rl.trainer import Trainer

    c = grpo.get_config("smoke,domain=sql")
    c.warmstart.steps = 0
    c.eval.update(at_start=False, every=0)
    c.optim.mini_batches = 1
    c.model.prompt_buckets = ()  # one padded length for every scored turn: one score program
    # The stand-in policy serves every caller of the engine: no calibration probes beside the
    # step's own rollouts, which are what is checked.
    c.calibration.enabled = False
    t = Trainer(c, str(tmp_path / "run"), devices=one_device())
    try:
        t._restore_or_warmstart(resume=False)
        policy = _ReferencePolicy(
            t.engine, t.tokenizer, SqlEnv, int(c.rollout.agent.max_turns),
            float(c.rollout.temperature),
        )  # fmt: skip
        t.services.sampler.engine, run_agent = policy, t.services.sampler.run_agent

        def recording(tasks, n, **kw):
            policy.tasks = list(tasks)
            return run_agent(tasks, n, **kw)

        t.services.sampler.run_agent = recording
        seen = record_train_batches(t)
        m = t.train_one_step()
    finally:
        t.close()
    assert m["reward/task_verifier/mean"] == 1.0  # the reference episodes pass the verifier
    assert m["rollout/tool_calls_mean"] == 2.0 and m["rollout/turns_mean"] == 3.0
    assert 0 < m["rollout/model_token_frac"] < 1
    tb = seen[-1]
    ids, lm, attn = (np.asarray(x) for x in (tb.input_ids, tb.loss_mask, tb.attention_mask))
    tool_id = t.tokenizer.encode("<|tool|>")
    assert len(tool_id) == 1
    eos = t.tokenizer.eos_id
    for r in range(ids.shape[0]):
        p = int(np.argmax(lm[r]))  # the first trained entry: the first completion token
        tool_pos = [i for i in range(p + 1, ids.shape[1]) if ids[r, i] == tool_id[0]]
        assert len(tool_pos) == 2  # two tool turns in the completion
        for i in tool_pos:
            assert lm[r, i - 1] == 0  # the tool output is never trained
            j = i
            while ids[r, j] != t.tokenizer.encode("<|assistant|>")[0]:
                assert lm[r, j - 1] == 0  # ... nor any token of the tool turn
                j += 1
        # Every model turn is trained up to and including its stop token.
        ends = [i for i in range(p + 1, ids.shape[1]) if ids[r, i] == eos and attn[r, i]]
        assert len(ends) == 3 and all(lm[r, i - 1] == 1 for i in ends)
