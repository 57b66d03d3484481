"""Artifact storage and the IO manager against S3 (a local moto server) and a local folder."""

import json
import os
import uuid
from pathlib import Path

import pandas as pd
import pytest
from dagster import AssetKey, build_input_context, build_output_context

from assets.io import FrameIOManager
from assets.resources import ArtifactStore


@pytest.fixture()
def s3_bucket(monkeypatch):
    """moto's in-process mock does not intercept s3fs (aiobotocore): use its server mode."""
    import boto3
    import s3fs
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(port=0)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    # Credentials no test would write on purpose: the micro flywheel below checks they appear
    # nowhere in what the platform stores (logs, MLflow params and artifacts, Dagster metadata).
    secret = f"s3cret-{uuid.uuid4().hex}"
    for key, value in {
        "AWS_ACCESS_KEY_ID": f"AKIA{uuid.uuid4().hex[:16].upper()}",
        "AWS_SECRET_ACCESS_KEY": secret,
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ENDPOINT_URL_S3": endpoint,
        "AWS_ENDPOINT_URL": endpoint,
    }.items():
        monkeypatch.setenv(key, value)
    boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket="flywheel-test")
    s3fs.S3FileSystem.clear_instance_cache()
    yield "s3://flywheel-test/run"
    s3fs.S3FileSystem.clear_instance_cache()
    server.stop()


def _roundtrip_frame(root: str) -> pd.DataFrame:
    manager = FrameIOManager(root=root)
    frame = pd.DataFrame({"task_id": ["a", "b"], "completion_ids": [[1, 2, 3], [4]], "tool_mask": [[1, 0, 1], [1]]})
    manager.handle_output(build_output_context(asset_key=AssetKey("rollout_batches")), frame)
    manager.handle_output(build_output_context(asset_key=AssetKey("rl_checkpoint")), {"uri": f"{root}/ckpt"})
    loaded = manager.load_input(build_input_context(asset_key=AssetKey("rollout_batches")))
    assert manager.load_input(build_input_context(asset_key=AssetKey("rl_checkpoint"))) == {"uri": f"{root}/ckpt"}
    assert [list(x) for x in loaded["completion_ids"]] == [[1, 2, 3], [4]]
    with pytest.raises(FileNotFoundError, match="no stored value for asset missing"):
        manager.load_input(build_input_context(asset_key=AssetKey("missing")))
    return loaded


def _roundtrip_folder(store: ArtifactStore) -> None:
    with store.writable_dir("checkpoints", "sft") as (path, uri):
        (path / "config.json").write_text('{"a": 1}')
        (path / "model.safetensors").write_bytes(b"\x00" * 1000)
    local = store.local_path(uri)
    assert (local / "config.json").read_text() == '{"a": 1}'
    assert (local / "model.safetensors").stat().st_size == 1000


def test_local_folder(tmp_path):
    _roundtrip_frame(str(tmp_path / "artifacts"))
    _roundtrip_folder(ArtifactStore(root=str(tmp_path / "artifacts"), cache_dir=str(tmp_path / "cache")))


def test_s3_through_s3fs(s3_bucket, tmp_path):
    _roundtrip_frame(s3_bucket)
    store = ArtifactStore(root=s3_bucket, cache_dir=str(tmp_path / "cache"))
    assert not store.is_local
    _roundtrip_folder(store)
    assert (tmp_path / "cache").exists(), "remote checkpoints are downloaded into the cache"


def test_task_file_from_s3(s3_bucket):
    """Users' task files load from s3:// like local ones, and bad rows are still named."""
    import json

    import fsspec

    from environments.task_files import TaskFileError, load_task_file

    good = {"task_id": "s1", "family": "arithmetic", "level": 2, "prompt": "compute 83-29\n", "answer": "54"}
    with fsspec.open(f"{s3_bucket}/tasks.jsonl", "w") as f:
        f.write(json.dumps(good) + "\n" + json.dumps({**good, "task_id": "s2", "level": "two"}) + "\n")
    with pytest.raises(TaskFileError, match=r"row 2: field 'level': expected an integer, got 'two'"):
        load_task_file(f"{s3_bucket}/tasks.jsonl")
    pd.DataFrame([good]).to_parquet(f"{s3_bucket}/tasks.parquet")
    assert load_task_file(f"{s3_bucket}/tasks.parquet")["task_id"].tolist() == ["s1"]


UNPARTITIONED = [
    "knowledge_base",
    "search_index",
    "benchmark_tasks",
    "training_tasks",
    "tokenizer",
    "base_model",
    "sft_trajectories",
    "sft_checkpoint",
    "sft_benchmark_scores",
]
ROUND = ["rollout_batches", "verified_rewards", "rl_checkpoint", "task_pool", "benchmark_scores"]


@pytest.mark.slow
def test_micro_flywheel_with_every_artifact_in_s3(s3_bucket, tmp_path, monkeypatch):
    """The whole micro flywheel with storage.root on the moto server: the same code as local files,
    and every asset value and checkpoint lands in the bucket and loads back from it."""
    import s3fs

    from pipelines.run import run_flywheel
    from training.model import load_policy

    monkeypatch.setenv("FLYWHEEL_HOME", str(tmp_path / "fw"))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    outcome = run_flywheel("micro", {"storage.root": s3_bucket})
    assert len(outcome["rounds"]) == 1
    assert not (tmp_path / "fw" / "artifacts").exists(), "nothing may be written to the local artifact root"

    fs = s3fs.S3FileSystem()
    bucket = s3_bucket.removeprefix("s3://")
    stored = {}
    for name, partition in [(a, "all") for a in UNPARTITIONED] + [(a, "1") for a in ROUND]:
        found = [
            p
            for p in (f"{bucket}/assets/{name}/{partition}.parquet", f"{bucket}/assets/{name}/{partition}.json")
            if fs.exists(p)
        ]
        assert found, f"{name} ({partition}) is not in the bucket"
        stored[name] = (
            pd.read_parquet(f"s3://{found[0]}") if found[0].endswith(".parquet") else json.loads(fs.cat(found[0]))
        )
    assert len(stored["rollout_batches"]) > 0 and len(stored["training_tasks"]) > 0
    # checkpoints are HF folders in the bucket; the pointers the assets stored name them
    store = ArtifactStore(root=s3_bucket, cache_dir=str(tmp_path / "fresh-cache"))
    for pointer in (stored["base_model"], stored["sft_checkpoint"], stored["rl_checkpoint"]):
        assert pointer["uri"].startswith(s3_bucket + "/checkpoints/")
        assert fs.exists(f"{pointer['uri'].removeprefix('s3://')}/model.safetensors")
        model = load_policy(store.local_path(pointer["uri"]))  # downloaded into an empty cache, then loaded
        assert sum(p.numel() for p in model.parameters()) > 0

    # Redaction: the S3 credentials are in this process's environment for the whole run, and in
    # no byte of what it stored: Dagster's event log and run storage (logs, metadata, tags), MLflow's
    # store (params, tags, metrics) and artifacts, compute logs, the bucket.
    secrets = [os.environ["AWS_SECRET_ACCESS_KEY"].encode(), os.environ["AWS_ACCESS_KEY_ID"].encode()]
    scanned = {p.relative_to(tmp_path / "fw").parts[0] for p in Path(tmp_path / "fw").rglob("*") if p.is_file()}
    assert {"mlflow.db", "mlartifacts", "dagster"} <= scanned, scanned  # the stores really are in the scan
    leaks = [
        str(path)
        for path in Path(tmp_path / "fw").rglob("*")
        if path.is_file() and any(s in path.read_bytes() for s in secrets)
    ]
    leaks += [key for key in fs.find(bucket) if any(s in fs.cat(key) for s in secrets)]
    assert not leaks, f"credentials written to {leaks}"


# --- manifests: a damaged artifact is refused by name, locally and on S3 ----------------------------


def _damage(root: str, relative: str, data: bytes) -> None:
    import fsspec

    fs, path = fsspec.core.url_to_fs(f"{root.rstrip('/')}/{relative}")
    fs.pipe_file(path, data)


@pytest.mark.parametrize("where", ["local", "s3"])
def test_a_truncated_dataset_is_refused_naming_asset_and_partition(where, request, tmp_path):
    from assets.artifacts import CorruptArtifact

    root = request.getfixturevalue("s3_bucket") if where == "s3" else str(tmp_path / "artifacts")
    manager = FrameIOManager(root=root)
    frame = pd.DataFrame({"task_id": [f"t{i}" for i in range(50)], "reward": [0.5] * 50})
    manager.handle_output(build_output_context(asset_key=AssetKey("verified_rewards"), partition_key="2"), frame)
    assert len(manager.load_input(build_input_context(asset_key=AssetKey("verified_rewards"), partition_key="2"))) == 50
    _damage(root, "verified_rewards/2.parquet", b"PAR1 cut short")
    with pytest.raises(
        CorruptArtifact, match=r"artifact verified_rewards\[2\] .*bytes, the manifest says .* \(truncated\?\)"
    ):
        manager.load_input(build_input_context(asset_key=AssetKey("verified_rewards"), partition_key="2"))


@pytest.mark.parametrize("where", ["local", "s3"])
def test_a_corrupted_checkpoint_is_refused_and_a_bad_cache_copy_is_fetched_again(where, request, tmp_path):
    from assets.artifacts import CorruptArtifact

    root = request.getfixturevalue("s3_bucket") if where == "s3" else str(tmp_path / "artifacts")
    store = ArtifactStore(root=root, cache_dir=str(tmp_path / "cache"))
    with store.writable_dir("checkpoints", "rl", "round-1", provenance={"dagster_run_id": "run-7"}) as (path, uri):
        (path / "config.json").write_text('{"a": 1}')
        (path / "model.safetensors").write_bytes(b"\x00" * 1000)
    local = store.local_path(uri)
    assert json.loads((local / "MANIFEST.json").read_text())["dagster_run_id"] == "run-7"
    if where == "s3":
        (local / "model.safetensors").write_bytes(b"\x01" * 1000)  # the cached copy rots: fetched again, verified
        assert (store.local_path(uri) / "model.safetensors").read_bytes() == b"\x00" * 1000
    _damage(root, "checkpoints/rl/round-1/model.safetensors", b"\x00" * 999 + b"\x01")
    if where == "s3":
        import shutil

        shutil.rmtree(local)
    with pytest.raises(CorruptArtifact, match="artifact .*round-1.*model.safetensors does not match its sha256"):
        store.local_path(uri)


@pytest.mark.yourdata
def test_a_corpus_an_sft_file_and_a_problem_file_from_s3(s3_bucket):
    """The other user files read from s3:// too (gzip included), bad rows named as locally."""
    import gzip

    import fsspec

    from environments.corpus import load_corpus
    from environments.problem_files import load_problems
    from environments.sft_files import load_sft_file
    from environments.task_files import TaskFileError

    repo = Path(__file__).resolve().parents[2] / "examples"
    for name in ("search/corpus.jsonl", "sft/trajectories.jsonl"):
        with fsspec.open(f"{s3_bucket}/{name}", "wb") as f:
            f.write((repo / name).read_bytes())
    with fsspec.open(f"{s3_bucket}/problems.jsonl.gz", "wb") as f:
        f.write(gzip.compress((repo / "problems" / "humaneval_format.jsonl").read_bytes()))
    assert len(load_corpus(f"{s3_bucket}/search/corpus.jsonl")) == 24
    assert len(load_sft_file(f"{s3_bucket}/sft/trajectories.jsonl")) == 4
    assert [t["task_id"] for t in load_problems(f"{s3_bucket}/problems.jsonl.gz", suite="mini")] == [
        "mini/0",
        "mini/1",
        "mini/2",
    ]
    with fsspec.open(f"{s3_bucket}/bad.jsonl", "w") as f:
        f.write(json.dumps({"id": "x", "text": ""}) + "\n")
    with pytest.raises(
        TaskFileError, match=r"corpus file s3://flywheel-test/run/bad.jsonl has 1 problem\(s\):\n  row 1: field 'text'"
    ):
        load_corpus(f"{s3_bucket}/bad.jsonl")
