"""One RL round: several on-policy GRPO steps with the engines loaded once.

Each step reads top to bottom: 1. generate, 2. verify, 3. advantages, 4. update, 5. log.
The math lives in `training.rl_math`; this file only wires it together.
"""

from __future__ import annotations

import random
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import torch

from configs.schema import RLConfig, RolloutConfig
from environments.tools import Tool
from training.curriculum import sample_prompts
from training.rl_math import (
    agg_loss, entropy_from_logits, get_advantage_estimator, get_policy_loss, group_stats, kl_penalty, masked_mean, token_logprobs,
)
from training.rollout import run_episodes
from training.scoring import episode_record, score_records
from training.sequences import collate, completion_logits
from verifiers.cascade import Cascade, TierStats, merge_stats, tier_metrics


@dataclass
class RoundResult:
    rollouts: list[dict] = field(default_factory=list)
    rewards: list[dict] = field(default_factory=list)
    history: list[dict] = field(default_factory=list)
    tier_stats: dict[str, TierStats] = field(default_factory=dict)  # the whole round's verification
    disagreements: int = 0


def _padded(rows: list[list[float]], width: int) -> torch.Tensor:
    out = torch.zeros((len(rows), width))
    for i, row in enumerate(rows):
        out[i, : len(row)] = torch.tensor(row)
    return out


def compute_advantages(rewards: list[float], group_ids: list[str], estimator: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-trajectory advantages and a keep-mask that drops zero-variance groups (all samples
    scored the same: no learning signal, only noise in the batch — DAPO's dynamic sampling)."""
    index = {g: i for i, g in enumerate(dict.fromkeys(group_ids))}
    gids = torch.tensor([index[g] for g in group_ids])
    r = torch.tensor(rewards, dtype=torch.float32)
    advantages = get_advantage_estimator(estimator)(r, gids)
    _, std = group_stats(r, gids)
    return advantages, std > 1e-6


def policy_update(policy, reference, optimizer, records: list[dict], advantages: torch.Tensor, cfg: RLConfig, *, temperature: float, pad_id: int,
                  generator: torch.Generator, max_tokens: int) -> dict[str, float]:
    """PPO-style update over `cfg.minibatches` shuffled minibatches, one optimizer step each.
    `max_tokens` is the constant Dr.GRPO's `seq_mean_token_sum_norm` divides by."""
    policy.train()
    order = torch.randperm(len(records), generator=generator).tolist()
    chunks = [order[i :: cfg.minibatches] for i in range(cfg.minibatches) if order[i :: cfg.minibatches]]
    sums: dict[str, float] = {}
    for chunk in chunks:
        rows = [records[i] for i in chunk]
        batch = collate([r["prompt_ids"] for r in rows], [r["completion_ids"] for r in rows], [r["tool_mask"] for r in rows], pad_id)
        width = batch.completion_ids.shape[1]
        logits = completion_logits(policy, batch)
        logprobs = token_logprobs(logits, batch.completion_ids, temperature)
        old_logprobs = _padded([r["logprobs"] for r in rows], width)
        token_adv = advantages[chunk][:, None].expand(-1, width)
        mask = batch.loss_mask
        pg_loss, pg_metrics = get_policy_loss(cfg.policy_loss)(
            logprobs, old_logprobs, token_adv, mask, clip_low=cfg.clip_low, clip_high=cfg.clip_high, agg_mode=cfg.loss_agg_mode,
            max_tokens=max_tokens,
        )
        kl = torch.zeros(())
        if cfg.kl_coef > 0:  # K3 to the frozen SFT reference, policy tokens only
            with torch.no_grad():
                ref_logprobs = token_logprobs(completion_logits(reference, batch), batch.completion_ids, temperature)
            kl = agg_loss(kl_penalty(logprobs, ref_logprobs, cfg.kl_estimator), mask, cfg.loss_agg_mode, max_tokens=max_tokens)
        loss = pg_loss + cfg.kl_coef * kl
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(policy.parameters(), cfg.grad_clip)
        optimizer.step()
        with torch.no_grad():
            entropy = masked_mean(entropy_from_logits(logits, temperature), mask)
        step_metrics = {"loss/policy": pg_loss.item(), "loss/kl": kl.item(), "actor/entropy": float(entropy), "actor/grad_norm": float(grad_norm),
                        "actor/clip_frac": pg_metrics["clip_frac"], "actor/approx_kl": pg_metrics["approx_kl"]}
        for key, value in step_metrics.items():
            sums[key] = sums.get(key, 0.0) + value / len(chunks)
    policy.eval()
    return sums


def repeat_rate(records: list[dict]) -> float:
    """Fraction of trajectories identical (same completion ids) to another one of their group: the
    Echo Trap (RAGEN) shows up as groups collapsing onto one trajectory before reward falls."""
    by_group: dict[str, Counter] = {}
    for r in records:
        by_group.setdefault(r["group_id"], Counter())[tuple(r["completion_ids"])] += 1
    repeated = sum(count for group in by_group.values() for count in group.values() if count > 1)
    return repeated / len(records) if records else 0.0


def rollout_metrics(records: list[dict], scores: list[dict]) -> dict[str, float]:
    n = len(records)
    rewards = torch.tensor([s["reward"] for s in scores])
    outcome = torch.tensor([s["outcome"] or 0.0 for s in scores])
    policy_tokens = [sum(r["tool_mask"]) for r in records]
    components = {f"reward/{k[len('reward_'):]}/contribution": sum(s[k] for s in scores) / n for k in scores[0] if k.startswith("reward_")}
    return {
        **components,
        "reward/total/mean": float(rewards.mean()),
        "reward/total/std": float(rewards.std()) if n > 1 else 0.0,
        "reward/outcome/pass_rate": float(outcome.mean()),
        "reward/well_formed/mean": sum(s["well_formed"] for s in scores) / n,
        "reward/unscorable": float(sum(s["outcome"] is None for s in scores)),
        "rollout/tool_call_rate": sum(r["num_tool_calls"] > 0 for r in records) / n,
        "rollout/tool_calls_per_episode": sum(r["num_tool_calls"] for r in records) / n,
        "rollout/turns": sum(r["turns"] for r in records) / n,
        "rollout/completion_len": sum(len(r["completion_ids"]) for r in records) / n,
        "rollout/policy_tokens": sum(policy_tokens) / n,
        "rollout/repeat_rate": repeat_rate(records),
    }


def train_round(
    policy, reference, tokenizer, tasks: list[dict], tools: dict[str, Tool], *,
    rl: RLConfig, rollout: RolloutConfig, cascade: Cascade, round_index: int, policy_version: str, seed: int,
    on_step: Callable[[int, dict[str, float]], None] | None = None, task_weights: Mapping[str, float] | None = None,
) -> RoundResult:
    """`task_weights`: the curriculum's sampling weight per task id (training/curriculum.py); None = uniform."""
    optimizer = torch.optim.AdamW(policy.parameters(), lr=rl.learning_rate, betas=(0.9, 0.99), weight_decay=0.0)
    rng, generator = random.Random(seed), torch.Generator().manual_seed(seed)
    by_id = {t["task_id"]: t for t in tasks}
    result = RoundResult()
    for step in range(1, rl.steps_per_round + 1):
        start = time.perf_counter()
        # 1. generate: G episodes per prompt, multi-turn with the tool
        prompts = sample_prompts(tasks, task_weights or {}, rl.prompts_per_step, rng)
        episodes = run_episodes(policy, tokenizer, prompts, group_size=rl.group_size, tools=tools, cfg=rollout,
                                generator=generator, group_prefix=f"r{round_index}-s{step}-")
        records = [episode_record(e, round_index=round_index, step=step, policy_version=policy_version, tokenizer=tokenizer) for e in episodes]
        generate_s = time.perf_counter() - start
        # 2. verify
        scores = score_records(records, by_id, tokenizer, cascade)
        step_stats, disagreements = cascade.take_stats()
        merge_stats(result.tier_stats, step_stats)
        result.disagreements += disagreements
        # 3. advantages (group-normalized), dropping groups with no signal or an unscorable task
        advantages, keep = compute_advantages([s["reward"] for s in scores], [r["group_id"] for r in records], rl.advantage_estimator)
        keep &= torch.tensor([s["outcome"] is not None for s in scores])
        for score, adv in zip(scores, advantages.tolist()):
            score["advantage"] = adv
        # 4. update on the informative groups
        kept = keep.nonzero().flatten().tolist() if rl.drop_zero_variance_groups else list(range(len(records)))
        update = policy_update(policy, reference, optimizer, [records[i] for i in kept], advantages[kept], rl,
                               temperature=rollout.temperature, pad_id=tokenizer.eos_token_id, generator=generator,
                               max_tokens=rollout.max_total_tokens) if kept else {}
        # 5. log
        metrics = {**rollout_metrics(records, scores), **tier_metrics(step_stats, disagreements), **update, "rollout/zero_variance_frac": 1.0 - float(keep.float().mean()),
                   "perf/generate_s": generate_s, "perf/step_s": time.perf_counter() - start}
        result.rollouts += records
        result.rewards += scores
        result.history.append({"step": step, **metrics})
        if on_step:
            on_step(step, metrics)
    return result
