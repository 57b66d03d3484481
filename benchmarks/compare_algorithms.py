"""Which RL algorithm, on this profile? One SFT checkpoint, one RL round per algorithm, the same
held-out benchmark: pass@1 with 95% CIs and the paired gain over SFT.

    .venv/bin/python benchmarks/compare_algorithms.py --profile tiny --home /tmp/algo-cmp \
        --algorithms grpo,dr_grpo,rloo,dapo,gspo,ppo [--seeds 0,1] [--set rl.steps_per_round=30]

The foundation (tasks, tokenizer, SFT) is materialized once through Dagster in `--home` (reused
when already there); each algorithm then starts from that same SFT checkpoint with the same
prompts (curriculum weights uniform, as in round 1 of the flywheel), the same reward and the same
evaluation seed, so differences come from the algorithm. Writes
benchmarks/results/algorithms-<profile>.{json,md} and a reward/entropy plot per algorithm.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from configs import load_profile, parse_override  # noqa: E402


def foundation(profile: str, overrides: dict, home: Path):
    """Materialize data, tokenizer and SFT once (reused if this home already has them)."""
    os.environ["FLYWHEEL_HOME"] = str(home)
    from pipelines.run import console, failure_message, prepare_home

    prepare_home(home)
    from dagster import AssetKey, DagsterInstance

    from pipelines.definitions import FOUNDATION_JOB, build_definitions

    defs = build_definitions(profile, overrides)
    instance = DagsterInstance.get()
    if instance.get_latest_materialization_event(AssetKey("sft_checkpoint")) is None:
        print(f"[compare] materializing the foundation in {home}", flush=True)
        log_file = home / "logs" / "foundation.log"
        result = defs.resolve_job_def(FOUNDATION_JOB).execute_in_process(
            instance=instance, run_config=console(log_file), raise_on_error=False
        )
        if not result.success:
            raise SystemExit(failure_message(result, FOUNDATION_JOB, log_file))
    load = lambda name: defs.load_asset_value(name, instance=instance)  # noqa: E731
    return load("training_tasks"), load("benchmark_tasks"), load("knowledge_base"), load("sft_checkpoint")


def held_out(benchmark_tasks, cfg) -> list[dict]:
    """The benchmark rows the promotion gate scores: the suites (HumanEval, ...) are reported apart."""
    return [t for t in benchmark_tasks.to_dict("records") if t["split"] not in cfg.benchmark.suites]


def evaluator(cfg, tok, bench: list[dict], tools, cascade):
    """model -> {task_id: score} on the held-out tasks, sampled as the benchmark asset samples."""
    from training.agent.engines import HFEngine
    from training.evaluate import evaluate_policy

    def evaluate(model) -> dict[str, float]:
        rows = evaluate_policy(
            HFEngine(model, tok),  # the tokenizer: stop strings (smol)
            tok,
            bench,
            tools,
            cfg.rollout,
            cascade,
            samples_per_task=cfg.benchmark.samples_per_task,
            greedy=False,
            temperature=cfg.benchmark.temperature,
            seed=cfg.seed,
            batch_size=cfg.benchmark.batch_size,
        )
        return {r["task_id"]: r["score"] for r in rows}

    return evaluate


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--profile", default="tiny")
    parser.add_argument("--home", type=Path, default=Path("/tmp/algo-compare"))
    parser.add_argument("--algorithms", default="grpo,dr_grpo,rloo,dapo,gspo,ppo")
    parser.add_argument("--seeds", default="0", help="RL seeds (the SFT checkpoint is shared)")
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.FIELD=VALUE")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    parser.add_argument("--tag", default="", help="suffix of the result files, e.g. -collapse")
    args = parser.parse_args(argv)
    overrides = dict(parse_override(o) for o in args.set)
    cfg = load_profile(args.profile, overrides)
    algorithms, seeds = args.algorithms.split(","), [int(s) for s in args.seeds.split(",")]

    import torch

    from assets.resources import SandboxResource
    from environments.families import build_tools
    from environments.search import kb_from_rows
    from training.evaluate import mean_ci, paired_difference
    from training.model import load_policy, load_tokenizer
    from training.rl.algorithms import resolve_algorithm
    from training.rl.collapse import detect_collapse
    from training.rl.loop import train_round
    from verifiers.cascade import Cascade

    torch.set_num_threads(cfg.threads)
    training_tasks, benchmark_tasks, knowledge_base, sft = foundation(args.profile, overrides, args.home)
    sft_path = Path(sft["uri"])
    tasks, bench = training_tasks.to_dict("records"), held_out(benchmark_tasks, cfg)
    kb = kb_from_rows(knowledge_base.to_dict("records"))
    tok = load_tokenizer(sft_path)
    sandbox = SandboxResource.from_config(cfg.sandbox).open()
    box = sandbox.__enter__()
    tools = build_tools(sandbox=box, kb=kb, top_k=cfg.data.knowledge_base.top_k)
    cascade = Cascade(cfg.reward, box, concurrency=cfg.sandbox.pool_size)

    evaluate = evaluator(cfg, tok, bench, tools, cascade)

    print(f"[compare] SFT checkpoint {sft_path}: evaluating on {len(bench)} held-out tasks", flush=True)
    sft_scores = evaluate(load_policy(sft_path, cfg.model.dtype))
    sft_mean, sft_low, sft_high = mean_ci(list(sft_scores.values()), cfg.benchmark.confidence)
    rows = [{"algorithm": "sft", "seed": None, "pass_at_1": sft_mean, "ci": [sft_low, sft_high]}]
    curves: dict[str, list[dict]] = {}
    for name in algorithms:
        for seed in seeds:
            rl = cfg.rl.model_copy(update={"algorithm": name})
            algo = resolve_algorithm(rl)
            policy = load_policy(sft_path, cfg.model.dtype)
            reference = (
                load_policy(sft_path, cfg.model.dtype).requires_grad_(False).eval() if algo.needs_reference else None
            )
            started = time.perf_counter()

            def progress(step: int, m: dict[str, float], name=name, rl=rl) -> None:
                if step % 5 == 0 or step == rl.steps_per_round:
                    print(
                        f"[compare] {name} step {step}/{rl.steps_per_round}: reward={m['reward/total/mean']:.3f} "
                        f"pass={m['reward/outcome/pass_rate']:.3f} entropy={m.get('actor/entropy', float('nan')):.3f}",
                        flush=True,
                    )

            result = train_round(
                policy,
                reference,
                tok,
                tasks,
                tools,
                rl=rl,
                rollout=cfg.rollout,
                cascade=cascade,
                round_index=1,
                policy_version="sft",
                seed=seed * 1000 + 1,
                engine_cfg=cfg.engine,
                on_step=progress,
            )
            train_minutes = (time.perf_counter() - started) / 60
            scores = evaluate(policy)
            mean, low, high = mean_ci(list(scores.values()), cfg.benchmark.confidence)
            gain = paired_difference(scores, sft_scores, cfg.benchmark.confidence)
            report = detect_collapse(result.history, rl.collapse)
            rows.append(
                {
                    "algorithm": name,
                    "seed": seed,
                    "pass_at_1": mean,
                    "ci": [low, high],
                    "gain": list(gain),
                    "train_minutes": train_minutes,
                    "final_entropy": result.history[-1].get("actor/entropy"),
                    "mean_clip_frac": _mean(result.history, "actor/clip_frac"),
                    "mean_kl_ref": _mean(result.history, "actor/kl_ref"),
                    "collapse_warnings": [f"{w.signal}@{w.first_step}" for w in report.warnings],
                    "first_warning_step": report.first_warning_step,
                    "reward_drop_step": report.reward_drop_step,
                }
            )
            curves[f"{name}/{seed}"] = result.history
            print(
                f"[compare] {name} seed {seed}: pass@1 {mean:.3f} [{low:.3f}, {high:.3f}], gain {gain[0]:+.3f} [{gain[1]:+.3f}, {gain[2]:+.3f}] "
                f"({train_minutes:.1f} min)",
                flush=True,
            )
    sandbox.__exit__(None, None, None)
    args.out.mkdir(parents=True, exist_ok=True)
    stem = args.out / f"algorithms-{args.profile}{args.tag}"
    meta = {
        "profile": args.profile,
        "overrides": overrides,
        "benchmark_tasks": len(bench),
        "steps": cfg.rl.steps_per_round,
        "prompts_per_step": cfg.rl.prompts_per_step,
        "group_size": cfg.rl.group_size,
        "command": " ".join(["benchmarks/compare_algorithms.py", *(argv or sys.argv[1:])]),
    }
    stem.with_suffix(".json").write_text(json.dumps({"meta": meta, "rows": rows, "histories": curves}, indent=1))
    table = to_markdown(rows)
    stem.with_suffix(".md").write_text(table + "\n")
    plot(curves, stem.with_suffix(".png"))
    print("\n" + table)
    return 0


def _mean(history: list[dict], key: str) -> float | None:
    values = [h[key] for h in history if key in h]
    return sum(values) / len(values) if values else None


def to_markdown(rows: list[dict]) -> str:
    lines = [
        "| algorithm | seed | pass@1 [95% CI] | gain over SFT [paired 95% CI] | RL minutes | final entropy | mean clip fraction | collapse warnings (signal@step) | reward drop step |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        gain = f"**{r['gain'][0]:+.3f}** [{r['gain'][1]:+.3f}, {r['gain'][2]:+.3f}]" if "gain" in r else "-"
        minutes = f"{r['train_minutes']:.1f}" if "train_minutes" in r else "-"
        entropy = f"{r['final_entropy']:.3f}" if r.get("final_entropy") is not None else "-"
        clip = f"{r['mean_clip_frac']:.3f}" if r.get("mean_clip_frac") is not None else "-"
        warnings = ", ".join(r.get("collapse_warnings", [])) or "none" if "gain" in r else "-"
        lines.append(
            f"| {r['algorithm']} | {r['seed'] if r['seed'] is not None else '-'} | {r['pass_at_1']:.3f} [{r['ci'][0]:.3f}, {r['ci'][1]:.3f}] "
            f"| {gain} | {minutes} | {entropy} | {clip} | {warnings} | {r.get('reward_drop_step') or ('none' if 'gain' in r else '-')} |"
        )
    return "\n".join(lines)


def plot(curves: dict[str, list[dict]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = ["reward/total/mean", "actor/entropy", "reward/group_std_unsolved", "rollout/repeat_rate_failed"]
    fig, axes = plt.subplots(1, len(keys), figsize=(4 * len(keys), 3.2))
    for ax, key in zip(axes, keys):
        for label, history in curves.items():
            points = [(h["step"], h[key]) for h in history if key in h]
            ax.plot([p[0] for p in points], [p[1] for p in points], label=label)
        ax.set_title(key)
        ax.set_xlabel("step")
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=90)


if __name__ == "__main__":
    sys.exit(main())
