"""Pages people read next to the curves: sample trajectories of a round, as Markdown."""

from __future__ import annotations

import json


def sample_trajectories_md(rollouts: list[dict], rewards: list[dict], prompts: dict[str, str]) -> str:
    """From the round's last step, per family one solved and one unsolved trajectory (when they
    exist): prompt, what the policy wrote with the tool observations in place, reward and why."""
    last_step = max(r["step"] for r in rollouts)
    reward_of = {r["trajectory_id"]: r for r in rewards}
    lines = [f"# Sample trajectories (step {last_step})", ""]
    for family in sorted({r["family"] for r in rollouts}):
        rows = [
            r for r in rollouts if r["family"] == family and r["step"] == last_step and r["trajectory_id"] in reward_of
        ]
        passed = [r for r in rows if reward_of[r["trajectory_id"]]["outcome"] >= 1.0]
        failed = [r for r in rows if reward_of[r["trajectory_id"]]["outcome"] < 1.0]
        picks = passed[:1] + failed[:1]
        lines += [f"## {family}", ""]
        for r in picks:
            score = reward_of[r["trajectory_id"]]
            calls = json.loads(r["tool_calls"]) if isinstance(r["tool_calls"], str) else r["tool_calls"]
            lines += [
                f"### {r['trajectory_id']}: reward {score['reward']:.3f} (outcome {score['outcome']:.2f}), {r['turns']} turns, "
                f"{len(calls)} tool calls, stopped by {r['stop_reason']}",
                "",
                "**Prompt**",
                "",
                "```",
                prompts.get(r["task_id"], "?").strip(),
                "```",
                "",
                "**Completion** (tool observations included, masked from the loss)",
                "",
                "```",
                r["completion"].strip(),
                "```",
                "",
            ]
    return "\n".join(lines)
