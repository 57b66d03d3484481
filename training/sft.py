"""Supervised fine-tuning on expert tool-use trajectories; loss only on the policy's own tokens."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Callable

import torch

from configs.schema import SFTConfig
from training.rl_math import agg_loss, token_logprobs
from training.sequences import collate, completion_logits


@dataclass(frozen=True)
class Example:
    prompt_ids: list[int]
    completion_ids: list[int]
    tool_mask: list[int]


def warmup_cosine(step: int, warmup: int, total: int) -> float:
    """LR multiplier: linear warm-up, then cosine to 10% (nanoGPT's schedule)."""
    if step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))


def make_optimizer(model, lr: float, weight_decay: float) -> torch.optim.Optimizer:
    return torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=weight_decay)


def sft_loss(model, examples: list[Example], pad_id: int) -> tuple[torch.Tensor, int]:
    """Mean negative log-likelihood over policy tokens (tool output and padding masked)."""
    batch = collate([e.prompt_ids for e in examples], [e.completion_ids for e in examples], [e.tool_mask for e in examples], pad_id)
    logprobs = token_logprobs(completion_logits(model, batch), batch.completion_ids)
    return agg_loss(-logprobs, batch.loss_mask, "token_mean"), int(batch.loss_mask.sum())


def train_sft(
    model,
    examples: list[Example],
    cfg: SFTConfig,
    *,
    pad_id: int,
    seed: int,
    on_log: Callable[[int, dict[str, float]], None] | None = None,
) -> list[dict[str, float]]:
    """Returns the logged history; `on_log(step, metrics)` reports progress as it goes."""
    if not examples:
        raise ValueError("no SFT examples")
    model.train()
    optimizer = make_optimizer(model, cfg.learning_rate, cfg.weight_decay)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: warmup_cosine(s, cfg.warmup_steps, cfg.steps))
    generator = torch.Generator().manual_seed(seed)
    history: list[dict[str, float]] = []
    start, tokens_seen = time.perf_counter(), 0
    for step in range(1, cfg.steps + 1):
        # 1. sample a batch of trajectories
        index = torch.randint(len(examples), (cfg.batch_size,), generator=generator).tolist()
        # 2. loss on policy tokens only
        loss, num_tokens = sft_loss(model, [examples[i] for i in index], pad_id)
        # 3. update
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        optimizer.step()
        schedule.step()
        tokens_seen += num_tokens
        if step % cfg.log_every == 0 or step == cfg.steps:
            elapsed = time.perf_counter() - start
            metrics = {
                "loss/sft": float(loss.detach()),
                "perf/grad_norm": float(grad_norm),
                "perf/lr": schedule.get_last_lr()[0],
                "perf/policy_tokens_per_s": tokens_seen / elapsed,
            }
            history.append({"step": step, **metrics})
            if on_log:
                on_log(step, metrics)
    model.eval()
    return history
