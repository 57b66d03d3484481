"""The code family: task rows, hidden tests that separate right from near-miss and hard-coded
solutions (run in the real sandbox), and the imperfect teacher."""

import hashlib
import json
import random
import re

import pytest

from environments.base import TASK_COLUMNS, task_view
from environments.code import (
    GENERATED_LEVELS,
    compile_solution,
    demonstrate,
    demonstrations,
    generate_tasks,
    near_misses,
    visible_cases,
)
from verifiers.base import run_verifier
from verifiers.code_tests import code_precheck, code_task_check, parse_tests

ALL_GROUPS = ["fail_to_pass", "held_out"]
TEMPLATES = {  # level -> what every prompt and reference body look like
    1: (r"write f\(x\) that returns x (plus|minus|times) \d+\n", r"x[-+*]\d+"),
    2: (r"write f\(x\) that returns x( (plus|minus|times) \d+){2}\n", r"x[-+*]\d+[-+*]\d+"),
    3: (
        r"write f\(x\) that returns x \w+ \d+ if x is (even|odd|above \d+|below \d+) else x \w+ \d+\n",
        r"x[-+*]\d+ if x(%2==[01]|[<>]\d+) else x[-+*]\d+",
    ),
    4: (r"write f\(xs\) that returns (the \w+ of xs|each x in xs|the xs) \w+ \d+\n", r".*\bxs\b.*"),
}


@pytest.fixture(scope="module")
def tasks():
    return generate_tasks(400, seed=3, split="train")


def sample_per_level(tasks, k=20):
    return [t for level in GENERATED_LEVELS for t in [t for t in tasks if t["level"] == level][:k]]


def score(candidate, task, groups, sandbox):
    return run_verifier("unit_tests", candidate, task_view(task), {"groups": groups}, sandbox=sandbox).score


def test_columns_ids_and_determinism(tasks):
    assert all(tuple(t) == TASK_COLUMNS and t["family"] == "code" and t["split"] == "train" for t in tasks)
    assert len({t["task_id"] for t in tasks}) == len(tasks)
    assert all(t["task_id"] == "code-" + hashlib.sha1(t["prompt"].encode()).hexdigest()[:12] for t in tasks)
    assert generate_tasks(400, seed=3, split="train") == tasks
    bench = generate_tasks(400, seed=3, split="bench")  # same specs, same ids and tests, another split
    assert [(b["task_id"], b["metadata"]) for b in bench] == [(t["task_id"], t["metadata"]) for t in tasks]


def test_levels_follow_their_templates(tasks):
    assert {t["level"] for t in tasks} == set(GENERATED_LEVELS)
    for t in tasks:
        prompt_re, body_re = TEMPLATES[t["level"]]
        header, body = t["answer"].split("\n    return ")
        assert re.fullmatch(prompt_re, t["prompt"]), t["prompt"]
        assert re.fullmatch(body_re, body) and header in ("def f(x):", "def f(xs):")
        assert " " not in re.sub(r" (if|else|for|in) ", "", body), body  # one style: no spaces around operators
    assert {t["level"] for t in generate_tasks(30, seed=1, split="train", levels=[2, 4])} == {2, 4}


def test_exclude_ids_and_too_small_space(tasks):
    excluded = frozenset(t["task_id"] for t in tasks)
    fresh = generate_tasks(400, seed=3, split="train", exclude_ids=excluded)
    assert not excluded & {t["task_id"] for t in fresh}
    with pytest.raises(ValueError, match="could only generate"):
        generate_tasks(3000, seed=0, split="train", levels=[1])  # level 1 holds 2994 tasks


def test_tests_parse_and_hide_nothing_in_the_prompt(tasks):
    for t in tasks:
        view = task_view(t)
        groups = [c.group for c in parse_tests(view["tests"])]
        assert view["entry_point"] == "f" and groups.count("fail_to_pass") == 3 and groups.count("held_out") == 3
        assert code_task_check(view, groups=ALL_GROUPS) is None
        assert code_precheck(t["answer"], view) is None
        assert not re.search(r"\[|\d+ ==", t["prompt"])  # no test input or expected value in the prompt


def test_reference_passes_and_near_misses_fail_in_the_sandbox(tasks, sandbox):
    for t in sample_per_level(tasks):
        assert score(t["answer"], t, ALL_GROUPS, sandbox) == 1.0, t["answer"]
        wrong = near_misses(t)
        assert wrong and t["answer"] not in wrong
        for miss in wrong[:2]:
            assert score(miss, t, ["fail_to_pass"], sandbox) < 1.0, miss


def test_hard_coded_answers_fail_the_held_out_group(tasks, sandbox):
    for t in sample_per_level(tasks, 10):
        arg = "xs" if "f(xs)" in t["answer"] else "x"
        cases = "".join(f"    if {arg} == {x!r}:\n        return {y!r}\n" for x, y in visible_cases(t))
        cheat = f"def f({arg}):\n{cases}    return {visible_cases(t)[0][1]!r}"
        assert score(cheat, t, ["fail_to_pass"], sandbox) == 1.0
        assert score(cheat, t, ["held_out"], sandbox) < 1.0, cheat


def test_teacher_test_step_runs_and_prints_the_expected_value(tasks, sandbox):
    sample = sample_per_level(tasks, 5)
    demos = [demonstrate(t, rng=random.Random(0), p_direct=0.0, hard_levels=(3, 4)) for t in sample]
    results = sandbox.run_many([d.steps[0].args for d in demos])
    for t, d, r in zip(sample, demos, results):
        assert d.strategy == "test" and d.correct and d.answer == t["answer"] and d.steps[0].tool == "code"
        assert d.steps[0].args.startswith(t["answer"] + "\nprint(f(")
        assert r.ok and r.stdout == d.notes["expected_output"]
        example = json.loads(d.steps[0].args.rsplit("print(f(", 1)[1][:-2])
        assert r.stdout == f"{compile_solution(t['answer'])(example)}\n"


def test_strategy_mix_and_honest_correctness(tasks):
    demos = list(demonstrations(tasks, 2000, seed=0, p_direct=0.3, hard_levels=(3, 4)))
    by_id = {t["task_id"]: t for t in tasks}
    direct = [d for d in demos if d.strategy == "direct"]
    assert abs(len(direct) / len(demos) - 0.3) < 0.04
    assert all(d.strategy == "test" and len(d.steps) == 1 and d.correct for d in demos if d not in direct)
    for d in direct:
        task = by_id[d.task_id]
        assert not d.steps
        assert d.correct == (task["level"] in (1, 2)) == (d.answer == task["answer"])
        fn = compile_solution(d.answer)
        assert d.correct == all(fn(x) == y for x, y in visible_cases(task))
