"""Composite reward: outcome verifier by task family + small, capped shaping terms.

    reward = outcome_weight * outcome            (1 if the single final answer is right)
           + format_weight  * well_formed        (tags in the protocol's order)
           - min(tool_cost * tool_calls, max_tool_penalty)

Outcome dominates by construction (configs.schema.RewardConfig refuses shaping >= outcome).
The per-call cost is ToolRL's tool-efficiency idea: with correctness alone, RL learns to call
the tool *always*; a small cost makes it learn *when* (FIELD-NOTES calibration).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from verifiers.math_equiv import numeric_match
from verifiers.protocol import extract_answers, is_well_formed

# family -> outcome verifier(prediction, gold, rel_tol) -> score | None
OutcomeVerifier = Callable[[str, str, float], "float | None"]
OUTCOME_VERIFIERS: dict[str, OutcomeVerifier] = {"arithmetic": numeric_match}


@dataclass(frozen=True)
class RewardWeights:
    outcome_weight: float = 1.0
    format_weight: float = 0.1
    tool_cost: float = 0.1
    max_tool_penalty: float = 0.3
    rel_tol: float = 1e-6


@dataclass(frozen=True)
class RewardBreakdown:
    reward: float
    outcome: float | None  # None: unscorable (bad gold), counted and reported, scored as 0 reward
    well_formed: float
    tool_penalty: float
    details: dict[str, str] = field(default_factory=dict)


def outcome_score(family: str, policy_turns: list[str], gold: str, rel_tol: float) -> tuple[float | None, str]:
    """Score the policy's single final answer. Several answers, or none, score 0: an answer
    hidden among others must not be rewarded (reward hacking by hedging)."""
    verifier = OUTCOME_VERIFIERS.get(family)
    if verifier is None:
        raise KeyError(f"no outcome verifier for family {family!r}; known: {sorted(OUTCOME_VERIFIERS)}")
    answers = extract_answers("".join(policy_turns))
    if len(answers) != 1:
        unscorable = verifier(gold, gold, rel_tol) is None
        return (None if unscorable else 0.0), f"{len(answers)} answers"
    score = verifier(answers[0], gold, rel_tol)
    return score, f"answer={answers[0][:32]!r} gold={gold!r}"


def compute_reward(
    family: str, policy_turns: list[str], num_tool_calls: int, gold: str, weights: RewardWeights
) -> RewardBreakdown:
    """`policy_turns`: the text of each contiguous run of policy-sampled tokens (tool_mask == 1)."""
    outcome, why = outcome_score(family, policy_turns, gold, weights.rel_tol)
    formed = 1.0 if is_well_formed(policy_turns) else 0.0
    penalty = min(weights.tool_cost * num_tool_calls, weights.max_tool_penalty)
    total = weights.outcome_weight * (outcome or 0.0) + weights.format_weight * formed - penalty
    return RewardBreakdown(
        reward=total, outcome=outcome, well_formed=formed, tool_penalty=penalty, details={"outcome": why}
    )
