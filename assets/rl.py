"""One RL round as one materialization: rollouts, rewards and the checkpoint, partitioned by round.

The engines stay loaded for all of the round's on-policy steps (reloading per step would
dominate at real scale); the three products are still separate assets with their own checks.
A round starts from the current `champion` in the MLflow registry (or the SFT checkpoint) and
keeps the SFT checkpoint as the frozen KL reference.
"""

import pandas as pd
import torch
from dagster import AssetExecutionContext, AssetKey, AssetOut, DynamicPartitionsDefinition, MetadataValue, Output, multi_asset

from assets.contracts import contract_check
from assets.plots import curves_png, markdown_image
from assets.resources import ArtifactStore, FlywheelSettings, SandboxResource
from assets.sft import load_checkpoint, records
from assets.tracking import CHAMPION, MLflowTracker
from environments.arithmetic import FAMILY, LEVELS
from environments.tools import CodeInterpreter
from training.grpo import train_round
from training.model import save_checkpoint
from training.scoring import reward_summary, tier_table
from verifiers.cascade import Cascade

rl_rounds = DynamicPartitionsDefinition(name="rl_round")
CURVE_KEYS = ["reward/total/mean", "reward/outcome/pass_rate", "actor/entropy", "reward/total/std", "loss/kl", "rollout/tool_call_rate"]


def starting_point(tracker: MLflowTracker, sft_checkpoint: dict, init_from: str) -> tuple[dict, str]:
    champion = tracker.version_by_alias(CHAMPION) if init_from == "champion" else None
    if champion is None or "checkpoint_uri" not in champion.tags:
        return sft_checkpoint, "sft"
    return {"uri": champion.tags["checkpoint_uri"]}, f"v{champion.version}"


@multi_asset(
    group_name="rl",
    partitions_def=rl_rounds,
    outs={
        "rollout_batches": AssetOut(description="Every trajectory sampled in the round (ids, tool_mask, behaviour logprobs)."),
        "verified_rewards": AssetOut(description="Reward and its components per trajectory; recomputable from rollouts."),
        "rl_checkpoint": AssetOut(description="The policy at the end of the round (HF folder)."),
    },
    deps=[AssetKey("sft_benchmark_scores")],  # the SFT version must be registered before round 1 looks up the champion
)
def rl_round(context: AssetExecutionContext, settings: FlywheelSettings, storage: ArtifactStore, sandbox: SandboxResource,
             tracker: MLflowTracker, training_tasks: pd.DataFrame, sft_checkpoint: dict):
    cfg = settings.config
    torch.set_num_threads(cfg.threads)
    round_index = int(context.partition_key)
    init, init_version = starting_point(tracker, sft_checkpoint, cfg.rl.init_from)
    policy, tok = load_checkpoint(storage, init, cfg.model.dtype)
    reference, _ = load_checkpoint(storage, sft_checkpoint, cfg.model.dtype)
    reference.requires_grad_(False).eval()

    def log(step: int, metrics: dict[str, float]) -> None:
        shown = ("reward/total/mean", "reward/outcome/pass_rate", "rollout/tool_call_rate", "actor/entropy", "loss/kl", "perf/step_s")
        context.log.info(f"round {round_index} step {step}/{cfg.rl.steps_per_round}: " + ", ".join(f"{k}={metrics[k]:.3f}" for k in shown if k in metrics))

    params = {"rl": cfg.rl.model_dump(), "rollout": cfg.rollout.model_dump(), "reward": cfg.reward.model_dump(), "init_version": init_version}
    with tracker.run(context, "rl_round", params) as run_id, sandbox.open() as box:
        result = train_round(policy, reference, tok, records(training_tasks), CodeInterpreter(box), rl=cfg.rl, rollout=cfg.rollout,
                             cascade=Cascade(cfg.reward, box, concurrency=cfg.sandbox.pool_size), round_index=round_index, policy_version=init_version,
                             seed=cfg.seed * 1000 + round_index, on_step=log)
        tracker.log_history(run_id, result.history)
        summary = reward_summary(result.rewards, result.tier_stats, result.disagreements)
        tracker.log_metrics(run_id, {f"round/{k}": v for k, v in summary.items()})
        png = curves_png(result.history, CURVE_KEYS, f"RL round {round_index} ({cfg.rl.algorithm})")
        tracker.log_png(run_id, png, "rl_curves.png")
    with storage.writable_dir("checkpoints", "rl", f"round-{round_index}") as (path, uri):
        save_checkpoint(policy, tok, path)
    rewards = pd.DataFrame(result.rewards)
    last = result.history[-1]
    yield Output(pd.DataFrame(result.rollouts), "rollout_batches", metadata={
        "rows": len(result.rollouts), "tool_call_rate": last["rollout/tool_call_rate"], "mean_turns": last["rollout/turns"],
        "example": MetadataValue.text(result.rollouts[-1]["completion"]),
    })
    yield Output(rewards, "verified_rewards", metadata={
        "rows": len(rewards), "unscorable": int(summary["reward/unscorable"]),
        **{k.replace("/", "_"): float(v) for k, v in summary.items() if k.startswith("reward/") and k != "reward/unscorable"},
        **{k.replace("/", "_"): float(v) for k, v in summary.items() if k.startswith("verifier/") and not k.endswith("/seconds")},
        "verifier_tiers": MetadataValue.md(tier_table(result.tier_stats)), "curves": markdown_image(png, "RL curves"),
    })
    yield Output({"uri": uri, "mlflow_run_id": run_id, "init_version": init_version, "round": round_index}, "rl_checkpoint", metadata={
        "uri": uri, "init_version": init_version, "mlflow_run_id": run_id, "final_entropy": last.get("actor/entropy", float("nan")),
    })


rollout_batches_contract = contract_check("rollout_batches", "rollout_batches", partitions_def=rl_rounds, families=(FAMILY,), max_level=max(LEVELS))
