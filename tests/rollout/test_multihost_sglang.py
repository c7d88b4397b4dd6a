"""Two processes (jax.distributed over loopback, 2 x 2 CPU devices) export the policy, update
the servers and generate through the SGLang engine built from the config.

The servers are recording HTTP endpoints of this test speaking SGLang's protocol (a real SGLang
server needs its own venv, third_party/sglang_cpu/install.sh, and minutes per start): they check
at each update that the checkpoint directory is complete, and answer /generate with random
tokens, so a process that sampled for itself would see other tokens than its peer.
"""

import json
import os
import random
import socket
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest

from rubric_rl.models.hf_io import SafetensorsFile
from rubric_rl.rollout.sglang_server import SGLangServer, SGLangServerConfig
from tests.launch_env import launch_env
from tests.rollout.sglang_env import require_sglang_venv

REPO = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).with_name("multihost_sglang_worker.py")


class RecordingServer:
    """SGLang's /generate (random tokens, log-probs, the served weight version) and the weight
    update endpoints; every request is recorded as (path, body)."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, dict]] = []
        self.updates: list[dict] = []  # /update_weights_from_disk: body + what the path held
        self.version = "0"
        self.rng = random.Random()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _reply(self, obj, status=200):
                data = json.dumps(obj).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.requests.append((self.path, body))
                if self.path == "/update_weights_from_disk":
                    path = Path(body["model_path"])
                    cfg = json.loads((path / "config.json").read_text())
                    outer.updates.append(dict(body, files=sorted(os.listdir(path)), config=cfg))
                    outer.version = body["weight_version"]
                if self.path != "/generate":
                    return self._reply({"success": True})
                if body["input_ids"] in ([99], [[99]]):
                    return self._reply({"error": "refused"}, status=400)
                if "logprob_start_len" in body:  # scoring: the prompt's and completion's
                    ids = body["input_ids"]
                    lps = [[None, ids[0], None]] + [[-0.5 * (i + 1), t, None] for i, t in
                                                    enumerate(ids[1:])]  # fmt: skip
                    return self._reply({"meta_info": {"input_token_logprobs": lps}})
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
                self._reply(items if many else items[0])

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def paths(self) -> list[str]:
        return [p for p, _ in self.requests]

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _reference_export(tmp_path) -> Path:
    """The same model built in this process (8 CPU devices) and exported in bf16 to
    ``<tmp_path>/ref``."""
    from configs import grpo
    from rubric_rl import builders
    from rubric_rl.models import save_pretrained

    c = grpo.get_config("smoke")
    tokenizer = builders.build_tokenizer(c, builders.build_domain(c), str(tmp_path / "ref_work"))
    model = builders.build_model(c, tokenizer, builders.build_mesh(c))
    save_pretrained(model, str(tmp_path / "ref"), dtype="bfloat16")
    return tmp_path / "ref"


def _run_two_processes(tmp_path, router: str, update_urls: str, *extra: str):
    """The worker on 2 processes x 2 CPU devices; returns what each process saw."""
    env = dict(launch_env(tmp_path / "jax_cache"),
               XLA_FLAGS="--xla_force_host_platform_device_count=2",
               PYTHONPATH=str(REPO))  # fmt: skip
    coordinator = f"127.0.0.1:{_free_port()}"
    procs = []
    for i in range(2):
        log = open(tmp_path / f"p{i}.log", "w")
        cmd = [sys.executable, str(WORKER), coordinator, str(i), str(tmp_path), router,
               update_urls, *extra]  # fmt: skip
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


def _assert_bf16_export_equals_the_model(tmp_path) -> None:
    got = SafetensorsFile(str(tmp_path / "weights" / "v2" / "model.safetensors"))
    ref = SafetensorsFile(str(_reference_export(tmp_path) / "model.safetensors"))
    assert got.names() == ref.names() and len(got.names()) > 5
    for name in ref.names():
        a, b = got.array(name), ref.array(name)
        assert a.dtype == b.dtype and str(a.dtype) == "bfloat16", name
        np.testing.assert_array_equal(a.view(np.uint16), b.view(np.uint16), err_msg=name)
    assert not list((tmp_path / "weights").glob("*.tmp"))


def test_two_processes_export_once_update_every_server_and_sample_once(tmp_path):
    router, worker = RecordingServer(), RecordingServer()
    try:
        p0, p1 = _run_two_processes(tmp_path, router.url, f"{router.url},{worker.url}")
    finally:
        router.close()
        worker.close()
    assert p0["devices"] == p1["devices"] == 4
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
    assert p0["data_rows"] == p1["data_rows"] == [[0, 0], [1, 1]]

    # One export per version (written once, the last two kept), in bf16, equal to the model.
    assert p0["exports"] == p1["exports"] == ["v1", "v2"]  # no init: the servers run
    _assert_bf16_export_equals_the_model(tmp_path)


@pytest.mark.sglang
@pytest.mark.slow
def test_two_processes_with_a_real_sglang_server(tmp_path):
    """The same two processes against a real (CPU) SGLang server started from the model's bf16
    export: both versions served in turn, the samples the same on both processes."""
    require_sglang_venv()
    start = _reference_export(tmp_path / "start")
    cfg = SGLangServerConfig(model_path=str(start), device="cpu", dtype="float32",
                             log_path=str(tmp_path / "server.log"))  # fmt: skip
    with SGLangServer(cfg) as server:
        p0, p1 = _run_two_processes(tmp_path, server.url, server.url, "real")
    assert p0["versions"] == p1["versions"] == [1, 2]
    assert (p0["inner"], p1["inner"]) == ("SGLangEngine", "NoneType")
    assert p0["generations"] == p1["generations"]
    gens = [s for g in p0["generations"] for s in g]
    assert len(gens) == 6 and all(s[3] == 2 for s in gens)  # the server reports version 2
    assert all(len(s[0]) == len(s[1]) >= 1 and all(lp <= 0 for lp in s[1]) for s in gens)
    assert p0["scores"] == p1["scores"] and [len(s) for s in p0["scores"]] == [2, 1]
    assert all(lp <= 0 for s in p0["scores"] for lp in s)
    _assert_bf16_export_equals_the_model(tmp_path)
