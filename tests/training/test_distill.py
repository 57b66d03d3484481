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
