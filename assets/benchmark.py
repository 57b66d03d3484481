"""Benchmark a checkpoint on the held-out tasks, register it, and run the promotion gate."""

import math

import pandas as pd
import torch
from dagster import AssetExecutionContext, AutomationCondition, Failure, MetadataValue, Output, asset

from assets.agent_model import log_agent_model
from assets.artifacts import MANIFEST, read_manifest
from assets.data import search_retriever
from assets.launcher import JobLauncher
from assets.locks import round_lock
from assets.plots import bars_png, markdown_image
from assets.policies import FLAKY_STEP_RETRY, GPU_POOL
from assets.resources import ArtifactStore, FlywheelSettings, SandboxResource
from assets.rl import rl_rounds, round_health
from assets.sft import load_checkpoint, records
from assets.tracking import CHALLENGER, CHAMPION, ChampionChanged, MLflowTracker
from environments.families import build_tools
from environments.search import kb_from_rows
from training.agent.chat import prompt_ids
from training.agent.engines import build_rollout_engine
from training.data_parallel import DataParallel
from training.evaluate import evaluate_policy, gate_scores, promotion_decision, suite_summary, summarize
from training.judge import judge_for
from verifiers.cascade import Cascade


def evaluate_checkpoint(
    cfg, storage: ArtifactStore, sandbox: SandboxResource, pointer: dict, task_rows: list[dict], kb_rows: list[dict]
) -> tuple[dict, dict[str, float]]:
    """The checkpoint on the benchmark: (summary, per-task mean score). Sampled pass@1 over
    `samples_per_task`, and greedy pass@1 when `benchmark.greedy`. Wherever it runs: in the step,
    or launched through Pipes (assets/jobs.py), where each rank scores its share of the tasks
    (sampling is keyed to the task, so the split does not change what is sampled)."""
    torch.set_num_threads(cfg.threads)
    model, tok = load_checkpoint(storage, pointer, cfg.model.dtype, cfg.device)
    bench = cfg.benchmark
    dp = DataParallel.current()
    mine = dp.mine([t for t in task_rows if t["split"] not in bench.suites])  # the held-out tasks: the gate's
    kb = kb_from_rows(kb_rows)
    with sandbox.open() as box:
        tools = build_tools(
            sandbox=box, kb=kb, top_k=cfg.data.knowledge_base.top_k, retriever=search_retriever(storage, kb)
        )
        cascade = Cascade(cfg.reward, box, concurrency=cfg.sandbox.pool_size, judge=judge_for(cfg.reward))
        common = dict(
            tools=tools,
            rollout=cfg.rollout,
            cascade=cascade,
            seed=cfg.seed,
            batch_size=bench.batch_size,
            temperature=bench.temperature,
        )
        engine = build_rollout_engine(engine_budget(cfg), model, tok, seed=cfg.seed)
        try:
            sampled = dp.gather(
                evaluate_policy(engine, tok, mine, samples_per_task=bench.samples_per_task, greedy=False, **common)
            )
            greedy = (
                dp.gather(evaluate_policy(engine, tok, mine, samples_per_task=1, greedy=True, **common))
                if bench.greedy
                else None
            )
            suites = {
                name: evaluate_suite(
                    cfg, name, [t for t in task_rows if t["split"] == name], engine, tok, tools, box, dp
                )
                for name in bench.suites
            }
        finally:
            engine.close()
    summary = summarize(sampled, bench.confidence, bench.pass_at_k)
    summary["greedy_pass_at_1"] = (
        summarize(greedy, bench.confidence)["pass_at_1"] if greedy is not None else float("nan")
    )
    for figures in suites.values():
        summary.update(figures)
    return summary, gate_scores(sampled, bench.gate_k)


def engine_budget(cfg):
    """The rollout settings the benchmark's engine is built with: the largest budget of the
    held-out tasks and every suite (vLLM fixes its context length when it starts; a suite's longer
    episodes would otherwise be refused). Each episode still runs under its own budget."""
    suites = cfg.benchmark.suites.values()
    return cfg.rollout.model_copy(
        update={
            "max_total_tokens": max([cfg.rollout.max_total_tokens, *(s.max_total_tokens or 0 for s in suites)]),
            "max_new_tokens_per_turn": max(
                [cfg.rollout.max_new_tokens_per_turn, *(s.max_new_tokens_per_turn or 0 for s in suites)]
            ),
        }
    )


def evaluate_suite(cfg, name: str, tasks: list[dict], engine, tok, tools, box, dp: DataParallel) -> dict[str, float]:
    """A `benchmark.suites` entry: its own budgets, samples and verifier. A prompt that does not
    leave room for an answer within the budget is scored 0 and counted (`<name>.over_budget`),
    not run: the model never sees a prompt it cannot answer, and the figure says how many."""
    suite = cfg.benchmark.suites[name]
    budgets = {"max_total_tokens": suite.max_total_tokens, "max_new_tokens_per_turn": suite.max_new_tokens_per_turn}
    rollout = cfg.rollout.model_copy(update={k: v for k, v in budgets.items() if v is not None})
    reward = cfg.reward
    if suite.verifier is not None:
        reward = reward.model_copy(
            update={"verifiers": {**reward.verifiers, **{t["family"]: suite.verifier for t in tasks}}}
        )
    room = min(rollout.max_new_tokens_per_turn, 8)  # an answer needs a few tokens at least
    fits = [t for t in tasks if len(prompt_ids(tok, t, rollout.system_prompt)) + room <= rollout.max_total_tokens]
    cascade = Cascade(reward, box, concurrency=cfg.sandbox.pool_size, judge=judge_for(reward))
    rows = dp.gather(
        evaluate_policy(
            engine,
            tok,
            dp.mine(fits),
            tools=tools,
            rollout=rollout,
            cascade=cascade,
            seed=cfg.seed,
            batch_size=cfg.benchmark.batch_size,
            temperature=cfg.benchmark.temperature,
            samples_per_task=suite.samples_per_task,
            greedy=False,
        )
    )
    fitting = {t["task_id"] for t in fits}
    rows += [
        {
            "task_id": t["task_id"],
            "family": t["family"],
            "level": int(t["level"]),
            "score": 0.0,
            "samples": suite.samples_per_task,
            "solved": 0,
            "tool_call_rate": 0.0,
            "turns": 0.0,
        }
        for t in tasks
        if t["task_id"] not in fitting
    ]
    return suite_summary(name, rows, len(tasks) - len(fits), cfg.benchmark.confidence, suite.pass_at_k)


def score_checkpoint(
    context: AssetExecutionContext,
    settings: FlywheelSettings,
    storage: ArtifactStore,
    sandbox: SandboxResource,
    launcher: JobLauncher,
    pointer: dict,
    tasks: pd.DataFrame,
    tasks_asset: str,
    knowledge_base: pd.DataFrame,
) -> tuple[dict, dict[str, float]]:
    """(summary, per-task score) of the checkpoint, in the step or as a launched job that reads the
    stored `tasks_asset` and knowledge base itself and reports back through Pipes."""
    if not launcher.external:
        return evaluate_checkpoint(settings.config, storage, sandbox, pointer, records(tasks), records(knowledge_base))
    extras = {
        "profile": settings.profile,
        "overrides_json": settings.overrides_json,
        "storage_root": storage.root,
        "cache_dir": storage.cache_dir,
        "pointer": pointer,
        "tasks_asset": tasks_asset,
    }
    invocation = launcher.launch(context, "benchmark", extras)
    [scores] = [m for m in invocation.get_custom_messages() if isinstance(m, dict) and "summary" in m]
    return scores["summary"], scores["per_task"]


def benchmark_checkpoint(
    context: AssetExecutionContext,
    *,
    settings: FlywheelSettings,
    storage: ArtifactStore,
    sandbox: SandboxResource,
    tracker: MLflowTracker,
    launcher: JobLauncher,
    pointer: dict,
    tasks: pd.DataFrame,
    knowledge_base: pd.DataFrame,
    stage: str,
    asset_name: str,
    blocked_by: str = "",
) -> Output[dict]:
    """`blocked_by`: why this checkpoint may not be promoted whatever its score (empty: it may)."""
    bench = settings.config.benchmark
    summary, per_task = score_checkpoint(
        context, settings, storage, sandbox, launcher, pointer, tasks, "benchmark_tasks", knowledge_base
    )

    champion = tracker.version_by_alias(CHAMPION)
    champion_scores = tracker.load_json(champion.run_id, "per_task_scores.json") if champion else None
    # per-task pass@k of another k: not comparable
    if champion is not None and tracker.gate_k(champion.run_id) != bench.gate_k:
        raise Failure(
            description=f"benchmark.gate_k={bench.gate_k}, but the champion (version {champion.version}) was scored with "
            f"gate_k={tracker.gate_k(champion.run_id)}: per-task scores of different k cannot be compared; "
            f"set benchmark.gate_k={tracker.gate_k(champion.run_id)}",
            allow_retries=False,
        )
    decision = promotion_decision(per_task, champion_scores, bench.confidence, bench.promotion_margin)
    if blocked_by:  # a collapsed round is never promoted, however it scores (rl.collapse.action: block)
        decision = {**decision, "promote": False}
    folder = storage.local_path(pointer["uri"])
    with tracker.run(
        context, asset_name, {"benchmark": bench.model_dump(), "stage": stage, "checkpoint": pointer["uri"]}
    ) as run_id:
        tracker.log_metrics(run_id, summary)
        tracker.log_json(run_id, per_task, "per_task_scores.json")
        tracker.client().set_tag(run_id, "gate_k", str(bench.gate_k))  # what per_task_scores.json holds
        version = tracker.register_model(
            run_id,
            lambda: log_agent_model(run_id, folder, settings.config, records(knowledge_base), summary),
            {
                "stage": stage,
                "round": context.partition_key if context.has_partition_key else "",
                "checkpoint_uri": pointer["uri"],
                "checkpoint_run": read_manifest(folder / MANIFEST, pointer["uri"]).get("dagster_run_id")
                or context.run_id,
                **({"blocked_by": blocked_by} if blocked_by else {}),
            },
        )
        decision, skipped = apply_gate(
            tracker, str(version.version), str(champion.version) if champion else None, decision
        )
        tracker.log_metrics(run_id, {f"vs_champion/{k}": float(v) for k, v in decision.items()})
        rows = tracker.version_rows()  # one read of every version's run: the plot and the table
        png = pass_at_1_by_version(rows)
        table = pd.DataFrame(rows).to_markdown(index=False, floatfmt=".3f")
        # the round's (or foundation's) parent run shows the headline figures in the runs list
        headline = {k: summary[k] for k in ("pass_at_1", "pass_at_1_ci_low", "pass_at_1_ci_high", "greedy_pass_at_1")}
        parent = tracker.parent_of(run_id)
        for target in (run_id, parent):
            tracker.log_png(target, png, "pass_at_1_by_version.png")
            tracker.log_text(target, table, "benchmark_table.md")
        tracker.log_metrics(parent, {**headline, "promoted": float(decision["promote"])})
        tracker.client().set_tag(parent, "model_version", str(version.version))
    context.log.info(
        f"{stage} checkpoint pass@1={summary['pass_at_1']:.3f} -> version {version.version} is {'champion' if decision['promote'] else 'challenger'}"
        + (f" (promotion blocked: {blocked_by})" if blocked_by else "")
        + (f" (promotion skipped: {skipped})" if skipped else "")
    )
    level_table = pd.DataFrame(
        [
            {"family_level": f"{k.split('/')[0]} {k.split('/')[1]}", "metric": k.split("/")[2], "value": v}
            for k, v in summary.items()
            if k.count("/") == 2
        ]
    )
    families = sorted({k.split("/")[0] for k in summary if k.count("/") == 1 and k.endswith("/pass_at_1")})
    return Output(
        {
            "stage": stage,
            "version": str(version.version),
            "mlflow_run_id": run_id,
            "promoted": bool(decision["promote"]),
            "blocked_by": blocked_by,
            "promotion_skipped": skipped,
            **summary,
            **decision,
        },
        metadata={
            "pass_at_1": summary["pass_at_1"],
            "pass_at_1_ci": f"[{summary['pass_at_1_ci_low']:.3f}, {summary['pass_at_1_ci_high']:.3f}]",
            "greedy_pass_at_1": summary["greedy_pass_at_1"],
            "tool_call_rate": summary["tool_call_rate"],
            "mean_turns": summary["mean_turns"],
            **{
                f"pass_at_{k}": summary[f"pass_at_{k}"]
                for k in settings.config.benchmark.pass_at_k
                if f"pass_at_{k}" in summary
            },
            "model_version": version.version,
            "alias": CHAMPION if decision["promote"] else CHALLENGER,
            "mlflow_run_id": run_id,
            "mlflow_run": tracker.run_link(run_id),
            "model_version_page": tracker.version_link(version.version),
            "promotion_blocked_by": blocked_by or "nothing",
            "promotion_skipped": skipped or "no",
            "diff_vs_champion": MetadataValue.json({k: float(v) for k, v in decision.items()}),
            **{f"{f}_pass_at_1": summary[f"{f}/pass_at_1"] for f in families},
            "by_family": MetadataValue.md(
                pd.DataFrame(
                    {
                        f: {
                            m: summary[f"{f}/{m}"]
                            for m in ("pass_at_1", "pass_at_1_ci_low", "pass_at_1_ci_high", "tool_call_rate")
                        }
                        for f in families
                    }
                ).T.to_markdown()
            ),
            "by_level": MetadataValue.md(
                level_table.pivot(index="family_level", columns="metric", values="value").to_markdown()
            ),
            **suite_metadata(summary, bench.suites),
            "pass_at_1_by_version": markdown_image(png, "pass@1 by version"),
            "benchmark_table": MetadataValue.md(table),
        },
    )


def suite_metadata(summary: dict, suites: dict) -> dict:
    """`<suite>_pass_at_1` and a table of every suite's figures (pass@1 and pass@k with CIs, tasks,
    prompts over budget) for the Dagster UI; MLflow has them as `<suite>.<metric>`."""
    if not suites:
        return {}
    table = pd.DataFrame(
        {
            name: {m.removeprefix(name + "."): v for m, v in summary.items() if m.startswith(name + ".")}
            for name in suites
        }
    ).T
    return {
        **{f"{name}_pass_at_1": summary[f"{name}.pass_at_1"] for name in suites},
        "suites": MetadataValue.md(table.to_markdown(floatfmt=".3f")),
    }


def apply_gate(tracker: MLflowTracker, version: str, compared: str | None, decision: dict) -> tuple[dict, str]:
    """Give `version` the alias the gate decided, against `compared` (the champion the gate read).
    The promotion is a compare-and-set (MLflowTracker.promote): if another run moved the champion
    meanwhile, this comparison is stale, so the version becomes challenger and the reason is
    returned (and tagged on it); `make promote` then compares it against the new champion.
    Returns the decision as applied and why a promotion was skipped ("" if it was not)."""
    skipped = ""
    if compared == version:  # this checkpoint's version, promoted by an earlier attempt of this step
        decision = {**decision, "promote": True}
    elif decision["promote"]:
        try:
            tracker.promote(version, "gate", expected=compared)
        except ChampionChanged as exc:
            decision, skipped = {**decision, "promote": False}, str(exc)
    if not decision["promote"]:
        tracker.set_alias(CHALLENGER, version)
    tracker.client().set_model_version_tag(
        tracker.registered_model, version, "promoted", str(bool(decision["promote"])).lower()
    )
    return decision, skipped


def pass_at_1_by_version(rows: list[dict]) -> bytes:
    scored = [r for r in rows if not math.isnan(r["pass_at_1"])]
    return bars_png(
        [f"v{r['version']} {r['stage']}{r['round']}" for r in scored],
        [r["pass_at_1"] for r in scored],
        [r["ci_low"] if not math.isnan(r["ci_low"]) else r["pass_at_1"] for r in scored],
        [r["ci_high"] if not math.isnan(r["ci_high"]) else r["pass_at_1"] for r in scored],
        "held-out pass@1 by model version",
    )


@asset(
    group_name="benchmark",
    pool=GPU_POOL,
    retry_policy=FLAKY_STEP_RETRY,
    description="The base model, zero-shot with the system prompt, on the held-out benchmark: the baseline of SFT's gain. "
    "Logged to MLflow, not registered (benchmark.include_base).",
)
def base_benchmark_scores(
    context: AssetExecutionContext,
    settings: FlywheelSettings,
    storage: ArtifactStore,
    sandbox: SandboxResource,
    tracker: MLflowTracker,
    launcher: JobLauncher,
    base_model: dict,
    benchmark_tasks: pd.DataFrame,
    knowledge_base: pd.DataFrame,
) -> Output[dict]:
    summary, per_task = score_checkpoint(
        context, settings, storage, sandbox, launcher, base_model, benchmark_tasks, "benchmark_tasks", knowledge_base
    )
    with tracker.run(
        context,
        "base_benchmark_scores",
        {"benchmark": settings.config.benchmark.model_dump(), "stage": "base", "checkpoint": base_model["uri"]},
    ) as run_id:
        tracker.log_metrics(run_id, summary)
        tracker.log_json(run_id, per_task, "per_task_scores.json")
    context.log.info(f"base model pass@1={summary['pass_at_1']:.3f} (tool-call rate {summary['tool_call_rate']:.3f})")
    families = sorted({k.split("/")[0] for k in summary if k.count("/") == 1 and k.endswith("/pass_at_1")})
    return Output(
        {"stage": "base", "mlflow_run_id": run_id, **summary},
        metadata={
            "pass_at_1": summary["pass_at_1"],
            "pass_at_1_ci": f"[{summary['pass_at_1_ci_low']:.3f}, {summary['pass_at_1_ci_high']:.3f}]",
            "tool_call_rate": summary["tool_call_rate"],
            "mlflow_run": tracker.run_link(run_id),
            **{f"{f}_pass_at_1": summary[f"{f}/pass_at_1"] for f in families},
            **suite_metadata(summary, settings.config.benchmark.suites),
        },
    )


@asset(
    group_name="benchmark",
    pool=GPU_POOL,
    retry_policy=FLAKY_STEP_RETRY,
    automation_condition=AutomationCondition.eager(),
    description="SFT checkpoint on the held-out benchmark; registered as a model version.",
)
def sft_benchmark_scores(
    context: AssetExecutionContext,
    settings: FlywheelSettings,
    storage: ArtifactStore,
    sandbox: SandboxResource,
    tracker: MLflowTracker,
    launcher: JobLauncher,
    sft_checkpoint: dict,
    benchmark_tasks: pd.DataFrame,
    knowledge_base: pd.DataFrame,
) -> Output[dict]:
    return benchmark_checkpoint(
        context,
        settings=settings,
        storage=storage,
        sandbox=sandbox,
        tracker=tracker,
        launcher=launcher,
        pointer=sft_checkpoint,
        tasks=benchmark_tasks,
        knowledge_base=knowledge_base,
        stage="sft",
        asset_name="sft_benchmark_scores",
    )


@asset(
    group_name="benchmark",
    partitions_def=rl_rounds,
    pool=GPU_POOL,
    retry_policy=FLAKY_STEP_RETRY,
    description="A round's RL checkpoint on the held-out benchmark; promotion gate.",
)
def benchmark_scores(
    context: AssetExecutionContext,
    settings: FlywheelSettings,
    storage: ArtifactStore,
    sandbox: SandboxResource,
    tracker: MLflowTracker,
    launcher: JobLauncher,
    rl_checkpoint: dict,
    benchmark_tasks: pd.DataFrame,
    knowledge_base: pd.DataFrame,
) -> Output[dict]:
    collapse = settings.config.rl.collapse
    health = round_health(rl_checkpoint, collapse)
    blocked_by = (
        f"collapse early-warning ({', '.join(w.signal for w in health.warnings)})"
        if health.collapsed and collapse.action == "block"
        else ""
    )
    # no run of this round may replace the checkpoint while it is scored and registered
    with round_lock(storage.cache_dir, context):
        return benchmark_checkpoint(
            context,
            settings=settings,
            storage=storage,
            sandbox=sandbox,
            tracker=tracker,
            launcher=launcher,
            pointer=rl_checkpoint,
            tasks=benchmark_tasks,
            knowledge_base=knowledge_base,
            stage="rl",
            asset_name="benchmark_scores",
            blocked_by=blocked_by,
        )
