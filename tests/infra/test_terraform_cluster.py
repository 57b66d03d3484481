"""The cluster's Terraform modules (infra/terraform/modules/network and eks), checked offline.

Providers cannot be installed here, so nothing is planned: the modules are parsed with python-hcl2
and their settings asserted, and the variables' validation conditions are evaluated by
`terraform console` in an empty directory (built-in functions only, no providers, no network).
The GPU and sandbox node groups' labels and taints are compared with what the app schedules GPU
steps with (configs.schema.K8sConfig) and the sandbox service with (pipelines/k8s_manifests.py),
since a mismatch only shows up on a live cluster as pods that stay Pending."""

from __future__ import annotations

import re
import subprocess

import pytest

from configs import load_profile
from configs.schema import K8sConfig
from tests.conftest import CLUSTER_ENV
from tests.terraform_support import (
    TERRAFORM_DIR,
    Module,
    Validations,
    module,
    needs_terraform,
    one,
    ref,
    references,
    terraform_env,
)

MODULES = ("network", "eks")

# The EKS API spells taint effects differently from Kubernetes.
K8S_EFFECT = {"NO_SCHEDULE": "NoSchedule", "NO_EXECUTE": "NoExecute", "PREFER_NO_SCHEDULE": "PreferNoSchedule"}


@pytest.fixture
def network() -> Module:
    return module("network")


@pytest.fixture
def eks() -> Module:
    return module("eks")


# --- GPU node group vs the app ------------------------------------------------------------------


def test_gpu_node_group_is_tainted_labelled_and_scales_from_zero(eks):
    gpu = eks.resource("aws_eks_node_group", "gpu")
    # the app selects on flywheel/node-pool; the cluster autoscaler recognises GPU nodes by the accelerator label
    assert gpu["labels"] == {"flywheel/node-pool": "gpu", "k8s.amazonaws.com/accelerator": ref("var.gpu_accelerator")}
    assert gpu["taint"] == [{"key": "nvidia.com/gpu", "value": "present", "effect": "NO_SCHEDULE"}]

    scaling = one(gpu, "scaling_config")
    assert scaling["min_size"] == 0, "the gpu group must be able to scale to zero nodes"
    assert scaling["desired_size"] == 0
    assert scaling["max_size"] == ref("var.gpu_max_nodes")
    assert eks.default("gpu_max_nodes") == 4
    assert eks.default("gpu_instance_types") == ["g5.2xlarge"]
    # The autoscaler owns the size once the group exists.
    assert ref("scaling_config[0].desired_size") in one(gpu, "lifecycle").get("ignore_changes", [])


def tolerates(toleration: dict[str, str], taint: dict[str, str]) -> bool:
    """Kubernetes' rule for a toleration matching a taint (the node group's taint, EKS spelling)."""
    if toleration.get("effect") and toleration["effect"] != K8S_EFFECT[taint["effect"]]:
        return False
    if toleration.get("operator", "Equal") == "Exists":
        return not toleration.get("key") or toleration["key"] == taint["key"]
    return toleration.get("key") == taint["key"] and toleration.get("value", "") == taint.get("value", "")


def test_gpu_label_and_taint_match_what_the_app_schedules_gpu_steps_with(eks):
    app = K8sConfig()
    gpu = eks.resource("aws_eks_node_group", "gpu")
    cpu = eks.resource("aws_eks_node_group", "cpu")

    # GPU step pods select the gpu nodes...
    assert app.gpu_node_selector.items() <= gpu["labels"].items(), (app.gpu_node_selector, gpu["labels"])
    # ...and no others, so they cannot land on a node without a GPU.
    assert not app.gpu_node_selector.items() <= cpu.get("labels", {}).items()
    assert cpu["labels"] == {"flywheel/node-pool": "cpu"}
    assert "taint" not in cpu, "a taint on the cpu group would keep the app's CPU pods and services off it"

    # A pod lands on a node only if it tolerates every one of the node's taints.
    for taint in gpu["taint"]:
        assert any(tolerates(t, taint) for t in app.gpu_tolerations), (taint, app.gpu_tolerations)
    assert app.gpu_tolerations == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]


def test_gpu_group_has_room_for_the_apps_gpu_pool(eks):
    app = K8sConfig()
    gpus_per_node = eks.default("gpus_per_node")
    # A step asking for more GPUs than one node has can never be scheduled.
    assert gpus_per_node >= app.gpus_per_step
    # The app runs up to gpu_pool_limit GPU steps at once; the group must be able to hold them.
    assert eks.default("gpu_max_nodes") * (gpus_per_node // app.gpus_per_step) >= app.gpu_pool_limit


# vCPU and memory (GiB) of the sandbox instance types the eks module may default to.
SANDBOX_INSTANCES = {"c6i.2xlarge": (8, 16), "c7i.2xlarge": (8, 16), "m6i.2xlarge": (8, 32)}
# vCPU and memory (GiB) of the GPU instance types the eks module may default to.
GPU_INSTANCES = {"g5.2xlarge": (8, 32), "g5.4xlarge": (16, 64), "g5.8xlarge": (32, 128), "g6.2xlarge": (8, 32)}
KUBE_RESERVED_GIB = 3  # kubelet, system daemons and eviction threshold on an EKS node of this size


def gib(quantity: str) -> float:
    units = {"Gi": 1, "Mi": 1 / 1024, "G": 1e9 / 2**30, "M": 1e6 / 2**30}
    for suffix, factor in units.items():
        if quantity.endswith(suffix):
            return float(quantity[: -len(suffix)]) * factor
    return float(quantity) / 2**30


def test_a_gpu_step_fits_on_the_default_gpu_instance(eks):
    """A request no node can hold stays Pending, and the autoscaler never adds a node for it."""
    app = K8sConfig()
    [instance] = eks.default("gpu_instance_types")
    vcpu, memory = GPU_INSTANCES[instance]
    requests = app.gpu_step_resources["requests"]
    assert float(requests["cpu"]) < vcpu
    assert gib(requests["memory"]) <= memory - KUBE_RESERVED_GIB, (requests, instance)
    assert gib(app.gpu_step_resources["limits"]["memory"]) <= memory - KUBE_RESERVED_GIB


def test_autoscaler_can_discover_both_groups_and_scale_gpu_from_zero(eks):
    discovery = eks.locals["autoscaler_discovery_tags"]
    assert discovery == {
        "k8s.io/cluster-autoscaler/enabled": "true",
        "k8s.io/cluster-autoscaler/${var.cluster_name}": "owned",
    }

    # The scale-from-zero template must describe the node the gpu group would really add: its
    # labels, its taint and its GPUs, or the autoscaler never picks the group for a GPU pod.
    gpu = eks.resource("aws_eks_node_group", "gpu")
    (taint,) = gpu["taint"]
    prefix = "k8s.io/cluster-autoscaler/node-template/"
    expected = {f"{prefix}label/{key}": value for key, value in gpu["labels"].items()}
    expected[f"{prefix}taint/{taint['key']}"] = f"{taint['value']}:{K8S_EFFECT[taint['effect']]}"
    expected[f"{prefix}resources/nvidia.com/gpu"] = ref("tostring(var.gpus_per_node)")
    assert eks.locals["gpu_node_template_tags"] == expected
    assert expected[f"{prefix}label/flywheel/node-pool"] == "gpu"
    assert expected[f"{prefix}taint/nvidia.com/gpu"] == "present:NoSchedule"

    cpu = eks.resource("aws_eks_node_group", "cpu")
    assert references(gpu["tags"], "local.autoscaler_discovery_tags")
    assert references(gpu["tags"], "local.gpu_node_template_tags")
    assert references(cpu["tags"], "local.autoscaler_discovery_tags")
    assert not references(cpu["tags"], "local.gpu_node_template_tags"), "the cpu group must not advertise GPUs"

    # Node group tags do not reach the Auto Scaling group, where the autoscaler reads them: the
    # module copies them there, the template tags to the gpu group's ASG only.
    asg_tag = eks.resource("aws_autoscaling_group_tag", "node_groups")
    assert asg_tag["for_each"] == ref("local.asg_tags")
    sources = dict(
        (group, source)
        for source, group in re.findall(r'\{for \w+, \w+ in (.*?) : "(cpu|gpu)\|\$\{\w+\}"', eks.locals["asg_tags"])
    )
    assert sources.keys() == {"cpu", "gpu"}, eks.locals["asg_tags"]
    assert references(sources["cpu"], "local.autoscaler_discovery_tags")
    assert not references(sources["cpu"], "local.gpu_node_template_tags")
    assert references(sources["gpu"], "local.autoscaler_discovery_tags")
    assert references(sources["gpu"], "local.gpu_node_template_tags")
    assert references(asg_tag["autoscaling_group_name"], "aws_eks_node_group.gpu.resources")
    assert references(asg_tag["autoscaling_group_name"], "aws_eks_node_group.cpu.resources")


def test_sandbox_node_group_is_what_the_sandbox_service_schedules_on(eks):
    """The service (pipelines/k8s_manifests.py) selects the group's label and tolerates its taint;
    no other pod tolerates the taint, and the group never scales to zero (every tool call needs it)."""
    from pipelines.k8s_manifests import SANDBOX_NODE_SELECTOR, SANDBOX_TOLERATIONS

    sandbox = eks.resource("aws_eks_node_group", "sandbox")
    assert sandbox["labels"] == {"flywheel/node-pool": "sandbox"} == SANDBOX_NODE_SELECTOR
    assert sandbox["taint"] == [{"key": "flywheel/sandbox", "value": "present", "effect": "NO_SCHEDULE"}]
    for taint in sandbox["taint"]:
        assert any(tolerates(t, taint) for t in SANDBOX_TOLERATIONS), (taint, SANDBOX_TOLERATIONS)
        assert not any(tolerates(t, taint) for t in K8sConfig().gpu_tolerations), (
            "GPU steps must not land on sandbox nodes"
        )
    scaling = one(sandbox, "scaling_config")
    assert (scaling["min_size"], scaling["desired_size"], scaling["max_size"]) == (1, 1, ref("var.sandbox_max_nodes"))
    assert sandbox["capacity_type"] == "ON_DEMAND" and sandbox["instance_types"] == ref("var.sandbox_instance_types")
    assert eks.default("sandbox_instance_types") == ["c6i.2xlarge"]
    assert ref("scaling_config[0].desired_size") in one(sandbox, "lifecycle").get("ignore_changes", [])

    # The autoscaler discovers the group and, at any size, knows its label and taint.
    prefix = "k8s.io/cluster-autoscaler/node-template/"
    (taint,) = sandbox["taint"]
    assert eks.locals["sandbox_node_template_tags"] == {
        f"{prefix}label/flywheel/node-pool": "sandbox",
        f"{prefix}taint/{taint['key']}": f"{taint['value']}:{K8S_EFFECT[taint['effect']]}",
    }
    assert references(sandbox["tags"], "local.autoscaler_discovery_tags") and references(
        sandbox["tags"], "local.sandbox_node_template_tags"
    )
    assert not references(sandbox["tags"], "local.gpu_node_template_tags")
    assert re.search(r'local\.sandbox_node_template_tags\) : "sandbox\|', eks.locals["asg_tags"]), eks.locals[
        "asg_tags"
    ]
    assert references(
        eks.resource("aws_autoscaling_group_tag", "node_groups")["autoscaling_group_name"],
        "aws_eks_node_group.sandbox.resources",
    )
    assert eks.outputs["sandbox_node_group_name"]["value"] == ref("aws_eks_node_group.sandbox.node_group_name")


def test_a_node_of_the_default_sandbox_instance_holds_two_service_replicas(eks):
    """Two replicas a node: the PodDisruptionBudget's one-down-at-a-time then drains a node without
    taking the service below its minimum, and the HPA's maximum fits the group's maximum."""
    from pipelines.k8s_manifests import sandbox_service

    [instance] = eks.default("sandbox_instance_types")
    vcpu, memory = SANDBOX_INSTANCES[instance]
    with pytest.MonkeyPatch.context() as patch:
        for name, value in CLUSTER_ENV.items():
            patch.setenv(name, value)
        manifests = sandbox_service(load_profile("cluster"))
    deployment = next(m for m in manifests if m["kind"] == "Deployment")
    hpa = next(m for m in manifests if m["kind"] == "HorizontalPodAutoscaler")
    requests = deployment["spec"]["template"]["spec"]["containers"][0]["resources"]["requests"]
    assert 2 * float(requests["cpu"]) <= vcpu - 1, "two replicas and the node's daemons"
    assert 2 * gib(requests["memory"]) <= memory - KUBE_RESERVED_GIB
    assert hpa["spec"]["maxReplicas"] <= 2 * eks.default("sandbox_max_nodes")


def test_network_policies_are_enforced_and_the_hpa_has_metrics(eks):
    """NetworkPolicies are inert unless the VPC CNI's policy agent is on; an HPA on CPU needs
    metrics-server. The sandbox service relies on both."""
    vpc_cni = eks.resource("aws_eks_addon", "vpc_cni")
    assert vpc_cni["addon_name"] == "vpc-cni"
    assert vpc_cni["configuration_values"] == '${jsonencode({enableNetworkPolicy = "true"})}'
    assert vpc_cni["resolve_conflicts_on_create"] == "OVERWRITE"  # adopts the self-managed copy EKS installs
    metrics = eks.resource("aws_eks_addon", "metrics_server")
    assert metrics["addon_name"] == "metrics-server"
    assert ref("aws_eks_node_group.cpu") in metrics["depends_on"]
    for addon in (vpc_cni, metrics):
        assert addon["cluster_name"] == ref("aws_eks_cluster.this.name")


def test_cpu_node_group_sizes(eks):
    scaling = one(eks.resource("aws_eks_node_group", "cpu"), "scaling_config")
    assert (scaling["min_size"], scaling["desired_size"], scaling["max_size"]) == (1, 2, ref("var.cpu_max_nodes"))
    assert eks.default("cpu_instance_types") == ["m6i.2xlarge"]
    assert eks.default("cpu_max_nodes") >= scaling["desired_size"]


# --- Nodes: AMIs, launch templates and IAM ------------------------------------------------------


def test_node_groups_run_amazon_linux_2023_with_the_nvidia_ami_on_gpu_nodes(eks):
    """The trainer image (docker/trainer.Dockerfile) is CUDA 13.0 and refuses drivers older than
    R580, which the AL2023 NVIDIA AMI carries; EKS publishes no Amazon Linux 2 AMIs for the
    Kubernetes versions kubernetes_version allows."""
    assert eks.resource("aws_eks_node_group", "gpu")["ami_type"] == "AL2023_x86_64_NVIDIA"
    assert eks.resource("aws_eks_node_group", "cpu")["ami_type"] == "AL2023_x86_64_STANDARD"
    assert eks.resource("aws_eks_node_group", "sandbox")["ami_type"] == "AL2023_x86_64_STANDARD"


POOLS = ("cpu", "gpu", "sandbox")


def test_one_launch_template_per_node_group(eks):
    # One aws_launch_template.node with for_each, an instance per node group.
    assert eks.resources("aws_launch_template").keys() == {"node"}
    template = eks.resource("aws_launch_template", "node")
    assert template["for_each"] == ref("local.launch_templates")
    assert eks.locals["launch_templates"].keys() == set(POOLS)
    assert template["name_prefix"] == "${var.cluster_name}-${each.key}-"
    assert one(template, "lifecycle")["create_before_destroy"] is True
    assert template["tags"] == ref("var.tags")


def test_launch_templates_moved_from_their_old_addresses(eks):
    # They were aws_launch_template.cpu/.gpu/.sandbox: without these moved blocks an existing
    # cluster would destroy and recreate them (and with them roll every node).
    moved = {block["from"]: block["to"] for block in eks.blocks.get("moved", [])}
    for pool in POOLS:
        assert moved.get(ref(f"aws_launch_template.{pool}")) == ref(f'aws_launch_template.node["{pool}"]'), moved


def test_launch_templates_leave_the_ami_and_its_nodeadm_bootstrap_to_eks(eks):
    # An image_id would make the node group a custom-AMI group: EKS would then neither pick the
    # AL2023 AMI of ami_type nor write the nodeadm NodeConfig that joins the node to the cluster.
    template = eks.resource("aws_launch_template", "node")
    assert "image_id" not in template
    # AL2023 has no bootstrap.sh; extra user data must be nodeadm's MIME NodeConfig.
    user_data = template.get("user_data")
    assert user_data is None or "application/node.eks.aws" in user_data, user_data


def test_launched_instances_carry_the_provider_default_tags(eks):
    # default_tags reach only resources Terraform creates; the node groups' instances are tagged by
    # the launch template, so GPU hours show up under the project's cost tags.
    assert "current" in eks.data("aws_default_tags")
    assert references(eks.locals["node_tags"], "data.aws_default_tags.current.tags")
    specs = eks.resource("aws_launch_template", "node")["tag_specifications"]
    assert {spec["resource_type"] for spec in specs} == {"instance", "volume"}
    for spec in specs:
        assert references(spec["tags"], "local.node_tags"), spec


def test_launch_templates_require_imdsv2_and_encrypt_root_volumes(eks):
    template = eks.resource("aws_launch_template", "node")
    metadata = one(template, "metadata_options")
    assert metadata["http_tokens"] == "required", "IMDSv1 must be off"
    assert metadata["http_endpoint"] == "enabled"
    # 1: pods (one hop behind the node) cannot reach IMDS and the node role; they use IRSA.
    assert metadata["http_put_response_hop_limit"] == 1

    ebs = one(one(template, "block_device_mappings"), "ebs")
    assert ebs["encrypted"] is True
    assert ebs["volume_type"] == "gp3"
    assert ebs["volume_size"] == ref("each.value.disk_size_gib")


@pytest.mark.parametrize("pool", POOLS)
def test_each_node_group_uses_its_launch_template_and_disk_size(eks, pool):
    # the sandbox nodes pull the same user-code image as the cpu nodes
    disk_size = eks.locals["launch_templates"][pool]["disk_size_gib"]
    assert disk_size == ref(f"var.{'cpu' if pool == 'sandbox' else pool}_disk_size_gib")

    # A template no node group uses protects nothing.
    launch_template = one(eks.resource("aws_eks_node_group", pool), "launch_template")
    assert launch_template["id"] == ref(f'aws_launch_template.node["{pool}"].id')
    assert launch_template["version"] == ref(f'aws_launch_template.node["{pool}"].latest_version')


def test_gpu_root_volume_is_200_gib(eks):
    assert eks.default("gpu_disk_size_gib") == 200


def test_iam_roles_carry_the_eks_managed_policies(eks):
    cluster_policy = eks.resource("aws_iam_role_policy_attachment", "cluster")
    assert cluster_policy["role"] == ref("aws_iam_role.cluster.name")
    assert cluster_policy["policy_arn"].endswith(":iam::aws:policy/AmazonEKSClusterPolicy")

    node_policies = eks.resource("aws_iam_role_policy_attachment", "node")
    assert node_policies["role"] == ref("aws_iam_role.node.name")
    attached = set(re.findall(r'"(\w+)"', node_policies["for_each"]))
    assert attached == {"AmazonEKSWorkerNodePolicy", "AmazonEKS_CNI_Policy", "AmazonEC2ContainerRegistryReadOnly"}
    for pool in ("cpu", "gpu"):
        assert eks.resource("aws_eks_node_group", pool)["node_role_arn"] == ref("aws_iam_role.node.arn")


# --- Control plane -------------------------------------------------------------------------------


def test_cluster_is_private_encrypts_secrets_and_logs_everything(eks):
    cluster = eks.resource("aws_eks_cluster", "this")
    vpc = one(cluster, "vpc_config")
    assert vpc["endpoint_private_access"] is True
    assert vpc["endpoint_public_access"] == ref("var.endpoint_public_access")
    assert eks.default("endpoint_public_access") is False
    assert vpc["subnet_ids"] == ref("var.private_subnet_ids")

    encryption = one(cluster, "encryption_config")
    assert encryption["resources"] == ["secrets"]
    assert one(encryption, "provider")["key_arn"] == ref("aws_kms_key.secrets.arn")
    assert eks.resource("aws_kms_key", "secrets")["enable_key_rotation"] is True

    assert cluster["version"] == ref("var.kubernetes_version")
    assert eks.default("kubernetes_version") == "1.35"
    assert cluster["enabled_cluster_log_types"] == ref("local.control_plane_log_types")
    assert set(eks.locals["control_plane_log_types"]) == {
        "api",
        "audit",
        "authenticator",
        "controllerManager",
        "scheduler",
    }
    log_group = eks.resource("aws_cloudwatch_log_group", "cluster")
    assert log_group["kms_key_id"] == ref("aws_kms_key.logs.arn")
    assert eks.resource("aws_kms_key", "logs")["enable_key_rotation"] is True


def test_irsa_oidc_provider_uses_the_clusters_issuer(eks):
    oidc = eks.resource("aws_iam_openid_connect_provider", "this")
    assert oidc["url"] == ref("aws_eks_cluster.this.identity[0].oidc[0].issuer")
    assert oidc["client_id_list"] == ["sts.amazonaws.com"]
    # IAM ignores thumbprints for EKS issuers and aws 5.x computes one; fetching the chain would
    # need the tls provider and the network at plan time.
    assert "thumbprint_list" not in oidc
    assert not eks.data("tls_certificate")
    assert eks.outputs["oidc_provider_url"]["value"] == ref(
        'replace(aws_eks_cluster.this.identity[0].oidc[0].issuer, "https://", "")'
    )


def test_api_access_is_through_access_entries_for_the_listed_admins_only(eks):
    access = one(eks.resource("aws_eks_cluster", "this"), "access_config")
    assert access["authentication_mode"] in {"API", "API_AND_CONFIG_MAP"}
    # No hidden admin for whoever created the cluster: admin_principal_arns is the whole list.
    assert access["bootstrap_cluster_creator_admin_permissions"] is False

    entry = eks.resource("aws_eks_access_entry", "admin")
    assert entry["for_each"] == ref("toset(var.admin_principal_arns)")
    assert entry["cluster_name"] == ref("aws_eks_cluster.this.name")
    assert entry["type"] == "STANDARD"

    association = eks.resource("aws_eks_access_policy_association", "admin")
    assert association["for_each"] == entry["for_each"]
    assert association["principal_arn"] == ref("aws_eks_access_entry.admin[each.key].principal_arn")
    assert association["policy_arn"].endswith(":eks::aws:cluster-access-policy/AmazonEKSClusterAdminPolicy")
    assert one(association, "access_scope") == {"type": "cluster"}
    assert "default" not in eks.variables["admin_principal_arns"], "a default would hide who may use the API"


def test_eks_outputs(eks):
    required = {
        "cluster_name",
        "cluster_endpoint",
        "cluster_certificate_authority_data",
        "oidc_provider_arn",
        "oidc_provider_url",
        "node_security_group_id",
        "cluster_security_group_id",
        "gpu_node_group_name",
        "sandbox_node_group_name",
    }
    assert required <= eks.outputs.keys(), required - eks.outputs.keys()
    assert eks.outputs["gpu_node_group_name"]["value"] == ref("aws_eks_node_group.gpu.node_group_name")


# --- Network -------------------------------------------------------------------------------------


def test_public_subnets_do_not_map_public_ips(network):
    assert network.resource("aws_subnet", "public")["map_public_ip_on_launch"] is False
    assert network.resource("aws_subnet", "private").get("map_public_ip_on_launch", False) is False


def test_subnets_are_tagged_for_eks_load_balancers(network):
    cluster_tag = "kubernetes.io/cluster/${var.cluster_name}"
    assert network.locals["public_subnet_tags"] == {cluster_tag: "shared", "kubernetes.io/role/elb": "1"}
    assert network.locals["private_subnet_tags"] == {cluster_tag: "shared", "kubernetes.io/role/internal-elb": "1"}
    assert references(network.resource("aws_subnet", "public")["tags"], "local.public_subnet_tags")
    assert references(network.resource("aws_subnet", "private")["tags"], "local.private_subnet_tags")


def test_subnets_span_az_count_zones_with_cidrsubnet(network):
    for kind in ("private", "public"):
        subnet = network.resource("aws_subnet", kind)
        assert subnet["count"] == ref("var.az_count")
        assert subnet["cidr_block"] == ref(f"local.{kind}_subnet_cidrs[count.index]")
        assert references(network.locals[f"{kind}_subnet_cidrs"], "var.vpc_cidr")
        assert "cidrsubnet(" in network.locals[f"{kind}_subnet_cidrs"]
    assert network.default("az_count") == 3
    assert network.default("single_nat_gateway") is True
    assert network.locals["nat_gateway_count"] == ref("var.single_nat_gateway ? 1 : var.az_count")


def test_vpc_has_dns_and_a_rule_free_default_security_group(network):
    vpc = network.resource("aws_vpc", "this")
    assert vpc["enable_dns_support"] is True and vpc["enable_dns_hostnames"] is True
    default_sg = network.resource("aws_default_security_group", "default")
    assert default_sg["vpc_id"] == ref("aws_vpc.this.id")
    assert "ingress" not in default_sg and "egress" not in default_sg


def test_vpc_flow_logs_go_to_an_encrypted_log_group_kept_a_year(network):
    flow_log = network.resource("aws_flow_log", "vpc")
    assert flow_log["vpc_id"] == ref("aws_vpc.this.id")
    assert flow_log["log_destination"] == ref("aws_cloudwatch_log_group.flow_logs.arn")
    assert flow_log["iam_role_arn"] == ref("aws_iam_role.flow_logs.arn")
    assert network.default("flow_log_traffic_type") == "ALL"

    log_group = network.resource("aws_cloudwatch_log_group", "flow_logs")
    assert log_group["kms_key_id"] == ref("aws_kms_key.flow_logs.arn")
    assert log_group["retention_in_days"] == ref("var.flow_log_retention_days")
    assert network.default("flow_log_retention_days") >= 365
    assert network.resource("aws_kms_key", "flow_logs")["enable_key_rotation"] is True
    assert network.resource("aws_iam_role_policy", "flow_logs")["role"] == ref("aws_iam_role.flow_logs.id")


# --- Module hygiene ------------------------------------------------------------------------------


@pytest.mark.parametrize("name", MODULES)
def test_every_variable_has_a_description_and_a_type(name):
    parsed = module(name)
    assert parsed.variables
    for variable, body in parsed.variables.items():
        assert isinstance(body.get("description"), str) and body["description"].strip(), (
            f"{name}: variable {variable} has no description"
        )
        assert body.get("type"), f"{name}: variable {variable} has no type"
    for output, body in parsed.outputs.items():
        assert body.get("description"), f"{name}: output {output} has no description"


@pytest.mark.parametrize("name", MODULES)
def test_versions_are_constrained_and_no_provider_is_configured(name):
    parsed = module(name)
    (settings,) = parsed.blocks["terraform"]
    assert settings["required_version"] == ">= 1.6"
    (providers,) = settings["required_providers"]
    # The AWS provider only: it is the one provider on the offline mirror (/opt/tf-plugins), so
    # `terraform validate` of the modules and the environment needs no network.
    assert providers == {"aws": {"source": "hashicorp/aws", "version": "~> 5.0"}}
    # A module that configures providers cannot be used with for_each/count and pins the caller's region.
    assert "provider" not in parsed.blocks


# --- Variable validations (terraform console, offline) ----------------------------------------------


# (module, variable, value, accepted)
VALIDATION_CASES = [
    ("network", "cluster_name", "flywheel", True),
    ("network", "cluster_name", "flywheel_prod", False),
    ("network", "cluster_name", "9lives", False),
    ("network", "cluster_name", "f" * 41, False),
    ("network", "vpc_cidr", "10.0.0.0/16", True),
    ("network", "vpc_cidr", "10.20.0.0/22", True),
    ("network", "vpc_cidr", "10.0.0.1/16", False),
    ("network", "vpc_cidr", "10.0.0.0/8", False),
    ("network", "vpc_cidr", "10.0.0.0/24", False),
    ("network", "vpc_cidr", "ten.0.0.0/16", False),
    ("network", "az_count", 2, True),
    ("network", "az_count", 6, True),
    ("network", "az_count", 1, False),
    ("network", "az_count", 7, False),
    ("network", "az_count", 2.5, False),
    ("network", "flow_log_retention_days", 731, True),
    ("network", "flow_log_retention_days", 90, False),
    ("network", "flow_log_retention_days", 0, False),
    ("eks", "cluster_name", "flywheel-prod", True),
    ("eks", "cluster_name", "-flywheel", False),
    ("eks", "kubernetes_version", "1.34", True),
    ("eks", "kubernetes_version", "1.35", True),
    ("eks", "kubernetes_version", "1.36", True),
    ("eks", "kubernetes_version", "1.40", True),
    ("eks", "kubernetes_version", "1.33", False),
    ("eks", "kubernetes_version", "1.31", False),
    ("eks", "kubernetes_version", "1.35.2", False),
    ("eks", "kubernetes_version", "v1.35", False),
    ("eks", "kubernetes_version", "2.0", False),
    ("eks", "admin_principal_arns", ["arn:aws:iam::123456789012:role/platform-admin"], True),
    (
        "eks",
        "admin_principal_arns",
        ["arn:aws:iam::123456789012:role/team/platform-admin", "arn:aws:iam::123456789012:user/alice"],
        True,
    ),
    ("eks", "admin_principal_arns", ["arn:aws-us-gov:iam::123456789012:role/admin"], True),
    ("eks", "admin_principal_arns", [], False),
    ("eks", "admin_principal_arns", ["arn:aws:sts::123456789012:assumed-role/platform-admin/alice"], False),
    ("eks", "admin_principal_arns", ["arn:aws:iam::123456789012:role/*"], False),
    ("eks", "admin_principal_arns", ["arn:aws:iam::12345:role/admin"], False),
    ("eks", "admin_principal_arns", ["arn:aws:iam::123456789012:role/a", "arn:aws:iam::123456789012:role/a"], False),
    ("eks", "public_access_cidrs", ["203.0.113.0/24"], True),
    ("eks", "public_access_cidrs", [], True),
    ("eks", "public_access_cidrs", ["0.0.0.0/0"], False),
    ("eks", "public_access_cidrs", ["203.0.113.0/24", "0.0.0.0/0"], False),
    ("eks", "public_access_cidrs", ["203.0.113.7"], False),
    ("eks", "private_subnet_ids", ["subnet-0a1", "subnet-0b2"], True),
    ("eks", "private_subnet_ids", ["subnet-0a1"], False),
    ("eks", "private_subnet_ids", ["sg-0a1", "subnet-0b2"], False),
    ("eks", "cpu_max_nodes", 2, True),
    ("eks", "cpu_max_nodes", 1, False),
    ("eks", "gpu_max_nodes", 1, True),
    ("eks", "gpu_max_nodes", 0, False),
    ("eks", "gpus_per_node", 0, False),
    ("eks", "gpu_disk_size_gib", 50, False),
    ("eks", "gpu_capacity_type", "SPOT", True),
    ("eks", "gpu_capacity_type", "spot", False),
    ("eks", "gpu_accelerator", "nvidia-l40s", True),
    ("eks", "gpu_accelerator", "NVIDIA A10G", False),
    ("eks", "sandbox_max_nodes", 1, True),
    ("eks", "sandbox_max_nodes", 0, False),
    ("eks", "sandbox_max_nodes", 2.5, False),
    ("eks", "sandbox_instance_types", [], False),
]

# aws_eks_cluster's precondition: a public endpoint needs an allow-list, since AWS falls back to 0.0.0.0/0.
PUBLIC_ENDPOINT_CASES = [
    ({"endpoint_public_access": False, "public_access_cidrs": []}, True),
    ({"endpoint_public_access": True, "public_access_cidrs": ["203.0.113.0/24"]}, True),
    ({"endpoint_public_access": True, "public_access_cidrs": []}, False),
]


@needs_terraform
def test_validations_accept_the_defaults_and_reject_bad_values(network, eks, tmp_path):
    checks = Validations({"network": network, "eks": eks})
    checks.cases(VALIDATION_CASES)
    checks.defaults()
    (precondition,) = one(eks.resource("aws_eks_cluster", "this"), "lifecycle")["precondition"]
    for values, accepted in PUBLIC_ENDPOINT_CASES:
        checks.expect_conditions(
            f"aws_eks_cluster precondition {values}", [(precondition["condition"], values)], accepted
        )
    checks.check(tmp_path)


@needs_terraform
def test_terraform_files_are_formatted():
    done = subprocess.run(
        ["terraform", "fmt", "-check", "-recursive", "-diff", str(TERRAFORM_DIR)],
        env=terraform_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, f"run `terraform fmt -recursive infra/terraform`:\n{done.stdout}{done.stderr}"
