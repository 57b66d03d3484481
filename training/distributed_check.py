"""Train a tiny model on a fixed batch with any engine and any number of ranks, for comparison.

    torchrun --nproc_per_node 2 -m training.distributed_check --engine deepspeed --zero-stage 2
             --micro-batch-size 2 --steps 3 --out result.json      (one command)
    python -m training.distributed_check --engine torch --steps 3 --out reference.json

Every run takes the same S optimizer steps on the same global batch (a seeded tiny Qwen2 and 8
seeded trajectories with tool spans), each step over the whole batch sharded across ranks and
cut into micro-batches, with the real project loss (collate -> completion_logprobs, chunked
by --logit-chunk-tokens -> agg_loss normalized by global counts). So, up to float rounding, the final
weights must not depend on the engine, the ZeRO stage, the micro-batch size or the world size.
Rank 0 writes a JSON summary to --out and the final weights next to it (same name, .pt).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Callable

import torch
from torch import Tensor

from configs.schema import EngineConfig, ModelConfig
from training.data_parallel import leave_together
from training.engines import CountFn, LossFn, TrainEngine, accumulate_step, build_engine, model_device, shard
from training.model import build_model
from training.rl.math import agg_loss, agg_normalizers, ppo_clip_loss
from training.sequences import collate, completion_logprobs, to_device

VOCAB_SIZE = 64
PAD_ID = 0
LR = 1e-2
DTYPES = {"float32": torch.float32, "float64": torch.float64}
TINY_MODEL = ModelConfig(
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=64,
)


def tiny_model(seed: int = 0, dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    # float64 (torch engine only: DeepSpeed refuses it) removes rounding noise, so invariance
    # checks can be tight; see tests/training/test_engines.py.
    return build_model(TINY_MODEL, vocab_size=VOCAB_SIZE, eos_token_id=PAD_ID, seed=seed).to(dtype)


def synthetic_batch(num_rows: int = 8, seed: int = 0) -> list[dict]:
    """Trajectories of different lengths (so micro-batches pad differently), each with a tool
    span masked out of the loss in every other row, and a fixed advantage in [-1, 1]."""
    g = torch.Generator().manual_seed(seed)

    def ids(n: int) -> list[int]:
        return torch.randint(1, VOCAB_SIZE, (n,), generator=g).tolist()

    rows = []
    for i in range(num_rows):
        prompt_len, completion_len = (int(torch.randint(lo, hi, (1,), generator=g)) for lo, hi in ((2, 7), (4, 12)))
        tool_mask = [1] * completion_len
        if i % 2:  # a tool observation in the middle of the completion
            start = int(torch.randint(1, completion_len - 2, (1,), generator=g))
            tool_mask[start : start + 2] = [0, 0]
        rows.append(
            {
                "prompt_ids": ids(prompt_len),
                "completion_ids": ids(completion_len),
                "tool_mask": tool_mask,
                "advantage": float(torch.rand((), generator=g) * 2 - 1),
            }
        )
    return rows


def _collate(chunk: list[dict]):
    return collate(
        [r["prompt_ids"] for r in chunk], [r["completion_ids"] for r in chunk], [r["tool_mask"] for r in chunk], PAD_ID
    )


def count_fn(chunk: list[dict]) -> Tensor:
    """(num_policy_tokens, num_seqs) of a chunk, as agg_loss counts them."""
    return torch.stack(agg_normalizers(_collate(chunk).loss_mask))


def sft_loss_fn(module: torch.nn.Module, chunk_tokens: int | None = None) -> LossFn:
    """Token-mean NLL on loss_mask tokens: SFT's loss, normalized by the global token count."""

    def loss_fn(chunk: list[dict], counts: Tensor) -> tuple[Tensor, dict[str, float]]:
        batch = to_device(_collate(chunk), model_device(module))
        logprobs = completion_logprobs(module, batch, chunk_tokens=chunk_tokens)
        loss = agg_loss(-logprobs, batch.loss_mask, "token_mean", num_tokens=counts[0])
        return loss, {"loss/nll_token_mean": float(agg_loss(-logprobs.detach(), batch.loss_mask, "token_mean"))}

    return loss_fn


def rl_loss_fn(module: torch.nn.Module, chunk_tokens: int | None = None) -> LossFn:
    """PPO-clip with fixed per-row advantages. old_logprobs are the current ones, detached: the
    policy at step start, as in the first minibatch of a PPO epoch (ratio 1, gradient -A ∇logp)."""

    def loss_fn(chunk: list[dict], counts: Tensor) -> tuple[Tensor, dict[str, float]]:
        batch = to_device(_collate(chunk), model_device(module))
        logprobs = completion_logprobs(module, batch, chunk_tokens=chunk_tokens)
        advantages = torch.tensor([[r["advantage"]] for r in chunk], device=batch.input_ids.device)
        return ppo_clip_loss(logprobs, logprobs.detach(), advantages, batch.loss_mask, num_tokens=counts[0])

    return loss_fn


LOSSES: dict[str, Callable[..., LossFn]] = {"sft": sft_loss_fn, "rl": rl_loss_fn}  # fn(module, chunk_tokens) -> LossFn


def shape(row: dict) -> tuple[int, int]:
    return len(row["prompt_ids"]), len(row["completion_ids"])


def train(
    engine: TrainEngine,
    rows: list[dict],
    *,
    steps: int,
    micro_batch_size: int | None,
    loss: str = "sft",
    count: CountFn = count_fn,
    max_tokens: int | None = None,
    chunk_tokens: int | None = None,
) -> list[dict[str, float]]:
    """`steps` optimizer steps, each over the whole global batch `rows`, sharded across ranks."""
    engine.train()
    loss_fn = LOSSES[loss](engine.module, chunk_tokens)
    mine = shard(rows, engine.rank, engine.world_size)
    return [
        accumulate_step(
            engine, mine, loss_fn, count, micro_batch_size=micro_batch_size, max_tokens=max_tokens, shape=shape
        )
        for _ in range(steps)
    ]


def lr_schedule(step: int) -> float:
    return 1.0 / (1 + step)  # not constant, so a scheduler that is not stepped (or restored) shows


def make_engine(
    cfg: EngineConfig, *, seed: int = 0, lr: float = LR, grad_clip: float = 1.0, dtype: torch.dtype = torch.float32
) -> TrainEngine:
    # grad_clip 1.0 is below the first steps' gradient norm (~1.1): clipping is exercised too.
    return build_engine(tiny_model(seed, dtype), cfg, lr=lr, grad_clip=grad_clip, lr_lambda=lr_schedule)


def run_check(
    cfg: EngineConfig,
    *,
    steps: int,
    num_rows: int = 8,
    loss: str = "sft",
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
) -> tuple[dict, dict[str, Tensor]]:
    """(JSON-able summary, final full state_dict) of one run; collective over all ranks."""
    engine = make_engine(cfg, seed=seed, dtype=dtype)
    history = train(
        engine,
        synthetic_batch(num_rows, seed),
        steps=steps,
        micro_batch_size=cfg.micro_batch_size,
        loss=loss,
        max_tokens=cfg.micro_batch_tokens,
        chunk_tokens=cfg.logit_chunk_tokens,
    )
    state = engine.model_state_dict()
    summary = {
        "engine": cfg.kind,
        "zero_stage": cfg.zero_stage,
        "micro_batch_size": cfg.micro_batch_size,
        "world_size": engine.world_size,
        "steps": steps,
        "rows": num_rows,
        "loss": loss,
        "dtype": str(dtype),
        "param_sum": float(sum(v.double().sum() for v in state.values())),
        "checksums": {k: float(v.double().sum()) for k, v in list(state.items())[:4]},
        "history": history,
    }
    return summary, state


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--engine", choices=["torch", "deepspeed"], default="torch")
    parser.add_argument("--zero-stage", type=int, choices=[0, 1, 2, 3], default=0)
    parser.add_argument("--offload-optimizer", action="store_true")
    parser.add_argument("--micro-batch-size", type=int, default=None)
    parser.add_argument("--precision", choices=["fp32", "bf16", "auto"], default="fp32")
    parser.add_argument(
        "--logit-chunk-tokens",
        type=int,
        default=EngineConfig().logit_chunk_tokens,
        help="LM-head tokens at once (small values exercise the chunked, recomputed head)",
    )
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--rows", type=int, default=8, help="global batch size (odd: ranks get unequal shards)")
    parser.add_argument("--loss", choices=sorted(LOSSES), default="sft")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="float32", help="float64: torch engine only")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    cfg = EngineConfig(
        kind=args.engine,
        zero_stage=args.zero_stage,
        offload_optimizer=args.offload_optimizer,
        micro_batch_size=args.micro_batch_size,
        precision=args.precision,
        logit_chunk_tokens=args.logit_chunk_tokens,
    )
    summary, state = run_check(cfg, steps=args.steps, num_rows=args.rows, loss=args.loss, dtype=DTYPES[args.dtype])
    rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
    leave_together()
    if rank != 0:
        return
    args.out.parent.mkdir(parents=True, exist_ok=True)
    torch.save(state, args.out.with_suffix(".pt"))
    args.out.write_text(json.dumps(summary, indent=1))
    print(json.dumps({k: v for k, v in summary.items() if k != "history"}))


if __name__ == "__main__":
    main()
