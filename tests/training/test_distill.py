"""On-policy distillation (issue 29, item 3): the per-token signal from a teacher's log-probs of
the tokens the student sampled."""

import math

import pytest
import torch

from training.rl.math import distill_advantages

pytestmark = pytest.mark.methods


def test_the_signal_is_the_teachers_log_prob_minus_the_students_on_policy_tokens_only():
    student = torch.tensor([[-1.0, -2.0, -0.5, -3.0]])
    teacher = torch.tensor([[-0.5, -4.0, -0.5, -0.1]])
    mask = torch.tensor([[1, 1, 0, 1]])
    signal = distill_advantages(student, teacher, mask, clamp=5.0)
    assert signal.tolist() == [[0.5, -2.0, 0.0, pytest.approx(2.9)]]


def test_the_signal_is_clamped_and_carries_no_gradient():
    student = torch.tensor([[-0.1, -20.0]], requires_grad=True)
    teacher = torch.tensor([[-30.0, -0.1]])
    signal = distill_advantages(student, teacher, torch.ones(1, 2), clamp=5.0)
    assert signal.tolist() == [[-5.0, 5.0]] and not signal.requires_grad


def test_its_expectation_under_the_student_is_minus_the_reverse_kl():
    """Sampled from the student, the mean signal estimates -KL(student || teacher)."""
    p = torch.tensor([0.7, 0.2, 0.1])
    q = torch.tensor([0.4, 0.4, 0.2])
    draws = torch.multinomial(p, 200_000, replacement=True, generator=torch.Generator().manual_seed(0))
    signal = distill_advantages(p.log()[draws][None], q.log()[draws][None], torch.ones(1, len(draws)), clamp=50.0)
    kl = float((p * (p.log() - q.log())).sum())
    assert float(signal.mean()) == pytest.approx(-kl, abs=5e-3) and kl > 0.1 and not math.isnan(kl)


@pytest.mark.xdist_group("capable_policy")
def test_prepare_samples_adds_the_teachers_signal_to_the_outcome_advantage_or_uses_it_alone(
    warm_policy, capable_policy, micro_cfg, sandbox
):
    """A smaller student (micro, 200 SFT steps) and a larger teacher (tiny's shape, 600 steps)
    with the same tokenizer, on the student's own episodes."""
    from configs.schema import DistillConfig, RewardConfig, RLConfig
    from training.agent.engines import HFEngine
    from training.agent.loop import run_episodes
    from training.rl.algorithms import resolve_algorithm
    from training.rl.loop import prepare_samples, recorded_logprobs
    from training.rl.scoring import episode_record, score_records
    from verifiers.cascade import Cascade

    assert warm_policy.tokenizer.get_vocab() == capable_policy.tokenizer.get_vocab()
    student, tok = warm_policy.model, warm_policy.tokenizer
    tasks = [t for t in warm_policy.tasks if t["family"] == "arithmetic"][:4]
    episodes = run_episodes(
        HFEngine(student),
        tok,
        tasks,
        group_size=4,
        tools=warm_policy.tools,
        cfg=micro_cfg.rollout,
        generator=torch.Generator().manual_seed(0),
    )
    records = [episode_record(e, round_index=1, step=1, policy_version="t", tokenizer=tok) for e in episodes]
    scores = score_records(records, {t["task_id"]: t for t in tasks}, tok, Cascade(RewardConfig(), sandbox))
    for i, s in enumerate(scores):
        s["reward"] = float(i % 2)
    algo = resolve_algorithm(RLConfig(algorithm="grpo", kl_coef=0.0, drop_zero_variance_groups=False))
    common = dict(policy=student, reference=None, critic=None, temperature=1.0, pad_id=tok.eos_token_id)
    plain, _ = prepare_samples(records, scores, algo, **common)
    mixed, metrics = prepare_samples(
        records, scores, algo, **common, distill=DistillConfig(enabled=True, coef=0.5), teacher=capable_policy.model
    )
    alone, _ = prepare_samples(
        records,
        scores,
        algo,
        **common,
        distill=DistillConfig(enabled=True, with_outcome=False),
        teacher=capable_policy.model,
    )
    teacher_lp = recorded_logprobs(capable_policy.model, records, temperature=1.0, pad_id=tok.eos_token_id)
    student_lp = recorded_logprobs(student, records, temperature=1.0, pad_id=tok.eos_token_id)
    for p, m, a, r, t, s in zip(plain, mixed, alone, records, teacher_lp, student_lp):
        n, mask = len(r["tool_mask"]), torch.tensor(r["tool_mask"], dtype=torch.bool)
        signal = torch.where(mask, (torch.tensor(t) - torch.tensor(s)).clamp(-5, 5), 0.0)
        torch.testing.assert_close(m.advantages[:n], p.advantages[:n] + 0.5 * signal, atol=1e-4, rtol=0)
        torch.testing.assert_close(a.advantages[:n], signal, atol=1e-4, rtol=0)
    assert metrics["distill/reverse_kl"] > 0  # the student is not the teacher


def test_a_round_with_distillation_needs_a_teacher_with_the_students_tokenizer(warm_policy, split_policy):
    from configs.schema import RLConfig
    from training.rl.loop import train_round

    with pytest.raises(ValueError, match="no teacher model"):
        train_round(
            warm_policy.model,
            None,
            warm_policy.tokenizer,
            [],
            {},
            rl=RLConfig(algorithm="dapo", distill={"enabled": True}),
            rollout=None,
            cascade=None,
            round_index=1,
            policy_version="t",
            seed=0,
        )
    from assets.rl import same_tokenizer

    same_tokenizer(warm_policy.tokenizer, warm_policy.tokenizer, "x")
    with pytest.raises(ValueError, match="tokenizer differs from the student's"):
        same_tokenizer(warm_policy.tokenizer, split_policy.tokenizer, "/teacher")
