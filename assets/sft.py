"""Tokenizer, base model, expert trajectories and the SFT checkpoint."""

import shutil
from pathlib import Path

import pandas as pd
import torch
from dagster import AssetExecutionContext, Failure, MetadataValue, Output, asset

from assets.contracts import contract_check
from assets.data import search_retriever
from assets.launcher import JobLauncher
from assets.plots import curves_png, markdown_image
from assets.policies import FLAKY_STEP_RETRY, GPU_POOL
from assets.resources import ArtifactStore, FlywheelSettings, SandboxResource
from assets.tracking import MLflowTracker
from environments.families import build_tools
from environments.search import kb_from_rows
from environments.sft_files import load_sft_file
from environments.task_files import TaskFileError
from training.data_parallel import DataParallel
from training.engines import resolve_device
from training.lora import apply_lora, lora_summary, merged
from training.model import build_model, load_policy, load_tokenizer, num_parameters, save_checkpoint
from training.model_sources import resolve_pretrained
from training.sft import Example, train_sft
from training.tokenizer import tag_tokens, train_tokenizer
from training.trajectories import build_sft_trajectories, file_trajectory_rows, tokenizer_corpus


def records(df: pd.DataFrame) -> list[dict]:
    return df.to_dict("records")


def load_checkpoint(storage: ArtifactStore, pointer: dict, dtype: str = "float32", device: str = "cpu"):
    path = storage.local_path(pointer["uri"])
    return load_policy(path, dtype, resolve_device(device)), load_tokenizer(path)


@asset(group_name="model", description="BPE tokenizer trained on the synthetic corpus (or the pretrained model's own).")
def tokenizer(
    context: AssetExecutionContext,
    settings: FlywheelSettings,
    storage: ArtifactStore,
    training_tasks: pd.DataFrame,
    knowledge_base: pd.DataFrame,
) -> dict:
    cfg = settings.config.model
    documents = [d["text"] for d in kb_from_rows(records(knowledge_base)).documents]
    if cfg.source == "pretrained":  # the model's own tokenizer (a GGUF is imported into the model cache first)
        tok = load_tokenizer(resolve_pretrained(cfg.name_or_path, cfg.gguf_file))
    else:
        tok = train_tokenizer(tokenizer_corpus(records(training_tasks), documents), cfg.vocab_size)
    tags = tag_tokens(tok)
    with storage.writable_dir("tokenizer", provenance=settings.provenance(context.run_id)) as (path, uri):
        tok.save_pretrained(path)
    context.add_output_metadata(
        {
            "vocab_size": len(tok),
            "tag_tokens": MetadataValue.json(tags),
            "uri": uri,
            "single_token_tags": all(len(ids) == 1 for ids in tags.values()),
            "chat_template": MetadataValue.text(tok.chat_template or "(none: PLAIN_TEMPLATE)"),
        }
    )
    return {"uri": uri, "vocab_size": len(tok)}


@asset(group_name="model", description="The initial policy: a Qwen2 built from config, or the pretrained checkpoint.")
def base_model(
    context: AssetExecutionContext, settings: FlywheelSettings, storage: ArtifactStore, tokenizer: dict
) -> dict:
    cfg = settings.config
    tok = load_tokenizer(storage.local_path(tokenizer["uri"]))
    if cfg.model.source == "pretrained":
        model = load_policy(resolve_pretrained(cfg.model.name_or_path, cfg.model.gguf_file), cfg.model.dtype)
    else:
        model = build_model(cfg.model, len(tok), tok.eos_token_id, cfg.seed)
    with storage.writable_dir("checkpoints", "base", provenance=settings.provenance(context.run_id)) as (path, uri):
        save_checkpoint(model, tok, path)
    source = {
        "source": cfg.model.source,
        **({"name_or_path": cfg.model.name_or_path} if cfg.model.name_or_path else {}),
    }
    context.add_output_metadata(
        {"parameters": num_parameters(model), "architecture": type(model).__name__, "uri": uri, **source}
    )
    return {"uri": uri, "parameters": num_parameters(model)}


@asset(
    group_name="sft",
    retry_policy=FLAKY_STEP_RETRY,
    deps=["search_index"],
    description="Teacher trajectories (tool calls run in the sandbox), and those of data.sft_file (chat messages), tokenized with tool_mask.",
)
def sft_trajectories(
    context: AssetExecutionContext,
    settings: FlywheelSettings,
    storage: ArtifactStore,
    sandbox: SandboxResource,
    training_tasks: pd.DataFrame,
    tokenizer: dict,
    knowledge_base: pd.DataFrame,
) -> pd.DataFrame:
    cfg = settings.config
    try:  # first: a bad file stops here, naming row and field, and is not retried (it would fail the same way)
        from_file = load_sft_file(cfg.data.sft_file) if cfg.data.sft_file else []
    except (TaskFileError, FileNotFoundError) as exc:
        raise Failure(description=str(exc), allow_retries=False) from exc
    tok = load_tokenizer(storage.local_path(tokenizer["uri"]))
    rows = []
    if not (from_file and cfg.data.sft_file_mode == "replace"):
        kb = kb_from_rows(records(knowledge_base))
        with sandbox.open() as box:
            tools = build_tools(
                sandbox=box, kb=kb, top_k=cfg.data.knowledge_base.top_k, retriever=search_retriever(storage, kb)
            )
            rows = build_sft_trajectories(
                records(training_tasks),
                tok,
                tools,
                teacher=cfg.teacher,
                seed=cfg.seed,
                kb=kb,
                system_prompt=cfg.rollout.system_prompt,
            )
    rows += file_trajectory_rows(from_file, tok, system_prompt=cfg.rollout.system_prompt)
    df = pd.DataFrame(rows)
    if from_file:
        context.add_output_metadata(
            {
                "source": f"{cfg.data.sft_file} ({cfg.data.sft_file_mode})",
                "rows_from_file": len(from_file),
                "file_system_messages_not_used": sum(t.replaced_system for t in from_file),
            }
        )
    mix = df.groupby(["family", "level", "strategy"]).size().unstack(fill_value=0)
    lengths = (df["prompt_ids"].map(len) + df["completion_ids"].map(len)).describe(percentiles=[0.5, 0.9, 0.99])
    context.add_output_metadata(
        {
            "rows": len(df),
            "teacher_accuracy": float(df["correct"].mean()),
            "teacher_accuracy_by_family": MetadataValue.json(
                {k: round(float(v), 4) for k, v in df.groupby("family")["correct"].mean().items()}
            ),
            "tokens_per_trajectory": MetadataValue.json(
                {k: round(float(v), 1) for k, v in lengths.items() if k != "count"}
            ),
            "strategy_by_level": MetadataValue.md(mix.to_markdown()),
            "example": MetadataValue.text(df["completion"].iloc[0]),
        }
    )
    return df


sft_trajectories_contract = contract_check("sft_trajectories", "sft_trajectories")


def fit_sft(
    cfg, storage: ArtifactStore, base_model: dict, trajectories: pd.DataFrame, on_log, provenance: dict | None = None
) -> dict:
    """SFT from the base checkpoint, saved as the `sft` checkpoint: the step's work, wherever it
    runs (in the step, or launched through Dagster Pipes by assets/jobs.py, data-parallel under
    torchrun, where rank 0 saves). Collective across ranks."""
    torch.set_num_threads(cfg.threads)
    model, tok = load_checkpoint(storage, base_model, cfg.model.dtype, cfg.device)
    model = apply_lora(model, cfg.model.lora)
    # loss_mask: the policy's own tokens minus the detours (mistakes and alternatives shown, not taught)
    examples = [
        Example(list(r["prompt_ids"]), list(r["completion_ids"]), list(r["loss_mask"])) for r in records(trajectories)
    ]
    # Resumable state on local disk next to the artifact cache: a re-executed SFT step continues from it.
    state_dir = Path(storage.cache_dir) / "sft-state"
    history = train_sft(
        model,
        examples,
        cfg.sft,
        pad_id=tok.eos_token_id,
        seed=cfg.seed,
        engine_cfg=cfg.engine,
        on_log=on_log,
        state_dir=state_dir,
        device=cfg.device,
        gradient_checkpointing=cfg.model.gradient_checkpointing,
    )
    dp, uri = DataParallel.current(), ""
    if dp.leader:
        with storage.writable_dir("checkpoints", "sft", provenance=provenance) as (path, uri):
            save_checkpoint(merged(model), tok, path)  # LoRA adapters merged: serving and vLLM load a plain HF folder
        shutil.rmtree(state_dir, ignore_errors=True)  # the checkpoint now exists; its resume state is spent
    dp.barrier()
    return {"uri": uri, "history": history, "trainable_parameters": int(lora_summary(model)["trainable"])}


def sft_log_line(step: int, total: int, metrics: dict[str, float]) -> str:
    return f"sft step {step}/{total}: " + ", ".join(f"{k}={v:.4g}" for k, v in metrics.items())


@asset(
    group_name="sft",
    pool=GPU_POOL,
    description="The policy after SFT on teacher trajectories (loss on policy tokens only).",
)
def sft_checkpoint(
    context: AssetExecutionContext,
    settings: FlywheelSettings,
    storage: ArtifactStore,
    tracker: MLflowTracker,
    launcher: JobLauncher,
    sft_trajectories: pd.DataFrame,
    base_model: dict,
) -> Output[dict]:
    cfg = settings.config
    params = {
        "sft": cfg.sft.model_dump(),
        "model": cfg.model.model_dump(),
        "teacher": cfg.teacher.model_dump(),
        "engine": cfg.engine.model_dump(),
        "launcher": launcher.kind,
        "nproc_per_node": launcher.nproc_per_node,
    }
    with tracker.run(context, "sft_checkpoint", params) as run_id:
        if launcher.external:  # the job reads the stored trajectories itself and reports back through Pipes
            extras = {
                "profile": settings.profile,
                "overrides_json": settings.overrides_json,
                "storage_root": storage.root,
                "cache_dir": storage.cache_dir,
                "base_model": base_model,
                "trajectories": f"{storage.uri('assets')}/sft_trajectories/all.parquet",
                "provenance": settings.provenance(context.run_id),
            }
            result = sft_result(launcher.launch(context, "sft", extras))
        else:
            result = fit_sft(
                cfg,
                storage,
                base_model,
                sft_trajectories,
                lambda step, m: context.log.info(sft_log_line(step, cfg.sft.steps, m)),
                settings.provenance(context.run_id),
            )
        history = result["history"]
        tracker.log_history(run_id, history)
        png = curves_png(history, ["loss/sft", "perf/grad_norm"], "SFT")
        tracker.log_png(run_id, png, "sft_curves.png")
    uri = result["uri"]
    return Output(
        {"uri": uri, "mlflow_run_id": run_id},
        metadata={
            "final_loss": history[-1]["loss/sft"],
            "steps": cfg.sft.steps,
            "mlflow_run_id": run_id,
            "mlflow_run": tracker.run_link(run_id),
            "uri": uri,
            "engine": cfg.engine.kind,
            "trainable_parameters": result["trainable_parameters"],
            "launcher": launcher.kind,
            "curves": markdown_image(png, "SFT loss"),
        },
    )


def sft_result(invocation) -> dict:
    """What an SFT job reported through Pipes: the checkpoint (its materialization) and the
    history (a custom message; the per-step lines already went to the step's log)."""
    reported = invocation.get_materialize_result().metadata
    [history] = [m["history"] for m in invocation.get_custom_messages() if isinstance(m, dict) and "history" in m]
    return {
        "uri": reported["uri"].value,
        "history": history,
        "trainable_parameters": int(reported["trainable_parameters"].value),
    }
