"""Heavy steps launched outside the step's process through Dagster Pipes (`orchestration.launcher`).

`subprocess` runs the job (`python -m assets.jobs NAME`) as a child process of the step, or, with
`orchestration.nproc_per_node` N > 1, as N ranks under torchrun (`--standalone`, gloo on CPU,
NCCL on GPUs): the local implementation, exercised by the tests. `k8s` runs the same command in
its own pod with dagster-k8s' PipesK8sClient: on the cluster the training pod gets the GPUs,
node selector and tolerations (pipelines/k8s.py builds its spec), torchrun one rank per GPU,
while the step that launched it waits on a CPU node. Either way rank 0 reports its log lines,
its history and the materialization back through Pipes, so the step's Dagster events and MLflow
run (one per step, opened by the step) look the same as in-process.

A rank that dies fails the step with an error naming the rank and the last lines it wrote
(torchrun keeps each rank's output under --log-dir); re-executing the step resumes from the
job's last state checkpoint.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from dagster import ConfigurableResource, PipesSubprocessClient

REPO = Path(__file__).resolve().parents[1]
TAIL_LINES = 20
# The steps whose heavy work a launcher runs (assets/jobs.py); on the cluster their step pods only wait.
LAUNCHED_OPS = ("sft_checkpoint", "rl_round", "base_benchmark_scores", "sft_benchmark_scores", "benchmark_scores")


class RankFailed(RuntimeError):
    """A rank of a launched job exited with an error; the message names it and shows its last lines."""


class JobLauncher(ConfigurableResource):
    kind: str = "in_process"  # in_process | subprocess | k8s
    nproc_per_node: int = 1
    namespace: str = "flywheel"
    image: str | None = None  # None: the image the launching step runs (dagster-k8s sets DAGSTER_CURRENT_IMAGE)
    pod_spec_json: str = "{}"  # base pod spec of the job's pod (k8s): resources, node selector, tolerations

    @property
    def external(self) -> bool:
        return self.kind != "in_process"

    def command(self, job: str, log_dir: str | None = None) -> list[str]:
        python = sys.executable if self.kind == "subprocess" else "python"
        if self.nproc_per_node == 1:
            return [python, "-m", "assets.jobs", job]
        # --redirects/--tee: each rank's output goes to its own file under log_dir and still to ours
        logs = ["--log-dir", log_dir, "--redirects", "3", "--tee", "3"] if log_dir else []
        return [
            python,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc-per-node={self.nproc_per_node}",
            *logs,
            "-m",
            "assets.jobs",
            job,
        ]

    def launch(self, context, job: str, extras: dict[str, Any]):
        """Run `job` to completion; returns Dagster's completed Pipes invocation (its reported
        materialization and custom messages). A failed job raises with its exit status, and a
        failed rank with its last log lines."""
        if self.kind == "subprocess":
            log_dir = tempfile.mkdtemp(prefix=f"flywheel-{job}-ranks-") if self.nproc_per_node > 1 else None
            try:
                return PipesSubprocessClient(cwd=str(REPO)).run(
                    context=context, command=self.command(job, log_dir), extras=extras
                )
            except Exception as exc:
                if log_dir and (failed := failed_ranks(Path(log_dir))):
                    raise RankFailed(rank_failure_message(job, failed)) from exc
                raise
            finally:
                if log_dir:
                    shutil.rmtree(log_dir, ignore_errors=True)
        if self.kind == "k8s":
            from dagster_k8s import PipesK8sClient

            image = self.image or os.environ.get("DAGSTER_CURRENT_IMAGE")
            if not image:
                raise RuntimeError(
                    "orchestration.launcher = k8s needs an image: set orchestration.k8s.image, "
                    "or launch from a dagster-k8s step pod (DAGSTER_CURRENT_IMAGE)"
                )
            return PipesK8sClient(load_incluster_config=True).run(
                context=context,
                extras=extras,
                image=image,
                command=self.command(job),
                namespace=self.namespace,
                base_pod_spec=json.loads(self.pod_spec_json),
                base_pod_meta={"labels": {"flywheel/job": job}},
            )
        raise ValueError(f"orchestration.launcher {self.kind!r} launches nothing (in_process runs in the step)")


def failed_ranks(log_dir: Path) -> dict[int, str]:
    """{rank: its last lines} of every rank that failed, from torchrun's log folder
    (<log_dir>/<run id>/attempt_<n>/<local rank>/{stdout,stderr}.log, error.json when it raised).
    A rank that raised left error.json; one killed by a signal left none, so without any
    error.json every rank whose output ends in a traceback or is cut short is shown."""
    ranks: dict[int, tuple[bool, str]] = {}
    for folder in sorted(log_dir.glob("*/attempt_*/*")):
        if not folder.name.isdigit():
            continue
        lines = []
        for name in ("stdout.log", "stderr.log"):
            path = folder / name
            if path.exists():
                lines += path.read_text(errors="replace").splitlines()
        ranks[int(folder.name)] = ((folder / "error.json").exists(), "\n".join(lines[-TAIL_LINES:]))
    raised = {rank: tail for rank, (error, tail) in ranks.items() if error}
    return raised or {rank: tail for rank, (_, tail) in ranks.items()}


def rank_failure_message(job: str, failed: dict[int, str], unit: str = "rank") -> str:
    """`unit`: what the keys number, a rank (torchrun's log folder) or a node (a multi-node Job's pod)."""
    parts = [
        f"job {job!r}: {unit} {', '.join(map(str, sorted(failed)))} failed; re-execute the step to resume from its last state checkpoint"
    ]
    for index, tail in sorted(failed.items()):
        parts.append(f"--- {unit} {index}, last {TAIL_LINES} lines ---\n{tail or '(no output)'}")
    return "\n".join(parts)
