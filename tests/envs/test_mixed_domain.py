"""The embedded domain with tool environments mixed in (``domain.tool_envs``): splits, verifier
and oracle dispatch, warm-start corpus, tokenizer, config errors, and one training step in which
single-turn and agent groups are rolled out, rewarded, tagged and trained together."""

import collections
import math

import numpy as np
import pytest

from configs import rised
from rubric_rl.config import builders
from rubric_rl.config.config_validation import validate_config
from rubric_rl.config.defaults import get_base_config
from rubric_rl.envs.base import is_tool_env
from rubric_rl.envs.mixed_domain import interleave, tool_split_size
from rubric_rl.envs.sql import SqlEnv


def _config(**domain):
    c = get_base_config()
    c.domain.update(**{"n_train": 64, "n_heldout": 32, "n_ood": 16, "tool_envs": "sql", **domain})
    return c


@pytest.fixture(scope="module")
def domain():
    return builders.build_domain(_config())


def test_interleave_keeps_every_prefix_in_proportion():
    a, b = list("abcdefgh"), ["X", "Y"]
    got = interleave([a, b])
    assert sorted(got) == sorted(a + b) and [x for x in got if x in a] == a
    # keys (j + 1/2) / m: a .0625, b .1875, X .25, c .3125, ..., f .6875, Y .75, g .8125
    assert got == ("a", "b", "X", "c", "d", "e", "f", "Y", "g", "h")
    assert tool_split_size(3) == 1 and tool_split_size(64) == 16


def test_splits_verifier_oracle_and_rollout_kind(domain):
    base = builders.build_domain(_config(tool_envs=""))
    for split, n in (("train", 64), ("heldout", 32), ("ood", 16)):
        tasks = getattr(domain, split)
        tools = [t for t in tasks if is_tool_env(t.env_name)]
        assert len(tools) == n // 4 and {t.env_name for t in tools} == {"sql"}
        assert [t for t in tasks if not is_tool_env(t.env_name)] == list(getattr(base, split))
        assert [t.id for t in tools] == [t.id for t in SqlEnv.task_bank(split, n // 4, 0)]
        for m in range(4, len(tasks) + 1, 4):  # every prefix holds sql in proportion
            share = sum(is_tool_env(t.env_name) for t in tasks[:m]) / m
            assert abs(share - 0.2) <= 1 / m + 1e-9
    assert domain.validation == base.validation
    sql = next(t for t in domain.heldout if t.env_name == "sql")
    ref = SqlEnv()
    try:
        ref.reset(sql)
        for turn in SqlEnv.reference_turns(sql):
            ref.step(turn)
        transcript = ref.response()
    finally:
        ref.close()
    assert domain.verify(sql, transcript) and not domain.verify(sql, "Answer: nothing")
    assert math.isnan(domain.oracle(sql, transcript))
    task = next(t for t in domain.heldout if not is_tool_env(t.env_name))
    assert domain.verify(task, task.reference_answer) == base.verify(task, task.reference_answer)
    assert domain.oracle(task, task.reference_answer) == base.oracle(task, task.reference_answer)
    assert domain.episodic(sql) and not domain.episodic(task)
    assert domain.make_env(sql).name == "sql"
    assert domain.guidance(sql) == sql.messages and domain.guidance(task) == base.guidance(task)
    assert domain.embedded_tokenizer == "spaced"
    assert set(base.vocabulary) < set(domain.vocabulary)


def test_warmstart_corpus_shares_and_tokenizer(domain, tmp_path):
    corpus = domain.corpus(100, 0, 0.5, 0.1)
    assert corpus == domain.corpus(100, 0, 0.5, 0.1)  # deterministic
    tool = [c for c in corpus if "SQLite" in c[0][0]["content"]]  # the SQL env's system prompt
    assert len(corpus) == 100 and len(tool) == 20  # tool_demo_share 0.2 of the corpus
    tok = builders.build_spaced_tokenizer(domain.vocabulary, str(tmp_path / "tok"))
    for t in domain.train[:40]:
        text = t.reference_answer if not is_tool_env(t.env_name) else t.question
        assert tok.decode(tok.encode(text)) == text
    with pytest.raises(ValueError, match="tool_demo_share"):
        builders.build_domain(_config(tool_demo_share=0.5, tool_envs="sql,inventory"))


def test_config_errors_name_the_field():
    c = _config(tool_envs="sql,nope")
    with pytest.raises(ValueError, match="domain.tool_envs.*'nope'"):
        validate_config(c)
    c = _config()
    c.rollout.mode = "single"
    with pytest.raises(ValueError, match="rollout.mode.*'single'"):
        validate_config(c)
    c = _config()
    c.model.max_prompt_len = 128
    with pytest.raises(ValueError, match="model.max_prompt_len.*tools=sql"):
        validate_config(c)
    validate_config(rised.get_config("smoke,tools=sql"))
    validate_config(rised.get_config("tools=sql+inventory"))
    with pytest.raises(ValueError, match="tools='sql\\+bogus'"):
        rised.get_config("tools=sql+bogus")
    c = rised.get_config("tools=sql+inventory")
    assert c.domain.tool_envs == "sql,inventory" and c.rollout.agent.max_total_tokens == 2304
    assert c.model.prompt_buckets[:5] == (24, 32, 48, 64, 96)


class _ReferencePolicy:
    """A scripted stand-in engine: a constraint prompt gets its task's reference answer, an
    agent turn its SQL task's reference turn; behaviour log-probs are a constant (what is
    checked is the batch and the rewards, so no scoring program is compiled)."""

    def __init__(self, tokenizer, tasks, max_turns, version):
        self.tok, self.max_turns, self.version = tokenizer, max_turns, version
        self.tasks = sorted(tasks, key=lambda t: -len(t.question))  # longest match first
        self.seen = collections.Counter()

    def generate(self, requests, params):
        from rubric_rl.rollout.engine import Generation

        out = []
        for req in requests:
            prompt = self.tok.decode(list(req.prompt_ids))
            task = next(t for t in self.tasks if t.question in prompt)
            if is_tool_env(task.env_name):
                # the agent loop's offset: sample_index * max_turns + turns so far
                text = SqlEnv.reference_turns(task)[req.sample_offset % self.max_turns]
            else:
                text = task.reference_answer
            self.seen[task.env_name == "sql"] += 1
            ids = [*self.tok.encode(text), self.tok.eos_id]
            g = Generation(tuple(ids), (-0.5,) * len(ids), "stop", self.version, "r")
            out.append([g] * params.n)
        return out


def test_one_step_trains_single_turn_and_agent_groups_together(tmp_path):
    from rubric_rl.trainer import Trainer
    from tests.trainer_spy import one_device, record_train_batches

    c = rised.get_config("smoke,tools=sql")
    c.unlock()
    c.warmstart.steps = 0
    c.eval.update(at_start=False, every=0)
    c.optim.mini_batches = 1
    # The stand-in policy serves every caller of the engine: no calibration probes beside the
    # step's own rollouts, which are what is checked.
    c.calibration.enabled = False
    c.rollout.update(tasks_per_step=8, train_groups=8, samples_per_task=2)  # all trained
    t = Trainer(c, str(tmp_path / "run"), devices=one_device())
    try:
        t._restore_or_warmstart(resume=False)
        policy = _ReferencePolicy(
            t.tokenizer, t.domain.train, int(c.rollout.agent.max_turns), t.engine.weight_version
        )
        t.services.sampler.engine = policy
        seen = record_train_batches(t)
        m = t.train_one_step()
    finally:
        t.close()
    assert policy.seen[True] > 0 and policy.seen[False] > 0  # both kinds in the step
    # Every group is its task's reference: solved by the verifier of its own environment.
    assert m["reward/task_verifier/mean"] == 1.0
    assert m["rised/select/candidates/zero_variance_frac"] == 1.0
    assert m["rised/tag/failed_frac"] == 0.0 and m["rised/tag/discovered_frac"] == 0.0
    assert m["rollout/tool_calls_mean"] > 0
    (tb,) = seen
    lm = np.asarray(tb.loss_mask)
    # Trained runs per row: an SQL episode's three model turns (the tool turns between them
    # masked out), a constraint answer's one; both kinds in the one batch.
    runs = [int((np.diff(np.concatenate([[0], r])) == 1).sum()) for r in lm]
    assert set(runs) == {1, 3} and runs.count(3) == policy.seen[True] // 3  # 3 requests each
