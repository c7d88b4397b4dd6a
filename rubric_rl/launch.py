"""Entry point: ``python -m rubric_rl.launch --config=configs/grpo.py[:variant,...]``.

    --config=configs/grpo.py:smoke --config.train.steps=10   # variants + locked overrides
    --workdir=runs/my-run                                     # default runs/<config>-<timestamp>
    --resume                                                  # continue the workdir's latest step

Writes the resolved config to ``<workdir>/config.json`` (secrets are never in a config: only the
names of the environment variables that hold them). On several hosts (JAX_COORDINATOR_ADDRESS /
SLURM / TPU environment), ``jax.distributed.initialize()`` runs before any device is touched.
"""

from __future__ import annotations

import datetime
import json
import os
import sys

from absl import app, flags, logging
from ml_collections import config_flags

from rubric_rl.tcmalloc import preload_env

# configs/ lives at the repository root, next to the package: the --config file (not this module)
# imports configs.common, so the root must be importable when launched from elsewhere.
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "Config file, with variants: configs/grpo.py:smoke,model=5m", lock_config=True
)
_WORKDIR = flags.DEFINE_string("workdir", None, "Run directory (default runs/<config>-<time>).")
_RESUME = flags.DEFINE_bool("resume", False, "Continue from the workdir's latest checkpoint.")


def maybe_initialize_distributed() -> bool:
    """``jax.distributed.initialize()`` when a multi-host launcher set its variables (explicit
    coordinator: ``JAX_COORDINATOR_ADDRESS`` + ``JAX_NUM_PROCESSES`` + ``JAX_PROCESS_ID``, or SLURM
    with several tasks); a single host does nothing."""
    multi = bool(os.environ.get("JAX_COORDINATOR_ADDRESS")) or (
        int(os.environ.get("SLURM_NTASKS", "1")) > 1
    )
    if multi:
        import jax

        # jax reads only the coordinator address from the environment; with an explicit
        # coordinator the process count and index must be passed too (SLURM is auto-detected).
        kwargs = {}
        if os.environ.get("JAX_COORDINATOR_ADDRESS"):
            for env, key in (
                ("JAX_NUM_PROCESSES", "num_processes"),
                ("JAX_PROCESS_ID", "process_id"),
            ):
                if env not in os.environ:
                    raise ValueError(f"JAX_COORDINATOR_ADDRESS is set but {env} is not")
                kwargs[key] = int(os.environ[env])
            kwargs["coordinator_address"] = os.environ["JAX_COORDINATOR_ADDRESS"]
        jax.distributed.initialize(**kwargs)
    return multi


def tcmalloc_reexec(
    argv: list[str], environ: dict[str, str], exists=os.path.exists
) -> tuple[list[str], dict[str, str]] | None:
    """(argv, env) to re-execute this entry point with tcmalloc preloaded (``rubric_rl.tcmalloc``:
    when installed, not yet preloaded, and ``RUBRIC_RL_TCMALLOC`` is not "0"), or None."""
    env = preload_env(environ, exists)
    return None if env is None else ([sys.executable, "-m", "rubric_rl.launch", *argv[1:]], env)


def default_workdir(config_path: str) -> str:
    name = os.path.splitext(os.path.basename(config_path.split(":")[0]))[0]
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%d-%H%M%S")
    return os.path.join("runs", f"{name}-{stamp}")


def write_config(config, workdir: str) -> str:
    from rubric_rl.metrics import scrub

    os.makedirs(workdir, exist_ok=True)
    path = os.path.join(workdir, "config.json")
    with open(path + ".tmp", "w") as f:
        json.dump(scrub(config.to_dict()), f, indent=2, sort_keys=True, default=list)
    os.replace(path + ".tmp", path)
    return path


def _quiet_orbax(record) -> bool:
    # orbax logs every save step at INFO through absl; keep the run's own log readable.
    return "orbax" not in record.pathname or record.levelno >= 30


def main(argv):
    del argv
    logging.get_absl_handler().addFilter(_quiet_orbax)
    maybe_initialize_distributed()
    config = _CONFIG.value
    if config is None:
        raise app.UsageError("--config is required, e.g. --config=configs/grpo.py")
    workdir = _WORKDIR.value or default_workdir(flags.FLAGS["config"].config_filename)
    import jax

    from rubric_rl.config_validation import validate_config

    validate_config(config, num_devices=jax.device_count())
    if jax.process_index() == 0:  # one copy of the run directory's files (multi-host)
        write_config(config, workdir)
    logging.info("workdir %s", os.path.abspath(workdir))
    from rubric_rl.trainer import Trainer

    trainer = Trainer(config, workdir)
    try:
        trainer.run(resume=_RESUME.value)
    finally:
        trainer.close()


if __name__ == "__main__":
    _reexec = tcmalloc_reexec(sys.argv, dict(os.environ))
    if _reexec is not None:  # execve keeps the pid: whoever signals this process still reaches it
        os.execve(sys.executable, *_reexec)
    app.run(main)
