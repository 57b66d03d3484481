"""The retraining schedule and the new-task-data sensors, evaluated against a real (ephemeral)
Dagster instance with `build_schedule_context` / `build_sensor_context`."""

from __future__ import annotations

import os

import pytest
from dagster import AssetMaterialization, DagsterRunStatus, build_schedule_context, build_sensor_context
from dagster._core.test_utils import create_run_for_test, instance_for_test

from assets.rl import next_round, rl_rounds, round_number
from pipelines.definitions import RL_ROUND_JOB, TASKS_JOB, build_definitions


@pytest.fixture()
def instance():
    with instance_for_test() as inst:  # sqlite in a temp dir: schedules need an instance reference
        yield inst


def definitions(**overrides):
    return build_definitions("micro", overrides)


def test_automation_is_listed_and_stopped_by_default():
    defs = definitions()
    schedule = defs.resolve_schedule_def("retrain_schedule")
    assert schedule.cron_schedule == "0 3 * * *" and schedule.job_name == RL_ROUND_JOB
    assert schedule.default_status.value == "STOPPED"
    sensors = {s.name: s for s in defs.sensors}
    assert set(sensors) == {"task_file_sensor", "new_tasks_round_sensor", "flywheel_automation"}
    assert (
        sensors["task_file_sensor"].job_name == TASKS_JOB and sensors["new_tasks_round_sensor"].job_name == RL_ROUND_JOB
    )
    assert all(s.default_status.value == "STOPPED" for s in sensors.values())
    assert (
        definitions(**{"orchestration.retrain_cron": "0 */6 * * *"})
        .resolve_schedule_def("retrain_schedule")
        .cron_schedule
        == "0 */6 * * *"
    )


def test_schedule_starts_the_next_round_and_waits_for_a_running_one(instance):
    defs = definitions()
    schedule = defs.resolve_schedule_def("retrain_schedule")
    repo = defs.get_repository_def()
    instance.add_dynamic_partitions(rl_rounds.name, ["1", "2"])  # rounds 1 and 2 happened
    tick = schedule.evaluate_tick(build_schedule_context(instance=instance, repository_def=repo))
    [request] = tick.run_requests
    assert (
        request.partition_key == "3" and request.run_key == "round-3" and request.tags["flywheel/trigger"] == "schedule"
    )
    assert "3" in instance.get_dynamic_partitions(rl_rounds.name)

    running = create_run_for_test(instance, job_name=RL_ROUND_JOB, status=DagsterRunStatus.STARTED)
    tick = schedule.evaluate_tick(build_schedule_context(instance=instance, repository_def=repo))
    assert not tick.run_requests and running.run_id in tick.skip_message
    assert instance.get_dynamic_partitions(rl_rounds.name) == ["1", "2", "3"]  # nothing added while it runs


def test_a_mistyped_round_partition_is_refused_by_name_and_skipped_when_counting(instance):
    assert round_number("12") == 12
    for key in ("round-2", "0", "-1", "2.0", " 3"):
        with pytest.raises(
            ValueError, match=rf"rl_round partition '{key}' is not a round number: name round partitions 1, 2, 3"
        ):
            round_number(key)
    instance.add_dynamic_partitions(rl_rounds.name, ["1", "round-2", "2"])  # a name typed in the UI's "Add a partition"
    assert next_round(instance) == 3


def test_task_file_sensor_fires_once_per_change(instance, tmp_path):
    task_file = tmp_path / "tasks.jsonl"
    sensor = {s.name: s for s in definitions(**{"data.task_file": str(task_file)}).sensors}["task_file_sensor"]

    def tick(cursor):
        return sensor.evaluate_tick(build_sensor_context(instance=instance, cursor=cursor))

    assert "does not exist" in tick(None).skip_message
    task_file.write_text('{"task_id": "a"}\n')
    first = tick(None)
    assert len(first.run_requests) == 1 and first.run_requests[0].tags["flywheel/task_file"] == str(task_file)
    assert "unchanged" in tick(first.cursor).skip_message
    task_file.write_text('{"task_id": "a"}\n{"task_id": "b"}\n')
    os.utime(task_file, (1e9, 2e9))
    second = tick(first.cursor)
    assert len(second.run_requests) == 1 and second.cursor != first.cursor
    assert second.run_requests[0].run_key != first.run_requests[0].run_key
    generated = {s.name: s for s in definitions().sensors}["task_file_sensor"]
    assert "data.task_file is not set" in generated.evaluate_tick(build_sensor_context(instance=instance)).skip_message


def test_new_tasks_start_a_round_once_none_is_running(instance):
    defs = definitions()
    sensor, repo = {s.name: s for s in defs.sensors}["new_tasks_round_sensor"], defs.get_repository_def()

    def tick(cursor):
        return sensor.evaluate_tick(
            build_sensor_context(instance=instance, instance_ref=instance.get_ref(), cursor=cursor, repository_def=repo)
        )

    assert "never been materialized" in tick(None).skip_message
    instance.report_runless_asset_event(AssetMaterialization("training_tasks"))
    running = create_run_for_test(instance, job_name=RL_ROUND_JOB, status=DagsterRunStatus.STARTED)
    held = tick(None)
    assert not held.run_requests and running.run_id in held.skip_message and held.cursor is None  # not consumed
    instance.report_run_failed(running)
    fired = tick(held.cursor)
    [request] = fired.run_requests
    assert request.partition_key == "1" and request.tags["flywheel/trigger"] == "new_tasks"
    assert [r.partition_keys for r in fired.dynamic_partitions_requests] == [["1"]]
    assert "no new training_tasks" in tick(fired.cursor).skip_message


def test_heavy_steps_share_the_gpu_pool_and_flaky_steps_retry():
    defs = definitions()
    graph = defs.resolve_asset_graph()
    job = defs.resolve_job_def(RL_ROUND_JOB)
    pools = {k.to_user_string(): graph.get(k).pools for k in graph.get_all_asset_keys()}
    for name in ("sft_checkpoint", "rl_checkpoint", "sft_benchmark_scores", "benchmark_scores"):
        assert pools[name] == {"gpu"}, name
    assert not pools["training_tasks"] and not pools["knowledge_base"]
    retries = {node.name: node.definition.retry_policy for node in job.graph.node_dict.values()}
    assert retries["rl_round"].max_retries == 2 and retries["benchmark_scores"].max_retries == 2
    for name in ("foundation", RL_ROUND_JOB, TASKS_JOB):
        assert defs.resolve_job_def(name).tags["dagster/max_runtime"] == str(4 * 3600)
    assert (
        definitions(**{"orchestration.max_runtime_s": 600}).resolve_job_def(RL_ROUND_JOB).tags["dagster/max_runtime"]
        == "600"
    )


@pytest.mark.parametrize("old", [0, 1])
def test_local_instance_monitors_and_retries_runs(tmp_path, monkeypatch, old):
    from dagster import DagsterInstance

    from pipelines.instance import LOCAL_SETTINGS
    from pipelines.run import OLD_INSTANCE_SETTINGS, prepare_home

    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path))  # prepare_home sets it; restored after the test
    (tmp_path / "dagster").mkdir()
    # an earlier version's home is upgraded
    (tmp_path / "dagster" / "dagster.yaml").write_text(OLD_INSTANCE_SETTINGS[old])
    prepare_home(tmp_path)
    assert (tmp_path / "dagster" / "dagster.yaml").read_text() == LOCAL_SETTINGS
    with DagsterInstance.from_config(str(tmp_path / "dagster")) as inst:
        assert inst.run_monitoring_enabled and inst.run_retries_enabled and inst.run_retries_max_retries == 1


def test_a_new_sft_checkpoint_is_due_a_benchmark_by_declarative_automation(instance):
    """`sft_benchmark_scores` is eager: once its inputs exist and the SFT checkpoint is newer than
    its last benchmark, the automation sensor requests it, once."""
    from dagster import AssetKey, evaluate_automation_conditions

    defs = definitions()
    due = AssetKey("sft_benchmark_scores")

    def requested(cursor=None):
        result = evaluate_automation_conditions(defs=defs, instance=instance, cursor=cursor)
        return result.get_num_requested(due), result.cursor

    count, cursor = requested()
    assert count == 0  # nothing to benchmark yet
    for key in ("knowledge_base", "benchmark_tasks", "sft_checkpoint"):
        instance.report_runless_asset_event(AssetMaterialization(key))
    count, cursor = requested(cursor)
    assert count == 1
    instance.report_runless_asset_event(AssetMaterialization("sft_benchmark_scores"))
    count, cursor = requested(cursor)
    assert count == 0  # benchmarked: nothing due
    instance.report_runless_asset_event(AssetMaterialization("sft_checkpoint"))  # e.g. SFT re-run on its own
    count, _ = requested(cursor)
    assert count == 1
    rl_side = evaluate_automation_conditions(defs=defs, instance=instance, cursor=cursor)
    assert rl_side.get_num_requested(AssetKey("rl_checkpoint")) == 0  # rounds stay with the schedule and sensors
