"""Entry point: ``python -m rubric_rl.launch --config=configs/grpo.py[:variant,...]``.

    --config=configs/grpo.py:smoke --config.train.steps=10   # variants + locked overrides
    --workdir=runs/my-run                        # default runs/<config>-<variant>-<UTC time>
    --resume                                     # continue the workdir's latest intact step
    --resume --allow_config_change=optim.lr      # ... with these config keys changed
    --resume --rebuild_controller_files          # ... although controller files are missing

The run holds an exclusive lock on its workdir (``rubric_rl.runs.run_dir``): a second launch into it
fails at once. The resolved config is written to ``<workdir>/config.json`` only once the workdir
is known to be this run's (secrets are never in a config: only the names of the environment
variables that hold them); a resumed run's changes are listed in ``config_changes.jsonl``. On
several hosts (an explicit JAX_COORDINATOR_ADDRESS, or SLURM with several tasks),
``jax.distributed.initialize()`` runs before any device is touched. Compiled programs are kept
in jax's persistent compilation cache (``compilation_cache_dir``), so a resumed or repeated run
skips the step's compiles.
"""

from __future__ import annotations

import os
import sys

from absl import app, flags, logging
from ml_collections import config_flags

from rubric_rl.util.logs import quiet_library_info, set_library_info  # noqa: F401 (re-exported)
from rubric_rl.util.tcmalloc import find_tcmalloc, preload_env

# configs/ lives at the repository root, next to the package: the --config file (not this module)
# imports configs.common, so the root must be importable when launched from elsewhere.
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "Config file, with variants: configs/grpo.py:smoke,model=5m", lock_config=True
)
_WORKDIR = flags.DEFINE_string(
    "workdir", None, "Run directory (default runs/<config>-<variant>-<UTC time>)."
)
_RESUME = flags.DEFINE_bool("resume", False, "Continue from the workdir's latest checkpoint.")
_REBUILD = flags.DEFINE_bool(
    "rebuild_controller_files",
    False,
    "With --resume: continue although the controllers' files (a memory, an event log) do not "
    "match the checkpoint's manifest (each difference is warned); without it such a resume is "
    "refused, naming them.",
)
_ALLOW_CHANGE = flags.DEFINE_list(
    "allow_config_change",
    [],
    "With --resume: config keys that may differ from the run's record (dotted, comma-separated; "
    "a section, e.g. optim, allows each of its keys).",
)


def maybe_initialize_distributed(local_device_ids: list[int] | None = None) -> bool:
    """``jax.distributed.initialize()`` when a multi-host launcher set its variables (explicit
    coordinator: ``JAX_COORDINATOR_ADDRESS`` + ``JAX_NUM_PROCESSES`` + ``JAX_PROCESS_ID``, or SLURM
    with several tasks); a single host does nothing. ``local_device_ids``: the GPUs jax may use
    in this process (``rollout.placement.local_device_ids``; None = jax's default), set before
    any device is touched, on one host too."""
    multi = bool(os.environ.get("JAX_COORDINATOR_ADDRESS")) or (
        int(os.environ.get("SLURM_NTASKS", "1")) > 1
    )
    if local_device_ids is not None and not multi:
        import jax

        jax.config.update("jax_cuda_visible_devices", ",".join(map(str, local_device_ids)))
    if multi:
        import jax

        # jax reads only the coordinator address from the environment; with an explicit
        # coordinator the process count and index must be passed too (SLURM is auto-detected).
        kwargs: dict = {}
        if local_device_ids is not None:
            kwargs["local_device_ids"] = list(local_device_ids)
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


def compilation_cache_dir(environ: dict[str, str]) -> str | None:
    """Where the launch keeps jax's persistent compilation cache: None when
    ``JAX_COMPILATION_CACHE_DIR`` is set (jax reads it itself) or ``RUBRIC_RL_JAX_CACHE=off``;
    else ``RUBRIC_RL_JAX_CACHE``, or ``$XDG_CACHE_HOME/rubric_rl/jax`` (``~/.cache`` when
    unset). One directory for every run of this user: a train step compiles once per shape
    (the prompt x completion buckets: minutes each at 4B and above), not once per launch."""
    if environ.get("JAX_COMPILATION_CACHE_DIR"):
        return None
    chosen = environ.get("RUBRIC_RL_JAX_CACHE", "")
    if chosen == "off":
        return None
    if chosen:
        return chosen
    base = environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "rubric_rl", "jax")


def tcmalloc_reexec(
    argv: list[str], environ: dict[str, str], find=find_tcmalloc
) -> tuple[list[str], dict[str, str]] | None:
    """(argv, env) to re-execute this entry point with tcmalloc preloaded
    (``rubric_rl.util.tcmalloc``: when ``find`` finds it, not yet preloaded, and
    ``RUBRIC_RL_TCMALLOC`` is not "0"), or None."""
    env = preload_env(environ, find)
    return None if env is None else ([sys.executable, "-m", "rubric_rl.launch", *argv[1:]], env)


_HELP = {"--help", "-help", "-?", "--helpshort", "-helpshort", "--helpfull", "-helpfull"}


def _innermost_message(e: BaseException) -> str:
    # ml_collections wraps a KeyError in an AttributeError; str() of either is a repr with the
    # message's newlines escaped.
    while e.args and isinstance(e.args[0], BaseException):
        e = e.args[0]
    return e.args[0] if e.args and isinstance(e.args[0], str) else str(e)


def override_error(e: BaseException, argv: list[str]) -> str | None:
    """The text of a failed ``--config.<key>`` override, naming the flag, with real newlines;
    None when no override names the missing key (the error is not an override's)."""
    msg = _innermost_message(e)
    key = msg.splitlines()[0].strip("'\"") if msg else ""
    names = [a.split("=", 1)[0] for a in argv[1:] if a.startswith("--config.")]
    named = [n for n in names if key and key in n.split(".")]
    return f"{named[0]}: no such config key {msg}" if named else None


def parse_flags(argv: list[str]) -> list[str]:
    """absl's flag parsing, except that a help request exits 0 (absl exits 1) and a mistyped
    ``--config.<key>`` override is one message naming the flag, not a traceback."""
    try:
        return app.parse_flags_with_usage(argv)
    except SystemExit as e:
        if e.code == 1 and _HELP.intersection(argv[1:]):
            raise SystemExit(0) from None
        raise
    except (AttributeError, KeyError) as e:
        if (msg := override_error(e, argv)) is None:
            raise
        sys.stderr.write(f"FATAL Flags parsing error: {msg}\n")
        sys.stderr.write("Pass --helpshort or --helpfull to see help on flags.\n")
        raise SystemExit(1) from None


def claim_workdir(config) -> str:
    """The run's workdir, locked and with its config record (``run_dir.claim``); exits with the
    reason when the launch is refused."""
    from rubric_rl.runs import run_dir

    if _ALLOW_CHANGE.value and not _RESUME.value:
        sys.exit("rubric_rl.launch: --allow_config_change applies only with --resume")
    if _REBUILD.value and not _RESUME.value:
        sys.exit("rubric_rl.launch: --rebuild_controller_files applies only with --resume")
    import jax

    if not _WORKDIR.value and jax.process_count() > 1:
        sys.exit("rubric_rl.launch: --workdir is required on several hosts (each names its own)")
    try:
        workdir = _WORKDIR.value or run_dir.default_workdir(flags.FLAGS["config"].config_filename)
        if jax.process_index() == 0:  # one copy of the run directory's files (multi-host)
            changes = run_dir.claim(
                workdir, config, resume=_RESUME.value, allow_changes=_ALLOW_CHANGE.value
            )
            for key, (old, new) in changes.items():
                logging.warning("config %s changed on resume: %r -> %r", key, old, new)
    except run_dir.RunDirError as e:
        sys.exit(f"rubric_rl.launch: {e}")
    return workdir


def main(argv):
    del argv
    config = _CONFIG.value
    if config is None:
        raise app.UsageError("--config is required, e.g. --config=configs/grpo.py")
    # orbax / optax INFO lines dropped unless config.logging.library_info (rubric_rl/util/logs.py).
    set_library_info(bool(config.logging.library_info))
    from rubric_rl.rollout.placement import local_device_ids

    try:  # the trainer's GPUs (the rest are the SGLang server's), before jax sees any device
        devices = local_device_ids(config, dict(os.environ))
    except ValueError as e:
        sys.exit(f"rubric_rl.launch: config.{e}")
    maybe_initialize_distributed(devices)
    import jax

    cache = compilation_cache_dir(dict(os.environ))
    if cache:
        jax.config.update("jax_compilation_cache_dir", cache)

    from rubric_rl.config.config_validation import validate_config

    validate_config(config, num_devices=jax.device_count())
    workdir = claim_workdir(config)
    logging.info("workdir %s", os.path.abspath(workdir))
    from rubric_rl.checkpoint import CheckpointSaveError, NoIntactCheckpointError
    from rubric_rl.runs.run_dir import unlock
    from rubric_rl.runs.run_files import ControllerFilesError
    from rubric_rl.trainer import Trainer

    try:
        trainer = Trainer(config, workdir)
        try:
            trainer.run(resume=_RESUME.value, rebuild_controller_files=_REBUILD.value)
        finally:
            trainer.close()
        if jax.process_index() == 0:  # the first and last evaluations, primary metrics first
            from rubric_rl.runs.run_summary import summarize_run

            print(summarize_run(workdir), flush=True)
    except NoIntactCheckpointError as e:  # the message names each step's file and cause
        sys.exit(f"rubric_rl.launch: --resume: {e}")
    except (ControllerFilesError, CheckpointSaveError) as e:  # names the cause and what to do
        sys.exit(f"rubric_rl.launch: {e}")
    finally:
        unlock(workdir)  # exit releases it too, a kill included


if __name__ == "__main__":
    _reexec = tcmalloc_reexec(sys.argv, dict(os.environ))
    if _reexec is not None:  # execve keeps the pid: whoever signals this process still reaches it
        os.execve(sys.executable, *_reexec)
    app.run(main, flags_parser=parse_flags)
