import re

import pytest

from configs import ConfigError, available_profiles, load_profile, parse_override


def test_all_profiles_validate(cluster_env):
    assert {"tiny", "micro", "gpu", "cluster"} <= set(available_profiles())
    for name in available_profiles():
        cfg = load_profile(name)
        assert cfg.profile == name
    assert load_profile("gpu").model.name_or_path == "Qwen/Qwen2.5-1.5B-Instruct"
    cluster = load_profile("cluster")
    assert cluster.storage.root == cluster_env["FLYWHEEL_ARTIFACT_ROOT"]
    assert cluster.orchestration.k8s.gpu_image == cluster_env["FLYWHEEL_TRAINER_IMAGE"]


def test_tiny_is_default(monkeypatch):
    monkeypatch.delenv("FLYWHEEL_PROFILE", raising=False)
    assert load_profile().profile == "tiny"


@pytest.mark.parametrize(
    "override, field, shown",
    [
        ({"rl.group_size": 1}, "rl.group_size", "1"),
        ({"teacher.p_direct": 1.5}, "teacher.p_direct", "1.5"),
        ({"rl.learning_rate": -1}, "rl.learning_rate", "-1"),
        ({"rl.loss_agg_mode": "token_sum"}, "rl.loss_agg_mode", "token_sum"),
        ({"sft.stepz": 3}, "sft.stepz", "3"),
        ({"reward.terms.format.cap": 0.9}, "reward", "outcome_weight"),
    ],
)
def test_invalid_values_name_field_and_value(override, field, shown):
    with pytest.raises(ConfigError) as err:
        load_profile("tiny", override)
    assert field in str(err.value) and shown in str(err.value)


def test_unknown_profile_lists_available():
    with pytest.raises(ConfigError, match="unknown profile 'huge'.*tiny"):
        load_profile("huge")


def test_override_parsing():
    assert parse_override("rl.rounds=3") == ("rl.rounds", 3)
    assert parse_override("data.task_file=/x.jsonl") == ("data.task_file", "/x.jsonl")
    with pytest.raises(ConfigError):
        parse_override("rl.rounds")


def test_config_choices_match_the_registries():
    """The schema's Literal choices are the registered names, so a typo fails at load time."""
    from typing import get_args

    from configs.schema import RLConfig
    from training.rl.algorithms import ALGORITHMS
    from training.rl.math import (
        ADVANTAGE_ESTIMATORS,
        AGG_MODES,
        KL_ESTIMATORS,
        POLICY_LOSSES,
        TOKEN_ADVANTAGE_ESTIMATORS,
    )

    def choices(name: str) -> set[str]:  # Literal[...] | None -> the Literal's strings
        return {
            value
            for arg in get_args(RLConfig.model_fields[name].annotation)
            for value in (get_args(arg) or (arg,))
            if isinstance(value, str)
        }

    assert choices("algorithm") == set(ALGORITHMS.names())
    # gae: token-level, needs the critic
    assert choices("advantage_estimator") == set(ADVANTAGE_ESTIMATORS.names()) | set(TOKEN_ADVANTAGE_ESTIMATORS.names())
    assert choices("policy_loss") == set(POLICY_LOSSES.names())
    assert choices("loss_agg_mode") == set(AGG_MODES.names())
    assert choices("kl_estimator") == set(KL_ESTIMATORS.names())


def test_override_inside_a_default_mapping_keeps_the_rest():
    cfg = load_profile("tiny", {"reward.terms.format.weight": 0.05, "reward.verifiers.arithmetic.params.rel_tol": 0.0})
    assert cfg.reward.terms["format"].weight == 0.05 and cfg.reward.terms["format"].cap == 0.1
    assert set(cfg.reward.terms) == {"format", "tool_cost", "tool_misuse", "overlong"}
    assert set(cfg.reward.verifiers) == {"arithmetic", "search", "code"}
    assert cfg.reward.verifiers["arithmetic"].name == "math" and cfg.reward.verifiers["arithmetic"].params == {
        "rel_tol": 0.0
    }


def test_vllm_on_cpu_refuses_a_head_size_its_kernels_lack():
    # head size 128/4 = 32: served
    assert load_profile("tiny", {"rollout.engine": "vllm"}).rollout.vllm.block_size == 32
    with pytest.raises(
        ConfigError,
        match=r"rollout.engine=vllm on CPU needs a head size .* model.hidden_size 128 / model.num_attention_heads 8 = 16",
    ):
        load_profile("tiny", {"rollout.engine": "vllm", "model.num_attention_heads": 8, "model.num_key_value_heads": 8})


def test_cluster_profile_reads_the_terraform_outputs_from_the_environment(cluster_env):
    cfg = load_profile("cluster")
    assert cfg.tracking.tracking_uri == cluster_env["MLFLOW_TRACKING_URI"]
    assert cfg.orchestration.k8s.image == cluster_env["FLYWHEEL_IMAGE"]
    assert cfg.sandbox.image == cluster_env["FLYWHEEL_SANDBOX_IMAGE"]


def test_an_unset_variable_names_the_profile_field_and_variable(cluster_env, monkeypatch):
    monkeypatch.delenv("FLYWHEEL_ARTIFACT_ROOT")
    with pytest.raises(ConfigError) as err:
        load_profile("cluster")
    message = str(err.value)
    assert "cluster.yaml" in message and "storage.root" in message and "FLYWHEEL_ARTIFACT_ROOT" in message


def test_references_take_defaults_and_sit_inside_longer_values(monkeypatch):
    monkeypatch.delenv("FLYWHEEL_TEST_BUCKET", raising=False)
    monkeypatch.setenv("FLYWHEEL_TEST_PREFIX", "run7")
    cfg = load_profile("micro", {"storage.root": "s3://${FLYWHEEL_TEST_BUCKET:-fallback}/${FLYWHEEL_TEST_PREFIX}/x"})
    assert cfg.storage.root == "s3://fallback/run7/x"
    # set but empty: the default applies, as in a shell's ${VAR:-default}
    monkeypatch.setenv("FLYWHEEL_TEST_BUCKET", "")
    assert load_profile("micro", {"storage.root": "${FLYWHEEL_TEST_BUCKET:-b}"}).storage.root == "b"
    monkeypatch.setenv("FLYWHEEL_TEST_BUCKET", "real")
    assert load_profile("micro", {"storage.root": "${FLYWHEEL_TEST_BUCKET:-b}"}).storage.root == "real"


def test_every_variable_the_cluster_profile_reads_is_documented():
    from configs import PROFILE_DIR, env_references

    text = (PROFILE_DIR / "cluster.yaml").read_text()
    names = {name for name, _ in env_references(text)}
    assert {
        "FLYWHEEL_ARTIFACT_ROOT",
        "FLYWHEEL_IMAGE",
        "FLYWHEEL_TRAINER_IMAGE",
        "FLYWHEEL_SANDBOX_IMAGE",
        "MLFLOW_TRACKING_URI",
    } <= names
    guide = (PROFILE_DIR.parent / "docs" / "deploy.md").read_text()
    assert not [name for name in names if f"`{name}`" not in guide], (
        "docs/deploy.md must list every variable configs/cluster.yaml reads"
    )


def test_flywheel_threads_replaces_every_profiles_threads_and_an_explicit_override_wins(cluster_env, monkeypatch):
    """tests/conftest.py sets FLYWHEEL_THREADS=1 under pytest-xdist: every process of a worker, the
    child processes a test starts included, then takes one thread, not the profile's."""
    monkeypatch.delenv("FLYWHEEL_THREADS", raising=False)
    assert (load_profile("micro").threads, load_profile("gpu").threads) == (2, 8)
    monkeypatch.setenv("FLYWHEEL_THREADS", "1")
    assert {name: load_profile(name).threads for name in available_profiles()} == dict.fromkeys(available_profiles(), 1)
    assert load_profile("gpu", {"threads": 4}).threads == 4
    monkeypatch.setenv("FLYWHEEL_THREADS", "")  # set but empty: as if unset
    assert load_profile("gpu").threads == 8


@pytest.mark.parametrize("value", ["0", "-1", "1.5", "two"])
def test_a_bad_flywheel_threads_is_refused_naming_the_variable_and_value(monkeypatch, value):
    monkeypatch.setenv("FLYWHEEL_THREADS", value)
    with pytest.raises(
        ConfigError, match=rf"FLYWHEEL_THREADS must be a whole number of threads >= 1 \(got '{re.escape(value)}'\)"
    ):
        load_profile("micro")
