"""What a task family is, and the registry the config's family names are checked against.

A family is one module that registers one `TaskFamily`: its levels, its tools, its default
outcome verifier, its scripted teacher (and the teacher's config), task generation,
demonstrations and detours, the texts its tokenizer must cover, and the extra checks its rows
get when they come from a user's task file. Everything else (SFT data, rollouts, rewards, the
benchmark, contracts) asks the registry. Adding a family (docs/task-families.md):

    # mypkg/reverse.py
    class Reverse(TaskFamily):
        name, levels, tools = "reverse", (1, 2), ("code",)
        default_verifier = VerifierSpec(name="exact_match")
        ...
    register_family(Reverse())

    # the profile, or --set
    data: {families: {reverse: {module: mypkg.reverse, train_tasks: 500, benchmark_tasks: 100}}}

`resolve_families(cfg)` imports the named modules, checks every family name the config uses
(data.families, teacher.mixture, teacher.<family>, reward.verifiers) against the registry, the
levels and the teacher parameters, and returns the config with each configured family's default
verifier filled in where reward.verifiers names none.
"""

from __future__ import annotations

import abc
import importlib
import random
from collections.abc import Iterator
from typing import ClassVar

from pydantic import BaseModel, ValidationError

from configs import ConfigError
from configs.registry import Registry
from configs.schema import FlywheelConfig, TeacherConfig, VerifierSpec
from environments.base import Demonstration, KnowledgeBase, Step
from verifiers import judge as _judge  # noqa: F401  (registers the judge, checked below)
from verifiers.base import VERIFIERS

FAMILIES = Registry("task family")


class NoTeacherParams(BaseModel):
    model_config = {"extra": "forbid", "frozen": True}


class TaskFamily(abc.ABC):
    """One kind of verifiable task. Class attributes describe it; methods make its data."""

    name: ClassVar[str]
    levels: ClassVar[tuple[int, ...]]  # every level that exists
    default_levels: ClassVar[tuple[int, ...] | None] = None  # generated when a profile names none (None: all)
    file_levels: ClassVar[
        tuple[int, ...]
    ] = ()  # levels only files provide (code's HumanEval/MBPP problems): never generated
    tools: ClassVar[tuple[str, ...]]  # names in verifiers.protocol.TOOL_TAGS; the tool-use term penalizes others
    default_verifier: ClassVar[VerifierSpec]  # the outcome verifier when reward.verifiers names none
    teacher_params: ClassVar[type[BaseModel]] = NoTeacherParams  # teacher.<name> in the profile
    needs_kb: ClassVar[bool] = False  # its tasks and teacher read the knowledge base
    # No rule can decide its answers (free text against a reference): only it may use the judge
    # tier (verifiers/judge.py), and its rows say so (metadata `open_ended`).
    open_ended: ClassVar[bool] = False

    @abc.abstractmethod
    def generate_tasks(
        self,
        n: int,
        *,
        seed: int,
        split: str,
        levels: tuple[int, ...],
        level_weights,
        exclude_ids: frozenset[str],
        kb: KnowledgeBase | None,
    ) -> list[dict]:
        """`n` distinct task rows (environments.base.TASK_COLUMNS) not in `exclude_ids`."""

    @abc.abstractmethod
    def demonstrations(
        self, tasks: list[dict], n: int, *, seed: int, teacher: BaseModel, kb: KnowledgeBase | None
    ) -> Iterator[Demonstration]:
        """`n` teacher demonstrations over `tasks` (`teacher` is a `teacher_params` instance)."""

    @abc.abstractmethod
    def tokenizer_texts(self, task: dict) -> Iterator[str]:
        """Texts in the shapes this family's episodes take, for a tokenizer trained from scratch."""

    def detour_steps(self, task: dict, kind: str, rng: random.Random, kb: KnowledgeBase | None) -> tuple[Step, ...]:
        """Masked steps before the expert's first ("negative": a mistake; "alternatives": other
        first actions with their real outcomes). None by default."""
        return ()

    def row_problem(self, task: dict) -> str | None:
        """What is wrong with a user's task row beyond the common columns (task_view: metadata merged)."""
        return None

    def all_default_levels(self) -> tuple[int, ...]:
        return self.default_levels or self.levels

    def teacher(self, cfg: TeacherConfig) -> BaseModel:
        raw = getattr(cfg, self.name, None) or {}
        return raw if isinstance(raw, self.teacher_params) else self.teacher_params.model_validate(raw)


def register_family(family: TaskFamily) -> TaskFamily:
    for attr in ("name", "levels", "tools", "default_verifier"):
        if not hasattr(family, attr):
            raise TypeError(f"task family {type(family).__name__} does not set {attr!r}")
    return FAMILIES.add(family.name, family)


def get_family(name: str) -> TaskFamily:
    return FAMILIES.get(name)


def tools_of(family: str) -> tuple[str, ...]:
    return get_family(family).tools


def tools_offered(task: dict) -> tuple[str, ...]:
    """The tools an episode of `task` may call: its family's, or the task's own `tools` when it
    names them (a question put to the served agent, which belongs to no family: training/agent/served.py)."""
    return tuple(task["tools"]) if task.get("tools") else tools_of(task["family"])


def _import_modules(cfg: FlywheelConfig) -> None:
    for name, fam in cfg.data.families.items():
        if fam.module is None:
            continue
        try:
            importlib.import_module(fam.module)
        except Exception as exc:  # noqa: BLE001 — any failure to import is this field's problem
            raise ConfigError(
                f"data.families.{name}.module: cannot import {fam.module!r} ({type(exc).__name__}: {exc})"
            ) from exc
        if name not in FAMILIES:
            raise ConfigError(
                f"data.families.{name}.module: {fam.module!r} registers no task family named {name!r}; "
                f"registered: {', '.join(FAMILIES.names())}"
            )


def resolve_families(cfg: FlywheelConfig) -> FlywheelConfig:
    """The config with its family names checked and reward.verifiers completed (module doc)."""
    _import_modules(cfg)
    known = ", ".join(FAMILIES.names())
    used = (
        [(f"data.families.{n}", n) for n in cfg.data.families]
        + [(f"teacher.mixture.{n}", n) for n in (cfg.teacher.mixture or {})]
        + [(f"reward.verifiers.{n}", n) for n in cfg.reward.verifiers]
        + [(f"reward.strict.verifiers.{n}", n) for n in cfg.reward.strict.verifiers]
        + [(f"teacher.{n}", n) for n in (cfg.teacher.model_extra or {})]
    )
    for where, name in used:
        if name not in FAMILIES:
            raise ConfigError(
                f"{where}: {name!r} is not a registered task family (registered: {known}; "
                f"a family of your own needs data.families.{name}.module)"
            )
    for name, fam in cfg.data.families.items():
        family = get_family(name)
        bad = [lv for lv in (fam.levels or ()) if lv not in family.levels]
        if bad:
            raise ConfigError(f"data.families.{name}.levels: {bad} do not exist; {name} has levels {family.levels}")
        from_files = [lv for lv in (fam.levels or ()) if lv in family.file_levels]
        if from_files:
            raise ConfigError(
                f"data.families.{name}.levels: {from_files} come from problem files only (data.task_file, "
                f"benchmark.suites), they are not generated; generated levels: "
                f"{tuple(lv for lv in family.levels if lv not in family.file_levels)}"
            )
    for name in cfg.teacher.model_extra or {}:
        try:
            get_family(name).teacher(cfg.teacher)
        except ValidationError as exc:
            problems = "; ".join(f"teacher.{name}.{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
            raise ConfigError(problems) from None
    for name, spec in cfg.reward.verifiers.items():
        if spec.name in VERIFIERS and VERIFIERS.get(spec.name).needs_judge and not get_family(name).open_ended:
            raise ConfigError(
                f"reward.verifiers.{name}.name: {spec.name!r} is a judge, and {name} is decided by a rule "
                f"({get_family(name).default_verifier.name!r}); the judge decides only open-ended families "
                f"({', '.join(n for n in FAMILIES.names() if get_family(n).open_ended)})"
            )
    missing = {n: get_family(n).default_verifier for n in cfg.data.families if n not in cfg.reward.verifiers}
    if not missing:
        return cfg
    reward = cfg.reward.model_copy(update={"verifiers": {**cfg.reward.verifiers, **missing}})
    return cfg.model_copy(update={"reward": reward})
