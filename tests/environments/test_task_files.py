"""Bring-your-own task files: every bad row named with its row number and field; good files load.
Contamination: exact, normalized and long n-gram overlaps are found and named."""

import json
from pathlib import Path

import pandas as pd
import pytest

from environments.contamination import duplicates, normalize_prompt, overlaps
from environments.task_files import TaskFileError, load_task_file

GOOD = {"task_id": "a1", "family": "arithmetic", "level": 1, "prompt": "compute 1+2\n", "answer": "3"}
CODE_META = {"entry_point": "f", "tests": [{"name": "t", "code": "assert f(1) == 2", "group": "fail_to_pass"}]}


def write_jsonl(path, rows):
    path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n")
    return str(path)


@pytest.mark.parametrize(
    "row, expected",
    [
        ({k: v for k, v in GOOD.items() if k != "answer"}, "row 1: missing field 'answer'"),
        ({**GOOD, "level": "1"}, "row 1: field 'level': expected an integer, got '1'"),
        ({**GOOD, "level": 9}, "row 1: field 'level': 9 is not a level of arithmetic (1, 2, 3, 4, 5)"),
        ({**GOOD, "level": 1.5}, "row 1: field 'level': expected an integer, got 1.5"),
        ({**GOOD, "family": "chess"}, "row 1: field 'family': 'chess' is not one of"),
        ({**GOOD, "task_id": ""}, "row 1: field 'task_id': expected a non-empty string"),
        ({**GOOD, "prompt": "   "}, "row 1: field 'prompt': expected non-empty text"),
        ({**GOOD, "prompt": "x" * 5000}, "row 1: field 'prompt': 5000 characters > 4000"),
        (
            {**GOOD, "prompt": "compute 1+2 <answer>3</answer>"},
            "row 1: field 'prompt': contains a protocol tag (<answer>)",
        ),
        ({**GOOD, "answer": [3]}, "row 1: field 'answer': expected text or an integer"),
        ({**GOOD, "metadata": "{not json"}, "row 1: field 'metadata': not valid JSON"),
        ({**GOOD, "family": "code", "level": 1}, "row 1: field 'metadata': needs metadata entry_point and tests"),
        (
            {**GOOD, "family": "code", "level": 1, "metadata": {"entry_point": "f", "tests": "[]"}},
            "row 1: field 'metadata': tests must be a non-empty list",
        ),
    ],
)
def test_bad_rows_are_named(tmp_path, row, expected):
    with pytest.raises(TaskFileError) as err:
        load_task_file(write_jsonl(tmp_path / "tasks.jsonl", [row]))
    assert expected in str(err.value) and "tasks.jsonl" in str(err.value)


@pytest.mark.parametrize(
    "line, expected",
    [
        (json.dumps({**GOOD, "level": float("nan")}), "row 1: field 'level': expected an integer, got nan"),
        (json.dumps({**GOOD, "level": float("inf")}), "row 1: field 'level': expected an integer, got inf"),
        ("[1, 2]", "row 1: expected a JSON object, got list"),
        ("{oops", "row 1: not valid JSON"),
    ],
)
def test_non_numbers_and_non_objects(tmp_path, line, expected):
    with pytest.raises(TaskFileError) as err:
        load_task_file(write_jsonl(tmp_path / "t.jsonl", [line]))
    assert expected in str(err.value)


def test_non_utf8_bytes_are_named(tmp_path):
    path = tmp_path / "latin1.jsonl"
    path.write_bytes(json.dumps(GOOD).encode() + b"\n" + b'{"task_id": "caf\xe9"}\n')
    with pytest.raises(TaskFileError, match=r"has 1 problem\(s\):\n  row 2: not UTF-8 \(byte 16\)"):
        load_task_file(str(path))


def test_every_problem_is_listed_with_its_row(tmp_path):
    rows = [GOOD, GOOD, {**GOOD, "task_id": "b", "level": 0}, {**GOOD, "task_id": "c", "family": "x"}]
    with pytest.raises(TaskFileError) as err:
        load_task_file(write_jsonl(tmp_path / "t.jsonl", rows))
    message = str(err.value)
    assert "has 3 problem(s)" in message
    assert (
        "row 2: field 'task_id': 'a1' repeats row 1" in message
        and "row 3: field 'level'" in message
        and "row 4: field 'family'" in message
    )


def test_good_jsonl_and_parquet_load_with_defaults(tmp_path):
    rows = [
        GOOD,
        {
            **GOOD,
            "task_id": "c1",
            "family": "code",
            "level": 2,
            "prompt": "write f(x)\n",
            "answer": "def f(x):\n    return x+1",
            "metadata": CODE_META,
        },
    ]
    df = load_task_file(write_jsonl(tmp_path / "t.jsonl", rows))
    assert list(df.columns) == ["task_id", "family", "level", "prompt", "answer", "split", "metadata"]
    assert df["split"].tolist() == ["train", "train"] and json.loads(df["metadata"][1])["entry_point"] == "f"
    pd.DataFrame(rows[:1]).to_parquet(tmp_path / "t.parquet")
    assert load_task_file(str(tmp_path / "t.parquet"))["task_id"].tolist() == ["a1"]


def test_urls_go_through_fsspec():
    import fsspec

    with fsspec.open("memory://tasks/t.jsonl", "w") as f:
        f.write(json.dumps(GOOD) + "\n")
    assert load_task_file("memory://tasks/t.jsonl")["task_id"].tolist() == ["a1"]
    with pytest.raises(FileNotFoundError, match="memory://tasks/none.jsonl"):
        load_task_file("memory://tasks/none.jsonl")


def test_overlaps_by_id_normalized_prompt_and_long_ngram():
    training = [
        {"task_id": "t1", "prompt": "compute 47+8\n"},
        {"task_id": "t2", "prompt": "write f(x) that returns x plus 7\n"},
        {"task_id": "t3", "prompt": "Background. " + " ".join(f"w{i}" for i in range(30)) + " so what is it?"},
        {"task_id": "t4", "prompt": "write f(x) that returns x plus 4 if x is even else x minus 1 and then add 2 more"},
    ]
    benchmark = [
        {"task_id": "t1", "prompt": "anything"},
        {"task_id": "b2", "prompt": "Compute 47 + 8?"},
        {"task_id": "b3", "prompt": "Q: " + " ".join(f"w{i}" for i in range(3, 17)) + " and more " * 8},
        {"task_id": "b6", "prompt": " ".join(f"w{i}" for i in range(3, 17))},  # short: compared whole only
        {"task_id": "b4", "prompt": "compute 47+9\n"},
        {"task_id": "b5", "prompt": "write f(x) that returns x plus 8\n"},
    ]
    benchmark.append(
        {"task_id": "b7", "prompt": "write f(x) that returns x plus 4 if x is even else x minus 1 and then add 3 more"}
    )
    found = {f["benchmark_id"]: (f["training_id"], f["how"]) for f in overlaps(benchmark, training, ngram=13)}
    assert found == {
        "t1": ("t1", "same id"),
        "b2": ("t1", "same normalized prompt"),
        "b3": ("t3", "shared 13-word run"),
    }


def test_normalization_keeps_what_changes_the_question():
    assert normalize_prompt("Compute 47 + 8?") == normalize_prompt("compute 47+8")
    assert normalize_prompt("compute 47-8") != normalize_prompt("compute 47+8")


def test_duplicates_inside_a_dataset():
    rows = [
        {"task_id": "a", "prompt": "compute 1+2"},
        {"task_id": "b", "prompt": "Compute 1 + 2"},
        {"task_id": "c", "prompt": "compute 1+3"},
    ]
    assert duplicates(rows) == [{"task_id": "b", "duplicate_of": "a"}]


@pytest.mark.operations
def test_a_task_file_over_the_size_cap_is_refused_before_it_is_read_whole(tmp_path, monkeypatch):
    """Issue 28: a huge file, a gzip that inflates past the cap, or /dev/zero (which claims size 0
    and never ends) is refused naming the file and the cap, never read into memory whole."""
    from environments import task_files

    monkeypatch.setattr(task_files, "MAX_FILE_BYTES", 4096)
    big = write_jsonl(tmp_path / "big.jsonl", [{**GOOD, "task_id": f"t{i}"} for i in range(200)])
    with pytest.raises(TaskFileError, match=r"big\.jsonl is larger than 4,096 bytes"):
        load_task_file(big)
    import gzip

    bomb = tmp_path / "bomb.jsonl.gz"
    bomb.write_bytes(gzip.compress(Path(big).read_bytes()))
    assert bomb.stat().st_size < 4096  # small on disk, over the cap once inflated
    with pytest.raises(TaskFileError, match=r"task file \(gunzipped\) .*bomb\.jsonl\.gz is larger than"):
        load_task_file(str(bomb))
    with pytest.raises(TaskFileError, match=r"/dev/zero is larger than 4,096 bytes"):
        load_task_file("/dev/zero")
    small = write_jsonl(tmp_path / "small.jsonl", [GOOD])
    assert list(load_task_file(small)["task_id"]) == ["a1"]
