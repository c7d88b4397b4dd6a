"""Options a script using rubric_rl as a library sets on the config: ``model.shape``
(a preset's fields replaced, random init seeded by ``model.init_seed``), ``model.vocab_multiple``,
``model.chat_template`` ("raw" prompts, a template string), ``logging.library_info`` (orbax /
optax INFO lines dropped by default, by the Trainer too), and validation of only the fields the
run uses."""

import dataclasses
import logging
import os

import jax
import numpy as np
import pytest
from flax import nnx

from configs import grpo
from rubric_rl.config import builders
from rubric_rl.config.config_validation import validate_config
from rubric_rl.models import PRESETS, SHAPE_FIELDS, Qwen3ForCausalLM, Tokenizer
from rubric_rl.pre_rl import warmstart
from rubric_rl.util import logs
from tests.trainer_spy import one_device

WORDS = [chr(ord("a") + i) * 2 for i in range(25)]  # aa ... yy, + 6 special tokens = 31 ids
USER = {"role": "user", "content": "bb cc dd"}
SYSTEM = {"role": "system", "content": "ee ff"}


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return builders.build_word_tokenizer(WORDS, str(tmp_path_factory.mktemp("tok")))


def _config(**model):
    c = grpo.get_config("smoke")  # locked: model.shape is None, so update() can set a dict
    c.model.update(model)
    return c


def _params(model) -> dict[str, np.ndarray]:
    flat = nnx.to_flat_state(nnx.state(model, nnx.Param))
    return {"/".join(map(str, k)): np.asarray(jax.device_get(v.value)) for k, v in flat}


def _count(v, d, f, layers, h, kv, hd, tied) -> int:
    """Qwen3's parameter count from its dims (q/k/v/o, q/k norms, gate/up/down, two norms per
    layer; embedding, final norm, an untied head)."""
    attn = d * h * hd + 2 * d * kv * hd + h * hd * d + 2 * hd
    return v * d * (1 if tied else 2) + layers * (attn + 3 * d * f + 2 * d) + d


# ------------------------------------------------------------------------------ model.shape


def test_shape_replaces_the_presets_fields_and_init_seed_seeds_the_model(tok):
    shape = dict(
        hidden_size=32, intermediate_size=48, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, tie_word_embeddings=False, rope_theta=5e4,
        rms_norm_eps=1e-5, max_position_embeddings=256,
    )  # fmt: skip
    c = _config(name="tiny", shape=shape, init_seed=3)
    validate_config(c, num_devices=jax.device_count())
    mesh = builders.build_mesh(c)
    with jax.set_mesh(mesh):
        model = builders.build_model(c, tok, mesh)
        c.model.init_seed = 4
        other = builders.build_model(c, tok, mesh)
    again = Qwen3ForCausalLM(model.config, rngs=nnx.Rngs(3))  # unsharded, eager, seed 3
    cfg = model.config
    assert {k: getattr(cfg, k) for k in shape} == shape and cfg.vocab_size == 64
    p = _params(model)
    assert p["embed/embedding"].shape == (64, 32) and p["lm_head/kernel"].shape == (32, 64)
    assert p["layers/2/attn/q_proj/kernel"].shape == (32, 32)
    assert p["layers/2/attn/k_proj/kernel"].shape == (32, 16)
    assert p["layers/2/mlp/up_proj/kernel"].shape == (32, 48)
    assert not any(k.startswith("layers/3/") for k in p)
    assert sum(a.size for a in p.values()) == _count(64, 32, 48, 3, 4, 2, 8, tied=False)
    q = _params(again)
    assert all(np.array_equal(p[k], q[k]) for k in p)  # same init_seed: the same model
    r = _params(other)
    assert not np.array_equal(p["embed/embedding"], r["embed/embedding"])
    assert not np.array_equal(p["layers/0/mlp/up_proj/kernel"], r["layers/0/mlp/up_proj/kernel"])


def test_peer_preset_is_the_peer_workloads_shape_and_size(tok):
    peer = dict(
        vocab_size=512, hidden_size=256, intermediate_size=768, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, head_dim=64, tie_word_embeddings=True,
        rope_theta=1e6, rms_norm_eps=1e-6,
    )  # fmt: skip
    assert {k: getattr(PRESETS["peer-3m"], k) for k in peer} == peer
    # The same shape given as a shape on another preset: the same config, 3,279,616 parameters.
    a = builders.model_config(_config(name="peer-3m", shape={"vocab_size": 512}), tok)
    b = builders.model_config(_config(name="tiny", shape=peer), tok)
    assert a == dataclasses.replace(b, max_position_embeddings=2048)
    model = nnx.eval_shape(lambda: Qwen3ForCausalLM(a, rngs=nnx.Rngs(0)))  # shapes only
    n = sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
    assert n == _count(512, 256, 768, 4, 4, 2, 64, tied=True) == 3_279_616


@pytest.mark.parametrize(
    "model, match",
    [
        (
            dict(shape={"hidden": 8}),
            r"^config\.model\.shape\.hidden: not a field of the model's shape; the valid ones "
            rf"are \[{', '.join(repr(f) for f in SHAPE_FIELDS)}\]$",
        ),
        (dict(shape={"eos_token_id": 2}), r"config\.model\.shape\.eos_token_id: not a field"),
        (
            dict(shape={"num_attention_heads": 3}),
            r"^config\.model\.shape\.num_attention_heads: must be a multiple of "
            r"num_key_value_heads, got 3 and 2$",
        ),
        (dict(shape={"hidden_size": "64"}), r"config\.model\.shape\.hidden_size: must be a posi"),
        (dict(shape={"tie_word_embeddings": 1}), r"shape\.tie_word_embeddings: must be True or"),
        (dict(vocab_multiple=0), r"^config\.model\.vocab_multiple: must be an int >= 1"),
        (dict(chat_template="Raw"), r"^config\.model\.chat_template: must be 'auto'"),
    ],
)
def test_model_option_errors_name_the_field(model, match):
    with pytest.raises(ValueError, match=match):
        validate_config(_config(**model), num_devices=jax.device_count())


def test_a_shape_with_a_checkpoint_directory_is_an_error_saying_why(tmp_path, tok):
    c = _config(name=str(tmp_path), tokenizer=str(tmp_path), shape={"hidden_size": 64})
    c.warmstart.tie_case = False
    why = r"^config\.model\.shape: model\.name '.*' is a checkpoint directory, whose config\.json"
    with pytest.raises(ValueError, match=why):
        validate_config(c, num_devices=jax.device_count())
    with pytest.raises(ValueError, match=why):  # also when build_model is called directly
        builders.build_model(c, tok, None)


# ------------------------------------------------------------------------------ vocabulary


@pytest.mark.parametrize(
    "model, vocab, why",
    [
        ({}, 64, "the tokenizer's 31 ids rounded up to 64, a multiple of "
                 "config.model.vocab_multiple=64"),
        ({"vocab_multiple": 1}, 31, "the tokenizer's 31 ids (a multiple of "
                                    "config.model.vocab_multiple=1)"),
        ({"vocab_multiple": 16}, 32, "the tokenizer's 31 ids rounded up to 32, a multiple of "
                                     "config.model.vocab_multiple=16"),
        ({"shape": {"vocab_size": 40}}, 40, "config.model.shape.vocab_size (the tokenizer has "
                                            "31 ids)"),
    ],
)  # fmt: skip
def test_vocabulary_size_is_chosen_as_configured_and_logged(tok, caplog, model, vocab, why):
    assert tok.vocab_size == 6 + len(WORDS) == 31
    with caplog.at_level(logging.INFO):
        cfg = builders.model_config(_config(**model), tok)
    assert cfg.vocab_size == vocab and cfg.eos_token_id == tok.eos_id
    assert [r.getMessage() for r in caplog.records if "vocabulary" in r.getMessage()] == [
        f"model vocabulary {vocab}: {why}"
    ]


def test_a_shape_vocabulary_smaller_than_the_tokenizers_is_an_error_naming_both(tok):
    with pytest.raises(ValueError, match=r"^config\.model\.shape\.vocab_size: .*vocabulary 30 .*"
                                         r"< the tokenizer's 31 token ids"):  # fmt: skip
        builders.model_config(_config(shape={"vocab_size": 30}), tok)


# ------------------------------------------------------------------------------ chat template


def test_raw_prompts_are_the_messages_contents_and_a_template_string_replaces_the_tokenizers(tok):
    raw = Tokenizer(tok.hf, chat_template="raw")
    assert raw.chat_text([USER]) == USER["content"]
    assert raw.apply_chat_template([USER]) == tok.encode(USER["content"]) == [7, 8, 9]
    assert raw.chat_text([SYSTEM, USER]) == "ee ff\n\nbb cc dd"  # no role, no generation prompt
    assert not raw.has_chat_template
    assert tok.chat_text([USER]) == "<|user|> bb cc dd <|assistant|>"  # "auto": the tokenizer's
    custom = Tokenizer(
        tok.hf, chat_template="{% for m in messages %}[{{ m['content'] }}]{% endfor %}"
    )
    assert custom.chat_text([SYSTEM, USER]) == "[ee ff][bb cc dd]"
    assert tok.chat_text([USER]) == "<|user|> bb cc dd <|assistant|>"  # the wrapped one unchanged
    with pytest.raises(ValueError, match=r"^Tokenizer\(chat_template=\.\.\.\): must be 'auto'"):
        Tokenizer(tok.hf, chat_template="none")


def test_raw_prompts_are_refused_for_multi_turn_agent_episodes():
    c = grpo.get_config("smoke,domain=sql")
    c.model.chat_template = "raw"
    with pytest.raises(ValueError, match=r"^config\.model\.chat_template: 'raw' drops the roles"):
        validate_config(c, num_devices=jax.device_count())


def test_warm_start_cache_key_unchanged_by_the_new_model_options_at_their_defaults():
    c = grpo.get_config("smoke")
    key = warmstart.cache_key(c)
    with c.unlocked():
        for k in ("shape", "vocab_multiple", "chat_template"):
            del c.model[k]  # a config from before these options existed
    assert warmstart.cache_key(c) == key
    assert warmstart.cache_key(_config(chat_template="raw")) != key
    assert warmstart.cache_key(_config(vocab_multiple=1)) != key
    assert warmstart.cache_key(_config(shape={"hidden_size": 32})) != key


# ------------------------------------------------------------------------------ Trainer


def _orbax_info(records) -> list[str]:
    return [
        r.getMessage()
        for r in records
        if f"{os.sep}orbax{os.sep}" in r.pathname and r.levelno == logging.INFO
    ]


@pytest.fixture
def absl_handler_records():
    """What absl's handler (the launcher's) emits once its filters pass a record, attached to the
    root logger at INFO."""
    from absl import logging as absl_logging

    handler, records = absl_logging.get_absl_handler(), []
    root, level = logging.getLogger(), logging.getLogger().level
    handler.python_handler.emit = records.append  # in place of writing the line
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    yield records
    root.removeHandler(handler)
    root.setLevel(level)
    del handler.python_handler.emit
    logs.set_library_info(False)


def _trainer(workdir, *, library_info=False, **model):
    from rubric_rl.trainer import Trainer

    c = _config(shape={"num_hidden_layers": 1}, **model)  # one layer: logging is checked
    c.warmstart.steps = 0
    c.calibration.enabled = False
    c.logging.update(tensorboard=False, progress_bar=False, library_info=library_info)
    return Trainer(c, str(workdir), devices=one_device())


def test_trainer_formats_raw_prompts_and_drops_orbax_info_unless_asked(
    tmp_path, absl_handler_records
):
    t = _trainer(tmp_path / "quiet", chat_template="raw")
    try:
        task = t.domain.train[0]
        assert len(task.prompt) == 1 and t.tokenizer.chat_template == "raw"
        ids = t.services.encode_prompt(task.prompt)
        assert list(ids) == t.tokenizer.encode(task.prompt[0].content)
        t.save(wait=True)
    finally:
        t.close()
    assert os.path.isdir(tmp_path / "quiet" / "checkpoints" / "0")
    assert _orbax_info(absl_handler_records) == []
    # The filter drops INFO only: a warning from inside orbax passes.
    path = os.path.join(os.sep, "site-packages", "orbax", "x.py")
    assert logs.quiet_library_info(logging.LogRecord("absl", 30, path, 1, "w", (), None))
    assert not logs.quiet_library_info(logging.LogRecord("absl", 20, path, 1, "i", (), None))

    t = _trainer(tmp_path / "verbose", library_info=True)
    try:
        t.save(wait=True)
    finally:
        t.close()
    assert len(_orbax_info(absl_handler_records)) >= 3  # orbax's save lines, now through


def test_the_trainer_spans_the_devices_it_is_given(tmp_path):
    """``Trainer(devices=...)``: config.mesh over those devices (here one of the suite's eight),
    and the mesh is checked against them, not against every device of the host."""
    from rubric_rl.trainer import Trainer

    (device,) = one_device()
    t = _trainer(tmp_path / "one")
    try:
        assert t.mesh.devices.size == 1 and t.mesh.devices.flat[0] == device
        leaves = jax.tree.leaves(t.state.params)
        assert leaves and all(x.sharding.device_set == {device} for x in leaves)
    finally:
        t.close()
    c = _config()
    c.mesh.update(data=2, fsdp=-1)  # fits the host's 8 devices, not the 1 given
    with pytest.raises(ValueError, match=r"config\.mesh.* does not divide 1 devices"):
        Trainer(c, str(tmp_path / "two"), devices=one_device())


def test_library_filter_installs_once_and_is_removed_by_the_flag():
    from absl import logging as absl_logging

    targets = (logging.getLogger("absl"), logging.getLogger(), absl_logging.get_absl_handler())
    try:
        logs.set_library_info(False)
        logs.set_library_info(False)
        assert [t.filters.count(logs.quiet_library_info) for t in targets] == [1, 1, 1]
        logs.set_library_info(True)
        assert [t.filters.count(logs.quiet_library_info) for t in targets] == [0, 0, 0]
    finally:
        logs.set_library_info(False)


# ------------------------------------------------------------------------------ validation


def test_warm_start_corpus_setting_is_checked_only_when_there_is_a_warm_start():
    c = grpo.get_config("smoke")
    c.warmstart.p_keep = 1.5
    c.warmstart.steps = 0  # no warm start (as on the dataset domain): p_keep is unused
    validate_config(c, num_devices=jax.device_count())
    c.warmstart.steps = 2
    with pytest.raises(ValueError, match=r"^config\.warmstart\.p_keep: must be in \[0, 1\]"):
        validate_config(c, num_devices=jax.device_count())


def test_grpo_config_is_the_packaged_base_and_what_configs_grpo_locks():
    from rubric_rl.config.defaults import get_base_config, grpo_config

    c = grpo_config()
    assert c.method == "grpo" and c.controllers.sampler == "uniform"
    c.model.update(name="peer-3m")  # unlocked: a script changes it in place
    c.some_new_key = 1
    ours = grpo.get_config().to_dict()
    assert grpo_config().to_dict() == ours
    assert get_base_config().to_dict() == {
        k: v for k, v in ours.items() if k not in ("method", "controllers")
    }


def test_train_byte_bpe_has_exactly_the_size_and_the_special_ids(tmp_path):
    from rubric_rl.models.tokenizer import train_byte_bpe

    texts = [f"word{i} other{i % 7} ünïcode {i * 13}" for i in range(400)]
    path = train_byte_bpe(tmp_path / "bpe", texts, vocab_size=300)
    t = Tokenizer(path)
    assert len(t.hf) == 300
    assert (t.hf.pad_token_id, t.hf.eos_token_id, t.hf.bos_token_id) == (0, 1, 2)
    for text in ("word3 other3", "never seen: ✓ 漢字", texts[-1]):  # every byte encodes
        ids = t.hf.encode(text, add_special_tokens=False)
        assert t.hf.decode(ids) == text and not {0, 1, 2} & set(ids)
    with pytest.raises(ValueError, match="gave .* ids, not 5000"):
        train_byte_bpe(tmp_path / "small", texts[:3], vocab_size=5000)
    with pytest.raises(ValueError, match="vocab_size=100"):
        train_byte_bpe(tmp_path / "tiny", texts, vocab_size=100)
    with pytest.raises(ValueError, match="distinct pad, EOS and BOS"):
        train_byte_bpe(tmp_path / "dup", texts, 300, special_tokens=("<p>", "<p>", "<b>"))


def test_step_timer_times_from_one_step_end_to_the_next(monkeypatch):
    import types

    from rubric_rl.loop import step_callbacks

    state = type("State", (), {"params": {"w": jax.numpy.ones(3)}})()
    clock = iter([10.0, 12.5, 13.5, 16.0])  # step ends: steps of 2.5, 1.0, 2.5 s after step 1
    # The callbacks module's clock only: patching time.perf_counter itself would also feed jax's
    # own timers (the persistent compilation cache times every compile) from this clock.
    fake_time = types.SimpleNamespace(perf_counter=lambda: next(clock))
    monkeypatch.setattr(step_callbacks, "time", fake_time)
    timer = step_callbacks.StepTimer()
    for step, gen in zip(range(1, 5), [9.0, 2.0, 0.4, 1.5]):
        timer.on_step_end(step, {"step": step, "time/rollout": gen}, state)
    assert [r["step"] for r in timer.rows] == [1, 2, 3, 4]
    # warm-up 1: steps 2-4 timed, 2.5 / 1.0 / 2.5 s, generation 2.0 / 0.4 / 1.5, the rest
    # 0.5 / 0.6 / 1.0 (step 1's 9 s of generation never counts)
    assert timer.summary(1) == pytest.approx(
        dict(steps=4, timed=3, step_s_median=2.5, gen_s_median=1.5, train_s_median=0.6)
    )
    s = timer.summary(2)  # steps 3-4: medians of two
    assert s["timed"] == 2 and s["step_s_median"] == pytest.approx(1.75)
    assert s["train_s_median"] == pytest.approx((0.6 + 1.0) / 2)
    with pytest.raises(ValueError, match="first step has no start"):
        timer.summary(0)
    with pytest.raises(ValueError, match="none after the 4 warm-up"):
        timer.summary(4)


def test_warm_start_cache_key_unchanged_by_the_hard_environment_option_at_its_default():
    c = grpo.get_config("smoke")
    key = warmstart.cache_key(c)
    with c.unlocked():
        del c.domain["hard_min_constraints"]  # a config from before the option existed
    assert warmstart.cache_key(c) == key
    with c.unlocked():
        c.domain.hard_min_constraints = 5
    assert warmstart.cache_key(c) != key


def test_warm_start_cache_key_unchanged_by_the_completion_len_option_at_its_default():
    c = grpo.get_config("smoke")
    key = warmstart.cache_key(c)
    with c.unlocked():
        del c.warmstart["completion_len"]  # a config from before the option existed
    assert warmstart.cache_key(c) == key and warmstart.completion_len(c) == 8
    with c.unlocked():
        c.warmstart.completion_len = 64
    assert warmstart.cache_key(c) != key and warmstart.completion_len(c) == 64
