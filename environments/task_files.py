"""Bring your own tasks: JSONL or Parquet files, local or `s3://`, checked row by row.

Schema (one task per row; docs/task-families.md has examples):

    task_id   str, unique, non-empty
    family    "arithmetic" | "search" | "code"
    level     int, one of the family's levels
    prompt    str, non-empty, at most 4,000 characters, no protocol tags
    answer    str (arithmetic: a number; search: the answer text; code: a reference solution)
    split     str, optional (default "train")
    metadata  JSON object or its text, optional; code tasks need {"entry_point", "tests"},
              search tasks may give {"aliases": [...]} (other accepted answers)

Every bad row is reported with the file, the row number (1-based, as an editor shows lines) and
the field, and nothing is trained on until the whole file is clean.
"""

from __future__ import annotations

import json
import math

import fsspec
import pandas as pd

from configs.schema import FAMILY_LEVELS
from environments.base import TASK_COLUMNS
from verifiers.protocol import TAGS

MAX_PROMPT_CHARS = 4000
REQUIRED = ("task_id", "family", "level", "prompt", "answer")
MAX_REPORTED = 20


class TaskFileError(ValueError):
    """A task file that cannot be used; the message lists every problem found (up to 20)."""


def read_rows(path: str) -> list[dict]:
    """Rows of a .jsonl / .json lines or .parquet file (local path or URL fsspec understands)."""
    fs, local = fsspec.core.url_to_fs(str(path))
    if not fs.exists(local):
        raise FileNotFoundError(f"task file {path} does not exist")
    if str(path).endswith(".parquet"):
        with fs.open(local, "rb") as f:
            return pd.read_parquet(f).to_dict("records")
    with fs.open(local, "rb") as f:
        raw = f.read()
    rows, problems = [], []
    for number, line in enumerate(raw.split(b"\n"), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line.decode("utf-8"))
        except UnicodeDecodeError as exc:
            problems.append(f"row {number}: not UTF-8 (byte {exc.start})")
            continue
        except json.JSONDecodeError as exc:
            problems.append(f"row {number}: not valid JSON ({exc.msg})")
            continue
        if not isinstance(row, dict):
            problems.append(f"row {number}: expected a JSON object, got {type(row).__name__}")
            continue
        rows.append({**row, "_row": number})
    if problems:
        raise TaskFileError(_summary(path, problems))
    return rows


def row_problems(row: dict, number: int) -> list[str]:
    problems = [f"row {number}: missing field {name!r}" for name in REQUIRED if row.get(name) is None]
    if problems:
        return problems
    out = []
    if not isinstance(row["task_id"], str) or not row["task_id"].strip():
        out.append(f"row {number}: field 'task_id': expected a non-empty string, got {row['task_id']!r}")
    family = row["family"]
    if family not in FAMILY_LEVELS:
        out.append(f"row {number}: field 'family': {family!r} is not one of {sorted(FAMILY_LEVELS)}")
    level = row["level"]
    if isinstance(level, bool) or not isinstance(level, (int, float)) or not math.isfinite(level) or int(level) != level:
        out.append(f"row {number}: field 'level': expected an integer, got {level!r}")
    elif family in FAMILY_LEVELS and int(level) not in FAMILY_LEVELS[family]:
        out.append(f"row {number}: field 'level': {int(level)} is not a level of {family} {FAMILY_LEVELS[family]}")
    prompt = row["prompt"]
    if not isinstance(prompt, str) or not prompt.strip():
        out.append(f"row {number}: field 'prompt': expected non-empty text, got {str(prompt)[:40]!r}")
    elif len(prompt) > MAX_PROMPT_CHARS:
        out.append(f"row {number}: field 'prompt': {len(prompt)} characters > {MAX_PROMPT_CHARS}")
    elif any(tag in prompt for tag in TAGS):  # a prompt must not speak for the policy or the tools
        out.append(f"row {number}: field 'prompt': contains a protocol tag ({next(t for t in TAGS if t in prompt)})")
    if not isinstance(row["answer"], (str, int)) or isinstance(row["answer"], bool):
        out.append(f"row {number}: field 'answer': expected text or an integer, got {row['answer']!r}")
    metadata = row.get("metadata")
    meta: object = {}
    if not _missing(metadata):
        try:
            meta = json.loads(metadata) if isinstance(metadata, str) else metadata
        except json.JSONDecodeError as exc:
            out.append(f"row {number}: field 'metadata': not valid JSON ({exc.msg})")
        if not isinstance(meta, dict):
            out.append(f"row {number}: field 'metadata': expected a JSON object")
            meta = {}
    if family == "code" and isinstance(meta, dict):
        from verifiers.code_tests import code_task_check  # noqa: PLC0415 (only code rows need it)

        reason = code_task_check({**meta, **row}) if {"entry_point", "tests"} <= set(meta) else "needs metadata entry_point and tests"
        if reason:
            out.append(f"row {number}: field 'metadata': {reason}")
    return out


def load_task_file(path: str, default_split: str = "train") -> pd.DataFrame:
    """The file's tasks as a frame with `TASK_COLUMNS`, or TaskFileError naming every bad row."""
    rows = read_rows(path)
    problems, seen = [], {}
    for i, row in enumerate(rows, start=1):
        number = row.get("_row", i)
        problems += row_problems(row, number)
        task_id = row.get("task_id")
        if isinstance(task_id, str) and task_id in seen:
            problems.append(f"row {number}: field 'task_id': {task_id!r} repeats row {seen[task_id]}")
        elif isinstance(task_id, str):
            seen[task_id] = number
    if problems:
        raise TaskFileError(_summary(path, problems))
    if not rows:
        raise TaskFileError(f"{path}: no tasks")
    return pd.DataFrame([{
        "task_id": r["task_id"], "family": r["family"], "level": int(r["level"]), "prompt": r["prompt"], "answer": str(r["answer"]),
        "split": r.get("split") or default_split,
        "metadata": r["metadata"] if isinstance(r.get("metadata"), str) else json.dumps(r.get("metadata") or {}),
    } for r in rows], columns=list(TASK_COLUMNS))


def _missing(value) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def _summary(path, problems: list[str]) -> str:
    shown = problems[:MAX_REPORTED]
    more = f"\n  ... and {len(problems) - MAX_REPORTED} more" if len(problems) > MAX_REPORTED else ""
    return f"task file {path} has {len(problems)} problem(s):\n  " + "\n  ".join(shown) + more

