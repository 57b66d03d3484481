"""The AWS environment (infra/terraform/environments/aws/infra): the modules composed into one
environment whose outputs the `cluster` profile consumes, checked offline.

Three layers, cheapest first:
* `check_*` functions over the python-hcl2 parse of the environment, the modules, the backend and
  tfvars examples (wiring, least privilege, the flywheel_env contract with the app). As in
  tests/infra/test_terraform_data.py, `test_check_catches` breaks a parsed copy one way at a time and
  requires the matching check to fail, so no check passes vacuously.
* `terraform validate` of the environment and of every module, from the local provider mirror,
  and of scratch copies with a broken reference, which must fail.
* `terraform test` of the environment (tests/plan.tftest.hcl): a full plan against a mocked AWS
  provider, which finds what validate cannot (for_each keys unknown until apply, checks).
Variable validations run through `terraform console`, as in tests/infra/test_terraform_cluster.py.
"""

from __future__ import annotations

import copy
import json
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import hcl2
import pytest

from configs.schema import K8sConfig
from tests import terraform_support
from tests.terraform_support import (
    ENVIRONMENTS_DIR,
    MODULES_DIR,
    PLAIN,
    ROOT,
    TERRAFORM_DIR,
    Module,
    Validations,
    load,
    needs_terraform,
    one,
    ref,
    references,
    required_providers,
    terraform_env,
    validate,
)

ENV_DIR = ENVIRONMENTS_DIR / "aws" / "infra"
MODULE_DIRS = sorted(path for path in MODULES_DIR.iterdir() if path.is_dir() and any(path.glob("*.tf")))
# This layer may use only the AWS provider; modules that need kubernetes or helm are the platform
# layer's (environments/aws/platform), which runs once this layer's cluster exists.
AWS_MODULE_DIRS = [path for path in MODULE_DIRS if set(required_providers(path)) == {"aws"}]

# The contract with the app: configs/cluster.yaml reads these, pipelines/instance.py the DAGSTER_PG_*.
FLYWHEEL_ENV_KEYS = {
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
# What the platform layer reads through terraform_remote_state.
REQUIRED_OUTPUTS = {
    "region",
    "cluster_name",
    "cluster_endpoint",
    "cluster_certificate_authority_data",
    "artifact_root",
    "bucket_name",
    "db_endpoint",
    "db_port",
    "db_master_user_secret_arn",
    "dagster_database_name",
    "mlflow_database_name",
    "image_repositories",
    "runner_role_arn",
    "mlflow_role_arn",
    "autoscaler_role_arn",
    "db_secret_reader_role_arn",
    "namespace",
    "flywheel_env",
}
# The only actions the cluster autoscaler's role may use to change capacity.
SCALING_ACTIONS = {"autoscaling:SetDesiredCapacity", "autoscaling:TerminateInstanceInAutoScalingGroup"}
READ_ONLY_VERB = re.compile(r"^[a-z0-9-]+:(Describe|Get|List)[A-Za-z]+$")


@dataclass
class Tree:
    """Everything the checks read, parsed; copies, so mutations never reach the cached parse."""

    env: Module
    modules: dict[str, Module]
    backend: dict
    tfvars: dict


def parse_tree() -> Tree:
    with (ENV_DIR / "backend.tf.example").open() as f:
        backend = hcl2.load(f, serialization_options=PLAIN)
    with (ENV_DIR / "terraform.tfvars.example").open() as f:
        tfvars = hcl2.load(f, serialization_options=PLAIN)
    return Tree(
        env=copy.deepcopy(load(ENV_DIR)),
        modules={path.name: copy.deepcopy(load(path)) for path in MODULE_DIRS},
        backend=backend,
        tfvars=tfvars,
    )


@pytest.fixture(scope="module")
def tree() -> Tree:
    return parse_tree()


# -- raw blocks (what a mutation edits; Module's merged views are rebuilt from these) ----------------


def raw(parsed: Module, kind: str, *labels: str) -> dict:
    """The body of one labelled block as parsed, e.g. raw(env, "module", "eks")."""
    for entry in parsed.blocks.get(kind, []):
        node = entry
        for label in labels:
            node = node.get(label) if isinstance(node, dict) else None
        if isinstance(node, dict):
            return node
    raise KeyError(f"{parsed.name}: no {kind} {'.'.join(labels)}")


def raw_locals(parsed: Module, name: str) -> dict:
    return next(entry for entry in parsed.blocks["locals"] if name in entry)


def statements(document: dict) -> list[dict]:
    return list(document.get("statement", []))


def statement(parsed: Module, document: str, sid: str) -> dict:
    return next(s for s in statements(raw(parsed, "data", "aws_iam_policy_document", document)) if s.get("sid") == sid)


def module_dir_of(env: Module, call: str) -> str:
    source = env.modules[call]["source"]
    assert source.startswith("../../../modules/"), f"module {call}: {source} is not one of infra/terraform/modules"
    return Path(source).name


def passthrough(tree: Tree) -> dict[str, list[tuple[str, str]]]:
    """env variable -> [(module directory, module variable)] it is passed to verbatim (`x = var.x`)."""
    found: dict[str, list[tuple[str, str]]] = {}
    for call, body in tree.env.modules.items():
        for argument, value in body.items():
            if isinstance(value, str) and (match := re.fullmatch(r"\$\{var\.(\w+)\}", value)):
                found.setdefault(match.group(1), []).append((module_dir_of(tree.env, call), argument))
    return found


# -- checks --------------------------------------------------------------------------------------------


def aws_only(parsed: Module) -> bool:
    return all(set(one(settings, "required_providers")) == {"aws"} for settings in parsed.blocks.get("terraform", []))


def check_every_module_is_used(tree: Tree) -> None:
    used = {module_dir_of(tree.env, call) for call in tree.env.modules}
    aws_modules = {name for name, parsed in tree.modules.items() if aws_only(parsed)}
    assert aws_modules <= used, f"AWS modules the environment does not use: {sorted(aws_modules - used)}"
    assert used <= aws_modules, (
        f"modules needing more than the AWS provider belong to the platform layer: {sorted(used - aws_modules)}"
    )


def check_only_the_aws_provider(tree: Tree) -> None:
    aws = {"aws": {"source": "hashicorp/aws", "version": "~> 5.0"}}
    used = [tree.modules[module_dir_of(tree.env, call)] for call in tree.env.modules]
    for parsed in [tree.env, *used]:
        (settings,) = parsed.blocks["terraform"]
        assert settings["required_version"] == ">= 1.6", parsed.name
        # The offline mirror has the AWS provider only; kubernetes/helm belong to the platform layer.
        assert one(settings, "required_providers") == aws, f"{parsed.name}: {settings['required_providers']}"
        if parsed is not tree.env:
            assert "provider" not in parsed.blocks, f"{parsed.name}: modules must not configure providers"
    # Local state unless the user adds backend.tf (from backend.tf.example).
    assert "backend" not in tree.env.blocks["terraform"][0], "the environment's state is local by default"
    (provider,) = tree.env.blocks["provider"]
    assert set(provider) == {"aws"}
    assert provider["aws"]["region"] == ref("var.region")
    assert references(one(provider["aws"], "default_tags")["tags"], "var.tags")


def check_database_reachable_from_the_cluster_only(tree: Tree) -> None:
    database = tree.env.modules["database"]
    assert database["allowed_security_group_ids"] == [ref("module.eks.node_security_group_id")], database[
        "allowed_security_group_ids"
    ]
    # ...which is the group EKS attaches to the managed nodes, where every pod of the app runs.
    eks_outputs = tree.modules["eks"].outputs
    assert eks_outputs["node_security_group_id"]["value"] == ref(
        "aws_eks_cluster.this.vpc_config[0].cluster_security_group_id"
    )
    assert database["vpc_id"] == ref("module.network.vpc_id")
    assert database["private_subnet_ids"] == ref("module.network.private_subnet_ids")
    assert tree.modules["eks"].resource("aws_eks_node_group", "gpu").get("vpc_config") is None


def check_service_account_roles_match_the_app(tree: Tree) -> None:
    app, env = K8sConfig(), tree.env
    assert env.default("namespace") == app.namespace
    assert env.default("runner_service_account") == app.service_account

    runner, mlflow = env.modules["runner_role"], env.modules["mlflow_role"]
    for call, role in (("runner_role", runner), ("mlflow_role", mlflow)):
        assert module_dir_of(env, call) == "irsa"
        assert role["namespace"] == ref("var.namespace"), call
        assert role["oidc_provider_arn"] == ref("module.eks.oidc_provider_arn"), call
        assert role["oidc_provider_url"] == ref("module.eks.oidc_provider_url"), call
        assert role["bucket_arn"] == ref("module.storage.bucket_arn") and role["kms_key_arn"] == ref(
            "module.storage.kms_key_arn"
        ), call
        assert "secret_arn" not in role, f"{call}: the database secret has its own reader role"
    assert runner["service_account"] == ref("var.runner_service_account")
    assert mlflow["service_account"] == ref("var.mlflow_service_account")
    assert runner["service_account"] != mlflow["service_account"]

    # The step pods: the whole artifact root, which is the storage module's prefix.
    assert env.modules["storage"]["artifact_prefix"] == ref("var.artifact_prefix")
    assert runner["bucket_prefixes"] == [ref("var.artifact_prefix")]
    # The MLflow server: its own sub-prefix only.
    assert mlflow["bucket_prefixes"] == [ref("local.mlflow_prefix")]
    assert env.locals["mlflow_prefix"] == "${var.artifact_prefix}/mlflow"
    assert env.outputs["namespace"]["value"] == ref("var.namespace")
    assert env.outputs["runner_service_account"]["value"] == ref("var.runner_service_account")


def check_autoscaler_scales_only_its_own_node_groups(tree: Tree) -> None:
    env = tree.env
    role = env.modules["autoscaler_role"]
    assert module_dir_of(env, "autoscaler_role") == "service_account_role"
    assert (role["namespace"], role["service_account"]) == ("kube-system", "cluster-autoscaler")
    assert role["policy_json"] == ref("data.aws_iam_policy_document.cluster_autoscaler.json")

    document = env.data("aws_iam_policy_document")["cluster_autoscaler"]
    granted = set()
    owned_tag = "aws:ResourceTag/k8s.io/cluster-autoscaler/${module.eks.cluster_name}"
    for entry in statements(document):
        where = entry.get("sid", "?")
        assert (
            entry.get("effect", "Allow") == "Allow" and "not_actions" not in entry and "not_resources" not in entry
        ), where
        actions = set(entry["actions"])
        granted |= actions
        unexpected = {a for a in actions if a not in SCALING_ACTIONS and not READ_ONLY_VERB.match(a)}
        assert not unexpected, f"{where}: actions beyond reading and scaling: {unexpected}"
        if actions & SCALING_ACTIONS:
            assert actions <= SCALING_ACTIONS, f"{where}: scaling actions share a statement with others: {actions}"
            conditions = entry.get("condition", [])
            assert {"test": "StringEquals", "variable": owned_tag, "values": ["owned"]} in conditions, (
                f"{where}: not limited to owned groups"
            )
        if "*" in entry["resources"]:
            assert all(READ_ONLY_VERB.match(a) for a in actions), f"{where}: only reads may be on every resource"
        if "eks:DescribeNodegroup" in actions:
            assert entry["resources"] != ["*"] and all(
                "nodegroup/${module.eks.cluster_name}/" in r for r in entry["resources"]
            ), where
    assert SCALING_ACTIONS <= granted, (
        "the autoscaler cannot scale without SetDesiredCapacity and TerminateInstanceInAutoScalingGroup"
    )

    # The condition matches only if the eks module really tags the groups as owned by this cluster.
    eks = tree.modules["eks"]
    assert eks.locals["autoscaler_discovery_tags"].get("k8s.io/cluster-autoscaler/${var.cluster_name}") == "owned"
    assert eks.outputs["cluster_name"]["value"] == ref("aws_eks_cluster.this.name")
    assert eks.resource("aws_eks_cluster", "this")["name"] == ref("var.cluster_name")


def check_database_secret_reader_reads_one_secret(tree: Tree) -> None:
    env = tree.env
    role = env.modules["db_secret_reader_role"]
    assert module_dir_of(env, "db_secret_reader_role") == "service_account_role"
    assert role["namespace"] == ref("var.namespace")
    assert role["service_account"] == ref("var.db_secret_reader_service_account")
    assert role["policy_json"] == ref("data.aws_iam_policy_document.db_secret_reader.json")
    for entry in statements(env.data("aws_iam_policy_document")["db_secret_reader"]):
        actions = set(entry["actions"])
        if any(a.startswith("secretsmanager:") for a in actions):
            assert actions <= {"secretsmanager:GetSecretValue", "secretsmanager:DescribeSecret"}, actions
            assert entry["resources"] == [ref("module.database.master_user_secret_arn")], entry["resources"]
        else:
            assert actions == {"kms:Decrypt"}, actions
            assert entry["resources"] == [ref("module.database.kms_key_arn")]
            via = [c for c in entry.get("condition", []) if c["variable"] == "kms:ViaService"]
            assert via and via[0]["test"] == "StringEquals" and via[0]["values"][0].startswith("secretsmanager."), (
                "decrypt only through Secrets Manager"
            )


def check_image_repositories(tree: Tree) -> None:
    registry = tree.modules["registry"]
    repository = registry.resource("aws_ecr_repository", "this")
    assert repository["for_each"] == ref("toset(var.repositories)")
    assert repository["image_tag_mutability"] == "IMMUTABLE", "a deployed tag must always mean the same image"
    assert one(repository, "image_scanning_configuration")["scan_on_push"] is True
    encryption = one(repository, "encryption_configuration")
    assert encryption == {"encryption_type": "KMS", "kms_key": ref("aws_kms_key.this.arn")}, encryption
    assert registry.resource("aws_kms_key", "this")["enable_key_rotation"] is True

    policy = registry.resource("aws_ecr_lifecycle_policy", "this")
    assert policy["for_each"] == ref("aws_ecr_repository.this")
    assert policy["policy"] == ref("jsonencode(local.lifecycle_policy)")
    (rule,) = registry.locals["lifecycle_policy"]["rules"]
    assert rule["selection"]["tagStatus"] == "tagged", (
        "expiring untagged manifests can break a still-tagged image index"
    )
    assert rule["selection"]["countType"] == "imageCountMoreThan" and rule["selection"]["countNumber"] == ref(
        "var.keep_images"
    )
    assert rule["action"] == {"type": "expire"}

    call = tree.env.modules["registry"]
    assert call["repositories"] == ["trainer", "dagster", "sandbox"]
    assert call["name_prefix"] == ref("var.name")
    for name in call["repositories"]:
        assert (ROOT / "docker" / f"{name}.Dockerfile").is_file(), f"no Dockerfile builds the {name} image"


def check_flywheel_env_is_the_app_contract(tree: Tree) -> None:
    env = tree.env
    values = env.locals["flywheel_env"]
    assert set(values) == FLYWHEEL_ENV_KEYS, (
        f"extra {set(values) - FLYWHEEL_ENV_KEYS}, missing {FLYWHEEL_ENV_KEYS - set(values)}"
    )
    assert not [k for k in values if "PASSWORD" in k or "SECRET" in k], (
        "a rotated secret must not be copied into outputs"
    )
    assert env.outputs["flywheel_env"]["value"] == ref("local.flywheel_env")

    assert values["FLYWHEEL_PROFILE"] == "cluster"
    assert values["FLYWHEEL_ARTIFACT_ROOT"] == ref("module.storage.artifact_root")
    assert values["FLYWHEEL_IMAGE"] == ref('local.images["dagster"]')
    assert values["FLYWHEEL_TRAINER_IMAGE"] == ref('local.images["trainer"]')
    assert values["FLYWHEEL_SANDBOX_IMAGE"] == ref('local.images["sandbox"]')
    assert re.fullmatch(
        r'\$\{\{for (\w+), (\w+) in module\.registry\.repository_urls : \1 => "\$\{\2\}:\$\{var\.image_tag\}"\}\}',
        env.locals["images"],
    ), env.locals["images"]
    assert values["AWS_REGION"] == ref("var.region")

    # The MLflow Service the platform layer creates, in the app's namespace, as cluster.yaml used to hard-code.
    uri = values["MLFLOW_TRACKING_URI"]
    rendered = (
        uri.replace("${local.mlflow_service}", str(env.locals["mlflow_service"]))
        .replace("${var.namespace}", env.default("namespace"))
        .replace("${local.mlflow_port}", str(env.locals["mlflow_port"]))
    )
    assert rendered == "http://mlflow.flywheel.svc.cluster.local:5000", uri

    # DAGSTER_PG_HOST is a host name: RDS's `address`, not its `endpoint` (host:port).
    assert values["DAGSTER_PG_HOST"] == ref("module.database.endpoint")
    assert tree.modules["database"].outputs["endpoint"]["value"] == ref("aws_db_instance.this.address")
    assert values["DAGSTER_PG_DB"] == ref("module.database.dagster_database_name")
    assert values["DAGSTER_PG_USER"] == ref("module.database.master_username")

    # The app's side: the Dagster instance reads DAGSTER_PG_* (the password from elsewhere), the
    # profile reads ${VAR}s, and step pods get the Secret this map becomes.
    app = K8sConfig()
    assert set(app.postgres_env.values()) - FLYWHEEL_ENV_KEYS == {"DAGSTER_PG_PASSWORD"}, app.postgres_env
    assert app.env_secret == "flywheel-env"
    profile_reads = set(re.findall(r"\$\{([A-Za-z_][A-Za-z0-9_]*)", (ROOT / "configs" / "cluster.yaml").read_text()))
    assert profile_reads <= FLYWHEEL_ENV_KEYS, (
        f"configs/cluster.yaml reads variables flywheel_env lacks: {profile_reads - FLYWHEEL_ENV_KEYS}"
    )


def check_cluster_admins(tree: Tree) -> None:
    env = tree.env
    assert env.modules["eks"].get("admin_principal_arns") == ref("var.admin_principal_arns")
    assert "default" not in env.variables["admin_principal_arns"], (
        "who may administer the cluster is always a conscious choice"
    )
    (check,) = env.blocks.get("check", [{}])
    assert "caller_is_a_cluster_admin" in check, "no check warns a caller who will not reach the API"
    (assertion,) = check["caller_is_a_cluster_admin"]["assert"]
    assert references(assertion["condition"], "var.admin_principal_arns")
    assert references(assertion["condition"], "data.aws_iam_session_context.caller.issuer_arn")


def check_documented(tree: Tree) -> None:
    for parsed in (tree.env, tree.modules["registry"], tree.modules["service_account_role"]):
        assert parsed.variables and parsed.outputs, parsed.name
        for name, body in parsed.variables.items():
            assert isinstance(body.get("description"), str) and body["description"].strip(), (
                f"{parsed.name}: variable {name} has no description"
            )
            assert body.get("type"), f"{parsed.name}: variable {name} has no type"
        for name, body in parsed.outputs.items():
            assert isinstance(body.get("description"), str) and body["description"].strip(), (
                f"{parsed.name}: output {name} has no description"
            )
    assert REQUIRED_OUTPUTS <= tree.env.outputs.keys(), f"missing outputs: {REQUIRED_OUTPUTS - tree.env.outputs.keys()}"


def check_variables_are_validated(tree: Tree) -> None:
    """A variable that can hold a wrong value is validated, here or by the module it is passed to."""
    passed = passthrough(tree)
    for name, body in tree.env.variables.items():
        if body["type"] in ("bool", "${bool}", "map(string)", "${map(string)}") or body.get("validation"):
            continue
        targets = passed.get(name)
        assert targets, f"variable {name} is neither validated nor passed to a module"
        for module_name, argument in targets:
            assert tree.modules[module_name].variables[argument].get("validation"), (
                f"variable {name} is passed unvalidated to {module_name}.{argument}, which has no validation either"
            )


def check_backend_example(tree: Tree) -> None:
    (settings,) = tree.backend["terraform"]
    (backend,) = settings["backend"]
    s3 = backend["s3"]
    assert s3.get("encrypt") is True, "state holds every resource id and endpoint: encrypt it"
    assert s3.get("use_lockfile") is True, "two applies must not interleave"
    assert "dynamodb_table" not in s3, "use_lockfile replaces the deprecated DynamoDB lock table"
    assert s3["key"].endswith(".tfstate")


def check_tfvars_example(tree: Tree) -> None:
    variables = tree.env.variables
    required = {name for name, body in variables.items() if "default" not in body}
    assert required <= tree.tfvars.keys(), f"terraform.tfvars.example misses required {required - tree.tfvars.keys()}"
    assert tree.tfvars.keys() <= variables.keys(), (
        f"terraform.tfvars.example sets unknown {tree.tfvars.keys() - variables.keys()}"
    )


CHECKS: dict[str, Callable[[Tree], None]] = {
    "every_module_is_used": check_every_module_is_used,
    "only_the_aws_provider": check_only_the_aws_provider,
    "database_reachable_from_the_cluster_only": check_database_reachable_from_the_cluster_only,
    "service_account_roles_match_the_app": check_service_account_roles_match_the_app,
    "autoscaler_scales_only_its_own_node_groups": check_autoscaler_scales_only_its_own_node_groups,
    "database_secret_reader_reads_one_secret": check_database_secret_reader_reads_one_secret,
    "image_repositories": check_image_repositories,
    "flywheel_env_is_the_app_contract": check_flywheel_env_is_the_app_contract,
    "cluster_admins": check_cluster_admins,
    "documented": check_documented,
    "variables_are_validated": check_variables_are_validated,
    "backend_example": check_backend_example,
    "tfvars_example": check_tfvars_example,
}


@pytest.mark.parametrize("check", CHECKS)
def test_properties(tree: Tree, check: str) -> None:
    CHECKS[check](tree)


# -- each check must be able to fail ------------------------------------------------------------------


def _call(t: Tree, name: str) -> dict:
    return raw(t.env, "module", name)


def _scale(t: Tree) -> dict:
    return statement(t.env, "cluster_autoscaler", "ScaleOwnNodeGroups")


def _env_locals(t: Tree) -> dict:
    return raw_locals(t.env, "flywheel_env")["flywheel_env"]


def _helm_module(t: Tree) -> Module:
    helm = copy.deepcopy(t.modules["registry"])
    helm.blocks["terraform"] = [{"required_providers": [{"helm": {"source": "hashicorp/helm", "version": "~> 3.0"}}]}]
    return helm


def _drop_module_call(t: Tree, name: str) -> None:
    for entry in t.env.blocks["module"]:
        entry.pop(name, None)


MUTATIONS: list[tuple[str, str, Callable[[Tree], Any]]] = [
    ("every_module_is_used", "registry unused", lambda t: _drop_module_call(t, "registry")),
    (
        "every_module_is_used",
        "registry from elsewhere",
        lambda t: _call(t, "registry").update(source="terraform-aws-modules/ecr/aws"),
    ),
    (
        "every_module_is_used",
        "a helm module in this layer",
        lambda t: (
            t.env.blocks["module"].append({"releases": {"source": "../../../modules/releases"}})
            or t.modules.update(releases=_helm_module(t))
        ),
    ),
    (
        "only_the_aws_provider",
        "tls again",
        lambda t: one(t.modules["eks"].blocks["terraform"][0], "required_providers").update(
            tls={"source": "hashicorp/tls", "version": "~> 4.0"}
        ),
    ),
    (
        "only_the_aws_provider",
        "helm in the environment",
        lambda t: one(t.env.blocks["terraform"][0], "required_providers").update(
            helm={"source": "hashicorp/helm", "version": "~> 2.0"}
        ),
    ),
    (
        "only_the_aws_provider",
        "unpinned",
        lambda t: one(t.env.blocks["terraform"][0], "required_providers")["aws"].update(version=">= 4"),
    ),
    (
        "only_the_aws_provider",
        "backend configured",
        lambda t: t.env.blocks["terraform"][0].update(backend=[{"s3": {"bucket": "x"}}]),
    ),
    (
        "only_the_aws_provider",
        "region hard-coded",
        lambda t: t.env.blocks["provider"][0]["aws"].update(region="us-east-1"),
    ),
    (
        "only_the_aws_provider",
        "provider in a module",
        lambda t: t.modules["registry"].blocks.update(provider=[{"aws": {"region": "x"}}]),
    ),
    (
        "database_reachable_from_the_cluster_only",
        "a second group",
        lambda t: _call(t, "database")["allowed_security_group_ids"].append("sg-0123456789abcdef0"),
    ),
    (
        "database_reachable_from_the_cluster_only",
        "wrong group",
        lambda t: _call(t, "database").update(
            allowed_security_group_ids=["${module.network.default_security_group_id}"]
        ),
    ),
    (
        "database_reachable_from_the_cluster_only",
        "node group output moved",
        lambda t: raw(t.modules["eks"], "output", "node_security_group_id").update(
            value="${aws_security_group.nodes.id}"
        ),
    ),
    (
        "service_account_roles_match_the_app",
        "runner is the default account",
        lambda t: _call(t, "runner_role").update(service_account="default"),
    ),
    (
        "service_account_roles_match_the_app",
        "namespace differs from the app's",
        lambda t: raw(t.env, "variable", "namespace").update(default="ml"),
    ),
    (
        "service_account_roles_match_the_app",
        "service account differs from the app's",
        lambda t: raw(t.env, "variable", "runner_service_account").update(default="runner"),
    ),
    (
        "service_account_roles_match_the_app",
        "mlflow gets the whole root",
        lambda t: _call(t, "mlflow_role").update(bucket_prefixes=["${var.artifact_prefix}"]),
    ),
    (
        "service_account_roles_match_the_app",
        "runner reads the secret",
        lambda t: _call(t, "runner_role").update(secret_arn="${module.database.master_user_secret_arn}"),
    ),
    (
        "service_account_roles_match_the_app",
        "runner in another namespace",
        lambda t: _call(t, "runner_role").update(namespace="default"),
    ),
    ("autoscaler_scales_only_its_own_node_groups", "no owned condition", lambda t: _scale(t).pop("condition")),
    (
        "autoscaler_scales_only_its_own_node_groups",
        "shared instead of owned",
        lambda t: _scale(t)["condition"][0].update(values=["shared"]),
    ),
    (
        "autoscaler_scales_only_its_own_node_groups",
        "StringLike",
        lambda t: _scale(t)["condition"][0].update(test="StringLike"),
    ),
    (
        "autoscaler_scales_only_its_own_node_groups",
        "scaling without condition",
        lambda t: statement(t.env, "cluster_autoscaler", "DescribeScalingState")["actions"].append(
            "autoscaling:SetDesiredCapacity"
        ),
    ),
    (
        "autoscaler_scales_only_its_own_node_groups",
        "update groups",
        lambda t: _scale(t)["actions"].append("autoscaling:UpdateAutoScalingGroup"),
    ),
    (
        "autoscaler_scales_only_its_own_node_groups",
        "wildcard action",
        lambda t: statement(t.env, "cluster_autoscaler", "DescribeScalingState")["actions"].append("autoscaling:*"),
    ),
    ("autoscaler_scales_only_its_own_node_groups", "terminate dropped", lambda t: _scale(t)["actions"].pop()),
    (
        "autoscaler_scales_only_its_own_node_groups",
        "any node group",
        lambda t: statement(t.env, "cluster_autoscaler", "DescribeOwnNodeGroups").update(resources=["*"]),
    ),
    (
        "autoscaler_scales_only_its_own_node_groups",
        "groups not tagged owned",
        lambda t: raw_locals(t.modules["eks"], "autoscaler_discovery_tags")["autoscaler_discovery_tags"].update(
            {"k8s.io/cluster-autoscaler/${var.cluster_name}": "shared"}
        ),
    ),
    (
        "autoscaler_scales_only_its_own_node_groups",
        "wrong service account",
        lambda t: _call(t, "autoscaler_role").update(namespace="flywheel"),
    ),
    (
        "database_secret_reader_reads_one_secret",
        "every secret",
        lambda t: statement(t.env, "db_secret_reader", "ReadDatabaseSecret").update(resources=["*"]),
    ),
    (
        "database_secret_reader_reads_one_secret",
        "may write",
        lambda t: statement(t.env, "db_secret_reader", "ReadDatabaseSecret")["actions"].append(
            "secretsmanager:PutSecretValue"
        ),
    ),
    (
        "database_secret_reader_reads_one_secret",
        "direct decrypt",
        lambda t: statement(t.env, "db_secret_reader", "DecryptDatabaseSecret").pop("condition"),
    ),
    (
        "database_secret_reader_reads_one_secret",
        "any key",
        lambda t: statement(t.env, "db_secret_reader", "DecryptDatabaseSecret").update(resources=["*"]),
    ),
    (
        "image_repositories",
        "mutable tags",
        lambda t: raw(t.modules["registry"], "resource", "aws_ecr_repository", "this").update(
            image_tag_mutability="MUTABLE"
        ),
    ),
    (
        "image_repositories",
        "no scan",
        lambda t: raw(t.modules["registry"], "resource", "aws_ecr_repository", "this")["image_scanning_configuration"][
            0
        ].update(scan_on_push=False),
    ),
    (
        "image_repositories",
        "AES256",
        lambda t: raw(t.modules["registry"], "resource", "aws_ecr_repository", "this")["encryption_configuration"][
            0
        ].update(encryption_type="AES256"),
    ),
    (
        "image_repositories",
        "key rotation off",
        lambda t: raw(t.modules["registry"], "resource", "aws_kms_key", "this").update(enable_key_rotation=False),
    ),
    (
        "image_repositories",
        "expire untagged",
        lambda t: raw_locals(t.modules["registry"], "lifecycle_policy")["lifecycle_policy"]["rules"][0][
            "selection"
        ].update(tagStatus="any"),
    ),
    (
        "image_repositories",
        "expire by age",
        lambda t: raw_locals(t.modules["registry"], "lifecycle_policy")["lifecycle_policy"]["rules"][0][
            "selection"
        ].update(countType="sinceImagePushed"),
    ),
    (
        "image_repositories",
        "sandbox repository missing",
        lambda t: _call(t, "registry").update(repositories=["trainer", "dagster"]),
    ),
    (
        "image_repositories",
        "image without a Dockerfile",
        lambda t: _call(t, "registry").update(repositories=["trainer", "dagster", "sandbox", "web"]),
    ),
    (
        "flywheel_env_is_the_app_contract",
        "password copied",
        lambda t: _env_locals(t).update(DAGSTER_PG_PASSWORD="${var.password}"),
    ),
    ("flywheel_env_is_the_app_contract", "region missing", lambda t: _env_locals(t).pop("AWS_REGION")),
    (
        "flywheel_env_is_the_app_contract",
        "images swapped",
        lambda t: _env_locals(t).update(FLYWHEEL_IMAGE='${local.images["trainer"]}'),
    ),
    ("flywheel_env_is_the_app_contract", "gpu profile", lambda t: _env_locals(t).update(FLYWHEEL_PROFILE="gpu")),
    (
        "flywheel_env_is_the_app_contract",
        "host with port",
        lambda t: _env_locals(t).update(DAGSTER_PG_HOST="${module.database.endpoint}:5432"),
    ),
    (
        "flywheel_env_is_the_app_contract",
        "endpoint is host:port",
        lambda t: raw(t.modules["database"], "output", "endpoint").update(value="${aws_db_instance.this.endpoint}"),
    ),
    (
        "flywheel_env_is_the_app_contract",
        "mlflow on port 80",
        lambda t: raw_locals(t.env, "mlflow_port").update(mlflow_port=80),
    ),
    (
        "flywheel_env_is_the_app_contract",
        "untagged images",
        lambda t: raw_locals(t.env, "images").update(images="${module.registry.repository_urls}"),
    ),
    (
        "flywheel_env_is_the_app_contract",
        "output is not the local",
        lambda t: raw(t.env, "output", "flywheel_env").update(value="${{}}"),
    ),
    ("cluster_admins", "admins not passed", lambda t: _call(t, "eks").pop("admin_principal_arns")),
    ("cluster_admins", "admins defaulted", lambda t: raw(t.env, "variable", "admin_principal_arns").update(default=[])),
    ("cluster_admins", "check removed", lambda t: t.env.blocks.pop("check")),
    ("documented", "variable description dropped", lambda t: raw(t.env, "variable", "image_tag").pop("description")),
    ("documented", "output description dropped", lambda t: raw(t.env, "output", "db_port").pop("description")),
    (
        "documented",
        "module variable type dropped",
        lambda t: raw(t.modules["registry"], "variable", "keep_images").pop("type"),
    ),
    (
        "documented",
        "required output missing",
        lambda t: [entry.pop("autoscaler_role_arn", None) for entry in t.env.blocks["output"]],
    ),
    ("variables_are_validated", "image_tag unchecked", lambda t: raw(t.env, "variable", "image_tag").pop("validation")),
    (
        "variables_are_validated",
        "module check removed",
        lambda t: raw(t.modules["eks"], "variable", "gpu_max_nodes").pop("validation"),
    ),
    (
        "variables_are_validated",
        "unused variable",
        lambda t: t.env.blocks["variable"].append({"extra": {"description": "x", "type": "${string}"}}),
    ),
    ("backend_example", "no lock", lambda t: t.backend["terraform"][0]["backend"][0]["s3"].update(use_lockfile=False)),
    ("backend_example", "unencrypted", lambda t: t.backend["terraform"][0]["backend"][0]["s3"].pop("encrypt")),
    ("tfvars_example", "required value missing", lambda t: t.tfvars.pop("image_tag")),
    ("tfvars_example", "unknown variable", lambda t: t.tfvars.update(gpu_type="a10g")),
]


@pytest.mark.parametrize(
    "check,mutate", [(c, f) for c, _, f in MUTATIONS], ids=[f"{c}-{d.replace(' ', '_')}" for c, d, _ in MUTATIONS]
)
def test_check_catches(tree: Tree, check: str, mutate: Callable[[Tree], Any]) -> None:
    broken = copy.deepcopy(tree)
    mutate(broken)
    with pytest.raises(AssertionError):
        CHECKS[check](broken)


def test_every_check_has_a_mutation() -> None:
    assert set(CHECKS) == {c for c, _, _ in MUTATIONS}


def test_default_gpu_group_holds_the_apps_gpu_pool(tree: Tree) -> None:
    app, env = K8sConfig(), tree.env
    assert env.default("gpus_per_node") >= app.gpus_per_step
    assert env.default("gpu_max_nodes") * (env.default("gpus_per_node") // app.gpus_per_step) >= app.gpu_pool_limit


# -- variable validations (terraform console, offline) -------------------------------------------------

# (directory: "env" or a module, variable, value, accepted)
VALIDATION_CASES = [
    ("env", "region", "us-east-1", True),
    ("env", "region", "eu-central-1", True),
    ("env", "region", "ap-southeast-2", True),
    ("env", "region", "us-gov-west-1", True),
    ("env", "region", "us-east-1a", False),
    ("env", "region", "US-EAST-1", False),
    ("env", "region", "useast1", False),
    ("env", "region", "", False),
    ("env", "image_tag", "3f2c1ab", True),
    ("env", "image_tag", "v1.2.3_rc-1", True),
    ("env", "image_tag", "latest", False),
    ("env", "image_tag", "-rc1", False),
    ("env", "image_tag", "feature/x", False),
    ("env", "image_tag", "a" * 129, False),
    ("env", "image_tag", "", False),
    ("env", "admin_principal_arns", ["arn:aws:iam::123456789012:role/platform-admin"], True),
    (
        "env",
        "admin_principal_arns",
        ["arn:aws:iam::123456789012:user/alice", "arn:aws:iam::123456789012:role/ci/deployer"],
        True,
    ),
    ("env", "admin_principal_arns", [], False),
    ("env", "admin_principal_arns", ["arn:aws:sts::123456789012:assumed-role/platform-admin/alice"], False),
    ("env", "admin_principal_arns", ["platform-admin"], False),
    ("env", "name", "flywheel", True),
    ("env", "name", "flywheel-prod2", True),
    ("env", "name", "Flywheel", False),
    ("env", "name", "flywheel--prod", False),
    ("env", "name", "flywheel-", False),
    ("env", "name", "2flywheel", False),
    ("env", "name", "f" * 41, False),
    ("env", "namespace", "flywheel", True),
    ("env", "namespace", "Flywheel", False),
    ("env", "namespace", "fly.wheel", False),
    ("env", "namespace", "n" * 64, False),
    ("env", "runner_service_account", "flywheel-runner", True),
    ("env", "runner_service_account", "flywheel_runner", False),
    ("env", "mlflow_service_account", "mlflow", True),
    ("env", "mlflow_service_account", "*", False),
    ("env", "db_secret_reader_service_account", "external-secrets", True),
    ("env", "db_secret_reader_service_account", "Reader", False),
    ("registry", "name_prefix", "flywheel", True),
    ("registry", "name_prefix", "Flywheel", False),
    ("registry", "name_prefix", "fly--wheel", False),
    ("registry", "repositories", ["trainer", "dagster", "sandbox"], True),
    ("registry", "repositories", [], False),
    ("registry", "repositories", ["Trainer"], False),
    ("registry", "repositories", ["trainer", "trainer"], False),
    ("registry", "keep_images", 1, True),
    ("registry", "keep_images", 0, False),
    ("registry", "keep_images", 2.5, False),
    ("service_account_role", "policy_json", '{"Version": "2012-10-17", "Statement": []}', True),
    ("service_account_role", "policy_json", "not json", False),
    ("service_account_role", "policy_json", '{"Version": "2012-10-17"}', False),
    ("service_account_role", "service_account", "cluster-autoscaler", True),
    ("service_account_role", "service_account", "*", False),
    ("service_account_role", "namespace", "kube-system", True),
    ("service_account_role", "namespace", "Kube-System", False),
    ("service_account_role", "role_name", "flywheel-cluster-autoscaler", True),
    ("service_account_role", "role_name", "r" * 65, False),
]


@needs_terraform
def test_validations_accept_defaults_and_examples_and_reject_bad_values(tree: Tree, tmp_path: Path) -> None:
    checks = Validations({"env": tree.env, **tree.modules})
    checks.cases(VALIDATION_CASES)
    checks.defaults("env", "registry", "service_account_role")

    # What the environment passes on must pass the receiving module's rule: its defaults, and the
    # values terraform.tfvars.example gives.
    example = tree.tfvars
    for variable, targets in passthrough(tree).items():
        body = tree.env.variables[variable]
        for label, source in (("default", body), ("example", example)):
            value = source.get("default") if label == "default" else source.get(variable)
            if (label == "default" and "default" not in body) or (label == "example" and variable not in example):
                continue
            for module_name, argument in targets:
                if checks.modules[module_name].variables[argument].get("validation"):
                    checks.expect(
                        module_name, argument, value, True, label=f"env {label} {variable} -> {module_name}.{argument}"
                    )
    for variable, value in example.items():
        if tree.env.variables[variable].get("validation"):
            checks.expect("env", variable, value, True, label=f"example {variable}")
    checks.check(tmp_path)


# -- terraform validate and terraform test (offline, from the plugin mirror) -------------------------------


def diagnostics_of(done: subprocess.CompletedProcess) -> list[dict]:
    return [d for d in json.loads(done.stdout).get("diagnostics", []) if d["severity"] == "error"]


@needs_terraform
@pytest.mark.parametrize("directory", [ENV_DIR, *AWS_MODULE_DIRS], ids=lambda p: str(p.relative_to(TERRAFORM_DIR)))
def test_terraform_validate_passes_offline(directory: Path, tmp_path: Path) -> None:
    done = validate(directory, tmp_path)
    result = json.loads(done.stdout)
    assert result["valid"] is True and result["error_count"] == 0, json.dumps(result["diagnostics"], indent=1)


# (what is broken, file of the environment, text replaced, replacement, the error validate must report)
BREAKAGES = [
    (
        "reference to a missing module output",
        "main.tf",
        "module.eks.node_security_group_id",
        "module.eks.node_security_group",
        "Unsupported attribute",
    ),
    (
        "module call without a required argument",
        "main.tf",
        "  admin_principal_arns   = var.admin_principal_arns\n",
        "",
        "Missing required argument",
    ),
    (
        "output of an undeclared local",
        "outputs.tf",
        "local.flywheel_env",
        "local.flywheel_environment",
        "Reference to undeclared local value",
    ),
]


@needs_terraform
@pytest.mark.parametrize("what,file,old,new,error", BREAKAGES, ids=[b[0].replace(" ", "_") for b in BREAKAGES])
def test_terraform_validate_fails_on_a_broken_copy(what, file, old, new, error, tmp_path: Path, monkeypatch) -> None:
    broken_root = tmp_path / "broken"
    shutil.copytree(
        TERRAFORM_DIR, broken_root, ignore=shutil.ignore_patterns(".terraform", "*.tfstate*", ".terraform.lock.hcl")
    )
    target = broken_root / ENV_DIR.relative_to(TERRAFORM_DIR)
    text = (target / file).read_text()
    assert text.count(old) == 1, f"{file}: the text to break ({old!r}) must occur exactly once"
    (target / file).write_text(text.replace(old, new))
    # validate() copies TERRAFORM_DIR; point it at the broken tree.
    monkeypatch.setattr(terraform_support, "TERRAFORM_DIR", broken_root)
    done = validate(target, tmp_path / "work")
    errors = diagnostics_of(done)
    assert errors, f"{what}: terraform validate accepted a broken configuration"
    assert any(e["summary"] == error for e in errors), [e["summary"] for e in errors]


@needs_terraform
def test_environment_plans_offline_against_a_mocked_provider(tmp_path: Path) -> None:
    done = validate(ENV_DIR, tmp_path)  # also initializes the copy from the plugin mirror
    assert json.loads(done.stdout)["valid"] is True, done.stdout
    workdir = tmp_path / "terraform" / ENV_DIR.relative_to(TERRAFORM_DIR)
    run = subprocess.run(
        ["terraform", "test", "-json"], cwd=workdir, env=terraform_env(), capture_output=True, text=True, timeout=600
    )
    messages = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
    errors = [
        m["diagnostic"] for m in messages if m.get("type") == "diagnostic" and m["diagnostic"]["severity"] == "error"
    ]
    summary = next((m["test_summary"] for m in messages if m.get("type") == "test_summary"), None)
    detail = (
        "\n".join(f"{e['summary']}: {e.get('detail', '')} ({e.get('range', {}).get('filename')})" for e in errors)
        or run.stderr
    )
    assert run.returncode == 0 and summary and summary["status"] == "pass", detail
