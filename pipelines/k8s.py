"""The `k8s` executor of the `cluster` profile: one pod per step, GPU steps on the GPU nodes.

Which steps need a GPU is not listed twice: it is the `gpu` concurrency pool the assets declare
(assets/policies.py). Those steps get `nvidia.com/gpu`, the GPU node group's node selector and
the tolerations for its taints through dagster-k8s' `per_step_k8s_config`; every other step gets
the CPU resources through `step_k8s_config`.
"""

from __future__ import annotations

from typing import Any

from assets.policies import GPU_POOL
from configs import FlywheelConfig
from configs.schema import K8sConfig


def gpu_ops(assets: list) -> list[str]:
    """Op names of the assets in the `gpu` pool (a multi-asset is one op)."""
    return sorted({a.node_def.name for a in assets if GPU_POOL in (a.node_def.pools or ())})


def step_config(k8s: K8sConfig, *, gpu: bool) -> dict[str, Any]:
    """dagster-k8s user-defined config (container, pod spec, job spec) of one step's pod."""
    resources = {kind: dict(values) for kind, values in (k8s.gpu_step_resources if gpu else k8s.cpu_step_resources).items()}
    pod_spec: dict[str, Any] = {}
    if gpu:
        for kind in ("requests", "limits"):  # extended resources: request and limit must match
            resources.setdefault(kind, {})["nvidia.com/gpu"] = str(k8s.gpus_per_step)
        pod_spec |= {"node_selector": dict(k8s.gpu_node_selector), "tolerations": [dict(t) for t in k8s.gpu_tolerations]}
    container: dict[str, Any] = {"resources": resources}
    if k8s.env_secret:
        container["env_from"] = [{"secret_ref": {"name": k8s.env_secret}}]
    # a failed step is retried by Dagster (RetryPolicy), not by Kubernetes re-running the pod
    return {"container_config": container, "pod_spec_config": pod_spec, "job_spec_config": {"backoff_limit": 0}}


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
