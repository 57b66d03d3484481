"""One RL round: several on-policy steps with the engines loaded once, for every algorithm.

Each step reads top to bottom: 1. generate (and refill, with dynamic sampling), 2. verify,
3. reference log-probs, values and advantages, 4. update the critic and the policy, 5. log and
checkpoint. What differs between GRPO, Dr.GRPO, RLOO, REINFORCE++, DAPO, GSPO and PPO is data
(`training.rl.algorithms.Algorithm`); the math lives in `training.rl.math`; gradients go through a
`training.engines` engine (plain torch or DeepSpeed). A round killed at any point resumes from its
last state checkpoint and ends bitwise where an uninterrupted round ends (tests/training/test_resume.py).
"""

from __future__ import annotations

import copy
import json
import random
import time
from collections import Counter, deque
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from configs.failpoints import failpoint
from configs.schema import DistillConfig, EngineConfig, ProcessConfig, RLConfig, RolloutConfig
from environments.tools import Tool
from training.agent.engines import build_rollout_engine
from training.agent.loop import run_episodes
from training.data_parallel import DataParallel
from training.engines import (
    Auxiliary,
    TrainEngine,
    accumulate_step,
    build_engine,
    micro_batches,
    model_device,
    resolve_device,
    shard,
)
from training.rl.algorithms import Algorithm, resolve_algorithm
from training.rl.batch import RolloutBatch, Sample, group_index, padded
from training.rl.critic import critic_from_policy, token_values
from training.rl.curriculum import sample_prompts
from training.rl.hindsight import relabel_all
from training.rl.math import (
    TOKEN_ADVANTAGE_ESTIMATORS,
    agg_loss,
    distill_advantages,
    get_advantage_estimator,
    get_policy_loss,
    group_stats,
    kl_penalty,
    logprob_mismatch,
    masked_mean,
    tis_weights,
    value_loss,
)
from training.rl.process import on_turn_tokens, signal_kind, turn_advantages, turn_returns, turn_signals
from training.rl.scoring import Verifying, episode_record
from training.sequences import collate, completion_logprobs, to_device
from training.state import fingerprint, load_state, save_state
from verifiers.cascade import Cascade, TierStats, merge_stats, tier_metrics


@dataclass
class RoundResult:
    rollouts: list[dict] = field(default_factory=list)
    rewards: list[dict] = field(default_factory=list)
    history: list[dict] = field(default_factory=list)
    tier_stats: dict[str, TierStats] = field(default_factory=dict)  # the whole round's verification
    disagreements: int = 0
    resumed_from_step: int = 0  # 0: started fresh
    # the trained model with whole weights (set on return, never saved in state)
    policy: Any = field(default=None, repr=False, compare=False)


def informative_groups(rewards: list[float], group_ids: list[str]) -> torch.Tensor:
    """Per trajectory: does its group have any reward spread? (DAPO keeps only those.)"""
    _, std = group_stats(torch.tensor(rewards, dtype=torch.float32), group_index(group_ids))
    return std > 1e-6


def filter_values(scores: list[dict], by: str) -> list[float]:
    """The number whose within-group spread makes a group worth training on (`rl.group_filter`).
    "outcome" is DAPO's accuracy filter (verl's `filter_groups.metric: acc`): a group whose samples
    all succeed or all fail is dropped even when the shaping terms differ. Under a std-normalized
    advantage, a 0.1 tool-cost difference between otherwise equal samples becomes a +-1 advantage:
    an all-failed multi-hop group then teaches "search fewer times", not "answer right"."""
    return [s["reward"] if by == "reward" else (s["outcome"] or 0.0) for s in scores]


def mean_group_std(rewards: list[float], group_ids: list[str]) -> float:
    """Mean within-group reward std: the spread GRPO learns from (RAGEN watches it fall)."""
    _, std = group_stats(torch.tensor(rewards, dtype=torch.float32), group_index(group_ids))
    by_group = dict(zip(group_ids, std.tolist()))
    return sum(by_group.values()) / len(by_group) if by_group else 0.0


def token_rewards(outcome: float, kl: list[float], mask: list[int], kl_coef: float) -> list[float]:
    """PPO's per-token reward: -beta * KL on each policy token, the outcome on the last one."""
    rewards = [-kl_coef * k if m else 0.0 for k, m in zip(kl, mask)]
    last = max((i for i, m in enumerate(mask) if m), default=None)
    if last is not None:
        rewards[last] += outcome
    return rewards


def repeat_rate(records: list[dict]) -> float:
    """Fraction of trajectories identical (same completion ids) to another one of their group: the
    Echo Trap (RAGEN) shows up as groups collapsing onto one trajectory before reward falls."""
    by_group: dict[str, Counter] = {}
    for r in records:
        by_group.setdefault(r["group_id"], Counter())[tuple(r["completion_ids"])] += 1
    repeated = sum(count for group in by_group.values() for count in group.values() if count > 1)
    return repeated / len(records) if records else 0.0


def unsolved_group_metrics(records: list[dict], scores: list[dict]) -> dict[str, float]:
    """The Echo Trap's signals, measured where they mean collapse: on failed trajectories and
    unsolved groups (some outcome below 1). A confident, correct policy repeats itself on what it
    has mastered, and that is success; repeating the same *wrong* trajectory, or every sample of a
    task failing alike, is the trap (RAGEN). Calibrated on healthy and forced-collapse runs
    (docs/algorithms.md)."""
    groups: dict[str, list[tuple[tuple, float, float]]] = {}
    for r, s in zip(records, scores):
        groups.setdefault(r["group_id"], []).append((tuple(r["completion_ids"]), s["outcome"] or 0.0, s["reward"]))
    unsolved = {g: rows for g, rows in groups.items() if min(o for _, o, _ in rows) < 1.0}
    failed = [Counter(ids for ids, o, _ in rows if o < 1.0) for rows in unsolved.values()]
    # wrong trajectories echoed within their group
    repeated = sum(n for counts in failed for n in counts.values() if n > 1)
    stuck = sum(1 for rows in unsolved.values() if len({o for _, o, _ in rows}) == 1)  # every sample failed alike
    stds = [
        torch.tensor([rw for _, _, rw in rows]).std().item() if len(rows) > 1 else 0.0 for rows in unsolved.values()
    ]
    metrics = {
        "rollout/unsolved_groups": len(unsolved) / len(groups) if groups else 0.0,
        "rollout/stuck_frac": stuck / len(groups) if groups else 0.0,
    }
    if unsolved:  # absent, not 0, when everything is solved: collapse.py skips a step without them
        metrics["rollout/repeat_rate_failed"] = repeated / sum(sum(counts.values()) for counts in failed)
        metrics["reward/group_std_unsolved"] = sum(stds) / len(stds)
    return metrics


def rollout_metrics(records: list[dict], scores: list[dict]) -> dict[str, float]:
    n = len(records)
    rewards = torch.tensor([s["reward"] for s in scores])
    outcome = torch.tensor([s["outcome"] or 0.0 for s in scores])
    policy_tokens = [sum(r["tool_mask"]) for r in records]
    components = {
        f"reward/{k[len('reward_') :]}/contribution": sum(s[k] for s in scores) / n
        for k in scores[0]
        if k.startswith("reward_")
    }
    calls = [c for r in records for c in json.loads(r["tool_calls"] or "[]")]
    if calls:  # a traceback, a timeout, an empty search: what the process signals penalize
        components["rollout/tool_error_rate"] = sum(signal_kind(c.get("error")) is not None for c in calls) / len(calls)
    if "process_total" in scores[0]:  # process signals credited per turn: not a reward component
        components["reward/process/turn_credited"] = sum(s["process_total"] for s in scores) / n
    group_ids = [r["group_id"] for r in records]
    spread = informative_groups(rewards.tolist(), group_ids)
    groups_with_spread = {g for g, keep in zip(group_ids, spread.tolist()) if keep}
    return {
        **components,
        "reward/total/mean": float(rewards.mean()),
        "reward/total/std": float(rewards.std()) if n > 1 else 0.0,
        "reward/group_std": mean_group_std(rewards.tolist(), group_ids),
        "reward/outcome/pass_rate": float(outcome.mean()),
        "reward/well_formed/mean": sum(s["well_formed"] for s in scores) / n,
        "reward/unscorable": float(sum(s["outcome"] is None for s in scores)),
        "rollout/tool_call_rate": sum(r["num_tool_calls"] > 0 for r in records) / n,
        "rollout/tool_calls_per_episode": sum(r["num_tool_calls"] for r in records) / n,
        "rollout/turns": sum(r["turns"] for r in records) / n,
        "rollout/completion_len": sum(len(r["completion_ids"]) for r in records) / n,
        "rollout/policy_tokens": sum(policy_tokens) / n,
        "rollout/repeat_rate": repeat_rate(records),
        "rollout/zero_variance_frac": 1.0 - len(groups_with_spread) / len(set(group_ids)),
        **unsolved_group_metrics(records, scores),
    }


# --------------------------------------------------------------------------- model passes
def _record_shape(record: dict) -> tuple[int, int]:
    return len(record["prompt_ids"]), len(record["completion_ids"])


def _per_token(
    records: list[dict], fn: Callable, model, *, pad_id: int, batch_size: int, max_tokens: int | None
) -> list[list[float]]:
    """fn(batch) -> (rows, width) per completion token, for every record, in record order; computed
    in chunks of at most `batch_size` rows (and `max_tokens` padded tokens, length-sorted), each
    batch on `model`'s device."""
    index = {id(r): i for i, r in enumerate(records)}
    out: list[list[float]] = [[] for _ in records]
    device = model_device(model)
    for rows in micro_batches(records, batch_size, max_tokens=max_tokens, shape=_record_shape):
        batch = collate(
            [r["prompt_ids"] for r in rows], [r["completion_ids"] for r in rows], [r["tool_mask"] for r in rows], pad_id
        )
        values = fn(to_device(batch, device)).cpu()
        for j, r in enumerate(rows):
            out[index[id(r)]] = values[j, : len(r["completion_ids"])].tolist()
    return out


@torch.no_grad()
def recorded_logprobs(
    model,
    records: list[dict],
    *,
    temperature: float,
    pad_id: int,
    batch_size: int = 64,
    max_tokens: int | None = None,
    chunk_tokens: int | None = None,
) -> list[list[float]]:
    """log pi(recorded token) for every completion token of every record, in batches
    (`chunk_tokens`: engine.logit_chunk_tokens, see completion_logprobs)."""
    return _per_token(
        records,
        lambda batch: completion_logprobs(model, batch, temperature, chunk_tokens=chunk_tokens),
        model,
        pad_id=pad_id,
        batch_size=batch_size,
        max_tokens=max_tokens,
    )


@torch.no_grad()
def recorded_values(
    critic, records: list[dict], *, pad_id: int, batch_size: int = 64, max_tokens: int | None = None
) -> list[list[float]]:
    return _per_token(
        records,
        lambda batch: token_values(critic, batch),
        critic,
        pad_id=pad_id,
        batch_size=batch_size,
        max_tokens=max_tokens,
    )


def _kl_per_token(batch: RolloutBatch, old: torch.Tensor, algo: Algorithm) -> torch.Tensor:
    """KL(old || reference) estimated per token, (B, W). Row by row on each row's own tokens:
    elementwise kernels may round a vector body and its tail differently, so a row's values would
    otherwise depend on the width it is padded to."""
    kl = torch.zeros_like(old)
    for i, n in enumerate(batch.lengths):
        kl[i, :n] = kl_penalty(old[i, :n], batch.ref_logprobs[i, :n], algo.kl_estimator, k3_clamp=algo.k3_clamp)
    return kl


def _policy_token_mean(per_token: torch.Tensor, tool_mask: torch.Tensor) -> float:
    """The mean over policy tokens, summed in row-major order in double precision (a metric)."""
    values = per_token[tool_mask.bool()].tolist()
    return sum(values) / max(1, len(values))


def trainer_gap(
    policy,
    records: list[dict],
    *,
    temperature: float,
    pad_id: int,
    max_tokens: int | None = None,
    chunk_tokens: int | None = None,
    dp: DataParallel = DataParallel(),
) -> tuple[list[list[float]], dict[str, float]]:
    """The trainer's log-probs of the recorded tokens, and how far the rollout engine's behaviour
    log-probs are from them on policy tokens (`rollout/logprob_mismatch_*`, every step). Under
    data parallelism each rank computes its share and every rank gets all of them."""
    old = dp.map_sharded(
        records,
        lambda rows: recorded_logprobs(
            policy, rows, temperature=temperature, pad_id=pad_id, max_tokens=max_tokens, chunk_tokens=chunk_tokens
        ),
    )
    width = max(len(r["completion_ids"]) for r in records)
    gap = logprob_mismatch(
        padded(old, width),
        padded([r["logprobs"] for r in records], width),
        padded([r["tool_mask"] for r in records], width),
    )
    return old, {"rollout/logprob_mismatch_max": gap["max"], "rollout/logprob_mismatch_mean": gap["mean"]}


def reuses_update_logprobs(algo: Algorithm) -> bool:
    """Strictly on-policy: one optimizer step per batch, and nothing needs the old log-probs
    before the update (no KL in the reward, no critic, no importance weights). The update's own
    log-probs, detached, are then exactly the old ones (ratio 1, as TRL and verl use them), so
    the pass that recomputes them is skipped: one forward of the batch in five (ref, old, and the
    update's forward + backward). The engine/trainer mismatch and the KL to the reference are
    then measured in the update, from the same log-probs (`policy_loss_fn`'s `stats`)."""
    return (
        algo.minibatches == 1
        and algo.tis_cap is None
        and not algo.critic
        and not (algo.needs_reference and algo.kl_placement == "reward")
    )


def prepare_samples(
    records: list[dict],
    scores: list[dict],
    algo: Algorithm,
    *,
    policy,
    reference,
    critic,
    temperature: float,
    pad_id: int,
    micro_batch_tokens: int | None = None,
    chunk_tokens: int | None = None,
    dp: DataParallel = DataParallel(),
    process: ProcessConfig | None = None,
    distill: DistillConfig | None = None,
    teacher=None,
) -> tuple[list[Sample], dict[str, float]]:
    """Step 3: the trainer's own log-probs of the recorded tokens (the PPO ratio's denominator, and
    the engine/trainer mismatch), reference log-probs, KL (in the reward if so placed), values,
    advantages (times truncated importance weights if `algo.tis_cap`); then keep the trajectories
    that carry a gradient signal. A group with an unscorable member never trains (docs/verifiers.md).
    `micro_batch_tokens`: padded tokens per forward pass (engine.micro_batch_tokens); `chunk_tokens`:
    LM-head tokens at once in a log-prob pass (engine.logit_chunk_tokens). The reference and the
    critic run wherever they are (rl.reference_device, rl.critic_device). `dp`: under data
    parallelism every rank holds the same global batch; each computes its share of the per-token passes."""
    passes = dict(temperature=temperature, pad_id=pad_id, max_tokens=micro_batch_tokens, chunk_tokens=chunk_tokens)
    batch = RolloutBatch.of(records, scores)
    metrics: dict[str, float] = {}
    if not reuses_update_logprobs(algo):
        old, metrics = trainer_gap(policy, records, **passes, dp=dp)
        batch = batch.with_(old_logprobs=padded(old, batch.width))
    # The whole group leaves: the unscorable member's reward is shaping only, and in the group's
    # baseline it would act as an outcome of 0 and move its siblings' advantages.
    unscorable = {g for g, outcome in zip(batch.group_ids, batch.outcomes) if outcome is None}
    metrics["rollout/unscorable_groups"] = float(len(unscorable))
    if unscorable:
        batch = batch.select([g not in unscorable for g in batch.group_ids])
        if not batch:
            return [], metrics
    if algo.drop_zero_variance_groups and algo.group_filter == "outcome":
        # the dynamic-sampling batch is already filtered; this is the plain one
        keep = informative_groups(filter_values(batch.scores, "outcome"), batch.group_ids)
        metrics["rollout/no_outcome_spread_dropped"] = float(len(batch) - int(keep.sum()))
        batch = batch.select(keep)
        if not batch:
            return [], metrics
    if algo.needs_reference:
        ref = dp.map_sharded(batch.records, lambda rows: recorded_logprobs(reference, rows, **passes))
        batch = batch.with_(ref_logprobs=padded(ref, batch.width))
    if batch.ref_logprobs is not None and batch.old_logprobs is not None:
        batch = batch.with_(kl=_kl_per_token(batch, batch.old_logprobs, algo))
        metrics["actor/kl_ref"] = _policy_token_mean(batch.kl, batch.tool_mask)
    in_reward = algo.kl_coef if (batch.kl is not None and algo.kl_placement == "reward") else 0.0
    batch = _with_advantages(batch, algo, in_reward, critic, pad_id, micro_batch_tokens, dp, metrics)
    if process is not None and process.enabled and process.credit == "turn":
        batch = _with_turn_credit(batch, process, metrics)
    if distill is not None and distill.enabled:
        batch = _with_distillation(batch, distill, teacher, passes, dp, metrics)
    if algo.tis_cap is not None:  # w > 0 factors out of PPO's min/max, so weighting A weights the token's loss
        weights = tis_weights(batch.old_logprobs, batch.behaviour_logprobs, batch.tool_mask, algo.tis_cap)
        metrics["rollout/tis_weight_mean"] = float(masked_mean(weights, batch.tool_mask))
        batch = batch.with_(advantages=batch.advantages * weights)
    trained = batch
    if algo.drop_zero_variance_groups:
        # an all-zero advantage (e.g. a zero-variance group under GRPO) moves nothing but the normalizer
        trained = batch.select((batch.advantages != 0).any(dim=1))
    # no update will measure them: the engine gap and KL as without reuse
    if batch.old_logprobs is None and not trained:
        old, gap = trainer_gap(policy, batch.records, **passes, dp=dp)
        metrics |= gap
        if batch.ref_logprobs is not None:
            kl = _kl_per_token(batch, padded(old, batch.width), algo)
            metrics["actor/kl_ref"] = _policy_token_mean(kl, batch.tool_mask)
    return trained.samples(), metrics


def _with_advantages(
    batch: RolloutBatch,
    algo: Algorithm,
    in_reward: float,
    critic,
    pad_id: int,
    micro_batch_tokens: int | None,
    dp: DataParallel,
    metrics: dict[str, float],
) -> RolloutBatch:
    """Advantages per token: a token-level estimator over the critic's values (GAE), or a
    sequence-level one over the group's rewards, the sequence's value repeated on its tokens."""
    if algo.critic:
        values = padded(
            dp.map_sharded(
                batch.records,
                lambda rows: recorded_values(critic, rows, pad_id=pad_id, max_tokens=micro_batch_tokens),
            ),
            batch.width,
        )
        kl = batch.kl.tolist() if batch.kl is not None else None
        per_token = [
            token_rewards(reward, kl[i] if kl else [0.0] * len(r["tool_mask"]), r["tool_mask"], in_reward)
            for i, (r, reward) in enumerate(zip(batch.records, batch.rewards))
        ]
        estimator = TOKEN_ADVANTAGE_ESTIMATORS.get(algo.advantage_estimator)
        advantages, returns = estimator(
            padded(per_token, batch.width), values, batch.tool_mask, gamma=algo.gamma, lam=algo.lam
        )
        metrics["critic/values_mean"] = float(masked_mean(values, batch.tool_mask))
        return batch.with_(values=values, returns=returns, advantages=advantages)
    rewards = batch.rewards
    if in_reward:  # KL in the reward, for outcome estimators: the sequence's reward minus beta * its summed KL (verl)
        kl_sums = [sum(row[m].tolist()) for row, m in zip(batch.kl, batch.tool_mask.bool())]
        rewards = [reward - in_reward * kl_sum for reward, kl_sum in zip(rewards, kl_sums)]
    sequence = get_advantage_estimator(algo.advantage_estimator)(
        torch.tensor(rewards, dtype=torch.float32), batch.group_index
    )
    return batch.with_(advantages=_on_tokens(sequence, batch))


def _with_turn_credit(batch: RolloutBatch, process: ProcessConfig, metrics: dict[str, float]) -> RolloutBatch:
    """Adds the turn-level advantage of the process signals to each policy turn's tokens
    (training/rl/process.py has the estimator)."""
    returns = [
        turn_returns(turn_signals(json.loads(r["tool_calls"]), process.penalties), process.gamma, process.cap)
        for r in batch.records
    ]
    per_turn = turn_advantages(returns, batch.group_ids)
    added = padded([on_turn_tokens(turns, r["tool_mask"]) for turns, r in zip(per_turn, batch.records)], batch.width)
    metrics["actor/turn_advantage_abs_mean"] = float(masked_mean(added.abs(), batch.tool_mask))
    return batch.with_(advantages=batch.advantages + process.turn_weight * added)


def _with_distillation(
    batch: RolloutBatch, distill: DistillConfig, teacher, passes: dict, dp: DataParallel, metrics: dict[str, float]
) -> RolloutBatch:
    """On-policy distillation: the teacher scores the student's sampled tokens; `coef` times
    (teacher - student log-prob) is added to the outcome's advantage, or replaces it
    (`with_outcome: false`). The student's log-probs are the trainer's before the update (the
    engine's when the update reuses its own, on-policy: the two agree to rollout/logprob_mismatch)."""
    if teacher is None:
        raise ValueError("rl.distill.enabled but no teacher model was given")
    teacher_lp = padded(
        dp.map_sharded(batch.records, lambda rows: recorded_logprobs(teacher, rows, **passes)), batch.width
    )
    student_lp = batch.old_logprobs if batch.old_logprobs is not None else batch.behaviour_logprobs
    signal = distill_advantages(student_lp, teacher_lp, batch.tool_mask, distill.clamp)
    metrics["distill/reverse_kl"] = -float(masked_mean(signal, batch.tool_mask))
    base = batch.advantages if distill.with_outcome else torch.zeros_like(batch.advantages)
    return batch.with_(advantages=base + distill.coef * signal)


def _on_tokens(sequence: torch.Tensor, batch: RolloutBatch) -> torch.Tensor:
    """A value per sequence (B,) on every completion token of it, 0 on the padding: (B, W)."""
    within = torch.arange(batch.width)[None, :] < torch.tensor(batch.lengths)[:, None]
    return torch.where(within, sequence[:, None], 0.0)


# --------------------------------------------------------------------------- update
def _counts(samples: list[Sample]) -> torch.Tensor:
    """(policy tokens, sequences with a policy token): the global normalizers of agg_loss."""
    tokens = [sum(s.record["tool_mask"]) for s in samples]
    return torch.tensor([float(sum(tokens)), float(sum(t > 0 for t in tokens))])


def _collate(samples: list[Sample], pad_id: int, device: torch.device):
    batch = collate(
        [s.record["prompt_ids"] for s in samples],
        [s.record["completion_ids"] for s in samples],
        [s.record["tool_mask"] for s in samples],
        pad_id,
    )
    return to_device(batch, device)


def policy_loss_fn(
    engine,
    algo: Algorithm,
    *,
    temperature: float,
    pad_id: int,
    loss_norm_tokens: int,
    stats: dict[str, float] | None = None,
    chunk_tokens: int | None = None,
) -> Callable:
    """`loss_norm_tokens`: the constant divisor of a token-sum aggregation (Dr.GRPO's
    seq_mean_token_sum_norm), the episode's token budget (rollout.max_total_tokens). `stats`: where, for samples without old log-probs (reuses_update_logprobs), the update's own
    log-probs are measured against the engine's and the reference's (sums, see `on_policy_metrics`).
    `chunk_tokens`: engine.logit_chunk_tokens (completion_logprobs)."""
    policy_loss = get_policy_loss(algo.policy_loss)

    def loss_fn(samples: list[Sample], counts: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
        device = engine.device
        batch = _collate(samples, pad_id, device)
        width = batch.completion_ids.shape[1]
        logprobs, entropy = completion_logprobs(
            engine.module, batch, temperature, with_entropy=True, chunk_tokens=chunk_tokens
        )
        mask = batch.loss_mask
        norm = {"num_tokens": counts[0], "num_seqs": counts[1], "max_tokens": loss_norm_tokens}
        if samples[0].old_logprobs is None:
            old = logprobs.detach()
            if stats is not None:
                _measure_on_policy(stats, old, samples, mask, width, algo)
        else:
            old = padded([s.old_logprobs for s in samples], width, device)
        loss, metrics = policy_loss(
            logprobs,
            old,
            padded([s.advantages for s in samples], width, device),
            mask,
            clip_low=algo.clip_low,
            clip_high=algo.clip_high,
            clip_ratio_c=algo.clip_ratio_c,
            seq_log_ratio_max=algo.seq_log_ratio_max,
            agg_mode=algo.loss_agg_mode,
            **norm,
        )
        out = {
            "loss/policy": loss.item(),
            "actor/clip_frac": metrics["clip_frac"],
            "actor/dual_clip_frac": metrics["dual_clip_frac"],
            "actor/approx_kl": metrics["approx_kl"],
        }
        if algo.needs_reference and algo.kl_placement == "loss":
            ref = padded([s.ref_logprobs for s in samples], width, device)
            kl = agg_loss(
                kl_penalty(logprobs, ref, algo.kl_estimator, k3_clamp=algo.k3_clamp), mask, algo.loss_agg_mode, **norm
            )
            loss = loss + algo.kl_coef * kl
            out["loss/kl"] = kl.item()
        # summed over micro-batches and ranks (SUMMED_METRICS): the minibatch's exact token mean, whatever the split
        out["actor/entropy"] = float((entropy.detach() * mask).sum() / counts[0].clamp(min=1))
        return loss, out

    return loss_fn


def _measure_on_policy(
    stats: dict[str, float],
    trainer: torch.Tensor,
    samples: list[Sample],
    mask: torch.Tensor,
    width: int,
    algo: Algorithm,
) -> None:
    """Accumulates, over one micro-batch's policy tokens, what `trainer_gap` and `prepare_samples`
    would have measured from a separate old-log-prob pass."""
    m = mask.bool()
    gap = (trainer - padded([s.record["logprobs"] for s in samples], width, trainer.device)).abs()[m]
    stats["tokens"] = stats.get("tokens", 0.0) + float(m.sum())
    stats["gap_sum"] = stats.get("gap_sum", 0.0) + float(gap.sum())
    stats["gap_max"] = max(stats.get("gap_max", 0.0), float(gap.max()) if gap.numel() else 0.0)
    if samples[0].ref_logprobs is not None:
        kl = kl_penalty(
            trainer,
            padded([s.ref_logprobs for s in samples], width, trainer.device),
            algo.kl_estimator,
            k3_clamp=algo.k3_clamp,
        )[m]
        stats["kl_sum"] = stats.get("kl_sum", 0.0) + float(kl.sum())


def on_policy_metrics(stats: dict[str, float], dp: DataParallel = DataParallel()) -> dict[str, float]:
    """The mismatch and KL metrics from the sums `_measure_on_policy` collected ({} if none), over
    every rank's micro-batches."""
    stats = combine_stats(dp.gather_objects(stats))
    if not stats.get("tokens"):
        return {}
    out = {
        "rollout/logprob_mismatch_max": stats["gap_max"],
        "rollout/logprob_mismatch_mean": stats["gap_sum"] / stats["tokens"],
    }
    if "kl_sum" in stats:
        out["actor/kl_ref"] = stats["kl_sum"] / stats["tokens"]
    return out


def combine_stats(per_rank: list[dict[str, float]]) -> dict[str, float]:
    """Ranks' `_measure_on_policy` sums added up (the maximum of the maxima)."""
    out: dict[str, float] = {}
    for stats in per_rank:
        for key, value in stats.items():
            out[key] = max(out.get(key, 0.0), value) if key == "gap_max" else out.get(key, 0.0) + value
    return out


def critic_loss_fn(engine, clip: float, pad_id: int) -> Callable:
    def loss_fn(samples: list[Sample], counts: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
        batch = _collate(samples, pad_id, engine.device)
        width = batch.completion_ids.shape[1]
        values = token_values(engine.module, batch)
        loss, metrics = value_loss(
            values,
            padded([s.old_values for s in samples], width, engine.device),
            padded([s.returns for s in samples], width, engine.device),
            batch.loss_mask,
            clip=clip,
            num_tokens=counts[0],
        )
        return loss, {"critic/value_loss": loss.item(), "critic/value_clip_frac": metrics["value_clip_frac"]}

    return loss_fn


# Metrics the loss functions normalize by the global counts (the loss terms, the entropy's token
# mean), so their sum over micro-batches and ranks is the minibatch's value whatever the split
# (accumulate_step `summed`); the others are averaged over rows.
SUMMED_METRICS = ("loss/policy", "loss/kl", "critic/value_loss", "actor/entropy")


def hindsight_loss_fn(engine, coef: float, pad_id: int, chunk_tokens: int | None = None) -> Callable:
    """The corrected examples' NLL (training/rl/hindsight.py): a token mean over every example of
    the minibatch (`counts[0]`, global) on their trained tokens, times `coef`, at temperature 1 as
    SFT trains. Reported unweighted as `loss/hindsight`."""

    def loss_fn(samples: list[Sample], counts: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
        batch = _collate(samples, pad_id, engine.device)
        logprobs = completion_logprobs(engine.module, batch, chunk_tokens=chunk_tokens)
        nll = agg_loss(-logprobs, batch.loss_mask, "token_mean", num_tokens=counts[0])
        return coef * nll, {"loss/hindsight": float(nll.detach())}

    return loss_fn


HINDSIGHT_METRICS = ("loss/hindsight",)


def _sample_shape(sample: Sample) -> tuple[int, int]:
    return _record_shape(sample.record)


def run_update(
    engine,
    samples: list[Sample],
    loss_fn: Callable,
    *,
    minibatches: int,
    micro_batch_size: int | None,
    generator: torch.Generator,
    prefix: str,
    micro_batch_tokens: int | None = None,
    auxiliary: Auxiliary | None = None,
) -> dict[str, float]:
    """`minibatches` optimizer steps over shuffled, disjoint minibatches (PPO's inner epoch). Each
    minibatch is split over ranks and micro-batches (at most `micro_batch_size` rows and
    `micro_batch_tokens` padded tokens, engine.*); the loss is normalized by its global counts, so
    the update does not depend on how it is split (tests/training/test_engines.py).
    `auxiliary`: rows of a second loss (hindsight examples), dealt over the minibatches in turn and
    trained in the same optimizer steps."""
    engine.train()
    order = torch.randperm(len(samples), generator=generator).tolist()
    chunks = [order[i::minibatches] for i in range(minibatches) if order[i::minibatches]]
    sums: dict[str, float] = {}
    for c, chunk in enumerate(chunks):
        mine = shard([samples[i] for i in chunk], engine.rank, engine.world_size)
        extra = (
            replace(auxiliary, rows=shard(auxiliary.rows[c :: len(chunks)], engine.rank, engine.world_size))
            if auxiliary is not None
            else None
        )
        metrics = accumulate_step(
            engine,
            mine,
            loss_fn,
            _counts,
            micro_batch_size=micro_batch_size,
            max_tokens=micro_batch_tokens,
            shape=_sample_shape,
            summed=SUMMED_METRICS,
            auxiliary=extra,
        )
        for key, value in metrics.items():
            name = key if "/" in key else f"{prefix}/{key}"  # the engine's grad_norm / lr
            sums[name] = sums.get(name, 0.0) + value / len(chunks)
    engine.eval()
    return sums


# --------------------------------------------------------------------------- the round
def build_engines(
    policy,
    reference,
    algo: Algorithm,
    rl: RLConfig,
    engine_cfg: EngineConfig,
    *,
    device: torch.device | str | None,
    gradient_checkpointing: bool,
) -> dict[str, TrainEngine]:
    """The policy's engine on `device` (None: where the policy is), the critic's (PPO) on
    rl.critic_device, and the frozen reference moved to rl.reference_device; both default to where
    the policy trains."""
    engines = {
        "policy": build_engine(
            policy,
            engine_cfg,
            lr=rl.learning_rate,
            betas=(0.9, 0.99),
            grad_clip=rl.grad_clip,
            device=device,
            gradient_checkpointing=gradient_checkpointing,
        )
    }
    trains_on = engines["policy"].device
    if reference is not None:
        reference.to(resolve_device(rl.reference_device or trains_on))
    if algo.critic:
        critic_device = resolve_device(rl.critic_device or trains_on)
        engines["critic"] = build_engine(
            critic_from_policy(policy, device=critic_device),
            engine_cfg,
            lr=rl.ppo.critic_learning_rate,
            betas=(0.9, 0.99),
            grad_clip=rl.grad_clip,
            device=critic_device,
            gradient_checkpointing=gradient_checkpointing,
        )
    return engines


def train_round(
    policy,
    reference,
    tokenizer,
    tasks: list[dict],
    tools: dict[str, Tool],
    *,
    rl: RLConfig,
    rollout: RolloutConfig,
    cascade: Cascade,
    round_index: int,
    policy_version: str,
    seed: int,
    engine_cfg: EngineConfig = EngineConfig(),
    state_dir: Path | None = None,
    on_step: Callable[[int, dict[str, float]], None] | None = None,
    task_weights: Mapping[str, float] | None = None,
    device: torch.device | str | None = None,
    gradient_checkpointing: bool = False,
    teacher=None,
    hindsight_examples: list[dict] | None = None,
) -> RoundResult:
    """`task_weights`: the curriculum's sampling weight per task id (training/rl/curriculum.py); None = uniform.
    `reference` may be None when the algorithm's kl_coef is 0. `state_dir`: where resumable state
    checkpoints go every `rl.checkpoint_every` steps (None: no checkpoints). `device`: the config's
    `device`, where the policy trains (None: where it is); the reference and the critic go to
    rl.reference_device / rl.critic_device, by default the policy's. `gradient_checkpointing`:
    `model.gradient_checkpointing`, for the policy and the critic. `hindsight_examples`: the previous
    round's corrected examples (training/rl/hindsight.py), when `rl.hindsight` is on.

    Under torchrun (several ranks) the round is data-parallel (training/data_parallel.py): each
    rank rolls out whole groups of the step's prompts, every rank sees the global batch, and the
    update is sharded over ranks by the training engine. `result.policy` is the trained model with
    whole weights (under ZeRO-3, the sampler's copy: see below)."""
    algo = resolve_algorithm(rl)
    if rl.distill.enabled and teacher is None:
        raise ValueError("rl.distill.enabled but no teacher model was given (rl.distill.teacher)")
    if algo.needs_reference and reference is None:
        raise ValueError(
            f"rl.algorithm={rl.algorithm!r} has kl_coef={algo.kl_coef} > 0 but no reference model was given"
        )
    zero3 = engine_cfg.kind == "deepspeed" and engine_cfg.zero_stage == 3
    ahead_of_update = rl.one_step_off_policy
    if ahead_of_update and (zero3 or DataParallel.current().world_size > 1 or algo.dynamic_sampling):
        raise ValueError(
            "rl.one_step_off_policy runs in one process, without ZeRO-3 and without dynamic sampling "
            f"(here: world size {DataParallel.current().world_size}, zero_stage {engine_cfg.zero_stage}, "
            f"algorithm {rl.algorithm!r})"
        )
    if zero3 and algo.critic:
        raise ValueError(
            f"rl.algorithm={rl.algorithm!r} trains a critic, whose value pass needs whole weights: use engine.zero_stage 0-2 "
            "(ZeRO-3 partitions them)"
        )
    pad_id = tokenizer.eos_token_id
    # ZeRO-3 partitions the trainer's weights across ranks, so rollouts and the log-prob passes run
    # on a whole copy, given the new weights after every update (as a vLLM engine is).
    sampler = copy.deepcopy(policy) if zero3 else None
    engines = build_engines(
        policy, reference, algo, rl, engine_cfg, device=device, gradient_checkpointing=gradient_checkpointing
    )
    if teacher is not None:  # frozen, beside the reference
        teacher.requires_grad_(False).eval().to(resolve_device(rl.reference_device or engines["policy"].device))
    if sampler is not None:
        sampler.to(engines["policy"].device).requires_grad_(False).eval()
    # samples rollouts; the engine's module computes gradients
    model = sampler if sampler is not None else engines["policy"].model
    dp = DataParallel.current()
    rng, generator = random.Random(seed), torch.Generator().manual_seed(seed)
    by_id = {t["task_id"]: t for t in tasks}
    state_key = fingerprint(
        rl=rl.model_dump(),
        rollout=rollout.model_dump(),
        round=round_index,
        seed=seed,
        version=policy_version,
        tasks=len(tasks),
        engine=engine_cfg.model_dump(),
    )
    result, first_step = RoundResult(), 1
    resumed = load_state(state_dir, state_key)
    if resumed:
        folder, loop = resumed
        for name, engine in engines.items():
            engine.load_state(folder / name)
        rng.setstate(loop["python_rng"])
        generator.set_state(loop["generator"])
        torch.set_rng_state(loop["torch_rng"])
        result, first_step = loop["result"], loop["step"] + 1
        result.resumed_from_step = loop["step"]
        journal = loop["journal"]
        for entry in journal:
            result.rollouts += entry["rollouts"]
            result.rewards += entry["rewards"]
            result.history.append(entry["history"])
    else:
        journal = []  # per step: its rollouts, rewards and history entry (the resume state's journal)
    # Hindsight relabels: the previous round's, then each step's, newest last. A pure function of
    # the rollouts, so a resumed round rebuilds it from the journal instead of saving it.
    hindsight = rl.hindsight
    relabels: deque[dict] = deque(hindsight_examples or [], maxlen=hindsight.buffer)
    if hindsight.enabled:
        for entry in journal:
            relabels.extend(relabel_all(entry["rollouts"], entry["rewards"], by_id, tokenizer))

    def sample(n_prompts: int, step: int, tag: str) -> tuple[list[dict], list[dict]]:
        return generate(sample_prompts(tasks, task_weights or {}, n_prompts, rng), step, tag)

    def generate(prompts: list[dict], step: int, tag: str) -> tuple[list[dict], list[dict]]:
        """The step's prompts are drawn alike on every rank; each rolls out and scores its share of
        whole groups; every rank gets the global batch back, in prompt order."""
        mine = dp.mine(prompts)

        def to_record(episode) -> dict:
            return episode_record(
                episode, round_index=round_index, step=step, policy_version=policy_version, tokenizer=tokenizer
            )

        records, scores = [], []
        if mine:
            # finished episodes are verified while the rest generate, if the profile says so
            with Verifying(to_record, by_id, tokenizer, cascade, background=rollout.verify_during_rollout) as verifying:
                episodes = run_episodes(
                    rollout_engine,
                    tokenizer,
                    mine,
                    group_size=rl.group_size,
                    tools=tools,
                    cfg=rollout,
                    group_prefix=f"r{round_index}-s{tag}-",
                    sampling_key=f"seed={seed}/round={round_index}/step={tag}",
                    on_finished=verifying,
                )
                records, scores = verifying.results(episodes)
        groups = dp.gather(
            [
                (records[i : i + rl.group_size], scores[i : i + rl.group_size])
                for i in range(0, len(records), rl.group_size)
            ]
        )
        return [r for rs, _ in groups for r in rs], [s for _, ss in groups for s in ss]

    def generate_ahead(prompts: list[dict], step: int) -> tuple[list[dict], list[dict], tuple]:
        """The next step's batch, on the background thread, with its verifier statistics taken
        there (the main thread takes none while it runs)."""
        records, scores = generate(prompts, step, str(step))
        return records, scores, cascade.take_stats()

    # One step off-policy: the rollout engine serves a copy of the weights, which step t+1's
    # generation reads (on a background thread) while step t's update changes the trainer's; the
    # copy takes the new weights once that generation is collected. Made after a resume, so it
    # starts from the restored weights.
    trainer_view = model  # whose log-probs are the "old" ones in prepare_samples
    if ahead_of_update:
        model = copy.deepcopy(engines["policy"].model).requires_grad_(False).eval()
    # The rollout engine serves the policy's current weights: HF shares its tensors, vLLM gets
    # them pushed after every update (sync_weights), without a restart.
    rollout_engine = build_rollout_engine(rollout, model, tokenizer, seed=seed)
    background = ThreadPoolExecutor(1, thread_name_prefix="rollout-ahead") if ahead_of_update else None
    ahead: Future | None = None  # the next step's (records, scores), generating
    try:
        for step in range(first_step, rl.steps_per_round + 1):
            start = time.perf_counter()
            # 1-2. generate and verify; DAPO refills until enough groups have reward spread
            lag, taken = 0.0, None
            if ahead is not None:  # generated during the previous update, by the weights before it
                records, scores, taken = ahead.result()
                ahead, lag = None, 1.0
            else:
                records, scores = sample(rl.prompts_per_step, step, str(step))
            passes = 1
            while (
                algo.dynamic_sampling
                and passes < rl.max_sampling_rounds
                and _spread_groups(records, scores, algo.group_filter) < rl.prompts_per_step
            ):
                passes += 1
                more_records, more_scores = sample(rl.prompts_per_step, step, f"{step}.{passes}")
                records, scores = records + more_records, scores + more_scores
            step_stats, disagreements = _global_stats(dp, taken or cascade.take_stats())
            merge_stats(result.tier_stats, step_stats)
            result.disagreements += disagreements
            if ahead_of_update:  # the copy takes the trainer's weights, then generates the next step's batch
                sync_start = time.perf_counter()
                model.load_state_dict(engines["policy"].model_state_dict())
                rollout_engine.sync_weights(model)
                sync_s = time.perf_counter() - sync_start
                # the resume state keeps the generator of prompts as it was before the next step's draw
                rng_before_draw = rng.getstate()
                if step < rl.steps_per_round:
                    ahead = background.submit(
                        generate_ahead, sample_prompts(tasks, task_weights or {}, rl.prompts_per_step, rng), step + 1
                    )
            generate_s = time.perf_counter() - start
            train_records, train_scores = (
                _first_spread_groups(records, scores, rl.prompts_per_step, algo.group_filter)
                if algo.dynamic_sampling
                else (records, scores)
            )
            # 3. reference log-probs, values, advantages
            critic = engines["critic"].model if algo.critic else None
            samples, prep_metrics = (
                prepare_samples(
                    train_records,
                    train_scores,
                    algo,
                    policy=trainer_view,
                    reference=reference,
                    critic=critic,
                    temperature=rollout.temperature,
                    pad_id=pad_id,
                    micro_batch_tokens=engine_cfg.micro_batch_tokens,
                    chunk_tokens=engine_cfg.logit_chunk_tokens,
                    dp=dp,
                    process=cascade.cfg.process,
                    distill=rl.distill,
                    teacher=teacher,
                )
                if train_records
                else ([], {})
            )
            if not train_records:  # nothing to train on; the engine gap is still measured
                prep_metrics = trainer_gap(
                    trainer_view,
                    records,
                    temperature=rollout.temperature,
                    pad_id=pad_id,
                    max_tokens=engine_cfg.micro_batch_tokens,
                    chunk_tokens=engine_cfg.logit_chunk_tokens,
                    dp=dp,
                )[1]
            # one number per trajectory for `verified_rewards` (PPO's are per token: their mean over policy tokens)
            advantage_of = {
                s.record["trajectory_id"]: masked_mean(
                    torch.as_tensor(s.advantages), torch.tensor(s.record["tool_mask"])
                ).item()
                for s in samples
            }
            for score in scores:
                score["advantage"] = advantage_of.get(score["trajectory_id"], 0.0)
            # 4. update: the critic first (PPO), then the policy unless the critic is still warming up
            update: dict[str, float] = {}
            if samples and algo.critic:
                update |= run_update(
                    engines["critic"],
                    samples,
                    critic_loss_fn(engines["critic"], rl.ppo.value_clip, pad_id),
                    minibatches=algo.minibatches,
                    micro_batch_size=engine_cfg.micro_batch_size,
                    micro_batch_tokens=engine_cfg.micro_batch_tokens,
                    generator=generator,
                    prefix="critic",
                )
            # the newest corrected examples from earlier steps and the previous round, in the same update
            auxiliary = None
            if hindsight.enabled and relabels:
                rows = [
                    Sample(record=r, advantages=[], old_logprobs=None) for r in list(relabels)[-hindsight.per_step :]
                ]
                auxiliary = Auxiliary(
                    rows,
                    hindsight_loss_fn(engines["policy"], hindsight.coef, pad_id, engine_cfg.logit_chunk_tokens),
                    _counts,
                    HINDSIGHT_METRICS,
                )
            if samples and step > (rl.ppo.critic_warmup_steps if algo.critic else 0):
                on_policy: dict[str, float] = {}
                update |= run_update(
                    engines["policy"],
                    samples,
                    policy_loss_fn(
                        engines["policy"],
                        algo,
                        temperature=rollout.temperature,
                        pad_id=pad_id,
                        loss_norm_tokens=rollout.max_total_tokens,
                        stats=on_policy,
                        chunk_tokens=engine_cfg.logit_chunk_tokens,
                    ),
                    minibatches=algo.minibatches,
                    micro_batch_size=engine_cfg.micro_batch_size,
                    micro_batch_tokens=engine_cfg.micro_batch_tokens,
                    generator=generator,
                    prefix="actor",
                    auxiliary=auxiliary,
                )
                if auxiliary is not None:  # only a step whose update ran trains its relabels
                    update["hindsight/trained"] = float(len(auxiliary.rows))
                prep_metrics |= on_policy_metrics(on_policy, dp)
                if sampler is not None:  # gathered from the ZeRO-3 shards (a collective), into the whole copy
                    sampler.load_state_dict(engines["policy"].model_state_dict())
                if not ahead_of_update:
                    update["perf/weight_sync_s"] = rollout_engine.sync_weights(model)
            failpoint("rl.update")
            if hindsight.enabled:  # this step's failures that showed the answer, for the next steps
                relabeled = relabel_all(records, scores, by_id, tokenizer)
                relabels.extend(relabeled)
                update["hindsight/relabeled"] = float(len(relabeled))
                update["hindsight/buffer"] = float(len(relabels))
            # 5. log, checkpoint
            metrics = {
                **rollout_metrics(records, scores),
                **tier_metrics(step_stats, disagreements),
                **prep_metrics,
                **update,
                "rollout/sampling_passes": float(passes),
                "rollout/trained_trajectories": float(len(samples)),
                "perf/generate_s": generate_s,
            }
            if ahead_of_update:
                # rollout/policy_lag: updates between the weights that sampled this batch and the
                # trainer's (1 when it was generated ahead); perf/generate_s is then the wait for it
                metrics |= {"rollout/policy_lag": lag, "perf/weight_sync_s": sync_s}
            entry = {"step": step, **metrics}
            result.rollouts += records
            result.rewards += scores
            result.history.append(entry)
            journal.append({"rollouts": records, "rewards": scores, "history": entry})
            if state_dir is not None and step % rl.checkpoint_every == 0 and step < rl.steps_per_round:
                save_start = time.perf_counter()
                # The progress saved is the round's fixed-size part; what grows is in the journal.
                progress = replace(result, rollouts=[], rewards=[], history=[], policy=None)
                saved_rng = rng
                if ahead_of_update:  # as before the next step's draw: a resumed round draws those prompts again
                    saved_rng = random.Random()
                    saved_rng.setstate(rng_before_draw)
                save_state(state_dir, step, state_key, engines, saved_rng, generator, progress, dp, journal=journal)
                metrics["perf/save_s"] = time.perf_counter() - save_start
            # The step's time includes its save; the journal's copy of a saving step's entry, which a
            # resumed round reads back, was written before the save ended and so lacks both.
            metrics["perf/step_s"] = time.perf_counter() - start
            entry.update(metrics)
            if on_step:
                on_step(step, metrics)
    finally:
        if background is not None:  # a generation in flight ends before its engine closes
            if ahead is not None:
                ahead.cancel()
            background.shutdown(wait=True)
        rollout_engine.close()
    result.policy = trainer_view  # the trained weights (the off-policy copy is one update behind)
    return result


def _global_stats(dp: DataParallel, local: tuple[dict[str, TierStats], int]) -> tuple[dict[str, TierStats], int]:
    """The step's verifier statistics over every rank's share of the batch."""
    merged: dict[str, TierStats] = {}
    total = 0
    for stats, disagreements in dp.gather_objects(local):
        merge_stats(merged, stats)
        total += disagreements
    return merged, total


def _spread_groups(records: list[dict], scores: list[dict], by: str = "reward") -> int:
    keep = informative_groups(filter_values(scores, by), [r["group_id"] for r in records])
    return len({r["group_id"] for r, k in zip(records, keep.tolist()) if k})


def _first_spread_groups(
    records: list[dict], scores: list[dict], n_groups: int, by: str = "reward"
) -> tuple[list[dict], list[dict]]:
    """DAPO's filtered batch: the first `n_groups` groups with spread in `by` (all of them if fewer)."""
    keep = informative_groups(filter_values(scores, by), [r["group_id"] for r in records])
    chosen = list(dict.fromkeys(r["group_id"] for r, k in zip(records, keep.tolist()) if k))[:n_groups]
    wanted = set(chosen)
    pairs = [(r, s) for r, s in zip(records, scores) if r["group_id"] in wanted]
    return [r for r, _ in pairs], [s for _, s in pairs]
