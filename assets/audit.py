"""Re-score a stored round's rollouts with a different verifier configuration.

Reward hacking shows up as trajectories the training verifier rewarded and a stricter one does
not. Materialize `reward_audit` for a round (UI: the asset's partition, Launchpad config) with
reward overrides in the same `section.field=value` form as `make run ARGS="--set ..."`:

    dagster asset materialize -m pipelines.definitions --select reward_audit --partition 1 \\
        --config-json '{"ops": {"reward_audit": {"config": {"overrides": ["reward.strict.verifiers={arithmetic: {name: numeric, params: {rel_tol: 0.0}}}"]}}}}'
"""

import json

import pandas as pd
from dagster import AssetExecutionContext, AssetIn, Config, MetadataValue, Output, asset
from pydantic import Field

from assets.policies import FLAKY_STEP_RETRY
from assets.resources import ArtifactStore, FlywheelSettings, SandboxResource
from assets.rl import rl_rounds
from assets.sft import records
from assets.tracking import MLflowTracker
from configs import ConfigError, load_profile, parse_override
from training.judge import judge_for
from training.model import load_tokenizer
from training.rl.scoring import disagreements, reward_summary, score_records, tier_table
from verifiers.cascade import Cascade

# The default audit, as a strict tier on every candidate: exact numeric equality for arithmetic (no
# tolerance, no symbolic rewriting), and code re-run with the held-out tests (hard-coded answers fail).
STRICT_DEFAULT = [
    "reward.strict.verifiers={arithmetic: {name: numeric, params: {rel_tol: 0.0}}, "
    "code: {name: unit_tests, params: {groups: [fail_to_pass, pass_to_pass, held_out]}}}",
    "reward.strict.select=all",
]


class AuditConfig(Config):
    overrides: list[str] = Field(default=STRICT_DEFAULT, description="Reward overrides, `reward.<field>=<yaml value>`.")
    examples: int = Field(default=10, description="Disagreements shown in the asset's metadata.")


@asset(
    group_name="rl",
    partitions_def=rl_rounds,
    retry_policy=FLAKY_STEP_RETRY,
    ins={
        "rollout_batches": AssetIn(),
        "verified_rewards": AssetIn(),
        "training_tasks": AssetIn(),
        "tokenizer": AssetIn(),
    },
    description="Stored rollouts of a round re-scored with another verifier configuration; one row per disagreement.",
)
def reward_audit(
    context: AssetExecutionContext,
    config: AuditConfig,
    settings: FlywheelSettings,
    storage: ArtifactStore,
    sandbox: SandboxResource,
    tracker: MLflowTracker,
    rollout_batches: pd.DataFrame,
    verified_rewards: pd.DataFrame,
    training_tasks: pd.DataFrame,
    tokenizer: dict,
):
    cfg = settings.config
    pairs = [parse_override(text) for text in config.overrides]
    bad = [key for key, _ in pairs if not key.startswith("reward.")]
    if bad:
        raise ConfigError(f"reward_audit config.overrides may only change reward.* fields, got {bad}")
    audit_cfg = load_profile(cfg.profile, {**json.loads(settings.overrides_json), **dict(pairs)}).reward
    tok = load_tokenizer(storage.local_path(tokenizer["uri"]))
    rows = records(rollout_batches)
    by_id = {t["task_id"]: t for t in records(training_tasks)}
    with sandbox.open() as box:
        cascade = Cascade(audit_cfg, box, concurrency=cfg.sandbox.pool_size, judge=judge_for(audit_cfg))
        audited = score_records(rows, by_id, tok, cascade)
        stats, disagreed = cascade.take_stats()
    found = disagreements(records(verified_rewards), audited, rows, tok)
    kinds = {k: sum(d["kind"] == k for d in found) for k in ("training_only", "audit_only", "scorability")}
    summary = {
        **reward_summary(audited, stats, disagreed),
        **{f"audit/{k}": float(v) for k, v in kinds.items()},
        "audit/disagreements": float(len(found)),
        "audit/rows": float(len(rows)),
    }
    with tracker.run(
        context, "reward_audit", {"overrides": config.overrides, "round": context.partition_key}
    ) as run_id:
        tracker.log_metrics(run_id, summary)
    context.log.info(f"audit of round {context.partition_key}: {len(found)} of {len(rows)} outcomes differ ({kinds})")
    shown = "\n\n".join(
        f"**{d['kind']}** `{d['trajectory_id']}` {d['baseline_outcome']} -> {d['audit_outcome']}: "
        f"{d['audit_details']}\n```\n{d['completion'][:300]}\n```"
        for d in found[: config.examples]
    )
    columns = [
        "trajectory_id",
        "task_id",
        "kind",
        "baseline_outcome",
        "audit_outcome",
        "baseline_reward",
        "audit_reward",
        "audit_details",
        "completion",
    ]
    return Output(
        pd.DataFrame(found, columns=columns),
        metadata={
            "rows_rescored": len(rows),
            "disagreements": len(found),
            **kinds,
            "overrides": MetadataValue.json(config.overrides),
            "verifier_tiers": MetadataValue.md(tier_table(stats)),
            "examples": MetadataValue.md(shown or "no disagreements"),
            "mlflow_run_id": run_id,
            "mlflow_run": tracker.run_link(run_id),
        },
    )
