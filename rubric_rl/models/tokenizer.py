"""Thin wrapper over a local Hugging Face tokenizer directory (`transformers.AutoTokenizer`)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any


def _as_dict(m: Any) -> dict[str, str]:
    if isinstance(m, dict):
        return m
    if hasattr(m, "to_dict"):  # rubric_rl.rubrics.types.Message
        return m.to_dict()
    raise TypeError(f"chat message must be a dict or Message, got {type(m).__name__}")


class Tokenizer:
    """Encode/decode and chat formatting for one tokenizer directory (no downloads).

    `apply_chat_template` uses the tokenizer's chat template when it has one. Without a template
    the fallback is plain concatenation: each message as "{role}: {content}\\n", then "assistant: "
    when `add_generation_prompt` — a readable format for models trained from scratch on it, not
    any model family's official format.
    """

    def __init__(self, path_or_tokenizer: Any):
        if isinstance(path_or_tokenizer, str | os.PathLike):
            from transformers import AutoTokenizer

            path = os.fspath(path_or_tokenizer)
            if not os.path.isdir(path):
                raise FileNotFoundError(f"tokenizer directory {path} does not exist")
            self.hf = AutoTokenizer.from_pretrained(path, local_files_only=True)
        else:
            self.hf = path_or_tokenizer

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
        return bool(getattr(self.hf, "chat_template", None))

    def encode(self, text: str, *, add_special_tokens: bool = False) -> list[int]:
        return list(self.hf.encode(text, add_special_tokens=add_special_tokens))

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = True) -> str:
        return self.hf.decode(list(map(int, ids)), skip_special_tokens=skip_special_tokens)

    def chat_text(self, messages: Sequence[Any], *, add_generation_prompt: bool = True) -> str:
        """The prompt string for `messages` (dicts {role, content} or `Message`s)."""
        msgs = [_as_dict(m) for m in messages]
        if self.has_chat_template:
            return self.hf.apply_chat_template(
                msgs, tokenize=False, add_generation_prompt=add_generation_prompt
            )
        text = "".join(f"{m['role']}: {m['content']}\n" for m in msgs)
        return text + ("assistant: " if add_generation_prompt else "")

    def apply_chat_template(
        self, messages: Sequence[Any], *, add_generation_prompt: bool = True
    ) -> list[int]:
        """Token ids of `chat_text(messages)`; the template's own special tokens are kept as
        written in the text (no extra BOS is added)."""
        return self.encode(self.chat_text(messages, add_generation_prompt=add_generation_prompt))
