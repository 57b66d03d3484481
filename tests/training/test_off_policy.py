"""One-step-off-policy rollouts (issue 29, item 6): step t+1's batch is generated while step t's
update runs, by the weights from before that update, and trained with truncated importance weights."""

import copy

import pytest
import torch

pytestmark = pytest.mark.methods


def test_it_needs_the_importance_correction_and_one_process():
    from pydantic import ValidationError

    from configs.schema import RLConfig
    from training.rl.loop import train_round

    with pytest.raises(ValidationError, match="set rl.tis_cap"):
        RLConfig(one_step_off_policy=True)
    with pytest.raises(ValueError, match="without dynamic sampling"):
        train_round(
            None,
            None,
            None,
            [],
            {},
            rl=RLConfig(algorithm="dapo", one_step_off_policy=True, tis_cap=2.0),
            rollout=None,
            cascade=None,
            round_index=1,
            policy_version="t",
            seed=0,
        )


def test_each_batch_is_sampled_by_the_weights_one_update_before_the_ones_it_trains(warm_policy, micro_cfg, sandbox):
    """The behaviour log-probs recorded for step k's batch are those of the weights after k-2
    updates (step 1's: the start), i.e. one update behind the trainer that step k updates."""
    from configs.schema import RewardConfig
    from training.rl.loop import recorded_logprobs, train_round
    from verifiers.cascade import Cascade

    tok, start = warm_policy.tokenizer, copy.deepcopy(warm_policy.model)
    policy = copy.deepcopy(warm_policy.model)
    after_update = {0: copy.deepcopy(start.state_dict())}

    def snapshot(step: int, metrics: dict) -> None:
        after_update[step] = copy.deepcopy(policy.state_dict())

    rl = micro_cfg.rl.model_copy(
        update={
            "steps_per_round": 3,
            "prompts_per_step": 4,
            "group_size": 4,
            "kl_coef": 0.0,
            "tis_cap": 2.0,
            "one_step_off_policy": True,
            "drop_zero_variance_groups": False,  # every step updates, so the weights move each time
        }
    )
    tasks = [t for t in warm_policy.tasks if t["family"] == "arithmetic"][:32]
    result = train_round(
        policy,
        None,
        tok,
        tasks,
        warm_policy.tools,
        rl=rl,
        rollout=micro_cfg.rollout,
        cascade=Cascade(RewardConfig(), sandbox),
        round_index=1,
        policy_version="t",
        seed=0,
        on_step=snapshot,
    )
    assert [h["rollout/policy_lag"] for h in result.history] == [0.0, 1.0, 1.0]
    assert result.policy is policy  # the trained weights, not the copy that samples
    judge = copy.deepcopy(start)
    for step, sampled_by in [(1, 0), (2, 0), (3, 1)]:
        records = [r for r in result.rollouts if r["step"] == step]
        assert records
        judge.load_state_dict(after_update[sampled_by])
        expected = recorded_logprobs(judge, records, temperature=micro_cfg.rollout.temperature, pad_id=tok.eos_token_id)
        judge.load_state_dict(after_update[step - 1])
        trainer = recorded_logprobs(judge, records, temperature=micro_cfg.rollout.temperature, pad_id=tok.eos_token_id)
        gap_sampler, gap_trainer = 0.0, 0.0
        for r, e, t in zip(records, expected, trainer):
            mask = torch.tensor(r["tool_mask"], dtype=torch.bool)
            behaviour = torch.tensor(r["logprobs"])[mask]
            gap_sampler = max(gap_sampler, (behaviour - torch.tensor(e)[mask]).abs().max().item())
            gap_trainer = max(gap_trainer, (behaviour - torch.tensor(t)[mask]).abs().max().item())
        assert gap_sampler < 1e-3, (step, gap_sampler)
        if step > 1:  # a batch generated ahead is not the trainer's own: the importance weights correct it
            assert gap_trainer > 1e-2, (step, gap_trainer)
