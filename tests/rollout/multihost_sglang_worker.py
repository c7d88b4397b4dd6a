"""One process of tests/rollout/test_multihost_sglang.py: jax.distributed over loopback (2
processes x 2 CPU devices), the smoke config's model sharded over all 4 devices, the SGLang
engine from the config (pointed at the test's recording servers), then export -> update ->
generate -> score; writes what this process saw to ``<out>/p<index>.json``.

Usage: python multihost_sglang_worker.py COORDINATOR PROCESS_ID OUT_DIR ROUTER_URL UPDATE_URLS
[real]  ("real": a real SGLang server, which has no refused prompt to try)
"""

import json
import os
import sys

import jax

coordinator, pid, out, router, update_urls = sys.argv[1:6]
real_server = sys.argv[6:] == ["real"]
jax.distributed.initialize(coordinator, num_processes=2, process_id=int(pid))

from configs import grpo  # noqa: E402
from rubric_rl import builders  # noqa: E402
from rubric_rl.rollout.engine import GenerationRequest, SamplingParams  # noqa: E402
from rubric_rl.rollout.weight_sync import WeightSync  # noqa: E402

c = grpo.get_config("smoke")
c.mesh.update(data=1, fsdp=-1, tensor=1)
c.rollout.engine = "sglang"
c.rollout.sglang.update(
    url=router,
    weight_update_urls=update_urls,
    export_dtype="bfloat16",
    weight_sync_dir=os.path.join(out, "weights"),  # shared by both processes
)
workdir = os.path.join(out, f"work{pid}")
os.makedirs(workdir, exist_ok=True)
domain = builders.build_domain(c)
tokenizer = builders.build_tokenizer(c, domain, workdir)
mesh = builders.build_mesh(c)
model = builders.build_model(c, tokenizer, mesh)
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
    if not real_server:
        engine.generate([GenerationRequest((99,), "refused")], SamplingParams(max_new_tokens=1))
except Exception as exc:  # noqa: BLE001 - recorded for the test
    failure = f"{type(exc).__name__}: {exc}"
from rubric_rl.core.sharding import make_mesh  # noqa: E402

two_nodes = make_mesh(data=2, fsdp=-1, tensor=1)  # docs/gpu.md: data across hosts
result = {
    "process": jax.process_index(),
    "devices": jax.device_count(),
    "engine": type(engine).__name__,
    "inner": type(getattr(engine, "inner", None)).__name__,
    "versions": versions,
    "generations": [
        [[g.token_ids, g.logprobs, g.seed, g.weight_version] for g in gs] for gs in gens
    ],
    "scores": scores,
    "failure": failure,
    "data_rows": [[d.process_index for d in row.flat] for row in two_nodes.devices],
    "exports": sorted(os.listdir(sync.root)),
}
engine.close()
with open(os.path.join(out, f"p{pid}.json"), "w") as f:
    json.dump(result, f)
