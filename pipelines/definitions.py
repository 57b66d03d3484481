"""Dagster entry point (`dagster dev`, `dagster asset list`, `dagster definitions validate`).

The profile comes from FLYWHEEL_PROFILE (default `tiny`) and overrides from
FLYWHEEL_OVERRIDES (JSON); an invalid profile fails here, before any run starts.
"""

from __future__ import annotations

import json
import os

from dagster import AssetSelection, Definitions, define_asset_job

from assets import audit, benchmark, data, graduation, rl, sft
from configs import flywheel_home, load_profile
from environments.family import resolve_families
from pipelines.automation import build_automation
from pipelines.console import flywheel_console
from pipelines.home import located, settings
from pipelines.resources import executor_for, resources_for

FOUNDATION_JOB = "foundation"
RL_ROUND_JOB = "rl_round_job"
AUDIT_JOB = "reward_audit_job"
TASKS_JOB = "refresh_tasks_job"


def build_definitions(profile: str | None = None, overrides: dict | None = None) -> Definitions:
    if profile is None and overrides is None and "FLYWHEEL_PROFILE" not in os.environ:
        # `dagster dev` / `make audit` on a home: the settings its flywheel runs with (pipelines/home.py)
        located()
        profile, overrides = settings(flywheel_home(), None, json.loads(os.environ.get("FLYWHEEL_OVERRIDES", "{}")))
    overrides = overrides if overrides is not None else json.loads(os.environ.get("FLYWHEEL_OVERRIDES", "{}"))
    cfg = resolve_families(load_profile(profile, overrides))
    limits = {"dagster/max_runtime": str(cfg.orchestration.max_runtime_s)}
    # the zero-shot baseline, for pretrained models
    base = ("base_benchmark_scores",) if cfg.benchmark.include_base else ()
    foundation = define_asset_job(
        FOUNDATION_JOB,
        selection=AssetSelection.groups("data", "model", "sft") | AssetSelection.assets("sft_benchmark_scores", *base),
        description="Tasks, tokenizer, base model, SFT, and the SFT benchmark (the first registered version).",
        tags=limits,
    )
    rl_job = define_asset_job(
        RL_ROUND_JOB,
        selection=AssetSelection.assets(
            "rollout_batches", "verified_rewards", "rl_checkpoint", "task_pool", "benchmark_scores"
        ),
        partitions_def=rl.rl_rounds,
        description="One RL round from the champion, then its benchmark and the promotion gate.",
        tags=limits,
    )
    audit_job = define_asset_job(
        AUDIT_JOB,
        selection=AssetSelection.assets("reward_audit"),
        partitions_def=rl.rl_rounds,
        description="Re-score a stored round with another verifier configuration; report disagreements.",
        tags=limits,
    )

    tasks_job = define_asset_job(
        TASKS_JOB,
        selection=AssetSelection.assets("training_tasks"),
        description="Re-read the training tasks (data.task_file) and run their checks.",
        tags=limits,
    )
    schedules, sensors = build_automation(cfg, rl_job, tasks_job)

    assets = [
        data.knowledge_base,
        data.search_index,
        data.benchmark_tasks,
        data.training_tasks,
        sft.tokenizer,
        sft.base_model,
        sft.sft_trajectories,
        sft.sft_checkpoint,
        benchmark.sft_benchmark_scores,
        rl.rl_round,
        benchmark.benchmark_scores,
        audit.reward_audit,
    ]
    if base:
        assets.append(benchmark.base_benchmark_scores)
    return Definitions(
        assets=assets,
        asset_checks=[
            data.knowledge_base_contract,
            data.search_index_contract,
            data.training_tasks_contract,
            data.benchmark_tasks_contract,
            data.training_disjoint_from_benchmark,
            sft.sft_trajectories_contract,
            graduation.sft_graduation,
            rl.rollout_batches_contract,
            rl.task_pool_contract,
            rl.rl_round_health,
        ],
        jobs=[foundation, rl_job, audit_job, tasks_job],
        schedules=schedules,
        sensors=sensors,
        resources=resources_for(cfg, overrides),
        executor=executor_for(cfg, assets),
        loggers={"flywheel": flywheel_console},  # `make run`'s console and log file (pipelines/console.py)
    )


# For `reconstructable()`: `make resume` (pipelines/run.py) re-executes a failed run from failure
# with the job rebuilt from FLYWHEEL_PROFILE / FLYWHEEL_OVERRIDES, as a code location would.
def foundation_job():
    return build_definitions().resolve_job_def(FOUNDATION_JOB)


def rl_round_job():
    return build_definitions().resolve_job_def(RL_ROUND_JOB)


defs = build_definitions()
