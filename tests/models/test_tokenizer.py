"""Tokenizer wrapper on a locally built WordLevel tokenizer (no downloads)."""

import json

import pytest

from rubric_rl.models import Tokenizer
from rubric_rl.rubrics.types import Message

tokenizers = pytest.importorskip("tokenizers")
transformers = pytest.importorskip("transformers")

WORDS = ["hello", "world", "how", "are", "you", "fine", "system", "user", "assistant", "\n"]
SPECIALS = ["<pad>", "<|im_start|>", "<|im_end|>", "<unk>"]
# Qwen-style ChatML template.
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def _build(path, with_template: bool):
    from tokenizers import Tokenizer as RawTok
    from tokenizers import models, pre_tokenizers

    vocab = {t: i for i, t in enumerate(SPECIALS + WORDS)}
    raw = RawTok(models.WordLevel(vocab, unk_token="<unk>"))
    raw.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(" ", "removed"), pre_tokenizers.Split("\n", "isolated")]
    )
    tok = transformers.PreTrainedTokenizerFast(
        tokenizer_object=raw,
        pad_token="<pad>",
        eos_token="<|im_end|>",
        unk_token="<unk>",
        additional_special_tokens=["<|im_start|>"],
    )
    if with_template:
        tok.chat_template = CHAT_TEMPLATE
    tok.save_pretrained(str(path))
    return vocab


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("tok")
    return path, _build(path, with_template=True)


def test_encode_decode_and_special_ids(tok_dir):
    path, vocab = tok_dir
    tok = Tokenizer(str(path))
    ids = tok.encode("hello world how are you")
    assert ids == [vocab[w] for w in ["hello", "world", "how", "are", "you"]]
    assert tok.decode(ids) == "hello world how are you"
    assert tok.eos_id == vocab["<|im_end|>"] and tok.pad_id == vocab["<pad>"]
    assert tok.vocab_size == len(vocab)
    assert tok.has_chat_template


def test_chat_template_ids(tok_dir):
    path, v = tok_dir
    tok = Tokenizer(str(path))
    msgs = [Message("system", "fine"), {"role": "user", "content": "hello world"}]
    ids = tok.apply_chat_template(msgs)
    start, end, nl = v["<|im_start|>"], v["<|im_end|>"], v["\n"]
    expected = [start, v["system"], nl, v["fine"], end, nl]
    expected += [start, v["user"], nl, v["hello"], v["world"], end, nl]
    assert ids[: len(expected)] == expected
    assert ids[len(expected) :] == [start, v["assistant"], nl]
    assert tok.apply_chat_template(msgs, add_generation_prompt=False) == expected


def test_thinking_is_off_unless_asked(tok_dir):
    """``enable_thinking`` reaches the template as its variable (as Qwen3's template reads it):
    off by default, on when asked; a template without it is unchanged either way."""
    path, v = tok_dir
    qwen3_like = CHAT_TEMPLATE + (
        "{% if add_generation_prompt and enable_thinking is defined and not enable_thinking %}"
        "<|im_start|>\n<|im_end|>\n{% endif %}"
    )
    msgs = [{"role": "user", "content": "hello"}]
    plain = Tokenizer(str(path)).apply_chat_template(msgs)
    off = Tokenizer(str(path), chat_template=qwen3_like).apply_chat_template(msgs)
    on = Tokenizer(str(path), chat_template=qwen3_like, enable_thinking=True)
    empty_think = [v["<|im_start|>"], v["\n"], v["<|im_end|>"], v["\n"]]
    assert off == plain + empty_think
    assert on.apply_chat_template(msgs) == plain
    assert Tokenizer(str(path), enable_thinking=True).apply_chat_template(msgs) == plain


def test_fallback_without_template(tmp_path):
    _build(tmp_path, with_template=False)
    tok = Tokenizer(str(tmp_path))
    assert not tok.has_chat_template
    text = tok.chat_text([{"role": "user", "content": "how are you"}])
    assert text == "user: how are you\nassistant: "


def test_missing_directory_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope"):
        Tokenizer(str(tmp_path / "nope"))


def test_plain_fast_directory_loads_as_autotokenizer_would(tok_dir, tmp_path):
    """A directory saved as a plain fast tokenizer loads directly as that class (without
    AutoTokenizer's model-config read, which imports torch), equal to AutoTokenizer's load in
    ids, text, special tokens and chat rendering; a malformed tokenizer_config.json is named."""
    from rubric_rl.models.tokenizer import PLAIN_FAST_TOKENIZER_CLASSES, load_tokenizer_dir

    path, _ = tok_dir
    config = json.loads((path / "tokenizer_config.json").read_text())
    assert config["tokenizer_class"] in PLAIN_FAST_TOKENIZER_CLASSES
    ours = load_tokenizer_dir(str(path))
    ref = transformers.AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    assert type(ours) is type(ref)
    text = "hello world\nhow are you <|im_start|> fine"
    assert ours.encode(text) == ref.encode(text)
    ids = ref.encode(text)
    for skip in (True, False):
        assert ours.decode(ids, skip_special_tokens=skip) == ref.decode(
            ids, skip_special_tokens=skip
        )
    assert ours.get_vocab() == ref.get_vocab() and len(ours) == len(ref)
    assert (ours.eos_token_id, ours.pad_token_id) == (ref.eos_token_id, ref.pad_token_id)
    assert ours.all_special_ids == ref.all_special_ids
    msgs = [{"role": "user", "content": "how are you"}]
    assert ours.apply_chat_template(msgs, tokenize=False) == ref.apply_chat_template(
        msgs, tokenize=False
    )
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "tokenizer_config.json").write_text("{not json")
    with pytest.raises(ValueError, match=r"bad/tokenizer_config\.json"):
        load_tokenizer_dir(str(bad))
