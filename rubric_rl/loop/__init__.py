"""The training loop's parts (``rubric_rl/trainer.py`` is the loop): a step's pipeline run on the
engine, the engine's copy of the policy, Rollouts -> TrainBatch, the checkpointed run state,
step callbacks, non-finite updates, asynchronous rollouts, the step's metrics, evaluation, and a
checkpoint's policy loaded for analyses."""
