"""Arithmetic that needs a code interpreter (ReTool style): tasks and an imperfect teacher.

Levels (a 0.5M-parameter model can learn 1-2 in its head, not 3-4):
  1. 2-digit + 1-digit            47+8
  2. 2-digit +/- 2-digit          83-29
  3. 2-digit x 2-digit            47*38
  4. 3-digit x 2-digit +/- 2-digit 347*52-18
  5. a word problem               "The shop sells 47 boxes of pens on Monday and 38 boxes on Tuesday. ..."
     the model must build the expression ((47+38)*12) from the story, which also states 1-2
     distractor numbers. Levels 1-4 are solved by a switch (copy the expression into print());
     this one is not. Level 5 is opt-in (`DEFAULT_LEVELS`), so profiles that name no levels
     generate the same tasks as before it existed.

The teacher is imperfect the way human demonstrators are: with probability `p_direct` it answers
from memory. That is right on easy levels and wrong on hard ones and on word problems (a plausible
near-miss); with the tool it prints the expression (the story's, on level 5) and answers. So
SFT copies a mixed policy whose ceiling RL can pass by learning *when* to call the tool.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
from dataclasses import dataclass, field
from typing import Iterable, Iterator

from pydantic import BaseModel, ConfigDict, Field

from configs.schema import VerifierSpec
from environments.base import TASK_COLUMNS, Demonstration, Step, draw_distinct_tasks  # noqa: F401  (TASK_COLUMNS re-exported)
from environments.family import TaskFamily, register_family
from environments.tools import wrap_observation
from verifiers.protocol import ANSWER_CLOSE, ANSWER_OPEN, CODE_CLOSE, CODE_OPEN

FAMILY = "arithmetic"
LEVELS = (1, 2, 3, 4, 5)
DEFAULT_LEVELS = (1, 2, 3, 4)  # when no levels are named: the word problems (5) are opt-in
WORD_LEVEL = 5


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
    raise ValueError(
        f"no bare expression at arithmetic level {level}; levels 1-4 have one, {WORD_LEVEL} is make_word_problem"
    )


def evaluate(expression: str) -> int:
    """Gold answer. Expressions are generated here (digits, + - * and parentheses only), so eval
    is safe; the check keeps it that way if someone feeds other text."""
    if not set(expression) <= set("0123456789+-*()"):
        raise ValueError(f"not an arithmetic expression: {expression!r}")
    return int(eval(expression, {"__builtins__": {}}, {}))  # noqa: S307 - validated above


def prompt_for(expression: str) -> str:
    return f"compute {expression}\n"


def task_id_for(expression: str) -> str:
    """Content-addressed ids: the same expression is the same task in every split, which is
    what makes decontamination a set difference. On level 5 too: two stories that ask for the
    same expression (another template, name, item or distractor) are one task, so no benchmark
    computation and its answer is ever trained on under another story. (No level-5 expression
    has a level 1-4 shape, so the levels' ids never meet; tests/environments/test_word_problems.py checks it.)"""
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


def word_task_record(problem: WordProblem, split: str) -> dict:
    return {
        "task_id": task_id_for(problem.expression),
        "family": FAMILY,
        "level": WORD_LEVEL,
        "prompt": problem.prompt,
        "answer": str(evaluate(problem.expression)),
        "split": split,
        "metadata": json.dumps(
            {"expression": problem.expression, "template": problem.template, "distractors": list(problem.distractors)}
        ),
    }


def make_task(level: int, rng: random.Random, split: str) -> dict:
    if level == WORD_LEVEL:
        return word_task_record(make_word_problem(rng), split)
    return task_record(make_expression(level, rng), level, split)


def generate_tasks(
    n: int,
    *,
    seed: int,
    split: str,
    levels: Iterable[int] = DEFAULT_LEVELS,
    level_weights: Iterable[float] | None = None,
    exclude_ids: frozenset[str] = frozenset(),
) -> list[dict]:
    """`n` distinct tasks not in `exclude_ids`. Raises if the space is too small to fill."""
    rng = random.Random(seed)
    return draw_distinct_tasks(
        n,
        rng=rng,
        split=split,
        levels=levels,
        level_weights=level_weights,
        exclude_ids=exclude_ids,
        make=lambda level: make_task(level, rng, split),
    )


# ---------------------------------------------------------------- level 5: word problems
# A small vocabulary (a few names, items and units) so that the scratch tokenizer, trained on the
# task corpus, learns whole words. Every number in a story is an operand or a distractor, and
# distractors never equal an operand, so "which numbers matter" is the whole reading task. No
# sentence holds + - * / or parentheses: there is no expression to copy.

PEOPLE = (
    ("Mia", "she", "her"),
    ("Tom", "he", "his"),
    ("Ana", "she", "her"),
    ("Ben", "he", "his"),
    ("Zoe", "she", "her"),
    ("Sam", "he", "his"),
    ("Lea", "she", "her"),
    ("Max", "he", "his"),
    ("Ivy", "she", "her"),
    ("Leo", "he", "his"),
)


@dataclass(frozen=True)
class Story:
    """A word-problem template. Sentences and question use operands {a}..{d}, a person ({name},
    {He}, {he}, {his}) and an {item}; `expression` is what the question asks, over the operands,
    drawn from `spans` until they differ and the answer is at least 1 (a count). A distractor is
    a sentence with one number {x} in [low, high] that the answer ignores."""

    name: str
    sentences: tuple[str, ...]
    question: str
    expression: str
    spans: dict[str, tuple[int, int]]
    distractors: tuple[tuple[str, int, int], ...]
    items: tuple[str, ...] = field(default=("",))


@dataclass(frozen=True)
class WordProblem:
    prompt: str
    expression: str
    template: str
    distractors: tuple[int, ...]


STORIES = (
    Story(
        "shop",
        ("The shop sells {a} boxes of {item} on Monday and {b} boxes on Tuesday.", "Each box holds {c} {item}."),
        "How many {item} did the shop sell on the two days?",
        "({a}+{b})*{c}",
        {"a": (12, 89), "b": (12, 89), "c": (12, 48)},
        (("The shop has been open for {x} years.", 2, 60), ("The shop has {x} workers.", 2, 30)),
        ("pens", "pencils", "cards", "nails", "beads", "eggs"),
    ),
    Story(
        "give",
        ("{name} has {a} {item}.", "{He} gives {b} {item} to each of {his} {c} friends."),
        "How many {item} does {name} have left?",
        "{a}-{b}*{c}",
        {"a": (300, 999), "b": (12, 49), "c": (3, 19)},
        (("{name} is {x} years old.", 6, 15), ("{name} keeps the {item} in {x} boxes.", 2, 20)),
        ("stickers", "stamps", "marbles", "shells", "coins"),
    ),
    Story(
        "tickets",
        ("{name} buys {a} adult tickets at {b} coins each and {c} child tickets at {d} coins each.",),
        "How many coins does {name} pay in all?",
        "{a}*{b}+{c}*{d}",
        {"a": (11, 40), "b": (12, 60), "c": (11, 40), "d": (5, 30)},
        (("The show starts at {x} o'clock.", 2, 11), ("The hall has {x} doors.", 2, 20)),
    ),
    Story(
        "eggs",
        ("The farm packs {a} crates with {b} eggs in each crate.", "On the way to town {c} eggs break."),
        "How many eggs are still whole?",
        "{a}*{b}-{c}",
        {"a": (12, 99), "b": (12, 36), "c": (10, 99)},
        (("The farm has {x} hens.", 20, 99), ("The trip to town takes {x} minutes.", 10, 90)),
    ),
    Story(
        "bakery",
        (
            "The bakery bakes {a} loaves of bread.",
            "At the end of the day {b} loaves are not sold.",
            "Each sold loaf costs {c} coins.",
        ),
        "How many coins does the bakery get for its bread?",
        "({a}-{b})*{c}",
        {"a": (60, 300), "b": (10, 59), "c": (12, 45)},
        (("The bakery opens at {x} o'clock.", 5, 9), ("The bakery has {x} ovens.", 2, 12)),
    ),
    Story(
        "hotel",
        ("The hotel has {a} floors.", "Each floor has {b} rooms and each room has {c} {item}."),
        "How many {item} are in the hotel?",
        "{a}*{b}*{c}",
        {"a": (3, 19), "b": (11, 40), "c": (2, 9)},
        (("The hotel is {x} years old.", 10, 99), ("The hotel has {x} cooks.", 2, 20)),
        ("lamps", "chairs", "beds", "towels"),
    ),
    Story(
        "reading",
        ("{name} reads {b} pages every day for {a} days.", "Then {he} reads {c} more pages."),
        "How many pages does {name} read in all?",
        "{a}*{b}+{c}",
        {"a": (12, 60), "b": (12, 60), "c": (10, 99)},
        (("The book costs {x} coins.", 5, 40), ("{name} is {x} years old.", 8, 16)),
    ),
    Story(
        "apples",
        (
            "The store gets {a} boxes with {b} apples in each box.",
            "The store sells {c} bags with {d} apples in each bag.",
        ),
        "How many apples does the store have left?",
        "{a}*{b}-{c}*{d}",
        {"a": (12, 40), "b": (12, 40), "c": (11, 30), "d": (3, 40)},
        (("The store has {x} workers.", 2, 30), ("The store is open {x} hours a day.", 6, 14)),
    ),
    Story(
        "school",
        ("The school has three classes with {a}, {b} and {c} students.", "Each student gets {d} {item}."),
        "How many {item} does the school give out?",
        "({a}+{b}+{c})*{d}",
        {"a": (15, 40), "b": (15, 40), "c": (15, 40), "d": (3, 24)},
        (("The school has {x} teachers.", 5, 30), ("The school was built {x} years ago.", 10, 99)),
        ("pencils", "books", "apples", "cards"),
    ),
    Story(
        "workers",
        ("Each of the {a} workers on the farm earns {b} coins a day.", "Each worker spends {c} coins a day on lunch."),
        "How many coins do the workers save in one day?",
        "{a}*({b}-{c})",
        {"a": (12, 60), "b": (40, 99), "c": (10, 39)},
        (("The farm has {x} cows.", 10, 99), ("The workers start at {x} o'clock.", 5, 9)),
    ),
    Story(
        "boat",
        (
            "A group of {a} adults and {b} kids goes on a boat trip.",
            "Each ticket costs {c} coins.",
            "The group gets {d} coins off with a coupon.",
        ),
        "How many coins does the group pay?",
        "({a}+{b})*{c}-{d}",
        {"a": (11, 40), "b": (11, 40), "c": (12, 45), "d": (10, 99)},
        (("The boat is {x} meters long.", 10, 60), ("The trip takes {x} hours.", 2, 9)),
    ),
    Story(
        "library",
        ("The library has {a} books.", "The library gets {b} boxes of new books with {c} books in each box."),
        "How many books does the library have now?",
        "{a}+{b}*{c}",
        {"a": (100, 999), "b": (12, 40), "c": (12, 40)},
        (("The library has {x} tables.", 5, 40), ("The library opened {x} years ago.", 10, 99)),
    ),
    Story(
        "hall",
        (
            "The hall has {a} rows of {b} seats.",
            "In the hall {c} seats are broken and {d} seats are kept for the band.",
        ),
        "How many seats are free?",
        "{a}*{b}-{c}-{d}",
        {"a": (12, 40), "b": (12, 40), "c": (10, 60), "d": (10, 60)},
        (("The show lasts {x} minutes.", 30, 99), ("A ticket costs {x} coins.", 5, 40)),
    ),
    Story(
        "garden",
        ("{name} has a garden with {a} rows of flowers.", "Each row has {b} red flowers and {c} white flowers."),
        "How many flowers are in the garden?",
        "{a}*({b}+{c})",
        {"a": (12, 60), "b": (11, 40), "c": (11, 40)},
        (("The garden is {x} meters wide.", 5, 50), ("{name} waters the garden {x} times a week.", 2, 7)),
    ),
    Story(
        "planting",
        ("{name} plants {a} rows of {b} carrots.", "{He} also plants {c} rows of {d} beans."),
        "How many plants does {name} plant in all?",
        "{a}*{b}+{c}*{d}",
        {"a": (11, 40), "b": (12, 50), "c": (11, 40), "d": (12, 50)},
        (("{name} has {x} hens.", 3, 30), ("{name} works on the farm {x} hours a day.", 5, 12)),
    ),
    Story(
        "saving",
        ("{name} saves {b} coins every week for {a} weeks.", "Then {he} buys a bike for {c} coins."),
        "How many coins does {name} have left?",
        "{a}*{b}-{c}",
        {"a": (12, 52), "b": (12, 60), "c": (100, 999)},
        (("The bike has {x} gears.", 3, 21), ("{name} is {x} years old.", 8, 16)),
    ),
)


def make_word_problem(rng: random.Random) -> WordProblem:
    """A story from one of `STORIES`, its operands, a person and an item, and 1-2 distractor
    sentences placed anywhere before the question. Deterministic in `rng`."""
    story = rng.choice(STORIES)
    for _ in range(1000):
        operands = {k: rng.randint(low, high) for k, (low, high) in story.spans.items()}
        expression = story.expression.format(**operands)
        if evaluate(expression) >= 1 and len(set(operands.values())) == len(operands):
            break
    else:
        raise ValueError(f"story {story.name!r}: no distinct operands in {story.spans} give a positive answer")
    name, he, his = rng.choice(PEOPLE)
    slots = {**operands, "name": name, "He": he.capitalize(), "he": he, "his": his, "item": rng.choice(story.items)}
    sentences = [s.format(**slots) for s in story.sentences]
    used, values = set(operands.values()), []
    for text, low, high in rng.sample(story.distractors, rng.randint(1, len(story.distractors))):
        x = rng.choice([v for v in range(low, high + 1) if v not in used])
        used.add(x)
        values.append(x)
        sentences.insert(rng.randint(0, len(sentences)), text.format(**slots, x=x))
    # ends like every arithmetic prompt (a newline), so a scratch model's prompt/completion split is the same
    return WordProblem(
        " ".join([*sentences, story.question.format(**slots)]) + "\n", expression, story.name, tuple(values)
    )


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
    # A word problem is hard whatever `hard_levels` says: its products are 2-3 digits by
    # construction, and a config listing (3, 4) was written before level 5 existed.
    if task["level"] in set(hard_levels) or task["level"] == WORD_LEVEL:
        return Demonstration(task["task_id"], "direct", (), str(near_miss(gold, rng)), False)
    return Demonstration(task["task_id"], "direct", (), str(gold), True)


def demonstrations(
    tasks: list[dict], n: int, *, seed: int, p_direct: float, hard_levels: Iterable[int]
) -> Iterator[Demonstration]:
    rng = random.Random(seed)
    hard = tuple(hard_levels)
    for i in range(n):
        yield demonstrate(tasks[i % len(tasks)], rng=rng, p_direct=p_direct, hard_levels=hard)


def code_turn(code: str) -> str:
    return f"{CODE_OPEN}{code}{CODE_CLOSE}"


def answer_turn(answer: str) -> str:
    return f"{ANSWER_OPEN}{answer}{ANSWER_CLOSE}"


# ---------------------------------------------------------------- the family


class ArithmeticTeacher(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    p_direct: float = Field(0.6, ge=0.0, le=1.0, description="Probability the teacher answers without the tool.")
    hard_levels: tuple[int, ...] = Field((3, 4), description="Levels where a direct (mental) answer is wrong.")


class Arithmetic(TaskFamily):
    name, levels, default_levels, tools = FAMILY, LEVELS, DEFAULT_LEVELS, ("code",)
    default_verifier = VerifierSpec(name="math", params={"rel_tol": 1e-6})
    teacher_params = ArithmeticTeacher

    def generate_tasks(self, n, *, seed, split, levels, level_weights, exclude_ids, kb):
        return generate_tasks(
            n, seed=seed, split=split, levels=levels, level_weights=level_weights, exclude_ids=exclude_ids
        )

    def demonstrations(self, tasks, n, *, seed, teacher, kb):
        return demonstrations(tasks, n, seed=seed, p_direct=teacher.p_direct, hard_levels=teacher.hard_levels)

    def detour_steps(self, task, kind, rng, kb):
        # negative: an unclosed print (a SyntaxError comes back); alternatives: the first operation alone
        expression = json.loads(task.get("metadata") or "{}").get("expression", str(task["answer"]))
        if kind == "negative":
            return (Step("code", f"print({expression}", trained=False),)
        first = re.search(r"\d+[-+*]\d+", expression)  # search: a word problem's may open with "("
        return (Step("code", f"print({first.group() if first else expression})", trained=False),)

    def tokenizer_texts(self, task):
        answer = str(task["answer"])
        expression = json.loads(task["metadata"] or "{}").get("expression", answer)  # user files may omit it
        yield task["prompt"] + code_turn(f"print({expression})") + wrap_observation(answer + "\n") + answer_turn(answer)


register_family(Arithmetic())
