"""GPU hours per flywheel round on the cluster, estimated on paper (docs/deploy.md, "Cost drivers").

Nothing here runs on a GPU. The estimate combines three kinds of figures, each printed with its
source so a reader can replace any of them:

* **the work**, from a profile (`configs/cluster.yaml` by default): episodes per round
  (steps x prompts x group size), benchmark episodes, SFT steps and batch;
* **measured on this machine** (benchmarks/results/*.json, written by the benchmark scripts):
  tool calls per episode and the sandbox's CPU time per call, which size the CPU side of a step;
* **published GPU figures**: NVIDIA's peak bf16 tensor throughput and memory bandwidth, and one
  measured vLLM decode point (75 tokens/s for Llama-3.1-8B bf16 at one request on an A100 40GB,
  77% of its bandwidth roofline; johnmusgrave.com/p/vllm-throughput-latency-sweep-on), which sets
  the bandwidth efficiency used for decoding.

Episode length is the figure this machine cannot measure for a 0.5B-7B model (the `tiny` model
writes about 17 tokens an episode), so every estimate is a row per episode length.

    .venv/bin/python benchmarks/gpu_cost.py [--profile cluster] [--out benchmarks/results/gpu-cost]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from configs import load_profile  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"


@dataclass(frozen=True)
class Model:
    """Shapes from the models' published Hugging Face configs (Qwen/Qwen2.5-*-Instruct/config.json)."""

    name: str
    params_b: float  # parameters, billions
    layers: int
    kv_heads: int
    head_dim: int

    def kv_bytes_per_token(self, dtype_bytes: int = 2) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * dtype_bytes  # K and V


@dataclass(frozen=True)
class Gpu:
    """Peak dense bf16 tensor FLOP/s and memory bandwidth (NVIDIA data sheets: A100 80 GB SXM 312
    TFLOPS, 2,039 GB/s; L40S 362 TFLOPS, 864 GB/s; the A10G's tensor rate is below the A10's 125
    TFLOPS, about 70, per Baseten's A10 vs A10G comparison, with the A10's 600 GB/s)."""

    name: str
    instance: str
    gpus: int
    bf16_tflops: float
    bandwidth_gbs: float
    memory_gb: float
    vllm_memory_fraction: float  # rollout.vllm.gpu_memory_utilization to run with: the rest is the trainer's


MODELS = {
    "0.5b": Model("Qwen2.5-0.5B", 0.49, 24, 2, 64),
    "1.5b": Model("Qwen2.5-1.5B", 1.54, 28, 2, 128),
    "7b": Model("Qwen2.5-7B", 7.62, 28, 4, 128),
}
# The smallest common instance where the model trains in full (no LoRA) next to a colocated vLLM
# engine; `trainer_gb` below checks it.
GPUS = {
    "g5.2xlarge": Gpu("A10G 24 GB", "g5.2xlarge", 1, 70.0, 600.0, 24.0, 0.5),  # the eks module's default GPU node
    "g6e.2xlarge": Gpu("L40S 48 GB", "g6e.2xlarge", 1, 362.0, 864.0, 48.0, 0.3),
    "p4de.24xlarge": Gpu("A100 80 GB", "p4de.24xlarge", 8, 312.0, 2039.0, 80.0, 0.4),
}
PLACEMENT = {"0.5b": GPUS["g5.2xlarge"], "1.5b": GPUS["g6e.2xlarge"], "7b": GPUS["p4de.24xlarge"]}
BANDWIDTH_EFFICIENCY = 0.77  # the published vLLM decode point above
MFU = 0.35  # training and prefill: a planning assumption (issue 9 measures ours on CPU); change with --mfu
TRAIN_FLOPS_PER_TOKEN = 6 + 2 + 2  # update (forward+backward) + old log-probs + reference log-probs, in units of N


def decode_tokens_per_s(model: Model, gpu: Gpu, concurrency: int, context: int, mfu: float) -> float:
    """Batched decode of one engine (one GPU; tensor parallel = 1): each step reads the weights once
    and every sequence's KV cache, or is compute-bound, whichever is slower."""
    weight_bytes = model.params_b * 1e9 * 2
    read_s = (weight_bytes + concurrency * context * model.kv_bytes_per_token()) / (
        gpu.bandwidth_gbs * 1e9 * BANDWIDTH_EFFICIENCY
    )
    compute_s = 2 * model.params_b * 1e9 * concurrency / (gpu.bf16_tflops * 1e12 * mfu)
    return concurrency / max(read_s, compute_s)


def kv_concurrency(model: Model, gpu: Gpu, max_tokens: int, want: int, memory_fraction: float) -> int:
    """Sequences whose full-length KV fits next to the weights in vLLM's share of one GPU."""
    free = gpu.memory_gb * 1e9 * memory_fraction - model.params_b * 1e9 * 2
    return max(1, min(want, int(free // (max_tokens * model.kv_bytes_per_token()))))


def trainer_gb(model: Model, gpus: int) -> float:
    """Training state on one GPU under ZeRO-2: bf16 weights whole; bf16 gradients and fp32 master
    weights + Adam moments (2 + 12 bytes a parameter) sharded over the GPUs. Activations come on
    top (micro-batch x sequence; gradient checkpointing keeps them to a few GB at these sizes)."""
    return model.params_b * (2 + 14 / gpus)


def measured_cpu_side() -> dict:
    """Tool calls per episode and sandbox CPU per call, from this machine's benchmark results."""
    rollout = json.loads((RESULTS / "rollout-engines.json").read_text())
    vllm_tiny = next(r for r in rollout["rows"] if r["engine"] == "vllm" and r["size"] == "tiny")
    sandbox = json.loads((RESULTS / "verifier_throughput.json").read_text())["sandbox"]
    return {
        "tool_calls_per_episode": vllm_tiny["tool_call_rate"],
        "generated_tokens_per_episode_tiny": sum(n for n, _ in vllm_tiny["pure_runs"])
        / len(vllm_tiny["pure_runs"])
        / vllm_tiny["episodes"],
        "sandbox_ms_per_call": sandbox["sandbox ms per call (one at a time)"],
        "sources": ["benchmarks/results/rollout-engines.json", "benchmarks/results/verifier_throughput.json"],
    }


def estimate(cfg, key: str, episode_tokens: int, prompt_tokens: int, cpu: dict, mfu: float) -> dict:
    model, gpu = MODELS[key], PLACEMENT[key]
    episodes = cfg.rl.steps_per_round * cfg.rl.prompts_per_step * cfg.rl.group_size
    bench_episodes = sum(f.benchmark_tasks for f in cfg.data.families.values()) * cfg.benchmark.samples_per_task
    generated = episode_tokens - prompt_tokens
    n = model.params_b * 1e9
    peak = gpu.bf16_tflops * 1e12 * mfu

    # Rollout: every GPU runs its own engine on 1/gpus of the episodes (data parallel).
    concurrency = kv_concurrency(
        model,
        gpu,
        cfg.rollout.max_total_tokens,
        cfg.rl.prompts_per_step * cfg.rl.group_size // gpu.gpus,
        gpu.vllm_memory_fraction,
    )
    trainer_room = gpu.memory_gb * (1 - gpu.vllm_memory_fraction)
    decode_rate = decode_tokens_per_s(model, gpu, concurrency, episode_tokens // 2, mfu)
    prefill_s = 2 * n * prompt_tokens / peak  # prompts and tool observations, compute-bound
    rollout_s = episodes / gpu.gpus * (generated / decode_rate + prefill_s)
    # Tools run on the node's CPUs while the GPU decodes other sequences; they only add wall time
    # when they take longer than the decoding they overlap with.
    tools_cpu_s = episodes * cpu["tool_calls_per_episode"] * cpu["sandbox_ms_per_call"] / 1000
    train_s = TRAIN_FLOPS_PER_TOKEN * n * episodes * episode_tokens / (peak * gpu.gpus)
    bench_s = bench_episodes / gpu.gpus * (generated / decode_rate + prefill_s)
    sft_s = 6 * n * cfg.sft.steps * cfg.sft.batch_size * episode_tokens / (peak * gpu.gpus)
    round_h = (rollout_s + train_s + bench_s) / 3600
    return {
        "model": model.name,
        "instance": f"{gpu.instance} ({gpu.gpus} x {gpu.name})",
        "episode_tokens": episode_tokens,
        "vllm_memory_fraction": gpu.vllm_memory_fraction,
        "trainer_state_gb_per_gpu": round(trainer_gb(model, gpu.gpus), 1),
        "fits": trainer_gb(model, gpu.gpus) + 2 <= trainer_room,
        "episodes_per_round": episodes,
        "benchmark_episodes": bench_episodes,
        "engine_concurrency": concurrency,
        "decode_tokens_per_s_per_gpu": round(decode_rate),
        "rollout_h": rollout_s / 3600,
        "train_h": train_s / 3600,
        "benchmark_h": bench_s / 3600,
        "tools_cpu_h": tools_cpu_s / 3600,
        "round_wall_h": round_h,
        "round_gpu_h": round_h * gpu.gpus,
        "sft_gpu_h": sft_s / 3600 * gpu.gpus,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--profile", default="cluster")
    parser.add_argument("--models", default="0.5b,1.5b,7b")
    parser.add_argument(
        "--episode-tokens",
        default="512,1024,2048,4096",
        help="Whole-episode lengths to tabulate (prompt + generated + observations).",
    )
    parser.add_argument(
        "--prompt-tokens",
        type=int,
        default=256,
        help="Prompt and tool-observation tokens of an episode (prefill, not decoded).",
    )
    parser.add_argument("--mfu", type=float, default=MFU)
    parser.add_argument("--out", default=str(RESULTS / "gpu-cost"))
    args = parser.parse_args()

    # The cluster profile reads its bucket and images from the environment; the estimate needs
    # neither, so placeholders stand in for anything unset.
    for name in (
        "FLYWHEEL_ARTIFACT_ROOT",
        "FLYWHEEL_IMAGE",
        "FLYWHEEL_TRAINER_IMAGE",
        "FLYWHEEL_SANDBOX_IMAGE",
        "MLFLOW_TRACKING_URI",
    ):
        os.environ.setdefault(name, "unset")
    cfg = load_profile(args.profile)
    cpu = measured_cpu_side()
    rows = [
        estimate(cfg, key, int(t), args.prompt_tokens, cpu, args.mfu)
        for key in args.models.split(",")
        for t in args.episode_tokens.split(",")
        if int(t) <= cfg.rollout.max_total_tokens
    ]

    fit_lines = [
        "Full fine-tuning next to a colocated vLLM engine (2 GB kept for activations):",
        "",
        "| model | instance | vLLM share | trainer state GB/GPU | room GB | fits |",
        "|---|---|---|---|---|---|",
    ]
    for key in args.models.split(","):
        for gpu in GPUS.values():
            state, room = trainer_gb(MODELS[key], gpu.gpus), gpu.memory_gb * (1 - gpu.vllm_memory_fraction)
            fit_lines.append(
                f"| {MODELS[key].name} | {gpu.instance} ({gpu.gpus} x {gpu.name}) | {gpu.vllm_memory_fraction} | {state:.1f} | "
                f"{room:.1f} | {'yes' if state + 2 <= room else 'no'} |"
            )
    header = "| model | instance | tokens/episode | decode tok/s/GPU | rollout h | train h | benchmark h | GPU-hours/round | SFT GPU-hours |"
    lines = [
        f"Profile `{args.profile}`: {rows[0]['episodes_per_round']:,} episodes a round "
        f"({cfg.rl.steps_per_round} steps x {cfg.rl.prompts_per_step} prompts x {cfg.rl.group_size}), "
        f"{rows[0]['benchmark_episodes']:,} benchmark episodes; MFU {args.mfu:.0%}, decode at {BANDWIDTH_EFFICIENCY:.0%} of bandwidth.",
        f"Measured here: {cpu['tool_calls_per_episode']:.2f} tool calls an episode, {cpu['sandbox_ms_per_call']:.1f} ms sandbox CPU a call "
        f"(tools: {rows[0]['tools_cpu_h'] * 60:.1f} CPU-minutes a round, spread over the node's CPUs while the GPU decodes).",
        "",
        header,
        "|" + "---|" * (header.count("|") - 1),
    ]
    for r in rows:
        lines.append(
            f"| {r['model']} | {r['instance']} | {r['episode_tokens']:,} | {r['decode_tokens_per_s_per_gpu']:,} | {r['rollout_h']:.2f} | "
            f"{r['train_h']:.2f} | {r['benchmark_h']:.2f} | {r['round_gpu_h']:.1f} | {r['sft_gpu_h']:.1f} |"
        )
    table = "\n".join(fit_lines + [""] + lines)
    print(table)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    command = "benchmarks/gpu_cost.py " + " ".join(sys.argv[1:])
    out.with_suffix(".json").write_text(
        json.dumps(
            {
                "command": command.strip(),
                "measured": cpu,
                "mfu": args.mfu,
                "bandwidth_efficiency": BANDWIDTH_EFFICIENCY,
                "gpus": {k: asdict(v) for k, v in GPUS.items()},
                "rows": rows,
            },
            indent=1,
        )
    )
    out.with_suffix(".md").write_text(f"`{command.strip()}`\n\n{table}\n")


if __name__ == "__main__":
    main()
