"""One RL round as one materialization: rollouts, rewards, the checkpoint and the task pool,
partitioned by round.

The engines stay loaded for all of the round's on-policy steps (reloading per step would
dominate at real scale); the four products are still separate assets with their own checks.
The round samples training tasks by the curriculum weights of the previous round's task pool.
A round starts from the current `champion` in the MLflow registry (or the SFT checkpoint) and
keeps the SFT checkpoint as the frozen KL reference.
"""

import json
import shutil
from dataclasses import asdict
from pathlib import Path

import pandas as pd
import torch
from dagster import (
    AssetCheckResult,
    AssetCheckSeverity,
    AssetExecutionContext,
    AssetKey,
    AssetOut,
    DynamicPartitionsDefinition,
    MetadataValue,
    Output,
    asset_check,
    multi_asset,
)

from assets.artifacts import exists
from assets.contracts import contract_check
from assets.data import search_retriever
from assets.io import read_stored_frame
from assets.launcher import JobLauncher
from assets.locks import round_lock
from assets.plots import curves_png, markdown_image
from assets.policies import FLAKY_STEP_RETRY, GPU_POOL
from assets.reports import sample_trajectories_md
from assets.resources import ArtifactStore, FlywheelSettings, SandboxResource
from assets.sft import load_checkpoint, records
from assets.tracking import CHAMPION, MLflowTracker
from configs.schema import CollapseConfig
from environments.families import build_tools
from environments.search import kb_from_rows
from training.data_parallel import DataParallel
from training.judge import judge_for
from training.lora import apply_lora, merged
from training.model import save_checkpoint
from training.rl.algorithms import resolve_algorithm
from training.rl.collapse import CollapseReport, detect_collapse
from training.rl.curriculum import pool_frame, pool_weights, update_history
from training.rl.hindsight import relabel_all
from training.rl.loop import RoundResult, train_round
from training.rl.scoring import reward_summary, tier_table
from verifiers.cascade import Cascade, TierStats

rl_rounds = DynamicPartitionsDefinition(name="rl_round")


def round_number(key: str) -> int:
    """A round partition's number. Users add partitions in the UI by typing a name, so anything
    but a positive integer is refused with what to type instead."""
    if not key.isdigit() or int(key) < 1:
        raise ValueError(
            f"rl_round partition {key!r} is not a round number: name round partitions 1, 2, 3, ... "
            f"(the next one is what `make run` or the retrain schedule would add)"
        )
    return int(key)


def round_numbers(instance) -> list[int]:
    """The instance's round partitions that are round numbers, ascending (a mistyped one is skipped
    here and refused when it is run)."""
    return sorted(int(k) for k in instance.get_dynamic_partitions(rl_rounds.name) if k.isdigit() and int(k) >= 1)


def next_round(instance) -> int:
    return max(round_numbers(instance), default=0) + 1


CURVE_KEYS = [
    "reward/total/mean",
    "reward/outcome/pass_rate",
    "actor/entropy",
    "reward/total/std",
    "actor/kl_ref",
    "rollout/tool_call_rate",
]
# The early-warning signals (training/rl/collapse.py), plotted together so a trend is visible at a glance.
HEALTH_KEYS = [
    "actor/entropy",
    "reward/group_std_unsolved",
    "rollout/stuck_frac",
    "rollout/repeat_rate_failed",
    "actor/approx_kl",
    "actor/clip_frac",
    "actor/grad_norm",
]
# Rollout engine vs trainer: the log-prob gap on the recorded tokens (docs/rollout.md has the bound) and the cost of a step.
ENGINE_KEYS = ["rollout/logprob_mismatch_max", "rollout/logprob_mismatch_mean", "perf/generate_s", "perf/step_s"]


def starting_point(tracker: MLflowTracker, sft_checkpoint: dict, init_from: str) -> tuple[dict, str]:
    champion = tracker.version_by_alias(CHAMPION) if init_from == "champion" else None
    if champion is None or "checkpoint_uri" not in champion.tags:
        return sft_checkpoint, "sft"
    return {"uri": champion.tags["checkpoint_uri"]}, f"v{champion.version}"


def distill_teacher(tracker: MLflowTracker, sft_checkpoint: dict, teacher: str) -> dict:
    """The checkpoint `rl.distill.teacher` names: the champion's, the SFT one, or a folder."""
    if teacher == "sft":
        return sft_checkpoint
    if teacher == "champion":
        champion = tracker.version_by_alias(CHAMPION)
        if champion is None or "checkpoint_uri" not in champion.tags:
            raise ValueError("rl.distill.teacher=champion, but the registry has no champion with a checkpoint yet")
        return {"uri": champion.tags["checkpoint_uri"]}
    return {"uri": teacher}


def same_tokenizer(student, teacher, where: str) -> None:
    """Distillation compares log-probs token by token: the two must split text the same way."""
    if student.get_vocab() != teacher.get_vocab():
        raise ValueError(
            f"rl.distill.teacher {where}: its tokenizer differs from the student's "
            f"({len(teacher.get_vocab())} vs {len(student.get_vocab())} entries); distillation needs the same one"
        )


def previous_pool(context: AssetExecutionContext, storage: ArtifactStore, round_index: int) -> dict[str, dict]:
    """The task pool the latest earlier round stored ({} before the first)."""
    earlier = [k for k in reversed(round_numbers(context.instance)) if k < round_index]
    for key in earlier:
        frame = read_stored_frame(storage.uri("assets"), "task_pool", str(key))
        if frame is not None:
            return {str(r["task_id"]): r for r in frame.to_dict("records") if r["attempts"] > 0}
    return {}


def previous_rollouts(context: AssetExecutionContext, storage: ArtifactStore, round_index: int) -> int | None:
    """The latest earlier round whose rewards are stored (None before the first): hindsight
    relabeling (rl.hindsight) starts a round from its corrected examples. Only looks; the round's
    job reads the frames (`hindsight_examples`)."""
    for key in reversed(round_numbers(context.instance)):
        if key < round_index and exists(storage.uri("assets", "verified_rewards", f"{key}.parquet")):
            return key
    return None


def hindsight_examples(storage: ArtifactStore, round_key: int | None, tasks: list[dict], tokenizer) -> list[dict]:
    """Round `round_key`'s failed trajectories that showed the answer, relabeled (training/rl/hindsight.py)."""
    if round_key is None:
        return []
    rollouts = read_stored_frame(storage.uri("assets"), "rollout_batches", str(round_key))
    rewards = read_stored_frame(storage.uri("assets"), "verified_rewards", str(round_key))
    if rollouts is None or rewards is None:
        return []
    outcome = dict(zip(rewards["trajectory_id"], rewards["outcome"]))
    rows = rollouts.to_dict("records")
    scores = [{"outcome": outcome.get(r["trajectory_id"])} for r in rows]
    return relabel_all(rows, scores, {t["task_id"]: t for t in tasks}, tokenizer)


@multi_asset(
    group_name="rl",
    partitions_def=rl_rounds,
    outs={
        "rollout_batches": AssetOut(
            description="Every trajectory sampled in the round (ids, tool_mask, behaviour logprobs)."
        ),
        "verified_rewards": AssetOut(
            description="Reward and its components per trajectory; recomputable from rollouts."
        ),
        "rl_checkpoint": AssetOut(description="The policy at the end of the round (HF folder)."),
        "task_pool": AssetOut(
            description="Pass-rate history per training task after this round, and its weight in the next (curriculum)."
        ),
    },
    deps=[AssetKey("sft_benchmark_scores")],  # the SFT version must be registered before round 1 looks up the champion
    pool=GPU_POOL,
    retry_policy=FLAKY_STEP_RETRY,
)
def rl_round(
    context: AssetExecutionContext,
    settings: FlywheelSettings,
    storage: ArtifactStore,
    sandbox: SandboxResource,
    tracker: MLflowTracker,
    launcher: JobLauncher,
    training_tasks: pd.DataFrame,
    sft_checkpoint: dict,
    knowledge_base: pd.DataFrame,
):
    # One run at a time per round (assets/locks.py): a second launch stops here, before it reads or writes the round's resume state or checkpoint.
    with round_lock(storage.cache_dir, context):
        yield from train_round_partition(
            context, settings, storage, sandbox, tracker, launcher, training_tasks, sft_checkpoint, knowledge_base
        )


def fit_round(
    cfg,
    storage: ArtifactStore,
    sandbox: SandboxResource,
    init: dict,
    init_version: str,
    sft_checkpoint: dict,
    tasks: list[dict],
    knowledge_base: list[dict],
    weights: dict[str, float],
    round_index: int,
    on_step,
    provenance: dict | None = None,
    teacher: dict | None = None,
    hindsight_from: int | None = None,
) -> tuple[RoundResult, str]:
    """The round's work, wherever it runs (in the step, or launched through Dagster Pipes by
    assets/jobs.py, data-parallel under torchrun): train from `init`, save the `rl` checkpoint
    (rank 0), and return (result, checkpoint uri). Collective across ranks. `hindsight_from`: the
    earlier round whose corrected examples start this one's (rl.hindsight)."""
    torch.set_num_threads(cfg.threads)
    policy, tok = load_checkpoint(storage, init, cfg.model.dtype, cfg.device)
    policy = apply_lora(policy, cfg.model.lora)
    reference = None  # kl_coef = 0 (e.g. DAPO, GSPO): no KL term, so the reference model is never loaded
    if resolve_algorithm(cfg.rl).needs_reference:
        reference, _ = load_checkpoint(storage, sft_checkpoint, cfg.model.dtype, cfg.rl.reference_device or cfg.device)
        reference.requires_grad_(False).eval()
    teacher_model = None
    if cfg.rl.distill.enabled:  # on-policy distillation: the teacher scores the student's tokens
        teacher_model, teacher_tok = load_checkpoint(
            storage, teacher, cfg.model.dtype, cfg.rl.reference_device or cfg.device
        )
        same_tokenizer(tok, teacher_tok, teacher["uri"])
    # Resumable state lives on local disk next to the artifact cache: a re-executed round continues from it.
    state_dir = Path(storage.cache_dir) / "rl-state" / f"round-{round_index}"
    with sandbox.open() as box:
        kb = kb_from_rows(knowledge_base)
        tools = build_tools(
            sandbox=box, kb=kb, top_k=cfg.data.knowledge_base.top_k, retriever=search_retriever(storage, kb)
        )
        result = train_round(
            policy,
            reference,
            tok,
            tasks,
            tools,
            rl=cfg.rl,
            rollout=cfg.rollout,
            cascade=Cascade(cfg.reward, box, concurrency=cfg.sandbox.pool_size, judge=judge_for(cfg.reward)),
            round_index=round_index,
            policy_version=init_version,
            seed=cfg.seed * 1000 + round_index,
            on_step=on_step,
            task_weights=weights,
            engine_cfg=cfg.engine,
            state_dir=state_dir,
            device=cfg.device,
            gradient_checkpointing=cfg.model.gradient_checkpointing,
            teacher=teacher_model,
            hindsight_examples=hindsight_examples(storage, hindsight_from, tasks, tok),
        )
    dp = DataParallel.current()
    uri = ""
    if dp.leader:
        with storage.writable_dir("checkpoints", "rl", f"round-{round_index}", provenance=provenance) as (path, uri):
            save_checkpoint(merged(result.policy), tok, path)
        shutil.rmtree(state_dir, ignore_errors=True)  # the round's output now exists; its resume state is spent
    dp.barrier()
    return result, uri


def round_log_line(round_index: int, steps: int, step: int, metrics: dict[str, float]) -> str:
    shown = (
        "reward/total/mean",
        "reward/outcome/pass_rate",
        "rollout/tool_call_rate",
        "actor/entropy",
        "loss/kl",
        "rollout/logprob_mismatch_max",
        "perf/step_s",
    )
    return f"round {round_index} step {step}/{steps}: " + ", ".join(
        f"{k}={metrics[k]:.3f}" for k in shown if k in metrics
    )


def train_round_partition(
    context: AssetExecutionContext,
    settings: FlywheelSettings,
    storage: ArtifactStore,
    sandbox: SandboxResource,
    tracker: MLflowTracker,
    launcher: JobLauncher,
    training_tasks: pd.DataFrame,
    sft_checkpoint: dict,
    knowledge_base: pd.DataFrame,
):
    cfg = settings.config
    round_index = round_number(context.partition_key)
    init, init_version = starting_point(tracker, sft_checkpoint, cfg.rl.init_from)
    teacher = distill_teacher(tracker, sft_checkpoint, cfg.rl.distill.teacher) if cfg.rl.distill.enabled else None
    algorithm = resolve_algorithm(cfg.rl)
    tasks = records(training_tasks)
    history = previous_pool(context, storage, round_index)
    hindsight_from = previous_rollouts(context, storage, round_index) if cfg.rl.hindsight.enabled else None
    weights = pool_weights([t["task_id"] for t in tasks], history, cfg.rl.curriculum)
    params = {
        "rl": cfg.rl.model_dump(),
        "algorithm": asdict(algorithm),
        "engine": cfg.engine.model_dump(),
        "rollout": cfg.rollout.model_dump(),
        "reward": cfg.reward.model_dump(),
        "init_version": init_version,
        "launcher": launcher.kind,
        "nproc_per_node": launcher.nproc_per_node,
    }
    with tracker.run(context, "rl_round", params) as run_id:
        if launcher.external:  # the job reads the stored tasks itself and reports back through Pipes
            extras = {
                "profile": settings.profile,
                "overrides_json": settings.overrides_json,
                "storage_root": storage.root,
                "cache_dir": storage.cache_dir,
                "init": init,
                "init_version": init_version,
                "sft_checkpoint": sft_checkpoint,
                "weights": weights,
                "round": round_index,
                "provenance": settings.provenance(context.run_id),
                "teacher": teacher,
                "hindsight_from": hindsight_from,
            }
            result, uri = round_result(storage, launcher.launch(context, "rl_round", extras))
        else:
            result, uri = fit_round(
                cfg,
                storage,
                sandbox,
                init,
                init_version,
                sft_checkpoint,
                tasks,
                records(knowledge_base),
                weights,
                round_index,
                lambda step, m: context.log.info(round_log_line(round_index, cfg.rl.steps_per_round, step, m)),
                settings.provenance(context.run_id),
                teacher=teacher,
                hindsight_from=hindsight_from,
            )
        if result.resumed_from_step:
            context.log.info(f"round {round_index} resumed from its step-{result.resumed_from_step} state checkpoint")
        tracker.log_history(run_id, result.history)
        summary = reward_summary(result.rewards, result.tier_stats, result.disagreements)
        tracker.log_metrics(run_id, {f"round/{k}": v for k, v in summary.items()})
        png = curves_png(result.history, CURVE_KEYS, f"RL round {round_index} ({cfg.rl.algorithm})")
        tracker.log_png(run_id, png, "rl_curves.png")
        health = detect_collapse(result.history, cfg.rl.collapse)
        health_png = curves_png(result.history, HEALTH_KEYS, f"RL round {round_index}: collapse early-warning signals")
        tracker.log_png(run_id, health_png, "collapse_signals.png")
        engine_png = curves_png(
            result.history, ENGINE_KEYS, f"RL round {round_index}: {cfg.rollout.engine} rollout engine vs trainer"
        )
        tracker.log_png(run_id, engine_png, "rollout_engine.png")
        tracker.log_metrics(run_id, {"round/collapse_warnings": float(len(health.warnings))})
        samples = sample_trajectories_md(result.rollouts, result.rewards, {t["task_id"]: t["prompt"] for t in tasks})
        tracker.log_text(run_id, samples, "sample_trajectories.md")
    for warning in health.warnings:
        context.log.warning(f"round {round_index} collapse early-warning: {warning.message}")
    rewards = pd.DataFrame(result.rewards)
    last = result.history[-1]
    yield Output(
        pd.DataFrame(result.rollouts),
        "rollout_batches",
        metadata={
            "rows": len(result.rollouts),
            "tool_call_rate": last["rollout/tool_call_rate"],
            "mean_turns": last["rollout/turns"],
            "example": MetadataValue.text(result.rollouts[-1]["completion"]),
            "sample_trajectories": MetadataValue.md(samples),
            "mlflow_run": tracker.run_link(run_id),
        },
    )
    yield Output(
        rewards,
        "verified_rewards",
        metadata={
            "rows": len(rewards),
            "unscorable": int(summary["reward/unscorable"]),
            **{
                k.replace("/", "_"): float(v)
                for k, v in summary.items()
                if k.startswith("reward/") and k != "reward/unscorable"
            },
            **{
                k.replace("/", "_"): float(v)
                for k, v in summary.items()
                if k.startswith("verifier/") and not k.endswith("/seconds")
            },
            "verifier_tiers": MetadataValue.md(tier_table(result.tier_stats)),
            "curves": markdown_image(png, "RL curves"),
        },
    )
    pool = pool_frame(update_history(history.values(), result.rewards, round_index), tasks, cfg.rl.curriculum)
    yield Output(
        pool,
        "task_pool",
        metadata={
            "tasks_tried": int((pool["attempts"] > 0).sum()),
            "tasks": len(pool),
            "dropped_always_solved": int(
                ((pool["weight"] == 0) & (pool["pass_rate"] >= cfg.rl.curriculum.solved_above)).sum()
            ),
            "dropped_never_solved": int(
                ((pool["weight"] == 0) & (pool["pass_rate"] <= cfg.rl.curriculum.unsolved_below)).sum()
            ),
            "weighted_this_round": int(sum(w > 0 for w in weights.values())),
            "pass_rate_by_family_level": MetadataValue.md(
                pool[pool["attempts"] > 0]
                .groupby(["family", "level"])["pass_rate"]
                .mean()
                .unstack()
                .round(3)
                .to_markdown()
            ),
        },
    )
    yield Output(
        {
            "uri": uri,
            "mlflow_run_id": run_id,
            "init_version": init_version,
            "round": round_index,
            "algorithm": cfg.rl.algorithm,
            "history": result.history,
        },
        "rl_checkpoint",
        metadata={
            "uri": uri,
            "init_version": init_version,
            "mlflow_run_id": run_id,
            "mlflow_run": tracker.run_link(run_id),
            "final_entropy": last.get("actor/entropy", float("nan")),
            "algorithm": cfg.rl.algorithm,
            "resumed_from_step": result.resumed_from_step,
            "collapse_warnings": len(health.warnings),
            "collapse_signals": markdown_image(health_png, "collapse early-warning signals"),
            "rollout_engine": cfg.rollout.engine,
            "max_logprob_mismatch": max(h.get("rollout/logprob_mismatch_max", 0.0) for h in result.history),
            "engine_vs_trainer": markdown_image(engine_png, "rollout engine vs trainer"),
        },
    )


def round_result(storage: ArtifactStore, invocation) -> tuple[RoundResult, str]:
    """What an RL round job reported through Pipes: the checkpoint (its materialization) and the
    round's result, which rank 0 stored beside it (rollouts are too big for a Pipes message)."""
    [reported] = [m for m in invocation.get_custom_messages() if isinstance(m, dict) and "result_uri" in m]
    return load_round_result(storage, reported["result_uri"]), reported["uri"]


def store_round_result(storage: ArtifactStore, result: RoundResult, round_index: int, provenance: dict | None) -> str:
    """The round's rollouts, rewards, history and verifier statistics as one JSON file (rank 0 of a job)."""
    payload = {
        "rollouts": result.rollouts,
        "rewards": result.rewards,
        "history": result.history,
        "disagreements": result.disagreements,
        "resumed_from_step": result.resumed_from_step,
        "tier_stats": {k: asdict(v) for k, v in result.tier_stats.items()},
    }
    with storage.writable_dir("jobs", "rl_round", f"round-{round_index}", provenance=provenance) as (path, uri):
        (path / "result.json").write_text(json.dumps(payload))
    return uri


def load_round_result(storage: ArtifactStore, uri: str) -> RoundResult:
    payload = json.loads((storage.local_path(uri) / "result.json").read_text())
    return RoundResult(
        rollouts=payload["rollouts"],
        rewards=payload["rewards"],
        history=payload["history"],
        disagreements=payload["disagreements"],
        resumed_from_step=payload["resumed_from_step"],
        tier_stats={k: TierStats(**v) for k, v in payload["tier_stats"].items()},
    )


def round_health(rl_checkpoint: dict, cfg: CollapseConfig) -> CollapseReport:
    """The collapse report of a stored round (its per-step history travels with the checkpoint)."""
    return detect_collapse(rl_checkpoint.get("history", []), cfg)


@asset_check(
    asset="rl_checkpoint",
    partitions_def=rl_rounds,
    description="Collapse early-warnings (entropy, group reward spread, repeats, KL, "
    "clip fraction, grad norm): ERROR when rl.collapse.action is block (the benchmark gate then refuses to promote), else WARN.",
)
def rl_round_health(settings: FlywheelSettings, rl_checkpoint: dict) -> AssetCheckResult:
    cfg = settings.config.rl.collapse
    report = round_health(rl_checkpoint, cfg)
    return AssetCheckResult(
        passed=not report.collapsed,
        severity=AssetCheckSeverity.ERROR if cfg.action == "block" else AssetCheckSeverity.WARN,
        description=report.to_markdown(),
        metadata=report.as_metadata(),
    )


task_pool_contract = contract_check("task_pool", "task_pool", partitions_def=rl_rounds)
rollout_batches_contract = contract_check("rollout_batches", "rollout_batches", partitions_def=rl_rounds)
