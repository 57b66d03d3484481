"""Registering a plain folder, as versions were registered before they were MLflow models (what
the registry tests need of a version: a source, a run with its scores, tags), without logging
and validating a whole agent model per version (tests/pipelines/test_serve.py does that)."""

from pathlib import Path


def folder_model(tracker, run_id: str, folder: Path):
    """The `log_model` of MLflowTracker.register_model for an artifact folder: (its source, no logged model)."""

    def log() -> tuple[str, None]:
        client = tracker.client()
        client.log_artifacts(run_id, str(folder), "checkpoint")
        return f"{client.get_run(run_id).info.artifact_uri}/checkpoint", None

    return log
