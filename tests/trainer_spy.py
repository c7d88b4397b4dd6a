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


def serve_scripted(trainer, engine) -> None:
    """The trainer samples from ``engine`` (a ``rollout.scripted.ScriptedEngine``) instead of its
    model: no generation program is compiled; updates, evaluation, checkpoints and logs are the
    real ones (the engine is told each new weight version). The real engine is closed first, so
    a component still holding it fails loudly."""
    real = trainer.engine
    real.close()
    # The services' sampler is shared by every caller's view (controllers included); the weight
    # server tells the engine each new version.
    trainer.engine = trainer.services.sampler.engine = trainer.weights.engine = engine


def short_words(request, prompt_text: str, k: int) -> str:
    """``rollout.scripted.prompt_words`` cut to 3 words: with EOS within the smoke configs' 8 new
    tokens, as the model's own samples are, so a step's batch has the completion bucket the
    model's would (one train program compiled, not one per bucket)."""
    from rubric_rl.rollout.scripted import prompt_words

    return " ".join(prompt_words(request, prompt_text, k).split()[:3])


def one_device() -> list:
    """The first device only, for ``Trainer(..., devices=one_device())``: tests of the loop's
    Python that do not test sharding compile and run on one device instead of the suite's
    eight forced host devices (a third less time)."""
    import jax

    return jax.devices()[:1]
