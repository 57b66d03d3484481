"""The pretrained-model path end to end (issue 22): the micro flywheel with `model.source:
pretrained` on a Qwen2 folder whose tokenizer splits the tags (the gpu profile's path, on a model
built in seconds), and on the real SmolLM2-135M-Instruct."""

import pytest
import torch

from tests.conftest import TEST_THREADS
from training.model import save_checkpoint

pytestmark = [pytest.mark.realmodel, pytest.mark.slow]


@pytest.fixture()
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("FLYWHEEL_HOME", str(tmp_path / "fw"))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    return tmp_path / "fw"


def _assert_flywheel_ran(home, outcome, tokenizer):
    from dagster import AssetKey, DagsterInstance
    from mlflow import MlflowClient

    assert outcome["sft"]["version"] == "1" and len(outcome["rounds"]) == 1
    instance = DagsterInstance.get()
    meta = instance.get_latest_materialization_event(AssetKey("tokenizer")).asset_materialization.metadata
    assert meta["single_token_tags"].value is False  # the tags are text on this tokenizer
    client = MlflowClient(f"sqlite:///{home}/mlflow.db")
    experiment = client.get_experiment_by_name("agentic-flywheel").experiment_id
    (rl_run,) = client.search_runs([experiment], "tags.`dagster.asset` = 'rl_round'")
    gap = client.get_metric_history(rl_run.info.run_id, "rollout/logprob_mismatch_max")
    assert gap and all(m.value < 1e-4 for m in gap)  # HF engine, fp32: the recorded ids are the sampled ids


def test_micro_flywheel_on_a_pretrained_qwen2_whose_tokenizer_splits_the_tags(home, split_policy, tmp_path):
    from pipelines.run import run_flywheel

    folder = save_checkpoint(split_policy.model, split_policy.tokenizer, tmp_path / "qwen2-chatml")
    outcome = run_flywheel(
        "micro",
        {
            "model.source": "pretrained",
            "model.name_or_path": str(folder),
            "rollout.system_prompt": "Answer in <answer></answer>.",
        },
    )
    _assert_flywheel_ran(home, outcome, split_policy.tokenizer)
    torch.set_num_threads(TEST_THREADS)  # the run set the profile's `threads`; the suite's own share again


# --------------------------------------------------------------------------- SmolLM2-135M-Instruct
@pytest.fixture(scope="module")
def smol_vllm(smol_policy):
    from configs import load_profile
    from tests.conftest import smol_overrides
    from training.agent.engines import VLLMEngine

    cfg = load_profile("micro", smol_overrides()).rollout
    engine = VLLMEngine.from_model(smol_policy.model, smol_policy.tokenizer, cfg, seed=0)
    yield engine
    engine.close()


@pytest.mark.xdist_group("vllm")  # a vLLM engine, and both kinds share `smol_policy`
@pytest.mark.parametrize("kind", ["hf", "vllm"])
def test_real_model_rollouts_are_token_exact(kind, smol_policy, tmp_path, request):
    """On SmolLM2's own tokenizer (`</code>` is three tokens, the template ChatML): each turn is
    exactly what the engine sampled and ends at the token completing its stop, observations are
    masked, and the trainer's fp32 log-probs of the recorded ids match the engine's within 1e-4."""
    from configs import load_profile
    from tests.conftest import smol_overrides
    from tests.rollout_checks import check_token_exact
    from training.agent.engines import HFEngine

    cfg = load_profile("micro", smol_overrides()).rollout
    engine = (
        HFEngine(smol_policy.model, smol_policy.tokenizer) if kind == "hf" else request.getfixturevalue("smol_vllm")
    )
    tasks = [t for t in smol_policy.tasks if t["family"] == "arithmetic"][:8]
    episodes = check_token_exact(engine, smol_policy, "arithmetic", cfg, tmp_path, 1e-4, tasks=tasks, group_size=2)
    assert any(e.stop_reason == "answer" for e in episodes)


def test_micro_flywheel_on_smollm2_with_lora(home, smollm2_folder):
    """The whole graph on the real model: its tokenizer and chat template, LoRA adapters (saved
    merged), a base benchmark, a few SFT steps, one RL step, a benchmark of a few tasks."""
    from transformers import AutoModelForCausalLM

    from pipelines.run import run_flywheel
    from tests.conftest import smol_overrides

    outcome = run_flywheel(
        "micro",
        {
            **smol_overrides(),
            "model.lora.enabled": True,
            "model.lora.r": 8,
            "benchmark.include_base": True,
            "benchmark.greedy": False,
            "data.families.arithmetic.benchmark_tasks": 6,
            "data.families.search.benchmark_tasks": 3,
            "data.families.code.benchmark_tasks": 3,
            "data.families.arithmetic.train_tasks": 40,
            "data.families.search.train_tasks": 20,
            "data.families.code.train_tasks": 20,
            "teacher.num_trajectories": 16,
            "sft.steps": 2,
            "sft.batch_size": 4,
            "rl.prompts_per_step": 2,
            "rl.group_size": 2,
            "rl.steps_per_round": 1,
            # no resumable state of the 135M model (micro keeps one every RL step for the kill tests)
            "sft.checkpoint_every": 100,
            "rl.checkpoint_every": 10,
        },
    )
    assert "base" in outcome and "base_gain" in outcome
    folder = home / "artifacts" / "checkpoints"
    saved = sorted(p for p in folder.rglob("config.json"))
    assert saved and not list(folder.rglob("adapter_config.json"))  # merged: plain HF folders, no adapters
    model = AutoModelForCausalLM.from_pretrained(saved[-1].parent)
    assert type(model).__name__ == "LlamaForCausalLM" and model.config.vocab_size == 49152
