"""``warmstart.cache_dir``: runs that differ only after the warm start share it bit for bit; a
change in anything it depends on (here the seed) trains a new one."""

import os

import jax
import numpy as np

from configs import grpo
from rubric_rl.pre_rl import warmstart
from tests.trainer_spy import one_device


def _params(workdir, cache, **train):
    from rubric_rl.trainer import Trainer

    c = grpo.get_config("smoke")
    c.warmstart.cache_dir = str(cache)
    c.train.update(**train)
    c.eval.n = 4  # differs after the warm start only
    t = Trainer(c, str(workdir), devices=one_device())
    try:
        t._restore_or_warmstart(resume=False)
        return [np.asarray(x) for x in jax.tree.leaves(t.state.params)], warmstart.cache_key(c)
    finally:
        t.close()


def test_cached_warm_start_is_reused_exactly(tmp_path):
    cache = tmp_path / "cache"
    a, key_a = _params(tmp_path / "a", cache, seed=0)
    assert os.path.isdir(cache / key_a / "params")
    assert (tmp_path / "a" / "warmstart" / "log.jsonl").exists()  # a trained
    b, key_b = _params(tmp_path / "b", cache, seed=0, steps=7)
    assert key_b == key_a
    assert not (tmp_path / "b" / "warmstart" / "log.jsonl").exists()  # b copied, no training
    assert os.path.isdir(tmp_path / "b" / "warmstart" / "params")  # its own copy, for --resume
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    c, key_c = _params(tmp_path / "c", cache, seed=1)
    assert key_c != key_a and (tmp_path / "c" / "warmstart" / "log.jsonl").exists()
    assert any(not np.array_equal(x, y) for x, y in zip(a, c))
    assert sorted(os.listdir(cache)) == sorted([key_a, key_c])
