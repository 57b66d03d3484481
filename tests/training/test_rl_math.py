"""Hand-computed checks for training/rl/math.py. Every expected number is derived in a comment."""

import math

import pytest
import torch

from configs.registry import Registry, UnknownNameError
from environments.family import FAMILIES
from training.rl.algorithms import ALGORITHMS
from training.rl.math import (
    ADVANTAGE_ESTIMATORS,
    AGG_MODES,
    POLICY_LOSSES,
    agg_loss,
    agg_normalizers,
    gae_advantages,
    get_advantage_estimator,
    get_policy_loss,
    group_stats,
    kl_penalty,
    masked_mean,
    value_loss,
)
from training.sequences import entropy_from_logits, token_logprobs
from verifiers import cascade  # noqa: F401  (registers every verifier)
from verifiers.base import get_verifier
from verifiers.shaping import get_term

R2 = 1 / math.sqrt(2)


def _close(actual, expected, atol=1e-5):
    torch.testing.assert_close(
        torch.as_tensor(actual, dtype=torch.float32), torch.as_tensor(expected, dtype=torch.float32), atol=atol, rtol=0
    )


# ----------------------------------------------------------------------------- advantages
def test_grpo_two_contiguous_groups():
    # g0 = [1, 0]: mean .5, unbiased std sqrt(.5) -> +-.5/.7071 = +-.7071
    # g1 = [1, .5]: mean .75, unbiased std sqrt(.125) -> +-.25/.35355 = +-.7071
    adv = get_advantage_estimator("grpo")(torch.tensor([1.0, 0.0, 1.0, 0.5]), torch.tensor([0, 0, 1, 1]))
    _close(adv, [R2, -R2, R2, -R2])


# rewards [1, 0, .5, 1, 0], groups [9, 2, 9, 2, 9] (non-contiguous, unsorted ids):
#   g9 = [1, .5, 0]: mean .5, unbiased std sqrt((.25 + 0 + .25) / 2) = .5
#   g2 = [0, 1]:     mean .5, unbiased std sqrt(.5)
NONCONTIG = (torch.tensor([1.0, 0.0, 0.5, 1.0, 0.0]), torch.tensor([9, 2, 9, 2, 9]))


@pytest.mark.parametrize(
    "name, expected",
    [
        ("grpo", [1.0, -R2, 0.0, R2, -1.0]),  # (r - mean) / std
        ("dr_grpo", [0.5, -0.5, 0.0, 0.5, -0.5]),  # r - mean
        # leave-one-out: g9: 1-(.5+0)/2=.75, .5-(1+0)/2=0, 0-(1+.5)/2=-.75; g2: 0-1=-1, 1-0=1
        ("rloo", [0.75, -1.0, 0.0, 1.0, -0.75]),
    ],
)
def test_estimators_non_contiguous_groups(name, expected):
    _close(get_advantage_estimator(name)(*NONCONTIG), expected)


@pytest.mark.parametrize("name", ["grpo", "dr_grpo", "rloo"])
def test_zero_variance_and_singleton_groups_are_exactly_zero(name):
    # in float32 sum([.9, .9, .9]) / 3 != .9 (off by 6e-8; / eps would make 0.06); must still be 0
    rewards = torch.tensor([0.9, 0.9, 0.9, 0.3, 0.7, 5.0])
    adv = get_advantage_estimator(name)(rewards, torch.tensor([4, 4, 4, 1, 1, 8]))
    assert torch.equal(adv[:3], torch.zeros(3))  # constant group
    assert adv[5].item() == 0.0  # singleton group
    assert adv[3].item() < 0 < adv[4].item()  # the live group still gets signal


def test_group_stats_matches_python_loop():
    g = torch.Generator().manual_seed(0)
    rewards = torch.rand(60, generator=g)
    ids = torch.tensor([3, 17, 42, 1000, 5, 77])[torch.randint(0, 6, (60,), generator=g)]
    ids[0] = 123456  # guarantee a singleton
    mean, std = group_stats(rewards, ids)
    for i in range(60):
        members = rewards[ids == ids[i]]
        _close(mean[i], members.mean())
        _close(std[i], members.std(correction=1) if len(members) > 1 else 0.0)


# ----------------------------------------------------------------------------- token helpers
def test_token_logprobs_matches_loop_and_temperature():
    g = torch.Generator().manual_seed(1)
    logits, ids = torch.randn(2, 3, 5, generator=g) * 3, torch.randint(0, 5, (2, 3), generator=g)
    for temp in (1.0, 0.7):
        out = token_logprobs(logits, ids, temperature=temp)
        loop = torch.tensor(
            [[torch.log_softmax(logits[b, t] / temp, -1)[ids[b, t]].item() for t in range(3)] for b in range(2)]
        )
        _close(out, loop)
    _close(token_logprobs(logits, ids, 2.0), token_logprobs(logits / 2, ids))
    assert not torch.allclose(token_logprobs(logits, ids, 2.0), token_logprobs(logits, ids))
    assert token_logprobs(logits.bfloat16(), ids).dtype == torch.float32
    with pytest.raises(ValueError, match="temperature"):
        token_logprobs(logits, ids, 0.0)


def test_entropy():
    _close(entropy_from_logits(torch.zeros(2, 3, 7)), torch.full((2, 3), math.log(7)))
    _close(entropy_from_logits(torch.zeros(1, 1, 7), temperature=0.3), [[math.log(7)]])
    peaked = torch.zeros(1, 2, 7)
    peaked[..., 0] = 50.0
    assert entropy_from_logits(peaked).max().item() < 1e-6
    # p = [.5, .25, .25]: H = .5 ln2 + 2 * .25 ln4 = 1.5 ln2; a -inf logit adds 0, not NaN
    logits = torch.log(torch.tensor([[[0.5, 0.25, 0.25, 0.0]]]))
    _close(entropy_from_logits(logits), [[1.5 * math.log(2)]])


def test_masked_mean_ignores_nan_padding_and_handles_empty_mask():
    x = torch.tensor([[1.0, 3.0, float("nan")], [5.0, float("inf"), 7.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    _close(masked_mean(x, mask), 3.0)  # (1 + 3 + 5) / 3
    _close(masked_mean(x, mask, dim=-1), [2.0, 5.0])
    _close(masked_mean(x, torch.zeros(2, 3)), 0.0)


def test_kl_hand_values():
    # logp = ln .5, ref = ln .25: d = logp - ref = ln 2
    logp, ref = torch.log(torch.tensor([[0.5]])), torch.log(torch.tensor([[0.25]]))
    _close(kl_penalty(logp, ref, "k1"), [[math.log(2)]])
    _close(kl_penalty(logp, ref, "k2"), [[0.5 * math.log(2) ** 2]])  # .2402
    _close(kl_penalty(logp, ref, "k3"), [[0.5 + math.log(2) - 1.0]])  # e^-d + d - 1 = .1931


def test_k3_nonnegative_zero_when_equal_and_finite_on_garbage():
    g = torch.Generator().manual_seed(2)
    a, b = torch.randn(8, 50, generator=g) * 5, torch.randn(8, 50, generator=g) * 5
    assert (kl_penalty(a, b) >= 0).all()
    assert torch.equal(kl_penalty(a, a), torch.zeros_like(a))
    huge = torch.tensor([[1e4, -1e4]])
    assert torch.isfinite(kl_penalty(huge, -huge)).all()  # both signs: exp(2e4) would be inf
    with pytest.raises(ValueError, match="'k9'"):
        kl_penalty(a, b, "k9")


# ----------------------------------------------------------------------------- aggregation
LOSS = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
MASK = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])


@pytest.mark.parametrize(
    "mode, kwargs, expected",
    [
        ("token_mean", {}, (1 + 2 + 4) / 3),
        ("token_mean", {"num_tokens": 7.0}, 1.0),
        ("seq_mean_token_mean", {}, (1.5 + 4.0) / 2),
        ("seq_mean_token_mean", {"num_seqs": 5.0}, 5.5 / 5),
        ("seq_mean_token_sum_norm", {"max_tokens": 4}, (3 / 4 + 4 / 4) / 2),
        ("seq_mean_token_sum_norm", {"max_tokens": 4, "num_seqs": 7.0}, 1.75 / 7),
    ],
)
def test_agg_loss_hand_values(mode, kwargs, expected):
    _close(agg_loss(LOSS, MASK, mode, **kwargs), expected)
    garbage = LOSS.clone()
    garbage[MASK == 0] = float("nan")
    _close(agg_loss(garbage, MASK.bool(), mode, **kwargs), expected)


def test_agg_loss_all_padding_rows_do_not_count_and_errors():
    loss, mask = torch.cat([LOSS, torch.full((1, 3), 1e4)]), torch.cat([MASK, torch.zeros(1, 3)])
    _close(agg_loss(loss, mask, "seq_mean_token_mean"), 5.5 / 2)
    _close(agg_loss(LOSS, torch.zeros(2, 3), "token_mean"), 0.0)
    with pytest.raises(ValueError, match="max_tokens"):
        agg_loss(LOSS, MASK, "seq_mean_token_sum_norm")
    with pytest.raises(ValueError, match="'sum'.*token_mean"):
        agg_loss(LOSS, MASK, "sum")


def _varlen_batch(B=8, T=12, seed=3):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([1, 12, 3, 0, 7, 2, 11, 5])[:B]  # unequal, incl. an all-padding row
    mask = (torch.arange(T)[None, :] < lengths[:, None]).float()
    return torch.randn(B, T, generator=g), torch.randn(B, T, generator=g), mask


def _grad(fn, w):
    w = w.clone().requires_grad_(True)
    fn(w).backward()
    return w.grad


@pytest.mark.parametrize("mode", AGG_MODES.names())
@pytest.mark.parametrize("n_micro", [2, 4])
def test_agg_loss_micro_batch_gradient_invariance(mode, n_micro):
    w0, target, mask = _varlen_batch()
    T = mask.shape[1]

    def full(w):  # per-token loss depends on the parameter; local (= global) counts by default
        return agg_loss((w - target) ** 2, mask, mode, max_tokens=T)

    num_tokens, num_seqs = map(sum, zip(*(agg_normalizers(m) for m in mask.chunk(n_micro))))

    def accumulated(w):
        total = 0.0
        for rows in torch.arange(8).chunk(n_micro):
            m = mask[rows]
            width = max(int(m.sum(-1).max()), 1)  # dynamic padding: each micro-batch is trimmed
            lm = ((w[rows] - target[rows]) ** 2)[:, :width]
            total = total + agg_loss(lm, m[:, :width], mode, num_tokens=num_tokens, num_seqs=num_seqs, max_tokens=T)
        return total

    _close(_grad(accumulated, w0), _grad(full, w0), atol=1e-6)
    _close(accumulated(w0), full(w0), atol=1e-6)


def test_token_mean_without_global_count_is_not_invariant():
    w0, target, mask = _varlen_batch()
    full = agg_loss((w0 - target) ** 2, mask, "token_mean")
    # naive accumulation: average of per-micro-batch token means (micro-batches hold 16 vs 24 tokens)
    naive = sum(agg_loss(((w0 - target) ** 2)[r], mask[r], "token_mean") for r in torch.arange(8).chunk(2)) / 2
    assert abs(naive.item() - full.item()) > 1e-3


# ----------------------------------------------------------------------------- ppo_clip
def _ppo(logp, old, adv, mask, **kw):
    return get_policy_loss("ppo_clip")(logp, old, adv, mask, **kw)


def test_ppo_ratio_one_is_minus_mean_advantage():
    adv, mask = torch.tensor([[1.0, -2.0, 4.0], [3.0, 100.0, 100.0]]), MASK
    lp = torch.randn(2, 3)
    loss, metrics = _ppo(lp, lp.clone(), adv, mask)
    _close(loss, -(1 - 2 + 3) / 3)
    assert metrics == pytest.approx(
        {"clip_frac": 0.0, "dual_clip_frac": 0.0, "approx_kl": 0.0, "ratio_mean": 1.0, "ratio_max": 1.0}
    )


def test_ppo_hand_clipping_and_gradients():
    # tok0: r=1.5, A=+1 -> clipped at 1.2: loss -1.2 (no grad)
    # tok1: r=0.5, A=-1 -> unclipped .5, clipped .8: loss .8 (clipped, no grad)
    # tok2: r=1.5, A=-1 -> unclipped 1.5 > clipped 1.2: loss 1.5, d/dlogp = r = 1.5, /3 tokens
    # tok3: padding with garbage
    old = torch.zeros(1, 4)
    logp = torch.tensor([[math.log(1.5), math.log(0.5), math.log(1.5), 1e4]], requires_grad=True)
    adv, mask = torch.tensor([[1.0, -1.0, -1.0, 1e4]]), torch.tensor([[1, 1, 1, 0]])
    loss, metrics = _ppo(logp, old, adv, mask)
    _close(loss, (-1.2 + 0.8 + 1.5) / 3)
    loss.backward()
    _close(logp.grad, [[0.0, 0.0, 0.5, 0.0]])
    assert metrics["clip_frac"] == pytest.approx(2 / 3)
    assert metrics["ratio_mean"] == pytest.approx((1.5 + 0.5 + 1.5) / 3)
    assert metrics["ratio_max"] == pytest.approx(1.5)
    # k3 vs old: r - 1 - ln r
    k3 = [r - 1 - math.log(r) for r in (1.5, 0.5, 1.5)]
    assert metrics["approx_kl"] == pytest.approx(sum(k3) / 3, rel=1e-5)
    assert all(isinstance(v, float) for v in metrics.values())


def test_ppo_clip_higher_is_asymmetric():
    # tok0: r=1.25, A=+1: symmetric clips at 1.2 (-1.2); clip_high=.28 leaves it (-1.25)
    # tok1: r=0.75, A=-1: lower bound .8 either way: max(.75, .8) = .8, clipped
    logp, old = torch.log(torch.tensor([[1.25, 0.75]])), torch.zeros(1, 2)
    adv, mask = torch.tensor([[1.0, -1.0]]), torch.ones(1, 2)
    sym, m_sym = _ppo(logp, old, adv, mask)
    high, m_high = _ppo(logp, old, adv, mask, clip_low=0.2, clip_high=0.28)
    _close(sym, (-1.2 + 0.8) / 2)
    _close(high, (-1.25 + 0.8) / 2)
    assert (m_sym["clip_frac"], m_high["clip_frac"]) == (1.0, 0.5)


@pytest.mark.parametrize("name", ["ppo_clip", "gspo"])
def test_padding_garbage_changes_nothing(name):
    g = torch.Generator().manual_seed(4)
    _, _, mask = _varlen_batch()
    lp, old = torch.randn(8, 12, generator=g) * 0.1 - 2, torch.randn(8, 12, generator=g) * 0.1 - 2
    adv = torch.randn(8, 1, generator=g).expand(8, 12)
    pad = mask == 0
    outs = []
    for fill in (0.0, 1e4, float("nan")):
        lp_f = torch.where(pad, fill, lp).requires_grad_(True)
        loss, metrics = get_policy_loss(name)(
            lp_f, torch.where(pad, -fill, old), torch.where(pad, fill, adv), mask, clip_high=0.28
        )
        loss.backward()
        assert torch.isfinite(lp_f.grad).all() and (lp_f.grad[pad] == 0).all()
        outs.append((loss.item(), metrics, lp_f.grad))
    for loss, metrics, grad in outs[1:]:
        assert loss == pytest.approx(outs[0][0], abs=1e-7)
        assert metrics == pytest.approx(outs[0][1], abs=1e-7)
        _close(grad, outs[0][2], atol=1e-7)


# ----------------------------------------------------------------------------- gspo
def _gspo(logp, old, adv, mask, **kw):
    return get_policy_loss("gspo")(logp, old, adv, mask, **kw)


def test_gspo_equal_logprobs_is_minus_mean_sequence_advantage():
    # unequal lengths (2, 1, 3 tokens): per-sequence aggregation, so each sequence weighs 1/3
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 1]])
    adv = torch.tensor([[1.0], [-2.0], [0.5]]).expand(3, 3)
    lp = torch.randn(3, 3)
    loss, metrics = _gspo(lp, lp.clone(), adv, mask)
    _close(loss, -(1 - 2 + 0.5) / 3)
    assert metrics["clip_frac"] == 0.0 and metrics["ratio_max"] == pytest.approx(1.0)


def test_gspo_sequence_level_clipping_by_hand():
    # seq0: token ratios [1.5, 1.5] -> s = 1.5, A=+1: clipped at 1.2 -> -1.2, no gradient
    # seq1: token ratios [2, .5]    -> s = exp(mean(ln2, -ln2)) = 1, A=-1 -> +1.0, NOT clipped,
    #       although token-level PPO would clip both of its tokens.
    # gradient of seq1 tokens: d(-A * s_it)/dlogp_t = s = 1, / 2 tokens / 2 seqs = .25
    logp = torch.log(torch.tensor([[1.5, 1.5], [2.0, 0.5]])).requires_grad_(True)
    adv, mask = torch.tensor([[1.0, 1.0], [-1.0, -1.0]]), torch.ones(2, 2)
    loss, metrics = _gspo(logp, torch.zeros(2, 2), adv, mask)
    _close(loss, (-1.2 + 1.0) / 2)
    loss.backward()
    _close(logp.grad, [[0.0, 0.0], [0.25, 0.25]])
    assert metrics["clip_frac"] == pytest.approx(0.5)
    # token-level PPO on the same data clips 3 of 4 tokens (seq1: r=2, A=-1 stays unclipped)
    assert _ppo(logp.detach(), torch.zeros(2, 2), adv, mask)[1]["clip_frac"] == pytest.approx(0.75)


def test_gspo_token_form_gradient_equals_sequence_objective():
    # GSPO: J = mean_i A_i * s_i(theta), s_i = exp(mean_t over mask of (logp - old)); wide clip range
    g = torch.Generator().manual_seed(5)
    _, _, mask = _varlen_batch()
    old = torch.randn(8, 12, generator=g) * 0.1
    lp0 = old + torch.randn(8, 12, generator=g) * 0.05
    a = torch.randn(8, 1, generator=g)

    def sequence_level(lp):
        s = torch.exp(masked_mean(lp - old, mask, dim=-1))
        live = mask.any(-1)
        return -(a[:, 0] * s)[live].sum() / live.sum()

    token_form = _grad(lambda lp: _gspo(lp, old, a.expand(8, 12), mask, clip_low=10.0, clip_high=10.0)[0], lp0)
    _close(token_form, _grad(sequence_level, lp0), atol=1e-6)


# ----------------------------------------------------------------------------- registry
@pytest.mark.parametrize(
    "getter, expected",
    [
        (get_policy_loss, ["gspo", "ppo_clip"]),
        (get_advantage_estimator, ["dr_grpo", "grpo", "reinforce_pp", "reinforce_pp_baseline", "rloo"]),
    ],
)
def test_registry_unknown_name_lists_available(getter, expected):
    for exc in (KeyError, ValueError):
        with pytest.raises(exc) as info:
            getter("nope")
        assert "'nope'" in str(info.value) and ", ".join(expected) in str(info.value)


@pytest.mark.parametrize(
    "getter, listed",
    [
        (get_verifier, ["exact_match", "numeric", "unit_tests"]),
        (get_term, ["format", "overlong", "tool_cost"]),
        (FAMILIES.get, ["arithmetic", "code", "search"]),
        (ALGORITHMS.get, ["grpo", "ppo"]),
    ],
)
def test_every_registry_raises_one_error_type_that_lists_its_names(getter, listed):
    """Verifiers, shaping terms, task families and algorithms: one Registry, one error."""
    with pytest.raises(UnknownNameError) as info:
        getter("nope")
    assert "'nope'" in str(info.value) and all(name in str(info.value) for name in listed)


def test_registry_generic_behaviour():
    assert POLICY_LOSSES.names() == ["gspo", "ppo_clip"] and "grpo" in ADVANTAGE_ESTIMATORS
    reg = Registry("widget")

    @reg.register("a")
    def a():
        return 1

    assert reg.get("a") is a and reg.names() == ["a"]
    with pytest.raises(ValueError, match="already registered"):
        reg.register("a")(lambda: 2)
    with pytest.raises(KeyError, match="unknown widget 'b'; available: a"):
        reg.get("b")


# ----------------------------------------------------------------------- REINFORCE++, GAE, value loss
def test_reinforce_pp_whitens_over_the_whole_batch():
    # mean .5, unbiased std sqrt(1/3): A = +-.5 / .57735 = +-.86603
    adv = get_advantage_estimator("reinforce_pp")(torch.tensor([1.0, 0.0, 1.0, 0.0]), torch.tensor([0, 0, 1, 1]))
    _close(adv, [0.86603, -0.86603, 0.86603, -0.86603], atol=1e-4)
    assert torch.equal(
        get_advantage_estimator("reinforce_pp")(torch.tensor([0.3, 0.3]), torch.tensor([0, 1])), torch.zeros(2)
    )


def test_reinforce_pp_baseline_centers_per_group_then_whitens_globally():
    # g0 = [1, 0] -> [.5, -.5]; g1 = [1, 1] constant -> 0; std of the live [.5, -.5] = sqrt(.5)
    adv = get_advantage_estimator("reinforce_pp_baseline")(
        torch.tensor([1.0, 0.0, 1.0, 1.0]), torch.tensor([0, 0, 1, 1])
    )
    _close(adv, [0.70711, -0.70711, 0.0, 0.0], atol=1e-4)


@pytest.mark.parametrize(
    "gamma, lam, expected_adv",
    [
        (1.0, 1.0, [0.5, 0.4, 0.0, 0.2]),  # returns are the outcome (1.0) on every policy token
        (0.9, 0.5, [0.1345, 0.21, 0.0, 0.2]),  # t3: 1-.8; t1: .9*.8-.6 + .45*.2; t0: .9*.6-.5 + .45*.21
    ],
)
def test_gae_by_hand_skips_tool_tokens(gamma, lam, expected_adv):
    rewards = torch.tensor([[0.0, 0.0, 0.0, 1.0]])
    values = torch.tensor([[0.5, 0.6, 9.0, 0.8]])  # 9.0 sits on a tool token: must be ignored
    mask = torch.tensor([[1, 1, 0, 1]])
    adv, ret = gae_advantages(rewards, values, mask, gamma=gamma, lam=lam)
    _close(adv[0], expected_adv, atol=1e-6)
    _close(
        ret[0], [a + v if m else 0.0 for a, v, m in zip(expected_adv, [0.5, 0.6, 9.0, 0.8], [1, 1, 0, 1])], atol=1e-6
    )


def test_gae_matches_a_reference_over_compacted_tokens():
    g = torch.Generator().manual_seed(3)
    rewards, values = torch.randn(4, 12, generator=g), torch.randn(4, 12, generator=g)
    mask = (torch.rand(4, 12, generator=g) > 0.3).long()
    adv, _ = gae_advantages(rewards, values, mask, gamma=0.95, lam=0.9)
    for b in range(4):
        live = [t for t in range(12) if mask[b, t]]
        expected, running = {}, 0.0
        for i in reversed(range(len(live))):
            t = live[i]
            next_v = float(values[b, live[i + 1]]) if i + 1 < len(live) else 0.0
            running = float(rewards[b, t]) + 0.95 * next_v - float(values[b, t]) + 0.95 * 0.9 * running
            expected[t] = running
        _close(adv[b], [expected.get(t, 0.0) for t in range(12)], atol=1e-5)


def test_value_loss_clipped_by_hand():
    # token 0: (1-0)^2 = 1 either way; token 1: unclipped 0, clipped V=1.5 -> .25; mean .625 -> loss .3125
    loss, metrics = value_loss(
        torch.tensor([[1.0, 2.0]]),
        torch.tensor([[1.0, 1.0]]),
        torch.tensor([[0.0, 2.0]]),
        torch.tensor([[1, 1]]),
        clip=0.5,
    )
    assert loss.item() == pytest.approx(0.3125) and metrics["value_clip_frac"] == pytest.approx(0.5)


# ----------------------------------------------------------------------- numerical bounds (issue 21)
E3, E10, E12 = math.exp(3), math.exp(10), math.exp(12)  # 20.0855, 22026.466, 162754.79


@pytest.mark.integrity
def test_k3_is_clamped_at_10_with_zero_gradient_past_the_bound():
    # k3 = e^d - d - 1 with d = ref - logp; d/dlogp = 1 - e^d.
    # tok0: d = 3:   e^3 - 3 - 1 = 16.0855 > 10 -> 10, gradient 0 (unclamped: 1 - e^3 = -19.0855)
    # tok1: d = 1:   e - 1 - 1 = .71828 < 10, kept, gradient 1 - e = -1.71828
    # tok2: d = -12: e^-12 + 12 - 1 = 11.000006 > 10 -> 10, gradient 0 (unclamped: 1 - e^-12 = .999994)
    logp = torch.zeros(1, 3, requires_grad=True)
    ref = torch.tensor([[3.0, 1.0, -12.0]])
    kl = kl_penalty(logp, ref, "k3")  # the default bound is verl's 10
    _close(kl, [[10.0, math.e - 2.0, 10.0]])
    kl.sum().backward()
    _close(logp.grad, [[0.0, 1.0 - math.e, 0.0]])
    # k3_clamp=None is today's unbounded estimator
    logp.grad = None
    unbounded = kl_penalty(logp, ref, "k3", k3_clamp=None)
    _close(unbounded, [[E3 - 4.0, math.e - 2.0, math.exp(-12) + 11.0]], atol=1e-4)
    unbounded.sum().backward()
    _close(logp.grad, [[1.0 - E3, 1.0 - math.e, 1.0 - math.exp(-12)]], atol=1e-4)
    # a tighter bound: 16.0855 and 11.000006 -> 5, .71828 stays
    _close(kl_penalty(logp, ref, "k3", k3_clamp=5.0), [[5.0, math.e - 2.0, 5.0]])
    # k1 / k2 are not clamped, as in verl (their gradients, 1 and d, do not blow up): logp - ref = 12
    _close(kl_penalty(logp, ref, "k1")[0, 2], 12.0)
    _close(kl_penalty(logp, ref, "k2")[0, 2], 72.0)  # .5 * 12^2
    for bad in (0.0, -1.0):
        with pytest.raises(ValueError, match="k3_clamp must be > 0"):
            kl_penalty(logp, ref, "k3", k3_clamp=bad)


@pytest.mark.integrity
def test_ppo_dual_clip_by_hand():
    # old = 0, so r = exp(logp); clip 0.2 / 0.2, clip_ratio_c = 3 (verl's default); 4 tokens, token mean.
    # tok0: r=5, A=-1:   PPO max(-A r, -A clip(r)) = max(5, 1.2) = 5; dual min(5, -A*3 = 3) = 3, gradient 0
    # tok1: r=2, A=-1:   max(2, 1.2) = 2 < 3: not capped; loss 2, d/dlogp = -A r = 2, /4 tokens = .5
    # tok2: r=5, A=+1:   upper clip -1.2, gradient 0; the dual-clip is for A < 0 only
    # tok3: r=5, A=-.5:  max(2.5, .6) = 2.5; dual -A*3 = 1.5 < 2.5 -> 1.5, gradient 0
    # loss = (3 + 2 - 1.2 + 1.5) / 4 = 1.325.  Without dual-clip: (5 + 2 - 1.2 + 2.5) / 4 = 2.075,
    # gradient [5, 2, 0, 2.5] / 4: the r=5 tokens pull 2.5x harder than the in-range one.
    old = torch.zeros(1, 4)
    logp = torch.log(torch.tensor([[5.0, 2.0, 5.0, 5.0]])).requires_grad_(True)
    adv, mask = torch.tensor([[-1.0, -1.0, 1.0, -0.5]]), torch.ones(1, 4)
    loss, metrics = _ppo(logp, old, adv, mask)
    _close(loss, 1.325)
    loss.backward()
    _close(logp.grad, [[0.0, 0.5, 0.0, 0.0]])
    assert metrics["dual_clip_frac"] == pytest.approx(2 / 4)  # tok0, tok3 (verl's pg_clipfrac_lower)
    assert metrics["clip_frac"] == pytest.approx(1 / 4)  # tok2: the standard clip, unchanged
    # clip_ratio_c=None switches it off; clip_ratio_c=1.5 also caps tok1 (-A*1.5 = 1.5 < 2)
    off = logp.detach().requires_grad_(True)
    loss_off, metrics_off = _ppo(off, old, adv, mask, clip_ratio_c=None)
    _close(loss_off, 2.075)
    loss_off.backward()
    _close(off.grad, [[1.25, 0.5, 0.0, 0.625]])
    assert metrics_off["dual_clip_frac"] == 0.0
    _close(_ppo(logp.detach(), old, adv, mask, clip_ratio_c=1.5)[0], (1.5 + 1.5 - 1.2 + 0.75) / 4)
    for name in ("ppo_clip", "gspo"):
        for bad in (1.0, 0.5):  # <= 1 would cap the loss at ratio 1 and below (verl asserts > 1)
            with pytest.raises(ValueError, match="clip_ratio_c must be > 1"):
                get_policy_loss(name)(logp, old, adv, mask, clip_ratio_c=bad)


@pytest.mark.integrity
def test_gspo_sequence_ratio_is_capped_at_e10_with_zero_gradient():
    # seq0: token log-ratios [12, 12] -> mean 12 > 10: s = e^10 = 22026.47 (was e^20-capped: e^12), A=-1.
    # seq1: token ratios [2, .5] -> s = 1, A=-1: loss 1, d/dlogp_t = s = 1, / 2 tokens / 2 seqs = .25
    old, mask = torch.zeros(2, 2), torch.ones(2, 2)
    logp = torch.tensor([[12.0, 12.0], [math.log(2), math.log(0.5)]], requires_grad=True)
    adv = torch.tensor([[-1.0, -1.0], [-1.0, -1.0]])
    # defaults (cap 10, dual-clip 3): seq0 loss min(-A e^10, -A*3) = 3; (3 + 1) / 2 = 2.
    # Before: (e^12 + 1) / 2 = 81377.9, gradient e^12 / 4 = 40688.7 on each seq0 token.
    loss, metrics = _gspo(logp, old, adv, mask)
    _close(loss, 2.0)
    loss.backward()
    _close(logp.grad, [[0.0, 0.0], [0.25, 0.25]])
    assert metrics["ratio_max"] == pytest.approx(E10, rel=1e-6)
    assert metrics["dual_clip_frac"] == pytest.approx(2 / 4)  # seq0's two tokens
    # the cap alone (dual-clip off): (e^10 + 1) / 2 = 11013.73, and still no gradient on seq0: verl
    # clamps log(s_it) = sg[log s_i] + logp - sg[logp] itself, so torch.clamp stops its gradient.
    capped = logp.detach().requires_grad_(True)
    loss, _ = _gspo(capped, old, adv, mask, clip_ratio_c=None)
    assert loss.item() == pytest.approx((E10 + 1) / 2, rel=1e-6)
    loss.backward()
    _close(capped.grad, [[0.0, 0.0], [0.25, 0.25]])
    # a cap of 20 (the finite-exp guard, today's value) lets seq0 through: (e^12 + 1) / 2, gradient e^12 / 4
    wide = logp.detach().requires_grad_(True)
    loss, _ = _gspo(wide, old, adv, mask, clip_ratio_c=None, seq_log_ratio_max=20.0)
    assert loss.item() == pytest.approx((E12 + 1) / 2, rel=1e-6)
    loss.backward()
    torch.testing.assert_close(wide.grad, torch.tensor([[E12 / 4, E12 / 4], [0.25, 0.25]]), rtol=1e-5, atol=1e-5)
    for bad in (0.0, 20.5):  # above 20 exp() heads for float32's overflow at ~88
        with pytest.raises(ValueError, match="seq_log_ratio_max must be > 0 and <= 20"):
            _gspo(logp, old, adv, mask, seq_log_ratio_max=bad)
