"""Sampling randomness keyed to (seed, round, step, task, sample index), not to rank or batch
position (issue 23): the pure generator, the inverse-CDF draw, and both engines under the loop."""

from __future__ import annotations

import math

import pytest
import torch

from training.agent.engines import HFEngine
from training.agent.loop import run_episodes
from training.agent.sampling_keys import episode_seed, inverse_cdf, turn_seed, uniforms

pytestmark = pytest.mark.scaleout


def test_uniforms_are_a_pure_function_of_seed_and_index_and_look_uniform():
    seeds = list(range(20_000))
    u = uniforms(seeds, 0)
    assert torch.equal(u, uniforms(seeds, 0)) and not torch.equal(u, uniforms(seeds, 1))
    assert float(u.min()) >= 0.0 and float(u.max()) < 1.0
    # Kolmogorov-Smirnov against U(0, 1): the 0.1% critical value at n = 20k is 1.95 / sqrt(n)
    s = u.sort().values
    n = len(s)
    ks = float(torch.maximum(torch.arange(1, n + 1) / n - s, s - torch.arange(n) / n).max())
    assert ks < 1.95 / math.sqrt(n), ks
    # neighbouring seeds and neighbouring indices are not correlated
    assert abs(float(torch.corrcoef(torch.stack([u[:-1], u[1:]]))[0, 1])) < 0.03
    assert abs(float(torch.corrcoef(torch.stack([u, uniforms(seeds, 1)]))[0, 1])) < 0.03
    # one row's uniform does not depend on the other rows of the call
    assert float(uniforms([seeds[7]], 3)[0]) == float(uniforms(seeds, 3)[7])


def test_episode_and_turn_seeds_are_stable_and_distinct():
    a = episode_seed("seed=0/round=1/step=2", "math-17", 3)
    assert a == episode_seed("seed=0/round=1/step=2", "math-17", 3)  # no per-process hash salt
    others = {
        episode_seed("seed=0/round=1/step=2", "math-17", 4),
        episode_seed("seed=0/round=1/step=3", "math-17", 3),
        episode_seed("seed=1/round=1/step=2", "math-17", 3),
        episode_seed("seed=0/round=1/step=2", "math-18", 3),
    }
    assert a not in others and len(others) == 4
    assert 0 <= a < 2**63 and turn_seed(a, 0) != turn_seed(a, 5) and 0 <= turn_seed(a, 5) < 2**63


def test_inverse_cdf_matches_the_distribution_and_never_draws_a_zero_probability_token():
    probs = torch.tensor([0.0, 0.5, 0.0, 0.2, 0.3, 0.0])
    n = 30_000
    draws = inverse_cdf(probs.expand(n, -1), uniforms(list(range(n)), 0))
    counts = torch.bincount(draws, minlength=len(probs)).double()
    assert counts[probs == 0].sum() == 0
    expected = probs.double() * n
    chi2 = float(((counts - expected)[probs > 0] ** 2 / expected[probs > 0]).sum())
    assert chi2 < 13.8, chi2  # 0.1% critical value, 2 degrees of freedom
    # unnormalized rows are drawn by their relative mass; u -> 1 still lands on the last positive token
    assert int(inverse_cdf(torch.tensor([[2.0, 0.0, 6.0, 0.0]]), torch.tensor([0.999999]))[0]) == 2
    assert int(inverse_cdf(torch.tensor([[2.0, 0.0, 6.0, 0.0]]), torch.tensor([0.0]))[0]) == 0


def tasks_of(warm_policy, family, n):
    return [t for t in warm_policy.tasks if t["family"] == family][:n]


def _by_episode(episodes) -> dict[tuple[str, int], list[int]]:
    return {(e.task["task_id"], e.sample_index): e.completion_ids for e in episodes}


def test_moving_episodes_between_ranks_keeps_their_sampled_ids(warm_policy, micro_cfg):
    """Two 'ranks' each roll out two tasks x two samples; then the tasks swap ranks and order
    (the same batch shape). Every episode samples the same ids wherever it ran, and a different
    step key samples different ones."""
    tasks = [t for family in ("arithmetic", "search") for t in tasks_of(warm_policy, family, 2)]
    engine = HFEngine(warm_policy.model, warm_policy.tokenizer)
    common = dict(
        group_size=2,
        tools=warm_policy.tools,
        cfg=micro_cfg.rollout.model_copy(update={"temperature": 1.3}),
        sampling_key="seed=0/round=1/step=1",
    )
    before = _by_episode(
        run_episodes(engine, warm_policy.tokenizer, tasks[:2], **common)
        + run_episodes(engine, warm_policy.tokenizer, tasks[2:], **common)
    )
    after = _by_episode(
        run_episodes(engine, warm_policy.tokenizer, [tasks[3], tasks[0]], **common)
        + run_episodes(engine, warm_policy.tokenizer, [tasks[1], tasks[2]], **common)
    )
    assert before == after
    assert len({tuple(ids) for ids in before.values()}) > 1  # really sampled (T = 1.3), not one greedy answer
    other = _by_episode(
        run_episodes(engine, warm_policy.tokenizer, tasks[:2], **{**common, "sampling_key": "seed=0/round=1/step=2"})
    )
    assert any(other[k] != before[k] for k in other)
