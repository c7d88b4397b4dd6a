"""Reading a dataset's files into numbered rows, for ``rubric_rl.rubrics.datasets``.

``resolve_files`` lists a path's data files (a directory: those of a split); ``iter_rows``
yields (1-based row number, row) pairs from .jsonl / .jsonl.gz / .json / .parquet. Every failure
is a ``DatasetError`` naming the file and, where rows are numbered, the row (the line of a
JSONL file), with the byte offset where that says more: a non-UTF-8 byte (that line, skippable
in lenient mode), a gzip file named ``.jsonl``, a truncated ``.gz`` or parquet file, a file that
cannot be opened (the whole file).
"""

from __future__ import annotations

import gzip
import json
import os
import re
import zlib
from collections.abc import Iterator, Sequence
from typing import Any

EXTENSIONS = (".jsonl", ".jsonl.gz", ".json", ".parquet")
_GZIP_MAGIC = b"\x1f\x8b"


class DatasetError(ValueError):
    """A malformed row or an unreadable file: names the file, the 1-based row number (None:
    the whole file) and the field ("<json>", "<bytes>", "<file>", "<parquet>" for read errors)."""

    def __init__(self, file: str, row: int | None, field: str, message: str):
        self.file, self.row, self.field, self.message = file, row, field, message
        where = f"{file}:{row}" if row is not None else file
        super().__init__(f"{where}: field {field!r}: {message}")


def _split_tokens(relpath: str) -> set[str]:
    """The words of a path inside a dataset directory: "data/train-00000-of-00001.parquet" ->
    {data, train, 00000, of, 00001, parquet}. A split matches a whole word, never a substring
    ("test" is not in "latest.jsonl", "train" not in "constrained.jsonl")."""
    return set(re.split(r"[^a-z0-9]+", relpath.lower())) - {""}


def resolve_files(path: str, split: str | Sequence[str] | None) -> list[str]:
    if os.path.isdir(path):
        names = (split,) if isinstance(split, str) else tuple(split or ())
        files = sorted(
            os.path.join(root, f)
            for root, _, fs in os.walk(path)
            for f in fs
            if f.endswith(EXTENSIONS)
            and (
                not names
                or _split_tokens(os.path.relpath(os.path.join(root, f), path)) & set(names)
            )
        )
        if not files:
            raise DatasetError(
                path, None, "split", f"no {EXTENSIONS} files for split={split!r} in the directory"
            )
        return files
    if not os.path.exists(path):
        raise FileNotFoundError(f"dataset file not found: {path}")
    return [path]


def _open_binary(path: str):
    """The file's bytes (decompressed for .gz). A gzip file under another name is an error, not
    the UnicodeDecodeError its compressed bytes would give."""
    try:
        if path.endswith(".gz"):
            return gzip.open(path, "rb")
        f = open(path, "rb")
    except OSError as e:
        raise DatasetError(path, None, "<file>", f"cannot open: {e.strerror or e}") from None
    if f.read(2) == _GZIP_MAGIC:
        f.close()
        raise DatasetError(
            path, None, "<file>", f"is gzip-compressed but not named .gz; rename it to {path}.gz"
        )
    f.seek(0)
    return f


def _bad_byte(e: UnicodeDecodeError, data: bytes) -> tuple[int, int]:
    """(the offending byte, its index in ``data``): utf-8-sig reports positions after the BOM."""
    return e.object[e.start], e.start + len(data) - len(e.object)


def _decode(path: str, number: int, offset: int, data: bytes) -> str:
    """``data`` (line ``number``, starting at byte ``offset`` of the file, decompressed for .gz)
    as UTF-8; a BOM on the first line is dropped."""
    try:
        return data.decode("utf-8-sig" if number == 1 else "utf-8")
    except UnicodeDecodeError as e:
        byte, at = _bad_byte(e, data)
        where = "of the decompressed file" if path.endswith(".gz") else "of the file"
        raise DatasetError(
            path,
            number,
            "<bytes>",
            f"not UTF-8 text: byte 0x{byte:02x} at column {at + 1} (byte offset {offset + at} "
            f"{where}); re-encode the file as UTF-8",
        ) from None


def _read_failure(path: str, number: int, e: Exception) -> DatasetError:
    return DatasetError(
        path, number, "<file>", f"read failed at this line ({type(e).__name__}: {e}); truncated?"
    )


def _iter_lines(path: str) -> Iterator[tuple[int, str | DatasetError]]:
    """(1-based line number, text) of a JSONL file; a line that is not UTF-8 comes as a
    DatasetError (skippable in lenient mode); a file that cannot be read raises one."""
    number, offset = 0, 0
    with _open_binary(path) as f:
        lines = iter(f)
        while True:
            try:
                data = next(lines)
            except StopIteration:
                return
            except (OSError, EOFError, zlib.error) as e:  # truncated / corrupt gzip stream
                raise _read_failure(path, number + 1, e) from None
            number += 1
            try:
                yield number, _decode(path, number, offset, data)
            except DatasetError as e:
                yield number, e
            offset += len(data)


def _iter_parquet(path: str) -> Iterator[tuple[int, Any]]:
    import pyarrow  # heavy import, only for parquet
    import pyarrow.parquet as pq

    n = 0
    try:
        batches = pq.ParquetFile(path).iter_batches(batch_size=1024)
    except (OSError, pyarrow.ArrowException) as e:
        raise DatasetError(path, None, "<parquet>", f"not a readable parquet file: {e}") from None
    while True:
        try:
            batch = next(batches)
        except StopIteration:
            return
        except (OSError, pyarrow.ArrowException) as e:
            raise DatasetError(
                path, n + 1, "<parquet>", f"cannot read the rows from here on: {e}"
            ) from None
        for row in batch.to_pylist():
            n += 1
            yield n, row


def _iter_json(path: str) -> Iterator[tuple[int, Any]] | None:
    """The rows of a .json file holding one list (or {"data": [...]}); None when it holds several
    JSON values (read as JSONL instead)."""
    with _open_binary(path) as f:
        try:
            data = f.read()
        except (OSError, EOFError, zlib.error) as e:
            raise _read_failure(path, 1, e) from None
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        byte, at = _bad_byte(e, data)
        raise DatasetError(
            path,
            data.count(b"\n", 0, at) + 1,
            "<bytes>",
            f"not UTF-8 text: byte 0x{byte:02x} at byte offset {at}; re-encode the file as UTF-8",
        ) from None
    try:
        rows = json.loads(text)
    except json.JSONDecodeError as e:
        if "Extra data" in str(e):
            return None  # several JSON values: JSONL
        raise DatasetError(path, e.lineno, "<json>", f"invalid JSON: {e.msg}") from None
    if isinstance(rows, dict) and isinstance(rows.get("data"), list):
        rows = rows["data"]
    if not isinstance(rows, list):
        raise DatasetError(path, None, "<json>", "expected a JSON list of rows")
    return enumerate(rows, start=1)


def iter_rows(path: str) -> Iterator[tuple[int, Any]]:
    """(1-based row number, row) pairs; a row that is not valid JSON or not UTF-8 comes as a
    DatasetError. A file that cannot be read (missing, compressed under another name, truncated,
    not parquet) raises a DatasetError naming it and, where rows are numbered, the row."""
    if path.endswith(".parquet"):
        yield from _iter_parquet(path)
        return
    if path.endswith(".json"):
        rows = _iter_json(path)
        if rows is not None:
            yield from rows
            return
    for n, line in _iter_lines(path):
        if isinstance(line, DatasetError):
            yield n, line
            continue
        if not line.strip():
            continue
        try:
            yield n, json.loads(line)
        except json.JSONDecodeError as e:
            yield n, DatasetError(path, n, "<json>", f"invalid JSON line: {e.msg}")
