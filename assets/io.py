"""IO manager: DataFrames as Parquet, small records (checkpoint pointers, scores) as JSON, under
a local folder or an s3:// root (fsspec/s3fs). One file per asset and partition."""

from __future__ import annotations

import json

import fsspec
import pandas as pd
from dagster import ConfigurableIOManager, InputContext, OutputContext


class FrameIOManager(ConfigurableIOManager):
    root: str

    def _path(self, context: InputContext | OutputContext, suffix: str) -> str:
        key = "/".join(context.asset_key.path)
        partition = context.asset_partition_key if context.has_asset_partitions else "all"
        return f"{self.root.rstrip('/')}/{key}/{partition}{suffix}"

    def handle_output(self, context: OutputContext, obj) -> None:
        if obj is None:
            return
        if isinstance(obj, pd.DataFrame):
            path = self._path(context, ".parquet")
            fs, local = fsspec.core.url_to_fs(path)
            fs.makedirs(fs._parent(local), exist_ok=True)
            obj.to_parquet(path, index=False)
        else:
            path = self._path(context, ".json")
            fs, local = fsspec.core.url_to_fs(path)
            fs.makedirs(fs._parent(local), exist_ok=True)
            with fs.open(local, "w") as f:
                json.dump(obj, f, indent=1, default=str)
        context.add_output_metadata({"path": path})

    def load_input(self, context: InputContext):
        for suffix in (".parquet", ".json"):
            path = self._path(context, suffix)
            fs, local = fsspec.core.url_to_fs(path)
            if fs.exists(local):
                if suffix == ".parquet":
                    return pd.read_parquet(path)
                with fs.open(local) as f:
                    return json.load(f)
        raise FileNotFoundError(f"no stored value for asset {context.asset_key.to_user_string()} at {self._path(context, '.{parquet,json}')}")


def read_stored_frame(root: str, asset: str, partition: str) -> pd.DataFrame | None:
    """A partition that FrameIOManager stored under `root`, read outside the asset graph (the
    curriculum reads the previous round's task pool, which a graph edge cannot express: a round
    depending on an earlier partition of its own output). None if it was never stored."""
    path = f"{root.rstrip('/')}/{asset}/{partition}.parquet"
    fs, local = fsspec.core.url_to_fs(path)
    return pd.read_parquet(path) if fs.exists(local) else None
