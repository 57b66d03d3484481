"""The verification cascade: cheap checks first, the expensive verifier only for survivors.

    fast    the task's gold is usable; exactly one final answer, not empty, not enormous; the
            verifier's own precheck (parses as math, compiles under the code policy, ...)
    verify  the family's configured outcome verifier (math equivalence, EM/F1, sandboxed tests)
    judge   open-ended families only (verifiers/judge.py): a judge model under a rubric, by
            majority vote, at most reward.judge.max_calls_per_step candidates per step (counted
            from one `take_stats` to the next); it never sees a task a rule decides
    strict  optional: a stricter rule verifier (held-out tests, exact match) for the candidates a
            rule selects; its score replaces the main one

This is the verification ladder of background/002 (fast tier -> simulation -> high fidelity):
most candidates of an early policy are rejected by the fast tier in microseconds, so the sandbox
and the strict tier only see candidates that could earn reward. Every tier counts its calls,
passes, unscorables and seconds (`metrics()`), so users see where verification time goes.

The composite reward is configured, not coded (configs.schema.RewardConfig):

    reward = outcome_weight * outcome + sum_t clip(weight_t * term_t, -cap_t, cap_t)

and every component is reported separately; they sum to the reward.
"""

from __future__ import annotations

import hashlib
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from configs.failpoints import failpoint
from configs.registry import UnknownNameError
from configs.schema import RewardConfig, VerifierSpec
from verifiers import code_tests, math_verify, qa  # noqa: F401  (register the verifiers)
from verifiers.base import Task, Verdict, get_verifier, run_precheck, run_task_check, run_verifier
from verifiers.judge import request_of
from verifiers.protocol import extract_answers
from verifiers.shaping import Candidate, contribution, get_term

TIERS = ("fast", "verify", "judge", "strict")


@dataclass
class TierStats:
    calls: int = 0
    passed: int = 0
    unscorable: int = 0
    candidate_faults: int = 0  # 0s the candidate earned by breaking the verifier's machinery
    seconds: float = 0.0

    def add(self, verdict: Verdict | None, seconds: float) -> None:
        """`verdict` None means the candidate passed a gate (the fast tier's checks)."""
        self.calls += 1
        self.seconds += seconds
        if verdict is None or (verdict.score is not None and verdict.score > 0):
            self.passed += 1
        elif verdict.score is None:
            self.unscorable += 1
        if verdict is not None and verdict.candidate_fault:
            self.candidate_faults += 1


@dataclass(frozen=True)
class RewardBreakdown:
    reward: float
    outcome: float | None  # None: unscorable, counted and reported; contributes 0
    components: dict[str, float]  # name -> signed contribution; they sum to `reward`
    tier: str  # the last tier that ruled on the outcome
    details: dict[str, str] = field(default_factory=dict)


class Cascade:
    def __init__(self, cfg: RewardConfig, sandbox=None, concurrency: int = 1, judge=None):
        """`judge`: a verifiers.judge.Judge (training.judge.judge_for), needed when a family's
        verifier is the judge."""
        self.cfg, self.sandbox, self.concurrency, self.judge = cfg, sandbox, max(1, concurrency), judge
        for where, specs in (("reward.verifiers", cfg.verifiers), ("reward.strict.verifiers", cfg.strict.verifiers)):
            for family, spec in specs.items():
                try:
                    registered = get_verifier(spec.name)
                except UnknownNameError as exc:
                    raise ValueError(f"{where}.{family}.name: {exc.args[0]}") from None
                if registered.needs_judge and where == "reward.strict.verifiers":
                    raise ValueError(
                        f"{where}.{family}.name: {spec.name!r} is a judge; the strict tier re-checks what a rule "
                        "decided, and a judge never decides a task a rule can"
                    )
                if registered.needs_judge and judge is None:
                    raise ValueError(
                        f"{where}.{family}.name: {spec.name!r} needs a judge model; build the cascade with "
                        "judge=training.judge.judge_for(cfg.reward)"
                    )
        for name in cfg.terms:
            try:
                get_term(name)
            except UnknownNameError as exc:
                raise ValueError(f"reward.terms.{name}: {exc.args[0]}") from None
        self.stats = {tier: TierStats() for tier in TIERS}
        self.disagreements = 0
        self.judged = 0  # judge calls since the last take_stats: the budget's count
        self._task_checks: dict[tuple[str, str], str | None] = {}

    # -- the three tiers ----------------------------------------------------------------------
    def _spec(self, task: Task) -> VerifierSpec:
        family = str(task["family"])
        if family not in self.cfg.verifiers:
            raise ValueError(
                f"reward.verifiers has no verifier for task family {family!r} "
                f"(task {task.get('task_id')!r}); configured: {sorted(self.cfg.verifiers)}"
            )
        return self.cfg.verifiers[family]

    def _fast(self, candidate: Candidate, task: Task, spec: VerifierSpec) -> tuple[str | None, Verdict | None]:
        """Returns (the answer to verify, None) or (None, the verdict that ends the cascade)."""
        key = (spec.name, str(task.get("task_id", id(task))))
        if key not in self._task_checks:
            self._task_checks[key] = run_task_check(spec.name, task, spec.params)
        if self._task_checks[key] is not None:
            return None, Verdict(None, f"unscorable task: {self._task_checks[key]}")
        answers = extract_answers(candidate.text)
        if len(answers) != 1:  # several answers hedge; an answer hidden among others is not rewarded
            return None, Verdict(0.0, f"{len(answers)} final answers")
        answer = answers[0]
        if not answer:
            return None, Verdict(0.0, "empty answer")
        if len(answer) > self.cfg.max_answer_chars:
            return None, Verdict(
                0.0, f"answer of {len(answer)} chars > reward.max_answer_chars={self.cfg.max_answer_chars}"
            )
        rejected = run_precheck(spec.name, answer, task, spec.params)
        return (None, rejected) if rejected is not None else (answer, None)

    def _verify(self, tier: str, spec: VerifierSpec, answer: str, task: Task) -> Verdict:
        start = time.perf_counter()
        verdict = run_verifier(spec.name, answer, task, spec.params, sandbox=self.sandbox)
        self.stats[tier].add(verdict, time.perf_counter() - start)
        return verdict

    def _judge(self, answers: list[tuple[str, Task]]) -> list[Verdict]:
        """The judge tier, batched; candidates past the step's budget are unscorable."""
        budget = max(0, self.cfg.judge.max_calls_per_step - self.judged)
        within, over = answers[:budget], answers[budget:]
        start = time.perf_counter()
        try:
            verdicts = self.judge.judge_many([request_of(answer, task) for answer, task in within]) if within else []
        except Exception as exc:  # noqa: BLE001 — as in run_verifier: a crash is unscorable, never reward
            crashed = Verdict(None, f"judge raised {type(exc).__name__}: {str(exc)[:200]}")
            verdicts = [crashed] * len(within)
        self.judged += len(within)
        for verdict in verdicts:
            self.stats["judge"].add(verdict, (time.perf_counter() - start) / len(verdicts))
        spent = Verdict(
            None, f"judge budget spent: reward.judge.max_calls_per_step={self.cfg.judge.max_calls_per_step}"
        )
        for _ in over:
            self.stats["judge"].add(spent, 0.0)
        return [*verdicts, *[spent] * len(over)]

    def _selected_for_strict(self, family: str, verdict: Verdict, key: str) -> bool:
        strict = self.cfg.strict
        if family not in strict.verifiers or verdict.score is None:
            return False
        if strict.select == "passed" and not verdict.score > 0:
            return False
        if strict.sample_rate >= 1.0:
            return True
        bucket = int.from_bytes(hashlib.sha256(key.encode()).digest()[:4], "big") / 2**32
        return bucket < strict.sample_rate  # deterministic: an audit re-score selects the same ones

    # -- scoring ------------------------------------------------------------------------------
    def score_many(self, items: list[tuple[Candidate, Task]], keys: list[str] | None = None) -> list[RewardBreakdown]:
        keys = keys or [str(i) for i in range(len(items))]
        verdicts: list[Verdict | None] = [None] * len(items)
        tiers = ["fast"] * len(items)
        pending: list[tuple[int, VerifierSpec, str]] = []
        for i, (candidate, task) in enumerate(items):
            start = time.perf_counter()
            spec = self._spec(task)
            answer, verdict = self._fast(candidate, task, spec)
            self.stats["fast"].add(verdict, time.perf_counter() - start)
            if verdict is not None:
                verdicts[i] = verdict
            else:
                pending.append((i, spec, answer))
        failpoint("rl.verify")
        judged = [p for p in pending if get_verifier(p[1].name).needs_judge]
        for (i, _, _), verdict in zip(judged, self._judge([(p[2], items[p[0]][1]) for p in judged])):
            verdicts[i], tiers[i] = verdict, "judge"
        pending = [p for p in pending if not get_verifier(p[1].name).needs_judge]
        # The main tier: concurrent when the verifier runs in the sandbox (its pool bounds it).
        sandboxed = [p for p in pending if get_verifier(p[1].name).needs_sandbox]
        inline = [p for p in pending if not get_verifier(p[1].name).needs_sandbox]
        for i, spec, answer in inline:
            verdicts[i], tiers[i] = self._verify("verify", spec, answer, items[i][1]), "verify"
        if sandboxed:
            with ThreadPoolExecutor(max_workers=self.concurrency) as pool:
                done = pool.map(lambda p: self._verify("verify", p[1], p[2], items[p[0]][1]), sandboxed)
                for (i, _, _), verdict in zip(sandboxed, done):
                    verdicts[i], tiers[i] = verdict, "verify"
        strict_details: dict[int, str] = {}
        for i, _, answer in pending:
            family = str(items[i][1]["family"])
            if not self._selected_for_strict(family, verdicts[i], keys[i]):
                continue
            strict = self._verify("strict", self.cfg.strict.verifiers[family], answer, items[i][1])
            strict_details[i] = strict.details
            if strict.score is None:  # the strict tier cannot rule; the main verdict stands
                continue
            if strict.score != verdicts[i].score:
                self.disagreements += 1
            verdicts[i], tiers[i] = Verdict(strict.score, verdicts[i].details), "strict"
        return [self._compose(items[i][0], verdicts[i], tiers[i], strict_details.get(i)) for i in range(len(items))]

    def score(self, candidate: Candidate, task: Task, key: str = "0") -> RewardBreakdown:
        return self.score_many([(candidate, task)], [key])[0]

    def _compose(
        self, candidate: Candidate, verdict: Verdict, tier: str, strict_details: str | None
    ) -> RewardBreakdown:
        components = {"outcome": self.cfg.outcome_weight * (verdict.score or 0.0)}
        for name, term in self.cfg.terms.items():
            components[name] = contribution(get_term(name)(candidate, **term.params), term.weight, term.cap)
        details = {"outcome": verdict.details}
        if strict_details is not None:
            details["strict"] = strict_details
        return RewardBreakdown(sum(components.values()), verdict.score, components, tier, details)

    # -- reporting ----------------------------------------------------------------------------
    def metrics(self) -> dict[str, float]:
        return tier_metrics(self.stats, self.disagreements)

    def take_stats(self) -> tuple[dict[str, TierStats], int]:
        """The counts since the last call, and start counting afresh (one RL step's worth)."""
        taken = (self.stats, self.disagreements)
        self.stats, self.disagreements, self.judged = {tier: TierStats() for tier in TIERS}, 0, 0
        return taken


def tier_metrics(stats: dict[str, TierStats], disagreements: int) -> dict[str, float]:
    out: dict[str, float] = {}
    for tier, s in stats.items():
        out[f"verifier/{tier}/calls"] = float(s.calls)
        out[f"verifier/{tier}/pass_rate"] = s.passed / s.calls if s.calls else 0.0
        out[f"verifier/{tier}/unscorable"] = float(s.unscorable)
        out[f"verifier/{tier}/candidate_faults"] = float(s.candidate_faults)
        out[f"verifier/{tier}/latency_ms"] = 1000 * s.seconds / s.calls if s.calls else 0.0
        out[f"verifier/{tier}/seconds"] = s.seconds
    out["verifier/strict/disagreements"] = float(disagreements)
    return out


def merge_stats(into: dict[str, TierStats], other: dict[str, TierStats]) -> None:
    for tier, s in other.items():
        total = into.setdefault(tier, TierStats())
        total.calls, total.passed = total.calls + s.calls, total.passed + s.passed
        total.unscorable, total.seconds = total.unscorable + s.unscorable, total.seconds + s.seconds
        total.candidate_faults += s.candidate_faults
