"""Training launched outside the step through Dagster Pipes (`orchestration.sft_launcher`).

`subprocess` runs the job (`python -m assets.jobs NAME`) as a child process of the step: the
local implementation, exercised by the tests. `k8s` runs the same command in its own pod with
dagster-k8s' PipesK8sClient: on the cluster the training pod gets the GPUs, node selector and
tolerations (pipelines/k8s.py builds its spec) while the step that launched it waits on a CPU
node. Either way the job reports its log lines, its history and the materialization back
through Pipes, so the step's Dagster events and MLflow run look the same as in-process.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from dagster import ConfigurableResource, PipesSubprocessClient

REPO = Path(__file__).resolve().parents[1]


class JobLauncher(ConfigurableResource):
    kind: str = "in_process"  # in_process | subprocess | k8s
    namespace: str = "flywheel"
    image: str | None = None  # None: the image the launching step runs (dagster-k8s sets DAGSTER_CURRENT_IMAGE)
    pod_spec_json: str = "{}"  # base pod spec of the job's pod (k8s): resources, node selector, tolerations

    @property
    def external(self) -> bool:
        return self.kind != "in_process"

    def command(self, job: str) -> list[str]:
        return [sys.executable if self.kind == "subprocess" else "python", "-m", "assets.jobs", job]

    def launch(self, context, job: str, extras: dict[str, Any]):
        """Run `job` to completion; returns Dagster's completed Pipes invocation (its reported
        materialization and custom messages). A failed job raises with its exit status."""
        if self.kind == "subprocess":
            return PipesSubprocessClient(cwd=str(REPO)).run(context=context, command=self.command(job), extras=extras)
        if self.kind == "k8s":
            from dagster_k8s import PipesK8sClient

            image = self.image or os.environ.get("DAGSTER_CURRENT_IMAGE")
            if not image:
                raise RuntimeError("orchestration.sft_launcher = k8s needs an image: set orchestration.k8s.image, "
                                   "or launch from a dagster-k8s step pod (DAGSTER_CURRENT_IMAGE)")
            return PipesK8sClient(load_incluster_config=True).run(
                context=context, extras=extras, image=image, command=self.command(job), namespace=self.namespace,
                base_pod_spec=json.loads(self.pod_spec_json), base_pod_meta={"labels": {"flywheel/job": job}},
            )
        raise ValueError(f"orchestration.sft_launcher {self.kind!r} launches nothing (in_process runs in the step)")
