"""Jobs a step launches outside its own process through Dagster Pipes (assets/launcher.py):

    python -m assets.jobs sft     # with DAGSTER_PIPES_CONTEXT / DAGSTER_PIPES_MESSAGES set by the launcher

The job rebuilds the profile and the artifact store from the extras, does the same work as the
in-process path (assets/sft.py::fit_sft), and reports back: each progress line as a log
message, the history as a custom message, and the checkpoint as the asset's materialization.
"""

from __future__ import annotations

import io
import json
import sys

import pandas as pd
from dagster_pipes import PipesContext, open_dagster_pipes

from assets.artifacts import exists, read_verified_bytes
from assets.resources import ArtifactStore
from assets.sft import fit_sft, sft_log_line
from configs import load_profile


def sft(pipes: PipesContext) -> None:
    extras = pipes.extras
    cfg = load_profile(extras["profile"], json.loads(extras["overrides_json"]))
    storage = ArtifactStore(root=extras["storage_root"], cache_dir=extras["cache_dir"])
    if not exists(extras["trajectories"]):
        raise FileNotFoundError(f"sft job: no stored sft_trajectories at {extras['trajectories']} (materialize sft_trajectories first)")
    trajectories = pd.read_parquet(io.BytesIO(read_verified_bytes(extras["trajectories"], "sft_trajectories")))
    result = fit_sft(cfg, storage, extras["base_model"], trajectories, lambda step, m: pipes.log.info(sft_log_line(step, cfg.sft.steps, m)),
                     extras.get("provenance"))
    pipes.report_custom_message({"history": result["history"]})
    last = result["history"][-1]
    pipes.report_asset_materialization(metadata={"uri": result["uri"], "trainable_parameters": result["trainable_parameters"],
                                                 "final_loss": float(last["loss/sft"])})


JOBS = {"sft": sft}


def main(argv: list[str]) -> int:
    if len(argv) != 1 or argv[0] not in JOBS:
        print(f"usage: python -m assets.jobs {{{','.join(JOBS)}}} (launched by assets/launcher.py through Dagster Pipes)", file=sys.stderr)
        return 2
    with open_dagster_pipes() as pipes:
        JOBS[argv[0]](pipes)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
