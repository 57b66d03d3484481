"""The HF engine's work savings change no sampled token (issue 26): KV kept across an episode's
turns, a group's identical prompts prefilled once, stopped rows dropped from the decode batch at
once. Each is compared with the engine doing all the work (re-prefilling every turn, every row, and
decoding stopped rows until half the batch has stopped), on multi-turn episodes of policies that
call tools: the same ids, and log-probs equal to float rounding."""

from __future__ import annotations

import pytest
import torch

from training.agent.engines import HFEngine, Sampling
from training.agent.loop import run_episodes

pytestmark = pytest.mark.perf

FAMILIES = ("arithmetic", "search", "code")
BASELINE = {"reuse_kv": False, "share_prompts": False, "drop_stopped_at": 0.5}


def rollout(engine, policy, cfg):
    tasks = [t for family in FAMILIES for t in [t for t in policy.tasks if t["family"] == family][:6]]
    return run_episodes(
        engine, policy.tokenizer, tasks, group_size=4, tools=policy.tools, cfg=cfg, sampling_key="kv-reuse"
    )


@pytest.mark.parametrize("policy_name", ["warm_policy", "split_policy"])  # tags as single tokens / as text
def test_kept_kv_shared_prompts_and_dropped_rows_sample_what_full_work_samples(policy_name, micro_cfg, request):
    policy = request.getfixturevalue(policy_name)
    cfg = (
        micro_cfg.rollout
        if policy_name == "warm_policy"
        else micro_cfg.rollout.model_copy(update={"system_prompt": "Answer in <answer></answer>."})
    )
    fast = HFEngine(policy.model, policy.tokenizer)
    full = HFEngine(policy.model, policy.tokenizer, **BASELINE)
    saved, everything = rollout(fast, policy, cfg), rollout(full, policy, cfg)

    assert sum(e.turns >= 2 for e in everything) >= 10, "too few multi-turn episodes to test turn reuse"
    for a, b in zip(saved, everything):
        assert (a.group_id, a.sample_index) == (b.group_id, b.sample_index)
        assert a.completion_ids == b.completion_ids
        assert a.tool_mask == b.tool_mask
        torch.testing.assert_close(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-5, rtol=0)
    # and the work was really saved: fewer prefill tokens, no decode row that had stopped
    assert fast.counts["prefill computed"] < 0.6 * full.counts["prefill computed"]
    assert fast.counts["decode computed"] == fast.counts["decode real"]
    assert full.counts["decode computed"] > full.counts["decode real"]


def test_a_turn_reuses_its_episodes_kv_only_when_the_sequence_continues_it():
    from training.distributed_check import tiny_model

    model = tiny_model(seed=3).eval()
    engine, plain = HFEngine(model), HFEngine(model, reuse_kv=False)
    g = torch.Generator().manual_seed(0)
    sequences = [torch.randint(1, 64, (n,), generator=g).tolist() for n in (3, 7, 5, 9)]
    keys = ["a", "b", "c", "d"]
    sampling, seeds = Sampling(), [11, 12, 13, 14]
    first = engine.generate(sequences, [6, 3, 8, 5], stop_ids={63}, sampling=sampling, seeds=seeds, keys=keys)
    assert set(engine._kept) == set(keys)
    # turn 2: a, b continue their turn with an observation; c's sequence was changed; d is gone
    nxt = [
        sequences[0] + first[0].ids + [5, 6, 7],
        sequences[1] + first[1].ids + [8],
        [1, 2] + sequences[2] + first[2].ids,
    ]
    before = engine.counts["prefill real"]
    second = engine.generate(nxt, [4, 4, 4], stop_ids={63}, sampling=sampling, seeds=[21, 22, 23], keys=keys[:3])
    # only a's and b's new tokens (their last sampled id, never fed, and the observation), and all of c's
    assert engine.counts["prefill real"] - before == (1 + 3) + (1 + 1) + len(nxt[2])
    assert "d" not in engine._kept  # not continued: freed
    again = plain.generate(nxt, [4, 4, 4], stop_ids={63}, sampling=sampling, seeds=[21, 22, 23])
    for a, b in zip(second, again):
        assert a.ids == b.ids
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-5)
    engine.sync_weights(model)
    assert engine._kept == {}  # kept KV was computed by weights that may have changed
