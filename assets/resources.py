"""Resources: each external system with a real local implementation and a cluster one.

Picked in one place (`pipelines.resources.resources_for(profile)`):
  settings  - the validated FlywheelConfig for the profile
  storage   - artifact root: a local folder, or s3://… through s3fs (fsspec)
  tracker   - MLflow (sqlite under FLYWHEEL_HOME locally, a tracking server on the cluster)
  sandbox   - bubblewrap workers locally, Docker containers or a sandbox service on the cluster
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
import uuid
from pathlib import Path
from typing import Any, Iterator

import fsspec
from dagster import ConfigurableResource

from assets.artifacts import (
    MANIFEST,
    CorruptArtifact,
    atomic_folder,
    build_manifest,
    config_hash,
    filesystem,
    folder_files,
    remote_errors,
    replace_dir,
    verify_folder,
    write_json_atomic,
)
from configs import FlywheelConfig, load_profile
from configs.schema import SandboxConfig
from environments.family import resolve_families


class FlywheelSettings(ConfigurableResource):
    """Which profile (plus `section.field` overrides as JSON) the assets run with."""

    profile: str = "tiny"
    overrides_json: str = "{}"

    @property
    def config(self) -> FlywheelConfig:
        return resolve_families(load_profile(self.profile, json.loads(self.overrides_json)))

    def provenance(self, run_id: str | None) -> dict[str, Any]:
        """What an artifact's manifest records about who made it (assets/artifacts.py)."""
        return {
            "profile": self.profile,
            "config_hash": config_hash(self.config.model_dump_json()),
            "dagster_run_id": run_id,
        }


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
    def writable_dir(self, *parts: str, provenance: dict[str, Any] | None = None) -> Iterator[tuple[Path, str]]:
        """Yield a local folder to save into and the URI it will live at. Nothing appears at the
        URI until the block succeeds: locally the folder is renamed into place, remotely it is
        uploaded after the block; either way its manifest (assets/artifacts.py) is written last."""
        uri = self.uri(*parts)
        artifact = "/".join(parts)
        if self.is_local:
            target = Path(fsspec.core.url_to_fs(uri)[1])
            with atomic_folder(target, artifact, provenance) as staging:
                yield staging, str(target)
            return
        with tempfile.TemporaryDirectory() as tmp:
            folder = Path(tmp)
            yield folder, uri
            files = folder_files(folder)
            write_json_atomic(folder / MANIFEST, build_manifest(files, artifact, provenance))
            fs, remote = filesystem(uri)
            remote = remote.rstrip("/")
            # The old manifest goes first and the new one last: in between (and after an upload
            # that failed half-way), a reader finds no manifest (an error it names), never new
            # files checked against old hashes.
            with remote_errors(fs, f"upload of artifact {artifact}: removing the old manifest", f"{uri}/{MANIFEST}"):
                if fs.exists(f"{remote}/{MANIFEST}"):
                    fs.rm(f"{remote}/{MANIFEST}")
            for name, path in [*files.items(), (MANIFEST, folder / MANIFEST)]:
                with remote_errors(fs, f"upload of artifact {artifact}: file", f"{uri}/{name}"):
                    fs.put_file(str(path), f"{remote}/{name}")

    def local_path(self, uri: str) -> Path:
        """A local folder holding `uri`, verified against its manifest (downloaded once into the
        cache for remote roots). Raises CorruptArtifact naming the artifact and the bad file."""
        if "://" not in uri or uri.startswith("file://"):
            path = Path(fsspec.core.url_to_fs(uri)[1])
            verify_folder(path, uri)
            return path
        fs, remote = filesystem(uri)
        target = Path(self.cache_dir) / remote.strip("/").replace("/", "__")
        if target.exists():
            try:
                verify_folder(target, uri)
                return target
            except CorruptArtifact:  # a damaged cache copy: fetch it again
                shutil.rmtree(target, ignore_errors=True)
        target.parent.mkdir(parents=True, exist_ok=True)
        download = target.with_name(f".{target.name}.tmp-{uuid.uuid4().hex[:8]}")
        try:
            with remote_errors(fs, "download of artifact", uri):
                fs.get(remote.rstrip("/") + "/", str(download) + "/", recursive=True)
            verify_folder(download, uri)
            replace_dir(download, target)
        finally:
            shutil.rmtree(download, ignore_errors=True)
        return target


class SandboxResource(ConfigurableResource):
    kind: str = "bubblewrap"
    image: str = "python:3.11-slim"  # the docker tier's image
    pool_size: int = 2
    timeout_s: float = 2.0
    memory_mb: int = 256
    max_processes: int = 8
    max_files: int = 10_000
    max_output_bytes: int = 65_536
    url: str | None = None  # the sandbox service (kind http)
    token_env: str = "FLYWHEEL_SANDBOX_TOKEN"  # its shared secret is read from here when the sandbox opens

    @classmethod
    def from_config(cls, cfg: SandboxConfig) -> "SandboxResource":
        return cls(**cfg.model_dump())

    @contextlib.contextmanager
    def open(self) -> Iterator[Any]:
        from verifiers.sandboxes import sandbox_from_settings

        sandbox = sandbox_from_settings(self)
        try:
            yield sandbox
        finally:
            sandbox.close()


def default_tracking_uri(home: Path) -> str:
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{home}/mlflow.db"
