"""Rollout records and their rewards. Rewards are a pure function of a stored rollout record
and its task, so a round can be re-scored later with a stricter verifier (an audit)."""

from __future__ import annotations

import json

from training.rollout import Episode
from training.sequences import policy_spans
from verifiers.rewards import RewardWeights, compute_reward


def episode_record(episode: Episode, *, round_index: int, step: int, policy_version: str, tokenizer) -> dict:
    """One row of `rollout_batches` (the trajectory contract in docs/architecture.md)."""
    t = episode.task
    return {
        "trajectory_id": f"{episode.group_id}-{episode.sample_index}",
        "task_id": t["task_id"],
        "family": t["family"],
        "level": int(t["level"]),
        "group_id": episode.group_id,
        "sample_index": episode.sample_index,
        "round": round_index,
        "step": step,
        "policy_version": policy_version,
        "prompt_ids": episode.prompt_ids,
        "completion_ids": episode.completion_ids,
        "tool_mask": episode.tool_mask,
        "logprobs": episode.logprobs,
        "completion": tokenizer.decode(episode.completion_ids),
        "turns": episode.turns,
        "num_tool_calls": len(episode.tool_calls),
        "tool_calls": json.dumps(episode.tool_calls),
        "stop_reason": episode.stop_reason,
    }


def score_record(record: dict, task: dict, tokenizer, weights: RewardWeights) -> dict:
    """One row of `verified_rewards`: the total and each component, for audit."""
    turns = [tokenizer.decode(span) for span in policy_spans(list(record["completion_ids"]), list(record["tool_mask"]))]
    r = compute_reward(task["family"], turns, int(record["num_tool_calls"]), str(task["answer"]), weights)
    return {
        "trajectory_id": record["trajectory_id"],
        "task_id": record["task_id"],
        "group_id": record["group_id"],
        "level": int(record["level"]),
        "round": int(record["round"]),
        "step": int(record["step"]),
        "reward": r.reward,
        "outcome": r.outcome,
        "well_formed": r.well_formed,
        "tool_penalty": r.tool_penalty,
        "num_tool_calls": int(record["num_tool_calls"]),
        "details": json.dumps(r.details),
    }
