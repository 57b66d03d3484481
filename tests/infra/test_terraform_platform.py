"""The platform layer (infra/terraform/modules/platform and environments/aws/platform), checked
offline against the app it deploys.

The kubernetes and helm providers are not installed here, so nothing is planned. Instead:
- the files are parsed with python-hcl2 and their settings asserted;
- the module's Helm values are rendered by Terraform itself: its variables.tf and its locals
  (rebuilt from the parse) go into a scratch directory, `terraform console` evaluates
  `yamldecode(yamlencode(local.<values>))` for sample inputs, and the checks read what Helm
  would receive. The same scratch evaluates the flywheel-env Secret's preconditions;
- the figures are compared with what the app itself produces: pipelines.instance.cluster_settings
  of the `cluster` profile, configs.schema.K8sConfig, configs/cluster.yaml's ${VAR} references,
  the dagster pin in pyproject.toml, docker/dagster.Dockerfile's CMD and the infra layer's outputs.

Each property is a `check_*` over a `Layers` snapshot; `test_check_catches` breaks a copy one way
at a time and requires the matching check to fail.
"""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import subprocess
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import pytest
import yaml

from configs import env_references, load_profile
from configs.schema import K8sConfig
from pipelines.instance import DAGSTER_HOME_IN_POD, INSTANCE_CONFIG_MAP, RUN_MONITORING, RUN_RETRIES, cluster_settings
from tests.terraform_support import (
    ENVIRONMENTS_DIR,
    MODULES_DIR,
    ROOT,
    TERRAFORM_DIR,
    Module,
    Validations,
    load,
    ref,
    references,
    terraform_env,
    validate,
)

PLATFORM_DIR = MODULES_DIR / "platform"
AWS_DIR = ENVIRONMENTS_DIR / "aws" / "platform"
INFRA_DIR = ENVIRONMENTS_DIR / "aws" / "infra"
HAVE_TERRAFORM = shutil.which("terraform") is not None

# The infra layer's flywheel_env output: what the Secret flywheel-env holds next to the password.
CONTRACT_ENV_KEYS = {
    "FLYWHEEL_PROFILE",
    "FLYWHEEL_ARTIFACT_ROOT",
    "FLYWHEEL_IMAGE",
    "FLYWHEEL_TRAINER_IMAGE",
    "FLYWHEEL_SANDBOX_IMAGE",
    "MLFLOW_TRACKING_URI",
    "DAGSTER_PG_HOST",
    "DAGSTER_PG_DB",
    "DAGSTER_PG_USER",
    "AWS_REGION",
}

REGISTRY = "123456789012.dkr.ecr.us-east-1.amazonaws.com"
SAMPLE_ENV = {
    "FLYWHEEL_PROFILE": "cluster",
    "FLYWHEEL_ARTIFACT_ROOT": "s3://flywheel-artifacts-example/flywheel",
    "FLYWHEEL_IMAGE": f"{REGISTRY}/flywheel-dagster:0123456789ab",
    "FLYWHEEL_TRAINER_IMAGE": f"{REGISTRY}/flywheel-trainer:0123456789ab",
    "FLYWHEEL_SANDBOX_IMAGE": f"{REGISTRY}/flywheel-sandbox:0123456789ab",
    "MLFLOW_TRACKING_URI": "http://mlflow.flywheel.svc.cluster.local:5000",
    "DAGSTER_PG_HOST": "flywheel-postgres.abcdefghijkl.us-east-1.rds.amazonaws.com",
    "DAGSTER_PG_DB": "dagster",
    "DAGSTER_PG_USER": "flywheel_admin",
    "AWS_REGION": "us-east-1",
}
SAMPLE_PASSWORD = "rotated-by-rds-7f3a9c"  # made up; the rendered chart values must not contain it
SAMPLE_TOKEN = "sandbox-token-0123456789abcdef0123456789"  # made up, like the password
SAMPLE_INPUTS = {
    "env": SAMPLE_ENV,
    "dagster_image": SAMPLE_ENV["FLYWHEEL_IMAGE"],
    "artifact_root": SAMPLE_ENV["FLYWHEEL_ARTIFACT_ROOT"],
    "db_host": SAMPLE_ENV["DAGSTER_PG_HOST"],
    "db_username": SAMPLE_ENV["DAGSTER_PG_USER"],
    "db_password": SAMPLE_PASSWORD,
    "dagster_database_name": SAMPLE_ENV["DAGSTER_PG_DB"],
    "sandbox_token": SAMPLE_TOKEN,
}
IRSA = "eks.amazonaws.com/role-arn"
EXACT_VERSION = re.compile(r"^\d+\.\d+\.\d+$")
K8S_EFFECT = {"NO_SCHEDULE": "NoSchedule", "NO_EXECUTE": "NoExecute", "PREFER_NO_SCHEDULE": "PreferNoSchedule"}

# helm_release -> (repository, chart) in each directory.
RELEASES = {
    "platform": {
        "dagster": ("https://dagster-io.github.io/helm", "dagster"),
        "mlflow": ("https://community-charts.github.io/helm-charts", "mlflow"),
        "nvidia_device_plugin": ("https://nvidia.github.io/k8s-device-plugin", "nvidia-device-plugin"),
    },
    "aws": {"cluster_autoscaler": ("https://kubernetes.github.io/autoscaler", "cluster-autoscaler")},
}


# --- Rendering the module's locals with Terraform (offline) ---------------------------------------


def is_expression(text: str) -> bool:
    """Whether a parsed value is one whole HCL expression ("${...}") rather than a template."""
    if not (text.startswith("${") and text.endswith("}")):
        return False
    depth, quoted, escaped = 1, False, False
    for i in range(2, len(text)):
        char = text[i]
        if quoted:
            escaped, quoted = (False, quoted) if escaped else (char == "\\", char != '"')
            continue
        if char == '"':
            quoted = True
        elif char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0:
                return i == len(text) - 1
    return False


def to_hcl(value: Any) -> str:
    """A python-hcl2 value back as HCL source (strings keep the parser's HCL escapes)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return f"({value[2:-1]})" if is_expression(value) else '"' + value.replace("\n", "\\n") + '"'
    if isinstance(value, list):
        return "[" + ", ".join(to_hcl(item) for item in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(key)} = {to_hcl(item)}" for key, item in value.items()) + "}"
    raise TypeError(f"cannot write {value!r} as HCL")


def unescape(text: str) -> str:
    """A heredoc's text from python-hcl2, which returns it with HCL string escapes."""
    return re.sub(r"\\(.)", r"\1", text)


def scratch_eval(module: Module, inputs: dict, expressions: list[str], workdir: Path) -> list[Any]:
    """Evaluates expressions over `module`'s variables (validations included) and locals, with
    `inputs` as the variables' values, in one `terraform console` run."""
    if workdir.exists():
        shutil.rmtree(workdir)
    workdir.mkdir(parents=True)
    shutil.copy(module.path / "variables.tf", workdir)
    (workdir / "locals.tf").write_text(
        "locals {\n" + "".join(f"  {name} = {to_hcl(value)}\n" for name, value in module.locals.items()) + "}\n"
    )
    (workdir / "terraform.tfvars.json").write_text(json.dumps(inputs))
    items = ", ".join(f"try(nonsensitive(jsonencode({e})), jsonencode({e}))" for e in expressions)
    done = subprocess.run(
        ["terraform", "console"],
        input=f"jsonencode([{items}])\n",
        cwd=workdir,
        env=terraform_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    (line,) = [out for out in done.stdout.splitlines() if out.startswith('"')]
    return [json.loads(item) for item in json.loads(json.loads(line))]


RENDERED = {
    "dagster": "yamldecode(yamlencode(local.dagster_values))",
    "mlflow": "yamldecode(yamlencode(local.mlflow_values))",
    "device_plugin": "yamldecode(yamlencode(local.device_plugin_values))",
    "secret_keys": "keys(local.flywheel_env_secret)",
    "mlflow_tracking_uri": "local.mlflow_tracking_uri",
    "dagster_values_yaml": "yamlencode(local.dagster_values)",
    "mlflow_values_yaml": "yamlencode(local.mlflow_values)",
}


# --- The snapshot the checks read ----------------------------------------------------------------


@dataclass
class Layers:
    platform: Module
    aws: Module
    infra: Module | None
    eks: Module
    rendered: dict[str, Any] | None  # RENDERED, evaluated for SAMPLE_INPUTS; None without terraform
    settings: dict[str, Any]  # pipelines.instance.cluster_settings of the cluster profile


def sample_profile():
    with pytest.MonkeyPatch.context() as patch:
        for name, value in SAMPLE_ENV.items():
            patch.setenv(name, value)
        return load_profile("cluster")


@pytest.fixture(scope="module")
def layers(tmp_path_factory) -> Layers:
    platform = load(PLATFORM_DIR)
    rendered = None
    if HAVE_TERRAFORM:
        values = scratch_eval(
            platform, SAMPLE_INPUTS, list(RENDERED.values()), tmp_path_factory.mktemp("scratch") / "platform"
        )
        rendered = dict(zip(RENDERED, values))
    return Layers(
        platform=platform,
        aws=load(AWS_DIR),
        infra=load(INFRA_DIR) if INFRA_DIR.is_dir() else None,
        eks=load(MODULES_DIR / "eks"),
        rendered=rendered,
        settings=cluster_settings(sample_profile()),
    )


def rendered(layers: Layers) -> dict[str, Any]:
    if layers.rendered is None:
        pytest.skip("the terraform CLI renders the Helm values; it is not installed")
    return layers.rendered


def infra(layers: Layers) -> Module:
    if layers.infra is None:
        pytest.skip(f"{INFRA_DIR} does not exist")
    return layers.infra


def default_of(module: Module, expression: str):
    """The default of the variable a whole-reference expression such as ${var.x} names."""
    match = re.fullmatch(r"\$\{var\.(\w+)\}", expression)
    assert match, f"{module.name}: expected a variable reference, got {expression!r}"
    return module.default(match.group(1))


def yaml_env_references() -> set[str]:
    """Variables configs/cluster.yaml reads without a default (a default needs no Secret key)."""
    names: set[str] = set()

    def walk(node):
        if isinstance(node, dict):
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)
        elif isinstance(node, str):
            names.update(name for name, default in env_references(node) if default is None)

    walk(yaml.safe_load((ROOT / "configs" / "cluster.yaml").read_text()))
    return names


def dockerfile_cmd() -> list[str]:
    (cmd,) = re.findall(r"^CMD (\[.*\])$", (ROOT / "docker" / "dagster.Dockerfile").read_text(), flags=re.M)
    return json.loads(cmd)


def pinned_dagster() -> str:
    dependencies = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    (pin,) = [d.split("==")[1] for d in dependencies if re.match(r"^dagster==", d)]
    return pin


def tolerates(toleration: dict[str, str], taint: dict[str, str]) -> bool:
    """Kubernetes' rule for a toleration matching a taint (taint in the EKS API's spelling)."""
    if toleration.get("effect") and toleration["effect"] != K8S_EFFECT[taint["effect"]]:
        return False
    if toleration.get("operator", "Equal") == "Exists":
        return not toleration.get("key") or toleration["key"] == taint["key"]
    return toleration.get("key") == taint["key"] and toleration.get("value", "") == taint.get("value", "")


# --- Checks ----------------------------------------------------------------------------------------


def check_charts_pinned(layers: Layers) -> None:
    for key, module in (("platform", layers.platform), ("aws", layers.aws)):
        releases = module.resources("helm_release")
        assert set(releases) == set(RELEASES[key]), (module.name, sorted(releases))
        for name, (repository, chart) in RELEASES[key].items():
            release = releases[name]
            assert (release["repository"], release["chart"]) == (repository, chart), name
            variable = re.fullmatch(r"\$\{var\.(\w+)\}", release["version"])
            assert variable, f"{name}: version must be a variable with a pinned default, not {release['version']!r}"
            assert EXACT_VERSION.match(module.default(variable.group(1))), (
                f"{name}: {module.default(variable.group(1))!r} is not an exact version"
            )
            assert module.variables[variable.group(1)].get("validation"), (
                f"{name}: its version variable must reject ranges"
            )
            # Values go through one yamlencode'd document, not dozens of set blocks.
            assert release["values"] == [
                "${yamlencode(local.%s)}"
                % {
                    "dagster": "dagster_values",
                    "mlflow": "mlflow_values",
                    "nvidia_device_plugin": "device_plugin_values",
                    "cluster_autoscaler": "cluster_autoscaler_values",
                }[name]
            ]
            assert "set" not in release and "set_sensitive" not in release, name


def check_dagster_chart_is_the_app_dagster(layers: Layers) -> None:
    assert layers.platform.default("dagster_chart_version") == pinned_dagster(), (
        "the dagster chart must be the release pyproject.toml pins"
    )


def check_secret_holds_the_app_env(layers: Layers) -> None:
    secret = layers.platform.resource("kubernetes_secret_v1", "flywheel_env")
    assert secret["metadata"][0]["name"] == ref("local.env_secret_name")
    assert layers.platform.locals["env_secret_name"] == K8sConfig().env_secret
    assert secret["data"] == ref("local.flywheel_env_secret")

    required = set(layers.platform.locals["required_env_keys"])
    needed = yaml_env_references() | set(K8sConfig().postgres_env.values()) | {sample_profile().sandbox.token_env}
    assert needed, "configs/cluster.yaml reads no ${VAR}: the cluster profile would not get its bucket or images"
    # Everything the app reads is either required of `env` or a secret the module adds (the
    # database password, the sandbox service's token under the profile's sandbox.token_env)...
    assert needed - required == {"DAGSTER_PG_PASSWORD", "FLYWHEEL_SANDBOX_TOKEN"}, needed - required
    # ...and the module requires nothing the infra layer does not provide.
    assert required <= CONTRACT_ENV_KEYS, required - CONTRACT_ENV_KEYS
    if layers.infra is not None:
        assert set(layers.infra.locals["flywheel_env"]) == CONTRACT_ENV_KEYS
        assert layers.infra.locals["flywheel_env"]["FLYWHEEL_PROFILE"] == layers.platform.locals["profile"]
    if layers.rendered is not None:
        assert set(layers.rendered["secret_keys"]) == CONTRACT_ENV_KEYS | {
            "DAGSTER_PG_PASSWORD",
            "FLYWHEEL_SANDBOX_TOKEN",
        }, layers.rendered["secret_keys"]
    # The profile the code server loads (FLYWHEEL_PROFILE) is the one with the k8s executor, and it
    # loads from nothing but the Secret's variables.
    assert sample_profile().orchestration.executor == "k8s"


def check_instance_matches_pipelines_instance(layers: Layers) -> None:
    values = rendered(layers)["dagster"]
    settings = layers.settings
    k8s = K8sConfig()

    # Run queue and pools: the chart's `concurrency` block, as in cluster_settings, and no
    # run_coordinator config next to it (Dagster refuses max_concurrent_runs in both places).
    assert values["concurrency"]["enabled"] is True
    assert values["concurrency"]["runs"]["maxConcurrentRuns"] == settings["concurrency"]["runs"]["max_concurrent_runs"]
    pools = settings["concurrency"]["pools"]
    assert values["concurrency"]["pools"] == {
        "defaultLimit": pools["default_limit"],
        "granularity": pools["granularity"],
    }
    coordinator = values["dagsterDaemon"]["runCoordinator"]
    assert (
        coordinator["enabled"] is True
        and coordinator["type"] == settings["run_coordinator"]["class"] == "QueuedRunCoordinator"
    )
    assert all(v is None for v in coordinator["config"]["queuedRunCoordinator"].values()), coordinator
    assert set(coordinator["config"]["queuedRunCoordinator"]) >= {
        "maxConcurrentRuns",
        "dequeueNumWorkers",
        "dequeueUseThreads",
    }

    # Monitoring and retries.
    monitoring = values["dagsterDaemon"]["runMonitoring"]
    assert (monitoring["enabled"], monitoring["startTimeoutSeconds"], monitoring["pollIntervalSeconds"]) == (
        RUN_MONITORING["enabled"],
        RUN_MONITORING["start_timeout_seconds"],
        RUN_MONITORING["poll_interval_seconds"],
    )
    assert values["dagsterDaemon"]["runRetries"] == {"enabled": False}
    assert values["additionalInstanceConfig"] == {"run_retries": RUN_RETRIES}
    assert values["telemetry"] == settings["telemetry"]

    # The run launcher: K8sRunLauncher in the namespace, the env Secret, the runner account.
    launcher = values["runLauncher"]
    expected = settings["run_launcher"]["config"]
    assert launcher["type"] == settings["run_launcher"]["class"] == "K8sRunLauncher"
    assert launcher["config"]["k8sRunLauncher"]["envSecrets"] == [{"name": name} for name in expected["env_secrets"]]
    assert (
        launcher["config"]["k8sRunLauncher"]["jobNamespace"]
        == expected["job_namespace"]
        == layers.platform.default("namespace")
    )
    assert launcher["config"]["k8sRunLauncher"]["loadInclusterConfig"] is expected["load_incluster_config"]
    # Run pods outlive any single step; the autoscaler's scale-down must leave them alone.
    run_pod = launcher["config"]["k8sRunLauncher"]["runK8sConfig"]["podTemplateSpecMetadata"]
    assert run_pod["annotations"] == {"cluster-autoscaler.kubernetes.io/safe-to-evict": "false"}
    assert values["global"]["serviceAccountName"] == expected["service_account_name"] == k8s.service_account
    assert values["global"]["dagsterHome"] == expected["dagster_home"] == DAGSTER_HOME_IN_POD
    assert (
        f"{layers.platform.locals['dagster_release']}-instance"
        == expected["instance_config_map"]
        == INSTANCE_CONFIG_MAP
    )
    assert layers.platform.resource("helm_release", "dagster")["name"] == ref("local.dagster_release")

    # The AWS root passes its own defaults, which must be the same figures.
    call = layers.aws.modules["platform"]
    assert default_of(layers.aws, call["max_concurrent_runs"]) == k8s.max_concurrent_runs
    assert default_of(layers.aws, call["gpu_pool_limit"]) == k8s.gpu_pool_limit
    if layers.infra is not None:
        # The pool admits no more GPU steps than the GPU node group can hold at its maximum.
        capacity = layers.infra.default("gpu_max_nodes") * (layers.infra.default("gpus_per_node") // k8s.gpus_per_step)
        assert layers.aws.default("gpu_pool_limit") <= capacity, (layers.aws.default("gpu_pool_limit"), capacity)


def check_user_code_serves_the_image_cmd(layers: Layers) -> None:
    values = rendered(layers)["dagster"]
    (deployment,) = values["dagster-user-deployments"]["deployments"]
    assert values["dagster-user-deployments"]["enabled"] is True
    cmd = dockerfile_cmd()
    assert cmd[:3] == ["dagster", "api", "grpc"]
    # The chart runs `dagster api grpc -h 0.0.0.0 -p <port> <dagsterApiGrpcArgs>`.
    assert deployment["dagsterApiGrpcArgs"] == ["-m", cmd[cmd.index("-m") + 1]]
    assert deployment["port"] == int(cmd[cmd.index("-p") + 1])
    repository, tag = SAMPLE_INPUTS["dagster_image"].rsplit(":", 1)
    for image in (deployment["image"], values["dagsterWebserver"]["image"], values["dagsterDaemon"]["image"]):
        assert (image["repository"], image["tag"]) == (repository, tag), image
    assert deployment["envSecrets"] == [{"name": K8sConfig().env_secret}]
    assert {"name": "FLYWHEEL_PROFILE", "value": "cluster"} in deployment["env"]
    assert deployment["includeConfigInLaunchedRuns"] == {"enabled": True}
    cpu = layers.platform.default("cpu_node_selector")
    for component in (deployment, values["dagsterWebserver"], values["dagsterDaemon"]):
        assert component["nodeSelector"] == cpu, component


def check_external_postgres_over_tls(layers: Layers) -> None:
    values = rendered(layers)["dagster"]
    postgres = values["postgresql"]
    assert postgres["enabled"] is False
    assert (
        postgres["postgresqlHost"],
        postgres["postgresqlDatabase"],
        postgres["postgresqlUsername"],
        postgres["service"]["port"],
    ) == (SAMPLE_ENV["DAGSTER_PG_HOST"], SAMPLE_ENV["DAGSTER_PG_DB"], SAMPLE_ENV["DAGSTER_PG_USER"], 5432)
    assert postgres["postgresqlParams"] == {"sslmode": "require"}
    # The password comes from a Secret the module writes, never from the chart's values.
    assert values["generatePostgresqlPasswordSecret"] is False
    secret = layers.platform.resource("kubernetes_secret_v1", "dagster_postgresql")
    assert values["global"]["postgresqlSecretName"] == layers.platform.locals["dagster_postgres_secret"]
    assert secret["metadata"][0]["name"] == ref("local.dagster_postgres_secret")
    assert secret["data"] == {"postgresql-password": ref("var.db_password")}
    mlflow = rendered(layers)["mlflow"]
    assert mlflow["extraEnvVars"]["PGSSLMODE"] == "require"


def check_device_plugin_on_gpu_nodes_only(layers: Layers) -> None:
    values = rendered(layers)["device_plugin"]
    app = K8sConfig()
    assert values["nodeSelector"] == app.gpu_node_selector
    # None deletes the chart's NFD-label affinity, which no node here satisfies.
    assert "affinity" in values and values["affinity"] is None
    gpu = layers.eks.resource("aws_eks_node_group", "gpu")
    assert app.gpu_node_selector.items() <= gpu["labels"].items()
    for taint in gpu["taint"]:
        assert any(tolerates(t, taint) for t in values["tolerations"]), (taint, values["tolerations"])
    assert values["tolerations"] == app.gpu_tolerations
    assert layers.platform.resource("helm_release", "nvidia_device_plugin")["namespace"] == "kube-system"


def check_services_cluster_ip_only(layers: Layers) -> None:
    values = rendered(layers)
    assert values["dagster"]["dagsterWebserver"]["service"]["type"] == "ClusterIP"
    assert values["mlflow"]["service"]["type"] == "ClusterIP"
    for release in ("dagster", "mlflow"):
        assert not values[release].get("ingress", {}).get("enabled", False), release
    for directory in (PLATFORM_DIR, AWS_DIR):
        for path in directory.glob("*.tf"):
            assert not re.search(r"LoadBalancer|NodePort", path.read_text()), (
                f"{path} exposes a Service outside the cluster"
            )
    assert "service" not in layers.aws.locals["cluster_autoscaler_values"]


def check_mlflow_at_the_tracking_uri(layers: Layers) -> None:
    values = rendered(layers)["mlflow"]
    uri = rendered(layers)["mlflow_tracking_uri"]
    # The chart names its Service fullnameOverride, on service.port.
    assert (
        uri
        == f"http://{values['fullnameOverride']}.{layers.platform.default('namespace')}.svc.cluster.local:{values['service']['port']}"
    )
    assert uri == SAMPLE_ENV["MLFLOW_TRACKING_URI"]
    if layers.infra is not None:
        template = layers.infra.locals["flywheel_env"]["MLFLOW_TRACKING_URI"]
        infra_uri = (
            template.replace("${local.mlflow_service}", layers.infra.locals["mlflow_service"])
            .replace("${var.namespace}", layers.infra.default("namespace"))
            .replace("${local.mlflow_port}", str(layers.infra.locals["mlflow_port"]))
        )
        assert infra_uri == uri
    # MLflow 3 answers only the Host headers it allows: the in-cluster name and port-forwarding.
    from mlflow.server.security_utils import is_allowed_host_header

    allowed = values["extraEnvVars"]["MLFLOW_SERVER_ALLOWED_HOSTS"].split(",")
    host = uri.removeprefix("http://")
    for header in (host, host.split(":")[0], "localhost:5000", "127.0.0.1:5000"):
        assert is_allowed_host_header(allowed, header), (header, allowed)
    assert not is_allowed_host_header(allowed, "attacker.example:5000")

    store = values["backendStore"]
    assert store["postgres"] == {
        "enabled": True,
        "host": SAMPLE_ENV["DAGSTER_PG_HOST"],
        "port": 5432,
        "database": "mlflow",
    }
    assert store["existingDatabaseSecret"]["name"] == layers.platform.locals["mlflow_database_secret"]
    assert store["databaseMigration"] is True
    assert values["artifactRoot"] == {
        "proxiedArtifactStorage": True,
        "defaultArtifactsDestination": SAMPLE_ENV["FLYWHEEL_ARTIFACT_ROOT"] + "/mlflow",
    }
    assert values["serviceAccount"] == {"create": False, "name": layers.platform.default("mlflow_service_account")}
    assert "${kubernetes_job_v1.mlflow_database}" in layers.platform.resource("helm_release", "mlflow")["depends_on"]


def check_rbac_namespaced_and_minimal(layers: Layers) -> None:
    platform = layers.platform
    for kind in (
        "kubernetes_cluster_role_v1",
        "kubernetes_cluster_role_binding_v1",
        "kubernetes_cluster_role",
        "kubernetes_cluster_role_binding",
    ):
        assert not platform.resources(kind), f"{kind}: nothing cluster-wide"
    role = platform.resource("kubernetes_role_v1", "runner")
    assert role["metadata"][0]["namespace"] == ref("kubernetes_namespace_v1.this.metadata[0].name")
    granted = {
        (group, resource, verb)
        for rule in role["rule"]
        for group in rule["api_groups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }
    # the multi-node launch's headless Service
    expected = (
        {("batch", "jobs", v) for v in ("create", "get", "list", "watch", "delete")}
        | {("batch", "jobs/status", "get")}
        | {("", "pods", v) for v in ("create", "get", "list", "watch", "delete")}
        | {("", "pods/log", "get"), ("", "pods/status", "get"), ("", "events", "list")}
        | {("", "services", v) for v in ("create", "delete")}
    )
    assert granted == expected, (granted - expected, expected - granted)
    binding = platform.resource("kubernetes_role_binding_v1", "runner")
    assert binding["role_ref"][0] == {
        "api_group": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": ref("kubernetes_role_v1.runner.metadata[0].name"),
    }
    assert binding["subject"] == [
        {
            "kind": "ServiceAccount",
            "name": ref("kubernetes_service_account_v1.runner.metadata[0].name"),
            "namespace": ref("kubernetes_namespace_v1.this.metadata[0].name"),
        }
    ]
    assert platform.resources("kubernetes_role_v1").keys() == {"runner"}


def check_service_accounts_match_app_and_irsa(layers: Layers) -> None:
    platform, aws = layers.platform, layers.aws
    runner = platform.resource("kubernetes_service_account_v1", "runner")["metadata"][0]
    mlflow = platform.resource("kubernetes_service_account_v1", "mlflow")["metadata"][0]
    assert (runner["name"], runner["annotations"]) == (
        ref("var.runner_service_account"),
        ref("var.runner_service_account_annotations"),
    )
    assert (mlflow["name"], mlflow["annotations"]) == (
        ref("var.mlflow_service_account"),
        ref("var.mlflow_service_account_annotations"),
    )
    assert platform.default("runner_service_account") == K8sConfig().service_account
    assert platform.default("namespace") == K8sConfig().namespace

    call = aws.modules["platform"]
    assert call["runner_service_account_annotations"] == {IRSA: "${local.infra.runner_role_arn}"}
    assert call["mlflow_service_account_annotations"] == {IRSA: "${local.infra.mlflow_role_arn}"}
    assert call["runner_service_account"] == "${local.infra.runner_service_account}"
    assert call["mlflow_service_account"] == "${local.infra.mlflow_service_account}"
    assert call["namespace"] == "${local.infra.namespace}"
    autoscaler_sa = aws.locals["cluster_autoscaler_values"]["rbac"]["serviceAccount"]
    assert autoscaler_sa["name"] == ref("local.autoscaler_service_account")
    assert autoscaler_sa["annotations"] == {IRSA: "${local.infra.autoscaler_role_arn}"}
    assert aws.resource("helm_release", "cluster_autoscaler")["namespace"] == ref("local.autoscaler_namespace")

    if layers.infra is not None:
        # The subjects the infra layer's IRSA roles trust are the accounts deployed here.
        for variable in ("namespace", "runner_service_account", "mlflow_service_account"):
            assert layers.infra.default(variable) == platform.default(variable), variable
        autoscaler_role = layers.infra.modules["autoscaler_role"]
        assert (
            (autoscaler_role["namespace"], autoscaler_role["service_account"])
            == (aws.locals["autoscaler_namespace"], aws.locals["autoscaler_service_account"])
            == ("kube-system", "cluster-autoscaler")
        )
        for output in (
            "runner_role_arn",
            "mlflow_role_arn",
            "autoscaler_role_arn",
            "runner_service_account",
            "mlflow_service_account",
        ):
            assert output in layers.infra.outputs, output


def check_autoscaler_scales_gpu_from_zero(layers: Layers) -> None:
    aws = layers.aws
    values = aws.locals["cluster_autoscaler_values"]
    assert values["cloudProvider"] == "aws"
    assert values["awsRegion"] == "${local.infra.region}"
    assert values["autoDiscovery"] == {"clusterName": "${data.aws_eks_cluster.this.name}"}
    assert values["image"] == {"tag": ref("local.cluster_autoscaler_image_tag")}
    assert values["nodeSelector"] == "${module.platform.cpu_node_selector}"
    assert layers.platform.default("cpu_node_selector") == layers.eks.resource("aws_eks_node_group", "cpu")["labels"]
    args = values["extraArgs"]
    minutes = re.fullmatch(r"(\d+)m", aws.default("scale_down_unneeded_time"))
    assert minutes and int(minutes.group(1)) < 10, "idle GPU nodes should go sooner than the autoscaler's 10m default"
    assert args["scale-down-unneeded-time"] == ref("var.scale_down_unneeded_time")
    assert args["scale-down-delay-after-add"] == ref("var.scale_down_unneeded_time")
    assert args["ignore-daemonsets-utilization"] is True
    # The eks module tags both groups for auto-discovery under this cluster's name.
    assert set(layers.eks.locals["autoscaler_discovery_tags"]) == {
        "k8s.io/cluster-autoscaler/enabled",
        "k8s.io/cluster-autoscaler/${var.cluster_name}",
    }
    # An image for the infra layer's Kubernetes version, of the same minor.
    tags = aws.default("cluster_autoscaler_image_tags")
    assert (
        aws.locals["cluster_autoscaler_image_tag"]
        == "${lookup(var.cluster_autoscaler_image_tags, local.kubernetes_minor, null)}"
    )
    for minor, tag in tags.items():
        assert re.fullmatch(rf"v{re.escape(minor)}\.\d+", tag), (minor, tag)
    if layers.infra is not None:
        assert layers.infra.default("kubernetes_version") in tags, (
            "no autoscaler image for the infra layer's default Kubernetes version"
        )


def check_providers_pinned_and_configured(layers: Layers) -> None:
    (settings,) = layers.platform.blocks["terraform"]
    (providers,) = settings["required_providers"]
    assert providers == {
        "kubernetes": {"source": "hashicorp/kubernetes", "version": "~> 3.0"},
        "helm": {"source": "hashicorp/helm", "version": "~> 3.0"},
    }
    assert "provider" not in layers.platform.blocks, "a module that configures providers cannot be reused or counted"

    (settings,) = layers.aws.blocks["terraform"]
    (providers,) = settings["required_providers"]
    assert providers["aws"] == {"source": "hashicorp/aws", "version": "~> 5.0"}
    assert providers["kubernetes"] == {"source": "hashicorp/kubernetes", "version": "~> 3.0"}
    assert providers["helm"] == {"source": "hashicorp/helm", "version": "~> 3.0"}
    configured = {name: body for entry in layers.aws.blocks["provider"] for name, body in entry.items()}
    assert configured["aws"]["region"] == "${local.infra.region}"
    # helm 3.x syntax: `kubernetes` and its `exec` are attributes (a block here is a 2.x config).
    helm = configured["helm"]["kubernetes"]
    assert isinstance(helm, dict) and helm["exec"] == ref("local.cluster_exec"), helm
    kubernetes = configured["kubernetes"]
    for target in (helm, kubernetes):
        assert target["host"] == "${data.aws_eks_cluster.this.endpoint}"
        assert (
            target["cluster_ca_certificate"]
            == "${base64decode(data.aws_eks_cluster.this.certificate_authority[0].data)}"
        )
    assert isinstance(kubernetes["exec"], list) and kubernetes["exec"][0]["command"] == "${local.cluster_exec.command}"
    exec_ = layers.aws.locals["cluster_exec"]
    assert exec_["command"] == "aws" and exec_["args"][:2] == ["eks", "get-token"]

    state = layers.aws.data("terraform_remote_state")["infra"]
    assert (state["backend"], state["config"]) == (ref("var.infra_state_backend"), ref("var.infra_state_config"))
    assert (layers.aws.default("infra_state_backend"), layers.aws.default("infra_state_config")) == (
        "local",
        {"path": "../infra/terraform.tfstate"},
    )


def check_documented(layers: Layers) -> None:
    for module in (layers.platform, layers.aws):
        where = module.path.relative_to(TERRAFORM_DIR)
        assert module.variables and module.outputs
        for name, body in module.variables.items():
            assert isinstance(body.get("description"), str) and body["description"].strip(), (
                f"{where}: variable {name} has no description"
            )
            assert body.get("type"), f"{where}: variable {name} has no type"
        for name, body in module.outputs.items():
            assert isinstance(body.get("description"), str) and body["description"].strip(), (
                f"{where}: output {name} has no description"
            )
    outputs = layers.aws.outputs
    for name in (
        "namespace",
        "dagster_webserver_service",
        "dagster_port_forward_command",
        "mlflow_tracking_uri",
        "mlflow_port_forward_command",
    ):
        assert name in outputs, name


def check_password_only_in_secrets(layers: Layers) -> None:
    assert layers.platform.variables["db_password"].get("sensitive") is True
    secret_version = layers.aws.data("aws_secretsmanager_secret_version")["db_master"]
    assert secret_version["secret_id"] == "${local.infra.db_master_user_secret_arn}"
    assert (
        layers.aws.locals["db_master"]
        == "${jsondecode(data.aws_secretsmanager_secret_version.db_master.secret_string)}"
    )
    call = layers.aws.modules["platform"]
    assert (call["db_username"], call["db_password"]) == ("${local.db_master.username}", "${local.db_master.password}")
    assert call["credentials_revision"] == "${data.aws_secretsmanager_secret_version.db_master.version_id}"
    # Where the password is used: three Secrets, nowhere else in the module.
    users = {
        name
        for name, body in layers.platform.resources("kubernetes_secret_v1").items()
        if references(json.dumps(body), "var.db_password")
    }
    users |= {
        name for name, value in layers.platform.locals.items() if references(json.dumps(value), "var.db_password")
    }
    assert users == {"dagster_postgresql", "mlflow_database", "flywheel_env_secret"}, users
    if layers.rendered is not None:
        for document in ("dagster_values_yaml", "mlflow_values_yaml"):
            assert SAMPLE_PASSWORD not in json.dumps(layers.rendered[document]), (
                f"the password is in the {document} Helm values"
            )
        assert SAMPLE_PASSWORD not in json.dumps(layers.rendered["dagster"]) + json.dumps(layers.rendered["mlflow"])


def check_sandbox_token_only_in_its_secrets(layers: Layers) -> None:
    """The sandbox service's token: generated by the AWS root, given to the service through its own
    Secret (the name and key pipelines/k8s_manifests.py renders the Deployment with) and to the
    clients through flywheel-env under the profile's sandbox.token_env; nowhere else."""
    from pipelines.k8s_manifests import SANDBOX_TOKEN_KEY, SANDBOX_TOKEN_SECRET

    platform = layers.platform
    assert platform.variables["sandbox_token"].get("sensitive") is True
    secret = platform.resource("kubernetes_secret_v1", "sandbox_token")
    assert secret["metadata"][0]["name"] == ref("local.sandbox_token_secret")
    assert (platform.locals["sandbox_token_secret"], platform.locals["sandbox_token_key"]) == (
        SANDBOX_TOKEN_SECRET,
        SANDBOX_TOKEN_KEY,
    )
    assert secret["data"] == {"${(local.sandbox_token_key)}": ref("var.sandbox_token")}
    users = {
        name
        for name, body in platform.resources("kubernetes_secret_v1").items()
        if references(json.dumps(body), "var.sandbox_token")
    }
    users |= {name for name, value in platform.locals.items() if references(json.dumps(value), "var.sandbox_token")}
    assert users == {"sandbox_token", "flywheel_env_secret"}, users
    assert "FLYWHEEL_SANDBOX_TOKEN = var.sandbox_token" in platform.locals["flywheel_env_secret"].replace('"', "")
    assert sample_profile().sandbox.token_env == "FLYWHEEL_SANDBOX_TOKEN"

    generated = layers.aws.resource("random_password", "sandbox_token")
    assert generated["length"] >= 32 and generated["special"] is False
    assert layers.aws.modules["platform"]["sandbox_token"] == ref("random_password.sandbox_token.result")
    if layers.rendered is not None:
        for document in ("dagster_values_yaml", "mlflow_values_yaml"):
            assert SAMPLE_TOKEN not in json.dumps(layers.rendered[document]), (
                f"the sandbox token is in the {document} Helm values"
            )
        assert SAMPLE_TOKEN not in json.dumps(layers.rendered["dagster"]) + json.dumps(layers.rendered["mlflow"])


CHECKS: dict[str, Callable[[Layers], None]] = {
    "charts_pinned": check_charts_pinned,
    "dagster_chart_is_the_app_dagster": check_dagster_chart_is_the_app_dagster,
    "secret_holds_the_app_env": check_secret_holds_the_app_env,
    "instance_matches_pipelines_instance": check_instance_matches_pipelines_instance,
    "user_code_serves_the_image_cmd": check_user_code_serves_the_image_cmd,
    "external_postgres_over_tls": check_external_postgres_over_tls,
    "device_plugin_on_gpu_nodes_only": check_device_plugin_on_gpu_nodes_only,
    "services_cluster_ip_only": check_services_cluster_ip_only,
    "mlflow_at_the_tracking_uri": check_mlflow_at_the_tracking_uri,
    "rbac_namespaced_and_minimal": check_rbac_namespaced_and_minimal,
    "service_accounts_match_app_and_irsa": check_service_accounts_match_app_and_irsa,
    "autoscaler_scales_gpu_from_zero": check_autoscaler_scales_gpu_from_zero,
    "providers_pinned_and_configured": check_providers_pinned_and_configured,
    "documented": check_documented,
    "password_only_in_secrets": check_password_only_in_secrets,
    "sandbox_token_only_in_its_secrets": check_sandbox_token_only_in_its_secrets,
}


@pytest.mark.parametrize("check", CHECKS)
def test_properties(layers: Layers, check: str) -> None:
    CHECKS[check](layers)


# --- Each check must be able to fail ---------------------------------------------------------------


def _body(module: Module, kind: str, type_: str, name: str) -> dict:
    """The parsed block itself (Module's accessors return merged copies)."""
    for entry in module.blocks.get(kind, []):
        if name in entry.get(type_, {}):
            return entry[type_][name]
    raise KeyError(f"{kind} {type_}.{name}")


def _variable(module: Module, name: str) -> dict:
    return next(entry[name] for entry in module.blocks["variable"] if name in entry)


def _locals(module: Module, name: str) -> dict:
    return next(entry for entry in module.blocks["locals"] if name in entry)


def _rendered(layers: Layers, key: str) -> Any:
    return rendered(layers)[key]


def _dagster(layers: Layers) -> dict:
    return rendered(layers)["dagster"]


def _mlflow(layers: Layers) -> dict:
    return rendered(layers)["mlflow"]


def _plugin(layers: Layers) -> dict:
    return rendered(layers)["device_plugin"]


def _deployment(layers: Layers) -> dict:
    return _dagster(layers)["dagster-user-deployments"]["deployments"][0]


def _rules(layers: Layers) -> list[dict]:
    return _body(layers.platform, "resource", "kubernetes_role_v1", "runner")["rule"]


def _call(module: Module, name: str) -> dict:
    return next(entry[name] for entry in module.blocks["module"] if name in entry)


def _config(module: Module, name: str) -> dict:
    return next(entry[name] for entry in module.blocks["provider"] if name in entry)


MUTATIONS: list[tuple[str, str, Callable[[Layers], Any]]] = [
    (
        "charts_pinned",
        "range default",
        lambda layers: _variable(layers.platform, "mlflow_chart_version").update(default="~> 1.11"),
    ),
    (
        "charts_pinned",
        "literal range",
        lambda layers: _body(layers.aws, "resource", "helm_release", "cluster_autoscaler").update(version=">= 9.0"),
    ),
    (
        "charts_pinned",
        "validation dropped",
        lambda layers: _variable(layers.platform, "nvidia_device_plugin_chart_version").pop("validation"),
    ),
    (
        "charts_pinned",
        "set blocks",
        lambda layers: _body(layers.platform, "resource", "helm_release", "dagster").update(
            set=[{"name": "x", "value": "y"}]
        ),
    ),
    (
        "dagster_chart_is_the_app_dagster",
        "chart behind the pin",
        lambda layers: _variable(layers.platform, "dagster_chart_version").update(default="1.13.26"),
    ),
    (
        "secret_holds_the_app_env",
        "key missing from the Secret",
        lambda layers: _rendered(layers, "secret_keys").remove("FLYWHEEL_SANDBOX_IMAGE"),
    ),
    (
        "secret_holds_the_app_env",
        "requirement dropped",
        lambda layers: _locals(layers.platform, "required_env_keys")["required_env_keys"].remove("MLFLOW_TRACKING_URI"),
    ),
    (
        "secret_holds_the_app_env",
        "another Secret",
        lambda layers: _locals(layers.platform, "env_secret_name").update(env_secret_name="flywheel"),
    ),
    (
        "instance_matches_pipelines_instance",
        "more runs",
        lambda layers: _dagster(layers)["concurrency"]["runs"].update(maxConcurrentRuns=8),
    ),
    (
        "instance_matches_pipelines_instance",
        "pool limit",
        lambda layers: _dagster(layers)["concurrency"]["pools"].update(defaultLimit=1),
    ),
    (
        "instance_matches_pipelines_instance",
        "run coordinator limit too",
        lambda layers: _dagster(layers)["dagsterDaemon"]["runCoordinator"]["config"]["queuedRunCoordinator"].update(
            maxConcurrentRuns=4
        ),
    ),
    (
        "instance_matches_pipelines_instance",
        "no env secret",
        lambda layers: _dagster(layers)["runLauncher"]["config"]["k8sRunLauncher"].update(envSecrets=[]),
    ),
    (
        "instance_matches_pipelines_instance",
        "retries on op failure",
        lambda layers: _dagster(layers)["additionalInstanceConfig"]["run_retries"].update(
            retry_on_asset_or_op_failure=True
        ),
    ),
    (
        "instance_matches_pipelines_instance",
        "chart's service account",
        lambda layers: _dagster(layers)["global"].update(serviceAccountName="dagster"),
    ),
    (
        "instance_matches_pipelines_instance",
        "root default differs",
        lambda layers: _variable(layers.aws, "gpu_pool_limit").update(default=8),
    ),
    (
        "instance_matches_pipelines_instance",
        "pool larger than the node group",
        lambda layers: _variable(infra(layers), "gpu_max_nodes").update(default=2),
    ),
    (
        "user_code_serves_the_image_cmd",
        "file instead of module",
        lambda layers: _deployment(layers).update(dagsterApiGrpcArgs=["-f", "repo.py"]),
    ),
    ("user_code_serves_the_image_cmd", "chart's port", lambda layers: _deployment(layers).update(port=3030)),
    (
        "user_code_serves_the_image_cmd",
        "daemon on any node",
        lambda layers: _dagster(layers)["dagsterDaemon"].update(nodeSelector={}),
    ),
    (
        "external_postgres_over_tls",
        "bundled postgres",
        lambda layers: _dagster(layers)["postgresql"].update(enabled=True),
    ),
    (
        "external_postgres_over_tls",
        "TLS preferred only",
        lambda layers: _dagster(layers)["postgresql"].update(postgresqlParams={"sslmode": "prefer"}),
    ),
    (
        "external_postgres_over_tls",
        "chart-generated password",
        lambda layers: _dagster(layers).update(generatePostgresqlPasswordSecret=True),
    ),
    ("device_plugin_on_gpu_nodes_only", "every node", lambda layers: _plugin(layers).update(nodeSelector={})),
    (
        "device_plugin_on_gpu_nodes_only",
        "taint not tolerated",
        lambda layers: _plugin(layers).update(tolerations=[{"key": "CriticalAddonsOnly", "operator": "Exists"}]),
    ),
    ("device_plugin_on_gpu_nodes_only", "NFD affinity kept", lambda layers: _plugin(layers).pop("affinity")),
    (
        "services_cluster_ip_only",
        "webserver load balancer",
        lambda layers: _dagster(layers)["dagsterWebserver"]["service"].update(type="LoadBalancer"),
    ),
    ("services_cluster_ip_only", "mlflow node port", lambda layers: _mlflow(layers)["service"].update(type="NodePort")),
    ("services_cluster_ip_only", "ingress", lambda layers: _mlflow(layers).update(ingress={"enabled": True})),
    (
        "mlflow_at_the_tracking_uri",
        "service renamed",
        lambda layers: _mlflow(layers).update(fullnameOverride="mlflow-server"),
    ),
    ("mlflow_at_the_tracking_uri", "port 80", lambda layers: _mlflow(layers)["service"].update(port=80)),
    (
        "mlflow_at_the_tracking_uri",
        "service name not allowed",
        lambda layers: _mlflow(layers)["extraEnvVars"].update(MLFLOW_SERVER_ALLOWED_HOSTS="localhost,localhost:*"),
    ),
    (
        "mlflow_at_the_tracking_uri",
        "artifacts at the root",
        lambda layers: _mlflow(layers)["artifactRoot"].update(defaultArtifactsDestination="s3://x"),
    ),
    ("rbac_namespaced_and_minimal", "wildcard verb", lambda layers: _rules(layers)[0]["verbs"].append("*")),
    ("rbac_namespaced_and_minimal", "secrets", lambda layers: _rules(layers)[2]["resources"].append("secrets")),
    (
        "rbac_namespaced_and_minimal",
        "cluster role",
        lambda layers: layers.platform.blocks["resource"].append({"kubernetes_cluster_role_v1": {"x": {}}}),
    ),
    (
        "rbac_namespaced_and_minimal",
        "bound to default",
        lambda layers: _body(layers.platform, "resource", "kubernetes_role_binding_v1", "runner")["subject"][0].update(
            name="default"
        ),
    ),
    (
        "service_accounts_match_app_and_irsa",
        "runner renamed",
        lambda layers: _variable(layers.platform, "runner_service_account").update(default="dagster"),
    ),
    (
        "service_accounts_match_app_and_irsa",
        "annotation key",
        lambda layers: _call(layers.aws, "platform").update(runner_service_account_annotations={"role": "x"}),
    ),
    (
        "service_accounts_match_app_and_irsa",
        "autoscaler elsewhere",  # caught by comparing with the infra layer's role
        lambda layers: (
            infra(layers) and _locals(layers.aws, "autoscaler_namespace").update(autoscaler_namespace="default")
        ),
    ),
    (
        "autoscaler_scales_gpu_from_zero",
        "slow scale-down",
        lambda layers: _variable(layers.aws, "scale_down_unneeded_time").update(default="30m"),
    ),
    (
        "autoscaler_scales_gpu_from_zero",
        "no image for the infra default",
        lambda layers: _variable(layers.aws, "cluster_autoscaler_image_tags").update(
            default={"1.0": "v1.0.0"} if infra(layers) else {}
        ),
    ),
    (
        "autoscaler_scales_gpu_from_zero",
        "image of another minor",
        lambda layers: _variable(layers.aws, "cluster_autoscaler_image_tags").update(default={"1.35": "v1.34.2"}),
    ),
    (
        "autoscaler_scales_gpu_from_zero",
        "on gpu nodes",
        lambda layers: _locals(layers.aws, "cluster_autoscaler_values")["cluster_autoscaler_values"].update(
            nodeSelector={}
        ),
    ),
    (
        "providers_pinned_and_configured",
        "module configures a provider",
        lambda layers: layers.platform.blocks.setdefault("provider", [{"helm": {}}]),
    ),
    (
        "providers_pinned_and_configured",
        "helm unpinned",
        lambda layers: layers.platform.blocks["terraform"][0]["required_providers"][0]["helm"].update(version=">= 2"),
    ),
    (
        "providers_pinned_and_configured",
        "helm 2.x block syntax",
        lambda layers: _config(layers.aws, "helm").update(kubernetes=[{"host": "x"}]),
    ),
    (
        "documented",
        "description dropped",
        lambda layers: _variable(layers.platform, "gpu_pool_limit").pop("description"),
    ),
    (
        "documented",
        "output undocumented",
        lambda layers: next(e for e in layers.aws.blocks["output"] if "namespace" in e)["namespace"].pop("description"),
    ),
    (
        "password_only_in_secrets",
        "not sensitive",
        lambda layers: _variable(layers.platform, "db_password").pop("sensitive"),
    ),
    (
        "password_only_in_secrets",
        "password in chart values",
        lambda layers: _dagster(layers)["postgresql"].update(postgresqlPassword=SAMPLE_PASSWORD),
    ),
    (
        "password_only_in_secrets",
        "hard-coded password",
        lambda layers: _locals(layers.aws, "db_master").update(db_master='${{username = "a", password = "b"}}'),
    ),
    (
        "sandbox_token_only_in_its_secrets",
        "not sensitive",
        lambda layers: _variable(layers.platform, "sandbox_token").pop("sensitive"),
    ),
    (
        "sandbox_token_only_in_its_secrets",
        "secret renamed",
        lambda layers: _locals(layers.platform, "sandbox_token_secret").update(sandbox_token_secret="sandbox-token"),
    ),
    (
        "sandbox_token_only_in_its_secrets",
        "token in chart values",
        lambda layers: _dagster(layers)["dagsterDaemon"].update(env={"FLYWHEEL_SANDBOX_TOKEN": SAMPLE_TOKEN}),
    ),
    (
        "sandbox_token_only_in_its_secrets",
        "short token",
        lambda layers: _body(layers.aws, "resource", "random_password", "sandbox_token").update(length=12),
    ),
    (
        "sandbox_token_only_in_its_secrets",
        "literal token",
        lambda layers: _call(layers.aws, "platform").update(sandbox_token="0123456789abcdef0123456789abcdef"),
    ),
]


@pytest.mark.parametrize(
    "check,mutate", [(c, f) for c, _, f in MUTATIONS], ids=[f"{c}-{d.replace(' ', '_')}" for c, d, _ in MUTATIONS]
)
def test_check_catches(layers: Layers, check: str, mutate: Callable[[Layers], Any]) -> None:
    broken = copy.deepcopy(layers)
    mutate(broken)
    with pytest.raises(AssertionError):
        CHECKS[check](broken)


def test_every_check_has_a_mutation() -> None:
    assert set(CHECKS) == {c for c, _, _ in MUTATIONS}


# --- The MLflow database job's script ----------------------------------------------------------------


FAKE_PSQL = """#!/bin/sh
# Stands in for psql: answers the lookup from FAKE_EXISTING, records every CREATE, fails when the
# server is "down".
echo "$@" >> "$FAKE_LOG"
[ -n "$FAKE_DOWN" ] && { echo "psql: could not connect" >&2; exit 2; }
case "$*" in
  *"SELECT 1 FROM pg_database WHERE datname = '$MLFLOW_DATABASE'"*) [ "$FAKE_EXISTING" = "$MLFLOW_DATABASE" ] && echo 1; exit 0 ;;
  *'CREATE DATABASE "'"$MLFLOW_DATABASE"'"'*) exit 0 ;;
esac
echo "unexpected psql call: $*" >&2; exit 3
"""


@pytest.mark.parametrize(
    "existing,down,creates,succeeds",
    [("", "", True, True), ("mlflow", "", False, True), ("", "1", True, False)],
    ids=["missing-is-created", "existing-is-kept", "unreachable-fails"],
)
def test_mlflow_database_job_creates_only_when_missing(tmp_path, existing, down, creates, succeeds):
    platform = load(PLATFORM_DIR)
    script = unescape(platform.locals["create_mlflow_database"])
    (tmp_path / "psql").write_text(FAKE_PSQL)
    (tmp_path / "psql").chmod(0o755)
    log = tmp_path / "calls.log"
    env = {
        "PATH": f"{tmp_path}:{os.environ['PATH']}",
        "MLFLOW_DATABASE": "mlflow",
        "FAKE_EXISTING": existing,
        "FAKE_DOWN": down,
        "FAKE_LOG": str(log),
    }
    done = subprocess.run(["/bin/sh", "-c", script], env=env, capture_output=True, text=True, timeout=30)
    assert (done.returncode == 0) == succeeds, done.stderr
    calls = log.read_text().splitlines()
    assert any("CREATE DATABASE" in call for call in calls) == creates, calls
    assert all("ON_ERROR_STOP=1" in call for call in calls)

    job = platform.resource("kubernetes_job_v1", "mlflow_database")
    assert job["wait_for_completion"] is True
    (container,) = job["spec"][0]["template"][0]["spec"][0]["container"]
    assert container["command"] == ["/bin/sh", "-c", ref("local.create_mlflow_database")]
    assert container["image"] == ref("var.postgres_client_image")
    tag = platform.default("postgres_client_image").rsplit(":", 1)[1]
    assert re.match(r"^\d+\.\d+", tag) and "latest" not in tag, tag
    env_vars = {e["name"]: e for e in container["env"]}
    assert env_vars["PGSSLMODE"]["value"] == "require"
    assert env_vars["MLFLOW_DATABASE"]["value"] == ref("var.mlflow_database_name")
    for name, key in (("PGUSER", "username"), ("PGPASSWORD", "password")):
        assert env_vars[name]["value_from"][0]["secret_key_ref"][0]["key"] == key
    # The database it creates is the one MLflow uses.
    assert load(PLATFORM_DIR).locals["mlflow_values"]["backendStore"]["postgres"]["database"] == ref(
        "var.mlflow_database_name"
    )


# --- Variable validations and the Secret's preconditions (terraform console, offline) ------------------


# (directory key, variable, value, accepted)
VALIDATION_CASES = [
    ("platform", "namespace", "flywheel-dev", True),
    ("platform", "namespace", "Flywheel", False),
    ("platform", "env", SAMPLE_ENV, True),
    ("platform", "env", {**SAMPLE_ENV, "DAGSTER_PG_PASSWORD": "x"}, False),
    ("platform", "env", {"flywheel_profile": "cluster"}, False),
    ("platform", "dagster_image", SAMPLE_ENV["FLYWHEEL_IMAGE"], True),
    ("platform", "dagster_image", "localhost:5000/flywheel-dagster:v1.2", True),
    ("platform", "dagster_image", f"{REGISTRY}/flywheel-dagster:latest", False),
    ("platform", "dagster_image", f"{REGISTRY}/flywheel-dagster", False),
    ("platform", "dagster_image", f"{REGISTRY}/flywheel-dagster@sha256:{'a' * 64}", False),
    ("platform", "postgres_client_image", "postgres:16.4", False),
    ("platform", "postgres_client_image", "public.ecr.aws/docker/library/postgres:latest", False),
    ("platform", "postgres_client_image", "public.ecr.aws/docker/library/postgres:17.2-bookworm", True),
    ("platform", "artifact_root", "gs://bucket/flywheel", True),
    ("platform", "artifact_root", "s3://bucket/flywheel/", False),
    ("platform", "artifact_root", "/data/flywheel", False),
    ("platform", "db_host", "db.internal", True),
    ("platform", "db_host", "db.internal:5432", False),
    ("platform", "db_port", 0, False),
    ("platform", "db_port", 5432.5, False),
    ("platform", "db_username", "flywheel admin", False),
    ("platform", "db_password", "short", False),
    ("platform", "db_password", SAMPLE_PASSWORD, True),
    ("platform", "sandbox_token", SAMPLE_TOKEN, True),
    ("platform", "sandbox_token", "short-token-0123", False),
    ("platform", "sandbox_token", "a token with spaces 0123456789abcdef", False),
    ("platform", "env", {**SAMPLE_ENV, "FLYWHEEL_SANDBOX_TOKEN": "x"}, False),
    ("platform", "dagster_database_name", "dagster", True),
    ("platform", "mlflow_database_name", "ml-flow", False),
    ("platform", "mlflow_database_name", "mlflow'; DROP DATABASE dagster; --", False),
    ("platform", "runner_service_account", "Flywheel_Runner", False),
    ("platform", "cpu_node_selector", {}, False),
    ("platform", "gpu_tolerations", [], False),
    ("platform", "gpu_tolerations", [{"key": "nvidia.com/gpu", "operator": "Maybe", "effect": "NoSchedule"}], False),
    (
        "platform",
        "gpu_tolerations",
        [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule", "seconds": "5"}],
        False,
    ),
    (
        "platform",
        "gpu_tolerations",
        [{"key": "nvidia.com/gpu", "operator": "Equal", "value": "present", "effect": "NoSchedule"}],
        True,
    ),
    ("platform", "max_concurrent_runs", 0, False),
    ("platform", "max_concurrent_runs", 1.5, False),
    ("platform", "gpu_pool_limit", 0, False),
    ("platform", "dagster_chart_version", "~> 1.13", False),
    ("platform", "mlflow_chart_version", "1.11", False),
    ("platform", "nvidia_device_plugin_chart_version", "latest", False),
    ("aws", "infra_state_backend", "s3", True),
    ("aws", "infra_state_backend", "s4", False),
    ("aws", "infra_state_config", {"bucket": "state", "key": "infra.tfstate", "region": "us-east-1"}, True),
    ("aws", "infra_state_config", {}, False),
    ("aws", "max_concurrent_runs", 0, False),
    ("aws", "gpu_pool_limit", 2.5, False),
    ("aws", "cluster_autoscaler_chart_version", "9.x", False),
    ("aws", "cluster_autoscaler_image_tags", {"1.36": "v1.36.1"}, True),
    ("aws", "cluster_autoscaler_image_tags", {"1.35": "v1.34.2"}, False),
    ("aws", "cluster_autoscaler_image_tags", {"1.35": "1.35.0"}, False),
    ("aws", "cluster_autoscaler_image_tags", {}, False),
    ("aws", "scale_down_unneeded_time", "300s", True),
    ("aws", "scale_down_unneeded_time", "5 minutes", False),
]


@pytest.mark.skipif(not HAVE_TERRAFORM, reason="the terraform CLI is not installed")
def test_validations_accept_the_defaults_and_reject_bad_values(tmp_path):
    checks = Validations({"platform": load(PLATFORM_DIR), "aws": load(AWS_DIR)})
    checks.cases(VALIDATION_CASES)
    checks.defaults()
    # The sample inputs are valid, or the rendering below would say nothing.
    for variable, value in SAMPLE_INPUTS.items():
        if checks.modules["platform"].variables[variable].get("validation"):
            checks.expect("platform", variable, value, True, label=f"sample {variable}")
    checks.check(tmp_path)


# env variants -> index of the precondition that must fail (None: all pass)
PRECONDITION_CASES = {
    "sample": ({}, None),
    "missing-key": ({"FLYWHEEL_SANDBOX_IMAGE": None}, 0),
    "other-profile": ({"FLYWHEEL_PROFILE": "gpu"}, 1),
    "other-namespace": ({"MLFLOW_TRACKING_URI": "http://mlflow.other.svc.cluster.local:5000"}, 2),
    "other-user": ({"DAGSTER_PG_USER": "someone_else"}, 3),
    "other-image": ({"FLYWHEEL_IMAGE": f"{REGISTRY}/flywheel-dagster:fedcba987654"}, 4),
}


@pytest.mark.skipif(not HAVE_TERRAFORM, reason="the terraform CLI is not installed")
@pytest.mark.parametrize("case", PRECONDITION_CASES)
def test_env_secret_preconditions_catch_a_mismatched_env(tmp_path, case):
    platform = load(PLATFORM_DIR)
    changes, failing = PRECONDITION_CASES[case]
    env = {k: v for k, v in {**SAMPLE_ENV, **changes}.items() if v is not None}
    preconditions = platform.resource("kubernetes_secret_v1", "flywheel_env")["lifecycle"][0]["precondition"]
    results = scratch_eval(
        platform, {**SAMPLE_INPUTS, "env": env}, [p["condition"][2:-1] for p in preconditions], tmp_path / "scratch"
    )
    assert results == [i != failing for i in range(len(preconditions))], results


# --- Terraform itself ----------------------------------------------------------------------------------


@pytest.mark.skipif(not HAVE_TERRAFORM, reason="the terraform CLI is not installed")
@pytest.mark.parametrize("directory", [PLATFORM_DIR, AWS_DIR], ids=["module", "aws-root"])
def test_terraform_validate(directory, tmp_path):
    done = validate(directory, tmp_path)  # skips, naming them, when kubernetes/helm are not mirrored
    assert done.returncode == 0, done.stdout + done.stderr
    assert json.loads(done.stdout)["valid"] is True, done.stdout


@pytest.mark.skipif(not HAVE_TERRAFORM, reason="the terraform CLI is not installed")
def test_terraform_files_are_formatted():
    done = subprocess.run(
        ["terraform", "fmt", "-check", "-recursive", "-diff", str(PLATFORM_DIR), str(AWS_DIR)],
        env=terraform_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, (
        f"run `terraform fmt -recursive {TERRAFORM_DIR.relative_to(ROOT)}`:\n{done.stdout}{done.stderr}"
    )
