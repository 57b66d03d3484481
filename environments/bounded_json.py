"""Bounded parsing of the JSON and Parquet values in files from others (task, corpus, SFT and
problem files): whatever a row holds, the loader gets plain Python values or a `JSONProblem`
naming the field, never a RecursionError, an int-conversion ValueError or a string that cannot
be written back as UTF-8 later.

The bounds, checked before the value is built:

    MAX_LINE_BYTES   a JSON line (one row) is at most 4 MiB
    MAX_DEPTH        arrays and objects nest at most 64 deep (a code task's metadata needs 4,
                     an SFT trajectory's tool call 5); counted on the raw text before `json.loads`
                     recurses (CPython's decoder recurses once per level and stops at ~1,000
                     with a RecursionError)
    integers         at most `sys.get_int_max_str_digits()` digits (4,300), Python's own limit
    strings          no lone UTF-16 surrogates (`"\\ud800"` decodes to a str that no UTF-8
                     writer accepts)

    value = loads(text)              # JSONProblem(path, reason) on a bad one
    value = plain(parquet_value)     # numpy arrays -> lists, structs -> dicts, depth-checked
"""

from __future__ import annotations

import json
import math
import re
import sys
from typing import Any

import numpy as np

MAX_LINE_BYTES = 4 * 2**20
MAX_DEPTH = 64

_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)
_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"|[\[\]{}:,]|[^\s\[\]{}:,"]+', re.DOTALL)
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
_SURROGATE = re.compile("[\ud800-\udfff]")
_STEP = np.zeros(256, dtype=np.int8)
_STEP[[ord("["), ord("{")]] = 1
_STEP[[ord("]"), ord("}")]] = -1


class JSONProblem(ValueError):
    """A value outside the bounds. `where` locates it in the document (keys and indexes,
    () for the whole value); `reason` says what is wrong."""

    def __init__(self, where: tuple[str | int, ...], reason: str):
        self.where, self.reason = tuple(where), reason
        super().__init__(f"{self.path or 'the value'}: {reason}")

    @property
    def field(self) -> str:
        """The top-level field the problem is in ("" when it is the whole value or an array's)."""
        return _name(self.where[0]) if self.where and isinstance(self.where[0], str) else ""

    @property
    def path(self) -> str:
        """`metadata.tests[0].code`, its first levels only (a path 64 deep helps nobody)."""
        return path_text(self.where)


def path_text(where: tuple[str | int, ...], shown: int = 6) -> str:
    parts = [f"[{key}]" if isinstance(key, int) else f".{_name(key)}" for key in where]
    return "".join(parts[:shown]).lstrip(".") + ("…" if len(parts) > shown else "")


def loads(text: str | bytes, *, max_depth: int = MAX_DEPTH) -> Any:
    """`json.loads(text)` within the bounds above, or JSONProblem; json.JSONDecodeError (also a
    ValueError) for text that is not JSON, UnicodeDecodeError for bytes that are not UTF-8."""
    given_text = isinstance(text, str)
    raw = text.encode("utf-8", "surrogatepass") if given_text else text
    if len(raw) > MAX_LINE_BYTES:
        raise JSONProblem((), f"{len(raw):,} bytes of JSON, more than the {MAX_LINE_BYTES:,} allowed")
    text = text if given_text else raw.decode("utf-8")
    if raw.count(b"[") + raw.count(b"{") > max_depth and _depth(raw) > max_depth:
        where = _locate(text, lambda depth, token: depth > max_depth)
        if where is not None:  # else the brackets do not match: json.loads says where
            raise JSONProblem(where, f"nested more than {max_depth} levels deep")
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        raise
    except RecursionError:  # not reached within the depth bound; kept as the last line of defence
        raise JSONProblem((), f"nested more than {max_depth} levels deep") from None
    except ValueError:  # int("9" * 5000): Python's integer string conversion limit
        limit = sys.get_int_max_str_digits()
        where = _locate(text, lambda depth, token: token.lstrip("-").isdigit() and len(token.lstrip("-")) > limit)
        raise JSONProblem(where or (), f"an integer of more than {limit:,} digits") from None
    if _SURROGATE_ESCAPE.search(text) or (given_text and _SURROGATE.search(text)):
        _check_surrogates(value, ())
    return value


def plain(value: Any, where: tuple[str | int, ...] = (), *, max_depth: int = MAX_DEPTH) -> Any:
    """A Parquet cell as JSON's plain values: numpy arrays and lists as lists, structs and maps as
    dicts (a struct's null fields dropped: Parquet gives every row of a struct column every field
    any row has), numpy scalars as Python ones, NaN kept (pandas' missing value). `where` starts
    with the column's name. JSONProblem past `max_depth`, on a string JSON could not hold, or on
    a value no JSON file could hold (bytes, a timestamp) inside a list or struct; a column's own
    value of another type is left to the field's check."""
    if len(where) > max_depth:
        raise JSONProblem(where[:-1], f"nested more than {max_depth} levels deep")
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, str):
        _check_surrogates(value, where)
        return value
    if isinstance(value, dict):
        return {str(k): plain(v, (*where, str(k)), max_depth=max_depth) for k, v in value.items() if v is not None}
    if isinstance(value, (np.ndarray, list, tuple)):
        items = value.tolist() if isinstance(value, np.ndarray) and value.dtype != object else list(value)
        if items and all(isinstance(i, tuple) and len(i) == 2 for i in items):
            return plain(dict(items), where, max_depth=max_depth)  # a Parquet map: (key, value) pairs
        return [plain(v, (*where, i), max_depth=max_depth) for i, v in enumerate(items)]
    if len(where) > 1 and not isinstance(value, (bool, int, float)):  # inside a list or struct: JSON's values only
        raise JSONProblem(where, f"a {type(value).__name__} value, which a JSON file could not hold")
    return value


def is_missing(value: Any) -> bool:
    """None, or pandas' NaN for a missing cell."""
    return value is None or (isinstance(value, float) and math.isnan(value))


def _name(key: Any) -> str:
    """A key as a message may print it (a lone surrogate escaped: printing it would raise)."""
    return str(key).encode("utf-8", "backslashreplace").decode("utf-8")


def _depth(raw: bytes) -> int:
    """The deepest nesting of arrays and objects outside strings (numpy, so a 4 MiB line costs
    milliseconds)."""
    brackets = np.frombuffer(_STRING.sub(b'""', raw), dtype=np.uint8)
    return int(np.cumsum(_STEP[brackets], dtype=np.int64).max(initial=0))


def _locate(text: str, found) -> tuple[str | int, ...] | None:
    """Where (keys and indexes) the first token for which `found(depth, token)` holds is, walking
    the text as JSON tokens; only for a value already known to be bad, so it may be slow."""
    stack: list[list] = []  # [kind, key or index, expecting a key]
    for match in _TOKEN.finditer(text):
        token = match.group()
        if token in ("[", "{"):
            stack.append([token, 0 if token == "[" else "", token == "{"])
            if found(len(stack), token):
                return tuple(key for _, key, _ in stack[:-1])
        elif token in ("]", "}"):
            if stack:
                stack.pop()
        elif token == ",":
            if stack and stack[-1][0] == "[":
                stack[-1][1] += 1
            elif stack:
                stack[-1][2] = True
        elif token == ":":
            if stack:
                stack[-1][2] = False
        elif stack and stack[-1][0] == "{" and stack[-1][2] and token.startswith('"'):
            try:
                stack[-1][1] = json.loads(token)
            except ValueError:
                stack[-1][1] = token.strip('"')
        elif found(len(stack), token):
            return tuple(key for _, key, _ in stack)
    return None


def _check_surrogates(value: Any, where: tuple[str | int, ...]) -> None:
    """JSONProblem at the first string (or key) holding a lone surrogate."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise JSONProblem(
                where, f"a lone UTF-16 surrogate (\\u{ord(value[exc.start]):04x}) at character {exc.start + 1}"
            ) from None
    elif isinstance(value, dict):
        for key, item in value.items():
            _check_surrogates(key, (*where, key))
            _check_surrogates(item, (*where, key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            _check_surrogates(item, (*where, i))
