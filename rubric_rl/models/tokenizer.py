"""Thin wrapper over a local Hugging Face tokenizer directory (`transformers.AutoTokenizer`) or a
GGUF file's tokenizer (`gguf_io.gguf_tokenizer`)."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import Any


def _as_dict(m: Any) -> dict[str, str]:
    if isinstance(m, dict):
        return m
    if hasattr(m, "to_dict"):  # rubric_rl.rubrics.types.Message
        return m.to_dict()
    raise TypeError(f"chat message must be a dict or Message, got {type(m).__name__}")


# ``chat_template`` (``config.model.chat_template``): "auto" = the tokenizer's own template, else
# the role fallback below; "raw" = no template; anything else must be a Jinja template.
CHAT_TEMPLATE_MODES = ("auto", "raw")
# "raw": several messages' contents are joined by this (ours: a blank line, as between paragraphs).
RAW_SEPARATOR = "\n\n"


def check_chat_template(value: Any, field: str = "chat_template") -> str:
    """``value`` if it is "auto", "raw" or a Jinja template (has "{{" or "{%"), else ValueError
    naming ``field``."""
    if isinstance(value, str) and (value in CHAT_TEMPLATE_MODES or "{{" in value or "{%" in value):
        return value
    raise ValueError(
        f"{field}: must be 'auto' (the tokenizer's template), 'raw' (no template: the messages' "
        f"contents as they are) or a Jinja chat template string, got {value!r}"
    )


# Tokenizer classes that are the `tokenizers` library's fast tokenizer with no model-specific
# code (the embedded tokenizers are saved as these): loaded as that class directly.
# `AutoTokenizer` resolves the same class, but first reads the directory's model config through
# transformers' modelling utilities, which import torch: 1.5 s of every launch's start-up.
PLAIN_FAST_TOKENIZER_CLASSES = ("PreTrainedTokenizerFast", "TokenizersBackend")


def load_tokenizer_dir(path: str) -> Any:
    """The transformers tokenizer of the local directory `path`: a plain fast tokenizer
    (``tokenizer_config.json``'s ``tokenizer_class`` in ``PLAIN_FAST_TOKENIZER_CLASSES``) as
    `transformers.PreTrainedTokenizerFast`, any other through `transformers.AutoTokenizer`."""
    config = os.path.join(path, "tokenizer_config.json")
    name = None
    if os.path.isfile(config):
        try:
            with open(config, encoding="utf-8") as f:
                name = json.load(f).get("tokenizer_class")
        except (json.JSONDecodeError, UnicodeDecodeError, AttributeError) as e:
            raise ValueError(f"{config}: not a JSON object of tokenizer settings ({e})") from e
    if name in PLAIN_FAST_TOKENIZER_CLASSES:
        from transformers import PreTrainedTokenizerFast

        return PreTrainedTokenizerFast.from_pretrained(path, local_files_only=True)
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path, local_files_only=True)


class Tokenizer:
    """Encode/decode and chat formatting for one tokenizer directory (no downloads).

    ``chat_template`` says how `chat_text` / `apply_chat_template` turn messages into a prompt:

    - "auto" (default): the tokenizer's chat template when it has one. Without a template the
      fallback is plain concatenation: each message as "{role}: {content}\\n", then "assistant: "
      when `add_generation_prompt` — a readable format for models trained from scratch on it, not
      any model family's official format.
    - "raw": no template. The prompt is the messages' contents as they are: one message's content
      exactly, several joined by ``RAW_SEPARATOR``; no role words, no generation prompt.
    - a Jinja template string: used instead of the tokenizer's own (same variables: ``messages``,
      ``add_generation_prompt``, ``tools``, ``enable_thinking``, the special tokens).

    ``enable_thinking`` is handed to the template as a variable of that name: Qwen3's template
    then opens the reply with an empty ``<think></think>`` block when it is False (the default
    here: a reasoning trace would spend the rollout's ``max_new_tokens`` and be cut before the
    answer), and lets the model think when True; templates without the variable ignore it.
    """

    def __init__(
        self, path_or_tokenizer: Any, *, chat_template: str = "auto", enable_thinking: bool = False
    ):
        from rubric_rl.models.gguf_io import gguf_tokenizer, is_gguf_source

        if is_gguf_source(path_or_tokenizer):  # a GGUF file's own vocabulary and chat template
            self.hf = gguf_tokenizer(path_or_tokenizer)
        elif isinstance(path_or_tokenizer, str | os.PathLike):
            path = os.fspath(path_or_tokenizer)
            if not os.path.isdir(path):
                raise FileNotFoundError(f"tokenizer directory {path} does not exist")
            self.hf = load_tokenizer_dir(path)
        else:
            self.hf = path_or_tokenizer
        self.chat_template = check_chat_template(chat_template, "Tokenizer(chat_template=...)")
        self.enable_thinking = bool(enable_thinking)

    @property
    def vocab_size(self) -> int:
        """Number of token ids (including added special tokens)."""
        return len(self.hf)

    def vocab(self) -> dict[str, int]:
        """Token string -> id, added special tokens included."""
        return dict(self.hf.get_vocab())

    @property
    def eos_id(self) -> int | None:
        return self.hf.eos_token_id

    @property
    def pad_id(self) -> int | None:
        """The pad token id, falling back to eos when the tokenizer defines no pad token."""
        return self.hf.pad_token_id if self.hf.pad_token_id is not None else self.eos_id

    @property
    def bos_id(self) -> int | None:
        return self.hf.bos_token_id

    @property
    def has_chat_template(self) -> bool:
        """Whether a Jinja template renders prompts (never with ``chat_template="raw"``)."""
        if self.chat_template == "raw":
            return False
        return self.chat_template != "auto" or bool(getattr(self.hf, "chat_template", None))

    def encode(self, text: str, *, add_special_tokens: bool = False) -> list[int]:
        return list(self.hf.encode(text, add_special_tokens=add_special_tokens))

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = True) -> str:
        return self.hf.decode(list(map(int, ids)), skip_special_tokens=skip_special_tokens)

    def chat_text(
        self,
        messages: Sequence[Any],
        *,
        add_generation_prompt: bool = True,
        tools: Sequence[Any] | None = None,
    ) -> str:
        """The prompt string for `messages` (dicts {role, content} or `Message`s); ``tools``
        (schemas) are passed to a Jinja template that renders them."""
        msgs = [_as_dict(m) for m in messages]
        if self.chat_template == "raw":
            return RAW_SEPARATOR.join(str(m["content"]) for m in msgs)
        if self.has_chat_template:
            custom = None if self.chat_template == "auto" else self.chat_template
            extra = {"tools": list(tools)} if tools else {}
            return self.hf.apply_chat_template(
                msgs,
                tokenize=False,
                add_generation_prompt=add_generation_prompt,
                chat_template=custom,
                enable_thinking=self.enable_thinking,
                **extra,
            )
        text = "".join(f"{m['role']}: {m['content']}\n" for m in msgs)
        return text + ("assistant: " if add_generation_prompt else "")

    def apply_chat_template(
        self, messages: Sequence[Any], *, add_generation_prompt: bool = True
    ) -> list[int]:
        """Token ids of `chat_text(messages)`; the template's own special tokens are kept as
        written in the text (no extra BOS is added)."""
        return self.encode(self.chat_text(messages, add_generation_prompt=add_generation_prompt))


def train_byte_bpe(
    path: str | os.PathLike,
    texts: Sequence[str],
    vocab_size: int,
    special_tokens: Sequence[str] = ("<pad>", "<eos>", "<bos>"),
) -> str:
    """Train a byte-level BPE of exactly ``vocab_size`` ids on ``texts`` and save it at ``path`` as
    a Hugging Face tokenizer directory (``Tokenizer(path)`` and ``model.tokenizer`` read it);
    returns ``path``. ``special_tokens`` take ids 0, 1, 2, ... and are the pad, EOS and BOS tokens
    in that order (a fourth or later is only reserved). For a model trained from scratch on a
    small domain (the peer workload's 512-id vocabulary); every byte is in the alphabet, so any
    text encodes. A corpus too small to reach ``vocab_size`` merges is an error, not a smaller
    vocabulary."""
    from tokenizers import Tokenizer as RawTokenizer
    from tokenizers import decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    special = list(special_tokens)
    if len(special) < 3 or len(set(special)) != len(special):
        raise ValueError(f"special_tokens: need distinct pad, EOS and BOS tokens, got {special}")
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    if vocab_size < len(special) + len(alphabet):
        raise ValueError(
            f"vocab_size={vocab_size}: a byte-level BPE needs at least {len(special)} special + "
            f"{len(alphabet)} byte ids"
        )
    tok = RawTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=special, initial_alphabet=alphabet, min_frequency=1
    )
    tok.train_from_iterator(list(texts), trainer)
    got = tok.get_vocab_size()
    if got != vocab_size:
        raise ValueError(
            f"train_byte_bpe: the corpus ({len(texts)} texts) gave {got} ids, not {vocab_size}: "
            "too few distinct pairs to merge; give more (or more varied) text or a smaller size"
        )
    hf = PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token=special[0], eos_token=special[1], bos_token=special[2]
    )
    hf.save_pretrained(os.fspath(path))
    return os.fspath(path)
