# EKS cluster of the flywheel's `cluster` profile: a private control plane, a cpu node group
# for the always-on services, a tainted gpu node group that scales from zero, so GPUs are
# only paid for while rollout/training steps run, and a tainted sandbox node group where the
# sandbox service runs policy-written code away from everything else.

data "aws_partition" "current" {}

data "aws_region" "current" {}

data "aws_caller_identity" "current" {}

# The caller's provider-level default_tags. They reach the resources Terraform creates, but not
# the instances and volumes the node groups launch: those get their tags from the launch
# templates' tag specifications, so that cost reports see the GPU nodes under the project's tags.
data "aws_default_tags" "current" {}

locals {
  node_tags = merge(data.aws_default_tags.current.tags, var.tags)

  control_plane_log_types = ["api", "audit", "authenticator", "controllerManager", "scheduler"]

  # EKS writes control plane logs to this fixed name; creating the group first is the only way
  # to choose its retention and encryption.
  cluster_log_group_name = "/aws/eks/${var.cluster_name}/cluster"

  # How the cluster autoscaler finds the node groups it may scale (its
  # --node-group-auto-discovery=asg:tag=... flag).
  autoscaler_discovery_tags = {
    "k8s.io/cluster-autoscaler/enabled"             = "true"
    "k8s.io/cluster-autoscaler/${var.cluster_name}" = "owned"
  }

  # With zero gpu nodes there is no node for the autoscaler to copy labels, taints and
  # allocatable GPUs from, so it would never pick this group for a pending GPU pod. These
  # tags describe the node it would get; they must mirror the group's labels and taint below.
  gpu_node_template_tags = {
    "k8s.io/cluster-autoscaler/node-template/label/flywheel/node-pool"            = "gpu"
    "k8s.io/cluster-autoscaler/node-template/label/k8s.amazonaws.com/accelerator" = var.gpu_accelerator
    "k8s.io/cluster-autoscaler/node-template/taint/nvidia.com/gpu"                = "present:NoSchedule"
    "k8s.io/cluster-autoscaler/node-template/resources/nvidia.com/gpu"            = tostring(var.gpus_per_node)
  }

  # The same for the sandbox group. It never goes below one node, so the autoscaler could copy a
  # live node; the tags keep that true if its minimum is ever lowered to zero.
  sandbox_node_template_tags = {
    "k8s.io/cluster-autoscaler/node-template/label/flywheel/node-pool" = "sandbox"
    "k8s.io/cluster-autoscaler/node-template/taint/flywheel/sandbox"   = "present:NoSchedule"
  }

  # The node groups' launch templates (aws_launch_template.node), by node group: only the root
  # volume differs. The gpu nodes hold CUDA/vLLM images and cached model weights; the sandbox
  # service runs the user-code image, as the cpu nodes do, so it gets the cpu size.
  launch_templates = {
    cpu     = { disk_size_gib = var.cpu_disk_size_gib }
    gpu     = { disk_size_gib = var.gpu_disk_size_gib }
    sandbox = { disk_size_gib = var.cpu_disk_size_gib }
  }

  # Node group tags stay on the EKS node group object and are not copied to its Auto Scaling
  # group, which is where the autoscaler reads them; aws_autoscaling_group_tag below copies
  # them. Keys are "<group>|<tag>" so for_each knows them at plan time.
  asg_tags = merge(
    { for key, value in local.autoscaler_discovery_tags : "cpu|${key}" => { node_group = "cpu", key = key, value = value } },
    { for key, value in merge(local.autoscaler_discovery_tags, local.gpu_node_template_tags) : "gpu|${key}" => { node_group = "gpu", key = key, value = value } },
    { for key, value in merge(local.autoscaler_discovery_tags, local.sandbox_node_template_tags) : "sandbox|${key}" => { node_group = "sandbox", key = key, value = value } },
  )
}

# --- Control plane -----------------------------------------------------------------------------

data "aws_iam_policy_document" "cluster_assume" {
  statement {
    actions = ["sts:AssumeRole"]

    principals {
      type        = "Service"
      identifiers = ["eks.amazonaws.com"]
    }
  }
}

resource "aws_iam_role" "cluster" {
  name               = "${var.cluster_name}-eks-cluster"
  assume_role_policy = data.aws_iam_policy_document.cluster_assume.json

  tags = var.tags
}

resource "aws_iam_role_policy_attachment" "cluster" {
  role       = aws_iam_role.cluster.name
  policy_arn = "arn:${data.aws_partition.current.partition}:iam::aws:policy/AmazonEKSClusterPolicy"
}

# Envelope encryption of Secrets: etcd holds the step pods' env secret (MLflow/S3/Postgres
# settings), and with our own key access to it is auditable in CloudTrail and revocable.
resource "aws_kms_key" "secrets" {
  #checkov:skip=CKV2_AWS_64:The default key policy is intended here: the control plane uses the key through the cluster role's IAM policy (cluster_secrets_key below), which is what the default policy delegates to.
  description             = "EKS secrets envelope encryption for ${var.cluster_name}"
  enable_key_rotation     = true
  deletion_window_in_days = 30

  tags = var.tags
}

resource "aws_kms_alias" "secrets" {
  name          = "alias/${var.cluster_name}-eks-secrets"
  target_key_id = aws_kms_key.secrets.key_id
}

# AmazonEKSClusterPolicy grants no KMS rights; the control plane uses its own role to wrap
# and unwrap data keys.
data "aws_iam_policy_document" "cluster_secrets_key" {
  statement {
    actions   = ["kms:Encrypt", "kms:Decrypt", "kms:ListGrants", "kms:DescribeKey"]
    resources = [aws_kms_key.secrets.arn]
  }
}

resource "aws_iam_role_policy" "cluster_secrets_key" {
  name   = "eks-secrets-encryption"
  role   = aws_iam_role.cluster.id
  policy = data.aws_iam_policy_document.cluster_secrets_key.json
}

data "aws_iam_policy_document" "logs_key" {
  # A key policy's Resource can only be "*", which means the key the policy is attached to.
  #checkov:skip=CKV_AWS_109:This is a KMS key policy, where Resource "*" is the key itself, and kms:* for the account root is AWS's default administration statement that delegates to IAM.
  #checkov:skip=CKV_AWS_111:This is a KMS key policy, where Resource "*" is the key itself; the CloudWatch Logs statement is further limited to this one log group by its encryption-context condition.
  #checkov:skip=CKV_AWS_356:This is a KMS key policy, where Resource "*" is the only value KMS accepts and means the key the policy is attached to, not every resource.
  # Without this statement the key would be usable by nobody in the account but the service.
  statement {
    sid       = "AccountAdministration"
    actions   = ["kms:*"]
    resources = ["*"]

    principals {
      type        = "AWS"
      identifiers = ["arn:${data.aws_partition.current.partition}:iam::${data.aws_caller_identity.current.account_id}:root"]
    }
  }

  # CloudWatch Logs encrypts with the key on the log group's behalf; the encryption-context
  # condition limits that to the control plane's log group.
  statement {
    sid = "CloudWatchLogsControlPlaneGroup"
    actions = [
      "kms:Encrypt*",
      "kms:Decrypt*",
      "kms:ReEncrypt*",
      "kms:GenerateDataKey*",
      "kms:Describe*",
    ]
    resources = ["*"]

    principals {
      type        = "Service"
      identifiers = ["logs.${data.aws_region.current.name}.amazonaws.com"]
    }

    condition {
      test     = "ArnEquals"
      variable = "kms:EncryptionContext:aws:logs:arn"
      values   = ["arn:${data.aws_partition.current.partition}:logs:${data.aws_region.current.name}:${data.aws_caller_identity.current.account_id}:log-group:${local.cluster_log_group_name}"]
    }
  }
}

# A key separate from the secrets key: log readers must not be able to decrypt Secrets.
resource "aws_kms_key" "logs" {
  description             = "EKS control plane logs of ${var.cluster_name}"
  enable_key_rotation     = true
  deletion_window_in_days = 30
  policy                  = data.aws_iam_policy_document.logs_key.json

  tags = var.tags
}

resource "aws_kms_alias" "logs" {
  name          = "alias/${var.cluster_name}-eks-logs"
  target_key_id = aws_kms_key.logs.key_id
}

resource "aws_cloudwatch_log_group" "cluster" {
  name              = local.cluster_log_group_name
  retention_in_days = var.cluster_log_retention_days
  kms_key_id        = aws_kms_key.logs.arn

  tags = var.tags
}

resource "aws_eks_cluster" "this" {
  name     = var.cluster_name
  version  = var.kubernetes_version
  role_arn = aws_iam_role.cluster.arn

  enabled_cluster_log_types = local.control_plane_log_types

  vpc_config {
    subnet_ids              = var.private_subnet_ids
    endpoint_private_access = true
    endpoint_public_access  = var.endpoint_public_access
    # AWS stores 0.0.0.0/0 when no list is sent; with the public endpoint off that default is
    # inert, and sending null avoids a perpetual diff against it.
    public_access_cidrs = var.endpoint_public_access ? var.public_access_cidrs : null
  }

  encryption_config {
    resources = ["secrets"]

    provider {
      key_arn = aws_kms_key.secrets.arn
    }
  }

  # Access entries (below) instead of the aws-auth ConfigMap: who may use the API is then an AWS
  # resource, planned and reviewed here, and a broken ConfigMap can no longer lock everyone out.
  # The creator gets no invisible admin grant; admin_principal_arns is the whole list. EKS adds
  # the entries of the managed node groups' role itself.
  access_config {
    authentication_mode                         = "API"
    bootstrap_cluster_creator_admin_permissions = false
  }

  tags = var.tags

  lifecycle {
    # Cross-variable checks are not allowed in variable validation before Terraform 1.9. An
    # empty list here would make AWS fall back to 0.0.0.0/0, the opposite of the intent.
    precondition {
      condition     = !var.endpoint_public_access || length(var.public_access_cidrs) > 0
      error_message = "endpoint_public_access = true needs a non-empty public_access_cidrs."
    }
  }

  depends_on = [
    # Deleting the role's permissions before the cluster would leave EKS unable to clean up
    # the ENIs and security groups it created.
    aws_iam_role_policy_attachment.cluster,
    aws_iam_role_policy.cluster_secrets_key,
    # Otherwise EKS creates the log group itself (unencrypted, never expiring) and the
    # log group resource then fails with "already exists".
    aws_cloudwatch_log_group.cluster,
  ]
}

# --- API access ----------------------------------------------------------------------------------
# Cluster-admin for the people and pipelines that run Terraform: the platform layer's kubernetes
# and helm providers authenticate as one of these principals.

resource "aws_eks_access_entry" "admin" {
  for_each = toset(var.admin_principal_arns)

  cluster_name  = aws_eks_cluster.this.name
  principal_arn = each.value
  type          = "STANDARD"

  tags = var.tags
}

resource "aws_eks_access_policy_association" "admin" {
  for_each = toset(var.admin_principal_arns)

  cluster_name  = aws_eks_cluster.this.name
  principal_arn = aws_eks_access_entry.admin[each.key].principal_arn
  policy_arn    = "arn:${data.aws_partition.current.partition}:eks::aws:cluster-access-policy/AmazonEKSClusterAdminPolicy"

  access_scope {
    type = "cluster"
  }
}

# --- IRSA ----------------------------------------------------------------------------------------
# Lets service accounts (flywheel-runner: S3 only; cluster-autoscaler) assume their own IAM
# roles instead of inheriting the node role.

# No thumbprint_list: IAM trusts the EKS issuers' certificates through its own library of root
# CAs and ignores thumbprints for them, and the aws provider (checked on 5.100.0) makes the
# argument optional, letting IAM fill it in. Computing one would need the hashicorp/tls provider
# and a network fetch of the issuer's certificate chain at plan time, for nothing.
resource "aws_iam_openid_connect_provider" "this" {
  url            = aws_eks_cluster.this.identity[0].oidc[0].issuer
  client_id_list = ["sts.amazonaws.com"]

  tags = var.tags
}

# --- Nodes ---------------------------------------------------------------------------------------

data "aws_iam_policy_document" "node_assume" {
  statement {
    actions = ["sts:AssumeRole"]

    principals {
      type        = "Service"
      identifiers = ["ec2.amazonaws.com"]
    }
  }
}

resource "aws_iam_role" "node" {
  name               = "${var.cluster_name}-eks-node"
  assume_role_policy = data.aws_iam_policy_document.node_assume.json

  tags = var.tags
}

resource "aws_iam_role_policy_attachment" "node" {
  # Joining the cluster, pulling images from ECR, and the VPC CNI's ENI management (the
  # aws-node daemonset uses the node role unless it is given an IRSA role of its own).
  for_each = toset([
    "AmazonEKSWorkerNodePolicy",
    "AmazonEKS_CNI_Policy",
    "AmazonEC2ContainerRegistryReadOnly",
  ])

  role       = aws_iam_role.node.name
  policy_arn = "arn:${data.aws_partition.current.partition}:iam::aws:policy/${each.value}"
}

# The launch templates set no AMI and no user data, so EKS still picks the optimized AMI of
# the node group's ami_type and writes the bootstrap itself (on AL2023, nodeadm's NodeConfig,
# with the group's labels and taints); they exist for the metadata and disk settings, which a
# node group cannot set on its own. User data added here later must be a MIME multi-part
# NodeConfig document, not a bootstrap.sh call: AL2023 has no bootstrap.sh. No security groups
# either: nodes then get the cluster security group EKS manages, which already allows control
# plane <-> node traffic.
#
# One template per node group, all with the same settings but the root volume size
# (local.launch_templates).
resource "aws_launch_template" "node" {
  for_each = local.launch_templates

  name_prefix            = "${var.cluster_name}-${each.key}-"
  description            = "${each.key} node group of ${var.cluster_name}"
  update_default_version = true

  # IMDSv2 only: a token is needed, so an SSRF in a pod cannot read the node role's
  # credentials with a plain GET. Hop limit 1: a pod's traffic is one hop behind the node, so
  # only host-network pods (aws-node, kube-proxy) reach IMDS at all, and no workload can borrow
  # the node role (ENI management, ECR pulls). Pods that need AWS get an IRSA role, and the
  # region from AWS_REGION (flywheel_env; the cluster autoscaler's awsRegion), not from IMDS.
  # This matters most on the sandbox nodes: they run policy-written code, and must not be able
  # to borrow the node role.
  metadata_options {
    http_endpoint               = "enabled"
    http_tokens                 = "required"
    http_put_response_hop_limit = 1
  }

  block_device_mappings {
    device_name = "/dev/xvda"

    ebs {
      volume_size           = each.value.disk_size_gib
      volume_type           = "gp3"
      encrypted             = true
      delete_on_termination = true
    }
  }

  tag_specifications {
    resource_type = "instance"
    tags          = merge(local.node_tags, { Name = "${var.cluster_name}-${each.key}" })
  }

  tag_specifications {
    resource_type = "volume"
    tags          = merge(local.node_tags, { Name = "${var.cluster_name}-${each.key}" })
  }

  tags = var.tags

  lifecycle {
    create_before_destroy = true
  }
}

# The templates were three resources (aws_launch_template.cpu, .gpu, .sandbox) before they were
# folded into one with for_each; these keep existing clusters from replacing them.
moved {
  from = aws_launch_template.cpu
  to   = aws_launch_template.node["cpu"]
}

moved {
  from = aws_launch_template.gpu
  to   = aws_launch_template.node["gpu"]
}

moved {
  from = aws_launch_template.sandbox
  to   = aws_launch_template.node["sandbox"]
}

resource "aws_eks_node_group" "cpu" {
  cluster_name = aws_eks_cluster.this.name
  # A prefix, not a fixed name: instance type or AMI changes replace the group, and
  # create_before_destroy needs the new one to have a different name.
  node_group_name_prefix = "cpu-"
  node_role_arn          = aws_iam_role.node.arn
  subnet_ids             = var.private_subnet_ids
  # Nodes follow the control plane in the same apply instead of staying on the version the
  # group was created with.
  version = aws_eks_cluster.this.version
  # Amazon Linux 2023: EKS publishes no Amazon Linux 2 AMIs for Kubernetes 1.33 and later, and
  # ended their support on 26 November 2025.
  ami_type       = "AL2023_x86_64_STANDARD"
  capacity_type  = "ON_DEMAND"
  instance_types = var.cpu_instance_types

  # Dagster's webserver and daemon and the MLflow server live here, so the group never goes
  # below one node; the second gives room for CPU step pods and for draining during upgrades.
  scaling_config {
    min_size     = 1
    desired_size = 2
    max_size     = var.cpu_max_nodes
  }

  update_config {
    max_unavailable = 1
  }

  launch_template {
    id      = aws_launch_template.node["cpu"].id
    version = aws_launch_template.node["cpu"].latest_version
  }

  labels = {
    "flywheel/node-pool" = "cpu"
  }

  tags = merge(var.tags, local.autoscaler_discovery_tags)

  lifecycle {
    create_before_destroy = true
    # The cluster autoscaler owns the current size; re-applying must not undo its scaling.
    ignore_changes = [scaling_config[0].desired_size]
  }

  # The node role must keep its policies until the nodes are gone, or they cannot deregister.
  depends_on = [aws_iam_role_policy_attachment.node]
}

resource "aws_eks_node_group" "gpu" {
  cluster_name           = aws_eks_cluster.this.name
  node_group_name_prefix = "gpu-"
  node_role_arn          = aws_iam_role.node.arn
  subnet_ids             = var.private_subnet_ids
  version                = aws_eks_cluster.this.version
  # The EKS AL2023 NVIDIA AMI ships the NVIDIA driver and container toolkit; the NVIDIA device
  # plugin (installed in-cluster by the platform layer, tolerating the taint below) then
  # advertises nvidia.com/gpu. Its driver is what the trainer image needs: docker/trainer.Dockerfile
  # is CUDA 13.0, whose NVIDIA_REQUIRE_CUDA refuses drivers older than R580, and the AL2023
  # accelerated AMIs carry the R580 driver (EKS user guide, "Use EKS-optimized accelerated AMIs
  # for GPU instances": "currently include NVIDIA driver version 580"; rolled out to every
  # Kubernetes version per awslabs/amazon-eks-ami#2470 and #2509). Check the AMI release notes
  # before changing the trainer's CUDA major version.
  ami_type       = "AL2023_x86_64_NVIDIA"
  capacity_type  = var.gpu_capacity_type
  instance_types = var.gpu_instance_types

  # Scale from zero: GPU nodes exist only while GPU step pods are pending or running.
  scaling_config {
    min_size     = 0
    desired_size = 0
    max_size     = var.gpu_max_nodes
  }

  update_config {
    max_unavailable = 1
  }

  launch_template {
    id      = aws_launch_template.node["gpu"].id
    version = aws_launch_template.node["gpu"].latest_version
  }

  # The app's GPU steps select these nodes with orchestration.k8s.gpu_node_selector and
  # tolerate the taint with orchestration.k8s.gpu_tolerations (configs/schema.py K8sConfig);
  # the taint keeps every other pod off the expensive nodes so they can scale back to zero.
  # k8s.amazonaws.com/accelerator is the label the cluster autoscaler's AWS provider reads to know
  # a node is a GPU node: on a new node whose device plugin has not yet advertised nvidia.com/gpu
  # it then waits, instead of adding a second node for the same pending pod.
  labels = {
    "flywheel/node-pool"            = "gpu"
    "k8s.amazonaws.com/accelerator" = var.gpu_accelerator
  }

  taint {
    key    = "nvidia.com/gpu"
    value  = "present"
    effect = "NO_SCHEDULE"
  }

  tags = merge(var.tags, local.autoscaler_discovery_tags, local.gpu_node_template_tags)

  lifecycle {
    create_before_destroy = true
    ignore_changes        = [scaling_config[0].desired_size]
  }

  depends_on = [aws_iam_role_policy_attachment.node]
}

# The sandbox service (verifiers/sandbox_service.py, rendered by pipelines/k8s_manifests.py) runs
# policy-written code in bubblewrap, which needs root and CAP_SYS_ADMIN in its pod
# (docs/sandbox.md): it gets nodes of its own, so a compromised service holds nothing of the
# training nodes, the Dagster services or their credentials. The service selects the label and
# tolerates the taint; the taint keeps every other pod off.
resource "aws_eks_node_group" "sandbox" {
  cluster_name           = aws_eks_cluster.this.name
  node_group_name_prefix = "sandbox-"
  node_role_arn          = aws_iam_role.node.arn
  subnet_ids             = var.private_subnet_ids
  version                = aws_eks_cluster.this.version
  ami_type               = "AL2023_x86_64_STANDARD"
  capacity_type          = "ON_DEMAND"
  instance_types         = var.sandbox_instance_types

  # Always one node: every rollout step with tools calls the service, and a node added on demand
  # would stall the first round for minutes. The autoscaler adds nodes as the service's
  # HorizontalPodAutoscaler adds replicas.
  scaling_config {
    min_size     = 1
    desired_size = 1
    max_size     = var.sandbox_max_nodes
  }

  update_config {
    max_unavailable = 1
  }

  launch_template {
    id      = aws_launch_template.node["sandbox"].id
    version = aws_launch_template.node["sandbox"].latest_version
  }

  labels = {
    "flywheel/node-pool" = "sandbox"
  }

  taint {
    key    = "flywheel/sandbox"
    value  = "present"
    effect = "NO_SCHEDULE"
  }

  tags = merge(var.tags, local.autoscaler_discovery_tags, local.sandbox_node_template_tags)

  lifecycle {
    create_before_destroy = true
    ignore_changes        = [scaling_config[0].desired_size]
  }

  depends_on = [aws_iam_role_policy_attachment.node]
}

resource "aws_autoscaling_group_tag" "node_groups" {
  for_each = local.asg_tags

  autoscaling_group_name = {
    cpu     = aws_eks_node_group.cpu.resources[0].autoscaling_groups[0].name
    gpu     = aws_eks_node_group.gpu.resources[0].autoscaling_groups[0].name
    sandbox = aws_eks_node_group.sandbox.resources[0].autoscaling_groups[0].name
  }[each.value.node_group]

  tag {
    key   = each.value.key
    value = each.value.value
    # Only the autoscaler reads these, on the group; instances need not carry them.
    propagate_at_launch = false
  }
}

# --- Add-ons -------------------------------------------------------------------------------------

# The VPC CNI as a managed add-on with its network policy agent on. Without the agent the API
# accepts NetworkPolicies and nothing enforces them, and the sandbox service's policy (ingress from
# the step and training pods only, no egress: pipelines/k8s_manifests.py) would be a no-op.
# OVERWRITE adopts the self-managed copy EKS installs with every cluster. No addon_version: EKS
# picks the default for the cluster's Kubernetes version, and a pin here would go stale with it.
resource "aws_eks_addon" "vpc_cni" {
  cluster_name                = aws_eks_cluster.this.name
  addon_name                  = "vpc-cni"
  configuration_values        = jsonencode({ enableNetworkPolicy = "true" })
  resolve_conflicts_on_create = "OVERWRITE"
  resolve_conflicts_on_update = "OVERWRITE"

  tags = var.tags
}

# Resource metrics, which the sandbox service's HorizontalPodAutoscaler scales on (CPU
# utilization); EKS does not install metrics-server by itself.
resource "aws_eks_addon" "metrics_server" {
  cluster_name                = aws_eks_cluster.this.name
  addon_name                  = "metrics-server"
  resolve_conflicts_on_create = "OVERWRITE"
  resolve_conflicts_on_update = "OVERWRITE"

  tags = var.tags

  # Its pods need a node before the add-on becomes ACTIVE (they run on the untainted cpu nodes).
  depends_on = [aws_eks_node_group.cpu]
}
