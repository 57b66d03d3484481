"""The multi-node launch (pipelines/k8s_launch.py) against a Kubernetes API that records what it is
asked and plays pod 0's log stream: the Job and Service it creates, the Pipes messages that come
back, the node a failure names, and the clean-up."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from dagster import Output, asset, materialize
from dagster_pipes import _make_message

from assets.launcher import RankFailed
from pipelines.k8s_launch import IndexedJobLauncher, job_name

pytestmark = pytest.mark.scaleout
NNODES = 3


def pipes_line(method: str, params: dict | None) -> str:
    return json.dumps(_make_message(method, params))


class FakeCluster:
    """CoreV1Api and BatchV1Api in one object, enough of them for the launcher."""

    def __init__(self, failing_node: int | None = None):
        self.failing_node = failing_node
        self.created, self.deleted, self.log_reads = [], [], []

    # --- CoreV1Api
    def create_namespaced_service(self, namespace, body):
        self.created.append(("Service", namespace, body))

    def delete_namespaced_service(self, name, namespace):
        self.deleted.append(("Service", name))

    def list_namespaced_pod(self, namespace, label_selector):
        name = label_selector.split(",")[0].split("=")[1]
        wanted = (
            int(label_selector.split("job-completion-index=")[1]) if "job-completion-index" in label_selector else None
        )
        pods = []
        for index in range(NNODES):
            phase = "Failed" if index == self.failing_node else "Running"
            pods.append(
                SimpleNamespace(
                    metadata=SimpleNamespace(
                        name=f"{name}-{index}-abcde", labels={"batch.kubernetes.io/job-completion-index": str(index)}
                    ),
                    status=SimpleNamespace(phase=phase),
                )
            )
        return SimpleNamespace(items=[p for i, p in enumerate(pods) if wanted is None or i == wanted])

    def read_namespaced_pod_log(self, name, namespace, **kwargs):
        self.log_reads.append((name, kwargs))
        if kwargs.get("tail_lines"):  # a failed pod's last lines
            return "step 3\nTraceback (most recent call last):\nRuntimeError: NCCL error: unhandled system error"
        lines = [
            "rank 0 starting (not a Pipes message: forwarded to stdout)",
            pipes_line("opened", {}),
            pipes_line("log", {"message": "round 1 step 1/2: reward/total/mean=0.100", "level": "INFO"}),
            pipes_line(
                "report_custom_message",
                {"payload": {"uri": "s3://b/checkpoints/rl/round-1", "result_uri": "s3://b/jobs/x"}},
            ),
            pipes_line("closed", {}),
        ]
        return iter(f"2026-11-26T10:00:0{i}.000000Z {line}\n".encode() for i, line in enumerate(lines))

    # --- BatchV1Api
    def create_namespaced_job(self, namespace, body):
        self.created.append(("Job", namespace, body))

    def read_namespaced_job_status(self, name, namespace):
        failed = self.failing_node is not None
        return SimpleNamespace(
            status=SimpleNamespace(failed=1 if failed else None, succeeded=None if failed else NNODES)
        )

    def delete_namespaced_job(self, name, namespace, propagation_policy):
        self.deleted.append(("Job", name, propagation_policy))


def launch(cluster: FakeCluster, monkeypatch):
    launcher = IndexedJobLauncher(
        kind="k8s",
        nproc_per_node=8,
        namespace="flywheel",
        nnodes=NNODES,
        profile="cluster",
        overrides_json=json.dumps({"orchestration.k8s.nnodes": NNODES, "orchestration.k8s.gpus_per_step": 8}),
        poll_s=0.0,
    )
    monkeypatch.setattr(IndexedJobLauncher, "_clients", lambda self: (cluster, cluster))
    seen = {}

    @asset
    def rl_round(context) -> dict:
        seen["run_id"] = context.run_id
        seen["invocation"] = launcher.launch(context, "rl_round", {"round": 1})
        return Output({"launched": True})  # as the real steps do: their outputs are their own, not Pipes'

    return materialize([rl_round], raise_on_error=False), seen


def test_a_multi_node_job_is_created_read_through_pipes_and_cleaned_up(cluster_env, monkeypatch):
    cluster = FakeCluster()
    result, seen = launch(cluster, monkeypatch)
    assert result.success
    name = job_name(seen["run_id"], "rl_round")
    [(_, ns, service), (_, _, job)] = cluster.created
    assert ns == "flywheel" and service["kind"] == "Service" and service["metadata"]["name"] == name
    assert job["kind"] == "Job" and job["spec"]["completions"] == NNODES and job["spec"]["completionMode"] == "Indexed"
    container = job["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"] for e in container["env"]}
    assert {"DAGSTER_PIPES_CONTEXT", "DAGSTER_PIPES_MESSAGES", "NODE_RANK"} <= env  # every pod gets the session
    assert f"--nnodes={NNODES}" in container["command"] and "--nproc-per-node=8" in container["command"]
    assert cluster.log_reads[0][0] == f"{name}-0-abcde" and cluster.log_reads[0][1]["follow"]  # rank 0's pod, streamed
    messages = list(seen["invocation"].get_custom_messages())
    assert messages == [{"uri": "s3://b/checkpoints/rl/round-1", "result_uri": "s3://b/jobs/x"}]
    assert ("Job", name, "Background") in cluster.deleted and ("Service", name) in cluster.deleted


def test_a_failed_node_fails_the_step_naming_it_and_the_job_is_still_deleted(cluster_env, monkeypatch):
    cluster = FakeCluster(failing_node=2)
    result, _ = launch(cluster, monkeypatch)
    assert not result.success
    [failure] = [e for e in result.all_events if e.is_step_failure]
    message = (
        failure.step_failure_data.error.cause.message
        if failure.step_failure_data.error.cause
        else failure.step_failure_data.error.message
    )
    assert RankFailed.__name__ in (failure.step_failure_data.error.cause or failure.step_failure_data.error).cls_name
    assert "job 'rl_round': node 2 failed" in message and "NCCL error" in message
    assert [d[0] for d in cluster.deleted] == ["Job", "Service"]


def test_one_node_is_the_single_pod_launch(cluster_env):
    from pipelines.definitions import build_definitions

    launcher = build_definitions("cluster", {}).resources["launcher"]
    # launch() is then PipesK8sClient's one pod
    assert isinstance(launcher, IndexedJobLauncher) and launcher.nnodes == 1
    many = build_definitions("cluster", {"orchestration.k8s.nnodes": 4}).resources["launcher"]
    assert many.nnodes == 4 and json.loads(many.overrides_json) == {"orchestration.k8s.nnodes": 4}
