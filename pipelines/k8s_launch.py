"""Multi-node steps on Kubernetes: an Indexed Job of `orchestration.k8s.nnodes` pods, launched and
read through Dagster Pipes (the `k8s` launcher with nnodes > 1).

One node is a single pod, which dagster-k8s' PipesK8sClient launches (assets/launcher.py). Several
nodes are what PipesK8sClient does not do, so this launcher does the same steps for a Job:

1. open a Pipes session (context in env vars, messages read from pod logs, as PipesK8sClient);
2. create the headless Service and the Indexed Job `pipelines/k8s_manifests.py::training_job`
   renders, with the session's variables in every pod's env (rank 0 talks, the others read);
3. wait for pod 0 (index 0 hosts torchrun's rendezvous and rank 0) and read its log stream into
   the session until it ends;
4. wait for the Job: every pod succeeded, or one failed, which fails the step with `RankFailed`
   naming the node and its last lines;
5. delete the Job (and its pods) and the Service, whatever happened.

It lives in `pipelines` because it renders manifests from the profile (assets cannot import
pipelines); the assets see a JobLauncher like any other.
"""

from __future__ import annotations

import hashlib
import json
import time
from typing import Any

from assets.launcher import JobLauncher, RankFailed, rank_failure_message
from configs import load_profile

POLL_S = 5.0
POD_START_TIMEOUT_S = 30 * 60.0  # GPU nodes scale up from zero: minutes, and images are large
JOB_TIMEOUT_S = 24 * 3600.0


def job_name(run_id: str, job: str) -> str:
    """A DNS label unique to the run and step: flywheel-<job>-<8 hex of the run id>."""
    return f"flywheel-{job.replace('_', '-')}-{hashlib.sha256(run_id.encode()).hexdigest()[:8]}"


class IndexedJobLauncher(JobLauncher):
    """`JobLauncher(kind="k8s")` whose steps span `nnodes` pods (one node: the parent's single pod)."""

    nnodes: int = 1
    profile: str = "cluster"
    overrides_json: str = "{}"
    poll_s: float = POLL_S

    def launch(self, context, job: str, extras: dict[str, Any]):
        if self.nnodes == 1:
            return super().launch(context, job, extras)
        from dagster import PipesClientCompletedInvocation, open_pipes_session
        from dagster._core.pipes.utils import PipesEnvContextInjector
        from dagster_k8s.pipes import PipesK8sPodLogsMessageReader

        core, batch = self._clients()
        reader = PipesK8sPodLogsMessageReader()
        with open_pipes_session(
            context=context, extras=extras, context_injector=PipesEnvContextInjector(), message_reader=reader
        ) as session:
            self.run_job(context, job, session.get_bootstrap_env_vars(), core, batch, reader)
        return PipesClientCompletedInvocation(session)

    def _clients(self):
        """(CoreV1Api, BatchV1Api) of the cluster the step pod runs in (its service account)."""
        import kubernetes

        kubernetes.config.load_incluster_config()
        return kubernetes.client.CoreV1Api(), kubernetes.client.BatchV1Api()

    def run_job(self, context, job: str, env: dict[str, str], core, batch, reader) -> None:
        """Steps 2-5 against the Kubernetes API clients `core` (CoreV1Api) and `batch` (BatchV1Api)."""
        from pipelines.k8s_manifests import training_job

        cfg = load_profile(self.profile, json.loads(self.overrides_json))
        name = job_name(context.run_id, job)
        service, job_manifest = training_job(cfg, job, nnodes=self.nnodes, env=env, name=name)
        core.create_namespaced_service(self.namespace, service)
        try:
            batch.create_namespaced_job(self.namespace, job_manifest)
            context.log.info(
                f"launched {job!r} as Job {self.namespace}/{name}: {self.nnodes} nodes x {self.nproc_per_node} ranks"
            )
            leader = self._wait_for_pod_zero(core, name)
            reader.consume_pod_logs(context=context, core_api=core, pod_name=leader, namespace=self.namespace)
            self._wait_for_job(core, batch, job, name)
        finally:
            batch.delete_namespaced_job(name, self.namespace, propagation_policy="Background")  # its pods go with it
            core.delete_namespaced_service(name, self.namespace)

    def _selector(self, name: str, index: int | None = None) -> str:
        selector = f"batch.kubernetes.io/job-name={name}"
        return selector if index is None else f"{selector},batch.kubernetes.io/job-completion-index={index}"

    def _wait_for_pod_zero(self, core, name: str) -> str:
        deadline = time.monotonic() + POD_START_TIMEOUT_S
        while time.monotonic() < deadline:
            for pod in core.list_namespaced_pod(self.namespace, label_selector=self._selector(name, 0)).items:
                if pod.status.phase in ("Running", "Succeeded", "Failed"):  # it has logs to read
                    return pod.metadata.name
            time.sleep(self.poll_s)
        raise TimeoutError(
            f"Job {self.namespace}/{name}: pod 0 did not start within {POD_START_TIMEOUT_S / 60:.0f} min "
            f"(no free GPU node? check `kubectl describe job {name} -n {self.namespace}`)"
        )

    def _wait_for_job(self, core, batch, job: str, name: str) -> None:
        deadline = time.monotonic() + JOB_TIMEOUT_S
        while time.monotonic() < deadline:
            status = batch.read_namespaced_job_status(name, self.namespace).status
            if (status.failed or 0) > 0:
                raise RankFailed(rank_failure_message(job, self._failed_nodes(core, name), unit="node"))
            if (status.succeeded or 0) >= self.nnodes:
                return
            time.sleep(self.poll_s)
        raise TimeoutError(f"Job {self.namespace}/{name} did not finish within {JOB_TIMEOUT_S / 3600:.0f} h")

    def _failed_nodes(self, core, name: str) -> dict[int, str]:
        """{completion index: last lines} of the Job's failed pods."""
        failed = {}
        for pod in core.list_namespaced_pod(self.namespace, label_selector=self._selector(name)).items:
            if pod.status.phase == "Failed":
                index = int(pod.metadata.labels["batch.kubernetes.io/job-completion-index"])
                failed[index] = core.read_namespaced_pod_log(pod.metadata.name, self.namespace, tail_lines=20)
        return failed
