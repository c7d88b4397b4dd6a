"""The SGLang rollout backend (the GPU path, tested for real on CPU): one import point.

- `sglang_server`: `SGLangServer` / `SGLangServerConfig` — launch, health-wait, stop, restart a
  server process from its own venv (third_party/sglang_cpu/install.sh on CPU).
- `sglang_client`: `SGLangEngine` — the `RolloutEngine` over SGLang's native `/generate` API.
- `weight_sync`: `WeightSync` — versioned safetensors exports + `/update_weights_from_disk`.
- `placement`: the server's GPUs, command line and environment from `config.rollout.sglang`,
  and the trainer's share of the GPUs.
- `multihost`: `BroadcastEngine` — several processes: process 0 samples, all see its results.
"""

from rubric_rl.rollout.sglang_client import (
    RetryPolicy,
    SGLangEngine,
    SGLangProtocolError,
    SGLangRequestError,
)
from rubric_rl.rollout.sglang_server import (
    SGLangServer,
    SGLangServerConfig,
    SGLangServerError,
    default_server_python,
)
from rubric_rl.rollout.weight_sync import WeightSync, WeightSyncError

__all__ = [
    "RetryPolicy",
    "SGLangEngine",
    "SGLangProtocolError",
    "SGLangRequestError",
    "SGLangServer",
    "SGLangServerConfig",
    "SGLangServerError",
    "WeightSync",
    "WeightSyncError",
    "default_server_python",
]
