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
