"""One process of tests/rollout/test_sglang.py's two-process test: jax.distributed over loopback
(2 processes x 2 CPU devices), the smoke config's model (in the test server's shape,
``sglang_env.smoke_config``) sharded over all 4 devices, then for each set of servers the
SGLang engine from the config: export -> update -> generate -> score; writes what this process
saw to ``<out>/p<index>.json`` (``{"recording": {...}, "real": {...}}``).

Usage: python multihost_sglang_worker.py COORDINATOR PROCESS_ID OUT_DIR ROUTER_URL UPDATE_URLS
[REAL_URL]. ROUTER_URL / UPDATE_URLS are the test's recording servers (which refuse prompt
(99,)); REAL_URL, when given, a real SGLang server (sampling and updated by the same URL, with
no refused prompt to try), served after the recording servers by the same processes and model.
"""

import json
import os
import sys

import jax

coordinator, pid, out, router, update_urls = sys.argv[1:6]
real_url = sys.argv[6] if len(sys.argv) > 6 else None
jax.distributed.initialize(coordinator, num_processes=2, process_id=int(pid))

from rubric_rl.config import builders  # noqa: E402
from rubric_rl.core.sharding import make_mesh  # noqa: E402
from rubric_rl.rollout.engine import GenerationRequest, SamplingParams  # noqa: E402
from rubric_rl.rollout.weight_sync import WeightSync  # noqa: E402
from tests.rollout.sglang_env import smoke_config  # noqa: E402

c = smoke_config()
c.mesh.update(data=1, fsdp=-1, tensor=1)
c.rollout.engine = "sglang"
workdir = os.path.join(out, f"work{pid}")
os.makedirs(workdir, exist_ok=True)
domain = builders.build_domain(c)
tokenizer = builders.build_tokenizer(c, domain, workdir)
mesh = builders.build_mesh(c)
model = builders.build_model(c, tokenizer, mesh)


def serve(name: str, url: str, urls: str, refused: bool) -> dict:
    """Versions 1 and 2 exported to ``<out>/<name>`` and served by `urls`, then 3 tasks x 2
    samples and 2 scores from `url` (and the refused prompt when `refused`)."""
    c.rollout.sglang.update(
        url=url,
        weight_update_urls=urls,
        export_dtype="bfloat16",
        weight_sync_dir=os.path.join(out, name),  # shared by both processes
    )
    engine = builders.build_engine(c, model, tokenizer, mesh, workdir)
    sync = WeightSync(builders.weight_sync_root(c, workdir), dtype="bfloat16")
    versions = []
    for version in (1, 2):
        sync.sync(engine, model, version)
        versions.append(engine.weight_version)
    requests = [GenerationRequest((5, 6, 7), f"task{i}", step=2, task_index=i) for i in range(3)]
    gens = engine.generate(requests, SamplingParams(max_new_tokens=3, n=2))
    scores = engine.score([((5, 6), (7, 8)), ((9,), (3,))])
    failure = None
    try:  # the recording servers refuse prompt (99,): process 0's error reaches every process
        if refused:
            engine.generate([GenerationRequest((99,), "refused")], SamplingParams(max_new_tokens=1))
    except Exception as exc:  # noqa: BLE001 - recorded for the test
        failure = f"{type(exc).__name__}: {exc}"
    result = {
        "engine": type(engine).__name__,
        "inner": type(getattr(engine, "inner", None)).__name__,
        "versions": versions,
        "generations": [
            [[g.token_ids, g.logprobs, g.seed, g.weight_version] for g in gs] for gs in gens
        ],
        "scores": scores,
        "failure": failure,
        "exports": sorted(os.listdir(sync.root)),
    }
    engine.close()
    return result


result = {"recording": serve("weights", router, update_urls, refused=True)}
if real_url is not None:
    result["real"] = serve("weights_real", real_url, real_url, refused=False)
two_nodes = make_mesh(data=2, fsdp=-1, tensor=1)  # docs/gpu.md: data across hosts
result.update(
    process=jax.process_index(),
    devices=jax.device_count(),
    data_rows=[[d.process_index for d in row.flat] for row in two_nodes.devices],
)
with open(os.path.join(out, f"p{pid}.json"), "w") as f:
    json.dump(result, f)
