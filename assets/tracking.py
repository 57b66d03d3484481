"""MLflow as a Dagster resource: one run per asset materialization, the model registry with
aliases (`champion`, `challenger`), and the per-task scores the promotion gate compares.

Runs nest under one parent per round (`round-3`: the RL round, its benchmark, any reward audit)
or per foundation run (`foundation-1a2b3c4d`: SFT and its benchmark), so the MLflow UI shows the
flywheel as rounds that expand into their steps, and the parent carries the round's headline
figures and the benchmark table.
"""

from __future__ import annotations

import contextlib
import json
import math
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator

from dagster import ConfigurableResource

CHAMPION, CHALLENGER = "champion", "challenger"
CHAMPION_HISTORY_TAG = "champion_history"  # registered-model tag: JSON list of champion versions, oldest first
HISTORY_KEPT = 200  # entries; MLflow tag values are capped at a few thousand characters
GROUP_TAG = "flywheel.group"  # on a parent run and its children: round-N or foundation-<dagster run>
PARENT_RUN_ID_TAG = "mlflow.parentRunId"  # what the MLflow UI nests by


def group_of(context) -> str:
    """The parent a materialization's run nests under: its round, or the foundation run that made
    it (a re-execution from failure shares its root run, so it joins the same parent)."""
    if context.has_partition_key:
        return f"round-{context.partition_key}"
    run = context.dagster_run
    return f"foundation-{(run.root_run_id or run.run_id)[:8]}"


def flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flatten(value, name + "."))
        else:
            out[name] = value
    return out


class MLflowTracker(ConfigurableResource):
    tracking_uri: str
    experiment: str = "agentic-flywheel"
    registered_model: str = "agentic-policy"
    # Where a newly created experiment stores artifacts. With a local sqlite store MLflow would
    # otherwise use ./mlruns under the *current directory*; None leaves it to the server.
    artifact_location: str | None = None
    ui_url: str = "http://localhost:5000"  # for links in Dagster metadata

    def client(self):
        import mlflow
        from mlflow import MlflowClient

        mlflow.set_tracking_uri(self.tracking_uri)
        return MlflowClient(self.tracking_uri)

    def group_run(self, group: str) -> str:
        """The id of the parent run for `group`, created on first use. It is closed at once: its
        children run later, possibly in other processes, and it only holds their summary."""
        client = self.client()
        experiment = client.get_experiment_by_name(self.experiment)
        experiment_id = experiment.experiment_id if experiment else client.create_experiment(self.experiment, artifact_location=self.artifact_location)
        found = client.search_runs([experiment_id], filter_string=f"tags.`{GROUP_TAG}` = '{group}' and tags.`flywheel.role` = 'group'",
                                   order_by=["attributes.start_time ASC"], max_results=1)
        if found:  # the oldest: two steps racing to create it converge on one next time
            return found[0].info.run_id
        run = client.create_run(experiment_id, run_name=group, tags={GROUP_TAG: group, "flywheel.role": "group"})
        client.set_terminated(run.info.run_id)
        return run.info.run_id

    def parent_of(self, run_id: str) -> str | None:
        return self.client().get_run(run_id).data.tags.get(PARENT_RUN_ID_TAG)

    @contextlib.contextmanager
    def run(self, context, name: str, params: dict[str, Any] | None = None) -> Iterator[str]:
        """Start a run tagged with the Dagster run id, asset and partition, nested under its round
        (or foundation) parent; yield its id."""
        import mlflow

        group = group_of(context)
        parent = self.group_run(group)
        mlflow.set_experiment(self.experiment)
        partition = context.partition_key if context.has_partition_key else ""
        tags = {"dagster.run_id": context.run_id, "dagster.asset": name, "dagster.partition": partition, GROUP_TAG: group}
        with mlflow.start_run(run_name=f"{name}{'-' + partition if partition else ''}", tags=tags, parent_run_id=parent) as run:
            if params:
                mlflow.log_params({k: str(v)[:500] for k, v in flatten(params).items()})
            yield run.info.run_id

    def run_link(self, run_id: str):
        """The run's page in the MLflow UI, as Dagster metadata."""
        from dagster import MetadataValue

        experiment_id = self.client().get_run(run_id).info.experiment_id
        return MetadataValue.url(f"{self.ui_url.rstrip('/')}/#/experiments/{experiment_id}/runs/{run_id}")

    def version_link(self, version: str):
        from dagster import MetadataValue

        return MetadataValue.url(f"{self.ui_url.rstrip('/')}/#/models/{self.registered_model}/versions/{version}")

    def log_history(self, run_id: str, history: list[dict[str, float]]) -> None:
        """Per-step metrics in one batch call (a call per value is slow on sqlite)."""
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(k, float(v), now, int(h["step"])) for h in history for k, v in h.items() if k != "step" and v is not None]
        client = self.client()
        for i in range(0, len(metrics), 900):
            client.log_batch(run_id, metrics=metrics[i : i + 900])

    def log_metrics(self, run_id: str, metrics: dict[str, float]) -> None:
        self.log_history(run_id, [{"step": 0, **metrics}])

    def log_png(self, run_id: str, png: bytes, name: str) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / name
            path.write_bytes(png)
            self.client().log_artifact(run_id, str(path), "plots")

    def log_text(self, run_id: str, text: str, name: str) -> None:
        self.client().log_text(run_id, text, name)

    def log_json(self, run_id: str, obj: Any, name: str) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / name
            path.write_text(json.dumps(obj))
            self.client().log_artifact(run_id, str(path))

    def load_json(self, run_id: str, name: str) -> Any:
        import mlflow

        self.client()
        return json.loads(Path(mlflow.artifacts.download_artifacts(run_id=run_id, artifact_path=name)).read_text())

    def register_checkpoint(self, run_id: str, checkpoint_dir: Path, tags: dict[str, str]):
        """Log the HF folder to the run and make it a new version of the registered model."""
        from mlflow.exceptions import MlflowException

        client = self.client()
        client.log_artifacts(run_id, str(checkpoint_dir), "checkpoint")
        try:
            client.create_registered_model(self.registered_model)
        except MlflowException:
            pass  # already exists
        source = f"{client.get_run(run_id).info.artifact_uri}/checkpoint"
        return client.create_model_version(self.registered_model, source, run_id=run_id, tags=tags)

    def version_by_alias(self, alias: str):
        from mlflow.exceptions import MlflowException

        try:
            return self.client().get_model_version_by_alias(self.registered_model, alias)
        except MlflowException:
            return None

    def set_alias(self, alias: str, version: str) -> None:
        self.client().set_registered_model_alias(self.registered_model, alias, version)

    def champion_history(self) -> list[str]:
        from mlflow.exceptions import MlflowException

        try:
            model = self.client().get_registered_model(self.registered_model)
        except MlflowException:
            return []
        return json.loads(model.tags.get(CHAMPION_HISTORY_TAG, "[]"))

    def promote(self, version: str, reason: str) -> None:
        """Make `version` the champion, recording why (the gate, or a forced promotion) on the
        version and appending it to the champion history that `rollback` walks back."""
        client = self.client()
        history, current = self.champion_history(), self.version_by_alias(CHAMPION)
        if current is not None and (not history or history[-1] != str(current.version)):
            history.append(str(current.version))  # a champion set without history (by hand in the UI, or an older home)
        history = [*history, str(version)][-HISTORY_KEPT:]
        client.set_registered_model_alias(self.registered_model, CHAMPION, str(version))
        client.set_registered_model_tag(self.registered_model, CHAMPION_HISTORY_TAG, json.dumps(history))
        client.set_model_version_tag(self.registered_model, str(version), "promoted_by", reason)

    def rollback(self) -> tuple[str, str]:
        """Give the champion alias back to the previous champion; returns (from, to)."""
        current = self.version_by_alias(CHAMPION)
        if current is None:
            raise LookupError(f"registered model {self.registered_model!r} has no champion to roll back")
        history, was = self.champion_history(), str(current.version)
        earlier = [i for i, v in enumerate(history) if v != was]
        if not earlier:
            raise LookupError(f"version {was} is the only champion {self.registered_model!r} has had: nothing to roll back to")
        target = history[earlier[-1]]
        client = self.client()
        client.set_registered_model_alias(self.registered_model, CHAMPION, target)
        client.set_registered_model_tag(self.registered_model, CHAMPION_HISTORY_TAG, json.dumps(history[: earlier[-1] + 1]))
        client.set_model_version_tag(self.registered_model, was, "rolled_back", "true")
        return was, target

    def version_rows(self) -> list[dict]:
        """Every version with its benchmark summary and the aliases pointing at it: the
        benchmark table (`make models`, and an artifact of each benchmark run)."""
        client, versions = self.client(), self.versions()
        aliases: dict[str, list[str]] = {}
        if versions:  # version search results carry no aliases; the registered model does
            for alias, version in client.get_registered_model(self.registered_model).aliases.items():
                aliases.setdefault(str(version), []).append(alias)
        rows = []
        for v in versions:
            metrics = client.get_run(v.run_id).data.metrics if v.run_id else {}
            rows.append({
                "version": str(v.version), "stage": v.tags.get("stage", ""), "round": v.tags.get("round", ""),
                "pass_at_1": metrics.get("pass_at_1", math.nan), "ci_low": metrics.get("pass_at_1_ci_low", math.nan),
                "ci_high": metrics.get("pass_at_1_ci_high", math.nan), "aliases": ",".join(sorted(aliases.get(str(v.version), []))),
                "promoted_by": v.tags.get("promoted_by", ""), "blocked_by": v.tags.get("blocked_by", ""),
            })
        return rows

    def versions(self) -> list:
        from mlflow.exceptions import MlflowException

        try:
            found = self.client().search_model_versions(f"name='{self.registered_model}'")
        except MlflowException:
            return []
        return sorted(found, key=lambda v: int(v.version))
