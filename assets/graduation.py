"""The SFT graduation gate: a blocking check on `sft_checkpoint` (training/graduation.py).

A checkpoint that fails blocks everything after it in the foundation run (its benchmark, and so
every RL round): `make run` stops with the check's message, which names each failed criterion
and by how much. `make resume` re-runs the exam, so it stays blocked until SFT is retrained
(`make run` with more `sft.steps`) or the thresholds in `sft.graduation` are lowered.
"""

import pandas as pd
import torch
from dagster import AssetCheckResult, AssetCheckSeverity, AssetIn, MetadataValue, asset_check

from assets.benchmark import engine_budget
from assets.data import search_retriever
from assets.plots import criteria_png, markdown_image
from assets.resources import ArtifactStore, FlywheelSettings, SandboxResource
from assets.sft import load_checkpoint, records
from environments.families import build_tools
from environments.search import kb_from_rows
from training.agent.engines import build_rollout_engine
from training.evaluate import evaluate_policy
from training.graduation import GraduationReport, exam_tasks, grade
from training.judge import judge_for
from verifiers.cascade import Cascade


def sit_exam(
    cfg, storage: ArtifactStore, sandbox: SandboxResource, pointer: dict, tasks: list[dict], kb_rows: list[dict]
) -> GraduationReport:
    """The checkpoint at `pointer` on `sft.graduation.tasks_per_family` training tasks per family."""
    grad = cfg.sft.graduation
    torch.set_num_threads(cfg.threads)
    model, tok = load_checkpoint(storage, pointer, cfg.model.dtype, cfg.device)
    exam = exam_tasks(tasks, grad.tasks_per_family, cfg.seed)
    kb = kb_from_rows(kb_rows)
    with sandbox.open() as box:
        tools = build_tools(
            sandbox=box, kb=kb, top_k=cfg.data.knowledge_base.top_k, retriever=search_retriever(storage, kb)
        )
        engine = build_rollout_engine(engine_budget(cfg), model, tok, seed=cfg.seed)
        try:
            rows = evaluate_policy(
                engine,
                tok,
                exam,
                tools,
                cfg.rollout,
                Cascade(cfg.reward, box, concurrency=cfg.sandbox.pool_size, judge=judge_for(cfg.reward)),
                samples_per_task=grad.samples_per_task,
                temperature=cfg.rollout.temperature,  # as RL will sample
                greedy=False,
                seed=cfg.seed,
                batch_size=cfg.benchmark.batch_size,
            )
        finally:
            engine.close()
    return grade(rows, grad)


@asset_check(
    asset="sft_checkpoint",
    blocking=True,
    additional_ins={"training_tasks": AssetIn("training_tasks"), "knowledge_base": AssetIn("knowledge_base")},
    description="SFT graduation exam: format, tool-call syntax and success on every family, each over its "
    "threshold in sft.graduation; blocks the SFT benchmark and RL on a fail.",
)
def sft_graduation(
    context,
    settings: FlywheelSettings,
    storage: ArtifactStore,
    sandbox: SandboxResource,
    sft_checkpoint: dict,
    training_tasks: pd.DataFrame,
    knowledge_base: pd.DataFrame,
) -> AssetCheckResult:
    cfg = settings.config
    if not cfg.sft.graduation.enabled:
        return AssetCheckResult(passed=True, description="sft.graduation.enabled is false: not examined")
    report = sit_exam(cfg, storage, sandbox, sft_checkpoint, records(training_tasks), records(knowledge_base))
    (context.log.info if report.passed else context.log.error)(report.message())
    return AssetCheckResult(
        passed=report.passed,
        severity=AssetCheckSeverity.ERROR,
        description=report.message(),
        metadata={
            "episodes": report.episodes,
            "failed": ", ".join(c.name for c in report.failed) or "none",
            **{f"{c.name}": MetadataValue.float(round(c.measured, 4)) for c in report.criteria},
            "criteria": MetadataValue.md(report.table()),
            "exam": markdown_image(
                criteria_png(
                    [c.name for c in report.criteria],
                    [c.measured for c in report.criteria],
                    [c.threshold for c in report.criteria],
                    [c.passed for c in report.criteria],
                    "SFT graduation exam",
                ),
                "SFT graduation exam",
            ),
        },
    )
