"""The one place a profile picks its resources, IO manager and executor."""

from __future__ import annotations

import json
from typing import Any

from dagster import ExecutorDefinition, in_process_executor, multiprocess_executor

from assets.io import FrameIOManager
from assets.launcher import JobLauncher
from assets.resources import ArtifactStore, FlywheelSettings, SandboxResource, default_tracking_uri
from assets.tracking import MLflowTracker
from configs import FlywheelConfig, flywheel_home


def resources_for(cfg: FlywheelConfig, overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    home = flywheel_home()
    root = cfg.storage.root or str(home / "artifacts")
    tracking_uri = cfg.tracking.tracking_uri or default_tracking_uri(home)
    return {
        "settings": FlywheelSettings(profile=cfg.profile, overrides_json=json.dumps(overrides or {})),
        "storage": ArtifactStore(root=root, cache_dir=str(home / "cache")),
        "io_manager": FrameIOManager(root=f"{root.rstrip('/')}/assets"),
        "tracker": MLflowTracker(
            tracking_uri=tracking_uri,
            experiment=cfg.tracking.experiment,
            registered_model=cfg.tracking.registered_model,
            ui_url=cfg.tracking.ui_url,
            artifact_location=str(home / "mlartifacts") if tracking_uri.startswith("sqlite:") else None,
        ),
        "sandbox": SandboxResource.from_config(cfg.sandbox),
        "launcher": launcher_for(cfg, overrides),
    }


def launcher_for(cfg: FlywheelConfig, overrides: dict[str, Any] | None = None) -> JobLauncher:
    kind = cfg.orchestration.launcher
    if kind != "k8s":
        return JobLauncher(kind=kind, nproc_per_node=cfg.orchestration.nproc_per_node)
    from pipelines.k8s import job_pod_spec
    from pipelines.k8s_launch import IndexedJobLauncher

    k8s = cfg.orchestration.k8s  # one rank per GPU of each of the job's nnodes pods
    return IndexedJobLauncher(
        kind=kind,
        nproc_per_node=k8s.gpus_per_step,
        namespace=k8s.namespace,
        image=k8s.gpu_image or k8s.image,
        pod_spec_json=json.dumps(job_pod_spec(k8s)),
        nnodes=k8s.nnodes,
        profile=cfg.profile,
        overrides_json=json.dumps(overrides or {}),
    )


def executor_for(cfg: FlywheelConfig, assets: list | None = None) -> ExecutorDefinition:
    """`assets`: the definitions' assets, whose `gpu` pool decides which step pods get a GPU (k8s)."""
    if cfg.orchestration.executor == "in_process":
        return in_process_executor  # tiny models: a process per step would cost more than the step
    if cfg.orchestration.executor == "multiprocess":
        return multiprocess_executor
    try:
        from dagster_k8s import k8s_job_executor
    except ImportError as exc:
        raise RuntimeError(
            "orchestration.executor = k8s needs the dagster-k8s package (installed in the cluster image)"
        ) from exc
    from pipelines.k8s import executor_config, gpu_ops

    return k8s_job_executor.configured(executor_config(cfg, gpu_ops(assets or [], cfg)), name="k8s")
