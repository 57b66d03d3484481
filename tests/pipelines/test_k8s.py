"""The `cluster` profile's Kubernetes executor: its definitions load, and the pod specs dagster-k8s
builds for each step request GPUs, the GPU node group and its tolerations exactly for the steps in
the `gpu` pool. The specs are built by dagster-k8s itself (`construct_dagster_k8s_job`), from the
same layers its step handler merges (executor step config, then the per-step override)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from dagster_k8s.container_context import K8sContainerContext
from dagster_k8s.job import UserDefinedDagsterK8sConfig, construct_dagster_k8s_job

from pipelines.definitions import build_definitions
from tests.conftest import CLUSTER_ENV

# The steps in the `gpu` pool. With the profile's own `orchestration.launcher: k8s` their work runs in
# the pods the Pipes launcher creates and their step pods need no GPU; the `cluster` fixture runs them
# in their step pods instead (`launcher: in_process`), the other way a cluster can be used.
GPU_STEPS = {"base_benchmark_scores", "rl_round", "sft_benchmark_scores", "benchmark_scores", "sft_checkpoint"}
# What the Helm chart's K8sRunLauncher contributes to every step pod (not ours to test).
RUN_LAUNCHER = SimpleNamespace(
    job_image=None,
    dagster_home="/opt/dagster/dagster_home",
    instance_config_map="dagster-instance",
    postgres_password_secret="dagster-postgresql-secret",
    image_pull_policy="IfNotPresent",
    image_pull_secrets=[],
    service_account_name=None,
    env_config_maps=[],
    env_secrets=[],
    env_vars=[],
    volume_mounts=[],
    volumes=[],
    labels={},
    resources={},
    scheduler_name=None,
    security_context={},
    run_k8s_config=UserDefinedDagsterK8sConfig(),
    only_allow_user_defined_k8s_config_fields=None,
    only_allow_user_defined_env_vars=None,
    fail_pod_on_run_failure=None,
    job_namespace="flywheel",
)


def cluster_definitions(tmp_path_factory, overrides: dict):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("FLYWHEEL_HOME", str(tmp_path_factory.mktemp("cluster")))
        for name, value in CLUSTER_ENV.items():
            mp.setenv(name, value)
        return build_definitions("cluster", overrides)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    return cluster_definitions(tmp_path_factory, {"orchestration.launcher": "in_process"})


@pytest.fixture(scope="module")
def launched(tmp_path_factory):
    """The profile as shipped: the heavy steps launched as GPU pods through Pipes."""
    return cluster_definitions(tmp_path_factory, {"orchestration.k8s.gpus_per_step": 4})


def cluster_executor_config(defs) -> dict:
    """The configuration the profile gave the k8s executor, resolved by Dagster's config system
    (so it also passed dagster-k8s' schema)."""
    executor = defs.executor
    assert executor.name == "k8s"
    resolved = executor.config_schema.resolve_config({})
    assert resolved.success, resolved.errors
    return resolved.value["config"]


def pod_spec(executor_config: dict, op: str):
    """The V1Job dagster-k8s would create for `op`'s step: executor-level context (namespace,
    service account, step_k8s_config), then the step's own override, as its step handler merges."""
    executor_level = K8sContainerContext(
        namespace=executor_config["job_namespace"],
        service_account_name=executor_config["service_account_name"],
        run_k8s_config=UserDefinedDagsterK8sConfig.from_dict(executor_config["step_k8s_config"]),
    )
    context = executor_level.merge(
        K8sContainerContext(
            run_k8s_config=UserDefinedDagsterK8sConfig.from_dict(executor_config["per_step_k8s_config"].get(op, {}))
        )
    )
    # The executor's job_image when the profile sets one (K8sStepHandler._get_image), else the run's image.
    job_config = context.get_k8s_job_config(
        executor_config.get("job_image") or "registry.example/flywheel:test", RUN_LAUNCHER
    )
    return construct_dagster_k8s_job(
        job_config,
        ["dagster", "api", "execute_step"],
        f"dagster-step-{op.replace('_', '-')}",
        user_defined_k8s_config=context.run_k8s_config,
        pod_name=f"dagster-step-{op.replace('_', '-')}",
        component="step_worker",
        labels={"dagster/op": op},
    )


def test_cluster_definitions_use_the_k8s_executor_with_gpu_steps(cluster):
    config = cluster_executor_config(cluster)
    assert config["job_namespace"] == "flywheel" and config["service_account_name"] == "flywheel-runner"
    ops = {
        node.name
        for job in ("foundation", "rl_round_job")
        for node in cluster.resolve_job_def(job).graph.node_dict.values()
    }
    assert set(config["per_step_k8s_config"]) == GPU_STEPS and GPU_STEPS <= ops


def test_gpu_step_pods_request_gpus_on_gpu_nodes_and_cpu_steps_do_not(cluster):
    config = cluster_executor_config(cluster)
    ops = {
        node.name
        for job in ("foundation", "rl_round_job")
        for node in cluster.resolve_job_def(job).graph.node_dict.values()
    }
    assert GPU_STEPS <= ops
    for op in sorted(ops):
        job = pod_spec(config, op)
        # the cluster autoscaler must not evict a running step when it consolidates nodes
        assert job.spec.template.metadata.annotations["cluster-autoscaler.kubernetes.io/safe-to-evict"] == "false", op
        spec = job.spec.template.spec
        container = spec.containers[0]
        limits, requests = container.resources.limits or {}, container.resources.requests or {}
        tolerated = {t.key for t in spec.tolerations or []}
        if op in GPU_STEPS:
            assert limits["nvidia.com/gpu"] == "1" and requests["nvidia.com/gpu"] == "1", op
            assert spec.node_selector == {"flywheel/node-pool": "gpu"} and "nvidia.com/gpu" in tolerated, op
            assert requests["memory"] == "26Gi"
        else:
            assert "nvidia.com/gpu" not in limits and not spec.node_selector and "nvidia.com/gpu" not in tolerated, op
            assert requests["cpu"] == "1"
        # the images the infra layer's ECR repositories hold (configs/cluster.yaml reads them from flywheel-env)
        assert container.image == CLUSTER_ENV["FLYWHEEL_TRAINER_IMAGE" if op in GPU_STEPS else "FLYWHEEL_IMAGE"], op
        assert [e.secret_ref.name for e in container.env_from or [] if e.secret_ref] == ["flywheel-env"]
        assert spec.service_account_name == "flywheel-runner"


def test_gpu_count_and_node_group_come_from_the_profile(tmp_path, monkeypatch, cluster_env):
    monkeypatch.setenv("FLYWHEEL_HOME", str(tmp_path))
    defs = build_definitions(
        "cluster",
        {
            "orchestration.k8s.gpus_per_step": 4,
            "orchestration.k8s.gpu_node_selector": {"pool": "a100"},
            "orchestration.launcher": "in_process",
        },
    )
    spec = pod_spec(cluster_executor_config(defs), "rl_round").spec.template.spec
    assert spec.containers[0].resources.limits["nvidia.com/gpu"] == "4" and spec.node_selector == {"pool": "a100"}


@pytest.mark.scaleout
def test_launched_steps_wait_on_cpu_nodes_while_their_jobs_get_the_gpus(launched):
    config = cluster_executor_config(launched)
    assert set(config["per_step_k8s_config"]) == set(), "every gpu-pool step is launched: no step pod asks for a GPU"
    for op in sorted(GPU_STEPS):
        spec = pod_spec(config, op).spec.template.spec
        assert "nvidia.com/gpu" not in (spec.containers[0].resources.limits or {}) and not spec.node_selector, op


@pytest.mark.scaleout
@pytest.mark.parametrize("job", ["sft", "rl_round", "benchmark"])
def test_each_heavy_step_is_launched_in_its_own_gpu_pod_through_pipes(launched, job):
    """The pod PipesK8sClient would create for a job, built by dagster-k8s' own `build_pod_body`
    from the launcher the profile configured: torchrun with one rank per GPU of the pod."""
    from dagster_k8s.pipes import build_pod_body

    launcher = launched.resources["launcher"]
    assert launcher.kind == "k8s" and launcher.namespace == "flywheel" and launcher.nproc_per_node == 4
    pod = build_pod_body(
        f"flywheel-{job}",
        "registry.example/flywheel:test",
        launcher.command(job),
        {"DAGSTER_PIPES_CONTEXT": "x"},
        {"labels": {"flywheel/job": job}},
        json.loads(launcher.pod_spec_json),
    )
    spec, container = pod.spec, pod.spec.containers[0]
    assert container.command == [
        "python",
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node=4",
        "-m",
        "assets.jobs",
        job,
    ]
    assert container.image == "registry.example/flywheel:test"
    assert container.resources.limits["nvidia.com/gpu"] == "4" and container.resources.requests["nvidia.com/gpu"] == "4"
    assert spec.node_selector == {"flywheel/node-pool": "gpu"} and "nvidia.com/gpu" in {t.key for t in spec.tolerations}
    assert spec.service_account_name == "flywheel-runner" and spec.restart_policy == "Never"
    assert [e.secret_ref.name for e in container.env_from if e.secret_ref] == ["flywheel-env"]
    # how the job finds its context
    assert [(e.name, e.value) for e in container.env] == [("DAGSTER_PIPES_CONTEXT", "x")]


def test_gpu_steps_and_the_sft_job_run_the_trainer_image(tmp_path, monkeypatch, cluster_env):
    """The CUDA/vLLM/DeepSpeed image (docker/trainer.Dockerfile) only where a GPU is; the other
    steps keep the user-code image (docker/dagster.Dockerfile)."""
    monkeypatch.setenv("FLYWHEEL_HOME", str(tmp_path))
    trainer = "registry.example/flywheel-trainer:1.0"
    defs = build_definitions(
        "cluster", {"orchestration.k8s.gpu_image": trainer, "orchestration.launcher": "in_process"}
    )
    config = cluster_executor_config(defs)
    assert pod_spec(config, "rl_round").spec.template.spec.containers[0].image == trainer
    assert pod_spec(config, "benchmark_scores").spec.template.spec.containers[0].image == trainer
    assert pod_spec(config, "training_tasks").spec.template.spec.containers[0].image == cluster_env["FLYWHEEL_IMAGE"]
    assert build_definitions("cluster", {"orchestration.k8s.gpu_image": trainer}).resources["launcher"].image == trainer
