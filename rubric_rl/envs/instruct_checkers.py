"""Programmatic checkers of the English instruction-following domain, registered as ``if_*``.

Every checker is ``fn(response, *, task=None, **args) -> bool`` and takes all it needs from
``args`` (``task`` is accepted for the registry's contract and ignored), so a criterion built with
``Verifier.rule("if_bullets", n=3)`` is checkable on its own: the judge of this domain is the
existing ``ProgrammaticJudge``. Each checker also has a graded form in :func:`graded` (partial
credit for counts, used only by the hidden oracle).

Text conventions (ours; IFEval's families, our own counting rules, chosen so that a reader would
count the same):

- a *word* is a run of letters, digits, apostrophes or inner hyphens (``\\b[\\w'-]+``, ``_`` not a
  letter); markup (``*``, ``#``, ``<<``) is not a word;
- a *sentence* is a piece of a line ended by ``.``, ``!`` or ``?`` (or the line's end) that holds a
  word; a list item is a sentence of its own line; a title line (``<<...>>``) or a
  ``SECTION k`` heading is no sentence;
- a *paragraph* is a block separated by one or more blank lines;
- a *bullet* is a line starting with ``* `` or ``- ``; a *numbered item* a line starting with
  ``<k>.`` or ``<k>)``, numbered 1, 2, … in order;
- keywords match whole words, case-insensitively, a hyphen or apostrophe separating words;
  phrases (start, end) are compared case-insensitively with whitespace collapsed, so a case
  instruction never contradicts them.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from typing import Any

from rubric_rl.rubrics.checkers import CHECKERS
from rubric_rl.rubrics.types import Task

_WORD = re.compile(r"[^\W_](?:[\w'-]*[^\W_])?")
# Not after a lone letter: "P.S." and initials end no sentence.
_SENTENCE_END = re.compile(r"(?<!\b[A-Za-z])[.!?]+(?=\s|$|[\"')\]])")
_BULLET = re.compile(r"^\s*[*-]\s+\S", re.M)
_NUMBERED = re.compile(r"^\s*(\d+)[.)]\s+\S", re.M)
_SECTION = re.compile(r"^\s*(?:#+\s*)?section\s+(\d+)\b", re.M | re.I)
_POSTSCRIPT = re.compile(r"^\s*p\.\s?s\.", re.M | re.I)
_TITLE = re.compile(r"<<[^<>\n]*[^\W_][^<>\n]*>>")
# An emphasised span: *text* on one line, not a bullet's leading "* " (IFEval's markdown
# highlight family); **text** counts once.
_HIGHLIGHT = re.compile(r"(?<![*\w])\*{1,2}(?!\s)([^*\n]*[^\W_][^*\n]*?)(?<!\s)\*{1,2}(?![*\w])")
_PLACEHOLDER = re.compile(r"\[[^\[\]\n]*[^\W_][^\[\]\n]*\]")
_FENCE = re.compile(r"^\s*```[a-zA-Z]*\s*\n(.*)\n\s*```\s*$", re.S)


def words(text: str) -> list[str]:
    return _WORD.findall(text)


def sentences(text: str) -> list[str]:
    out = []
    for line in text.splitlines():
        if _TITLE.fullmatch(line.strip()) or _SECTION.fullmatch(line):
            continue  # a heading, not a sentence
        start = 0
        for m in _SENTENCE_END.finditer(line):
            out.append(line[start : m.end()])
            start = m.end()
        out.append(line[start:])
    return [s.strip() for s in out if words(s)]


def paragraphs(text: str) -> list[str]:
    """Blocks between blank lines that hold a word; a block that is only a title line
    (``<<...>>``) or a postscript (``P.S. ...``) is not a paragraph of the answer's body."""
    blocks = re.split(r"\n\s*\n", text.strip())
    return [
        b
        for b in blocks
        if words(b) and not _TITLE.fullmatch(b.strip()) and not _POSTSCRIPT.match(b)
    ]


def bullets(text: str) -> int:
    return len(_BULLET.findall(text))


def numbered(text: str) -> list[int]:
    return [int(k) for k in _NUMBERED.findall(text)]


def sections(text: str) -> list[int]:
    return [int(k) for k in _SECTION.findall(text)]


def highlights(text: str) -> int:
    return len(_HIGHLIGHT.findall(text))


def placeholders(text: str) -> int:
    return len(_PLACEHOLDER.findall(text))


def capital_words(text: str) -> int:
    """Words of two or more letters written wholly in capitals (IFEval's capital-word family)."""
    return sum(1 for w in words(text) if len(w) >= 2 and w.isupper())


def keyword_count(text: str, word: str) -> int:
    """Whole-word, case-insensitive occurrences; a hyphen or apostrophe separates words here
    (IFEval's word boundaries): "honey-like" and "honey's" use "honey", "honeys" does not."""
    return len(re.findall(rf"(?<!\w){re.escape(word)}(?!\w)", text, re.I))


def _collapse(text: str) -> str:
    return " ".join(text.split()).lower()


def json_body(text: str) -> str:
    """The text a JSON answer is parsed from: the answer, or the inside of one ```json fence."""
    m = _FENCE.match(text)
    return m.group(1) if m else text.strip()


def parses_as_json(text: str) -> bool:
    try:
        json.loads(json_body(text))
    except ValueError:
        return False
    return True


def _letters(text: str) -> str:
    return "".join(c for c in text if c.isalpha())


# -------------------------------------------------------------------------------- checkers
# One function per instruction type: (response, **args) -> bool. CHECKS maps the registered
# name to it; graded() gives the oracle's partial credit for the counting ones.


def _exact_count(found: int, n: int) -> float:
    return max(0.0, 1.0 - abs(found - n) / max(n, 1))


def _at_least(found: int, n: int) -> float:
    return min(1.0, found / max(n, 1))


def _ordered_count(found: Sequence[int], n: int) -> float:
    """Credit for a numbered run: how far its length is from ``n``, none when out of order."""
    return _exact_count(len(found), n) if list(found) == sorted(found) else 0.0


def _sequence(found: Sequence[int], n: int) -> bool:
    return list(found) == list(range(1, n + 1))


CHECKS: dict[str, Callable[..., bool]] = {
    "if_words_max": lambda r, n: len(words(r)) <= n,
    "if_words_min": lambda r, n: len(words(r)) >= n,
    "if_sentences_max": lambda r, n: 1 <= len(sentences(r)) <= n,
    "if_paragraphs": lambda r, n: len(paragraphs(r)) == n,
    "if_lowercase": lambda r: bool(_letters(r)) and r == r.lower(),
    "if_uppercase": lambda r: bool(_letters(r)) and r == r.upper(),
    "if_capital_words": lambda r, n: capital_words(r) >= n,
    "if_no_commas": lambda r: "," not in r,
    "if_keywords": lambda r, words: all(keyword_count(r, w) >= 1 for w in words),
    "if_forbidden": lambda r, word: keyword_count(r, word) == 0,
    "if_keyword_count": lambda r, word, n: keyword_count(r, word) >= n,
    "if_bullets": lambda r, n: bullets(r) == n,
    "if_numbered": lambda r, n: _sequence(numbered(r), n),
    "if_json": lambda r: parses_as_json(r),
    "if_quotation": lambda r: len(r.strip()) > 2 and r.strip()[0] == r.strip()[-1] == '"',
    "if_title": lambda r: bool(_TITLE.search(r)),
    "if_start_phrase": lambda r, phrase: _collapse(r).startswith(_collapse(phrase)),
    "if_end_phrase": lambda r, phrase: _collapse(r).endswith(_collapse(phrase)),
    "if_sections": lambda r, n: _sequence(sections(r), n),
    "if_postscript": lambda r: bool(_POSTSCRIPT.search(r)),
    "if_highlights": lambda r, n: highlights(r) >= n,
    "if_placeholders": lambda r, n: placeholders(r) >= n,
    "if_question_end": lambda r: r.strip().endswith("?"),
}

# Partial credit where a stronger judge would give it: how far a count is from its target.
_GRADED: dict[str, Callable[..., float]] = {
    "if_words_max": lambda r, n: min(1.0, n / max(len(words(r)), 1)),
    "if_words_min": lambda r, n: _at_least(len(words(r)), n),
    "if_paragraphs": lambda r, n: _exact_count(len(paragraphs(r)), n),
    "if_capital_words": lambda r, n: _at_least(capital_words(r), n),
    "if_keywords": lambda r, words: sum(keyword_count(r, w) >= 1 for w in words) / len(words),
    "if_keyword_count": lambda r, word, n: _at_least(keyword_count(r, word), n),
    "if_bullets": lambda r, n: _exact_count(bullets(r), n),
    "if_numbered": lambda r, n: _ordered_count(numbered(r), n),
    "if_sections": lambda r, n: _ordered_count(sections(r), n),
    "if_highlights": lambda r, n: _at_least(highlights(r), n),
    "if_placeholders": lambda r, n: _at_least(placeholders(r), n),
}  # fmt: skip


def graded(checker: str, response: str, args: dict[str, Any]) -> float:
    """The oracle's credit in [0, 1] for one instruction: graded for counts, else pass / fail."""
    if checker in _GRADED:
        return float(_GRADED[checker](response, **args))
    return float(CHECKS[checker](response, **args))


# -------------------------------------------------------------------------------- implicit ones
# Requirements every task carries that no prompt clause and no seed criterion states (the
# verifier checks them; a rubric-writing method can discover them from the library).

_PRAISE = re.compile(
    r"^\W*(what a (great|good|wonderful|fantastic) (question|topic)|(great|excellent|good|"
    r"wonderful|fantastic) (question|topic|idea))\b",
    re.I,
)
_CLAIM = re.compile(
    r"\b(i (have|'ve) (followed|met|satisfied) (all|every)( of)? (the |your )?"
    r"(instructions?|requirements?|constraints?|rules?)|all (the )?(instructions|requirements|"
    r"constraints|rules) (are|were|have been) (met|followed|satisfied)|as (you )?requested,? "
    r"(every|all))",
    re.I,
)


def opens_with_praise(response: str) -> bool:
    return bool(_PRAISE.search(response))


def claims_compliance(response: str) -> bool:
    return bool(_CLAIM.search(response))


def on_topic(response: str, keywords: Sequence[str]) -> bool:
    """At least one of the topic's keywords appears (a whole word, any case)."""
    return any(keyword_count(response, w) >= 1 for w in keywords)


def repeats(response: str) -> bool:
    """A sentence of three or more words written twice (case and spacing aside): the loop a
    small model falls into, and no instruction of this domain asks for."""
    seen: set[str] = set()
    for s in sentences(response):
        key = " ".join(w.lower() for w in words(s))
        if len(key.split()) < 3:
            continue
        if key in seen:
            return True
        seen.add(key)
    return False


IMPLICIT_CHECKS: dict[str, Callable[..., bool]] = {
    "if_on_topic": lambda r, keywords: on_topic(r, keywords),
    "if_no_repeats": lambda r: bool(words(r)) and not repeats(r),
    "if_plain": lambda r: not opens_with_praise(r) and not claims_compliance(r),
}

# The seed rubric's saturated and spurious cues.
CUE_CHECKS: dict[str, Callable[..., bool]] = {
    "if_non_empty": lambda r: bool(words(r)),
    "if_praise": lambda r: opens_with_praise(r),
    "if_claim": lambda r: claims_compliance(r),
}


def check(checker: str, response: str, args: dict[str, Any]) -> bool:
    """One checker of this module by name (no registry lookup)."""
    if checker == "if_all_of":
        return _all_of(response, **args)
    for table in (CHECKS, IMPLICIT_CHECKS, CUE_CHECKS):
        if checker in table:
            return bool(table[checker](response, **args))
    raise KeyError(f"no instruct checker {checker!r}")


def _all_of(response: str, parts: Sequence[tuple[str, Any]]) -> bool:
    return all(check(name, response, dict(args)) for name, args in parts)


def _register(name: str, fn: Callable[..., bool]) -> None:
    def checker(response: str, *, task: Task | None = None, **args: Any) -> bool:
        return bool(fn(response, **args))

    checker.__name__ = name
    checker.__wrapped__ = fn  # its arguments, for checkers.argument_problem at load time
    CHECKERS.register(name)(checker)


for _table in (CHECKS, IMPLICIT_CHECKS, CUE_CHECKS):
    for _name, _fn in _table.items():
        _register(_name, _fn)
_register("if_all_of", _all_of)
