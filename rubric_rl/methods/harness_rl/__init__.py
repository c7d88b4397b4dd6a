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
