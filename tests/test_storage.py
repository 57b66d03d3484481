"""Artifact storage and the IO manager against S3 (a local moto server) and a local folder."""

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
    for key, value in {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test", "AWS_DEFAULT_REGION": "us-east-1",
                       "AWS_ENDPOINT_URL_S3": endpoint, "AWS_ENDPOINT_URL": endpoint}.items():
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
