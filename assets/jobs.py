"""Jobs a step launches outside its own process through Dagster Pipes (assets/launcher.py):

    python -m assets.jobs sft|rl_round|benchmark      # DAGSTER_PIPES_CONTEXT / _MESSAGES set by the launcher
    python -m torch.distributed.run --standalone --nproc-per-node N -m assets.jobs rl_round   # N ranks

A job rebuilds the profile, the artifact store and the sandbox from the extras, reads the stored
inputs itself, and does the same work as the in-process path (assets/sft.py::fit_sft,
assets/rl.py::fit_round, assets/benchmark.py::evaluate_checkpoint). Under torchrun every rank
runs it (the work is collective: data-parallel SFT and RL, the benchmark's tasks split over
ranks) and only rank 0 opens the Pipes channel: its progress lines become the step's log, its
results a custom message or the materialization. The other ranks read the same context and log
to their own stderr (torchrun keeps it per rank for the launcher's failure message).
"""

from __future__ import annotations

import io
import json
import logging
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pandas as pd
from dagster_pipes import PipesDefaultContextLoader, PipesEnvVarParamsLoader, open_dagster_pipes
from torch.distributed.elastic.multiprocessing.errors import record

from assets.artifacts import exists, read_verified_bytes
from assets.benchmark import evaluate_checkpoint
from assets.io import read_stored_frame
from assets.resources import ArtifactStore, SandboxResource
from assets.rl import fit_round, round_log_line, store_round_result
from assets.sft import fit_sft, records, sft_log_line
from configs import load_profile
from environments.family import resolve_families
from training.data_parallel import leave_together
from training.engines import DIST_ENV


@dataclass
class Report:
    """What a job sends back: custom messages, then the materialization's metadata (if any)."""

    messages: list[dict] = field(default_factory=list)
    materialization: dict[str, Any] | None = None


def job_config(extras: dict):
    """The profile as the step resolved it. On CPU, ranks on one machine share its cores: each
    gets its share of `threads`, or they would oversubscribe the cores and all slow down."""
    cfg = resolve_families(load_profile(extras["profile"], json.loads(extras["overrides_json"])))
    local = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    if cfg.device == "cpu" and local > 1:
        cfg = cfg.model_copy(update={"threads": max(1, cfg.threads // local)})
    return cfg


def stored_frame(storage: ArtifactStore, asset: str) -> pd.DataFrame:
    frame = read_stored_frame(storage.uri("assets"), asset, "all")
    if frame is None:
        raise FileNotFoundError(f"job: no stored {asset} under {storage.uri('assets')} (materialize {asset} first)")
    return frame


def sft(extras: dict, log: Callable[[str], None]) -> Report:
    cfg = job_config(extras)
    storage = ArtifactStore(root=extras["storage_root"], cache_dir=extras["cache_dir"])
    if not exists(extras["trajectories"]):
        raise FileNotFoundError(
            f"sft job: no stored sft_trajectories at {extras['trajectories']} (materialize sft_trajectories first)"
        )
    trajectories = pd.read_parquet(io.BytesIO(read_verified_bytes(extras["trajectories"], "sft_trajectories")))
    result = fit_sft(
        cfg,
        storage,
        extras["base_model"],
        trajectories,
        lambda step, m: log(sft_log_line(step, cfg.sft.steps, m)),
        extras.get("provenance"),
    )
    last = result["history"][-1]
    return Report(
        [{"history": result["history"]}],
        {
            "uri": result["uri"],
            "trainable_parameters": result["trainable_parameters"],
            "final_loss": float(last["loss/sft"]),
        },
    )


def rl_round(extras: dict, log: Callable[[str], None]) -> Report:
    cfg = job_config(extras)
    storage = ArtifactStore(root=extras["storage_root"], cache_dir=extras["cache_dir"])
    round_index = int(extras["round"])
    result, uri = fit_round(
        cfg,
        storage,
        SandboxResource.from_config(cfg.sandbox),
        extras["init"],
        extras["init_version"],
        extras["sft_checkpoint"],
        records(stored_frame(storage, "training_tasks")),
        records(stored_frame(storage, "knowledge_base")),
        extras["weights"],
        round_index,
        lambda step, m: log(round_log_line(round_index, cfg.rl.steps_per_round, step, m)),
        extras.get("provenance"),
        teacher=extras.get("teacher"),
        hindsight_from=extras.get("hindsight_from"),
    )
    if not uri:  # not rank 0: rank 0 stores and reports
        return Report()
    result_uri = store_round_result(storage, result, round_index, extras.get("provenance"))
    # A custom message, not a materialization: the step's multi-asset yields its four outputs itself.
    return Report(
        [{"uri": uri, "result_uri": result_uri, "steps": len(result.history), "trajectories": len(result.rollouts)}]
    )


def benchmark(extras: dict, log: Callable[[str], None]) -> Report:
    cfg = job_config(extras)
    storage = ArtifactStore(root=extras["storage_root"], cache_dir=extras["cache_dir"])
    tasks = records(stored_frame(storage, extras["tasks_asset"]))
    log(f"benchmark of {extras['pointer']['uri']} on {len(tasks)} tasks")
    summary, per_task = evaluate_checkpoint(
        cfg,
        storage,
        SandboxResource.from_config(cfg.sandbox),
        extras["pointer"],
        tasks,
        records(stored_frame(storage, "knowledge_base")),
    )
    return Report([{"summary": summary, "per_task": per_task}])


JOBS: dict[str, Callable[[dict, Callable[[str], None]], Report]] = {
    "sft": sft,
    "rl_round": rl_round,
    "benchmark": benchmark,
}


@record  # under torchrun: a rank that raises writes its error file, so the launcher names that rank
def main(argv: list[str]) -> int:
    if len(argv) != 1 or argv[0] not in JOBS:
        print(
            f"usage: python -m assets.jobs {{{','.join(JOBS)}}} (launched by assets/launcher.py through Dagster Pipes)",
            file=sys.stderr,
        )
        return 2
    job = JOBS[argv[0]]
    if "TORCHELASTIC_RUN_ID" not in os.environ:
        # One process, not torchrun's: a world of its own. The launching step may hold a DeepSpeed
        # world of one (RANK, MASTER_PORT... in its environment, which Pipes passes on): joining
        # its address would fail with EADDRINUSE.
        for name in DIST_ENV:
            os.environ.pop(name, None)
    if int(os.environ.get("RANK", "0")) == 0:
        with open_dagster_pipes() as pipes:
            report = job(pipes.extras, pipes.log.info)
            leave_together()
            for message in report.messages:
                pipes.report_custom_message(message)
            if report.materialization is not None:
                pipes.report_asset_materialization(metadata=report.materialization)
        return 0
    # Another rank: the same context (extras), read without opening the message channel.
    logging.basicConfig(level=logging.INFO, format=f"[rank {os.environ['RANK']}] %(message)s", stream=sys.stderr)
    with PipesDefaultContextLoader().load_context(PipesEnvVarParamsLoader().load_context_params()) as context:
        extras = context["extras"]
    job(extras, logging.getLogger("assets.jobs").info)
    leave_together()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
