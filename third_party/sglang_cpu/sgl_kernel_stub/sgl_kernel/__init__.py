"""Stand-in for SGLang's ``sgl_kernel`` on CPUs without AMX (rubric_rl third_party/sglang_cpu).

PyPI ships only the CUDA build of ``sgl_kernel``; the CPU build exists only in SGLang's source
tree. On a CPU without AMX, SGLang 0.5.23's text path (torch_native attention, pytorch sampling)
calls exactly one op from it: ``assign_req_to_token_pool_cpu``, implemented here in plain torch.

A few more names are imported at module level by SGLang on CPU (``_IMPORTED_NOT_PROVIDED``) but
never called on the text path; they resolve to placeholders that raise ``StandInMissingOpError``
if ever called, after printing ``MISSING OP called: <name>`` on stderr (the rubric_rl tests fail on
that line in the server log). Any other name raises ``StandInMissingOpError`` (an
``AttributeError``, so ``hasattr`` probes stay harmless) and prints ``MISSING OP requested``.
"""

from __future__ import annotations

import sys

import torch

IS_RUBRIC_RL_STANDIN = True
__version__ = "0.0.0+rubricrl.cpu.standin"
LOG_PREFIX = "[sgl_kernel stand-in]"
_PROVIDED = ("assign_req_to_token_pool_cpu",)
# Imported at module level by SGLang 0.5.23 with --device cpu (KV-cache page moves, speculative
# decoding), never called for plain text generation. Found by scanning sglang's source for
# `from sgl_kernel import` under `if _is_cpu:` at module level.
_IMPORTED_NOT_PROVIDED = (
    "copy_all_layer_kv_cache_cpu",
    "build_tree_kernel_efficient_cpu",
    "verify_tree_greedy_cpu",
    "fill_accept_out_cache_loc_cpu",
    "fill_bonus_tokens_cpu",
    "assign_draft_cache_locs_contiguous_cpu",
    "assign_extend_cache_locs_cpu",
    "rotate_input_ids_cpu",
)

print(
    f"{LOG_PREFIX} in use: plain-torch CPU stand-in providing only {', '.join(_PROVIDED)}",
    file=sys.stderr,
    flush=True,
)


class StandInMissingOpError(AttributeError):
    """An op the stand-in does not provide was requested."""


def assign_req_to_token_pool_cpu(
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    start_offset: torch.Tensor,
    end_offset: torch.Tensor,
    out_cache_loc: torch.Tensor,
    pool_len: int,
) -> None:
    """Writes each request's new KV-slot indices into the request -> token table, in place.

    For request i (row ``req_pool_indices[i]``) with start s and end e:
    ``req_to_token[row, s:e] = out_cache_loc[o : o + e - s]`` where o is the total length of the
    requests before i (``out_cache_loc`` holds the new slots of all requests back to back). Same
    contract as SGLang's triton kernel ``assign_req_to_token_pool``.
    """
    del pool_len  # the row stride; implicit in req_to_token's shape here
    starts = start_offset.tolist()
    ends = end_offset.tolist()
    rows = req_pool_indices.tolist()
    offset = 0
    for row, start, end in zip(rows, starts, ends, strict=True):
        length = end - start
        if length > 0:
            req_to_token[row, start:end] = out_cache_loc[offset : offset + length].to(
                req_to_token.dtype
            )
        offset += length


def _missing_message(name: str) -> str:
    return (
        f"sgl_kernel.{name} is not provided by rubric_rl's CPU stand-in (only "
        f"{', '.join(_PROVIDED)}); this server configuration needs the real sgl_kernel CPU build "
        "(SGLang source tree, sgl-kernel/ with the CPU backend); see "
        "third_party/sglang_cpu/README.md"
    )


def _placeholder(name: str):
    def missing_op(*args, **kwargs):
        print(f"{LOG_PREFIX} MISSING OP called: {name}", file=sys.stderr, flush=True)
        raise StandInMissingOpError(_missing_message(name))

    missing_op.__name__ = name
    return missing_op


def __getattr__(name: str):
    if name.startswith("__"):
        raise AttributeError(name)
    if name in _IMPORTED_NOT_PROVIDED:
        return _placeholder(name)
    print(f"{LOG_PREFIX} MISSING OP requested: {name}", file=sys.stderr, flush=True)
    raise StandInMissingOpError(_missing_message(name))
