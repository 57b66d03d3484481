"""The methods around the loop (issue 29) against the plain loop: one SFT checkpoint, one RL round
per method and seed from it, the same held-out benchmark; pass@1 with 95% CIs, the paired gain
over the plain loop of the same seed, and wall time.

    .venv/bin/python benchmarks/compare_methods.py --profile tiny --home /tmp/methods \
        --methods plain,process_turn,process_trajectory --seeds 0,1

A method is a named set of config overrides (METHODS below), applied on top of the profile and
`--set`; everything else (the SFT checkpoint, the prompts, the evaluation seed, the benchmark's
verifiers) is shared, so a difference comes from the method. The evaluation scores the outcome
only, with the profile's own reward config, whatever the method trains on. Writes
benchmarks/results/methods-<profile>.{json,md} and a reward/entropy plot per method.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.compare_algorithms import _mean, evaluator, foundation, held_out, plot  # noqa: E402
from configs import load_profile, parse_override  # noqa: E402
from environments.family import resolve_families  # noqa: E402

# method -> overrides; "plain" is the loop as the profile configures it
METHODS: dict[str, dict] = {
    "plain": {},
    "process_turn": {"reward.process.enabled": True, "reward.process.credit": "turn"},
    "process_trajectory": {"reward.process.enabled": True, "reward.process.credit": "trajectory"},
    # the teacher is --teacher (a checkpoint folder with the student's tokenizer)
    "distill": {"rl.distill.enabled": True},
    "distill_only": {"rl.distill.enabled": True, "rl.distill.with_outcome": False},
    # one round from SFT: the relabels come from the round's own earlier steps (no previous round)
    "hindsight": {"rl.hindsight.enabled": True},
    # step t+1 generated during step t's update, by the weights before it; TIS corrects the lag
    "one_step_off": {"rl.one_step_off_policy": True, "rl.tis_cap": 2.0},
    # RL on the open-ended families too (data.families.explain in --set), rewarded by the judge
    # (--judge: its model); every other method trains on the rule families only
    "judge": {},
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--profile", default="tiny")
    parser.add_argument("--home", type=Path, default=Path("/tmp/methods-compare"))
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--seeds", default="0", help="RL seeds (the SFT checkpoint is shared)")
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.FIELD=VALUE")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    parser.add_argument("--tag", default="", help="suffix of the result files")
    parser.add_argument("--teacher", type=Path, help="the distill methods' teacher: a checkpoint folder")
    parser.add_argument("--judge", type=Path, help="the judge method's judge model (make judge's checkpoint)")
    parser.add_argument(
        "--eval-every", type=int, default=0, help="also score every K steps on --eval-tasks held-out tasks (a curve)"
    )
    parser.add_argument("--eval-tasks", type=int, default=400)
    args = parser.parse_args(argv)
    overrides = dict(parse_override(o) for o in args.set)
    if args.judge is not None:
        overrides["reward.judge.model"] = str(args.judge)
    # the families' default verifiers completed, as the pipeline does (explain's is the judge)
    cfg = resolve_families(load_profile(args.profile, overrides))
    methods, seeds = args.methods.split(","), [int(s) for s in args.seeds.split(",")]
    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        parser.error(f"--methods: unknown {unknown}; known: {sorted(METHODS)}")
    if any(METHODS[m].get("rl.distill.enabled") for m in methods) and args.teacher is None:
        parser.error("--teacher: the distill methods need a teacher checkpoint folder")
    if "judge" in methods and args.judge is None:
        parser.error("--judge: the judge method needs a judge model folder (make judge)")
    if "judge" in methods and not any(cfg.reward.verifiers[f].name == "judge" for f in cfg.data.families):
        parser.error(
            "--methods judge: no family is judged; add an open-ended one, e.g. "
            "--set data.families.explain.train_tasks=200 --set data.families.explain.benchmark_tasks=60"
        )
    if "plain" not in methods:
        methods = ["plain", *methods]  # every gain is paired against it

    import torch

    from assets.resources import SandboxResource
    from environments.families import build_tools
    from environments.family import get_family
    from environments.search import kb_from_rows
    from training.evaluate import mean_ci, paired_difference
    from training.judge import judge_for
    from training.model import load_policy, load_tokenizer
    from training.rl.algorithms import resolve_algorithm
    from training.rl.loop import train_round
    from verifiers.cascade import Cascade

    torch.set_num_threads(cfg.threads)
    training_tasks, benchmark_tasks, knowledge_base, sft = foundation(args.profile, overrides, args.home)
    sft_path = Path(sft["uri"])
    tasks, everything = training_tasks.to_dict("records"), held_out(benchmark_tasks, cfg)
    # pass@1 and its paired CIs are over the rule-decided families; the open-ended ones (judged)
    # are scored apart, so no gain is a judge's opinion
    open_ended = {f for f in cfg.data.families if get_family(f).open_ended}
    bench = [t for t in everything if t["family"] not in open_ended]
    judged_bench = [t for t in everything if t["family"] in open_ended]
    kb = kb_from_rows(knowledge_base.to_dict("records"))
    tok = load_tokenizer(sft_path)
    rows, curves, scores_of = [], {}, {}
    with SandboxResource.from_config(cfg.sandbox).open() as box:
        tools = build_tools(sandbox=box, kb=kb, top_k=cfg.data.knowledge_base.top_k)
        # the same evaluation for every method
        scorer = Cascade(cfg.reward, box, concurrency=cfg.sandbox.pool_size, judge=judge_for(cfg.reward))

        evaluate = evaluator(cfg, tok, bench, tools, scorer)
        evaluate_judged = evaluator(cfg, tok, judged_bench, tools, scorer) if judged_bench else None
        subset = bench[:: max(1, len(bench) // args.eval_tasks)][: args.eval_tasks]
        quick = evaluator(cfg, tok, subset, tools, scorer)

        def subset_pass(model) -> float:
            training = model.training
            with torch.no_grad():
                scores = quick(model.eval())
            model.train(training)
            return sum(scores.values()) / len(scores)

        teacher_pass = None
        if args.teacher is not None:
            teacher_pass = subset_pass(load_policy(args.teacher, cfg.model.dtype))
            print(f"[methods] teacher {args.teacher}: pass@1 {teacher_pass:.3f} on {len(subset)} tasks", flush=True)

        print(f"[methods] SFT checkpoint {sft_path}: evaluating on {len(bench)} held-out tasks", flush=True)
        sft_scores = evaluate(load_policy(sft_path, cfg.model.dtype))
        mean, low, high = mean_ci(list(sft_scores.values()), cfg.benchmark.confidence)
        rows.append({"method": "sft", "seed": None, "pass_at_1": mean, "ci": [low, high]})

        def save() -> Path:
            """The results so far: written after every row, so a stopped run keeps its finished rows."""
            args.out.mkdir(parents=True, exist_ok=True)
            stem = args.out / f"methods-{args.profile}{args.tag}"
            meta = {
                "profile": args.profile,
                "overrides": overrides,
                "methods": {m: METHODS[m] for m in methods},
                "benchmark_tasks": len(bench),
                "teacher": str(args.teacher) if args.teacher else None,
                "teacher_subset_pass_at_1": teacher_pass,
                "eval_every": args.eval_every,
                "eval_tasks": len(subset),
                "steps": cfg.rl.steps_per_round,
                "command": " ".join(["benchmarks/compare_methods.py", *(argv if argv is not None else sys.argv[1:])]),
            }
            stem.with_suffix(".json").write_text(
                json.dumps({"meta": meta, "rows": rows, "histories": curves}, indent=1)
            )
            stem.with_suffix(".md").write_text(to_markdown(rows) + "\n")
            return stem

        for seed in seeds:
            for name in methods:
                mcfg = resolve_families(load_profile(args.profile, {**overrides, **METHODS[name]}))
                algo = resolve_algorithm(mcfg.rl)
                policy = load_policy(sft_path, mcfg.model.dtype)
                reference = (
                    load_policy(sft_path, mcfg.model.dtype).requires_grad_(False).eval()
                    if algo.needs_reference
                    else None
                )
                teacher = load_policy(args.teacher, mcfg.model.dtype) if mcfg.rl.distill.enabled else None
                curve: list[tuple[int, float]] = []

                def progress(
                    step: int,
                    m: dict[str, float],
                    name=name,
                    seed=seed,
                    steps=mcfg.rl.steps_per_round,
                    policy=policy,
                    curve=curve,
                ) -> None:
                    if args.eval_every and step % args.eval_every == 0:
                        curve.append((step, subset_pass(policy)))
                    if step % 5 == 0 or step == steps:
                        print(
                            f"[methods] {name} seed {seed} step {step}/{steps}: reward={m['reward/total/mean']:.3f} "
                            f"pass={m['reward/outcome/pass_rate']:.3f} entropy={m.get('actor/entropy', float('nan')):.3f}",
                            flush=True,
                        )

                started = time.perf_counter()
                result = train_round(
                    policy,
                    reference,
                    tok,
                    tasks if name == "judge" else [t for t in tasks if t["family"] not in open_ended],
                    tools,
                    rl=mcfg.rl,
                    rollout=mcfg.rollout,
                    cascade=Cascade(mcfg.reward, box, concurrency=mcfg.sandbox.pool_size, judge=judge_for(mcfg.reward)),
                    round_index=1,
                    policy_version="sft",
                    seed=seed * 1000 + 1,
                    engine_cfg=mcfg.engine,
                    on_step=progress,
                    teacher=teacher,
                )
                minutes = (time.perf_counter() - started) / 60
                scores = scores_of[(name, seed)] = evaluate(policy)
                mean, low, high = mean_ci(list(scores.values()), cfg.benchmark.confidence)
                row = {
                    "method": name,
                    "seed": seed,
                    "pass_at_1": mean,
                    "ci": [low, high],
                    "gain_over_sft": list(paired_difference(scores, sft_scores, cfg.benchmark.confidence)),
                    "rl_minutes": minutes,
                    "seconds_per_step": 60 * minutes / max(1, len(result.history)),
                    # the step's wait for its batch: the whole generation on-policy, what is left of
                    # it after the previous update when generated ahead (rl.one_step_off_policy)
                    "rollout_wait_s": _mean(result.history, "perf/generate_s"),
                    "final_entropy": result.history[-1].get("actor/entropy"),
                    # the open-ended families' pass@1 as the judge scores it (not in the gains)
                    "judged_pass_at_1": _mean_score(evaluate_judged(policy)) if evaluate_judged else None,
                    "mean_tool_error_rate": _mean(result.history, "rollout/tool_error_rate"),
                    "eval_curve": curve,
                    "steps_to_teacher": next((st for st, p in curve if p >= teacher_pass), None)
                    if teacher_pass is not None
                    else None,
                }
                if name != "plain":
                    plain = scores_of[("plain", seed)]
                    row["gain_over_plain"] = list(paired_difference(scores, plain, cfg.benchmark.confidence))
                rows.append(row)
                curves[f"{name}/{seed}"] = result.history
                save()
                print(
                    f"[methods] {name} seed {seed}: pass@1 {mean:.3f} [{low:.3f}, {high:.3f}]"
                    + (
                        f", vs plain {row['gain_over_plain'][0]:+.3f} [{row['gain_over_plain'][1]:+.3f}, {row['gain_over_plain'][2]:+.3f}]"
                        if "gain_over_plain" in row
                        else ""
                    )
                    + f" ({minutes:.1f} min)",
                    flush=True,
                )
    stem = save()
    table = to_markdown(rows)
    plot(curves, stem.with_suffix(".png"))
    print("\n" + table)
    return 0


def _mean_score(scores: dict[str, float]) -> float:
    return sum(scores.values()) / max(1, len(scores))


def _ci(values: list[float] | None) -> str:
    return f"**{values[0]:+.3f}** [{values[1]:+.3f}, {values[2]:+.3f}]" if values else "-"


def _reached(row: dict) -> str:
    if not row.get("eval_curve"):
        return "-"
    return str(row["steps_to_teacher"]) if row.get("steps_to_teacher") is not None else "not reached"


def to_markdown(rows: list[dict]) -> str:
    lines = [
        "| method | seed | pass@1 [95% CI] | vs plain loop [paired 95% CI] | vs SFT [paired 95% CI] | RL minutes | s / step | of which waiting for rollouts | steps to the teacher's pass@1 | judged pass@1 (open-ended) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        minutes = f"{r['rl_minutes']:.1f}" if "rl_minutes" in r else "-"
        per_step = f"{r['seconds_per_step']:.1f}" if "seconds_per_step" in r else "-"
        waiting = f"{r['rollout_wait_s']:.1f}" if r.get("rollout_wait_s") is not None else "-"
        judged = f"{r['judged_pass_at_1']:.3f}" if r.get("judged_pass_at_1") is not None else "-"
        lines.append(
            f"| {r['method']} | {r['seed'] if r['seed'] is not None else '-'} "
            f"| {r['pass_at_1']:.3f} [{r['ci'][0]:.3f}, {r['ci'][1]:.3f}] | {_ci(r.get('gain_over_plain'))} "
            f"| {_ci(r.get('gain_over_sft'))} | {minutes} | {per_step} | {waiting} | {_reached(r)} | {judged} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
