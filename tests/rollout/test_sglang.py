"""SGLang backend: unit tests (no server) and tests against ONE real CPU server per session.

The server tests (`@pytest.mark.sglang`) need third_party/sglang_cpu/install.sh's venv; they skip
with that instruction when it is absent. Log-probs are checked against a reference forward pass
on the same weights by every function in `REFERENCES`: `transformers`' PyTorch forward and our
trainer's own scoring (`rubric_rl.core.logprobs.sequence_logprobs` on our JAX Qwen3).

The two-process test (export once, update every server, sample once: docs/gpu.md) runs against
recording servers of its own, then, with the venv, against the same shared server.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import random
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest

from rubric_rl.rollout.engine import GenerationRequest, SamplingParams, sample_seed
from rubric_rl.rollout.sglang_client import (
    RetryPolicy,
    SGLangEngine,
    SGLangProtocolError,
    SGLangRequestError,
    parse_generation,
)
from rubric_rl.rollout.sglang_server import (
    SGLangServer,
    SGLangServerConfig,
    SGLangServerError,
    default_server_python,
)
from rubric_rl.rollout.weight_sync import WeightSync, WeightSyncError
from tests.launch_env import launch_env, suite_xla_flags
from tests.rollout.sglang_env import TINY_QWEN3, smoke_config

REPO = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).with_name("multihost_sglang_worker.py")

# f32 weights on both sides: only summation order differs (bf16 would need ~1e-2).
LOGPROB_ATOL = 2e-4

# ----------------------------------------------------------------------------- references


Pairs = Sequence[tuple[Sequence[int], Sequence[int]]]


def transformers_logprobs(model_dir: Path, pairs: Pairs, temperature: float) -> list[np.ndarray]:
    """log_softmax(logits / T) of each completion token, from `transformers`' forward pass."""
    import torch
    import transformers

    model = _HF_CACHE.get(str(model_dir))
    if model is None:
        model = transformers.AutoModelForCausalLM.from_pretrained(
            str(model_dir), dtype=torch.float32
        ).eval()
        _HF_CACHE[str(model_dir)] = model
    t = temperature if temperature > 0 else 1.0
    out = []
    for prompt, completion in pairs:
        ids = torch.tensor([list(prompt) + list(completion)])
        with torch.no_grad():
            logp = torch.log_softmax(model(ids).logits[0].double() / t, dim=-1)
        pos = torch.arange(len(prompt) - 1, len(prompt) + len(completion) - 1)
        out.append(logp[pos, torch.tensor(list(completion))].numpy())
    return out


def trainer_logprobs(model_dir: Path, pairs: Pairs, temperature: float) -> list[np.ndarray]:
    """The trainer's own numbers: our JAX Qwen3 loaded from the same safetensors, scored by
    `rubric_rl.core.logprobs.sequence_logprobs` (prediction layout: entry t predicts t+1), all
    pairs right-padded into one batch of bucketed rows and length (one compile per bucket)."""
    import jax.numpy as jnp

    from rubric_rl.core.logprobs import sequence_logprobs
    from rubric_rl.models import from_pretrained

    model = _JAX_CACHE.get(str(model_dir))
    if model is None:
        model = _JAX_CACHE[str(model_dir)] = from_pretrained(str(model_dir))
    seqs = [list(p) + list(c) for p, c in pairs]
    width = -(-max(len(x) for x in seqs) // 64) * 64
    rows = -(-len(seqs) // 8) * 8  # padding rows too: the 3 scored pairs reuse the 8 sampled's
    ids = np.zeros((rows, width), np.int32)
    mask = np.zeros((rows, width), np.int32)
    mask[len(seqs) :, 0] = 1  # a padding row is one token, never an all-masked row
    for i, x in enumerate(seqs):
        ids[i, : len(x)], mask[i, : len(x)] = x, 1
    t = temperature if temperature > 0 else 1.0
    lp, _ = sequence_logprobs(
        model, jnp.asarray(ids), attention_mask=jnp.asarray(mask), temperature=t
    )
    lp = np.asarray(lp, np.float64)
    return [lp[i, len(p) - 1 : len(p) + len(c) - 1] for i, (p, c) in enumerate(pairs)]


_HF_CACHE: dict[str, object] = {}
_JAX_CACHE: dict[str, object] = {}
REFERENCES: dict[str, Callable[[Path, Pairs, float], list[np.ndarray]]] = {
    "transformers": transformers_logprobs,
    "trainer": trainer_logprobs,
}


EOS = TINY_QWEN3["eos_token_id"]  # of the tiny checkpoints; servers stop on it
VOCAB = TINY_QWEN3["vocab_size"]


def _assert_complete(g, max_new_tokens: int) -> None:
    """A finished sample: ids and log-probs one to one; full length, or ended by the model's EOS."""
    assert len(g.token_ids) == len(g.logprobs) >= 1
    if g.finish_reason == "length":
        assert len(g.token_ids) == max_new_tokens and EOS not in g.token_ids
    else:
        assert g.finish_reason == "stop", g
        assert g.token_ids[-1] == EOS and EOS not in g.token_ids[:-1]
        assert len(g.token_ids) <= max_new_tokens


def _prompts(n: int, seed: int, lo: int = 4, hi: int = 12) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(2, VOCAB, size=int(rng.integers(lo, hi))).tolist() for _ in range(n)]


# ----------------------------------------------------------------------------- unit tests


def test_sample_seed_is_stable_distinct_and_validated():
    assert sample_seed(3, 7, 1) == sample_seed(3, 7, 1)
    grid = {sample_seed(s, t, j) for s in range(4) for t in range(8) for j in range(16)}
    assert len(grid) == 4 * 8 * 16  # no collisions within or across groups
    assert all(0 <= x < 2**63 for x in grid)
    req = GenerationRequest(
        prompt_ids=(5, 6), request_id="r", step=2, task_index=3, sample_offset=4
    )
    assert req.seeds(2) == (sample_seed(2, 3, 4), sample_seed(2, 3, 5))
    with pytest.raises(ValueError, match="step"):
        sample_seed(-1, 0, 0)
    with pytest.raises(TypeError, match="task"):
        sample_seed(0, 1.5, 0)


def test_parse_generation_checks_ids_against_logprob_triples():
    good = {
        "output_ids": [7, 9],
        "meta_info": {
            "output_token_logprobs": [[-0.5, 7, None], [-1.5, 9, None]],
            "finish_reason": {"type": "stop", "matched": 9},
            "weight_version": "4",
        },
    }
    g = parse_generation(good, request_id="r", sample_index=1, seed=11, default_version=0)
    assert g.token_ids == (7, 9) and g.logprobs == (-0.5, -1.5)
    assert (g.finish_reason, g.weight_version, g.seed) == ("stop", 4, 11)
    bad_id = json.loads(json.dumps(good))
    bad_id["meta_info"]["output_token_logprobs"][1][1] = 8
    with pytest.raises(SGLangProtocolError, match=r"output_token_logprobs\[1\] is for token 8"):
        parse_generation(bad_id, request_id="r", sample_index=0, seed=None, default_version=0)
    bad_len = json.loads(json.dumps(good))
    bad_len["meta_info"]["output_token_logprobs"].pop()
    with pytest.raises(SGLangProtocolError, match="2 output_ids but 1"):
        parse_generation(bad_len, request_id="r", sample_index=0, seed=None, default_version=0)


class _JSONHandler(BaseHTTPRequestHandler):
    """The fake servers' request handler base: JSON replies, no request log on pytest's output."""

    def log_message(self, *args):
        pass

    def _reply(self, status, obj):
        data = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


class _FlakyServer:
    """A local HTTP server answering /generate: `fail_first` times with `fail_status`, then OK."""

    def __init__(self, fail_first: int, fail_status: int = 503) -> None:
        self.calls: list[dict] = []  # /generate bodies
        self.paths: list[str] = []  # every POST path, in order
        self.version = "0"
        self.fail_first, self.fail_status = fail_first, fail_status
        outer = self

        class Handler(_JSONHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.paths.append(self.path)
                if self.path != "/generate":  # admin endpoints of the weight update
                    if self.path == "/update_weights_from_disk":
                        if "bad" in body["model_path"]:
                            return self._reply(400, {"success": False, "message": "no weights"})
                        outer.version = body["weight_version"]
                    return self._reply(200, {"success": True})
                outer.calls.append(body)
                if len(outer.calls) <= outer.fail_first:
                    self.send_response(outer.fail_status)
                    self.end_headers()
                    self.wfile.write(b'{"error": "try later"}')
                    return
                n = len(body["input_ids"]) if isinstance(body["input_ids"][0], list) else 1
                item = {
                    "output_ids": [3, 4],
                    "meta_info": {
                        "output_token_logprobs": [[-1.0, 3, None], [-2.0, 4, None]],
                        "finish_reason": {"type": "length", "length": 2},
                        "weight_version": outer.version,
                    },
                }
                self._reply(200, [item] * n if n > 1 else item)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def test_retries_5xx_with_backoff_then_succeeds_and_sends_per_sample_seeds():
    srv = _FlakyServer(fail_first=2)
    retry = RetryPolicy(max_attempts=5, base_s=0.01, max_s=0.05)
    try:
        with SGLangEngine([srv.url], retry=retry) as engine:
            req = GenerationRequest(prompt_ids=(5, 6, 7), request_id="a", step=1, task_index=2)
            out = engine.generate([req], SamplingParams(max_new_tokens=2, n=3))
        assert len(srv.calls) == 3 and engine.stats["retries"] == 2
        assert [g.token_ids for g in out[0]] == [(3, 4)] * 3
        sent = srv.calls[-1]
        assert sent["input_ids"] == [[5, 6, 7]] * 3 and sent["return_logprob"] is True
        seeds = [sp["sampling_seed"] for sp in sent["sampling_params"]]
        assert seeds == list(req.seeds(3)) and len(set(seeds)) == 3
        assert [g.seed for g in out[0]] == seeds
    finally:
        srv.close()


def test_request_carries_min_new_tokens_and_ignore_eos():
    """SGLang's own sampling-parameter names, per sample (seeded) and per request (n=)."""
    srv = _FlakyServer(fail_first=0)
    req = GenerationRequest((5, 6), "a")
    try:
        forced = SamplingParams(max_new_tokens=2, n=2, min_new_tokens=2, ignore_eos=True)
        with SGLangEngine([srv.url]) as engine:
            engine.generate([req], forced)
            engine.generate([req], SamplingParams(max_new_tokens=2, n=2))
        with SGLangEngine([srv.url], seed_mode="none") as engine:
            engine.generate([req], dataclasses.replace(forced, ignore_eos=False, n=1))
        per_sample, default, per_request = (c["sampling_params"] for c in srv.calls)
        assert [(sp["min_new_tokens"], sp["ignore_eos"]) for sp in per_sample] == [(2, True)] * 2
        assert [(sp["min_new_tokens"], sp["ignore_eos"]) for sp in default] == [(0, False)] * 2
        assert (per_request["min_new_tokens"], per_request["ignore_eos"]) == (2, False)
    finally:
        srv.close()


def test_engine_eos_ids_join_each_requests_stop_tokens_once():
    """The tokenizer's EOS (the JAX engine's eos_token_ids) is a stop token of every request,
    merged with the request's own without duplicates."""
    srv = _FlakyServer(fail_first=0)
    req = GenerationRequest((5, 6), "a")
    try:
        with SGLangEngine([srv.url], seed_mode="none", eos_token_ids=(1,)) as engine:
            engine.generate([req], SamplingParams(max_new_tokens=2))
            engine.generate([req], SamplingParams(max_new_tokens=2, stop_token_ids=(7, 1)))
        with SGLangEngine([srv.url], seed_mode="none") as engine:
            engine.generate([req], SamplingParams(max_new_tokens=2))
        eos_only, merged, none = (c["sampling_params"] for c in srv.calls)
        assert eos_only["stop_token_ids"] == [1] and merged["stop_token_ids"] == [7, 1]
        assert "stop_token_ids" not in none
    finally:
        srv.close()


def test_client_error_is_not_retried_and_exhaustion_raises():
    srv = _FlakyServer(fail_first=100, fail_status=400)
    try:
        with SGLangEngine([srv.url], retry=RetryPolicy(base_s=0.01)) as engine:
            with pytest.raises(SGLangRequestError, match="answered 400"):
                engine.generate([GenerationRequest((5,), "x")], SamplingParams(max_new_tokens=2))
        assert len(srv.calls) == 1
    finally:
        srv.close()
    srv = _FlakyServer(fail_first=100, fail_status=502)
    try:
        retry = RetryPolicy(max_attempts=3, base_s=0.01, max_s=0.02)
        with SGLangEngine([srv.url], retry=retry, seed_mode="none") as engine:
            with pytest.raises(SGLangRequestError, match="failed 3 times"):
                engine.generate([GenerationRequest((5,), "x")], SamplingParams(max_new_tokens=2))
        assert len(srv.calls) == 3 and srv.calls[0]["sampling_params"]["n"] == 1
    finally:
        srv.close()


def test_failover_to_another_server_when_one_is_unreachable():
    srv = _FlakyServer(fail_first=0)
    dead = f"http://127.0.0.1:{_closed_port()}"
    retry = RetryPolicy(max_attempts=4, base_s=0.01, max_s=0.02)
    try:
        with SGLangEngine([dead, srv.url], retry=retry) as engine:
            reqs = [GenerationRequest((5, i + 2), f"f{i}") for i in range(4)]
            out = engine.generate(reqs, SamplingParams(max_new_tokens=2))
        assert [g[0].request_id for g in out] == ["f0", "f1", "f2", "f3"]
        assert len(srv.calls) == 4 and engine.stats["retries"] >= 1
    finally:
        srv.close()


def _closed_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_update_weights_order_version_probe_and_continue_on_failure(tmp_path):
    srv = _FlakyServer(fail_first=0)
    good, bad = tmp_path / "good", tmp_path / "bad"
    for d in (good, bad):
        d.mkdir()
        (d / "config.json").write_text("{}")
    try:
        with SGLangEngine([srv.url]) as engine:
            metrics = engine.update_weights(str(good), 7)
            assert srv.paths == [
                "/pause_generation",
                "/flush_cache",
                "/update_weights_from_disk",
                "/continue_generation",
                "/generate",  # the probe that checks the new version is served
            ]
            assert engine.weight_version == 7 and metrics["total_s"] >= metrics["update_s"]
            srv.paths.clear()
            with pytest.raises(WeightSyncError, match="update_weights_from_disk answered 400"):
                engine.update_weights(str(bad), 8)
            assert srv.paths[-1] == "/continue_generation"  # generation resumed regardless
            assert engine.weight_version == 7
            with pytest.raises(TypeError, match="weight_sync"):
                engine.update_weights(object(), 9)
    finally:
        srv.close()


def test_weight_sync_keeps_last_versions(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "config.json").write_text("{}")

    class FakeEngine:
        def __init__(self):
            self.calls = []

        def update_weights(self, path, version):
            self.calls.append((Path(path).name, version))
            return {"update_s": 0.0}

    sync, engine = WeightSync(tmp_path / "ckpt", keep_last=2), FakeEngine()
    for v in (1, 2, 3):
        metrics = sync.sync(engine, str(src), v)
    assert engine.calls == [("v1", 1), ("v2", 2), ("v3", 3)]
    assert sync.versions() == [2, 3] and metrics["deleted_versions"] == 1.0
    sync.sync(engine, str(src), 3)  # re-export of the same version (a resumed run): fine
    assert sync.versions() == [2, 3]
    sync.sync(engine, str(src), 1)  # resumed from an older checkpoint: newer exports are stale
    assert sync.versions() == [1] and engine.calls[-1] == ("v1", 1)
    with pytest.raises(ValueError, match="version must be >= 0"):
        sync.sync(engine, str(src), -1)
    with pytest.raises(FileNotFoundError, match="no config.json"):
        sync.export(str(tmp_path / "missing"), 9)


def test_server_bad_model_path_is_a_clear_error(tmp_path):
    cfg = SGLangServerConfig(model_path=str(tmp_path / "nope"), python="/bin/true")
    with pytest.raises(SGLangServerError, match="model_path .*nope.* does not exist"):
        SGLangServer(cfg).start()
    cfg = SGLangServerConfig(model_path=str(tmp_path), python=str(tmp_path / "no_python"))
    with pytest.raises(SGLangServerError, match="install.sh"):
        SGLangServer(cfg).start()


def test_sleep_on_idle_flag_is_on_by_default_and_can_be_turned_off(tmp_path):
    on = SGLangServer(SGLangServerConfig(model_path=str(tmp_path))).command(30000)
    off = SGLangServer(SGLangServerConfig(model_path=str(tmp_path), sleep_on_idle=False))
    assert on.count("--sleep-on-idle") == 1
    assert "--sleep-on-idle" not in off.command(30000)


def _group_processes(pgid: int):
    """(the /proc directory, the stat fields after "pid (comm)") of every live process in
    process group `pgid` (Linux /proc): state ppid pgrp ...; utime is field 14, stime 15
    (1-based)."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # the process ended meanwhile
            continue
        if int(fields[2]) == pgid:
            yield stat.parent, fields


def _group_cpu_seconds(pgid: int) -> float:
    """utime + stime of every live process in process group `pgid`."""
    total = sum(int(f[11]) + int(f[12]) for _, f in _group_processes(pgid))
    return total / os.sysconf("SC_CLK_TCK")


# ----------------------------------------------------------------------------- real server


@pytest.mark.sglang
@pytest.mark.parametrize("reference", sorted(REFERENCES))
def test_generate_ids_logprobs_line_up_and_match_reference(sglang_engine, sglang_server, reference):
    model_dir = Path(sglang_server.config.model_path)
    prompts = _prompts(4, seed=0)
    reqs = [GenerationRequest(p, f"r{i}", step=5, task_index=i) for i, p in enumerate(prompts)]
    params = SamplingParams(max_new_tokens=8, temperature=0.8, n=2)
    out = sglang_engine.generate(reqs, params)
    assert len(out) == 4 and all(len(group) == 2 for group in out)
    pairs, got = [], []
    for req, group in zip(reqs, out):
        for j, g in enumerate(group):
            assert g.request_id == req.request_id and g.sample_index == j
            _assert_complete(g, 8)
            assert g.weight_version == sglang_engine.weight_version
            pairs.append((req.prompt_ids, g.token_ids))
            got.append(g.logprobs)
    for lp, ref in zip(got, REFERENCES[reference](model_dir, pairs, 0.8), strict=True):
        np.testing.assert_allclose(lp, ref, atol=LOGPROB_ATOL, rtol=0)


@pytest.mark.sglang
def test_n_samples_per_request_and_stop_tokens(sglang_server):
    with SGLangEngine([sglang_server], seed_mode="none") as engine:
        reqs = [GenerationRequest(p, f"n{i}") for i, p in enumerate(_prompts(2, seed=1))]
        out = engine.generate(reqs, SamplingParams(max_new_tokens=6, temperature=1.0, n=3))
        assert [len(g) for g in out] == [3, 3]
        for group in out:
            assert len({g.token_ids for g in group}) > 1  # samples differ (576-token vocab, T=1)
            for g in group:
                _assert_complete(g, 6)
        # A stop token: generation ends at (and keeps) the first sampled occurrence.
        greedy = engine.generate(reqs[:1], SamplingParams(max_new_tokens=6, temperature=0.0))
        toks = greedy[0][0].token_ids
        stop = toks[2]
        cut = engine.generate(
            reqs[:1], SamplingParams(max_new_tokens=6, temperature=0.0, stop_token_ids=(stop,))
        )[0][0]
        assert cut.finish_reason == "stop"
        assert cut.token_ids == toks[: toks.index(stop) + 1]


@pytest.mark.sglang
@pytest.mark.parametrize("reference", sorted(REFERENCES))
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_score_matches_reference(sglang_engine, sglang_server, temperature, reference):
    model_dir = Path(sglang_server.config.model_path)
    prompts = _prompts(3, seed=2)
    completions = _prompts(3, seed=3, lo=3, hi=9)
    scores = sglang_engine.score(list(zip(prompts, completions)), temperature=temperature)
    refs = REFERENCES[reference](model_dir, list(zip(prompts, completions)), temperature)
    for c, got, ref in zip(completions, scores, refs, strict=True):
        assert len(got) == len(c)
        np.testing.assert_allclose(got, ref, atol=LOGPROB_ATOL, rtol=0)


@pytest.mark.sglang
def test_update_weights_from_disk_switches_output_and_version(
    sglang_engine, sglang_server, tiny_checkpoints, tmp_path_factory
):
    ours, other = tiny_checkpoints
    reqs = [GenerationRequest(p, f"w{i}") for i, p in enumerate(_prompts(3, seed=4))]
    greedy = SamplingParams(max_new_tokens=8, temperature=0.0)

    def run():
        out = sglang_engine.generate(reqs, greedy)
        return [g[0].token_ids for g in out], {g[0].weight_version for g in out}

    before, v0 = run()
    sync = WeightSync(tmp_path_factory.mktemp("sync"), keep_last=1)
    start = sglang_engine.weight_version
    metrics = sync.sync(sglang_engine, str(other), start + 1)
    after, v1 = run()
    assert v0 == {start} and v1 == {start + 1} and sglang_engine.weight_version == start + 1
    assert after != before
    # The new weights really serve: log-probs now match a forward pass of the other checkpoint.
    scored = sglang_engine.generate(reqs[:1], SamplingParams(max_new_tokens=6, temperature=1.0))
    g = scored[0][0]
    (ref,) = transformers_logprobs(Path(other), [(reqs[0].prompt_ids, g.token_ids)], 1.0)
    np.testing.assert_allclose(g.logprobs, ref, atol=LOGPROB_ATOL, rtol=0)
    sync.sync(sglang_engine, str(ours), start + 2)
    back, v2 = run()
    assert back == before and v2 == {start + 2}
    assert sync.versions() == [start + 2]  # keep_last=1 deleted the older export
    assert metrics["update_s"] < 30 and metrics["total_s"] >= metrics["update_s"]


@pytest.mark.sglang
def test_bad_weight_path_is_a_clear_error_and_server_keeps_serving(
    sglang_engine, tiny_checkpoints, tmp_path
):
    version = sglang_engine.weight_version
    with pytest.raises(FileNotFoundError, match="no config.json"):
        sglang_engine.update_weights(str(tmp_path / "missing"), version + 1)
    broken = tmp_path / "broken"  # a config but no weight files
    broken.mkdir()
    shutil.copy(Path(tiny_checkpoints[0]) / "config.json", broken / "config.json")
    with pytest.raises(WeightSyncError, match="update_weights_from_disk answered 400"):
        sglang_engine.update_weights(str(broken), version + 1)
    assert sglang_engine.weight_version == version
    out = sglang_engine.generate([GenerationRequest((5, 6, 7), "ok")], SamplingParams(4))
    assert out[0][0].weight_version == version
    _assert_complete(out[0][0], 4)


@pytest.mark.sglang
def test_server_killed_mid_batch_loses_no_request(sglang_engine, sglang_server):
    model_dir = Path(sglang_server.config.model_path)
    reqs = [GenerationRequest(p, f"k{i}") for i, p in enumerate(_prompts(24, seed=5))]
    params = SamplingParams(max_new_tokens=256, temperature=1.0)  # ~4k tokens: seconds of work
    retries0, restarts0 = sglang_engine.stats["retries"], sglang_engine.stats["restarts"]
    old_pid = sglang_server.pid

    async def run_and_kill():
        task = asyncio.ensure_future(sglang_engine.agenerate(reqs, params))
        await asyncio.sleep(0.3)  # requests are in flight on the server
        assert not task.done()
        sglang_server.kill()  # SIGKILL to the whole process group
        return await task

    out = sglang_engine._run_sync(run_and_kill())
    assert sglang_engine.stats["restarts"] == restarts0 + 1
    assert sglang_engine.stats["retries"] > retries0
    assert sglang_server.pid != old_pid and sglang_server.alive()
    assert [g[0].request_id for g in out] == [r.request_id for r in reqs]
    for (g,) in out:
        _assert_complete(g, 256)
        assert g.weight_version == sglang_engine.weight_version
    # Results are real samples of the served weights (restart reloads the last synced version).
    pairs = [(req.prompt_ids, g.token_ids) for req, (g,) in zip(reqs, out)][:3]
    for (g,), ref in zip(out, transformers_logprobs(model_dir, pairs, 1.0)):
        np.testing.assert_allclose(g.logprobs, ref, atol=LOGPROB_ATOL, rtol=0)
    assert sglang_engine.health()


# ----------------------------------------------------------------------------- two processes


class _RecordingServer:
    """SGLang's /generate (random tokens, log-probs, the served weight version) and the weight
    update endpoints; every request is recorded as (path, body). At each update it reads the
    checkpoint directory, so an update sent before the export was complete fails the test."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, dict]] = []
        self.updates: list[dict] = []  # /update_weights_from_disk: body + what the path held
        self.version = "0"
        self.rng = random.Random()
        outer = self

        class Handler(_JSONHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.requests.append((self.path, body))
                if self.path == "/update_weights_from_disk":
                    path = Path(body["model_path"])
                    cfg = json.loads((path / "config.json").read_text())
                    outer.updates.append(dict(body, files=sorted(os.listdir(path)), config=cfg))
                    outer.version = body["weight_version"]
                if self.path != "/generate":
                    return self._reply(200, {"success": True})
                if body["input_ids"] in ([99], [[99]]):
                    return self._reply(400, {"error": "refused"})
                if "logprob_start_len" in body:  # scoring: the prompt's and completion's
                    ids = body["input_ids"]
                    lps = [[None, ids[0], None]] + [[-0.5 * (i + 1), t, None] for i, t in
                                                    enumerate(ids[1:])]  # fmt: skip
                    return self._reply(200, {"meta_info": {"input_token_logprobs": lps}})
                many = isinstance(body["input_ids"][0], list)
                items = []
                for _ in range(len(body["input_ids"]) if many else 1):
                    n = body["sampling_params"][0]["max_new_tokens"] if many else 1
                    toks = [outer.rng.randrange(3, 50) for _ in range(n)]
                    items.append({
                        "output_ids": toks,
                        "meta_info": {
                            "output_token_logprobs": [[-outer.rng.random(), t, None] for t in toks],
                            "finish_reason": {"type": "length", "length": n},
                            "weight_version": outer.version,
                        },
                    })  # fmt: skip
                self._reply(200, items if many else items[0])

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def paths(self) -> list[str]:
        return [p for p, _ in self.requests]

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def _run_two_processes(tmp_path, *urls: str) -> list[dict]:
    """multihost_sglang_worker.py on 2 processes x 2 CPU devices; what each process saw."""
    env = dict(launch_env(tmp_path / "jax_cache"),
               XLA_FLAGS=suite_xla_flags("--xla_force_host_platform_device_count=2"),
               PYTHONPATH=str(REPO))  # fmt: skip
    coordinator = f"127.0.0.1:{_closed_port()}"
    procs = []
    for i in range(2):
        log = open(tmp_path / f"p{i}.log", "w")  # noqa: SIM115 - closed with the process
        cmd = [sys.executable, str(WORKER), coordinator, str(i), str(tmp_path), *urls]
        procs.append(subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log,
                                      stderr=subprocess.STDOUT))  # fmt: skip
    try:
        for i, p in enumerate(procs):
            assert p.wait(timeout=600) == 0, (tmp_path / f"p{i}.log").read_text()[-4000:]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    return [json.loads((tmp_path / f"p{i}.json").read_text()) for i in range(2)]


def _assert_bf16_exports_equal_the_model(tmp_path, *dirs: str) -> None:
    """`<tmp_path>/<dir>/v2` of each of `dirs` is bit-equal to the same model built in this
    process (8 CPU devices) and exported in bf16."""
    from rubric_rl.config import builders
    from rubric_rl.models import save_pretrained
    from rubric_rl.models.hf_io import SafetensorsFile

    c = smoke_config()
    tokenizer = builders.build_tokenizer(c, builders.build_domain(c), str(tmp_path / "ref_work"))
    model = builders.build_model(c, tokenizer, builders.build_mesh(c))
    save_pretrained(model, str(tmp_path / "ref"), dtype="bfloat16")
    ref = SafetensorsFile(str(tmp_path / "ref" / "model.safetensors"))
    for d in dirs:
        got = SafetensorsFile(str(tmp_path / d / "v2" / "model.safetensors"))
        assert got.names() == ref.names() and len(got.names()) > 5
        for name in ref.names():
            a, b = got.array(name), ref.array(name)
            assert a.dtype == b.dtype and str(a.dtype) == "bfloat16", name
            np.testing.assert_array_equal(a.view(np.uint16), b.view(np.uint16), err_msg=name)
        assert not list((tmp_path / d).glob("*.tmp"))


def test_two_processes_export_once_update_every_server_and_sample_once(request, tmp_path):
    """Two processes (jax.distributed over loopback, 2 x 2 CPU devices) export the policy, update
    the servers and generate through the SGLang engine built from the config: first against two
    recording servers of this test (the router samples, the worker's URL is for updates only),
    then, with the server's venv, against the session's real server (the smoke model takes its
    shape: sglang_env.smoke_config), whose weights are the session's again afterwards."""
    real = None
    if default_server_python().exists():  # without the venv: the recording servers only
        real = request.getfixturevalue("sglang_server")
        engine = request.getfixturevalue("sglang_engine")
        ours = request.getfixturevalue("tiny_checkpoints")[0]
    router, worker = _RecordingServer(), _RecordingServer()
    try:
        urls = (router.url, f"{router.url},{worker.url}") + ((real.url,) if real else ())
        procs = _run_two_processes(tmp_path, *urls)
    finally:
        router.close()
        worker.close()
        if real is not None:  # the shared server serves its own checkpoint again
            engine.update_weights(str(ours), engine.weight_version + 1)
    p0, p1 = (p["recording"] for p in procs)
    assert procs[0]["devices"] == procs[1]["devices"] == 4
    assert (p0["engine"], p0["inner"]) == ("BroadcastEngine", "SGLangEngine")
    assert (p1["engine"], p1["inner"]) == ("BroadcastEngine", "NoneType")  # no client of its own
    assert p0["versions"] == p1["versions"] == [1, 2]

    # Every server got each version once, from process 0, after the export was complete (the
    # recording server read its config.json): pause -> flush -> update -> continue.
    for srv in (router, worker):
        assert [u["weight_version"] for u in srv.updates] == ["1", "2"]
        assert [Path(u["model_path"]).name for u in srv.updates] == ["v1", "v2"]
        assert all(u["config"]["torch_dtype"] == "bfloat16" for u in srv.updates)
        assert all("model.safetensors" in u["files"] for u in srv.updates)
        admin = [p for p in srv.paths() if p != "/generate"]
        cycle = ["/pause_generation", "/flush_cache", "/update_weights_from_disk",
                 "/continue_generation"]  # fmt: skip
        assert admin == cycle * 2
    # Only the router samples (the worker's URL is for updates only): the version probes after
    # each update on both, then process 0's generate (one request per task) and 2 scores.
    assert worker.paths().count("/generate") == 2
    assert router.paths().count("/generate") == 2 + 3 + 2 + 1  # + the refused request

    # The same random samples on both processes: sampled once, broadcast.
    assert p0["generations"] == p1["generations"]
    gens = p0["generations"]
    assert [len(g) for g in gens] == [2, 2, 2] and all(len(s[0]) == 3 for g in gens for s in g)
    assert all(s[3] == 2 for g in gens for s in g)  # served by version 2
    seeds = [s[2] for g in gens for s in g]
    assert None not in seeds and len(set(seeds)) == 6  # per-sample seeds, sent by process 0
    assert p0["scores"] == p1["scores"] == [[-1.0, -1.5], [-0.5]]
    assert p0["failure"].startswith("SGLangRequestError") and "answered 400" in p0["failure"]
    assert p1["failure"].startswith("RuntimeError: process 0's rollout engine failed: SGLang")
    assert "answered 400" in p1["failure"]
    # data=2 over two hosts: each data row is one host's devices (FSDP's gathers stay inside).
    assert procs[0]["data_rows"] == procs[1]["data_rows"] == [[0, 0], [1, 1]]
    # One export per version (written once, the last two kept), in bf16, equal to the model.
    assert p0["exports"] == p1["exports"] == ["v1", "v2"]  # no init: the servers run

    if real is None:
        _assert_bf16_exports_equal_the_model(tmp_path, "weights")
        return
    # The real server: both versions served in turn, the samples the same on both processes.
    r0, r1 = (p["real"] for p in procs)
    assert r0["versions"] == r1["versions"] == [1, 2]
    assert (r0["inner"], r1["inner"]) == ("SGLangEngine", "NoneType")
    assert r0["generations"] == r1["generations"]
    gens = [s for g in r0["generations"] for s in g]
    assert len(gens) == 6 and all(s[3] == 2 for s in gens)  # the server reports version 2
    assert all(len(s[0]) == len(s[1]) >= 1 and all(lp <= 0 for lp in s[1]) for s in gens)
    assert r0["scores"] == r1["scores"] and [len(s) for s in r0["scores"]] == [2, 1]
    assert all(lp <= 0 for s in r0["scores"] for lp in s)
    assert r0["exports"] == r1["exports"] == ["v1", "v2"]
    assert r0["failure"] is None
    _assert_bf16_exports_equal_the_model(tmp_path, "weights", "weights_real")
    # Restored: the shared server serves its own checkpoint under the engine's version.
    out = engine.generate([GenerationRequest((5, 6, 7), "back")], SamplingParams(4))
    assert out[0][0].weight_version == engine.weight_version


@pytest.mark.sglang
@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc (Linux)")
def test_idle_server_does_not_spin_a_core(sglang_server):
    """With `--sleep-on-idle` (our default) an idle scheduler blocks on its sockets: measured on
    this tiny server, the whole process group used ~1 % of a core idle, against ~100 % (one core,
    the scheduler's busy loop) without the flag. The bound is far from both, and CPU time (not
    wall time) is what is measured, so machine load does not move it."""
    assert "--sleep-on-idle" in sglang_server.command(1)
    assert sglang_server.alive()
    pgid = sglang_server.pid  # the server is its own process group (SGLangServer.start)
    # Up to three 2-second windows (CPU time counts in 10 ms ticks: 0.5 % of a window): a server
    # still finishing earlier work (a restart by an earlier test) settles within one; a spinning
    # scheduler never goes under the bound.
    used = []
    for _ in range(3):
        cpu0, t0 = _group_cpu_seconds(pgid), time.monotonic()
        time.sleep(2.0)
        used.append((_group_cpu_seconds(pgid) - cpu0) / (time.monotonic() - t0))
        if used[-1] < 0.25:
            break
    assert min(used) < 0.25, f"the idle server used {[f'{u:.0%}' for u in used]} of a core"


@pytest.mark.sglang
def test_standin_kernel_in_use_and_no_missing_op_called(sglang_server):
    log = Path(sglang_server.log_path).read_text(errors="replace")
    assert "[sgl_kernel stand-in] in use" in log
    assert "MISSING OP called" not in log


@pytest.mark.sglang
def test_the_cpu_recipe_forks_the_servers_children(sglang_server):
    """The recipe's sitecustomize turns SGLang's forced `spawn` into `fork` (the children inherit
    the imports instead of repeating them): the log says so, and no process of the server's group
    is one of spawn's (its `-c "from multiprocessing..."` helpers)."""
    log = Path(sglang_server.log_path).read_text(errors="replace")
    assert "[sglang_cpu sitecustomize] start method fork instead of spawn" in log
    cmdlines = []
    for proc, _ in _group_processes(sglang_server.pid):
        try:
            cmdlines.append((proc / "cmdline").read_bytes().replace(b"\0", b" "))
        except OSError:  # the process ended meanwhile
            continue
    assert any(b"sglang.launch_server" in c for c in cmdlines), cmdlines
    assert sum(c.startswith(b"sglang::") for c in cmdlines) >= 2, cmdlines  # scheduler, detokenizer
    assert not any(b"multiprocessing" in c for c in cmdlines), cmdlines
