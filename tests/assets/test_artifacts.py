"""Crash-safe artifacts (assets/artifacts.py): atomic folder writes, manifests, verification.

The S3 side of the same checks is in tests/assets/test_storage.py (a local moto server)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from assets.artifacts import (
    MANIFEST,
    CorruptArtifact,
    atomic_folder,
    read_verified_bytes,
    sidecar,
    verify_file,
    verify_folder,
    write_bytes,
)

ROOT = Path(__file__).resolve().parents[2]


def _write_checkpoint(folder: Path, weights: bytes = b"\x01" * 4096) -> None:
    (folder / "config.json").write_text('{"hidden_size": 8}')
    (folder / "model.safetensors").write_bytes(weights)
    (folder / "sub").mkdir()
    (folder / "sub" / "tokenizer.json").write_text("{}")


def test_a_finished_folder_has_a_manifest_of_every_file_and_its_provenance(tmp_path):
    target = tmp_path / "checkpoints" / "sft"
    with atomic_folder(target, "checkpoints/sft", {"dagster_run_id": "r1", "config_hash": "abc"}) as staging:
        assert staging != target and not target.exists(), "nothing appears at the target before the block ends"
        _write_checkpoint(staging)
    manifest = verify_folder(target, "checkpoints/sft")
    assert set(manifest["files"]) == {"config.json", "model.safetensors", "sub/tokenizer.json"}
    assert manifest["files"]["model.safetensors"]["bytes"] == 4096
    assert manifest["dagster_run_id"] == "r1" and manifest["config_hash"] == "abc" and manifest["schema_version"] == 1
    assert [p.name for p in target.parent.iterdir()] == ["sft"], "no staging folder left behind"


def test_a_failed_write_leaves_the_previous_version_untouched(tmp_path):
    target = tmp_path / "ckpt"
    with atomic_folder(target, "ckpt") as staging:
        _write_checkpoint(staging, b"old" * 100)
    with pytest.raises(OSError, match="disk full"):
        with atomic_folder(target, "ckpt") as staging:
            (staging / "model.safetensors").write_bytes(b"new-but-half")
            raise OSError(28, "disk full")
    assert (target / "model.safetensors").read_bytes() == b"old" * 100
    verify_folder(target, "ckpt")
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt"]


def test_a_replaced_version_is_complete(tmp_path):
    target = tmp_path / "ckpt"
    for weights in (b"a" * 10, b"b" * 20):
        with atomic_folder(target, "ckpt") as staging:
            _write_checkpoint(staging, weights)
    assert (target / "model.safetensors").read_bytes() == b"b" * 20
    assert verify_folder(target, "ckpt")["files"]["model.safetensors"]["bytes"] == 20


@pytest.mark.parametrize(
    "damage, message",
    [
        (
            lambda f: (f / "model.safetensors").write_bytes(b"\x01" * 100),
            "model.safetensors has 100 bytes, the manifest says 4096 (truncated?)",
        ),
        (
            lambda f: (f / "model.safetensors").write_bytes(b"\x01" * 4095 + b"\x02"),
            "model.safetensors does not match its sha256",
        ),
        (lambda f: (f / "sub" / "tokenizer.json").unlink(), "file sub/tokenizer.json is missing"),
        (lambda f: (f / MANIFEST).unlink(), "no manifest"),
        (lambda f: (f / MANIFEST).write_text("{not json"), "is not valid JSON"),
        (lambda f: (f / MANIFEST).write_text(json.dumps({"schema_version": 99, "files": {}})), "schema_version 99"),
    ],
)
def test_damage_is_named_with_the_artifact_and_the_file(tmp_path, damage, message):
    target = tmp_path / "rl" / "round-2"
    with atomic_folder(target, "checkpoints/rl/round-2") as staging:
        _write_checkpoint(staging)
    damage(target)
    with pytest.raises(CorruptArtifact) as err:
        verify_folder(target, "checkpoints/rl/round-2")
    assert "artifact checkpoints/rl/round-2" in str(err.value) and message in str(err.value)


def test_a_file_artifact_and_its_sidecar(tmp_path):
    path = tmp_path / "assets" / "rollout_batches" / "3.parquet"
    write_bytes(str(path), b"PAR1" + b"x" * 500, "rollout_batches[3]", {"dagster_run_id": "r9"})
    assert read_verified_bytes(str(path), "rollout_batches[3]") == b"PAR1" + b"x" * 500
    assert verify_file(path, "rollout_batches[3]")["dagster_run_id"] == "r9"
    assert sorted(p.name for p in path.parent.iterdir()) == ["3.parquet", "3.parquet.manifest.json"]
    path.write_bytes(b"PAR1" + b"x" * 10)
    with pytest.raises(CorruptArtifact, match=r"rollout_batches\[3\].*14 bytes, the manifest says 504 \(truncated\?\)"):
        read_verified_bytes(str(path), "rollout_batches[3]")
    sidecar(path).unlink()
    with pytest.raises(CorruptArtifact, match="no manifest"):
        read_verified_bytes(str(path), "rollout_batches[3]")


# A writer killed with SIGKILL in the middle of a checkpoint: what a reader finds afterwards.
KILLED_WRITER = """
import sys, time
from pathlib import Path
from assets.artifacts import atomic_folder
target = Path(sys.argv[1])
with atomic_folder(target, "ckpt") as staging:
    (staging / "config.json").write_text("{}")
    with open(staging / "model.safetensors", "wb") as f:
        f.write(b"\\x07" * 1_000_000)
        f.flush()
        print("writing", flush=True)
        time.sleep(60)
"""


@pytest.mark.parametrize("previous", [False, True])
def test_sigkill_mid_write_never_exposes_a_partial_checkpoint(tmp_path, previous):
    target = tmp_path / "ckpt"
    if previous:
        with atomic_folder(target, "ckpt") as staging:
            _write_checkpoint(staging, b"v1" * 50)
    writer = subprocess.Popen(
        [sys.executable, "-c", KILLED_WRITER, str(target)], cwd=ROOT, stdout=subprocess.PIPE, text=True
    )
    assert writer.stdout.readline().strip() == "writing"
    os.kill(writer.pid, signal.SIGKILL)
    writer.wait(timeout=30)
    if previous:
        assert (target / "model.safetensors").read_bytes() == b"v1" * 50
        verify_folder(target, "ckpt")
    else:
        assert not target.exists(), "a killed first write leaves nothing at the target"
    leftovers = [p for p in tmp_path.iterdir() if p.name.startswith(".ckpt.tmp-")]
    assert len(leftovers) == 1, "the killed writer's staging folder stays hidden; readers only look at the target"
    # the re-run (Dagster's re-execution of the step) writes the checkpoint and sweeps the dead writer's folder
    with atomic_folder(target, "ckpt") as staging:
        _write_checkpoint(staging, b"v2" * 50)
    assert (target / "model.safetensors").read_bytes() == b"v2" * 50
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt"]
