"""RolloutBatch: one step's trajectories kept aligned, filtered with one mask (training/rl/batch.py)."""

from __future__ import annotations

import pytest
import torch

from training.rl.batch import RolloutBatch


def _rows(lengths, groups):
    records = [
        {
            "trajectory_id": f"t{i}",
            "group_id": g,
            "completion_ids": list(range(n)),
            "tool_mask": [1] * (n - 1) + [0],
            "logprobs": [-0.5 - i] * n,
        }
        for i, (n, g) in enumerate(zip(lengths, groups))
    ]
    scores = [{"trajectory_id": f"t{i}", "reward": float(i), "outcome": float(i % 2)} for i in range(len(lengths))]
    return records, scores


def test_a_batch_pads_to_its_longest_row_and_keeps_rows_aligned():
    batch = RolloutBatch.of(*_rows([3, 5, 2], "aab"))
    assert batch.width == 5 and len(batch) == 3 and batch.lengths == [3, 5, 2]
    assert batch.tool_mask.tolist()[2] == [1, 0, 0, 0, 0] and batch.behaviour_logprobs[1, 4] == -1.5
    assert batch.group_index.tolist() == [0, 0, 1] and batch.rewards == [0.0, 1.0, 2.0]


def test_select_filters_every_field_with_one_mask_and_trims_the_width():
    batch = RolloutBatch.of(*_rows([3, 5, 2], "aab"))
    batch = batch.with_(advantages=torch.arange(15, dtype=torch.float32).reshape(3, 5))
    kept = batch.select([True, False, True])
    assert [r["trajectory_id"] for r in kept.records] == ["t0", "t2"] and [s["reward"] for s in kept.scores] == [0, 2]
    assert kept.width == 3 and kept.advantages.tolist() == [[0, 1, 2], [10, 11, 12]]
    assert kept.old_logprobs is None  # fields never set stay unset
    samples = kept.samples()
    assert samples[1].advantages.tolist() == [10, 11] and samples[1].record["trajectory_id"] == "t2"
    assert not batch.select(torch.zeros(3, dtype=torch.bool))


def test_misaligned_inputs_and_misshapen_fields_are_refused():
    records, scores = _rows([3, 5], "ab")
    with pytest.raises(ValueError, match="out of order: t0 vs t1"):
        RolloutBatch.of(records, scores[::-1])
    with pytest.raises(ValueError, match="2 records but 1 scores"):
        RolloutBatch.of(records, scores[:1])
    batch = RolloutBatch.of(records, scores)
    with pytest.raises(ValueError, match=r"advantages: shape \(2, 4\), expected \(2, 5\)"):
        batch.with_(advantages=torch.zeros(2, 4))
    with pytest.raises(TypeError, match="'reward' is not a per-token field"):
        batch.with_(reward=torch.zeros(2, 5))
