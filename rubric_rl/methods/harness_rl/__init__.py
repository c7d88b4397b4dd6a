"""HarnessRL (seed 001): a training-time harness over task sampling, rollout guidance and rubric
criteria, with a memory, an attributor, a proposer and a just-in-time critic.

Modules: ``controller`` (the step's sampler: draws, guidance, observe → attribute → propose →
measure → apply), ``builder`` (``config.harness`` → the controller), ``rubric_ops`` (operations
and Λ rescaling), ``interfaces`` (sampling levels with u = 1/(N p), the guidance cap),
``attributor``, ``proposer``, ``critic`` (acceptance rules), ``cold_start`` (levels and bands),
``evidence`` (what the memory supplies per task), ``state`` (per-task state and records),
``style`` (how a domain writes guidance), ``evorubric`` (the EvoRubric-style rubric rule of the
``evorubric`` baseline and the c_t ← EvoRubric switching arm; SEC, the p_t ← SEC arm's bandit, is
``rubric_rl.methods.harness_rl.sec``). The memory is ``rubric_rl.memory``. The attributor and
proposer are programmatic (rule-judged domains) or, with ``harness.evolver="llm"``, asked of a
model through the ``LLMClient`` (``llm_evolver``).
"""

from __future__ import annotations

from typing import Any

from rubric_rl.envs.base import DomainContract
from rubric_rl.methods.method import Method, register_method


def harness_controllers(config: Any, domain: DomainContract) -> list[Any]:
    """The harness controller (the step's sampler); with ``harness.rollout_rule="ruscarl"`` (the
    g_t <- RuscaRL switching arm) RuscaRL's scaffold after it."""
    from rubric_rl.methods.harness_rl.builder import make_harness_controller
    from rubric_rl.methods.harness_rl.ruscarl import ruscarl_controllers

    harness = make_harness_controller(config, domain)
    if harness.config.rollout_rule == "ruscarl":
        scaffold = ruscarl_controllers(config, domain)
        if not scaffold:
            raise ValueError("harness.rollout_rule='ruscarl' needs a config.ruscarl section")
        return [harness, *scaffold]
    return [harness]


def validate_harness(config: Any) -> None:
    """``config.harness`` builds a ``HarnessConfig``, whose checks name the field."""
    from rubric_rl.methods.harness_rl.builder import harness_config

    harness_config(config)


METHOD = register_method(Method("harness_rl", harness_controllers, validate=validate_harness))

__all__ = ["METHOD", "harness_controllers", "validate_harness"]
