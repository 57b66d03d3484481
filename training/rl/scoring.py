"""Rollout records and their rewards. Rewards are a pure function of a stored rollout record
and its task, so a round can be re-scored later with a stricter verifier (an audit)."""

from __future__ import annotations

import json
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable

from environments.base import task_view
from environments.family import tools_of
from training.agent.loop import Episode
from training.rl.process import process_total, turn_signals
from training.sequences import policy_spans
from verifiers.cascade import Cascade, TierStats, tier_metrics
from verifiers.protocol import is_well_formed
from verifiers.shaping import Candidate


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


def candidate_of(record: dict, tokenizer) -> Candidate:
    """The policy's own text of a stored trajectory (tool_mask == 1 spans only): observations
    are never shown to a verifier, so a tool cannot inject an answer."""
    ids, mask = list(record["completion_ids"]), list(record["tool_mask"])
    turns = [tokenizer.decode(span) for span in policy_spans(ids, mask)]
    return Candidate(turns, num_policy_tokens=int(sum(mask)), tools=tools_of(str(record["family"])))


def score_records(records: list[dict], tasks_by_id: dict[str, dict], tokenizer, cascade: Cascade) -> list[dict]:
    """Rows of `verified_rewards`: the total, each component, the deciding tier and why."""
    items = [(candidate_of(r, tokenizer), task_view(tasks_by_id[r["task_id"]])) for r in records]
    breakdowns = cascade.score_many(items, keys=[r["trajectory_id"] for r in records])
    process = cascade.cfg.process
    rows = []
    for record, (candidate, _), b in zip(records, items, breakdowns):
        extra, reward = {}, b.reward
        if process.enabled:  # tool results as per-turn signals (training/rl/process.py)
            total = process_total(turn_signals(json.loads(record["tool_calls"]), process.penalties), process.cap)
            if process.credit == "trajectory":  # one more component of the reward
                extra, reward = {"reward_process": total}, b.reward + total
            else:  # credited per turn in the advantage (training/rl/loop.py); reported, not in the reward
                extra = {"process_total": total}
        rows.append(
            {
                "trajectory_id": record["trajectory_id"],
                "task_id": record["task_id"],
                "group_id": record["group_id"],
                "family": record["family"],
                "level": int(record["level"]),
                "round": int(record["round"]),
                "step": int(record["step"]),
                "reward": reward,
                "outcome": b.outcome,
                **{f"reward_{name}": value for name, value in b.components.items()},
                **extra,
                "well_formed": float(is_well_formed(candidate.policy_turns, candidate.tools)),
                "num_tool_calls": int(record["num_tool_calls"]),
                "policy_tokens": candidate.num_policy_tokens,
                "tier": b.tier,
                "details": json.dumps(b.details),
            }
        )
    return rows


class Verifying:
    """Verifies episodes while the rest of the batch still generates: run_episodes hands each batch
    of finished episodes to it (`on_finished`), and one background thread turns them into records
    and scores them; `results` waits for the last and returns both in episode order. Rewards are a
    pure function of the record and the task, so the scores are those of scoring the whole batch
    after the rollout (tests/training/test_overlapped_verification.py). One thread: the cascade's
    counters are never updated from two at once. `background=False` (rollout.verify_during_rollout
    off): the same, but everything is scored in `results`, on the caller's thread, after the rollout
    (on a 2-core CPU the overlap takes the engine's cores: benchmarks/verify_overlap.py)."""

    def __init__(
        self,
        to_record: Callable[[Episode], dict],
        tasks_by_id: dict[str, dict],
        tokenizer,
        cascade: Cascade,
        *,
        background: bool = True,
    ):
        self.to_record, self.tasks_by_id, self.tokenizer, self.cascade = to_record, tasks_by_id, tokenizer, cascade
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="verify") if background else None
        self._batches: list[tuple[list[Episode], Future | None]] = []

    def __enter__(self) -> Verifying:
        return self

    def __exit__(self, *exc) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)

    def __call__(self, episodes: list[Episode]) -> None:
        batch = list(episodes)
        self._batches.append((batch, self._pool.submit(self._score, batch) if self._pool is not None else None))

    def _score(self, episodes: list[Episode]) -> tuple[list[dict], list[dict]]:
        records = [self.to_record(e) for e in episodes]
        return records, score_records(records, self.tasks_by_id, self.tokenizer, self.cascade)

    def results(self, episodes: list[Episode]) -> tuple[list[dict], list[dict]]:
        """(records, scores) of `episodes`, in their order; each must have been handed over."""
        if self._pool is None:  # score everything now, in one call (the cascade's pool stays full)
            batch = [e for b, _ in self._batches for e in b]
            self._batches = [(batch, None)]
            scored = [self._score(batch)]
        else:
            scored = [future.result() for _, future in self._batches]
        by_episode = {}
        for (batch, _), (records, scores) in zip(self._batches, scored):
            by_episode.update({id(e): pair for e, pair in zip(batch, zip(records, scores))})
        missing = [e.group_id for e in episodes if id(e) not in by_episode]
        if missing:
            raise RuntimeError(f"{len(missing)} episodes finished without being verified (first: {missing[0]!r})")
        pairs = [by_episode[id(e)] for e in episodes]
        return [r for r, _ in pairs], [s for _, s in pairs]


def reward_summary(rows: list[dict], tier_stats: dict[str, TierStats], disagreements: int) -> dict[str, float]:
    """What `verified_rewards` reports in Dagster and MLflow: each component's mean, the
    unscorable count, and per-tier calls, pass rate and latency."""
    n = max(len(rows), 1)
    out = {
        "reward/mean": sum(r["reward"] for r in rows) / n,
        "reward/outcome/pass_rate": sum(r["outcome"] or 0.0 for r in rows) / n,
        "reward/unscorable": float(sum(r["outcome"] is None for r in rows)),
        # 0s for a candidate that broke the verifier's machinery (it would otherwise escape as unscorable)
        "reward/candidate_faults": float(sum(s.candidate_faults for s in tier_stats.values())),
    }
    for key in rows[0] if rows else {}:
        if key.startswith("reward_"):
            out[f"reward/{key[len('reward_') :]}/mean"] = sum(r[key] for r in rows) / n
    return {**out, **tier_metrics(tier_stats, disagreements)}


def tier_table(tier_stats: dict[str, TierStats]) -> str:
    """Markdown: where verification time went."""
    lines = [
        "| tier | calls | pass rate | unscorable | mean latency (ms) | total (s) |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for tier, s in tier_stats.items():
        rate = f"{s.passed / s.calls:.3f}" if s.calls else "-"
        latency = f"{1000 * s.seconds / s.calls:.3f}" if s.calls else "-"
        lines.append(f"| {tier} | {s.calls} | {rate} | {s.unscorable} | {latency} | {s.seconds:.2f} |")
    return "\n".join(lines)


def _outcome(value) -> float | None:
    """Stored outcomes come back from Parquet as NaN where they were None."""
    return None if value is None or value != value else float(value)


def disagreements(baseline: list[dict], audited: list[dict], records: list[dict], tokenizer) -> list[dict]:
    """Trajectories whose outcome differs between two scorings of the same rollouts.
    `training_only`: rewarded (more) by the baseline than by the audit — the signature of reward
    hacking when the audit is the stricter verifier."""
    by_id = {r["trajectory_id"]: r for r in records}
    rows = []
    for old, new in zip(baseline, audited):
        if old["trajectory_id"] != new["trajectory_id"]:
            raise ValueError(f"audit rows out of order: {old['trajectory_id']!r} vs {new['trajectory_id']!r}")
        a, b = _outcome(old["outcome"]), _outcome(new["outcome"])
        if a == b:
            continue
        if a is None or b is None:
            kind = "scorability"
        else:
            kind = "training_only" if a > b else "audit_only"
        record = by_id[old["trajectory_id"]]
        rows.append(
            {
                "trajectory_id": old["trajectory_id"],
                "task_id": old["task_id"],
                "kind": kind,
                "baseline_outcome": a,
                "audit_outcome": b,
                "baseline_reward": float(old["reward"]),
                "audit_reward": float(new["reward"]),
                "audit_details": new["details"],
                "completion": tokenizer.decode(list(record["completion_ids"])),
            }
        )
    return rows
