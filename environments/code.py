"""Write a tiny Python function from a templated description, scored by hidden unit tests.

Levels (each task is `def f(x)` or `def f(xs)` with a one-line body, in one canonical style):
  1. one operation            x plus 7                               x+7
  2. two operations           x times 3 minus 2                      x*3-2
  3. a condition              x plus 4 if x is even else x minus 1   x+4 if x%2==0 else x-1
  4. a list aggregate         the count of xs above 3                len([x for x in xs if x>3])
  5. a problem from a file    HumanEval, MBPP (environments/problem_files.py); never generated

Two-operation tasks only pair operations whose left-to-right reading is Python's precedence
(no "x plus 3 times 2"), so the English is never ambiguous. Where a task has a single operation
constant (level 1, level 4's aggregates and maps) it runs to 3 digits, for thousands of tasks.

Each task has `fail_to_pass` tests (the behaviour asked for; on a boundary input when there is a
comparison) and `held_out` tests on other inputs that catch candidates hard-coding answers.
Inputs come from an rng seeded by the prompt, so the same task has the same tests in every split.

The teacher mirrors arithmetic's: with probability `p_direct` it writes the function at once,
which is right on easy levels and a near miss (a constant off by one, `>` for `>=`, even for odd)
on hard ones; otherwise it first runs the function on an example input, then answers.
"""

from __future__ import annotations

import ast
import hashlib
import json
import random
import re
from typing import Callable, Iterable, Iterator

from pydantic import BaseModel, ConfigDict, Field

from configs.schema import VerifierSpec
from environments.base import TASK_COLUMNS, Demonstration, Step, draw_distinct_tasks
from environments.family import TaskFamily, register_family
from verifiers.code_tests import code_task_check
from verifiers.protocol import ANSWER_CLOSE, ANSWER_OPEN, CODE_CLOSE, CODE_OPEN

FAMILY = "code"
LEVELS = (1, 2, 3, 4, 5)
GENERATED_LEVELS = (1, 2, 3, 4)
FILE_LEVEL = 5  # function-completion problems read from a file: their teacher answers with the reference
ENTRY_POINT = "f"
N_VISIBLE, N_HELD_OUT = 3, 3
EXAMPLE_INPUTS = {"x": 3, "xs": [1, 2, 3]}  # the teacher's test step prints f(example)
OPS = {"+": "plus", "-": "minus", "*": "times"}
# (op1, op2) pairs where "x op1 a op2 b" read left to right is what Python computes.
OP_PAIRS = [(a, b) for a in OPS for b in OPS if b != "*" or a == "*"]
CONDITIONS = {"even": "x%2==0", "odd": "x%2==1", "above": "x>{k}", "below": "x<{k}"}
AGGREGATES = {"sum": "sum(xs)", "max": "max(xs)", "min": "min(xs)", "length": "len(xs)"}
FILTERS = {
    "count": "len([x for x in xs if x{c}{k}])",
    "sum": "sum([x for x in xs if x{c}{k}])",
    "list": "[x for x in xs if x{c}{k}]",
}
SCALARS, LIST_VALUES, LIST_LENGTHS = range(0, 31), range(0, 100), (3, 4, 5)
MAX_TRIES_PER_LEVEL = 20
_SAFE_BUILTINS = {"sum": sum, "len": len, "max": max, "min": min}


def _term(rng: random.Random, high: int = 99) -> tuple[str, str]:
    """One operation with a constant: (prompt words, code)."""
    op, k = rng.choice(list(OPS)), rng.randint(2, high)
    return f"{OPS[op]} {k}", f"{op}{k}"


def make_spec(level: int, rng: random.Random) -> tuple[str, str, str]:
    """(argument, description, body) for one random task of `level`."""
    if level == 1:
        words, code = _term(rng, 999)
        return "x", f"x {words}", f"x{code}"
    if level == 2:
        (a, b), ka, kb = rng.choice(OP_PAIRS), rng.randint(2, 99), rng.randint(2, 99)
        return "x", f"x {OPS[a]} {ka} {OPS[b]} {kb}", f"x{a}{ka}{b}{kb}"
    if level == 3:
        (w1, c1), (w2, c2), cond, k = _term(rng), _term(rng), rng.choice(list(CONDITIONS)), rng.randint(3, 27)
        if c1 == c2:  # the condition would not matter
            return make_spec(level, rng)
        test = CONDITIONS[cond].format(k=k)
        words = f"is {cond} {k}" if "{k}" in CONDITIONS[cond] else f"is {cond}"
        return "x", f"x {w1} if x {words} else x {w2}", f"x{c1} if {test} else x{c2}"
    if level == 4:
        kind = rng.choice(["aggregate", "each", "filter"])
        if kind == "aggregate":
            name, (words, code) = rng.choice(list(AGGREGATES)), _term(rng, 999)
            return "xs", f"the {name} of xs {words}", f"{AGGREGATES[name]}{code}"
        if kind == "each":
            words, code = _term(rng, 999)
            return "xs", f"each x in xs {words}", f"[x{code} for x in xs]"
        name, cmp, k = rng.choice(list(FILTERS)), rng.choice(["above", "below"]), rng.randint(5, 94)
        lead = "the xs" if name == "list" else f"the {name} of xs"
        return "xs", f"{lead} {cmp} {k}", FILTERS[name].format(c=">" if cmp == "above" else "<", k=k)
    raise ValueError(f"unknown code level {level}; levels are {LEVELS}")


def solution_for(arg: str, body: str) -> str:
    return f"def {ENTRY_POINT}({arg}):\n    return {body}"


def compile_solution(source: str) -> Callable:
    """The function a solution defines. Only for source generated here (templates and their
    mutations), with nothing but the four builtins the templates use."""
    namespace: dict = {}
    exec(source, {"__builtins__": _SAFE_BUILTINS}, namespace)  # noqa: S102 - generated here
    return namespace[ENTRY_POINT]


def _draw_input(arg: str, rng: random.Random):
    if arg == "x":
        return rng.choice(SCALARS)
    return [rng.choice(LIST_VALUES) for _ in range(rng.choice(LIST_LENGTHS))]


def _informative(fn: Callable, inputs: list, body: str) -> bool:
    """Outputs not all equal (a constant cannot pass) and both branches of a condition taken."""
    if len({repr(fn(v)) for v in inputs}) < 2:
        return False
    branch = re.search(r" if (.*) else ", body)
    if branch is None:
        return True
    condition = compile_solution(solution_for("x", branch.group(1)))
    return len({condition(v) for v in inputs}) == 2


def draw_inputs(arg: str, body: str, rng: random.Random) -> tuple[list, list]:
    """(visible, held_out) inputs, distinct, each group informative. A comparison's constant is
    itself a visible input (or a visible list's element), so `>` vs `>=` is caught."""
    fn, boundary = compile_solution(solution_for(arg, body)), re.search(r"[<>](\d+)", body)
    for _ in range(1000):
        visible = [_draw_input(arg, rng) for _ in range(N_VISIBLE)]
        if boundary:
            k = int(boundary.group(1))
            visible[0] = k if arg == "x" else visible[0] + [k]
        held_out = [_draw_input(arg, rng) for _ in range(N_HELD_OUT)]
        if (
            len({repr(v) for v in visible + held_out}) == N_VISIBLE + N_HELD_OUT
            and _informative(fn, visible, body)
            and _informative(fn, held_out, body)
        ):
            return visible, held_out
    raise ValueError(f"no informative test inputs for {body!r}")


def task_id_for(prompt: str) -> str:
    """Content-addressed ids: the same description is the same task in every split."""
    return f"{FAMILY}-{hashlib.sha1(prompt.encode()).hexdigest()[:12]}"


def prompt_for(arg: str, description: str) -> str:
    return f"write {ENTRY_POINT}({arg}) that returns {description}\n"


def task_record(arg: str, description: str, body: str, level: int, split: str) -> dict:
    prompt = prompt_for(arg, description)
    source, seed = solution_for(arg, body), int(hashlib.sha1(prompt.encode()).hexdigest()[:16], 16)
    fn, (visible, held_out) = compile_solution(source), draw_inputs(arg, body, random.Random(seed))
    tests = [
        {"name": f"{group}_{i}", "code": f"assert {ENTRY_POINT}({v!r}) == {fn(v)!r}", "group": group}
        for group, values in (("fail_to_pass", visible), ("held_out", held_out))
        for i, v in enumerate(values)
    ]
    record = {
        "task_id": task_id_for(prompt),
        "family": FAMILY,
        "level": level,
        "prompt": prompt,
        "answer": source,
        "split": split,
        "metadata": json.dumps({"entry_point": ENTRY_POINT, "tests": tests}),
    }
    return {column: record[column] for column in TASK_COLUMNS}


def generate_tasks(
    n: int,
    *,
    seed: int,
    split: str,
    levels: Iterable[int] = GENERATED_LEVELS,
    level_weights: Iterable[float] | None = None,
    exclude_ids: frozenset[str] = frozenset(),
) -> list[dict]:
    """`n` distinct tasks not in `exclude_ids`. Raises if the space is too small to fill. Retries
    within the drawn level, so levels keep their weights until one runs out of tasks."""
    rng = random.Random(seed)

    def make(level: int) -> dict:
        arg, description, body = make_spec(level, rng)
        return task_record(arg, description, body, level, split)

    return draw_distinct_tasks(
        n,
        rng=rng,
        split=split,
        levels=levels,
        level_weights=level_weights,
        exclude_ids=exclude_ids,
        make=make,
        tries_per_level=MAX_TRIES_PER_LEVEL,
    )


# ---------------------------------------------------------------- teacher


def visible_cases(task: dict) -> list[tuple[object, object]]:
    """(input, expected) of the fail_to_pass tests, read back from their asserts."""
    tests = json.loads(task["metadata"])["tests"]
    pattern = re.compile(rf"assert {ENTRY_POINT}\((.*)\) == (.*)")
    return [
        tuple(ast.literal_eval(part) for part in pattern.fullmatch(t["code"]).groups())
        for t in tests
        if t["group"] == "fail_to_pass"
    ]


def near_misses(task: dict) -> list[str]:
    """Plausible wrong solutions that fail at least one fail_to_pass test: one constant off by
    one, `>`/`<` made inclusive, or even and odd swapped."""
    source, cases = task["answer"], visible_cases(task)
    header, body = source.split("return ", 1)
    variants = [
        body[: m.start()] + str(int(m.group()) + d) + body[m.end() :]
        for m in re.finditer(r"(?<=[-+*<>])\d+", body)
        for d in (-1, 1)
    ]
    variants += [
        body.replace(a, b, 1)
        for a, b in ((">", ">="), ("<", "<="), ("%2==0", "%2==1"), ("%2==1", "%2==0"))
        if a in body
    ]
    wrong = []
    for variant in dict.fromkeys(variants):
        fn = compile_solution(header + "return " + variant)
        if any(fn(x) != expected for x, expected in cases):
            wrong.append(header + "return " + variant)
    return wrong


def demonstrate(task: dict, *, rng: random.Random, p_direct: float, hard_levels: Iterable[int]) -> Demonstration:
    source = task["answer"]
    if task["level"] == FILE_LEVEL:  # a problem file's reference solution, written out
        return Demonstration(task["task_id"], "reference", (), source, bool(source.strip()))
    if rng.random() >= p_direct:
        example = EXAMPLE_INPUTS["xs" if f"{ENTRY_POINT}(xs)" in source else "x"]
        step = Step("code", f"{source}\nprint({ENTRY_POINT}({example!r}))")
        expected = f"{compile_solution(source)(example)}\n"
        return Demonstration(task["task_id"], "test", (step,), source, True, {"expected_output": expected})
    wrong = near_misses(task) if task["level"] in set(hard_levels) else []
    if wrong:
        return Demonstration(task["task_id"], "direct", (), rng.choice(wrong), False)
    return Demonstration(task["task_id"], "direct", (), source, True)


def demonstrations(
    tasks: list[dict], n: int, *, seed: int, p_direct: float, hard_levels: Iterable[int]
) -> Iterator[Demonstration]:
    rng = random.Random(seed)
    hard = tuple(hard_levels)
    for i in range(n):
        yield demonstrate(tasks[i % len(tasks)], rng=rng, p_direct=p_direct, hard_levels=hard)


# ---------------------------------------------------------------- the family


class CodeTeacher(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    p_direct: float = Field(0.5, ge=0.0, le=1.0, description="Probability of answering without running the code first.")
    hard_levels: tuple[int, ...] = Field((3, 4), description="Levels where an untested answer is a near miss.")


class Code(TaskFamily):
    name, levels, default_levels, tools = FAMILY, LEVELS, GENERATED_LEVELS, ("code",)
    file_levels = (FILE_LEVEL,)
    default_verifier = VerifierSpec(name="unit_tests", params={"mode": "fraction"})
    teacher_params = CodeTeacher

    def generate_tasks(self, n, *, seed, split, levels, level_weights, exclude_ids, kb):
        return generate_tasks(
            n, seed=seed, split=split, levels=levels, level_weights=level_weights, exclude_ids=exclude_ids
        )

    def demonstrations(self, tasks, n, *, seed, teacher, kb):
        return demonstrations(tasks, n, seed=seed, p_direct=teacher.p_direct, hard_levels=teacher.hard_levels)

    def detour_steps(self, task, kind, rng, kb):
        # negative: a near miss run on the example; alternatives: a near miss, or the reference on another input
        if task["level"] == FILE_LEVEL:
            return ()
        wrong = near_misses(task)
        example = EXAMPLE_INPUTS["xs" if f"{ENTRY_POINT}(xs)" in task["answer"] else "x"]
        if wrong:
            return (Step("code", f"{rng.choice(wrong)}\nprint({ENTRY_POINT}({example!r}))", trained=False),)
        other = [4, 5, 6] if isinstance(example, list) else 7
        return (
            (Step("code", f"{task['answer']}\nprint({ENTRY_POINT}({other!r}))", trained=False),)
            if kind == "alternatives"
            else ()
        )

    def tokenizer_texts(self, task):
        answer = str(task["answer"])
        yield task["prompt"] + f"{CODE_OPEN}{answer}\nprint(f(3)){CODE_CLOSE}{ANSWER_OPEN}{answer}{ANSWER_CLOSE}"

    def row_problem(self, task):
        if not {"entry_point", "tests"} <= set(task):
            return "needs metadata entry_point and tests"
        return code_task_check(task)


register_family(Code())
