"""A checkpoint's policy loaded into a built ``Trainer`` for analyses of a run's checkpoints
(``rised_transfer``) and notebooks."""

from __future__ import annotations

from typing import Any

from rubric_rl.checkpoint import RunCheckpointer


def load_policy(trainer: Any, step: int, checkpoint_dir: str | None = None) -> None:
    """``trainer`` trains and serves the policy of checkpoint ``step`` from now on: its own
    run's (``<workdir>/checkpoints``) or another run's (``checkpoint_dir``, a run's
    ``checkpoints`` directory of the same model and optimiser). The train state (parameters,
    optimiser) and ``trainer.step`` are restored and the engine serves the parameters; the
    controllers' state and the RNG are not (that is ``run(resume=True)``)."""
    if checkpoint_dir is None:
        trainer.state, _ = trainer.ckpt.restore(trainer.state, int(step))
    else:
        other = RunCheckpointer(checkpoint_dir, keep=None, async_save=False)
        try:
            trainer.state, _ = other.restore(trainer.state, int(step))
        finally:
            other.close()
    trainer.step = int(step)
    trainer.weights.sync(trainer.state, trainer.step)
