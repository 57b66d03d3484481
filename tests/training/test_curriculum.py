"""The curriculum: pass-rate history per task, weights that drop always- and never-solved tasks."""

import math
import random
from collections import Counter

import pytest

from configs.schema import CurriculumConfig
from training.rl.curriculum import pool_weights, sample_prompts, task_weight, update_history


def rows(task_id, outcomes, family="search", level=2):
    return [{"task_id": task_id, "family": family, "level": level, "outcome": o} for o in outcomes]


def test_history_accumulates_over_rounds_and_skips_unscorable():
    h = update_history([], rows("a", [1, 0, 1, None, float("nan")]) + rows("b", [0.5, 0.5]), round_index=1)
    assert (h["a"]["attempts"], h["a"]["successes"], h["a"]["pass_rate"], h["a"]["rounds"]) == (
        3,
        2.0,
        pytest.approx(2 / 3),
        1,
    )
    h = update_history(h.values(), rows("a", [1]), round_index=2)
    assert (h["a"]["attempts"], h["a"]["rounds"], h["a"]["last_round"]) == (4, 2, 2) and h["b"]["pass_rate"] == 0.5


@pytest.mark.parametrize(
    "outcomes, weighting, expected",
    [
        ([1] * 8, "uniform", 0.0),  # always solved: no GRPO signal
        ([0] * 8, "uniform", 0.0),  # never solved
        ([1] * 4 + [0] * 4, "uniform", 1.0),
        ([1] * 4 + [0] * 4, "variance", 1.0),
        ([1] * 6 + [0] * 2, "variance", 0.75),
        ([1] * 3, "uniform", 1.0),  # too few attempts to judge
    ],
)
def test_task_weight(outcomes, weighting, expected):
    h = update_history([], rows("a", outcomes), 1)["a"]
    assert task_weight(h, CurriculumConfig(weighting=weighting)) == pytest.approx(expected)


def test_unseen_tasks_explore_and_all_zero_falls_back_to_uniform():
    cfg = CurriculumConfig()
    h = update_history([], rows("solved", [1] * 8), 1)
    assert pool_weights(["solved", "new"], h, cfg) == {"solved": 0.0, "new": 1.0}
    assert pool_weights(["solved"], h, cfg) == {"solved": 1.0}
    assert pool_weights(["solved", "new"], h, CurriculumConfig(enabled=False)) == {"solved": 1.0, "new": 1.0}


def test_sampling_follows_weights_without_repeats():
    tasks = [{"task_id": f"t{i}"} for i in range(10)]
    weights = {"t0": 0.0, "t1": 0.0, **{f"t{i}": (4.0 if i == 2 else 1.0) for i in range(2, 10)}}
    counts = Counter()
    rng = random.Random(0)
    for _ in range(2000):
        drawn = sample_prompts(tasks, weights, 3, rng)
        assert len({t["task_id"] for t in drawn}) == 3
        counts.update(t["task_id"] for t in drawn)
    assert counts["t0"] == counts["t1"] == 0
    assert counts["t2"] > 1.8 * max(counts[f"t{i}"] for i in range(3, 10))
    # zero weights still fill when nothing else is left
    assert len(sample_prompts(tasks[:2], {"t0": 0.0, "t1": 0.0}, 3, rng)) == 2
    assert math.isclose(sum(counts.values()), 6000)


def test_pool_frame_lists_every_task_with_its_next_weight():
    from training.rl.curriculum import pool_frame

    tasks = [{"task_id": t, "family": "code", "level": 1} for t in ("solved", "mixed", "new")]
    h = update_history([], rows("solved", [1] * 8, "code", 1) + rows("mixed", [1, 0] * 4, "code", 1), 1)
    pool = pool_frame(h, tasks, CurriculumConfig()).set_index("task_id")
    assert pool["weight"].to_dict() == {"solved": 0.0, "mixed": 1.0, "new": 1.0}
    assert (
        pool.loc["new", "attempts"] == 0
        and math.isnan(pool.loc["new", "pass_rate"])
        and pool.loc["mixed", "pass_rate"] == 0.5
    )
    assert set(pool_frame(h, tasks, CurriculumConfig(enabled=False))["weight"]) == {1.0}
