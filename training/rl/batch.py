"""One RL step's trajectories, row-aligned: what the step computes per trajectory and filters.

`prepare_samples` (training/rl/loop.py) builds one `RolloutBatch` from the step's records and
scores (the plain dicts of the asset boundary, `scoring.episode_record` and `score_records`), adds
the trainer's, the reference's and the critic's per-token passes as (B, W) tensors, and filters
rows with one boolean mask (`select`), so nothing is kept aligned by index by hand. `samples()`
hands the update one `Sample` per row.

Per-token tensors are float32, zero-padded to `width`, the longest kept completion: `select`
trims it again, so every pass sees the shapes it would see on the kept rows alone.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

import torch
from torch import Tensor


def padded(rows: list, width: int, device: torch.device | str = "cpu") -> Tensor:
    """Rows of per-token floats (lists or 1-D tensors) as a zero-padded (len(rows), width) float32 tensor."""
    out = torch.zeros((len(rows), width))
    for i, row in enumerate(rows):
        out[i, : len(row)] = torch.as_tensor(row, dtype=torch.float32)[:width]
    return out.to(device, non_blocking=True)


def group_index(group_ids: list[str]) -> Tensor:
    """Each row's group as 0, 1, ... in order of first appearance."""
    index = {g: i for i, g in enumerate(dict.fromkeys(group_ids))}
    return torch.tensor([index[g] for g in group_ids])


@dataclass
class Sample:
    """One trajectory chosen for the update, with everything its loss needs (per-token rows)."""

    record: dict
    advantages: Tensor | list[float]
    # the trainer's log-probs before the update; None: the update's own (on-policy, see reuses_update_logprobs)
    old_logprobs: Tensor | list[float] | None
    ref_logprobs: Tensor | list[float] | None = None
    old_values: Tensor | list[float] | None = None
    returns: Tensor | list[float] | None = None


# The per-token (B, W) fields, trimmed and filtered together.
_TOKEN_FIELDS = (
    "tool_mask",
    "behaviour_logprobs",
    "old_logprobs",
    "ref_logprobs",
    "kl",
    "values",
    "returns",
    "advantages",
)


@dataclass(frozen=True)
class RolloutBatch:
    records: list[dict]  # episode records (ids, masks, group), in step order
    scores: list[dict]  # their rewards and reward components (score_records), same order
    tool_mask: Tensor  # (B, W) 1.0 on the policy's own tokens, 0.0 on tool output and padding
    behaviour_logprobs: Tensor  # (B, W) the rollout engine's log-probs of the sampled tokens
    old_logprobs: Tensor | None = None  # (B, W) the trainer's before the update; None: the update's own
    ref_logprobs: Tensor | None = None  # (B, W) the frozen reference's
    kl: Tensor | None = None  # (B, W) per-token KL estimate, old vs reference
    values: Tensor | None = None  # (B, W) the critic's (PPO)
    returns: Tensor | None = None  # (B, W) GAE returns (PPO)
    advantages: Tensor | None = None  # (B, W) per token (a sequence's advantage repeated for outcome estimators)

    @classmethod
    def of(cls, records: list[dict], scores: list[dict]) -> RolloutBatch:
        if len(records) != len(scores):
            raise ValueError(f"{len(records)} records but {len(scores)} scores")
        for record, score in zip(records, scores):
            if record.get("trajectory_id") != score.get("trajectory_id", record.get("trajectory_id")):
                raise ValueError(
                    f"records and scores out of order: {record['trajectory_id']} vs {score['trajectory_id']}"
                )
        width = max(len(r["completion_ids"]) for r in records)
        return cls(
            records,
            scores,
            tool_mask=padded([r["tool_mask"] for r in records], width),
            behaviour_logprobs=padded([r["logprobs"] for r in records], width),
        )

    def __len__(self) -> int:
        return len(self.records)

    @property
    def width(self) -> int:
        return self.tool_mask.shape[1]

    @property
    def lengths(self) -> list[int]:
        return [len(r["completion_ids"]) for r in self.records]

    @property
    def group_ids(self) -> list[str]:
        return [r["group_id"] for r in self.records]

    @property
    def group_index(self) -> Tensor:
        return group_index(self.group_ids)

    @property
    def rewards(self) -> list[float]:
        return [s["reward"] for s in self.scores]

    @property
    def outcomes(self) -> list[float | None]:
        return [s["outcome"] for s in self.scores]

    def with_(self, **per_token: Tensor | None) -> RolloutBatch:
        """The batch with per-token fields set ((B, W) tensors, or None)."""
        for name, value in per_token.items():
            if name not in _TOKEN_FIELDS:
                raise TypeError(f"{name!r} is not a per-token field of RolloutBatch")
            if value is not None and tuple(value.shape) != (len(self), self.width):
                raise ValueError(f"{name}: shape {tuple(value.shape)}, expected {(len(self), self.width)}")
        return replace(self, **per_token)

    def select(self, keep: Tensor | list[bool]) -> RolloutBatch:
        """The rows where `keep` is true, per-token fields trimmed to the longest kept row."""
        rows = [i for i, k in enumerate(torch.as_tensor(keep, dtype=torch.bool).tolist()) if k]
        records = [self.records[i] for i in rows]
        width = max((len(r["completion_ids"]) for r in records), default=0)
        index = torch.tensor(rows, dtype=torch.long)
        trimmed = {
            f.name: getattr(self, f.name)[index, :width] if getattr(self, f.name) is not None else None
            for f in fields(self)
            if f.name in _TOKEN_FIELDS
        }
        return RolloutBatch(records, [self.scores[i] for i in rows], **trimmed)

    def row(self, name: str, i: int) -> Tensor | None:
        """Row `i` of a per-token field, cut to that trajectory's length."""
        value = getattr(self, name)
        return None if value is None else value[i, : len(self.records[i]["completion_ids"])]

    def samples(self) -> list[Sample]:
        return [
            Sample(
                record,
                self.row("advantages", i),
                self.row("old_logprobs", i),
                self.row("ref_logprobs", i),
                self.row("values", i),
                self.row("returns", i),
            )
            for i, record in enumerate(self.records)
        ]
