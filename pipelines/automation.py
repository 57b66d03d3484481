"""What starts runs without a person: the retraining schedule and the new-task-data sensors.

* `retrain_schedule` (cron `orchestration.retrain_cron`): the next round from the current
  champion, as a new partition of the round job.
* `task_file_sensor`: when the file at `data.task_file` changes (local or s3://, compared by
  size, modification time and ETag), re-materialize `training_tasks` and its checks.
* `new_tasks_round_sensor`: when `training_tasks` gets a new materialization, start a round on it.
* `flywheel_automation` (declarative automation, for assets whose `automation_condition` says
  when they are due): a new SFT checkpoint, however it was made (a re-run of the SFT step
  alone, a backfill), is benchmarked and registered without anyone asking
  (`sft_benchmark_scores` is `eager`).

The first three skip while a round is queued or running (one round at a time; rounds build on
the champion the previous one left). All four are stopped by default: `make run` drives its own
rounds, and a user turns them on in the Dagster UI (Automation).
"""

from __future__ import annotations

import hashlib
import json

from dagster import (
    AssetKey,
    AssetSelection,
    AutomationConditionSensorDefinition,
    DagsterRunStatus,
    DefaultScheduleStatus,
    DefaultSensorStatus,
    RunRequest,
    RunsFilter,
    ScheduleEvaluationContext,
    SensorEvaluationContext,
    SensorResult,
    SkipReason,
    schedule,
    sensor,
)

from assets.rl import next_round, rl_rounds
from configs import FlywheelConfig

ACTIVE = [DagsterRunStatus.QUEUED, DagsterRunStatus.STARTING, DagsterRunStatus.STARTED]


def round_in_progress(instance, job_name: str) -> str | None:
    """The id of a queued or running round, if any."""
    active = instance.get_runs(RunsFilter(job_name=job_name, statuses=ACTIVE), limit=1)
    return active[0].run_id if active else None


def task_file_fingerprint(uri: str) -> str | None:
    """What changes when the task file is replaced: size, mtime and ETag (S3). None: no file."""
    import fsspec

    fs, path = fsspec.core.url_to_fs(uri)
    if not fs.exists(path):
        return None
    info = fs.info(path)
    return json.dumps(
        {k: str(info.get(k)) for k in ("size", "mtime", "LastModified", "ETag") if info.get(k) is not None},
        sort_keys=True,
    )


def build_automation(cfg: FlywheelConfig, rl_job, tasks_job):
    """The schedules and sensors for the round job and the task-refresh job (asset jobs)."""
    rl_job_name = rl_job.name

    @schedule(
        job=rl_job,
        cron_schedule=cfg.orchestration.retrain_cron,
        execution_timezone=cfg.orchestration.timezone,
        default_status=DefaultScheduleStatus.STOPPED,
        description="Scheduled retraining: the next RL round from the current champion.",
    )
    def retrain_schedule(context: ScheduleEvaluationContext):
        running = round_in_progress(context.instance, rl_job_name)
        if running:
            return SkipReason(f"round run {running} is still in progress")
        key = str(next_round(context.instance))
        context.instance.add_dynamic_partitions(rl_rounds.name, [key])  # schedules cannot request new partitions
        return RunRequest(partition_key=key, run_key=f"round-{key}", tags={"flywheel/trigger": "schedule"})

    @sensor(
        job=tasks_job,
        minimum_interval_seconds=60,
        default_status=DefaultSensorStatus.STOPPED,
        description="Re-materialize training_tasks when the file at data.task_file changes.",
    )
    def task_file_sensor(context: SensorEvaluationContext):
        if cfg.data.task_file is None:
            return SkipReason("data.task_file is not set: training tasks are generated, no file to watch")
        fingerprint = task_file_fingerprint(cfg.data.task_file)
        if fingerprint is None:
            return SkipReason(f"data.task_file {cfg.data.task_file} does not exist (yet)")
        if fingerprint == context.cursor:
            return SkipReason(f"{cfg.data.task_file} is unchanged")
        context.update_cursor(fingerprint)
        # a stable key (str hash() is salted per process): the same file version is never re-run
        return RunRequest(
            run_key=f"tasks-{hashlib.sha256(fingerprint.encode()).hexdigest()[:16]}",
            tags={"flywheel/trigger": "task_file", "flywheel/task_file": cfg.data.task_file},
        )

    @sensor(
        job=rl_job,
        minimum_interval_seconds=60,
        default_status=DefaultSensorStatus.STOPPED,
        description="Start an RL round when training_tasks has a new materialization.",
    )
    def new_tasks_round_sensor(context: SensorEvaluationContext):
        records = context.instance.fetch_materializations(AssetKey("training_tasks"), limit=1).records
        if not records:
            return SkipReason("training_tasks has never been materialized")
        latest = records[0]
        if context.cursor and int(context.cursor) >= latest.storage_id:
            return SkipReason("no new training_tasks materialization")
        running = round_in_progress(context.instance, rl_job_name)
        if running:  # the cursor stays: the new tasks start a round once this one is over
            return SkipReason(f"new training tasks, but round run {running} is still in progress")
        key = str(next_round(context.instance))
        return SensorResult(
            run_requests=[
                RunRequest(
                    partition_key=key,
                    run_key=f"round-{key}",
                    tags={"flywheel/trigger": "new_tasks", "flywheel/tasks_run": latest.run_id},
                )
            ],
            dynamic_partitions_requests=[rl_rounds.build_add_request([key])],
            cursor=str(latest.storage_id),
        )

    automation = AutomationConditionSensorDefinition(
        "flywheel_automation",
        target=AssetSelection.all(),
        default_status=DefaultSensorStatus.STOPPED,
        description="Materializes assets whose automation condition says they are due.",
    )
    return [retrain_schedule], [task_file_sensor, new_tasks_round_sensor, automation]
