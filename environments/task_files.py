"""Bring your own tasks: JSONL or Parquet files, local or `s3://`, checked row by row.

Schema (one task per row; docs/task-families.md has examples):

    task_id   str, unique, non-empty
    family    a registered task family: "arithmetic" | "search" | "code" | one of your own
    level     int, one of the family's levels
    prompt    str, non-empty, at most 4,000 characters, no protocol tags
    answer    str (arithmetic: a number; search: the answer text; code: a reference solution)
    split     "train" | "benchmark", optional (default "train"); any other value is refused
    metadata  JSON object or its text, optional; the family checks what it needs
              (`TaskFamily.row_problem`): code tasks need {"entry_point", "tests"}, search tasks
              may give {"aliases": [...]} (other accepted answers)

Every bad row is reported with the file, the row number (1-based, as an editor shows lines) and
the field, and nothing is trained on until the whole file is clean.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import math

import fsspec
import pandas as pd

from environments import bounded_json
from environments.base import TASK_COLUMNS
from environments.bounded_json import JSONProblem
from environments.family import FAMILIES, get_family
from verifiers.protocol import TAGS

MAX_PROMPT_CHARS = 4000
REQUIRED = ("task_id", "family", "level", "prompt", "answer")
SPLITS = ("train", "benchmark")  # a row's `split`: trained on, or held out into the benchmark
_missing = bounded_json.is_missing
MAX_REPORTED = 20
# A task file is read whole into memory: past this (512 MiB, ~250k code tasks) it is refused before
# it is, and so is a gzipped file that inflates past it, or a device such as /dev/zero that never ends.
MAX_FILE_BYTES = 512 * 2**20


class TaskFileError(ValueError):
    """A task file that cannot be used; the message lists every problem found (up to 20)."""


def read_rows(path: str, what: str = "task file") -> list[dict]:
    """Rows of a JSON-lines (.jsonl, or gzipped .jsonl.gz) or .parquet file, local or any URL
    fsspec understands; each row gets `_row`, its 1-based line (Parquet: its 1-based row), and
    holds plain JSON values (environments/bounded_json.py: bounded lines, nesting and integers,
    no lone surrogates; Parquet arrays and structs as lists and dicts). Every row outside the
    bounds or not a JSON object is reported (file, row, field) in one error. `what` names the
    file in messages."""
    fs, local = fsspec.core.url_to_fs(str(path))
    if not fs.exists(local):
        raise FileNotFoundError(f"{what} {path} does not exist")
    if fs.isdir(local):
        raise TaskFileError(f"{what} {path} is a directory: give the .jsonl, .jsonl.gz or .parquet file itself")
    with fs.open(local, "rb") as f:
        raw = _read_capped(f, path, what)
    if str(path).endswith(".parquet"):
        return _parquet_rows(raw, path, what)
    if str(path).endswith(".gz"):
        try:
            with gzip.GzipFile(fileobj=io.BytesIO(raw)) as f:
                raw = _read_capped(f, path, f"{what} (gunzipped)")
        except (OSError, EOFError) as exc:
            raise TaskFileError(f"{what} {path} is not a readable gzip file ({exc})") from None
    rows, problems = [], []
    for number, line in enumerate(raw.split(b"\n"), start=1):
        if not line.strip():
            continue
        try:
            row = bounded_json.loads(line)
        except UnicodeDecodeError as exc:
            problems.append(f"row {number}: not UTF-8 (byte {exc.start})")
            continue
        except json.JSONDecodeError as exc:
            problems.append(f"row {number}: not valid JSON ({exc.msg}, column {exc.colno})")
            continue
        except JSONProblem as exc:
            problems.append(json_problem(number, exc))
            continue
        if not isinstance(row, dict):
            problems.append(f"row {number}: expected a JSON object, got {type(row).__name__}")
            continue
        rows.append({**row, "_row": number})
    if problems:
        raise TaskFileError(_summary(path, problems, what))
    return rows


def _parquet_rows(raw: bytes, path: str, what: str) -> list[dict]:
    """A Parquet file's rows as plain values (`bounded_json.plain`), or TaskFileError."""
    try:
        records = pd.read_parquet(io.BytesIO(raw)).to_dict("records")
    except Exception as exc:  # noqa: BLE001 — pyarrow raises many kinds for bytes that are not Parquet
        raise TaskFileError(f"{what} {path} is not a readable Parquet file ({type(exc).__name__}: {exc})") from None
    rows, problems = [], []
    for number, record in enumerate(records, start=1):
        try:
            row = {
                str(k): v if bounded_json.is_missing(v) else bounded_json.plain(v, (str(k),)) for k, v in record.items()
            }
        except JSONProblem as exc:
            problems.append(json_problem(number, exc))
            continue
        rows.append({**row, "_row": number})
    if problems:
        raise TaskFileError(_summary(path, problems, what))
    return rows


def json_problem(number: int, exc: JSONProblem, field: str | None = None) -> str:
    """`row N: field 'f': <reason> (at f.a[0]…)` for a value outside the bounds; `field`: the
    row's field whose text `exc` came from (metadata given as JSON text)."""
    where = ((field,) if field else ()) + exc.where
    top = field or exc.field
    at = bounded_json.path_text(where)
    detail = f" (at {at})" if at and at != top else ""
    return f"row {number}: field {top!r}: {exc.reason}{detail}" if top else f"row {number}: {exc.reason}{detail}"


def _read_capped(f, path: str, what: str, limit: int | None = None) -> bytes:
    """At most `limit` bytes of `f` (default MAX_FILE_BYTES), or TaskFileError if there are more:
    a file is never read past the cap, whatever its size claims to be."""
    limit = MAX_FILE_BYTES if limit is None else limit
    raw = f.read(limit + 1)
    if len(raw) > limit:
        raise TaskFileError(
            f"{what} {path} is larger than {limit:,} bytes ({limit / 2**20:.0f} MiB), the most a task file may hold: "
            "split it into several files or give fewer tasks"
        )
    return raw


def split_problem(row: dict, number: int) -> str | None:
    """`split` is one of SPLITS or absent: any other value (`test`, `Benchmark`, 7) is refused,
    never silently trained on."""
    split = row.get("split")
    if _missing(split) or (isinstance(split, str) and split in SPLITS):
        return None
    return f"row {number}: field 'split': {split!r:.60} is not one of {', '.join(SPLITS)} (absent: {SPLITS[0]})"


def row_split(row: dict, default_split: str) -> str:
    return default_split if _missing(row.get("split")) else row["split"]


def row_problems(row: dict, number: int) -> list[str]:
    problems = [f"row {number}: missing field {name!r}" for name in REQUIRED if row.get(name) is None]
    if problems:
        return problems
    out = []
    if not isinstance(row["task_id"], str) or not row["task_id"].strip():
        out.append(f"row {number}: field 'task_id': expected a non-empty string, got {row['task_id']!r}")
    family = row["family"]
    known = isinstance(family, str) and family in FAMILIES
    if not known:
        out.append(f"row {number}: field 'family': {family!r} is not one of {FAMILIES.names()}")
    level = row["level"]
    if (
        isinstance(level, bool)
        or not isinstance(level, (int, float))
        or not math.isfinite(level)
        or int(level) != level
    ):
        out.append(f"row {number}: field 'level': expected an integer, got {level!r}")
    elif known and int(level) not in get_family(family).levels:
        out.append(f"row {number}: field 'level': {int(level)} is not a level of {family} {get_family(family).levels}")
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
            meta = bounded_json.loads(metadata) if isinstance(metadata, str) else metadata
        except json.JSONDecodeError as exc:
            out.append(f"row {number}: field 'metadata': not valid JSON ({exc.msg})")
            meta = {}
        except JSONProblem as exc:
            out.append(json_problem(number, exc, "metadata"))
            meta = {}
        if not isinstance(meta, dict):
            out.append(f"row {number}: field 'metadata': expected a JSON object")
            meta = {}
    if known and isinstance(meta, dict):
        reason = get_family(family).row_problem({**meta, **row})  # as task_view merges them
        if reason:
            out.append(f"row {number}: field 'metadata': {reason}")
    return out


def question_row(row: dict) -> tuple[dict, list[str]]:
    """A question-file row (Search-R1 / NQ: question + golden_answers; HotpotQA: question + answer)
    as a search task row: the first golden answer is the answer, the others its aliases (exact
    match and F1 take the best over all of them). `id` / `_id`, `level` (hops) and `split` are
    kept when given; the task id is otherwise the question's hash."""
    key = "golden_answers" if "golden_answers" in row else "answer"
    number, golden = row["_row"], row.get(key)
    if isinstance(golden, str):
        golden = [golden]
    elif hasattr(golden, "tolist"):  # Parquet gives arrays
        golden = golden.tolist()
    problems = []
    if not isinstance(row.get("question"), str) or not row["question"].strip():
        problems.append(f"row {number}: field 'question': expected non-empty text, got {row.get('question')!r:.60}")
    if not isinstance(golden, (list, tuple)) or not golden or not all(isinstance(a, str) and a.strip() for a in golden):
        problems.append(
            f"row {number}: field {key!r}: expected a non-empty list of non-empty strings, got {golden!r:.60}"
        )
    if problems:
        return {}, problems
    question = row["question"].strip()
    given = row.get("id", row.get("_id"))
    task_id = (
        str(given)
        if given is not None and str(given).strip()
        else "question-" + hashlib.sha1(question.encode()).hexdigest()[:12]
    )
    return {
        "task_id": task_id,
        "family": "search",
        "level": row.get("level", 1),
        "prompt": question + "\n",
        "answer": golden[0],
        "split": row.get("split"),
        "metadata": {"aliases": golden[1:], "question_file": True},
        "_row": number,
    }, []


def load_task_file(path: str, default_split: str = "train", only_split: str | None = None) -> pd.DataFrame:
    """The file's tasks as a frame with `TASK_COLUMNS`, or TaskFileError naming every bad row.
    Rows in the question-file shape (`question_row`) become search tasks. `only_split`: just the
    rows of that split, checked (the benchmark's held-out rows; the rest is checked by the asset
    that trains on them), possibly none."""
    rows = read_rows(path)
    problems = [bad for row in rows if (bad := split_problem(row, row["_row"]))]  # every row's, before any is held out
    if only_split is not None:
        rows = [r for r in rows if not split_problem(r, r["_row"]) and row_split(r, default_split) == only_split]
    seen = {}
    for i, row in enumerate(rows, start=1):
        if "question" in row and "family" not in row:
            row, bad = question_row(row)
            rows[i - 1] = row
            if bad:
                problems += bad
                continue
        number = row.get("_row", i)
        problems += row_problems(row, number)
        task_id = row.get("task_id")
        if isinstance(task_id, str) and task_id in seen:
            problems.append(f"row {number}: field 'task_id': {task_id!r} repeats row {seen[task_id]}")
        elif isinstance(task_id, str):
            seen[task_id] = number
    if problems:
        raise TaskFileError(_summary(path, problems))
    if not rows and only_split is None:
        raise TaskFileError(f"{path}: no tasks")
    return pd.DataFrame(
        [
            {
                "task_id": r["task_id"],
                "family": r["family"],
                "level": int(r["level"]),
                "prompt": r["prompt"],
                "answer": str(r["answer"]),
                "split": row_split(r, default_split),
                "metadata": r["metadata"]
                if isinstance(r.get("metadata"), str)
                else json.dumps({} if _missing(r.get("metadata")) else r["metadata"]),
            }
            for r in rows
        ],
        columns=list(TASK_COLUMNS),
    )


def _summary(path, problems: list[str], what: str = "task file") -> str:
    shown = problems[:MAX_REPORTED]
    more = f"\n  ... and {len(problems) - MAX_REPORTED} more" if len(problems) > MAX_REPORTED else ""
    return f"{what} {path} has {len(problems)} problem(s):\n  " + "\n  ".join(shown) + more
