"""Task assets: the held-out benchmark, then training tasks decontaminated against it."""

import pandas as pd
from dagster import AssetCheckResult, AssetIn, AssetExecutionContext, MetadataValue, asset, asset_check

from assets.contracts import contract_check
from assets.resources import FlywheelSettings
from configs.schema import FAMILY_LEVELS
from environments.base import TASK_COLUMNS
from environments.contamination import duplicates, overlaps
from environments.families import generate_tasks, make_kb
from environments.search import kb_from_rows, kb_to_rows
from environments.task_files import load_task_file

MAX_LEVEL = max(max(levels) for levels in FAMILY_LEVELS.values())

BENCHMARK_SEED_OFFSET = 1_000_003


def _counts(df: pd.DataFrame) -> dict:
    """Rows per family and per (family, level): dataset statistics in the asset's metadata."""
    if not {"family", "level"} <= set(df):
        return {}
    out = {f"family_{k}": int(v) for k, v in df["family"].value_counts().sort_index().items()}
    out.update({f"{fam}_level_{lv}": int(v) for (fam, lv), v in df.groupby(["family", "level"]).size().items()})
    return out


def _dataset_report(df: pd.DataFrame) -> dict:
    """Duplicates inside the dataset (reported, not removed) and the prompt length distribution."""
    if not {"task_id", "prompt"} <= set(df):
        return {}
    dups = duplicates(df.to_dict("records"))
    words = df["prompt"].astype(str).str.split().str.len().describe(percentiles=[0.5, 0.9])
    return {"duplicate_prompts": len(dups), "duplicates": MetadataValue.json(dups[:20]),
            "prompt_words": MetadataValue.json({k: round(float(v), 1) for k, v in words.items() if k != "count"})}


@asset(group_name="data", description="The search family's world: generated entities, relations and one document per entity.")
def knowledge_base(context: AssetExecutionContext, settings: FlywheelSettings) -> pd.DataFrame:
    cfg = settings.config.data
    kb = make_kb(cfg.knowledge_base, cfg.seed)
    df = pd.DataFrame(kb_to_rows(kb))
    context.add_output_metadata({"rows": len(df), "entities": len(kb.entities), "relations": len(kb.relations),
                                 "documents": len(kb.documents), "preview": MetadataValue.md(df.head(5).to_markdown())})
    return df


def _generate(cfg, split: str, seed: int, kb, exclude_ids: frozenset[str] = frozenset()) -> pd.DataFrame:
    frames = []
    for family, fam in cfg.families.items():
        n = fam.benchmark_tasks if split == "benchmark" else fam.train_tasks
        rows = generate_tasks(family, n, seed=seed, split=split, levels=fam.levels, level_weights=fam.level_weights, exclude_ids=exclude_ids, kb=kb)
        frames.append(pd.DataFrame(rows, columns=list(TASK_COLUMNS)))
    return pd.concat(frames, ignore_index=True)


@asset(group_name="data", description="Held-out benchmark tasks of every configured family (fixed seed), never trained on.")
def benchmark_tasks(context: AssetExecutionContext, settings: FlywheelSettings, knowledge_base: pd.DataFrame) -> pd.DataFrame:
    cfg = settings.config.data
    if cfg.benchmark_file is not None:
        df, source = load_task_file(cfg.benchmark_file, default_split="benchmark"), cfg.benchmark_file
    else:
        df, source = _generate(cfg, "benchmark", cfg.seed + BENCHMARK_SEED_OFFSET, kb_from_rows(knowledge_base.to_dict("records"))), "generated"
    context.add_output_metadata({"rows": len(df), "source": source, **_counts(df), **_dataset_report(df),
                                 "preview": MetadataValue.md(df.head(5).to_markdown())})
    return df


@asset(group_name="data", description="Training tasks: generated (or read from data.task_file), minus any benchmark task.")
def training_tasks(context: AssetExecutionContext, settings: FlywheelSettings, benchmark_tasks: pd.DataFrame,
                   knowledge_base: pd.DataFrame) -> pd.DataFrame:
    cfg = settings.config.data
    held_out = frozenset(benchmark_tasks["task_id"])
    if cfg.task_file is not None:
        df = load_task_file(cfg.task_file)
        source = cfg.task_file
    else:
        df = _generate(cfg, "train", cfg.seed, kb_from_rows(knowledge_base.to_dict("records")), exclude_ids=held_out)
        source = "generated"
    before = len(df)
    if "task_id" in df:  # decontaminate; a missing column is reported by the contract check
        df = df[~df["task_id"].isin(held_out)].reset_index(drop=True)
    context.add_output_metadata({"rows": len(df), "source": source, "removed_overlap_with_benchmark": before - len(df), **_counts(df),
                                 **_dataset_report(df)})
    return df


knowledge_base_contract = contract_check("knowledge_base", "knowledge_base")
training_tasks_contract = contract_check("training_tasks", "tasks", families=tuple(FAMILY_LEVELS), max_level=MAX_LEVEL)
benchmark_tasks_contract = contract_check("benchmark_tasks", "tasks", families=tuple(FAMILY_LEVELS), max_level=MAX_LEVEL)


@asset_check(asset=training_tasks, blocking=True, additional_ins={"benchmark_tasks": AssetIn("benchmark_tasks")},
             description="No benchmark task appears in training: same id, same normalized prompt, or a shared long word run.")
def training_disjoint_from_benchmark(settings: FlywheelSettings, training_tasks: pd.DataFrame, benchmark_tasks: pd.DataFrame) -> AssetCheckResult:
    found = overlaps(benchmark_tasks.to_dict("records"), training_tasks.to_dict("records"), ngram=settings.config.data.contamination_ngram) \
        if {"task_id", "prompt"} <= set(training_tasks) else []
    by_kind = {how: sum(f["how"] == how for f in found) for how in dict.fromkeys(f["how"] for f in found)}
    description = "benchmark tasks seen in training:\n" + "\n".join(
        f"  benchmark {f['benchmark_id']} ~ training {f['training_id']} ({f['how']})" for f in found[:20]) if found else None
    return AssetCheckResult(passed=not found, description=description,
                            metadata={"overlapping_tasks": len(found), **by_kind, "overlaps": MetadataValue.json(found[:50])})
