"""Recording what a ``Trainer``'s jitted train step receives, for tests of the batch it builds."""


def record_train_batches(trainer) -> list:
    """Wraps ``trainer.train_step`` so that every ``TrainBatch`` it is called with is appended to
    the returned list (the π_old forward ``compute_logps`` is the real one, unwrapped)."""
    seen: list = []
    real = trainer.train_step

    def spy(state, batch, ref_params=None):
        seen.append(batch)
        return real(state, batch, ref_params)

    spy.compute_logps = real.compute_logps
    trainer.train_step = spy
    return seen
