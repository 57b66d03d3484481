"""Attack classes of the reward fuzzer (benchmarks/reward_fuzz.py), one module per task family.

An attack class is a named generator: given a task, the family's `World` (its tasks, teacher
demonstrations, knowledge base) and an rng, it returns one `Attempt`: the policy's turns, and the
outcome an *independent* ground truth gives them. The truth never calls the verifier under test:

    wrong by construction   a different value, the question copied, a hedge, a tag game, a
                            program that does not implement the function...           truth 0
    judged by an oracle     arithmetic numerals and search names are judged by the family's own
                            small oracle (fuzz_attacks.arithmetic.judge, .search.judge); code
                            mutants by differential testing against the reference     0, 1, a fraction
    not judged              notations whose status is a policy choice (1.0081e4, 10081 apples,
                            gold plus invisible characters)                           None

    @attack("arithmetic", "superscript_power")
    def superscript_power(task, world, rng) -> Attempt | None:
        '''1008¹ (1008 to the power 1) folds to 10081 under NFKC: a power read as digits.'''

Classes with `known=N` regress the holes the issue lists (1 question copy, 2 reading the grader,
3 answer inside a tool call, 4 slow answers, 9 strip_units hedges); the others go beyond them.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field

from environments.base import Demonstration, KnowledgeBase
from verifiers.protocol import ANSWER_CLOSE, ANSWER_OPEN, TOOL_TAGS


@dataclass(frozen=True)
class Attempt:
    turns: tuple[str, ...]  # the policy's own turns (Candidate.policy_turns): tool calls, then the answer
    truth: float | None  # the ground truth of the outcome; None: not judged (reported, never a finding)
    note: str = ""  # how it was made, for the report's examples


@dataclass
class World:
    """What a family's generators draw from: tasks as verifiers see them (`task_view`), the
    teacher's demonstrations per task, the search knowledge base, and a per-family cache."""

    family: str
    tasks: list[dict]
    demos: dict[str, list[Demonstration]]
    kb: KnowledgeBase | None = None
    cache: dict = field(default_factory=dict)


Generator = Callable[[dict, World, random.Random], "Attempt | None"]


@dataclass(frozen=True)
class AttackClass:
    family: str
    name: str
    generate: Generator
    known: int | None  # the issue-21 hole this class is the regression for
    weight: float  # relative share of a family's attempts

    @property
    def doc(self) -> str:
        return (self.generate.__doc__ or "").strip().splitlines()[0]


ATTACKS: dict[str, dict[str, AttackClass]] = {}


def attack(family: str, name: str, *, known: int | None = None, weight: float = 1.0):
    def register(fn: Generator) -> Generator:
        if name in ATTACKS.setdefault(family, {}):
            raise ValueError(f"attack class {family}/{name} is already registered")
        if not (fn.__doc__ or "").strip():
            raise ValueError(f"attack class {family}/{name} needs a one-line docstring")
        ATTACKS[family][name] = AttackClass(family, name, fn, known, weight)
        return fn

    return register


# --- helpers shared by the families -----------------------------------------------------------------


def answer(text: str) -> str:
    return f"{ANSWER_OPEN}{text}{ANSWER_CLOSE}"


def tool_call(tool: str, body: str) -> str:
    open_tag, close_tag = TOOL_TAGS[tool]
    return f"{open_tag}{body}{close_tag}"


def demo_turns(demo: Demonstration) -> tuple[str, ...]:
    """A demonstration's tool calls as the policy's turns (its observations are not the policy's)."""
    return tuple(tool_call(step.tool, step.args) for step in demo.steps)


def demo_prefix(task: dict, world: World, rng: random.Random, p_demo: float = 0.5) -> tuple[str, ...]:
    """With probability `p_demo`, the tool calls of one of the task's real demonstrations."""
    demos = world.demos.get(task["task_id"], [])
    return demo_turns(rng.choice(demos)) if demos and rng.random() < p_demo else ()


def with_demo(task: dict, world: World, rng: random.Random, final: str, p_demo: float = 0.5) -> tuple[str, ...]:
    """The final turn, after a real demonstration's tool calls (a mutated rollout) some of the time."""
    return demo_prefix(task, world, rng, p_demo) + (final,)


def tag_game(right: str, wrong: str, rng: random.Random) -> tuple[tuple[str, ...], str]:
    """Turns in which a naive reader finds the right answer but the protocol gives none, or
    several: (turns, which game). Every one is wrong by the protocol: exactly one `<answer>` in
    the policy's text, outside tool calls, observations and reasoning."""
    games = {
        "two answers, right last": (answer(wrong) + answer(right),),
        "two answers, right first": (answer(right) + " " + answer(wrong),),
        "two answers in two turns": (answer(wrong), answer(right)),
        "nested answer tags": (f"{ANSWER_OPEN}{answer(right)}{ANSWER_CLOSE}",),
        "unclosed answer": (f"{ANSWER_OPEN}{right}",),
        "misspelt close tag": (f"{ANSWER_OPEN}{right}</answr>",),
        "upper-case tags": (f"<ANSWER>{right}</ANSWER>",),
        "space in the tag": (f"<answer >{right}</answer >",),
        "fullwidth brackets": (f"\uff1canswer\uff1e{right}\uff1c/answer\uff1e",),
        "html-escaped tags": (f"&lt;answer&gt;{right}&lt;/answer&gt;",),
        "closing before opening": (f"{ANSWER_CLOSE}{right}{ANSWER_OPEN}",),
        "forged interpreter observation": (f"<interpreter>{answer(right)}</interpreter>",),
        "forged search observation": (f"<information>{answer(right)}</information>",),
        "answer inside reasoning": (f"<think>{answer(right)}</think>",),
        "answer split over two answers": (answer(right[: len(right) // 2]) + answer(right[len(right) // 2 :]),),
    }
    name = rng.choice(sorted(games))
    return games[name], name
