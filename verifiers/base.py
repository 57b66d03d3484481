"""The verifier interface: small deterministic functions registered by name.

A verifier takes the policy's single final answer and the task row, and returns a `Verdict`:
a score in [0, 1], or `None` when the task cannot be scored (a bad gold answer, a sandbox that
failed to start). `None` is counted and reported as *unscorable*, never silently turned into
0 or 1. `details` says why, for audit. Unscorable is for the task and the machinery only: a group
with an unscorable member never trains, so a failure the *candidate* caused (its output, its
exceptions, what it wrote where the verifier reads) must be a 0, flagged `candidate_fault`.

    @register("numeric")
    def numeric(prediction, task, *, rel_tol=1e-6) -> Verdict: ...

Verifiers that need the sandbox are registered with `needs_sandbox=True` and receive it as the
keyword `sandbox`; the judge (verifiers/judge.py) is registered with `needs_judge=True` and
receives the cascade's judge model as `judge`. A verifier may also register a `precheck` (cheap parse/schema check of the
candidate, run by the cascade's fast tier before the verifier itself) and a `task_check` (is the
task's gold usable at all?); each returns a reason, or None.

`run_verifier` is the only way the rest of the code calls a verifier: an exception raised inside
one (a candidate crafted to crash the parser, say) becomes an unscorable verdict naming the
exception, so no input can turn a crash into reward.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from configs.registry import Registry

Task = Mapping[str, Any]


@dataclass(frozen=True)
class Verdict:
    score: float | None  # in [0, 1]; None = unscorable
    details: str = ""
    # The score is 0 because the candidate broke the verifier's machinery (its protocol stream,
    # its sandbox run): what would otherwise look unscorable. Counted (verifier/<tier>/candidate_faults).
    candidate_fault: bool = False


@dataclass(frozen=True)
class RegisteredVerifier:
    name: str
    fn: Callable[..., Verdict]
    needs_sandbox: bool
    precheck: Callable[..., str | None] | None
    task_check: Callable[..., str | None] | None
    needs_judge: bool = False


VERIFIERS = Registry("verifier")  # name -> RegisteredVerifier


def register(
    name: str,
    *,
    needs_sandbox: bool = False,
    precheck: Callable[..., str | None] | None = None,
    task_check: Callable[..., str | None] | None = None,
    needs_judge: bool = False,
):
    """`precheck(prediction, task, **params)` and `task_check(task, **params)` return a reason
    (the candidate, or the task's gold, cannot be checked) or None."""

    def decorate(fn: Callable[..., Verdict]) -> Callable[..., Verdict]:
        VERIFIERS.add(name, RegisteredVerifier(name, fn, needs_sandbox, precheck, task_check, needs_judge))
        return fn

    return decorate


def get_verifier(name: str) -> RegisteredVerifier:
    """Raises UnknownNameError (a KeyError and a ValueError) naming the registered verifiers."""
    return VERIFIERS.get(name)


def run_verifier(
    name: str, prediction: str, task: Task, params: Mapping[str, Any], sandbox=None, judge=None
) -> Verdict:
    spec = get_verifier(name)
    if spec.needs_sandbox and sandbox is None:
        return Verdict(None, f"verifier {name!r} needs a sandbox and none was given")
    if spec.needs_judge and judge is None:
        return Verdict(None, f"verifier {name!r} needs a judge model and none was given")
    resources = {"sandbox": sandbox} if spec.needs_sandbox else {"judge": judge} if spec.needs_judge else {}
    try:
        verdict = spec.fn(prediction, task, **resources, **params)
    except Exception as exc:  # noqa: BLE001 — a crash is unscorable, never reward
        return Verdict(None, f"verifier {name!r} raised {type(exc).__name__}: {str(exc)[:200]}")
    if verdict.score is not None and not (
        isinstance(verdict.score, (int, float)) and math.isfinite(verdict.score) and 0.0 <= verdict.score <= 1.0
    ):
        return Verdict(None, f"verifier {name!r} returned score {verdict.score!r} outside [0, 1]")
    return verdict


def run_precheck(name: str, prediction: str, task: Task, params: Mapping[str, Any]) -> Verdict | None:
    """The fast tier's family-specific check: None to pass the candidate on, else a 0 verdict
    naming the reason. A crash inside the check is unscorable, like a crash in the verifier."""
    spec = get_verifier(name)
    if spec.precheck is None:
        return None
    try:
        reason = spec.precheck(prediction, task, **params)
    except Exception as exc:  # noqa: BLE001
        return Verdict(None, f"precheck {name!r} raised {type(exc).__name__}: {str(exc)[:200]}")
    return None if reason is None else Verdict(0.0, reason)


def run_task_check(name: str, task: Task, params: Mapping[str, Any]) -> str | None:
    """Why this task cannot be scored by `name` (an unscorable gold), or None."""
    spec = get_verifier(name)
    if spec.task_check is None:
        return None
    try:
        return spec.task_check(task, **params)
    except Exception as exc:  # noqa: BLE001
        return f"task_check {name!r} raised {type(exc).__name__}: {str(exc)[:200]}"
