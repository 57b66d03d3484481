"""Arithmetic that needs a code interpreter (ReTool style): tasks and an imperfect teacher.

Levels (a 0.5M-parameter model can learn 1-2 in its head, not 3-4):
  1. 2-digit + 1-digit            47+8
  2. 2-digit +/- 2-digit          83-29
  3. 2-digit x 2-digit            47*38
  4. 3-digit x 2-digit +/- 2-digit 347*52-18

The teacher is imperfect the way human demonstrators are: with probability `p_direct` it answers
from memory. That is right on easy levels and wrong on hard ones (a plausible near-miss), so
SFT copies a mixed policy whose ceiling RL can pass by learning *when* to call the tool.
"""

from __future__ import annotations

import hashlib
import json
import random
from typing import Iterable, Iterator

from environments.base import TASK_COLUMNS, Demonstration, Step, draw_distinct_tasks  # noqa: F401  (TASK_COLUMNS re-exported)
from verifiers.protocol import ANSWER_CLOSE, ANSWER_OPEN, CODE_CLOSE, CODE_OPEN

FAMILY = "arithmetic"
LEVELS = (1, 2, 3, 4)


def _digits(rng: random.Random, n: int) -> int:
    return rng.randint(10 ** (n - 1), 10**n - 1)


def make_expression(level: int, rng: random.Random) -> str:
    if level == 1:
        return f"{_digits(rng, 2)}+{_digits(rng, 1)}"
    if level == 2:
        return f"{_digits(rng, 2)}{rng.choice('+-')}{_digits(rng, 2)}"
    if level == 3:
        return f"{_digits(rng, 2)}*{_digits(rng, 2)}"
    if level == 4:
        return f"{_digits(rng, 3)}*{_digits(rng, 2)}{rng.choice('+-')}{_digits(rng, 2)}"
    raise ValueError(f"unknown arithmetic level {level}; levels are {LEVELS}")


def evaluate(expression: str) -> int:
    """Gold answer. Expressions are generated here (digits and + - * only), so eval is safe;
    the check keeps it that way if someone feeds other text."""
    if not set(expression) <= set("0123456789+-*"):
        raise ValueError(f"not an arithmetic expression: {expression!r}")
    return int(eval(expression, {"__builtins__": {}}, {}))  # noqa: S307 - validated above


def prompt_for(expression: str) -> str:
    return f"compute {expression}\n"


def task_id_for(expression: str) -> str:
    """Content-addressed ids: the same expression is the same task in every split, which is
    what makes decontamination a set difference."""
    return f"{FAMILY}-{hashlib.sha1(expression.encode()).hexdigest()[:12]}"


def task_record(expression: str, level: int, split: str) -> dict:
    return {
        "task_id": task_id_for(expression),
        "family": FAMILY,
        "level": level,
        "prompt": prompt_for(expression),
        "answer": str(evaluate(expression)),
        "split": split,
        "metadata": json.dumps({"expression": expression}),
    }


def generate_tasks(
    n: int,
    *,
    seed: int,
    split: str,
    levels: Iterable[int] = LEVELS,
    level_weights: Iterable[float] | None = None,
    exclude_ids: frozenset[str] = frozenset(),
) -> list[dict]:
    """`n` distinct tasks not in `exclude_ids`. Raises if the space is too small to fill."""
    rng = random.Random(seed)
    return draw_distinct_tasks(n, rng=rng, split=split, levels=levels, level_weights=level_weights, exclude_ids=exclude_ids,
                               make=lambda level: task_record(make_expression(level, rng), level, split))


# ---------------------------------------------------------------- teacher
# The observation of a tool step comes from the real tool when the trajectory is built
# (training.trajectories), so SFT sees exactly what rollouts will see.


def near_miss(value: int, rng: random.Random) -> int:
    """A plausible wrong mental answer: one digit off (never the right value)."""
    text = list(str(abs(value)))
    pos = rng.randrange(len(text))
    choices = [d for d in "0123456789" if d != text[pos] and not (pos == 0 and d == "0" and len(text) > 1)]
    text[pos] = rng.choice(choices)
    return int("".join(text)) * (-1 if value < 0 else 1)


def demonstrate(task: dict, *, rng: random.Random, p_direct: float, hard_levels: Iterable[int]) -> Demonstration:
    expression = json.loads(task["metadata"])["expression"]
    gold = int(task["answer"])
    if rng.random() >= p_direct:
        return Demonstration(task["task_id"], "tool", (Step("code", f"print({expression})"),), str(gold), True)
    if task["level"] in set(hard_levels):
        return Demonstration(task["task_id"], "direct", (), str(near_miss(gold, rng)), False)
    return Demonstration(task["task_id"], "direct", (), str(gold), True)


def demonstrations(tasks: list[dict], n: int, *, seed: int, p_direct: float, hard_levels: Iterable[int]) -> Iterator[Demonstration]:
    rng = random.Random(seed)
    hard = tuple(hard_levels)
    for i in range(n):
        yield demonstrate(tasks[i % len(tasks)], rng=rng, p_direct=p_direct, hard_levels=hard)


def code_turn(code: str) -> str:
    return f"{CODE_OPEN}{code}{CODE_CLOSE}"


def answer_turn(answer: str) -> str:
    return f"{ANSWER_OPEN}{answer}{ANSWER_CLOSE}"
