"""HarnessRL (seed 001): a training-time harness over task sampling, rollout guidance and rubric
criteria, with a memory, an attributor, a proposer and a just-in-time critic.

Landed so far (issue 16): the rubric interface's operations and Λ rescaling (``rubric_ops``),
the sampling and guidance interfaces (``interfaces``), the programmatic attributor
(``attributor``), the critic's acceptance rules (``critic``) and the cold start's estimators
(``cold_start``); the memory is ``rubric_rl.memory``. The controller that runs them in the step
and ``configs/harness_rl.py`` are not written yet.
"""
