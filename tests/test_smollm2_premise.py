"""benchmarks/smollm2_premise.py: the premise tally on scripted answers (exact figures), guidance
placement, the probe set, and the transformers backend on a tiny random Llama (batched greedy
answers equal one-at-a-time ones)."""

from __future__ import annotations

import importlib.util
import os
import sys

import pytest

from rubric_rl.envs.instruct_domain import make_task

SCRIPT = os.path.join(os.path.dirname(__file__), "..", "benchmarks", "smollm2_premise.py")
spec = importlib.util.spec_from_file_location("smollm2_premise_under_test", SCRIPT)
premise = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = premise  # dataclasses look their module up there
spec.loader.exec_module(premise)


def _task(k: int, insts, topic: int = 0):
    params = {"topic": topic, "request": 0, "instructions": [list(x) for x in insts]}
    return make_task("train", params, f"{k:040x}")


TASKS = [
    _task(1, [("bullets", {"n": 3}), ("no_commas", {})]),
    _task(2, [("lowercase", {})], topic=5),
    _task(3, [("json", {})], topic=8),
]
BAD = "Great question, Sure."  # misses every instruction above


class Scripted:
    """The reference answer when the last user message carries ``marker``, else ``BAD``; task 2
    answered right unguided when ``good_unguided``. Records every prompt it is given."""

    def __init__(self, marker: str, good_unguided: bool = False):
        self.marker, self.good_unguided, self.calls = marker, good_unguided, []
        self.by_question = {t.question: t for t in TASKS}

    def __call__(self, prompts):
        self.calls.append(prompts)
        out = []
        for p in prompts:
            text = "\n".join(m["content"] for m in p)
            task = next(t for q, t in self.by_question.items() if q in text)
            good = self.marker in text or (self.good_unguided and task is TASKS[1])
            out.append(task.reference_answer if good else BAD)
        return out


def test_tally_on_scripted_answers():
    gen = Scripted("Tips:")
    answers = premise.measure(TASKS, gen, arms=("unguided", "skills"))
    s = premise.summarise(TASKS, answers)
    assert s["instructions"] == 4
    assert s["arms"]["unguided"]["instruction_pass_rate"] == 0.0
    assert s["arms"]["unguided"]["task_pass_rate"] == 0.0
    assert s["arms"]["skills"]["instruction_pass_rate"] == 1.0
    assert s["arms"]["skills"]["task_pass_rate"] == 1.0
    assert s["arms"]["skills"]["per_type"]["bullets"] == {"pass_rate": 1.0, "n": 1}
    assert s["gains"]["skills"]["points"] == pytest.approx(100.0)
    assert s["gains"]["skills"]["ci95"] == pytest.approx((100.0, 100.0))
    # Unguided task pass 0 % is outside 10-60 %: the premise is not accepted despite the gain.
    assert s["acceptance"] == {
        "unguided_task_pass_in_range": False,
        "guided_gain_at_least_10_points": True,
        "accepted": False,
    }
    assert "| bullets | 1 | 0.00 | 1.00 |" in premise.table(s)


def test_missed_arm_shows_only_missed_texts_and_reuses_clean_answers():
    gen = Scripted("Make sure that:", good_unguided=True)
    answers = premise.measure(TASKS, gen, arms=("unguided", "missed"))
    assert len(gen.calls) == 2 and len(gen.calls[1]) == 2  # task 2 met everything unguided
    shown = gen.calls[1][0][-1]["content"]
    assert shown.endswith(
        'Make sure that:\n- The answer has exactly 3 bullet points starting with "* ".\n'
        "- The answer contains no commas."
    )
    missed = answers["missed"]
    assert [a.reused for a in missed] == [False, True, False]
    assert missed[1].response == answers["unguided"][1].response
    s = premise.summarise(TASKS, answers)
    # unguided: 1 of 4 instructions (task 2's), 1 of 3 tasks; missed arm: all.
    assert s["arms"]["unguided"]["instruction_pass_rate"] == pytest.approx(0.25)
    assert s["arms"]["unguided"]["task_pass_rate"] == pytest.approx(1 / 3)
    assert s["gains"]["missed"]["points"] == pytest.approx(75.0)
    assert s["acceptance"]["accepted"] is True
    lo, hi = s["gains"]["missed"]["ci95"]
    assert 0.0 <= lo <= 75.0 <= hi <= 100.0


def test_placements():
    t = TASKS[1]
    fields = {"skills": ["Tip A."]}
    user = premise.guided(t, fields, "user")
    assert user == [{"role": "user", "content": t.question + "\n\nTips:\n- Tip A."}]
    assert premise.guided(t, fields, "before") == [
        {"role": "user", "content": "Tips:\n- Tip A.\n\n" + t.question}
    ]
    assert premise.guided(t, fields, "system") == [
        {"role": "system", "content": "Tips:\n- Tip A."},
        {"role": "user", "content": t.question},
    ]
    assert premise.guided(t, {"skills": []}, "system") == t.messages
    with pytest.raises(ValueError, match="placement"):
        premise.guided(t, fields, "sideways")


def test_probe_tasks_are_training_tasks_only():
    a = premise.probe_tasks(12, seed=0, pool=60)
    assert a == premise.probe_tasks(12, seed=0, pool=60)
    assert [t.id for t in a] != [t.id for t in premise.probe_tasks(12, seed=1, pool=60)]
    assert len({t.id for t in a}) == 12
    assert all(t.raw["split"] == "train" and t.id.startswith("if-train-") for t in a)
    with pytest.raises(ValueError, match="more than"):
        premise.probe_tasks(70, pool=60)


def test_transformers_backend_batched_equals_single(tmp_path):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from rubric_rl.config.builders import build_spaced_tokenizer
    from rubric_rl.envs import instruct

    build_spaced_tokenizer(instruct.vocabulary(), str(tmp_path / "tok"))
    tok = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "tok"))
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(
        vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
        eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
    )  # fmt: skip
    model = transformers.LlamaForCausalLM(cfg).eval()
    gen = premise.hf_generator(model, tok, max_new_tokens=5, batch=3)
    prompts = [t.messages for t in TASKS]
    together = gen(prompts)
    alone = [gen([p])[0] for p in prompts]
    assert together == alone
    assert all(isinstance(x, str) for x in together) and any(together)
    # The chat template is applied: the prompt the model saw ends with the assistant marker.
    text = tok.apply_chat_template(prompts[0], tokenize=False, add_generation_prompt=True)
    assert text.endswith("<|assistant|>") and TASKS[0].question in text


def test_unguided_answers_reused():
    gen = Scripted("Tips:")
    first = premise.measure(TASKS, gen, arms=("unguided", "skills"))
    again = Scripted("Tips:")
    second = premise.measure(TASKS, again, arms=("unguided", "skills"), placement="system",
                             unguided=[a.response for a in first["unguided"]])  # fmt: skip
    assert len(again.calls) == 1  # the skills arm only
    assert [a.response for a in second["unguided"]] == [a.response for a in first["unguided"]]
    with pytest.raises(ValueError, match="2 unguided answers for 3 tasks"):
        premise.measure(TASKS, again, unguided=["a", "b"])
