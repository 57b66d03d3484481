"""Resources: each external system with a real local implementation and a cluster one.

Picked in one place (`pipelines.resources.resources_for(profile)`):
  settings  - the validated FlywheelConfig for the profile
  storage   - artifact root: a local folder, or s3://… through s3fs (fsspec)
  tracker   - MLflow (sqlite under FLYWHEEL_HOME locally, a tracking server on the cluster)
  sandbox   - bubblewrap workers locally, Docker containers on the cluster
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any, Iterator

import fsspec
from dagster import ConfigurableResource

from configs import FlywheelConfig, load_profile
from configs.schema import SandboxConfig


class FlywheelSettings(ConfigurableResource):
    """Which profile (plus `section.field` overrides as JSON) the assets run with."""

    profile: str = "tiny"
    overrides_json: str = "{}"

    @property
    def config(self) -> FlywheelConfig:
        return load_profile(self.profile, json.loads(self.overrides_json))


class ArtifactStore(ConfigurableResource):
    """Checkpoints and tokenizers as HF folders under `root` (local path or s3:// URI)."""

    root: str
    cache_dir: str

    @property
    def is_local(self) -> bool:
        return "://" not in self.root or self.root.startswith("file://")

    def uri(self, *parts: str) -> str:
        return "/".join([self.root.rstrip("/"), *parts])

    @contextlib.contextmanager
    def writable_dir(self, *parts: str) -> Iterator[tuple[Path, str]]:
        """Yield a local folder to save into and the URI it will live at. Remote roots are
        uploaded after the block: a crash mid-save never leaves a half-written remote copy."""
        uri = self.uri(*parts)
        if self.is_local:
            path = Path(fsspec.core.url_to_fs(uri)[1])
            path.mkdir(parents=True, exist_ok=True)
            yield path, str(path)
            return
        with tempfile.TemporaryDirectory() as tmp:
            yield Path(tmp), uri
            fs, remote = fsspec.core.url_to_fs(uri)
            fs.put(tmp.rstrip("/") + "/", remote, recursive=True)

    def local_path(self, uri: str) -> Path:
        """A local folder holding `uri` (downloaded once into the cache for remote roots)."""
        if "://" not in uri or uri.startswith("file://"):
            return Path(fsspec.core.url_to_fs(uri)[1])
        fs, remote = fsspec.core.url_to_fs(uri)
        target = Path(self.cache_dir) / remote.strip("/").replace("/", "__")
        if not target.exists():
            fs.get(remote.rstrip("/") + "/", str(target) + "/", recursive=True)
        return target


class SandboxResource(ConfigurableResource):
    kind: str = "bubblewrap"
    image: str = "python:3.11-slim"  # the docker tier's image
    pool_size: int = 2
    timeout_s: float = 2.0
    memory_mb: int = 256
    max_processes: int = 8

    @classmethod
    def from_config(cls, cfg: SandboxConfig) -> "SandboxResource":
        return cls(**cfg.model_dump())

    @contextlib.contextmanager
    def open(self) -> Iterator[Any]:
        from verifiers.sandbox import SandboxLimits, make_sandbox

        limits = SandboxLimits(timeout_s=self.timeout_s, cpu_s=max(1, int(self.timeout_s)), memory_mb=self.memory_mb, max_processes=self.max_processes)
        sandbox = make_sandbox(self.kind, limits, self.pool_size, image=self.image)
        try:
            yield sandbox
        finally:
            sandbox.close()


def default_tracking_uri(home: Path) -> str:
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{home}/mlflow.db"
