"""Crash-safe artifacts: atomic writes and a manifest per artifact, verified on load.

Every artifact the pipeline stores (a checkpoint or tokenizer folder, a dataset file) gets a
manifest written *last*: the sha256 and size of each of its files, the manifest schema version,
the hash of the configuration that produced it and the Dagster run id. A reader verifies the
manifest before using the artifact, so a checkpoint truncated by a full disk, a folder left
half-written by a killed step, or a bit-flipped file fails with a message naming the artifact and
the file, and is never trained on or promoted.

Locally a write goes to a hidden sibling first and is renamed into place (a rename within one
file system is atomic); on S3 every object is complete once its PUT returns, and the manifest is
the last object written, so a reader never sees a partial artifact either way.

The IO manager and the artifact store (assets/io.py, assets/resources.py) call in; the only
Dagster type used is `Failure`, so a corrupt artifact fails its step without the retries a
transient error gets (retrying cannot repair it).

Remote stores are reached through `filesystem(url)`: S3 calls retry transient failures (5xx,
throttling, dropped connections) with botocore's standard back-off (S3_RETRIES); a call that still
fails raises `StorageUnavailable` naming the object and the endpoint. Since the manifest goes last,
a write that fails half-way leaves an artifact no reader accepts, never a partial one it trusts.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import fsspec
from dagster import Failure
from fsspec.implementations.local import LocalFileSystem

MANIFEST = "MANIFEST.json"  # inside a folder artifact
SIDECAR_SUFFIX = ".manifest.json"  # next to a file artifact
SCHEMA_VERSION = 1
_CHUNK = 1 << 20
# botocore's retries for every S3 call (s3fs -> aiobotocore). Its default here is "legacy" mode
# with 5 attempts; "standard" mode (AWS's recommendation) retries 5xx, throttling and connection
# errors with jittered exponential back-off of at most 20 s a pause and a retry quota, and 10
# attempts ride out about a minute of an unavailable endpoint (111 s at most). AWS_MAX_ATTEMPTS or
# AWS_RETRY_MODE in the environment, when set, win.
S3_RETRIES = {"mode": "standard", "max_attempts": 10}


class CorruptArtifact(Failure):
    """An artifact whose manifest is missing or does not match its files. A Dagster `Failure`
    without retries: the step's RetryPolicy is for flaky tools, and a re-read gives the same bytes."""

    def __init__(self, message: str):
        super().__init__(description=message, allow_retries=False)


class StorageUnavailable(OSError):
    """A call to a remote artifact store that still failed after the client's retries."""


def s3_retries() -> dict[str, Any] | None:
    """The botocore `retries` config S3 calls use; None when the environment sets its own."""
    return None if {"AWS_MAX_ATTEMPTS", "AWS_RETRY_MODE"} & set(os.environ) else dict(S3_RETRIES)


def filesystem(url: str) -> tuple[Any, str]:
    """fsspec's file system for `url` and the path in it; S3 with the retries of S3_RETRIES."""
    retries = s3_retries() if url.startswith("s3://") else None
    return fsspec.core.url_to_fs(url, **({"config_kwargs": {"retries": retries}} if retries else {}))


def _endpoint(fs) -> str:
    try:
        # what s3fs's client resolved (argument, AWS_ENDPOINT_URL*, profile, AWS default)
        return fs.s3.meta.endpoint_url
    except AttributeError:
        return "(unknown)"


@contextlib.contextmanager
def remote_errors(fs, operation: str, url: str) -> Iterator[None]:
    """Raise StorageUnavailable naming the object and the endpoint when a call to a remote store
    fails for good (s3fs's errors name neither). Local errors (a full disk) and a missing object
    (an answer, not a failure) pass through unchanged."""
    try:
        yield
    except FileNotFoundError:
        raise
    except Exception as exc:
        if isinstance(fs, LocalFileSystem):
            raise
        retries = ""
        if url.startswith("s3://"):  # what botocore was told, or its defaults under the environment's settings
            used = s3_retries() or {
                "mode": os.environ.get("AWS_RETRY_MODE", "legacy"),
                "max_attempts": os.environ.get("AWS_MAX_ATTEMPTS", 5),
            }
            retries = f" after the S3 client's retries ({used['mode']} mode, {used['max_attempts']} attempts)"
        raise StorageUnavailable(
            f"{operation} {url} failed at endpoint {_endpoint(fs)}{retries}: {type(exc).__name__}: {exc}"
        ) from exc


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def config_hash(config_json: str) -> str:
    """Short hash of a configuration's canonical JSON: which settings produced an artifact."""
    return hashlib.sha256(config_json.encode()).hexdigest()[:16]


def _manifest(artifact: str, provenance: dict[str, Any] | None, files: dict[str, dict[str, Any]]) -> dict[str, Any]:
    return {
        "schema_version": SCHEMA_VERSION,
        "artifact": artifact,
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        **(provenance or {}),
        "files": files,
    }


def build_manifest(files: dict[str, Path], artifact: str, provenance: dict[str, Any] | None = None) -> dict[str, Any]:
    """The manifest of `files` (name in the artifact -> local path)."""
    return _manifest(
        artifact,
        provenance,
        {name: {"sha256": sha256_file(path), "bytes": path.stat().st_size} for name, path in sorted(files.items())},
    )


def folder_files(folder: Path) -> dict[str, Path]:
    return {
        p.relative_to(folder).as_posix(): p for p in sorted(folder.rglob("*")) if p.is_file() and p.name != MANIFEST
    }


def check_manifest(manifest: dict[str, Any], files: dict[str, Path], artifact: str, where: str) -> None:
    """Raise CorruptArtifact naming the first file that is missing, of the wrong size or hash."""
    version = manifest.get("schema_version")
    if version != SCHEMA_VERSION:
        raise CorruptArtifact(
            f"artifact {artifact} ({where}): manifest schema_version {version!r}, this code reads {SCHEMA_VERSION}"
        )
    listed = manifest.get("files")
    if not isinstance(listed, dict) or not listed:
        raise CorruptArtifact(f"artifact {artifact} ({where}): the manifest lists no files")
    for name, expected in listed.items():
        path = files.get(name)
        if path is None or not path.is_file():
            raise CorruptArtifact(f"artifact {artifact} ({where}): file {name} is missing")
        size = path.stat().st_size
        if size != expected["bytes"]:
            raise CorruptArtifact(
                f"artifact {artifact} ({where}): file {name} has {size} bytes, the manifest says {expected['bytes']} (truncated?)"
            )
        if sha256_file(path) != expected["sha256"]:
            raise CorruptArtifact(
                f"artifact {artifact} ({where}): file {name} does not match its sha256 in the manifest (corrupted)"
            )


def read_manifest(path: Path, artifact: str) -> dict[str, Any]:
    if not path.is_file():
        raise CorruptArtifact(
            f"artifact {artifact}: no manifest at {path}; the step that wrote it did not finish "
            "(or it predates manifests): re-materialize it"
        )
    try:
        return json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CorruptArtifact(f"artifact {artifact}: manifest {path} is not valid JSON ({exc})") from None


def verify_folder(folder: Path, artifact: str) -> dict[str, Any]:
    """Check a folder artifact against its MANIFEST.json; returns the manifest."""
    manifest = read_manifest(folder / MANIFEST, artifact)
    check_manifest(manifest, folder_files(folder), artifact, str(folder))
    return manifest


def verify_file(path: Path, artifact: str) -> dict[str, Any]:
    """Check a file artifact against its sidecar manifest; returns the manifest."""
    manifest = read_manifest(sidecar(path), artifact)
    check_manifest(manifest, {path.name: path}, artifact, str(path))
    return manifest


def sidecar(path: Path) -> Path:
    return path.with_name(path.name + SIDECAR_SUFFIX)


def write_json_atomic(path: Path, obj: Any) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{uuid.uuid4().hex[:8]}")
    tmp.write_text(json.dumps(obj, indent=1, default=str))
    os.replace(tmp, path)


def replace_dir(source: Path, target: Path) -> None:
    """Put the finished folder `source` at `target`, replacing what was there. Each rename is
    atomic; between the two a reader finds no folder (an error it reports), never a mix."""
    old = None
    if target.exists():
        old = target.with_name(f".{target.name}.old-{uuid.uuid4().hex[:8]}")
        os.rename(target, old)
    os.rename(source, target)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _sweep_dead_staging(target: Path) -> None:
    """Remove staging folders of `target` left by writers that were killed (their pid is gone)."""
    for leftover in target.parent.glob(f".{target.name}.tmp-*"):
        try:
            pid = int(leftover.name.rsplit(".tmp-", 1)[1].split("-")[0])
            os.kill(pid, 0)
        except ProcessLookupError:
            shutil.rmtree(leftover, ignore_errors=True)
        except (ValueError, PermissionError):
            continue


@contextlib.contextmanager
def atomic_folder(target: Path, artifact: str, provenance: dict[str, Any] | None = None) -> Iterator[Path]:
    """Yield a hidden sibling of `target` to write into; on success write its manifest and rename
    it into place. On any error (or a kill) `target` keeps its previous content."""
    target.parent.mkdir(parents=True, exist_ok=True)
    _sweep_dead_staging(target)
    staging = target.with_name(f".{target.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    staging.mkdir()
    try:
        yield staging
        write_json_atomic(staging / MANIFEST, build_manifest(folder_files(staging), artifact, provenance))
        replace_dir(staging, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


# --- single-file artifacts (datasets as Parquet, small records as JSON), local or s3:// ---------


def write_bytes(url: str, data: bytes, artifact: str, provenance: dict[str, Any] | None = None) -> None:
    """Store `data` at `url` with its sidecar manifest, the manifest last. Locally through a
    temporary file renamed into place; on S3 an object exists only once its upload completed."""
    fs, path = filesystem(url)
    name = path.rstrip("/").rsplit("/", 1)[-1]
    manifest = json.dumps(
        _manifest(artifact, provenance, {name: {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}}),
        indent=1,
        default=str,
    ).encode()
    with remote_errors(fs, f"writing artifact {artifact} to", url):
        fs.makedirs(fs._parent(path), exist_ok=True)
        side = path + SIDECAR_SUFFIX
        if fs.exists(side):  # never an old manifest next to new data
            fs.rm(side)
        if isinstance(fs, LocalFileSystem):
            for target, payload in ((path, data), (side, manifest)):
                tmp = f"{os.path.dirname(target)}/.{os.path.basename(target)}.tmp-{uuid.uuid4().hex[:8]}"
                with open(tmp, "wb") as f:
                    f.write(payload)
                    f.flush()
                    os.fsync(f.fileno())
                os.replace(tmp, target)
            return
        fs.pipe_file(path, data)
        fs.pipe_file(side, manifest)


def exists(url: str) -> bool:
    fs, path = filesystem(url)
    with remote_errors(fs, "looking for", url):
        return fs.exists(path)


def read_verified_bytes(url: str, artifact: str) -> bytes:
    """The bytes at `url`, checked against its sidecar manifest (CorruptArtifact if they differ)."""
    fs, path = filesystem(url)
    side = path + SIDECAR_SUFFIX
    with remote_errors(fs, f"reading artifact {artifact} from", url):
        raw_manifest = fs.cat_file(side) if fs.exists(side) else None
        data = fs.cat_file(path) if raw_manifest is not None else b""
    if raw_manifest is None:
        raise CorruptArtifact(
            f"artifact {artifact}: no manifest at {url}{SIDECAR_SUFFIX}; the step that wrote it did not finish "
            "(or it predates manifests): re-materialize it"
        )
    try:
        manifest = json.loads(raw_manifest)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CorruptArtifact(
            f"artifact {artifact}: manifest {url}{SIDECAR_SUFFIX} is not valid JSON ({exc})"
        ) from None
    name = path.rstrip("/").rsplit("/", 1)[-1]
    expected = (manifest.get("files") or {}).get(name)
    if manifest.get("schema_version") != SCHEMA_VERSION or expected is None:
        raise CorruptArtifact(
            f"artifact {artifact} ({url}): the manifest does not describe {name} (schema_version {manifest.get('schema_version')!r})"
        )
    if len(data) != expected["bytes"]:
        raise CorruptArtifact(
            f"artifact {artifact} ({url}): {len(data)} bytes, the manifest says {expected['bytes']} (truncated?)"
        )
    if hashlib.sha256(data).hexdigest() != expected["sha256"]:
        raise CorruptArtifact(f"artifact {artifact} ({url}): does not match its sha256 in the manifest (corrupted)")
    return data
