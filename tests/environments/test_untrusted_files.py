"""Files from others (task, corpus, SFT and problem files) under the bounded reader
(environments/bounded_json.py): every input that used to crash with a raw exception (RecursionError,
the int-conversion ValueError, a UnicodeEncodeError later, IsADirectoryError, ArrowInvalid) is a
TaskFileError naming the file, the row and the field, for every loader it applies to."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from environments.bounded_json import MAX_DEPTH, MAX_LINE_BYTES
from environments.corpus import load_corpus
from environments.problem_files import load_problems
from environments.sft_files import load_sft_file
from environments.task_files import TaskFileError, load_task_file

pytestmark = pytest.mark.integrity

DEEP = "[" * 100_000 + "]" * 100_000  # CPython's decoder recursed once per level: RecursionError
BIG_INT = "9" * 5000  # past sys.get_int_max_str_digits() (4,300): ValueError from int()
SURROGATE = '"a lone \\ud800 surrogate"'  # valid JSON; the str cannot be written as UTF-8 later
DEEP_LIST: list = [1]
for _ in range(100):
    DEEP_LIST = [DEEP_LIST]

TASK = {"task_id": "a1", "family": "arithmetic", "level": 1, "prompt": "compute 1+2\n", "answer": "3"}
DOCUMENT = {"id": "d1", "title": "Ada", "text": "Ada Lovelace wrote the first program."}
TRAJECTORY = {
    "messages": [{"role": "user", "content": "What is 2+2?"}, {"role": "assistant", "content": "4"}],
}
PROBLEM = {
    "task_id": "p/1",
    "prompt": "def f(x):\n",
    "entry_point": "f",
    "test": "def check(candidate):\n    assert candidate(1) == 1\n",
    "canonical_solution": "    return x\n",
}
LOADERS = {
    "task": (load_task_file, TASK, "task file"),
    "corpus": (load_corpus, DOCUMENT, "corpus file"),
    "sft": (load_sft_file, TRAJECTORY, "SFT file"),
    "problem": (load_problems, PROBLEM, "problem file"),
}


def _row_with(good: dict, field: str, raw_value: str) -> str:
    """`good` as a JSON line with `field` set to the JSON text `raw_value`, written as is."""
    return json.dumps({**good, field: "PLACEHOLDER"}).replace('"PLACEHOLDER"', raw_value)


def _load(kind: str, tmp_path, lines: list[str]):
    load, good, _ = LOADERS[kind]
    path = tmp_path / f"{kind}.jsonl"
    path.write_text("\n".join([json.dumps({**good, "task_id": "first", "id": "first"}), *lines]) + "\n")
    return load(str(path))


# (loader, field the bad value goes in, the bad JSON text, what the message says about it)
BAD_VALUES = [
    *[
        (kind, field, DEEP, f"nested more than {MAX_DEPTH} levels deep")
        for kind, field in (("task", "metadata"), ("corpus", "text"), ("sft", "messages"), ("problem", "test"))
    ],
    *[
        (kind, field, BIG_INT, "an integer of more than 4,300 digits")
        for kind, field in (("task", "answer"), ("corpus", "id"), ("sft", "level"), ("problem", "task_id"))
    ],
    *[
        (kind, field, SURROGATE, "a lone UTF-16 surrogate (\\ud800)")
        for kind, field in (("task", "prompt"), ("corpus", "text"), ("sft", "task_id"), ("problem", "prompt"))
    ],
    # the same, deeper inside the row: the message names the row's field and where in it
    ("task", "metadata", '{"entry_point": "f", "tests": ' + DEEP + "}", "(at metadata.tests[0][0]"),
    ("task", "metadata", '{"n": ' + BIG_INT + "}", "(at metadata.n)"),
    ("sft", "messages", '[{"role": "user", "content": ' + SURROGATE + "}]", "(at messages[0].content)"),
]


@pytest.mark.parametrize("kind, field, raw_value, expected", BAD_VALUES, ids=lambda v: str(v)[:20])
def test_a_bad_value_is_named_by_file_row_and_field_in_every_loader(tmp_path, kind, field, raw_value, expected):
    with pytest.raises(TaskFileError) as err:
        _load(kind, tmp_path, [_row_with(LOADERS[kind][1], field, raw_value)])
    message = str(err.value)
    assert f"{LOADERS[kind][2]} {tmp_path / kind}.jsonl" in message, message
    assert f"row 2: field {field!r}: " in message and expected in message, message[:400]
    message.encode("utf-8")  # the message itself can be printed


@pytest.mark.parametrize("kind", LOADERS)
def test_a_line_past_the_byte_bound_is_named_by_row(tmp_path, kind):
    line = _row_with(LOADERS[kind][1], "padding", json.dumps("x" * MAX_LINE_BYTES))
    with pytest.raises(TaskFileError, match=r"row 2: [\d,]+ bytes of JSON, more than the 4,194,304 allowed"):
        _load(kind, tmp_path, [line])


@pytest.mark.parametrize("kind", LOADERS)
def test_a_directory_or_garbage_parquet_is_named_not_a_raw_exception(tmp_path, kind):
    load, _, what = LOADERS[kind]
    folder = tmp_path / "tasks.jsonl"
    folder.mkdir()
    with pytest.raises(TaskFileError, match=f"{what} {folder} is a directory"):
        load(str(folder))
    garbage = tmp_path / "tasks.parquet"
    garbage.write_bytes(b"this is not parquet\n" * 50)
    with pytest.raises(TaskFileError, match=f"{what} {garbage} is not a readable Parquet file"):
        load(str(garbage))


def test_metadata_given_as_json_text_is_bounded_too(tmp_path):
    for text, expected in (
        (DEEP, "row 2: field 'metadata': nested more than 64 levels deep"),
        ('{"n": ' + BIG_INT + "}", "row 2: field 'metadata': an integer of more than 4,300 digits (at metadata.n)"),
    ):
        with pytest.raises(TaskFileError) as err:
            _load("task", tmp_path, [json.dumps({**TASK, "metadata": text})])
        assert expected in str(err.value), str(err.value)[:400]


def test_an_sft_tool_call_whose_arguments_nest_too_deep_is_named(tmp_path):
    call = {"type": "function", "function": {"name": "python", "arguments": DEEP}}
    row = {
        "messages": [
            {"role": "user", "content": "Compute 2+2."},
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "content": "4"},
            {"role": "assistant", "content": "4"},
        ]
    }
    with pytest.raises(TaskFileError) as err:
        _load("sft", tmp_path, [json.dumps(row)])
    assert "row 2: field 'messages[1].tool_calls[0].function.arguments': nested more than 64" in str(err.value)


@pytest.mark.parametrize("split", ["test", "Benchmark", 7, "", ["benchmark"]])
@pytest.mark.parametrize("form", ["jsonl", "parquet"])
def test_a_split_outside_train_and_benchmark_is_refused_not_trained(tmp_path, split, form):
    """Only the exact `benchmark` was held out: `test`, `Benchmark` or 7 were silently trained on,
    and a Parquet list crashed (the truth value of an array is ambiguous)."""
    rows = [TASK, {**TASK, "task_id": "a2", "split": split}]
    if form == "jsonl":
        path = tmp_path / "t.jsonl"
        path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    else:
        path = tmp_path / "t.parquet"
        first = "train" if isinstance(split, str) else split  # a Parquet column holds one type
        pd.DataFrame([{**TASK, "split": first}, rows[1]]).to_parquet(path)
    for only_split in (None, "benchmark"):  # the benchmark asset's read refuses it too, before anything trains
        with pytest.raises(TaskFileError) as err:
            load_task_file(str(path), only_split=only_split)
        message = str(err.value)
        assert str(path) in message and "row 2: field 'split': " in message, message
        assert repr(split) in message and "is not one of train, benchmark" in message, message


def test_train_benchmark_and_absent_splits_load(tmp_path):
    path = tmp_path / "t.jsonl"
    rows = [TASK, {**TASK, "task_id": "a2", "split": "benchmark"}, {**TASK, "task_id": "a3", "split": None}]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    assert load_task_file(str(path))["split"].tolist() == ["train", "benchmark", "train"]
    assert load_task_file(str(path), only_split="benchmark")["task_id"].tolist() == ["a2"]


def test_a_parquet_code_task_file_written_by_pandas_from_the_documented_jsonl_loads(tmp_path):
    """`pd.read_json(...).to_parquet(...)` writes metadata as a struct column (tests: an array of
    structs; rows of other families: null fields); it was refused as 'tests must be a non-empty list'."""
    code = {
        "task_id": "c1",
        "family": "code",
        "level": 2,
        "prompt": "write f(x)\n",
        "answer": "def f(x):\n    return x + 1\n",
        "split": "benchmark",
        "metadata": {
            "entry_point": "f",
            "tests": [
                {"name": "t1", "code": "assert f(1) == 2", "group": "fail_to_pass"},
                {"name": "t2", "code": "assert f(2) == 3", "group": "pass_to_pass"},
            ],
        },
    }
    jsonl = tmp_path / "tasks.jsonl"
    jsonl.write_text(json.dumps(code) + "\n" + json.dumps({**TASK, "metadata": {"note": "x"}}) + "\n")
    pd.read_json(jsonl, lines=True).to_parquet(tmp_path / "tasks.parquet")
    from_jsonl, from_parquet = load_task_file(str(jsonl)), load_task_file(str(tmp_path / "tasks.parquet"))
    assert from_parquet.drop(columns="metadata").equals(from_jsonl.drop(columns="metadata"))
    assert [json.loads(m) for m in from_parquet["metadata"]] == [json.loads(m) for m in from_jsonl["metadata"]]
    assert load_task_file(str(tmp_path / "tasks.parquet"), only_split="benchmark")["task_id"].tolist() == ["c1"]


def test_parquet_corpus_ids_and_sft_messages_are_plain_values(tmp_path):
    """numpy int64 ids were refused as 'expected a non-empty string or integer'; message structs
    carry every field any message has (tool_calls: None)."""
    pd.DataFrame([{**DOCUMENT, "id": 7}]).to_parquet(tmp_path / "c.parquet")
    assert load_corpus(str(tmp_path / "c.parquet"))[0]["doc_id"] == "7"
    call = {"type": "function", "function": {"name": "python", "arguments": '{"code": "print(2+2)"}'}}
    messages = [
        {"role": "user", "content": "Compute 2+2."},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "content": "4"},
        {"role": "assistant", "content": "4"},
    ]
    pd.DataFrame([{"messages": messages}]).to_parquet(tmp_path / "s.parquet")
    (trajectory,) = load_sft_file(str(tmp_path / "s.parquet"))
    assert [s.kind for s in trajectory.segments] == ["call", "observation", "answer"]


@pytest.mark.parametrize(
    "metadata, expected",
    [
        ({"deep": DEEP_LIST, "entry_point": "f"}, "nested more than 64 levels deep (at metadata.deep[0][0][0][0]…)"),
        (
            {"blob": b"\x00\x01", "entry_point": "f"},
            "a bytes value, which a JSON file could not hold (at metadata.blob)",
        ),
    ],
    ids=["deep", "bytes"],
)
def test_parquet_values_past_the_bounds_are_named_by_row_and_field(tmp_path, metadata, expected):
    path = tmp_path / "t.parquet"
    pd.DataFrame(
        [{**TASK, "metadata": {"entry_point": "g"}}, {**TASK, "task_id": "a2", "metadata": metadata}]
    ).to_parquet(path)
    with pytest.raises(TaskFileError) as err:
        load_task_file(str(path))
    assert f"task file {path} has 1 problem(s)" in str(err.value)
    assert f"row 2: field 'metadata': {expected}" in str(err.value), str(err.value)
