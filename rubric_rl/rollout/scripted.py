"""A rollout engine without a model, for stage, pipeline and method tests and scripted checks.

`ScriptedEngine` implements the `RolloutEngine` interface (rollout/engine.py) with a Python
function in place of the policy: each sample's text is ``reply(request, prompt_text, k)``, encoded
with the engine's tokenizer (plus the EOS id when the sample ends on "stop"). Everything around the
engine — agent loops, the step pipeline, controllers, judges, `Services` — runs for real; nothing
is compiled. `char_tokenizer` is a tokenizer for it that encodes any printable-ASCII text exactly,
with a Qwen3-style chat template (tool calls and tool responses included).

What the engine returns, per sample: token ids, one log-prob per token (``logprobs``: -0.5 each
unless a subclass says otherwise), the finish reason, `weight_version`, the request id, the sample
index and its seed (``request.seeds(n)``, as real engines report). A second parameter set
(``snapshot`` / ``serving`` / ``snapshot_parts`` / ``snapshot_of``) is a label, so methods that
hold a frozen policy (ARISE-RL) run on it too; ``serving_now`` says which label is served.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from rubric_rl.models.tokenizer import Tokenizer
from rubric_rl.rollout.engine import (
    FINISH_REASONS,
    FinishReason,
    Generation,
    GenerationRequest,
    RolloutEngine,
    SamplingParams,
    sample_seed,
)

Reply = str | tuple[str, FinishReason]

# A Qwen3-style template over plain strings: <|im_start|>role\n...<|im_end|>\n; consecutive tool
# results share one user turn inside <tool_response> blocks.
CHAT_TEMPLATE = (
    "{%- for m in messages -%}"
    "{%- if m.role == 'tool' -%}"
    "{%- if loop.first or messages[loop.index0 - 1].role != 'tool' -%}"
    "{{ '<|im_start|>user' }}{%- endif -%}"
    "{{ '\n<tool_response>\n' + m.content + '\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' -%}"
    "{{ '<|im_end|>\n' }}{%- endif -%}"
    "{%- else -%}{{ '<|im_start|>' + m.role + '\n' + m.content + '<|im_end|>\n' }}{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\n' }}{%- endif -%}"
)


def char_tokenizer() -> Tokenizer:
    """A character-level tokenizer of 104 ids (fits the tiny model's vocabulary of 128): 4
    specials (``<|pad|>``, ``<|im_start|>``, ``<|im_end|>`` = EOS, ``<unk>``), the 4 tool-call
    tags as single tokens, newline and the 95 printable ASCII characters; `CHAT_TEMPLATE`."""
    from tokenizers import Tokenizer as RawTokenizer
    from tokenizers import decoders, models
    from transformers import PreTrainedTokenizerFast

    special = ["<|pad|>", "<|im_start|>", "<|im_end|>", "<unk>"]
    added = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]
    chars = ["\n"] + [chr(c) for c in range(32, 127)]
    vocab = {t: i for i, t in enumerate(special + added + chars)}
    raw = RawTokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    raw.decoder = decoders.Fuse()
    hf = PreTrainedTokenizerFast(
        tokenizer_object=raw,
        eos_token="<|im_end|>",
        pad_token="<|pad|>",
        unk_token="<unk>",
        additional_special_tokens=["<|im_start|>", "<|im_end|>"],
    )
    hf.add_tokens(added)
    hf.chat_template = CHAT_TEMPLATE
    return Tokenizer(hf)


def sample_rng(request: GenerationRequest, k: int) -> np.random.Generator:
    """A generator seeded by sample ``k``'s own seed (``request.seeds``): scripted samples
    differ wherever a real engine's would, and repeat wherever they would."""
    return np.random.default_rng(
        sample_seed(request.step, request.task_index, request.sample_offset + k)
    )


def prompt_words(request: GenerationRequest, prompt_text: str, k: int) -> str:
    """A stand-in policy for any word-level domain: 2 to 8 of its prompt's words, drawn by the
    sample's seed (so any tokenizer that encoded the prompt encodes the reply)."""
    rng = sample_rng(request, k)
    return " ".join(rng.choice(prompt_text.split(), size=int(rng.integers(2, 9))))


class ScriptedEngine(RolloutEngine):
    """The policy is ``reply(request, prompt_text, k)``: the text of sample ``k`` of ``request``
    (whose prompt decodes to ``prompt_text``), or ``(text, finish_reason)``; a plain text ends on
    "stop". Give ``reply`` as an argument or override the method.

    Records: ``calls`` (the requests of each ``agenerate`` call) and ``requests`` (per request,
    ``record(request, prompt_text)``: by default ``(request_id, prompt_text, serving_now)``).
    ``ascore`` raises (there are no logits); ``update_weights`` records the version.
    """

    def __init__(self, tok: Tokenizer, reply: Any = None, *, weight_version: int = 0):
        self.tok = tok
        self._reply = reply
        self._version = int(weight_version)
        self.calls: list[list[GenerationRequest]] = []
        self.requests: list[Any] = []
        self.serving_now: Any = None  # the snapshot served (``serving``); None: the live policy
        self.snapshots = 0

    # -- the script ---------------------------------------------------------------------------

    def reply(self, request: GenerationRequest, prompt_text: str, k: int) -> Reply:
        if self._reply is None:
            raise NotImplementedError(
                f"{type(self).__name__}: give ScriptedEngine a reply function or override reply"
            )
        return self._reply(request, prompt_text, k)

    def logprobs(self, n_tokens: int) -> tuple[float, ...]:
        """The behaviour log-probs of a sample of ``n_tokens`` tokens."""
        return (-0.5,) * n_tokens

    def record(self, request: GenerationRequest, prompt_text: str) -> None:
        self.requests.append((request.request_id, prompt_text, self.serving_now))

    def decode_prompt(self, request: GenerationRequest) -> str:
        return self.tok.decode(list(request.prompt_ids))

    # -- RolloutEngine ------------------------------------------------------------------------

    async def agenerate(
        self, requests: Sequence[GenerationRequest], params: SamplingParams
    ) -> list[list[Generation]]:
        self.calls.append(list(requests))
        out = []
        for r in requests:
            text = self.decode_prompt(r)
            self.record(r, text)
            gens = []
            for k, seed in enumerate(r.seeds(params.n)):
                reply = self.reply(r, text, k)
                body, finish = (reply, "stop") if isinstance(reply, str) else reply
                if finish not in FINISH_REASONS:
                    raise ValueError(
                        f"{type(self).__name__}: request {r.request_id!r} sample {k}: finish "
                        f"reason {finish!r} not in {FINISH_REASONS}"
                    )
                ids = self.tok.encode(body) + ([self.tok.eos_id] if finish == "stop" else [])
                gens.append(
                    Generation(
                        tuple(ids),
                        self.logprobs(len(ids)),
                        finish,
                        self._version,
                        r.request_id,
                        k,
                        seed,
                    )  # fmt: skip
                )
            out.append(gens)
        return out

    async def ascore(self, sequences, temperature: float = 1.0) -> list[list[float]]:
        raise NotImplementedError(f"{type(self).__name__} has no model to score sequences with")

    def update_weights(self, params_or_path: Any, version: int) -> None:
        self._version = int(version)

    def health(self) -> bool:
        return True

    def close(self) -> None:
        self._close_sync_loop()

    @property
    def weight_version(self) -> int:
        return self._version

    # -- a second parameter set: a label, its own "parameters" in a checkpoint -----------------

    def snapshot(self) -> str:
        self.snapshots += 1
        return f"snapshot{self.snapshots}"

    @contextlib.contextmanager
    def serving(self, snapshot: Any) -> Iterator[None]:
        self.serving_now = snapshot
        try:
            yield
        finally:
            self.serving_now = None

    def snapshot_parts(self, snapshot: Any) -> tuple[Any, int]:
        return snapshot, 0

    def snapshot_of(self, params: Any, version: int) -> str:
        return params


def agent_turn(request: GenerationRequest) -> tuple[int, int]:
    """(episode, turn) of an agent-loop request: its id is ``episode<i>/turn<k>``
    (rollout/agent.py)."""
    episode, turn = request.request_id.rsplit("/", 2)[-2:]
    if not (episode.startswith("episode") and turn.startswith("turn")):
        raise ValueError(f"request id {request.request_id!r} is not episode<i>/turn<k>")
    return int(episode.removeprefix("episode")), int(turn.removeprefix("turn"))


class TurnScriptEngine(ScriptedEngine):
    """Plays forced agent turns: ``scripts[episode][turn]`` is a text (ends on "stop") or
    ``(text, finish_reason)``, like a policy that learned them."""

    def __init__(self, tok: Tokenizer, scripts: Sequence[Sequence[Reply]], **kwargs: Any):
        super().__init__(tok, **kwargs)
        self.scripts = scripts

    def reply(self, request: GenerationRequest, prompt_text: str, k: int) -> Reply:
        episode, turn = agent_turn(request)
        return self.scripts[episode][turn]

    def decode_prompt(self, request: GenerationRequest) -> str:
        return ""  # the script does not read the prompt
