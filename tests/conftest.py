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
    from training.warm_start import warm_started_policy

    return warm_started_policy(micro_cfg, sandbox, sft_steps=200)


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
