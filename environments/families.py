"""What every family's data goes through, family by family via the registry (environments/family.py).

arithmetic  compute an expression; tool: the code interpreter          verifier: math
search      multi-hop questions over a generated knowledge base;     verifier: exact_match
            tool: BM25 search
code        write a function from a short spec; hidden unit tests;   verifier: unit_tests
            tool: the code interpreter (to try it first)
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Mapping
from dataclasses import replace

from configs.schema import KnowledgeBaseConfig, TeacherConfig
from environments import search
from environments.base import Demonstration, KnowledgeBase
from environments.family import get_family
from environments.retrieval import Retriever
from environments.search import SearchTool
from environments.tools import CodeInterpreter, Tool, toolbox


def make_kb(cfg: KnowledgeBaseConfig, seed: int) -> KnowledgeBase:
    return search.generate_kb(
        seed, n_people=cfg.people, n_companies=cfg.companies, n_cities=cfg.cities, n_countries=cfg.countries
    )


def generate_tasks(
    family: str,
    n: int,
    *,
    seed: int,
    split: str,
    levels=None,
    level_weights=None,
    exclude_ids: frozenset[str] = frozenset(),
    kb: KnowledgeBase | None = None,
) -> list[dict]:
    fam = get_family(family)
    return fam.generate_tasks(
        n,
        seed=seed,
        split=split,
        levels=tuple(levels) if levels else fam.all_default_levels(),
        level_weights=level_weights,
        exclude_ids=exclude_ids,
        kb=kb,
    )


def demonstrations(
    family: str, tasks: list[dict], n: int, *, seed: int, teacher: TeacherConfig, kb: KnowledgeBase | None = None
) -> Iterator[Demonstration]:
    fam = get_family(family)
    return fam.demonstrations(tasks, n, seed=seed, teacher=fam.teacher(teacher), kb=kb)


def with_detours(
    family: str,
    demos: list[Demonstration],
    tasks: dict[str, dict],
    teacher: TeacherConfig,
    *,
    seed: int,
    kb: KnowledgeBase | None,
) -> list[Demonstration]:
    """Turn `negative_fraction` / `alternatives_fraction` of the expert demonstrations (right, with
    tool steps) into detoured ones; the strategy name records which (e.g. "search+negative")."""
    rng = random.Random(seed)
    out = []
    for demo in demos:
        draw = rng.random()
        kind = (
            "negative"
            if draw < teacher.negative_fraction
            else "alternatives"
            if draw < teacher.negative_fraction + teacher.alternatives_fraction
            else None
        )
        if kind is None or not (demo.correct and demo.steps):
            out.append(demo)
            continue
        extra = get_family(family).detour_steps(tasks[demo.task_id], kind, rng, kb)
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


def build_tools(
    *, sandbox, kb: KnowledgeBase | None, top_k: int = 1, retriever: Retriever | None = None
) -> dict[str, Tool]:
    """The interpreter, and search over the knowledge base's documents (with `retriever`, the
    `search_index` asset's, when given; else an index built here)."""
    tools: list[Tool] = [CodeInterpreter(sandbox)]
    if kb is not None:
        tools.append(SearchTool(kb.documents, top_k=top_k, retriever=retriever))
    return toolbox(*tools)
