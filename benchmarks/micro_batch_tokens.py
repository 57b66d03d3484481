"""Padding and the passes' budget: an SFT step and an RL update per `engine.micro_batch_tokens`, side by side (issue 9).

    .venv/bin/python benchmarks/micro_batch_tokens.py --home /tmp/rollout-bench [--sizes tiny,20m] [--budgets none,8192,2048,1024,512]

Real batches, not fixed-length synthetic ones: the SFT rows are teacher trajectories (mixed
families, 3 to 140 tokens); the RL batches are rollouts of the size's warm-started policy
(benchmarks/rollout_engines.py's cache) on arithmetic prompts, 32 prompts x 8 at `tiny` and 8 x 8
at 20m, as in benchmarks/trl_side_by_side.py. For each budget, in one run and on the same data:
- SFT: seconds per `train_sft` step (batch 64 at tiny, 16 at 20m), from the same initial weights;
- RL: seconds of `prepare_samples` (old and reference log-probs) plus `run_update` (GRPO, one
  optimizer step), over the same three batches, with a learning rate of ~0 so that every
  budget sees the same weights.
`none` is the baseline: rows in order, one pass over the whole (padded) batch. Each figure is the
median of `--repeats` runs; the ratio is baseline / budget (higher is faster).
Writes benchmarks/results/micro-batch-tokens.{json,md}.
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

PROMPTS = {"tiny": 32, "20m": 8}


def sft_examples(cfg, box):
    from environments.families import build_tools, generate_tasks, make_kb
    from training.sft import Example
    from training.tokenizer import train_tokenizer
    from training.trajectories import build_sft_trajectories, tokenizer_corpus

    kb = make_kb(cfg.data.knowledge_base, 0)
    tasks = [
        t
        for family, fam in cfg.data.families.items()
        for t in generate_tasks(
            family, fam.train_tasks, seed=0, split="train", levels=fam.levels, level_weights=fam.level_weights, kb=kb
        )
    ]
    tok = train_tokenizer(tokenizer_corpus(tasks, [d["text"] for d in kb.documents]), cfg.model.vocab_size)
    rows = build_sft_trajectories(
        tasks, tok, build_tools(sandbox=box, kb=kb, top_k=1), teacher=cfg.teacher, seed=0, kb=kb
    )
    return tok, [Example(r["prompt_ids"], r["completion_ids"], r["loss_mask"]) for r in rows]


def sft_step_s(cfg, tok, examples, budget: int | None, steps: int) -> float:
    from configs.schema import EngineConfig
    from training.model import build_model
    from training.sft import train_sft

    model = build_model(cfg.model, len(tok), tok.eos_token_id, 0)
    stamps: list[float] = []
    sft = cfg.sft.model_copy(update={"steps": steps + 1, "log_every": 1})
    train_sft(
        model,
        examples,
        sft,
        pad_id=tok.eos_token_id,
        seed=0,
        engine_cfg=EngineConfig(micro_batch_tokens=budget),
        on_log=lambda step, m: stamps.append(time.perf_counter()),
    )
    return statistics.median(b - a for a, b in zip(stamps, stamps[1:]))  # the first step (allocation) is not counted


def rl_batches(cfg, folder, tasks, box, prompts: int):
    import torch

    from benchmarks.trl_side_by_side import step_tasks
    from environments.families import build_tools
    from training.agent.engines import HFEngine
    from training.agent.loop import run_episodes
    from training.model import load_policy, load_tokenizer
    from training.rl.scoring import episode_record, score_records
    from verifiers.cascade import Cascade

    policy, tok = load_policy(folder), load_tokenizer(folder)
    tools, cascade = build_tools(sandbox=box, kb=None), Cascade(cfg.reward, box)
    batches = []
    for i, batch in enumerate(step_tasks(tasks, prompts, 3)):
        episodes = run_episodes(
            HFEngine(policy),
            tok,
            batch,
            group_size=8,
            tools=tools,
            cfg=cfg.rollout,
            generator=torch.Generator().manual_seed(i),
        )
        records = [episode_record(e, round_index=1, step=1, policy_version="bench", tokenizer=tok) for e in episodes]
        batches.append((records, score_records(records, {t["task_id"]: t for t in batch}, tok, cascade)))
    return policy, tok, batches


def rl_update_s(cfg, policy, reference, tok, batches, budget: int | None) -> float:
    import torch

    from training.engines import build_engine
    from training.rl.algorithms import resolve_algorithm
    from training.rl.loop import policy_loss_fn, prepare_samples, run_update

    rl = cfg.rl.model_copy(update={"drop_zero_variance_groups": False})
    algo = resolve_algorithm(rl)
    # ~0: every budget sees the same weights
    engine = build_engine(policy, cfg.engine, lr=1e-12, betas=(0.9, 0.99), grad_clip=1.0)
    loss_fn = policy_loss_fn(
        engine, algo, temperature=1.0, pad_id=tok.eos_token_id, loss_norm_tokens=cfg.rollout.max_total_tokens
    )
    start = time.perf_counter()
    for records, scores in batches:
        samples, _ = prepare_samples(
            records,
            scores,
            algo,
            policy=engine.model,
            reference=reference,
            critic=None,
            temperature=1.0,
            pad_id=tok.eos_token_id,
            micro_batch_tokens=budget,
        )
        run_update(
            engine,
            samples,
            loss_fn,
            minibatches=rl.minibatches,
            micro_batch_size=None,
            generator=torch.Generator().manual_seed(0),
            prefix="actor",
            micro_batch_tokens=budget,
        )
    return (time.perf_counter() - start) / len(batches)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--home", type=Path, default=Path("/tmp/rollout-bench"))
    parser.add_argument("--sizes", default="tiny,20m")
    parser.add_argument(
        "--sft-steps", default="tiny=400,20m=400", help="warm-start SFT steps per size (the cache's folder)"
    )
    parser.add_argument("--budgets", default="none,8192,2048,1024,512")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--steps", type=int, default=8, help="SFT steps timed per run")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = parser.parse_args(argv)
    try:
        budgets = [None if b == "none" else int(b) for b in args.budgets.split(",")]
    except ValueError:
        parser.error(f"--budgets: {args.budgets!r} is not a comma list of integers and 'none'")
    if budgets[0] is not None:
        parser.error("--budgets must start with 'none' (the baseline the ratios are taken against)")

    import torch

    from benchmarks.rollout_engines import DATA, SIZES, warm_model
    from benchmarks.trl_side_by_side import _sandbox
    from configs import load_profile
    from training.model import load_policy

    torch.set_num_threads(2)
    sft_steps = dict(item.split("=") for item in args.sft_steps.split(","))
    rows = []
    with _sandbox() as box:
        for size in args.sizes.split(","):
            if size not in SIZES or size not in PROMPTS:
                parser.error(f"--sizes: {size!r} is not one of {', '.join(PROMPTS)}")
            cfg, folder, _, _, tasks, _ = warm_model(size, int(sft_steps[size]), args.home, box)
            tok, examples = sft_examples(load_profile("tiny", {**DATA, **SIZES[size]}), box)
            policy, rl_tok, batches = rl_batches(cfg, folder, tasks, box, PROMPTS[size])
            reference = load_policy(folder).requires_grad_(False).eval()
            lengths = [len(r["prompt_ids"]) + len(r["completion_ids"]) for records, _ in batches for r in records]
            print(
                f"[bench] {size}: RL batches of {len(lengths) // 3} trajectories, {statistics.mean(lengths):.0f} tokens on average, "
                f"the longest {max(lengths)}",
                flush=True,
            )
            runs: dict = {b: {"sft": [], "rl": []} for b in budgets}
            for _ in range(args.repeats):  # budgets interleaved, so drift hits all of them alike
                for budget in budgets:
                    runs[budget]["sft"].append(sft_step_s(cfg, tok, examples, budget, args.steps))
                    runs[budget]["rl"].append(rl_update_s(cfg, policy, reference, rl_tok, batches, budget))
                    print(
                        f"[bench] {size} budget {budget}: SFT step {runs[budget]['sft'][-1]:.3f}s, RL prepare + update {runs[budget]['rl'][-1]:.3f}s",
                        flush=True,
                    )
            base = {k: statistics.median(runs[None][k]) for k in ("sft", "rl")}
            for budget in budgets:
                med = {k: statistics.median(runs[budget][k]) for k in ("sft", "rl")}
                rows.append(
                    {
                        "size": size,
                        "budget": budget,
                        "sft_step_s": round(med["sft"], 3),
                        "sft_speedup": round(base["sft"] / med["sft"], 2),
                        "rl_prepare_update_s": round(med["rl"], 3),
                        "rl_speedup": round(base["rl"] / med["rl"], 2),
                        "runs": runs[budget],
                    }
                )
    args.out.mkdir(parents=True, exist_ok=True)
    command = " ".join(
        [".venv/bin/python benchmarks/micro_batch_tokens.py", *(argv if argv is not None else sys.argv[1:])]
    )
    (args.out / "micro-batch-tokens.json").write_text(json.dumps({"command": command, "rows": rows}, indent=1))
    lines = [
        f"`{command}` (median of {args.repeats} runs)",
        "",
        "| size | micro_batch_tokens | SFT step (s) | SFT: baseline / this | RL prepare + update (s) | RL: baseline / this |",
        "|---" * 6 + "|",
    ]
    lines += [
        f"| {r['size']} | {r['budget'] or 'none (baseline)'} | {r['sft_step_s']} | {r['sft_speedup']}x | {r['rl_prepare_update_s']} | {r['rl_speedup']}x |"
        for r in rows
    ]
    (args.out / "micro-batch-tokens.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
