"""Supervised fine-tuning on expert tool-use trajectories; loss only on the policy's own tokens."""

from __future__ import annotations

import hashlib
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from configs.failpoints import failpoint
from configs.schema import EngineConfig, SFTConfig
from training.data_parallel import DataParallel
from training.engines import accumulate_step, build_engine, model_device, shard
from training.rl.math import agg_loss
from training.sequences import collate, completion_logprobs, to_device
from training.state import fingerprint, load_state, save_state


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


def sft_loss(
    model,
    examples: list[Example],
    pad_id: int,
    num_tokens: float | torch.Tensor | None = None,
    *,
    chunk_tokens: int | None = None,
) -> tuple[torch.Tensor, int]:
    """Negative log-likelihood over policy tokens (tool output and padding masked), divided by
    `num_tokens` (the whole batch's count when this is one micro-batch of it; default: this one's).
    The batch goes to the model's device; `chunk_tokens`: engine.logit_chunk_tokens."""
    batch = to_device(
        collate(
            [e.prompt_ids for e in examples],
            [e.completion_ids for e in examples],
            [e.tool_mask for e in examples],
            pad_id,
        ),
        model_device(model),
    )
    logprobs = completion_logprobs(model, batch, chunk_tokens=chunk_tokens)
    return agg_loss(-logprobs, batch.loss_mask, "token_mean", num_tokens=num_tokens), int(batch.loss_mask.sum())


def _policy_tokens(examples: list[Example]) -> torch.Tensor:
    return torch.tensor([float(sum(sum(e.tool_mask) for e in examples))])


def _shape(example: Example) -> tuple[int, int]:
    return len(example.prompt_ids), len(example.completion_ids)


def digest(what) -> str:
    """sha256 of examples' ids, or of a model's weights."""
    h = hashlib.sha256()
    if isinstance(what, torch.nn.Module):
        for name, tensor in what.state_dict().items():
            h.update(name.encode())
            h.update(tensor.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    else:
        for e in what:
            # ids may be numpy ints (parquet)
            h.update(json.dumps([e.prompt_ids, e.completion_ids, e.tool_mask], default=int).encode())
    return h.hexdigest()


def train_sft(
    model,
    examples: list[Example],
    cfg: SFTConfig,
    *,
    pad_id: int,
    seed: int,
    engine_cfg: EngineConfig = EngineConfig(),
    on_log: Callable[[int, dict[str, float]], None] | None = None,
    state_dir: Path | None = None,
    device: torch.device | str | None = None,
    gradient_checkpointing: bool = False,
) -> list[dict[str, float]]:
    """Returns the logged history; `on_log(step, metrics)` reports progress as it goes. Gradients go
    through a `training.engines` engine (plain torch or DeepSpeed, micro-batched if configured);
    only trainable parameters (all of them, or the LoRA adapters) are optimized. `state_dir`: where
    resumable state goes every `cfg.checkpoint_every` steps; a run killed after one continues from
    it, bit for bit (None: no state). `device`: the config's `device`, where the model trains (None:
    where it is); `gradient_checkpointing`: `model.gradient_checkpointing`."""
    if not examples:
        raise ValueError("no SFT examples")
    engine = build_engine(
        model,
        engine_cfg,
        lr=cfg.learning_rate,
        betas=(0.9, 0.95),
        weight_decay=cfg.weight_decay,
        grad_clip=cfg.grad_clip,
        lr_lambda=lambda s: warmup_cosine(s, cfg.warmup_steps, cfg.steps),
        device=device,
        gradient_checkpointing=gradient_checkpointing,
    )
    engine.train()
    generator = torch.Generator().manual_seed(seed)
    history: list[dict[str, float]] = []
    start, tokens_seen, first_step = time.perf_counter(), 0, 1
    # the same config, data and starting weights: state of another SFT in the same home is never resumed
    state_key = (
        fingerprint(
            sft=cfg.model_dump(),
            seed=seed,
            engine=engine_cfg.model_dump(),
            pad_id=pad_id,
            data=digest(examples),
            init=digest(model),
        )
        if state_dir
        else ""
    )
    resumed = load_state(state_dir, state_key)
    if resumed:
        folder, loop = resumed
        engine.load_state(folder / "policy")
        generator.set_state(loop["generator"])
        torch.set_rng_state(loop["torch_rng"])
        history = loop["journal"]  # tokens/s counts from the resume on: `start` is now
        first_step = loop["step"] + 1

    def loss_fn(chunk: list[Example], counts: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
        loss, n = sft_loss(
            engine.module, chunk, pad_id, num_tokens=counts[0], chunk_tokens=engine_cfg.logit_chunk_tokens
        )
        return loss, {"policy_tokens_per_row": n / len(chunk)}  # the engine averages metrics over rows

    for step in range(first_step, cfg.steps + 1):
        # 1. sample a batch of trajectories (every rank draws the same batch, then takes its shard)
        index = torch.randint(len(examples), (cfg.batch_size,), generator=generator).tolist()
        rows = shard([examples[i] for i in index], engine.rank, engine.world_size)
        # 2-3. loss on policy tokens only, one optimizer step
        metrics = accumulate_step(
            engine,
            rows,
            loss_fn,
            _policy_tokens,
            micro_batch_size=engine_cfg.micro_batch_size,
            max_tokens=engine_cfg.micro_batch_tokens,
            shape=_shape,
        )
        tokens_seen += int(metrics["policy_tokens_per_row"] * cfg.batch_size)
        if step % cfg.log_every == 0 or step == cfg.steps:
            elapsed = time.perf_counter() - start
            metrics = {
                "loss/sft": metrics["loss"],
                "perf/grad_norm": metrics["grad_norm"],
                "perf/lr": metrics["lr"],
                "perf/policy_tokens_per_s": tokens_seen / elapsed,
            }
            history.append({"step": step, **metrics})
            if on_log:
                on_log(step, metrics)
        if state_dir is not None and step % cfg.checkpoint_every == 0 and step < cfg.steps:
            save_state(
                state_dir,
                step,
                state_key,
                {"policy": engine},
                None,
                generator,
                None,
                DataParallel(engine.rank, engine.world_size),
                journal=history,
            )
        failpoint("sft.step")
    engine.eval()
    engine.finish()  # ZeRO-3: `model` holds whole weights again, for the caller to save
    return history
