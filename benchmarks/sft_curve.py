"""When does SFT teach each family? Pass@1 on held-out tasks along an SFT run (issue 26).

    .venv/bin/python benchmarks/sft_curve.py --home .flywheel [--runs 1200x64@1e-3,600x64@3e-3] [--tasks 200] [--evals 6]

Takes a flywheel home after `make run` (its base model, SFT trajectories, held-out benchmark tasks,
knowledge base and search index) and runs the product's SFT (`training.sft.train_sft`, the tiny
profile's engine settings) from the base model for each `--runs` entry (steps x batch @ learning
rate), stopping `--evals` times along the way to sample one episode on each of the first `--tasks`
held-out tasks of every family (`training.evaluate.evaluate_policy`, the real tools and verifier
cascade, temperature 1). Reported per evaluation: SFT wall so far (evaluations excluded), loss and
pass@1 per family. Writes benchmarks/results/sft-curve.{json,md}.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.warm_bench import commit, write_results  # noqa: E402

FAMILIES = ("arithmetic", "search", "code")


def parse_run(text: str) -> tuple[int, int, float]:
    """'1200x64@1e-3' -> (steps, batch, learning rate)."""
    try:
        shape, lr = text.split("@")
        steps, batch = shape.split("x")
        return int(steps), int(batch), float(lr)
    except ValueError:
        raise SystemExit(f"--runs entry {text!r}: expected STEPSxBATCH@LR, e.g. 1200x64@1e-3") from None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--home", type=Path, required=True, help="a flywheel home after `make run`")
    parser.add_argument("--profile", default="tiny")
    parser.add_argument("--runs", default="1200x64@1e-3,600x64@3e-3")
    parser.add_argument("--tasks", type=int, default=200, help="held-out tasks per family at each evaluation")
    parser.add_argument("--evals", type=int, default=6)
    args = parser.parse_args(argv)
    runs = [parse_run(r) for r in args.runs.split(",")]
    artifacts = args.home / "artifacts"
    if not (artifacts / "checkpoints" / "base").is_dir():
        raise SystemExit(
            f"--home {args.home}: no base model at {artifacts / 'checkpoints' / 'base'} (run `make run` first)"
        )

    import pandas as pd
    import torch

    from assets.data import search_retriever
    from assets.resources import ArtifactStore, SandboxResource
    from assets.sft import load_checkpoint
    from configs import load_profile
    from environments.families import build_tools
    from environments.search import kb_from_rows
    from training.agent.engines import HFEngine
    from training.evaluate import evaluate_policy
    from training.sft import Example, train_sft
    from verifiers.cascade import Cascade

    cfg = load_profile(args.profile)
    torch.set_num_threads(cfg.threads)
    storage = ArtifactStore(root=str(artifacts), cache_dir=str(args.home / "cache"))
    trajectories = pd.read_parquet(artifacts / "assets" / "sft_trajectories" / "all.parquet")
    # as the sft_checkpoint asset does: loss on the policy's tokens minus the detours
    examples = [
        Example(list(p), list(c), list(m))
        for p, c, m in zip(trajectories.prompt_ids, trajectories.completion_ids, trajectories.loss_mask)
    ]
    held_out = pd.read_parquet(artifacts / "assets" / "benchmark_tasks" / "all.parquet").to_dict("records")
    held_out = [t for t in held_out if t["split"] == "benchmark"]
    tasks = [t for f in FAMILIES for t in [t for t in held_out if t["family"] == f][: args.tasks]]
    kb = kb_from_rows(pd.read_parquet(artifacts / "assets" / "knowledge_base" / "all.parquet").to_dict("records"))
    rows = []
    with SandboxResource.from_config(cfg.sandbox).open() as box:
        tools = build_tools(
            sandbox=box, kb=kb, top_k=cfg.data.knowledge_base.top_k, retriever=search_retriever(storage, kb)
        )
        cascade = Cascade(cfg.reward, box, concurrency=cfg.sandbox.pool_size)
        for steps, batch, lr in runs:
            model, tok = load_checkpoint(storage, {"uri": str(artifacts / "checkpoints" / "base")})
            sft = cfg.sft.model_copy(
                update={"steps": steps, "batch_size": batch, "learning_rate": lr, "log_every": steps // args.evals}
            )
            start, evaluating = time.perf_counter(), 0.0

            def on_log(step, metrics, model=model, tok=tok, steps=steps, batch=batch, lr=lr, start=start):
                nonlocal evaluating
                began = time.perf_counter()
                model.eval()
                scored = evaluate_policy(
                    HFEngine(model, tok),
                    tok,
                    tasks,
                    tools=tools,
                    rollout=cfg.rollout,
                    cascade=cascade,
                    samples_per_task=1,
                    temperature=1.0,
                    greedy=False,
                    seed=0,
                    batch_size=cfg.benchmark.batch_size,
                )
                model.train()
                row = {
                    "run": f"{steps}x{batch}@{lr:g}",
                    "step": step,
                    "examples": step * batch,
                    "sft_s": began - start - evaluating,
                    "loss": metrics["loss/sft"],
                    **{f: sum(r["score"] for r in scored if r["family"] == f) / args.tasks for f in FAMILIES},
                }
                evaluating += time.perf_counter() - began
                rows.append(row)
                print(f"[curve] {row}", flush=True)

            train_sft(
                model, examples, sft, pad_id=tok.eos_token_id, seed=cfg.seed, engine_cfg=cfg.engine, on_log=on_log
            )

    header = (
        f"# Pass@1 along SFT (commit {commit()})\n\n"
        f"`.venv/bin/python benchmarks/sft_curve.py --home <a make run home> --runs {args.runs} "
        f"--tasks {args.tasks} --evals {args.evals}`: profile {args.profile}, one sample per task at temperature 1, "
        f"the first {args.tasks} held-out tasks of each family.\n\n"
        "| run (steps x batch @ lr) | step | examples seen | SFT wall s | loss | "
        + " | ".join(FAMILIES)
        + " |\n|---|---|---|---|---|"
        + "---|" * len(FAMILIES)
        + "\n"
    )
    lines = [
        f"| {r['run']} | {r['step']} | {r['examples']:,} | {r['sft_s']:.0f} | {r['loss']:.3f} | "
        + " | ".join(f"{r[f]:.3f}" for f in FAMILIES)
        + " |"
        for r in rows
    ]
    write_results("sft-curve", header, lines, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
