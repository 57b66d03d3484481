"""Dagster entry point (`dagster dev`, `dagster asset list`, `dagster definitions validate`).

The profile comes from FLYWHEEL_PROFILE (default `tiny`) and overrides from
FLYWHEEL_OVERRIDES (JSON); an invalid profile fails here, before any run starts.
"""

from __future__ import annotations

import json
import os

from dagster import AssetSelection, DefaultSensorStatus, Definitions, RunRequest, SensorEvaluationContext, SensorResult, SkipReason, define_asset_job, sensor

from assets import audit, benchmark, data, rl, sft
from configs import load_profile
from pipelines.resources import executor_for, resources_for

FOUNDATION_JOB = "foundation"
RL_ROUND_JOB = "rl_round_job"
AUDIT_JOB = "reward_audit_job"


def build_definitions(profile: str | None = None, overrides: dict | None = None) -> Definitions:
    overrides = overrides if overrides is not None else json.loads(os.environ.get("FLYWHEEL_OVERRIDES", "{}"))
    cfg = load_profile(profile, overrides)
    foundation = define_asset_job(
        FOUNDATION_JOB,
        selection=AssetSelection.groups("data", "model", "sft") | AssetSelection.assets("sft_benchmark_scores"),
        description="Tasks, tokenizer, base model, SFT, and the SFT benchmark (the first registered version).",
    )
    rl_job = define_asset_job(
        RL_ROUND_JOB,
        selection=AssetSelection.assets("rollout_batches", "verified_rewards", "rl_checkpoint", "task_pool", "benchmark_scores"),
        partitions_def=rl.rl_rounds,
        description="One RL round from the champion, then its benchmark and the promotion gate.",
    )
    audit_job = define_asset_job(AUDIT_JOB, selection=AssetSelection.assets("reward_audit"), partitions_def=rl.rl_rounds,
                                 description="Re-score a stored round with another verifier configuration; report disagreements.")

    @sensor(job=rl_job, minimum_interval_seconds=int(cfg.orchestration.retrain_interval_hours * 3600), default_status=DefaultSensorStatus.STOPPED)
    def retrain_sensor(context: SensorEvaluationContext):
        """Scheduled retraining: start the next round (from the current champion) unless one is running."""
        from dagster import DagsterRunStatus, RunsFilter

        active = context.instance.get_runs(RunsFilter(job_name=RL_ROUND_JOB, statuses=[DagsterRunStatus.STARTED, DagsterRunStatus.QUEUED, DagsterRunStatus.STARTING]))
        if active:
            return SkipReason(f"round run {active[0].run_id} is still in progress")
        keys = context.instance.get_dynamic_partitions(rl.rl_rounds.name)
        next_key = str(max((int(k) for k in keys), default=0) + 1)
        return SensorResult(run_requests=[RunRequest(partition_key=next_key, run_key=f"round-{next_key}")],
                            dynamic_partitions_requests=[rl.rl_rounds.build_add_request([next_key])])

    return Definitions(
        assets=[data.knowledge_base, data.benchmark_tasks, data.training_tasks, sft.tokenizer, sft.base_model, sft.sft_trajectories, sft.sft_checkpoint,
                benchmark.sft_benchmark_scores, rl.rl_round, benchmark.benchmark_scores, audit.reward_audit],
        asset_checks=[data.knowledge_base_contract, data.training_tasks_contract, data.benchmark_tasks_contract, data.training_disjoint_from_benchmark,
                      sft.sft_trajectories_contract, rl.rollout_batches_contract, rl.task_pool_contract, rl.rl_round_health],
        jobs=[foundation, rl_job, audit_job],
        sensors=[retrain_sensor],
        resources=resources_for(cfg, overrides),
        executor=executor_for(cfg),
    )


defs = build_definitions()
