"""The SFT graduation exam: is the SFT checkpoint a policy RL can learn from?

RL learns from the spread inside a group of samples. A policy that never writes a well-formed
episode, whose tool calls do not parse, or that never solves a family's task gives all-zero
groups there, so a round on it spends its compute and learns nothing (or learns only from the
shaping terms). Before RL starts, the SFT checkpoint sits a short exam on training tasks (a
few per family, sampled at the rollout temperature as RL samples) and must pass three criteria,
each a threshold in `sft.graduation` (configs/schema.py):

    format            share of episodes that are well formed (verifiers.protocol.is_well_formed:
                      one call per tool turn, one final answer, nothing after it)
    tool-call syntax  share of tool calls whose arguments the tool can take (the code compiles,
                      the query is not empty); a policy that makes no call passes this one
    success           on every family, the mean outcome is above zero and at least the threshold

Everything here is pure: `grade` takes the exam's rows (training.evaluate.evaluate_policy) and
returns a report; the Dagster check (assets/graduation.py) runs the exam and blocks RL on a fail.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass

from configs.schema import GraduationConfig


def _compiles(code: str) -> bool:
    try:
        compile(code, "<tool call>", "exec")
    except (SyntaxError, ValueError, RecursionError, MemoryError, OverflowError):
        return False  # ValueError: a null byte; the others: a pathological nesting
    return True


# tool name -> does this call's argument parse for it (no call is run)
CALL_SYNTAX = {"code": _compiles, "search": lambda query: bool(query.strip())}


def call_is_valid(name: str, args: str) -> bool:
    check = CALL_SYNTAX.get(name)
    return bool(check(args)) if check is not None else False


def count_calls(tool_calls_json: str) -> tuple[int, int]:
    """(calls, valid calls) of one stored episode's `tool_calls` (a JSON list of {name, args, …})."""
    calls = json.loads(tool_calls_json) if tool_calls_json else []
    return len(calls), sum(call_is_valid(c["name"], c["args"]) for c in calls)


def exam_tasks(tasks: list[dict], per_family: int, seed: int) -> list[dict]:
    """`per_family` training tasks of every family, drawn with `seed` (all of a family's if fewer)."""
    by_family: dict[str, list[dict]] = {}
    for task in tasks:
        by_family.setdefault(str(task["family"]), []).append(task)
    chosen = []
    for family in sorted(by_family):
        pool = sorted(by_family[family], key=lambda t: str(t["task_id"]))
        chosen += random.Random(f"{seed}/graduation/{family}").sample(pool, min(per_family, len(pool)))
    return chosen


@dataclass(frozen=True)
class Criterion:
    name: str  # "format", "tool-call syntax", "success on <family>"
    measured: float
    threshold: float
    counts: str  # what the share is of, e.g. "41 of 64 episodes"
    strict_zero: bool = False  # success: 0 fails even at a threshold of 0

    @property
    def passed(self) -> bool:
        if self.strict_zero and self.measured <= 0.0:
            return False
        return self.measured >= self.threshold

    def line(self) -> str:
        if self.passed:
            verdict = "ok"
        elif self.strict_zero and self.measured <= 0.0:
            verdict = "never solved"
        else:
            verdict = f"short by {self.threshold - self.measured:.3f}"
        return f"{self.name} {self.measured:.3f} (needs >= {self.threshold:.3f}; {self.counts}): {verdict}"


@dataclass(frozen=True)
class GraduationReport:
    criteria: tuple[Criterion, ...]
    episodes: int

    @property
    def passed(self) -> bool:
        return all(c.passed for c in self.criteria)

    @property
    def failed(self) -> list[Criterion]:
        return [c for c in self.criteria if not c.passed]

    def message(self) -> str:
        if self.passed:
            return f"the SFT checkpoint graduates ({self.episodes} exam episodes): " + "; ".join(
                c.line() for c in self.criteria
            )
        return (
            f"the SFT checkpoint did not graduate, so RL would start from a policy it cannot learn from "
            f"({self.episodes} exam episodes): "
            + "; ".join(c.line() for c in self.failed)
            + '. Retrain SFT with more steps or demonstrations, e.g. `make run ARGS="--set sft.steps=N"` '
            "(or teacher.num_trajectories), or lower sft.graduation's thresholds if this is expected; "
            "`make resume` would only re-examine the same checkpoint."
        )

    def table(self) -> str:
        lines = ["| criterion | measured | threshold | of | passed |", "|---|---|---|---|---|"]
        for c in self.criteria:
            lines.append(
                f"| {c.name} | {c.measured:.3f} | {c.threshold:.3f} | {c.counts} | {'yes' if c.passed else 'NO'} |"
            )
        return "\n".join(lines)


def grade(rows: list[dict], cfg: GraduationConfig) -> GraduationReport:
    """The report of an exam. `rows`: one per task, as evaluate_policy returns them (its
    `samples`, `score`, `well_formed`, `tool_calls`, `tool_calls_valid` and `family`)."""
    if not rows:
        raise ValueError("the graduation exam has no tasks (are there training tasks?)")
    episodes = sum(int(r["samples"]) for r in rows)
    well_formed = sum(r["well_formed"] * r["samples"] for r in rows)
    calls = sum(int(r["tool_calls"]) for r in rows)
    valid = sum(int(r["tool_calls_valid"]) for r in rows)
    criteria = [
        Criterion(
            "format", well_formed / episodes, cfg.min_format_rate, f"{round(well_formed)} of {episodes} episodes"
        ),
        Criterion(
            "tool-call syntax",
            valid / calls if calls else 1.0,
            cfg.min_tool_call_valid_rate,
            f"{valid} of {calls} calls" if calls else "no tool calls",
        ),
    ]
    for family in sorted({str(r["family"]) for r in rows}):
        mine = [r for r in rows if str(r["family"]) == family]
        samples = sum(int(r["samples"]) for r in mine)
        solved = sum(r["score"] * r["samples"] for r in mine)
        criteria.append(
            Criterion(
                f"success on {family}",
                solved / samples,
                cfg.min_family_success,
                f"{len(mine)} tasks x {samples // len(mine)} samples",
                strict_zero=True,
            )
        )
    return GraduationReport(tuple(criteria), episodes)
