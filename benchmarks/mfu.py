"""How close our training steps come to this machine's matrix-multiply limit (issue 9, part 2).

    .venv/bin/python benchmarks/mfu.py [--sizes tiny,20m,50m] [--steps 6] [--precision fp32,bf16]

1. The limit: sustained torch matmul FLOP/s (square n x n, 2n^3 FLOP each, for ~3 s per size), in
   fp32 and bf16, on every core torch may use.
2. The steps, through the product's own code on synthetic data shaped like the `tiny` profile's:
   - SFT: `training.sft.train_sft` (batch 64 x 208 tokens; 16 x 208 at 20m/50m), timed per optimizer step;
   - RL: `training.rl.loop.prepare_samples` (the trainer's old log-probs and the reference's: two
     forward passes) and `run_update` (one optimizer step over the batch, GRPO's loss), 256
     trajectories (32 prompts x 8; 8 x 8 at 20m/50m) of 144 tokens.
   Model FLOPs: 6 N tokens for a training step, 2 N tokens for a forward pass, N = the parameters
   of every matmul (each Linear; the embedding lookup is not a matmul). The LM head counts on
   completion tokens only: `completion_logits` runs it on no prompt position (logits_to_keep);
   attention's QK^T and AV are left out, as in the 6ND convention. MFU = model FLOP/s / the
   limit of the precision the step ran in. Each figure is the median over `--steps` steps after
   one warm-up step.
Writes benchmarks/results/mfu.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# Model shapes: the tiny profile's, and two larger variants (Qwen2 blocks, vocabulary 1024) with
# smaller batches (as benchmarks/rollout_engines.py's 20m), so that a step takes seconds, not minutes.
SIZES = {
    "tiny": {},
    "20m": {
        "model.hidden_size": 512,
        "model.intermediate_size": 1408,
        "model.num_hidden_layers": 6,
        "model.num_attention_heads": 8,
        "model.num_key_value_heads": 8,
        "sft.batch_size": 16,
        "rl.prompts_per_step": 8,
    },
    "50m": {
        "model.hidden_size": 768,
        "model.intermediate_size": 2048,
        "model.num_hidden_layers": 7,
        "model.num_attention_heads": 12,
        "model.num_key_value_heads": 12,
        "sft.batch_size": 16,
        "rl.prompts_per_step": 8,
    },
}
PROMPT, SFT_COMPLETION, RL_COMPLETION = 48, 160, 96


def matmul_peak(dtype, sizes=(1024, 2048, 4096), seconds: float = 3.0) -> dict[int, float]:
    """Sustained FLOP/s of n x n matmuls per n (after a warm-up)."""
    import torch

    out = {}
    for n in sizes:
        a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
        torch.mm(a, b)
        done, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            torch.mm(a, b)
            done += 1
        out[n] = 2 * n**3 * done / (time.perf_counter() - start)
    return out


def matmul_parameters(model) -> int:
    import torch

    return sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))


def model_flops(model, passes: int, prompt_tokens: int, completion_tokens: int) -> float:
    """passes x (N_body x every token + N_head x completion tokens): the head sees no prompt position."""
    head = model.get_output_embeddings().weight.numel()
    return passes * ((matmul_parameters(model) - head) * (prompt_tokens + completion_tokens) + head * completion_tokens)


def synthetic_ids(n: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    import torch

    gen = torch.Generator().manual_seed(seed)
    return torch.randint(3, vocab, (n, length), generator=gen).tolist()


def sft_steps(model, cfg, steps: int) -> tuple[list[float], int]:
    """Seconds per SFT step (the first, warm-up, dropped) and tokens per step."""
    from training.sft import Example, train_sft

    n = cfg.sft.batch_size * 8
    prompts, completions = (
        synthetic_ids(n, PROMPT, cfg.model.vocab_size, 0),
        synthetic_ids(n, SFT_COMPLETION, cfg.model.vocab_size, 1),
    )
    # a tool observation in the middle of each completion: masked from the loss, as in teacher trajectories
    mask = [1] * 60 + [0] * 40 + [1] * (SFT_COMPLETION - 100)
    examples = [Example(p, c, mask) for p, c in zip(prompts, completions)]
    stamps = [time.perf_counter()]
    sft = cfg.sft.model_copy(update={"steps": steps + 1, "log_every": 1, "warmup_steps": 0})
    train_sft(
        model,
        examples,
        sft,
        pad_id=0,
        seed=0,
        engine_cfg=cfg.engine,
        on_log=lambda step, m: stamps.append(time.perf_counter()),
    )
    return [b - a for a, b in zip(stamps[1:], stamps[2:])], (
        cfg.sft.batch_size * PROMPT,
        cfg.sft.batch_size * SFT_COMPLETION,
    )


def rl_steps(model, reference, cfg, steps: int) -> tuple[list[float], list[float], int]:
    """Seconds of prepare_samples (2 forward passes) and of run_update per step, and tokens per step."""
    import torch

    from training.engines import build_engine
    from training.rl.algorithms import resolve_algorithm
    from training.rl.loop import policy_loss_fn, prepare_samples, run_update

    rl, n = cfg.rl, cfg.rl.prompts_per_step * cfg.rl.group_size
    prompts, completions = (
        synthetic_ids(n, PROMPT, cfg.model.vocab_size, 2),
        synthetic_ids(n, RL_COMPLETION, cfg.model.vocab_size, 3),
    )
    mask = [1] * 40 + [0] * 24 + [1] * (RL_COMPLETION - 64)
    records = [
        {
            "prompt_ids": p,
            "completion_ids": c,
            "tool_mask": mask,
            "logprobs": [-1.0] * RL_COMPLETION,
            "group_id": f"g{i // rl.group_size}",
            "trajectory_id": f"t{i}",
        }
        for i, (p, c) in enumerate(zip(prompts, completions))
    ]
    # every group has reward spread
    scores = [{"reward": float(i % 3 == 0), "outcome": float(i % 3 == 0)} for i in range(n)]
    algo = resolve_algorithm(rl)
    engine = build_engine(model, cfg.engine, lr=rl.learning_rate, betas=(0.9, 0.99), grad_clip=rl.grad_clip)
    loss_fn = policy_loss_fn(
        engine, algo, temperature=cfg.rollout.temperature, pad_id=0, loss_norm_tokens=cfg.rollout.max_total_tokens
    )
    prep, update = [], []
    for _ in range(steps + 1):
        start = time.perf_counter()
        samples, _ = prepare_samples(
            records,
            scores,
            algo,
            policy=engine.model,
            reference=reference,
            critic=None,
            temperature=cfg.rollout.temperature,
            pad_id=0,
            micro_batch_tokens=cfg.engine.micro_batch_tokens,
        )
        mid = time.perf_counter()
        run_update(
            engine,
            samples,
            loss_fn,
            minibatches=rl.minibatches,
            micro_batch_size=cfg.engine.micro_batch_size,
            micro_batch_tokens=cfg.engine.micro_batch_tokens,
            generator=torch.Generator().manual_seed(0),
            prefix="actor",
        )
        prep.append(mid - start)
        update.append(time.perf_counter() - mid)
    return prep[1:], update[1:], (n * PROMPT, n * RL_COMPLETION)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="tiny,20m,50m")
    parser.add_argument("--steps", type=int, default=6, help="measured steps per figure, after one warm-up step")
    parser.add_argument("--precision", default="fp32", help="engine precisions to run the steps in: fp32, bf16 or both")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = parser.parse_args(argv)

    import torch

    from configs import load_profile
    from training.model import build_model

    torch.set_num_threads(2)
    peaks = {name: matmul_peak(dtype) for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16))}
    limit = {name: max(by_n.values()) for name, by_n in peaks.items()}
    for name, by_n in peaks.items():
        print(f"[mfu] matmul {name}: " + ", ".join(f"n={n} {f / 1e9:.1f} GFLOP/s" for n, f in by_n.items()), flush=True)
    rows = []
    for size in args.sizes.split(","):
        for precision in args.precision.split(","):
            cfg = load_profile("tiny", {**SIZES[size], "engine.precision": precision})
            model = build_model(cfg.model, cfg.model.vocab_size, 0, seed=0)
            n_params = matmul_parameters(model)
            sft, sft_tokens = sft_steps(model, cfg, args.steps)
            reference = build_model(cfg.model, cfg.model.vocab_size, 0, seed=1).requires_grad_(False).eval()
            prep, update, rl_tokens = rl_steps(model, reference, cfg, args.steps)
            peak = limit[precision]
            for stage, times, tokens, passes in (
                ("SFT step", sft, sft_tokens, 6),
                ("RL old+ref log-probs", prep, rl_tokens, 4),
                ("RL update", update, rl_tokens, 6),
            ):
                median = statistics.median(times)
                flops = model_flops(model, passes, *tokens) / median
                rows.append(
                    {
                        "size": size,
                        "precision": precision,
                        "matmul_params_m": round(n_params / 1e6, 2),
                        "stage": stage,
                        "tokens": sum(tokens),
                        "median_s": round(median, 4),
                        "spread_s": [round(min(times), 4), round(max(times), 4)],
                        "model_gflops": round(flops / 1e9, 2),
                        "peak_gflops": round(peak / 1e9, 2),
                        "mfu": round(flops / peak, 3),
                    }
                )
                print(
                    f"[mfu] {size} {precision} {stage}: {median:.3f}s for {sum(tokens)} tokens, {flops / 1e9:.1f} GFLOP/s = {flops / peak:.1%} of the matmul limit",
                    flush=True,
                )
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "mfu.json").write_text(
        json.dumps(
            {
                "command": " ".join(["benchmarks/mfu.py", *(argv or sys.argv[1:])]),
                "matmul_flops": {k: {str(n): v for n, v in by_n.items()} for k, by_n in peaks.items()},
                "rows": rows,
            },
            indent=1,
        )
    )
    lines = [
        "| matmul | " + " | ".join(f"n={n}" for n in peaks["fp32"]) + " |",
        "|---" * (len(peaks["fp32"]) + 1) + "|",
    ]
    lines += [
        f"| {k} GFLOP/s | " + " | ".join(f"{v / 1e9:.1f}" for v in by_n.values()) + " |" for k, by_n in peaks.items()
    ]
    lines += [
        "",
        "| size | matmul params (M) | precision | stage | tokens | median s [min, max] | model GFLOP/s | MFU |",
        "|---" * 8 + "|",
    ]
    lines += [
        f"| {r['size']} | {r['matmul_params_m']} | {r['precision']} | {r['stage']} | {r['tokens']} | {r['median_s']} {r['spread_s']} | "
        f"{r['model_gflops']} | **{r['mfu']:.1%}** |"
        for r in rows
    ]
    (args.out / "mfu.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
