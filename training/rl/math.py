"""Pure RL math for GRPO-style training on multi-turn tool-use rollouts.

Everything here is a pure function over tensors and 0/1 masks: no config objects, no I/O,
no engines (import-linter forbids them). Shapes: N trajectories, B rows of a (micro-)batch,
T tokens, V vocabulary. Masks may be bool or float 0/1; every reduction goes through them,
and masked positions are replaced with `torch.where` *before* any exp/multiply, so padding
garbage (1e4, inf, NaN) can never reach a loss, a metric or a gradient.

Call sites pick algorithms by name, with no if/elif on names:
    adv = get_advantage_estimator("grpo")(rewards, group_ids)
    loss, metrics = get_policy_loss("ppo_clip")(logp, old_logp, adv_bt, mask, clip_high=0.28)

Three bounds keep a single extreme token or sequence from owning the update (issue 21; values
as verl's core_algos): the k3 KL estimate is clamped (`k3_clamp`, verl 10), PPO's loss is
dual-clipped for negative advantages (`clip_ratio_c`, verl 3), and GSPO's sequence log-ratio is
capped (`seq_log_ratio_max`, verl 10). Past each bound the term is a constant: zero gradient.
"""

from __future__ import annotations

import math
from typing import Callable

import torch
from torch import Tensor

from configs.registry import Registry

__all__ = [
    "LOG_RATIO_CLAMP",
    "ADVANTAGE_ESTIMATORS",
    "TOKEN_ADVANTAGE_ESTIMATORS",
    "POLICY_LOSSES",
    "KL_ESTIMATORS",
    "AGG_MODES",
    "get_advantage_estimator",
    "get_policy_loss",
    "group_stats",
    "grpo_advantages",
    "dr_grpo_advantages",
    "rloo_advantages",
    "masked_mean",
    "kl_penalty",
    "agg_loss",
    "agg_normalizers",
    "ppo_clip_loss",
    "gspo_loss",
]

# Log-ratios are clamped to this before exp(): e^20 ~ 5e8 is far outside any trust region, and
# the clamp keeps exp() finite in float32 (overflow at ~88). Same bound verl uses.
LOG_RATIO_CLAMP = 20.0


# --------------------------------------------------------------------------- registry
ADVANTAGE_ESTIMATORS = Registry("advantage estimator")  # sequence level: fn(rewards (N,), group_ids (N,))
# token level, with a critic: fn(token_rewards, values, mask (B, T) each, *, gamma, lam) -> (advantages, returns)
TOKEN_ADVANTAGE_ESTIMATORS = Registry("token-level advantage estimator")
POLICY_LOSSES = Registry("policy loss")
KL_ESTIMATORS = Registry("KL estimator")
AGG_MODES = Registry("loss aggregation mode")


def get_advantage_estimator(name: str) -> Callable[..., Tensor]:
    """fn(rewards (N,), group_ids (N,), *, eps) -> advantages (N,)."""
    return ADVANTAGE_ESTIMATORS.get(name)


def get_policy_loss(name: str) -> Callable[..., tuple[Tensor, dict[str, float]]]:
    """fn(logprobs, old_logprobs, advantages, loss_mask, *, clip_low, clip_high, clip_ratio_c,
    seq_log_ratio_max, agg_mode, num_tokens, num_seqs, max_tokens) -> (scalar loss, metrics)."""
    return POLICY_LOSSES.get(name)


def _bool_mask(mask: Tensor) -> Tensor:
    return mask if mask.dtype == torch.bool else mask != 0


def _check_bound(name: str, value: float | None, low: float, high: float = math.inf) -> None:
    """low < value <= high, or None (off); checked where the bound is used, so a bad value fails
    with its parameter's name whoever called (the config checks the same ranges at load time)."""
    if value is not None and not low < value <= high:
        raise ValueError(f"{name} must be > {low:g}{'' if high == math.inf else f' and <= {high:g}'}, got {value!r}")


# --------------------------------------------------------------------------- advantages
def _group_moments(rewards: Tensor, group_ids: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Per-item (mean, unbiased std, group size, group-is-constant), all (N,).

    Group ids are arbitrary (prompt hashes, non-contiguous), so they are compacted with
    `unique(return_inverse=True)` and reduced with index_add / scatter_reduce: O(N), no loop.
    """
    r = rewards.to(torch.promote_types(rewards.dtype, torch.float32))
    _, inv, counts = torch.unique(group_ids, return_inverse=True, return_counts=True)
    num_groups = counts.numel()
    mean = r.new_zeros(num_groups).index_add_(0, inv, r) / counts
    dev = r - mean[inv]  # two-pass variance: no catastrophic cancellation of E[r^2] - E[r]^2
    sq = r.new_zeros(num_groups).index_add_(0, inv, dev * dev)
    # Bessel-corrected (unbiased) std, matching torch.std as used by the DeepSeekMath/GRPO
    # reference code, TRL and verl, so advantage scales are comparable with published runs.
    std = torch.where(counts > 1, (sq / (counts - 1).clamp_min(1)).sqrt(), 0.0)
    # "Constant" is decided exactly (max == min), not by std < tol: sum/count of identical
    # floats need not round-trip, and (r - mean) / (0 + eps) would blow a 1e-8 error up to 1e-2.
    gmax = r.new_zeros(num_groups).scatter_reduce_(0, inv, r, "amax", include_self=False)
    gmin = r.new_zeros(num_groups).scatter_reduce_(0, inv, r, "amin", include_self=False)
    return mean[inv], std[inv], counts[inv], (gmax == gmin)[inv]


def group_stats(rewards: Tensor, group_ids: Tensor) -> tuple[Tensor, Tensor]:
    """Per-item group mean and unbiased std, both (N,). rewards (N,), group_ids (N,) long.
    Singleton groups get std 0 (undefined with Bessel's correction)."""
    mean, std, _, _ = _group_moments(rewards, group_ids)
    return mean, std


@ADVANTAGE_ESTIMATORS.register("grpo")
def grpo_advantages(rewards: Tensor, group_ids: Tensor, *, eps: float = 1e-6) -> Tensor:
    """GRPO (DeepSeekMath, Shao et al. 2024): A_i = (r_i - mean_g) / (std_g + eps). (N,) -> (N,).

    Groups whose rewards are all equal (incl. singletons) get exactly 0: they carry no
    preference signal (this is why DAPO's dynamic sampling drops them)."""
    mean, std, _, constant = _group_moments(rewards, group_ids)
    return torch.where(constant, 0.0, (rewards - mean) / (std + eps))


@ADVANTAGE_ESTIMATORS.register("dr_grpo")
def dr_grpo_advantages(rewards: Tensor, group_ids: Tensor, *, eps: float = 1e-6) -> Tensor:
    """Dr.GRPO ("Understanding R1-Zero-like Training", Liu et al. 2025): A_i = r_i - mean_g.
    Dividing by std over-weights near-constant (too easy / too hard) groups; Dr.GRPO drops it.
    `eps` is unused and kept only for the shared estimator signature. (N,) -> (N,)."""
    mean, _, _, constant = _group_moments(rewards, group_ids)
    return torch.where(constant, 0.0, rewards - mean)


@ADVANTAGE_ESTIMATORS.register("rloo")
def rloo_advantages(rewards: Tensor, group_ids: Tensor, *, eps: float = 1e-6) -> Tensor:
    """RLOO (Kool et al. 2019; Ahmadian et al. 2024): A_i = r_i - mean_{j != i} r_j.
    The leave-one-out baseline is independent of r_i, so the estimator stays unbiased.
    Uses the identity r_i - (S - r_i)/(n-1) = n/(n-1) * (r_i - mean). Singletons -> 0.
    `eps` is unused (shared signature). (N,) -> (N,)."""
    mean, _, n, constant = _group_moments(rewards, group_ids)
    scale = n / (n - 1).clamp_min(1)  # clamp only avoids inf in the branch `where` discards
    return torch.where(constant, 0.0, scale * (rewards - mean))


def _batch_whiten(x: Tensor, eps: float) -> Tensor:
    """(x - mean) / (std + eps) over the whole batch; a constant batch gives exactly 0."""
    if x.numel() < 2 or bool((x == x[0]).all()):
        return torch.zeros_like(x)
    return (x - x.mean()) / (x.std() + eps)


@ADVANTAGE_ESTIMATORS.register("reinforce_pp")
def reinforce_pp_advantages(rewards: Tensor, group_ids: Tensor, *, eps: float = 1e-6) -> Tensor:
    """REINFORCE++ (Hu 2025, OpenRLHF): no critic, no per-prompt baseline; the outcome reward is
    whitened over the *global* batch, which stabilizes the scale across prompts of different
    difficulty without GRPO's per-group std (and its bias toward easy/hard groups).
    Outcome rewards are one value per sequence, so whitening is per sequence. (N,) -> (N,)."""
    return _batch_whiten(rewards.to(torch.promote_types(rewards.dtype, torch.float32)), eps)


@ADVANTAGE_ESTIMATORS.register("reinforce_pp_baseline")
def reinforce_pp_baseline_advantages(rewards: Tensor, group_ids: Tensor, *, eps: float = 1e-6) -> Tensor:
    """REINFORCE++ with a group baseline (verl's `reinforce_plus_plus_baseline`): subtract the
    group mean (as Dr.GRPO), then whiten over the global batch. Constant groups stay exactly 0."""
    mean, _, _, constant = _group_moments(rewards, group_ids)
    centered = torch.where(constant, 0.0, rewards - mean)
    live = ~constant
    if int(live.sum()) < 2:
        return torch.zeros_like(centered)
    scale = centered[live].std()
    return torch.where(constant, 0.0, centered / (scale + eps))


def gae_advantages(
    token_rewards: Tensor, values: Tensor, mask: Tensor, *, gamma: float, lam: float
) -> tuple[Tensor, Tensor]:
    """Generalized advantage estimation (Schulman et al. 2016) over policy tokens, (B, T) each.

    delta_t = r_t + gamma * V_{t+1} - V_t ;  A_t = delta_t + gamma * lam * A_{t+1}
    Positions where mask == 0 (tool output, padding) are skipped: the recursion jumps from one
    policy token to the next policy token, so an observation between two turns does not count as
    time steps (the critic is on the same tokens as the policy). Returns (advantages, returns),
    returns = advantages + values; both 0 where mask == 0. A plain reverse loop over T: T is a few
    hundred tokens and readability wins (tests compare it with a hand computation)."""
    m = _bool_mask(mask)
    advantages = torch.zeros_like(values, dtype=torch.float32)
    next_value = torch.zeros(values.shape[0], dtype=torch.float32)
    next_adv = torch.zeros(values.shape[0], dtype=torch.float32)
    for t in reversed(range(values.shape[1])):
        live = m[:, t]
        delta = token_rewards[:, t] + gamma * next_value - values[:, t]
        adv_t = delta + gamma * lam * next_adv
        advantages[:, t] = torch.where(live, adv_t, 0.0)
        next_value = torch.where(live, values[:, t].float(), next_value)
        next_adv = torch.where(live, adv_t, next_adv)
    returns = torch.where(m, advantages + values, 0.0)
    return advantages, returns


@TOKEN_ADVANTAGE_ESTIMATORS.register("gae")
def whitened_gae_advantages(
    token_rewards: Tensor, values: Tensor, mask: Tensor, *, gamma: float, lam: float
) -> tuple[Tensor, Tensor]:
    """PPO's estimator: GAE, then the advantages whitened over every policy token of the batch
    (verl's `compute_gae_advantage_return` + `masked_whiten`); 0 off the mask. Returns are not whitened."""
    adv, returns = gae_advantages(token_rewards, values, mask, gamma=gamma, lam=lam)
    live = mask.bool()
    return torch.where(live, (adv - masked_mean(adv, mask)) / (adv[live].std() + 1e-8), 0.0), returns


def value_loss(
    values: Tensor,
    old_values: Tensor,
    returns: Tensor,
    mask: Tensor,
    *,
    clip: float,
    num_tokens: float | Tensor | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """PPO's clipped value loss (as in verl / OpenRLHF): 0.5 * max((V - R)^2, (V_clip - R)^2) with
    V_clip = old_V + clip(V - old_V, -clip, clip), averaged over policy tokens. `num_tokens` is the
    global count when the batch is split into micro-batches (see agg_loss)."""
    m = _bool_mask(mask)
    clipped = old_values + (values - old_values).clamp(-clip, clip)
    unclipped_err, clipped_err = (values - returns) ** 2, (clipped - returns) ** 2
    loss = 0.5 * agg_loss(torch.maximum(unclipped_err, clipped_err), m, "token_mean", num_tokens=num_tokens)
    clip_frac = masked_mean((clipped_err > unclipped_err).float(), m)
    return loss, {"value_clip_frac": float(clip_frac)}


# --------------------------------------------------------------------------- token helpers
def masked_mean(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Mean of x over mask==1 (over `dim`, or everything). An empty mask gives 0, not NaN."""
    m = _bool_mask(mask)
    return torch.where(m, x, 0.0).sum(dim) / m.sum(dim).clamp_min(1)


# KL estimators share one signature fn(log_ratio, *, k3_clamp); only k3 uses the clamp.
@KL_ESTIMATORS.register("k1")
def _kl_k1(log_ratio: Tensor, *, k3_clamp: float | None) -> Tensor:
    return log_ratio  # unbiased, high variance, can be negative; gradient 1, nothing to bound


@KL_ESTIMATORS.register("k2")
def _kl_k2(log_ratio: Tensor, *, k3_clamp: float | None) -> Tensor:
    return 0.5 * log_ratio.square()  # biased but low variance; gradient is the true KL's (linear)


@KL_ESTIMATORS.register("k3")
def _kl_k3(log_ratio: Tensor, *, k3_clamp: float | None) -> Tensor:
    # With r = ref/pi: (r - 1) - log r. Unbiased for KL(pi||ref) (E_pi[r - 1] = 0) and >= 0
    # since log r <= r - 1 (Schulman, "Approximating KL divergence", 2020); GRPO's KL term.
    neg = (-log_ratio).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)  # exp() must stay finite
    kl = torch.exp(neg) - neg - 1.0
    # Its slope 1 - r grows like e^(ref - logp): at ref - logp = 3 the term is 16.09 with slope
    # -19.09, at 20 it is 4.9e8, so a few tokens the policy has moved far from can own the loss.
    # verl's low_var_kl clamps the estimate to [-10, 10] (k3 >= 0: only the top binds); past the
    # bound torch.clamp passes no gradient, so such a token stops pulling.
    return kl if k3_clamp is None else kl.clamp(max=k3_clamp)


def kl_penalty(logprobs: Tensor, ref_logprobs: Tensor, kind: str = "k3", *, k3_clamp: float | None = 10.0) -> Tensor:
    """Per-token estimate of KL(pi || ref) from samples of pi. (B, T), (B, T) -> (B, T).
    k1 = logp - ref; k2 = 0.5 (logp - ref)^2; k3 = min(exp(ref - logp) - (ref - logp) - 1, k3_clamp)
    with the log-ratio clamped to [-20, 20] (k3_clamp None: unbounded; k1, k2 ignore it, as verl
    clamps only low_var_kl). Unmasked: reduce with masked_mean / agg_loss."""
    _check_bound("k3_clamp", k3_clamp, 0.0)
    return KL_ESTIMATORS.get(kind)(logprobs.float() - ref_logprobs.float(), k3_clamp=k3_clamp)


# --------------------------------------------------------------------------- aggregation
def _den(count: float | Tensor | None, default: Tensor, like: Tensor) -> Tensor:
    """Denominator: the caller's global count if given (float or all-reduced tensor), else the
    local one. Clamped to >= 1 so an all-padding batch gives 0 loss instead of NaN."""
    value = default if count is None else count
    return torch.as_tensor(value, dtype=like.dtype, device=like.device).clamp_min(1)


@AGG_MODES.register("token_mean")
def _agg_token_mean(masked: Tensor, m: Tensor, num_tokens, num_seqs, max_tokens) -> Tensor:
    # DAPO: every token weighs the same, so long (multi-turn) trajectories are not down-weighted.
    return masked.sum() / _den(num_tokens, m.sum(), masked)


@AGG_MODES.register("seq_mean_token_mean")
def _agg_seq_mean_token_mean(masked: Tensor, m: Tensor, num_tokens, num_seqs, max_tokens) -> Tensor:
    # Original GRPO: mean over each sequence's tokens, then over sequences.
    per_seq = masked.sum(-1) / m.sum(-1).clamp_min(1)
    return per_seq.sum() / _den(num_seqs, m.any(-1).sum(), masked)


@AGG_MODES.register("seq_mean_token_sum_norm")
def _agg_seq_mean_token_sum_norm(masked: Tensor, m: Tensor, num_tokens, num_seqs, max_tokens) -> Tensor:
    # Dr.GRPO: divide token sums by a *constant* (the generation budget), not by each sequence's
    # length, which biases towards long wrong answers. A required argument rather than
    # masked.shape[-1], because the padded length changes from micro-batch to micro-batch.
    if max_tokens is None:
        raise ValueError("agg mode 'seq_mean_token_sum_norm' needs max_tokens (the generation budget)")
    per_seq = masked.sum(-1) / max_tokens
    return per_seq.sum() / _den(num_seqs, m.any(-1).sum(), masked)


def agg_loss(
    loss_mat: Tensor,
    loss_mask: Tensor,
    mode: str,
    *,
    num_tokens: float | Tensor | None = None,
    num_seqs: float | Tensor | None = None,
    max_tokens: int | None = None,
) -> Tensor:
    """Reduce a per-token loss (B, T) under loss_mask (B, T) to a scalar (verl's agg_loss).

    token_mean:              sum(loss * mask) / num_tokens
    seq_mean_token_mean:     sum_i mean_t(loss_i) / num_seqs
    seq_mean_token_sum_norm: sum_i (sum_t loss_i / max_tokens) / num_seqs
    num_tokens / num_seqs are GLOBAL counts over all micro-batches (and ranks), e.g. from
    `agg_normalizers` summed / all-reduced; then summing agg_loss over micro-batches equals the
    full-batch loss. Left as None they default to this batch's counts. A sequence counts only if
    it has >= 1 mask token: all-padding rows (bucketing filler) must not dilute the loss.
    """
    m = _bool_mask(loss_mask)
    masked = torch.where(m, loss_mat, 0.0)  # garbage at padding never enters a sum or a grad
    return AGG_MODES.get(mode)(masked, m, num_tokens, num_seqs, max_tokens)


def agg_normalizers(loss_mask: Tensor) -> tuple[Tensor, Tensor]:
    """(num_tokens, num_seqs) of one micro-batch, as float tensors, counted exactly as agg_loss
    counts them. Sum over micro-batches and all-reduce over ranks to get the global counts."""
    m = _bool_mask(loss_mask)
    return m.sum().float(), m.any(-1).sum().float()


# --------------------------------------------------------------------------- policy losses
def _clipped_surrogate(
    ratio: Tensor, adv: Tensor, clip_low: float, clip_high: float, clip_ratio_c: float | None
) -> tuple[Tensor, Tensor, Tensor]:
    """PPO (Schulman et al. 2017) as a loss: max(-A r, -A clip(r, 1-lo, 1+hi)), plus where the
    clipped branch is active. hi > lo is DAPO's clip-higher: room for low-probability tokens
    to grow, against entropy collapse. `where` (not maximum) sends the gradient to one branch.

    Dual-clip (Ye et al. 2020, "Mastering Complex Control in MOBA Games", verl's default 3): for
    A < 0 the max above is -A r, unbounded in r, so a token the policy now likes e^10 times more
    carries a loss (and gradient) e^10 times the advantage. It is capped at -A * clip_ratio_c,
    a constant: zero gradient. Returns (loss, is_clipped, is_dual_clipped)."""
    unclipped = -adv * ratio
    clipped = -adv * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    is_clipped = clipped > unclipped
    loss = torch.where(is_clipped, clipped, unclipped)
    if clip_ratio_c is None:
        return loss, is_clipped, torch.zeros_like(is_clipped)
    capped = -adv * clip_ratio_c
    is_dual_clipped = (adv < 0) & (loss > capped)
    return torch.where(is_dual_clipped, capped, loss), is_clipped, is_dual_clipped


@torch.no_grad()
def _ratio_metrics(
    ratio: Tensor, is_clipped: Tensor, is_dual_clipped: Tensor, m: Tensor, logprobs: Tensor, old_logprobs: Tensor
) -> dict[str, float]:
    """Diagnostics over mask tokens only. approx_kl is k3 with samples from the old policy,
    i.e. (r - 1) - log r, an unbiased estimate of KL(old || new); unclamped, it is a measurement.
    dual_clip_frac is verl's pg_clipfrac_lower: tokens whose loss the dual-clip capped."""
    n = int(m.sum())
    return {
        "clip_frac": masked_mean(is_clipped.float(), m).item(),
        "dual_clip_frac": masked_mean(is_dual_clipped.float(), m).item(),
        "approx_kl": masked_mean(kl_penalty(old_logprobs, logprobs, "k3", k3_clamp=None), m).item(),
        "ratio_mean": masked_mean(ratio, m).item(),
        "ratio_max": torch.where(m, ratio, -torch.inf).max().item() if n else 0.0,
    }


@POLICY_LOSSES.register("ppo_clip")
def ppo_clip_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    loss_mask: Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    clip_ratio_c: float | None = 3.0,
    seq_log_ratio_max: float = 10.0,
    agg_mode: str = "token_mean",
    num_tokens: float | Tensor | None = None,
    num_seqs: float | Tensor | None = None,
    max_tokens: int | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """Token-level PPO clipped surrogate (GRPO / DAPO), dual-clipped at `clip_ratio_c` for A < 0
    (None: off). All inputs (B, T); advantages may be (B, 1). `seq_log_ratio_max` is unused (the
    shared signature; token ratios keep the finite-exp clamp LOG_RATIO_CLAMP, as verl's 20).
    Returns (scalar loss, metrics: clip_frac, dual_clip_frac, approx_kl, ratio_mean, ratio_max)."""
    _check_bound("clip_ratio_c", clip_ratio_c, 1.0)  # <= 1 would cap the loss at ratio 1
    m = _bool_mask(loss_mask)
    # Mask BEFORE exp so padding garbage never enters the graph (the clamp's backward happens to
    # zero NaN/inf gradients too, but that is a side effect, not a contract).
    # Garbage advantages need no masking: agg_loss's `where` drops their value and gradient.
    log_ratio = torch.where(m, logprobs - old_logprobs, 0.0).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    ratio = torch.exp(log_ratio)
    loss_mat, is_clipped, is_dual = _clipped_surrogate(ratio, advantages, clip_low, clip_high, clip_ratio_c)
    loss = agg_loss(loss_mat, m, agg_mode, num_tokens=num_tokens, num_seqs=num_seqs, max_tokens=max_tokens)
    return loss, _ratio_metrics(ratio, is_clipped, is_dual, m, logprobs, old_logprobs)


@POLICY_LOSSES.register("gspo")
def gspo_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    loss_mask: Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    clip_ratio_c: float | None = 3.0,
    seq_log_ratio_max: float = 10.0,
    agg_mode: str = "seq_mean_token_mean",
    num_tokens: float | Tensor | None = None,
    num_seqs: float | Tensor | None = None,
    max_tokens: int | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """GSPO (Zheng et al. 2025, "Group Sequence Policy Optimization"). Inputs (B, T).

    The importance ratio is per sequence, s_i = exp(mean_t (logp - old)) over mask tokens, and
    clipping is decided per sequence (every token of a sequence clips together). Implemented as
    the paper's GSPO-token form s_it = sg[s_i] * pi(y_t) / sg[pi(y_t)]: its value is s_i and
    its gradient s_i * grad log pi(y_t), so with per-sequence advantages and the default
    seq_mean_token_mean aggregation it equals sequence-level GSPO exactly (hence the different
    default agg_mode). The paper's clip ranges are ~3e-4 / 4e-4, not PPO's 0.2: pass them.

    The sequence log-ratio is capped at `seq_log_ratio_max` (verl: 10), value and gradient
    together as verl clamps it: a sequence past e^10 is off-policy garbage, not a signal to
    scale by e^20. The dual-clip applies as in ppo_clip (verl's GSPO has none; the surrogate is
    shared here, and A < 0 with s_i >> 1 is the same unbounded case)."""
    _check_bound("clip_ratio_c", clip_ratio_c, 1.0)
    _check_bound("seq_log_ratio_max", seq_log_ratio_max, 0.0, LOG_RATIO_CLAMP)  # a trust bound, not exp()'s range
    m = _bool_mask(loss_mask)
    tok_log_ratio = torch.where(m, logprobs - old_logprobs, 0.0)
    seq_log_ratio = tok_log_ratio.sum(-1, keepdim=True) / m.sum(-1, keepdim=True).clamp_min(1)
    seq_log_ratio = seq_log_ratio.detach().clamp_min(-LOG_RATIO_CLAMP)
    lp = torch.where(m, logprobs, 0.0)
    # value s_i, grad s_i * grad logp_t; above the cap a constant (torch.clamp passes no gradient)
    ratio = torch.exp((seq_log_ratio + (lp - lp.detach())).clamp(max=seq_log_ratio_max))
    loss_mat, is_clipped, is_dual = _clipped_surrogate(ratio, advantages, clip_low, clip_high, clip_ratio_c)
    loss = agg_loss(loss_mat, m, agg_mode, num_tokens=num_tokens, num_seqs=num_seqs, max_tokens=max_tokens)
    return loss, _ratio_metrics(ratio, is_clipped, is_dual, m, logprobs, old_logprobs)


# --------------------------------------------------------------------------- engine / trainer mismatch
def logprob_mismatch(trainer_logprobs: Tensor, engine_logprobs: Tensor, mask: Tensor) -> dict[str, float]:
    """Max and mean |log pi_trainer - log pi_engine| over policy tokens: how far the rollout
    engine's numerics (kernels, batching, dtype) are from the trainer's on the same tokens."""
    m = _bool_mask(mask)
    gap = (trainer_logprobs - engine_logprobs).abs()[m]
    if gap.numel() == 0:
        return {"max": 0.0, "mean": 0.0}
    return {"max": float(gap.max()), "mean": float(gap.mean())}


def tis_weights(trainer_logprobs: Tensor, engine_logprobs: Tensor, mask: Tensor, cap: float) -> Tensor:
    """Truncated importance sampling (verl's `tis_imp_ratio_cap`, SkyRL's TIS): per policy token
    min(pi_trainer / pi_engine, cap), no gradient. Rollouts are sampled by the engine but the loss
    is the trainer's, so each token is re-weighted towards the trainer's distribution; truncating
    at `cap` bounds the variance a rare token could add. 0 where mask is 0."""
    ratio = torch.exp((trainer_logprobs - engine_logprobs).detach()).clamp(max=cap)
    return torch.where(_bool_mask(mask), ratio, torch.zeros_like(ratio))


def distill_advantages(student_logprobs: Tensor, teacher_logprobs: Tensor, mask: Tensor, clamp: float) -> Tensor:
    """On-policy distillation's per-token signal (Agarwal et al. 2024, GKD; Thinking Machines'
    "on-policy distillation"): on tokens the student sampled, `log pi_teacher - log pi_student`,
    the negative of the single-sample estimate of the per-token reverse KL(student || teacher).
    Used as an advantage with no discount: each token is pushed towards what the teacher would
    have said at that point of the student's own trajectory. Clamped to [-clamp, clamp] and
    without gradient (a reward, not a loss); 0 where mask is 0."""
    signal = (teacher_logprobs - student_logprobs).detach().clamp(-clamp, clamp)
    return torch.where(_bool_mask(mask), signal, torch.zeros_like(signal))
