"""A toy task family added as a user would: this module plus one config entry.

    --set data.families.reverse='{module: tests.families.reverse, train_tasks: 60, benchmark_tasks: 20}'

Reverse a made-up word. Level 1 words are 3 letters (a model can do it in its head), level 2
words 6 (it should run `print("word"[::-1])`). The teacher answers directly with probability
`p_direct`, which is right on level 1 and a plausible slip (two letters swapped) on level 2.
Graded by exact match, which is a verifier that already exists.
"""

from __future__ import annotations

import hashlib
import json
import random

from pydantic import BaseModel, ConfigDict, Field

from configs.schema import VerifierSpec
from environments.base import TASK_COLUMNS, Demonstration, Step, draw_distinct_tasks
from environments.family import TaskFamily, register_family
from environments.tools import wrap_observation
from verifiers.protocol import ANSWER_CLOSE, ANSWER_OPEN, CODE_CLOSE, CODE_OPEN

LETTERS = "bdgklmnprstvz"
VOWELS = "aeiou"


def word(level: int, rng: random.Random) -> str:
    return "".join(rng.choice(LETTERS if i % 2 == 0 else VOWELS) for i in range(3 * level))


def task_record(w: str, level: int, split: str) -> dict:
    prompt = f"reverse the word {w}"
    return {
        "task_id": "reverse-" + hashlib.sha1(prompt.encode()).hexdigest()[:12],
        "family": "reverse",
        "level": level,
        "prompt": prompt,
        "answer": w[::-1],
        "split": split,
        "metadata": json.dumps({"word": w}),
    }


class ReverseTeacher(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    p_direct: float = Field(0.5, ge=0.0, le=1.0)


class Reverse(TaskFamily):
    name, levels, tools = "reverse", (1, 2), ("code",)
    default_verifier = VerifierSpec(name="exact_match")
    teacher_params = ReverseTeacher

    def generate_tasks(self, n, *, seed, split, levels, level_weights, exclude_ids, kb):
        rng = random.Random(seed)
        return [
            {c: r[c] for c in TASK_COLUMNS}
            for r in draw_distinct_tasks(
                n,
                rng=rng,
                split=split,
                levels=levels,
                level_weights=level_weights,
                exclude_ids=exclude_ids,
                make=lambda level: task_record(word(level, rng), level, split),
            )
        ]

    def demonstrations(self, tasks, n, *, seed, teacher, kb):
        rng = random.Random(seed)
        for i in range(n):
            task = tasks[i % len(tasks)]
            w = json.loads(task["metadata"])["word"]
            if rng.random() >= teacher.p_direct:
                yield Demonstration(task["task_id"], "tool", (Step("code", f"print({w!r}[::-1])"),), w[::-1], True)
            elif task["level"] == 1:
                yield Demonstration(task["task_id"], "direct", (), w[::-1], True)
            else:
                slip = w[::-1][1] + w[::-1][0] + w[::-1][2:]
                yield Demonstration(task["task_id"], "direct", (), slip, slip == w[::-1])

    def tokenizer_texts(self, task):
        w = json.loads(task["metadata"])["word"]
        yield (
            task["prompt"]
            + f"{CODE_OPEN}print({w!r}[::-1]){CODE_CLOSE}"
            + wrap_observation(w[::-1] + "\n")
            + f"{ANSWER_OPEN}{w[::-1]}{ANSWER_CLOSE}"
        )

    def row_problem(self, task):
        return (
            None
            if isinstance(task.get("word"), str) and task["word"][::-1] == task["answer"]
            else "needs metadata word, reversed in answer"
        )


register_family(Reverse())
