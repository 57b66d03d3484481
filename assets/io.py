"""IO manager: DataFrames as Parquet, small records (checkpoint pointers, scores) as JSON, under
a local folder or an s3:// root (fsspec/s3fs). One file per asset and partition, each with a
sidecar manifest (sha256, size, the Dagster run) written after it and checked on every load
(assets/artifacts.py): a truncated or corrupted file fails naming the asset and partition."""

from __future__ import annotations

import io
import json

import pandas as pd
from dagster import ConfigurableIOManager, InputContext, OutputContext

from assets.artifacts import exists, read_verified_bytes, write_bytes


class FrameIOManager(ConfigurableIOManager):
    root: str

    def _path(self, context: InputContext | OutputContext, suffix: str) -> str:
        key = "/".join(context.asset_key.path)
        partition = context.asset_partition_key if context.has_asset_partitions else "all"
        return f"{self.root.rstrip('/')}/{key}/{partition}{suffix}"

    @staticmethod
    def _artifact(context: InputContext | OutputContext) -> str:
        name = context.asset_key.to_user_string()
        return f"{name}[{context.asset_partition_key}]" if context.has_asset_partitions else name

    def handle_output(self, context: OutputContext, obj) -> None:
        if obj is None:
            return
        if isinstance(obj, pd.DataFrame):
            path, data = self._path(context, ".parquet"), obj.to_parquet(index=False)
        else:
            path, data = self._path(context, ".json"), json.dumps(obj, indent=1, default=str).encode()
        write_bytes(path, data, self._artifact(context), {"dagster_run_id": context.run_id})
        context.add_output_metadata({"path": path, "bytes": len(data)})

    def load_input(self, context: InputContext):
        for suffix in (".parquet", ".json"):
            path = self._path(context, suffix)
            if exists(path):
                data = read_verified_bytes(path, self._artifact(context))
                return pd.read_parquet(io.BytesIO(data)) if suffix == ".parquet" else json.loads(data)
        raise FileNotFoundError(
            f"no stored value for asset {context.asset_key.to_user_string()} at {self._path(context, '.{parquet,json}')}"
        )


def read_stored_frame(root: str, asset: str, partition: str) -> pd.DataFrame | None:
    """A partition that FrameIOManager stored under `root`, read outside the asset graph (the
    curriculum reads the previous round's task pool, which a graph edge cannot express: a round
    depending on an earlier partition of its own output). None if it was never stored."""
    path = f"{root.rstrip('/')}/{asset}/{partition}.parquet"
    return pd.read_parquet(io.BytesIO(read_verified_bytes(path, f"{asset}[{partition}]"))) if exists(path) else None
