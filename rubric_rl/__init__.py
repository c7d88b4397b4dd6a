"""rubric_rl: reinforcement learning of LLM policies with rubric rewards, in JAX."""
