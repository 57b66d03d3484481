"""The Dagster instance each profile runs on: the local sqlite one is created by `make run`; the
`cluster` one (Postgres storage, K8sRunLauncher, queued runs, the `gpu` pool limit) is printed by
`python -m pipelines.instance` and validated here by Dagster's own instance schema and by the
config schemas of the classes it names (dagster-postgres, dagster-k8s)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml
from dagster._config import process_config
from dagster._core.instance.config import dagster_instance_config

from configs import load_profile
from pipelines.instance import LOCAL_SETTINGS, cluster_settings, instance_yaml

REPO = Path(__file__).resolve().parents[2]


def test_cluster_instance_is_postgres_backed_and_passes_dagsters_schemas(tmp_path, monkeypatch, cluster_env):
    printed = subprocess.run(
        [
            sys.executable,
            "-m",
            "pipelines.instance",
            "--profile",
            "cluster",
            "--set",
            "orchestration.k8s.gpu_pool_limit=2",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert printed.returncode == 0, printed.stderr
    (tmp_path / "dagster.yaml").write_text(printed.stdout)
    config, _ = dagster_instance_config(str(tmp_path))  # raises DagsterInvalidConfigError on a wrong key or type
    from dagster_k8s import K8sRunLauncher
    from dagster_postgres import DagsterPostgresStorage

    assert config["storage"]["postgres"]["postgres_db"]["hostname"] == {"env": "DAGSTER_PG_HOST"}
    # what the pods' env (from the flywheel-env secret) provides
    for var, value in {
        "DAGSTER_PG_HOST": "flywheel.abc.rds.amazonaws.com",
        "DAGSTER_PG_USER": "dagster",
        "DAGSTER_PG_PASSWORD": "s3cret",
        "DAGSTER_PG_DB": "dagster",
    }.items():
        monkeypatch.setenv(var, value)
    for cls, section in (
        (DagsterPostgresStorage, config["storage"]["postgres"]),
        (K8sRunLauncher, config["run_launcher"]["config"]),
    ):
        checked = process_config(cls.config_type(), section)
        assert checked.success, (cls.__name__, checked.errors)
        if cls is DagsterPostgresStorage:
            assert (
                checked.value["postgres_db"]["hostname"] == "flywheel.abc.rds.amazonaws.com"
                and checked.value["postgres_db"]["port"] == 5432
            )
    assert (
        config["run_launcher"]["class"] == "K8sRunLauncher"
        and config["run_launcher"]["config"]["job_namespace"] == "flywheel"
    )
    assert config["run_coordinator"]["class"] == "QueuedRunCoordinator"
    assert config["concurrency"]["pools"] == {"granularity": "op", "default_limit": 2}
    assert config["run_monitoring"]["enabled"] and config["run_retries"]["max_retries"] == 1


def test_local_profiles_keep_the_sqlite_instance(cluster_env):
    assert instance_yaml(load_profile("tiny", {})) == LOCAL_SETTINGS
    local = yaml.safe_load(LOCAL_SETTINGS)
    assert (
        "storage" not in local
        and local["run_monitoring"] == cluster_settings(load_profile("cluster", {}))["run_monitoring"]
    )


def test_a_bad_override_names_the_field(cluster_env):
    printed = subprocess.run(
        [
            sys.executable,
            "-m",
            "pipelines.instance",
            "--profile",
            "cluster",
            "--set",
            "orchestration.k8s.gpu_pool_limit=0",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert printed.returncode == 2 and "orchestration.k8s.gpu_pool_limit" in printed.stderr and not printed.stdout
