"""Task assets: the held-out benchmark, then training tasks decontaminated against it."""

import hashlib

import pandas as pd
from dagster import AssetCheckResult, AssetExecutionContext, AssetIn, MetadataValue, asset, asset_check

from assets.artifacts import MANIFEST, filesystem
from assets.contracts import contract_check
from assets.resources import ArtifactStore, FlywheelSettings
from environments.base import TASK_COLUMNS
from environments.contamination import duplicates, overlaps
from environments.corpus import corpus_kb_rows, load_corpus
from environments.families import generate_tasks, make_kb
from environments.family import get_family
from environments.problem_files import load_problems
from environments.retrieval import BM25Retriever, load_retriever
from environments.search import kb_from_rows, kb_to_rows, passage
from environments.task_files import load_task_file

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
    return {
        "duplicate_prompts": len(dups),
        "duplicates": MetadataValue.json(dups[:20]),
        "prompt_words": MetadataValue.json({k: round(float(v), 1) for k, v in words.items() if k != "count"}),
    }


@asset(
    group_name="data",
    description="What the search tool searches: the generated world (entities, relations, one document "
    "per entity), or the documents of data.corpus_file.",
)
def knowledge_base(context: AssetExecutionContext, settings: FlywheelSettings) -> pd.DataFrame:
    cfg = settings.config.data
    if cfg.corpus_file is not None:
        df = pd.DataFrame(corpus_kb_rows(load_corpus(cfg.corpus_file)))
        context.add_output_metadata(
            {
                "rows": len(df),
                "source": cfg.corpus_file,
                "documents": len(df),
                "text_words": MetadataValue.json(df["text"].str.split().str.len().describe().round(1).to_dict()),
                "preview": MetadataValue.md(df.head(5).to_markdown()),
            }
        )
        return df
    kb = make_kb(cfg.knowledge_base, cfg.seed)
    df = pd.DataFrame(kb_to_rows(kb))
    context.add_output_metadata(
        {
            "rows": len(df),
            "source": "generated",
            "entities": len(kb.entities),
            "relations": len(kb.relations),
            "documents": len(kb.documents),
            "preview": MetadataValue.md(df.head(5).to_markdown()),
        }
    )
    return df


def generated_families(cfg) -> dict:
    """The configured families whose tasks are generated: all, except those that read the
    generated world (search) when data.corpus_file replaces it; their tasks come from files."""
    return {f: fam for f, fam in cfg.families.items() if not (cfg.corpus_file is not None and get_family(f).needs_kb)}


def _generate(cfg, split: str, seed: int, kb, exclude_ids: frozenset[str] = frozenset()) -> pd.DataFrame:
    frames = [pd.DataFrame(columns=list(TASK_COLUMNS))]
    for family, fam in generated_families(cfg).items():
        n = fam.benchmark_tasks if split == "benchmark" else fam.train_tasks
        rows = generate_tasks(
            family,
            n,
            seed=seed,
            split=split,
            levels=fam.levels,
            level_weights=fam.level_weights,
            exclude_ids=exclude_ids,
            kb=kb,
        )
        frames.append(pd.DataFrame(rows, columns=list(TASK_COLUMNS)))
    return pd.concat(frames, ignore_index=True)


def suite_tasks(suites) -> pd.DataFrame:
    """The problems of every `benchmark.suites` entry, split = the suite's name."""
    frames = [
        pd.DataFrame(load_problems(s.file, suite=name, limit=s.limit), columns=list(TASK_COLUMNS))
        for name, s in suites.items()
    ]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=list(TASK_COLUMNS))


@asset(
    group_name="data",
    description="Held-out benchmark tasks of every configured family (fixed seed), never trained on; "
    "then the problems of benchmark.suites (e.g. HumanEval), reported on their own.",
)
def benchmark_tasks(
    context: AssetExecutionContext, settings: FlywheelSettings, knowledge_base: pd.DataFrame
) -> pd.DataFrame:
    cfg = settings.config.data
    if cfg.benchmark_file is not None:
        df, source = load_task_file(cfg.benchmark_file, default_split="benchmark"), cfg.benchmark_file
    else:
        df, source = (
            _generate(
                cfg, "benchmark", cfg.seed + BENCHMARK_SEED_OFFSET, kb_from_rows(knowledge_base.to_dict("records"))
            ),
            "generated",
        )
    if cfg.task_file is not None:  # the task file's own held-out rows
        held = load_task_file(cfg.task_file, only_split="benchmark")  # its other rows are training_tasks' to check
        if len(held):
            df, source = (
                pd.concat([df, held], ignore_index=True),
                f"{source} + {len(held)} held-out rows of {cfg.task_file}",
            )
    if df.empty:
        raise ValueError(
            "the benchmark has no tasks: with data.corpus_file, search tasks are not generated; give data.benchmark_file, "
            "or rows with split 'benchmark' in data.task_file"
        )
    suites = settings.config.benchmark.suites
    if suites:
        df = pd.concat([df, suite_tasks(suites)], ignore_index=True)
    context.add_output_metadata(
        {
            "rows": len(df),
            "source": source,
            **_counts(df),
            **_dataset_report(df),
            **{f"suite_{name}": int((df["split"] == name).sum()) for name in suites},
            "preview": MetadataValue.md(df.head(5).to_markdown()),
        }
    )
    return df


@asset(
    group_name="data", description="Training tasks: generated (or read from data.task_file), minus any benchmark task."
)
def training_tasks(
    context: AssetExecutionContext,
    settings: FlywheelSettings,
    benchmark_tasks: pd.DataFrame,
    knowledge_base: pd.DataFrame,
) -> pd.DataFrame:
    cfg = settings.config.data
    held_out = frozenset(benchmark_tasks["task_id"])
    if cfg.task_file is not None:
        df = load_task_file(cfg.task_file)
        df = df[df["split"] != "benchmark"].reset_index(drop=True)  # those are held out (benchmark_tasks)
        source = cfg.task_file
    else:
        df = _generate(cfg, "train", cfg.seed, kb_from_rows(knowledge_base.to_dict("records")), exclude_ids=held_out)
        source = "generated"
    before = len(df)
    if "task_id" in df:  # decontaminate; a missing column is reported by the contract check
        df = df[~df["task_id"].isin(held_out)].reset_index(drop=True)
    context.add_output_metadata(
        {
            "rows": len(df),
            "source": source,
            "removed_overlap_with_benchmark": before - len(df),
            **_counts(df),
            **_dataset_report(df),
        }
    )
    return df


knowledge_base_contract = contract_check("knowledge_base", "knowledge_base")
training_tasks_contract = contract_check("training_tasks", "tasks")
benchmark_tasks_contract = contract_check("benchmark_tasks", "tasks")


@asset_check(
    asset=training_tasks,
    blocking=True,
    additional_ins={"benchmark_tasks": AssetIn("benchmark_tasks")},
    description="No benchmark task appears in training: same id, same normalized prompt, or a shared long word run.",
)
def training_disjoint_from_benchmark(
    settings: FlywheelSettings, training_tasks: pd.DataFrame, benchmark_tasks: pd.DataFrame
) -> AssetCheckResult:
    found = (
        overlaps(
            benchmark_tasks.to_dict("records"),
            training_tasks.to_dict("records"),
            ngram=settings.config.data.contamination_ngram,
        )
        if {"task_id", "prompt"} <= set(training_tasks)
        else []
    )
    by_kind = {how: sum(f["how"] == how for f in found) for how in dict.fromkeys(f["how"] for f in found)}
    description = (
        "benchmark tasks seen in training:\n"
        + "\n".join(f"  benchmark {f['benchmark_id']} ~ training {f['training_id']} ({f['how']})" for f in found[:20])
        if found
        else None
    )
    return AssetCheckResult(
        passed=not found,
        description=description,
        metadata={"overlapping_tasks": len(found), **by_kind, "overlaps": MetadataValue.json(found[:50])},
    )


# ---------------------------------------------------------------- the search index

SELF_RANK_K = 5


def index_key(passages: list[str]) -> str:
    """The index's folder name: a hash of what it indexes, so a consumer finds the index built
    for exactly its knowledge base (and builds one in memory if there is none)."""
    return hashlib.sha256("\x00".join(passages).encode()).hexdigest()[:16]


@asset(
    group_name="data",
    description="The search tool's BM25 index (bm25s) over the knowledge base's passages, saved with the "
    "artifacts for the SFT, RL and benchmark steps; one row per passage (its indexed terms, its "
    "rank when its own text is the query), checked by a data contract.",
)
def search_index(
    context: AssetExecutionContext, settings: FlywheelSettings, storage: ArtifactStore, knowledge_base: pd.DataFrame
) -> pd.DataFrame:
    documents = kb_from_rows(knowledge_base.to_dict("records")).documents
    passages = [passage(d) for d in documents]
    retriever = BM25Retriever.build(passages)
    with storage.writable_dir("search_index", index_key(passages), provenance=settings.provenance(context.run_id)) as (
        folder,
        uri,
    ):
        retriever.save(folder)
    ranks = self_ranks(retriever, passages)
    df = pd.DataFrame({"doc_id": [d["doc_id"] for d in documents], "terms": retriever.terms, "self_rank": ranks})
    context.add_output_metadata(
        {
            "documents": len(df),
            "uri": uri,
            "retriever": retriever.kind,
            "vocabulary": retriever.vocabulary_size(),
            f"self_retrieval_at_{SELF_RANK_K}": float((df["self_rank"] >= 1).mean()),
            "self_retrieval_at_1": float((df["self_rank"] == 1).mean()),
        }
    )
    return df


def self_ranks(retriever, passages: list[str]) -> list[int]:
    """Each passage's rank (1-based; 0 past SELF_RANK_K) when its own text is the query: a passage
    a retriever cannot find from its own words is noise or a duplicate."""
    ids, _ = retriever.retrieve(passages, SELF_RANK_K)
    return [row.index(i) + 1 if i in row else 0 for i, row in enumerate(ids)]


def search_retriever(storage: ArtifactStore, kb) -> BM25Retriever | None:
    """The `search_index` asset's retriever for `kb`, or None if it was not built (a consumer then
    indexes in memory: same passages, same scores)."""
    if kb is None or not kb.documents:
        return None
    uri = storage.uri("search_index", index_key([passage(d) for d in kb.documents]))
    fs, path = filesystem(uri)
    if not fs.exists(f"{path.rstrip('/')}/{MANIFEST}"):
        return None
    # a damaged index is an error (CorruptArtifact), not silently rebuilt
    return load_retriever(storage.local_path(uri))


search_index_contract = contract_check("search_index", "search_index")
