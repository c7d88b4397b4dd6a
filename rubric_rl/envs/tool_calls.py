"""Qwen3-style tool calls: parsing model turns, validating arguments, rendering tool results.

A model turn calls tools with one or more blocks

    <tool_call>
    {"name": "sql", "arguments": {"query": "SELECT 1"}}
    </tool_call>

and sees each result wrapped as ``<tool_response>\\n...\\n</tool_response>`` in the next (``tool``)
turn — the format Qwen3's chat template uses. Reasoning inside ``<think>...</think>`` is never
parsed for calls (a model that thinks about a call has not made one).

Nothing here raises on bad model output: ``parse_tool_calls`` returns a ``ToolCallError`` in place
of each block it cannot use, and the environment turns it into an error observation. Error kinds
are stable strings (``ERROR_KINDS``) because trajectory rubrics count them.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

CALL_OPEN = "<tool_call>"
CALL_CLOSE = "</tool_call>"
_THINK_RE = re.compile(r"<think>.*?(?:</think>|$)", re.DOTALL)

# Error kinds caused by the form of the call (the model's fault), vs. a well-formed call that the
# tool itself rejected ("tool_error", e.g. an unknown item id, or a refused SQL write).
SYNTAX_ERROR_KINDS = (
    "malformed_json",
    "missing_name",
    "bad_arguments",
    "unknown_tool",
    "unclosed_tag",
    "stray_close_tag",
    "too_many_calls",
)
ERROR_KINDS = SYNTAX_ERROR_KINDS + ("tool_error",)

_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "array": (list,),
    "object": (dict,),
}


class ToolCallError(Exception):
    """A tool call that cannot be executed. ``kind`` is one of ``ERROR_KINDS``."""

    def __init__(
        self,
        kind: str,
        message: str,
        *,
        name: str | None = None,
        raw: str = "",
        details: Mapping[str, Any] | None = None,
    ):
        if kind not in ERROR_KINDS:
            raise ValueError(f"unknown ToolCallError kind {kind!r}; expected one of {ERROR_KINDS}")
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.name = name
        self.raw = raw
        self.details = dict(details or {})  # kept in the tool record, e.g. {"reason": "timeout"}

    def observation(self) -> str:
        """The text the model sees in place of the tool's output."""
        return f"Error ({self.kind}): {self.message}"


@dataclasses.dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: Mapping[str, Any]
    raw: str = ""


@dataclasses.dataclass(frozen=True)
class Param:
    """One tool parameter: a JSON-schema type name and a description."""

    type: str
    description: str
    required: bool = True
    enum: tuple[Any, ...] | None = None

    def __post_init__(self):
        if self.type not in _JSON_TYPES:
            raise ValueError(f"Param.type must be one of {sorted(_JSON_TYPES)}, got {self.type!r}")


@dataclasses.dataclass(frozen=True)
class ToolSpec:
    """A tool's signature, shown to the model in the chat template's tools section."""

    name: str
    description: str
    params: tuple[tuple[str, Param], ...] = ()

    def schema(self) -> dict[str, Any]:
        """OpenAI/Qwen3 function schema: {"type": "function", "function": {...}}."""
        properties: dict[str, Any] = {}
        for pname, p in self.params:
            prop: dict[str, Any] = {"type": p.type, "description": p.description}
            if p.enum is not None:
                prop["enum"] = list(p.enum)
            properties[pname] = prop
        required = [pname for pname, p in self.params if p.required]
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": {"type": "object", "properties": properties, "required": required},
            },
        }

    def validate(self, arguments: Mapping[str, Any]) -> dict[str, Any]:
        """Checked arguments, or ``ToolCallError("bad_arguments")`` naming the argument."""
        spec = dict(self.params)
        unknown = sorted(set(arguments) - set(spec))
        if unknown:
            raise ToolCallError(
                "bad_arguments",
                f"{self.name}() got unexpected argument(s) {unknown}; "
                f"its parameters are {sorted(spec) or '(none)'}",
                name=self.name,
            )
        out: dict[str, Any] = {}
        for pname, p in self.params:
            if pname not in arguments:
                if p.required:
                    raise ToolCallError(
                        "bad_arguments",
                        f"{self.name}() is missing required argument {pname!r} ({p.type})",
                        name=self.name,
                    )
                continue
            value = arguments[pname]
            if isinstance(value, float) and not math.isfinite(value):
                # Python's json accepts NaN / Infinity; no tool wants them.
                raise ToolCallError(
                    "bad_arguments",
                    f"{self.name}() argument {pname!r} must be a finite number",
                    name=self.name,
                )
            ok = isinstance(value, _JSON_TYPES[p.type])
            if isinstance(value, bool) and p.type in ("integer", "number"):
                ok = False  # JSON true is not a number
            if p.type == "integer" and isinstance(value, float) and value.is_integer():
                value, ok = int(value), True
            if not ok:
                raise ToolCallError(
                    "bad_arguments",
                    f"{self.name}() argument {pname!r} must be of type {p.type}, "
                    f"got {json.dumps(value)}",
                    name=self.name,
                )
            if p.enum is not None and value not in p.enum:
                raise ToolCallError(
                    "bad_arguments",
                    f"{self.name}() argument {pname!r} must be one of {list(p.enum)}",
                    name=self.name,
                )
            out[pname] = value
        return out


def tools_schema(specs: Sequence[ToolSpec]) -> list[dict[str, Any]]:
    """The ``tools=`` list for a chat template."""
    return [s.schema() for s in specs]


def strip_reasoning(text: str) -> str:
    """The turn without its ``<think>`` blocks (an unclosed one runs to the end of the text)."""
    return _THINK_RE.sub("", text)


def has_tool_call(text: str) -> bool:
    """True when the turn (outside ``<think>``) tries to call a tool, even malformed."""
    content = strip_reasoning(text)
    return CALL_OPEN in content or CALL_CLOSE in content


# Deeper JSON is no tool's argument, and Python's json (and the dataclass / JSON writers the
# transcript goes through) recurse once per level: a few thousand levels is a RecursionError.
MAX_JSON_DEPTH = 32


def _json_depth(obj: Any) -> int:
    """Nesting depth of a decoded JSON value (a scalar is 0), without recursion."""
    deepest, stack = 0, [(obj, 0)]
    while stack:
        value, depth = stack.pop()
        deepest = max(deepest, depth)
        if isinstance(value, dict):
            stack.extend((v, depth + 1) for v in value.values())
        elif isinstance(value, list):
            stack.extend((v, depth + 1) for v in value)
    return deepest


class _TooDeep(ValueError):
    pass


def _decode_json(text: str) -> Any:
    """``json.loads`` that fails with ``ValueError`` on anything a tool cannot take: invalid
    JSON (``JSONDecodeError``), nesting over ``MAX_JSON_DEPTH`` (``_TooDeep``), an integer over
    Python's 4300-digit limit."""
    try:
        obj = json.loads(text)
    except RecursionError:
        raise _TooDeep() from None
    if _json_depth(obj) > MAX_JSON_DEPTH:
        raise _TooDeep()
    return obj


def _malformed(e: ValueError, raw: str) -> ToolCallError:
    hint = '; write {"name": <tool name>, "arguments": {...}}'
    if isinstance(e, _TooDeep):
        why = f"nests JSON more than {MAX_JSON_DEPTH} levels deep"
    elif isinstance(e, json.JSONDecodeError):
        why = f"is not valid JSON ({e.msg} at char {e.pos})"
    else:
        why = f"is not usable JSON ({e})"
    return ToolCallError("malformed_json", f"the tool call {why}{hint}", raw=raw)


def _parse_block(body: str) -> ToolCall:
    raw = body
    try:
        obj = _decode_json(body.strip())
    except ValueError as e:
        raise _malformed(e, raw) from None
    try:
        json.dumps(obj, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        # Valid JSON can still decode to lone surrogates, which break sqlite and log writers.
        raise ToolCallError(
            "malformed_json",
            "the tool call contains invalid unicode (a lone surrogate escape)",
            raw=raw,
        ) from None
    if not isinstance(obj, dict):
        raise ToolCallError(
            "malformed_json",
            "the tool call must be a JSON object with 'name' and 'arguments'",
            raw=raw,
        )
    name = obj.get("name")
    if not isinstance(name, str) or not name.strip():
        raise ToolCallError(
            "missing_name", "the tool call has no 'name' (a non-empty string)", raw=raw
        )
    args = obj.get("arguments", {})
    if isinstance(args, str):  # some models emit the arguments JSON-encoded a second time
        try:
            args = _decode_json(args) if args.strip() else {}
        except _TooDeep as e:
            raise _malformed(e, raw) from None
        except ValueError:
            pass  # not JSON after all: the "must be a JSON object" error below says what to write
    if args is None:
        args = {}
    if not isinstance(args, dict):
        raise ToolCallError(
            "bad_arguments", f"'arguments' of {name!r} must be a JSON object", name=name, raw=raw
        )
    return ToolCall(name=name.strip(), arguments=args, raw=raw)


def parse_tool_calls(text: str) -> list[ToolCall | ToolCallError]:
    """Every tool-call block of a model turn, in order; a bad block becomes a ``ToolCallError``.

    Syntax only: whether the tool exists and its arguments fit is ``validate_call``'s job. An
    unclosed ``<tool_call>`` or a ``</tool_call>`` without an opening tag is an error item too, so
    a turn that tries to call a tool never silently counts as a final answer.
    """
    content = strip_reasoning(text)
    items: list[ToolCall | ToolCallError] = []
    pos = 0
    while True:
        start = content.find(CALL_OPEN, pos)
        before = content[pos:] if start < 0 else content[pos:start]
        if CALL_CLOSE in before:
            items.append(
                ToolCallError(
                    "stray_close_tag",
                    f"found {CALL_CLOSE} without a matching {CALL_OPEN}",
                    raw=before,
                )
            )
        if start < 0:
            return items
        body_start = start + len(CALL_OPEN)
        end = content.find(CALL_CLOSE, body_start)
        if end < 0:
            items.append(
                ToolCallError(
                    "unclosed_tag",
                    f"{CALL_OPEN} is never closed with {CALL_CLOSE}",
                    raw=content[body_start:],
                )
            )
            return items
        try:
            items.append(_parse_block(content[body_start:end]))
        except ToolCallError as e:
            items.append(e)
        pos = end + len(CALL_CLOSE)


def validate_call(call: ToolCall, specs: Mapping[str, ToolSpec]) -> ToolCall:
    """The call with checked arguments, or ``ToolCallError`` (unknown tool / bad arguments)."""
    spec = specs.get(call.name)
    if spec is None:
        raise ToolCallError(
            "unknown_tool",
            f"there is no tool {call.name!r}; available tools: {sorted(specs)}",
            name=call.name,
            raw=call.raw,
        )
    try:
        args = spec.validate(call.arguments)
    except ToolCallError as e:
        e.raw = call.raw
        raise
    return ToolCall(name=call.name, arguments=args, raw=call.raw)


def render_tool_call(name: str, arguments: Mapping[str, Any] | None = None) -> str:
    """A tool-call block as Qwen3 writes it (used for scripted turns and reference solutions)."""
    payload = json.dumps({"name": name, "arguments": dict(arguments or {})}, ensure_ascii=False)
    return f"{CALL_OPEN}\n{payload}\n{CALL_CLOSE}"


def render_tool_response(content: str) -> str:
    """One tool result as it appears inside the tool turn of Qwen3's chat template."""
    return f"<tool_response>\n{content}\n</tool_response>"


def tools_system_block(schemas: Sequence[Mapping[str, Any]]) -> str:
    """The tools section Qwen3's chat template appends to the system message.

    For tokenizers without a tools-aware template; with one, pass ``tools=`` to the template
    instead. The wording follows the template because that is what Qwen3 models were tuned on.
    """
    lines = "\n".join(json.dumps(s, ensure_ascii=False) for s in schemas)
    return (
        "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
        "You are provided with function signatures within <tools></tools> XML tags:\n"
        f"<tools>\n{lines}\n</tools>\n\n"
        "For each function call, return a json object with function name and arguments within "
        "<tool_call></tool_call> XML tags:\n<tool_call>\n"
        '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
    )
