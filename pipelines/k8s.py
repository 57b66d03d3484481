"""The `k8s` executor of the `cluster` profile: one pod per step, GPU steps on the GPU nodes.

Which steps need a GPU is not listed twice: it is the `gpu` concurrency pool the assets declare
(assets/policies.py). Those steps get `nvidia.com/gpu`, the GPU node group's node selector and
the tolerations for its taints through dagster-k8s' `per_step_k8s_config`; every other step gets
the CPU resources through `step_k8s_config`.
"""

from __future__ import annotations

from typing import Any

from assets.launcher import LAUNCHED_OPS
from assets.policies import GPU_POOL
from configs import FlywheelConfig
from configs.schema import K8sConfig

# A step pod is a bare Job pod: when the cluster autoscaler consolidates nodes it would evict one
# mid-step (an RL round an hour in). This annotation makes it wait for the pod to finish instead.
NO_EVICTION = {"cluster-autoscaler.kubernetes.io/safe-to-evict": "false"}


def gpu_ops(assets: list, cfg: FlywheelConfig | None = None) -> list[str]:
    """Op names of the assets in the `gpu` pool (a multi-asset is one op) that do their GPU work
    in their own step pod."""
    ops = {a.node_def.name for a in assets if GPU_POOL in (a.node_def.pools or ())}
    if cfg is not None and cfg.orchestration.launcher == "k8s":
        ops -= set(LAUNCHED_OPS)  # their Pipes job pods get the GPUs; the steps only wait for them
    return sorted(ops)


def step_config(k8s: K8sConfig, *, gpu: bool) -> dict[str, Any]:
    """dagster-k8s user-defined config (container, pod spec, job spec) of one step's pod."""
    resources = {
        kind: dict(values) for kind, values in (k8s.gpu_step_resources if gpu else k8s.cpu_step_resources).items()
    }
    pod_spec: dict[str, Any] = {}
    if gpu:
        for kind in ("requests", "limits"):  # extended resources: request and limit must match
            resources.setdefault(kind, {})["nvidia.com/gpu"] = str(k8s.gpus_per_step)
        pod_spec |= {
            "node_selector": dict(k8s.gpu_node_selector),
            "tolerations": [dict(t) for t in k8s.gpu_tolerations],
        }
    container: dict[str, Any] = {"resources": resources}
    if gpu and k8s.gpu_image:  # the CUDA/vLLM/DeepSpeed image; other steps keep the lighter user-code image
        container["image"] = k8s.gpu_image
    if k8s.env_secret:
        container["env_from"] = [{"secret_ref": {"name": k8s.env_secret}}]
    # a failed step is retried by Dagster (RetryPolicy), not by Kubernetes re-running the pod
    return {
        "container_config": container,
        "pod_spec_config": pod_spec,
        "pod_template_spec_metadata": {"annotations": dict(NO_EVICTION)},
        "job_spec_config": {"backoff_limit": 0},
    }


def job_pod_spec(k8s: K8sConfig) -> dict[str, Any]:
    """Base pod spec of a training job launched through Pipes (PipesK8sClient): the GPU step's
    resources, node selector and tolerations, in the pod spec's own (snake_case) field names."""
    step = step_config(k8s, gpu=True)
    return {
        **step["pod_spec_config"],
        "service_account_name": k8s.service_account,
        "containers": [dict(step["container_config"])],
    }


def executor_config(cfg: FlywheelConfig, gpu_op_names: list[str]) -> dict[str, Any]:
    k8s = cfg.orchestration.k8s
    config: dict[str, Any] = {
        "job_namespace": k8s.namespace,
        "service_account_name": k8s.service_account,
        "max_concurrent": k8s.max_concurrent,
        "step_k8s_config": step_config(k8s, gpu=False),
        "per_step_k8s_config": {op: step_config(k8s, gpu=True) for op in gpu_op_names},
    }
    if k8s.image:
        config["job_image"] = k8s.image
    return config
