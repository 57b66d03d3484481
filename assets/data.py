"""Task assets: the held-out benchmark, then training tasks decontaminated against it."""

import json
from pathlib import Path

import pandas as pd
from dagster import AssetCheckResult, AssetIn, AssetExecutionContext, MetadataValue, asset, asset_check

from assets.contracts import contract_check
from assets.resources import FlywheelSettings
from environments.arithmetic import FAMILY, LEVELS, generate_tasks

BENCHMARK_SEED_OFFSET = 1_000_003


def read_task_file(path: Path) -> pd.DataFrame:
    """JSONL, one task per line. Unparseable lines fail here naming file and line; field-level
    problems (missing, duplicate, out of range) are the data contract's job, downstream."""
    if not path.is_file():
        raise FileNotFoundError(f"task file {path} does not exist")
    rows = []
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}:{number}: not valid JSON ({exc.msg})") from None
        if not isinstance(row, dict):
            raise ValueError(f"{path}:{number}: expected a JSON object, got {type(row).__name__}")
        rows.append(row)
    return pd.DataFrame(rows)


def _level_counts(df: pd.DataFrame) -> dict:
    return {f"level_{k}": int(v) for k, v in df["level"].value_counts().sort_index().items()} if "level" in df else {}


@asset(group_name="data", description="Held-out benchmark tasks (fixed seed), never trained on.")
def benchmark_tasks(context: AssetExecutionContext, settings: FlywheelSettings) -> pd.DataFrame:
    cfg = settings.config.data
    df = pd.DataFrame(generate_tasks(cfg.num_benchmark_tasks, seed=cfg.seed + BENCHMARK_SEED_OFFSET, split="benchmark", levels=cfg.levels, level_weights=cfg.level_weights))
    context.add_output_metadata({"rows": len(df), **_level_counts(df), "preview": MetadataValue.md(df.head(5).to_markdown())})
    return df


@asset(group_name="data", description="Training tasks: generated (or read from data.task_file), minus any benchmark task.")
def training_tasks(context: AssetExecutionContext, settings: FlywheelSettings, benchmark_tasks: pd.DataFrame) -> pd.DataFrame:
    cfg = settings.config.data
    held_out = frozenset(benchmark_tasks["task_id"])
    if cfg.task_file is not None:
        df = read_task_file(cfg.task_file)
        source = str(cfg.task_file)
    else:
        df = pd.DataFrame(generate_tasks(cfg.num_train_tasks, seed=cfg.seed, split="train", levels=cfg.levels, level_weights=cfg.level_weights, exclude_ids=held_out))
        source = "generated"
    before = len(df)
    if "task_id" in df:  # decontaminate; a missing column is reported by the contract check
        df = df[~df["task_id"].isin(held_out)].reset_index(drop=True)
    context.add_output_metadata({"rows": len(df), "source": source, "removed_overlap_with_benchmark": before - len(df), **_level_counts(df)})
    return df


training_tasks_contract = contract_check("training_tasks", "tasks", families=(FAMILY,), max_level=max(LEVELS))
benchmark_tasks_contract = contract_check("benchmark_tasks", "tasks", families=(FAMILY,), max_level=max(LEVELS))


@asset_check(asset=training_tasks, blocking=True, additional_ins={"benchmark_tasks": AssetIn("benchmark_tasks")}, description="No benchmark task or prompt appears in training.")
def training_disjoint_from_benchmark(training_tasks: pd.DataFrame, benchmark_tasks: pd.DataFrame) -> AssetCheckResult:
    shared_ids = set(training_tasks.get("task_id", [])) & set(benchmark_tasks["task_id"])
    shared_prompts = set(training_tasks.get("prompt", [])) & set(benchmark_tasks["prompt"])
    return AssetCheckResult(
        passed=not shared_ids and not shared_prompts,
        metadata={"shared_task_ids": len(shared_ids), "shared_prompts": len(shared_prompts)},
    )
