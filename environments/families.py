"""The task families behind one interface, so data, SFT, rollouts and the benchmark treat them alike.

    arithmetic  compute an expression; tool: the code interpreter          verifier: math
    search      multi-hop questions over a generated knowledge base;     verifier: exact_match
                tool: BM25 search
    code        write a function from a short spec; hidden unit tests;   verifier: unit_tests
                tool: the code interpreter (to try it first)
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Iterator, Mapping
from dataclasses import replace

from configs.schema import KnowledgeBaseConfig, TeacherConfig
from environments import arithmetic, code, search
from environments.base import Demonstration, Step
from environments.search import KnowledgeBase, SearchTool
from environments.tools import CodeInterpreter, Tool, toolbox

MODULES = {"arithmetic": arithmetic, "search": search, "code": code}
# Levels generated when a profile names none. Arithmetic's word problems (level 5) are opt-in, so
# a profile written before them generates exactly the tasks it did then.
DEFAULT_LEVELS = {"arithmetic": arithmetic.DEFAULT_LEVELS, "search": search.LEVELS, "code": code.LEVELS}


def levels_of(family: str) -> tuple[int, ...]:
    return tuple(MODULES[family].LEVELS)


def make_kb(cfg: KnowledgeBaseConfig, seed: int) -> KnowledgeBase:
    return search.generate_kb(seed, n_people=cfg.people, n_companies=cfg.companies, n_cities=cfg.cities, n_countries=cfg.countries)


def generate_tasks(family: str, n: int, *, seed: int, split: str, levels=None, level_weights=None,
                   exclude_ids: frozenset[str] = frozenset(), kb: KnowledgeBase | None = None) -> list[dict]:
    levels = tuple(levels) if levels else DEFAULT_LEVELS[family]
    common = dict(seed=seed, split=split, levels=levels, level_weights=level_weights, exclude_ids=exclude_ids)
    if family == "search":
        if kb is None:
            raise ValueError("the search family needs the knowledge base to generate tasks")
        return search.generate_tasks(kb, n, **common)
    return MODULES[family].generate_tasks(n, **common)


def demonstrations(family: str, tasks: list[dict], n: int, *, seed: int, teacher: TeacherConfig,
                   kb: KnowledgeBase | None = None) -> Iterator[Demonstration]:
    if family == "arithmetic":
        t = teacher.arithmetic
        return arithmetic.demonstrations(tasks, n, seed=seed, p_direct=t.p_direct, hard_levels=t.hard_levels)
    if family == "search":
        if kb is None:
            raise ValueError("the search teacher needs the knowledge base")
        return search.demonstrations(tasks, kb, n, seed=seed, p_direct=teacher.search.p_direct, p_partial=teacher.search.p_partial)
    t = teacher.code
    return code.demonstrations(tasks, n, seed=seed, p_direct=t.p_direct, hard_levels=t.hard_levels)


def detour_steps(family: str, task: dict, kind: str, rng: random.Random, kb: KnowledgeBase | None) -> tuple[Step, ...]:
    """Steps taken before the expert's first step, shown in context but masked from the loss.

    negative (Agent-FLAN): a mistake the model should learn to recover from, not to make —
      arithmetic: an unclosed print (a SyntaxError comes back); search: the whole question as the
      query (BM25 finds something, rarely the right document); code: a near miss run on the example.
    alternatives (AgentFounder's HAS): other actions at the first step, each with its real outcome,
      before the chosen one — arithmetic: the first operation alone; search: another entity of the
      seed's type; code: a near miss, or the reference on another input.
    """
    meta = json.loads(task["metadata"]) if task.get("metadata") else {}
    if family == "arithmetic":
        expression = meta.get("expression", str(task["answer"]))
        if kind == "negative":
            return (Step("code", f"print({expression}", trained=False),)
        first = re.search(r"\d+[-+*]\d+", expression)  # search: a word problem's may open with "("
        return (Step("code", f"print({first.group() if first else expression})", trained=False),)
    if family == "search":
        if kind == "negative":
            return (Step("search", task["prompt"].strip().rstrip("?"), trained=False),)
        seed = meta["path"][0]
        others = [e for e in kb.of_type(kb.entities[seed]) if e != seed] if kb is not None else []
        return tuple(Step("search", name, trained=False) for name in rng.sample(others, min(2, len(others))))
    wrong = code.near_misses(task)
    example = code.EXAMPLE_INPUTS["xs" if "f(xs)" in task["answer"] else "x"]
    if wrong:
        return (Step("code", f"{rng.choice(wrong)}\nprint(f({example!r}))", trained=False),)
    other = [4, 5, 6] if isinstance(example, list) else 7
    return (Step("code", f"{task['answer']}\nprint(f({other!r}))", trained=False),) if kind == "alternatives" else ()


def with_detours(family: str, demos: list[Demonstration], tasks: dict[str, dict], teacher: TeacherConfig, *, seed: int,
                 kb: KnowledgeBase | None) -> list[Demonstration]:
    """Turn `negative_fraction` / `alternatives_fraction` of the expert demonstrations (right, with
    tool steps) into detoured ones; the strategy name records which (e.g. "search+negative")."""
    rng = random.Random(seed)
    out = []
    for demo in demos:
        draw = rng.random()
        kind = "negative" if draw < teacher.negative_fraction else \
            "alternatives" if draw < teacher.negative_fraction + teacher.alternatives_fraction else None
        if kind is None or not (demo.correct and demo.steps):
            out.append(demo)
            continue
        extra = detour_steps(family, tasks[demo.task_id], kind, rng, kb)
        out.append(replace(demo, strategy=f"{demo.strategy}+{kind}", steps=extra + demo.steps) if extra else demo)
    return out


def mixture_counts(teacher: TeacherConfig, task_counts: Mapping[str, int]) -> dict[str, int]:
    """SFT trajectories per family: `teacher.mixture` shares (default: as the training tasks),
    rounded so they sum to `teacher.num_trajectories`."""
    present = [f for f in task_counts if task_counts[f] > 0]
    shares = teacher.mixture if teacher.mixture is not None else task_counts
    weights = {f: float(shares.get(f, 0.0)) for f in present}
    total = sum(weights.values())
    if total <= 0:
        raise ValueError(f"teacher.mixture gives no weight to the families with training tasks ({present})")
    counts = {f: int(teacher.num_trajectories * w / total) for f, w in weights.items()}
    for f in sorted(present, key=lambda f: -weights[f])[: teacher.num_trajectories - sum(counts.values())]:
        counts[f] += 1  # hand the rounding remainder to the largest shares
    return counts


def build_tools(*, sandbox, kb: KnowledgeBase | None, top_k: int = 1) -> dict[str, Tool]:
    tools: list[Tool] = [CodeInterpreter(sandbox)]
    if kb is not None:
        tools.append(SearchTool(kb.documents, top_k=top_k))
    return toolbox(*tools)

