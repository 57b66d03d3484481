"""What every task family provides: tasks as rows, and a teacher's demonstrations as steps.

A task row has the same columns in every family (`TASK_COLUMNS`); what is family-specific goes
into `metadata` (JSON), and verifiers see the row with its metadata merged in (`task_view`).
A demonstration is the teacher's plan: tool calls to make and the final answer. The trajectory
builder runs the calls through the *real* tools, so SFT observations are exactly what rollouts see.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

TASK_COLUMNS = ("task_id", "family", "level", "prompt", "answer", "split", "metadata")


@dataclass(frozen=True)
class KnowledgeBase:
    """The documents the search tool reads: generated (environments.search) or a user's corpus
    (environments.corpus). Every family's teacher and detours receive it (None without search)."""

    entities: dict[str, str]  # name -> type, one of environments.search.TYPES
    relations: dict[tuple[str, str], str]  # (subject, relation) -> object
    documents: list[dict]  # {"doc_id", "title", "text"}, one per person, company and city, in entity order

    def of_type(self, kind: str) -> list[str]:
        return [name for name, t in self.entities.items() if t == kind]


@dataclass(frozen=True)
class Step:
    tool: str  # a name in verifiers.protocol.TOOL_TAGS
    args: str  # the text between the tool's tags
    trained: bool = True  # False: a negative step shown in context but masked from the SFT loss


@dataclass(frozen=True)
class Demonstration:
    task_id: str
    strategy: str  # e.g. "tool", "direct", "partial"
    steps: tuple[Step, ...]
    answer: str
    correct: bool
    notes: dict = field(default_factory=dict)


def task_view(task: dict) -> dict:
    """The row as verifiers see it: columns plus the family's metadata fields."""
    meta = task.get("metadata")
    extra = json.loads(meta) if isinstance(meta, str) and meta else {}
    return {**extra, **task}


def draw_distinct_tasks(
    n: int,
    *,
    rng: random.Random,
    split: str,
    levels: Iterable[int],
    level_weights: Iterable[float] | None,
    exclude_ids: frozenset[str],
    make: Callable[[int], dict],
    tries_per_level: int = 1,
) -> list[dict]:
    """`n` distinct task rows not in `exclude_ids`: draw a level by weight, then `make(level)` a
    candidate (retrying up to `tries_per_level` times within the level, so a level keeps its
    weight until its space runs out). Raises if the space is too small to fill."""
    levels = list(levels)
    weights = list(level_weights) if level_weights is not None else [1.0] * len(levels)
    tasks: dict[str, dict] = {}
    attempts = 0
    while len(tasks) < n:
        level = rng.choices(levels, weights)[0]
        for _ in range(tries_per_level):
            attempts += 1
            if attempts > 50 * n + 1000:
                raise ValueError(
                    f"could only generate {len(tasks)} distinct {split} tasks of {n} requested at levels {levels}"
                )
            record = make(level)
            if record["task_id"] not in exclude_ids and record["task_id"] not in tasks:
                tasks[record["task_id"]] = record
                break
    return list(tasks.values())
