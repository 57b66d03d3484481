# The AWS infrastructure of the app's `cluster` profile (configs/cluster.yaml): network, EKS with a
# cpu, a scale-from-zero gpu and a sandbox node group, the artifact bucket, PostgreSQL for Dagster
# and MLflow, the image repositories, and one IAM role per service account that needs AWS. Its outputs, and
# flywheel_env above all, are what the platform layer (../platform) deploys into the cluster.

data "aws_partition" "current" {}

data "aws_caller_identity" "current" {}

locals {
  # The MLflow server's Service, which the platform layer creates under this name and port; the
  # step pods reach it through cluster DNS.
  mlflow_service = "mlflow"
  mlflow_port    = 5000

  # The MLflow server stores run artifacts under its own prefix of the artifact root (it proxies
  # uploads, so clients need no S3 access for them); the step pods' role covers the whole root.
  mlflow_prefix = "${var.artifact_prefix}/mlflow"

  images = { for name, url in module.registry.repository_urls : name => "${url}:${var.image_tag}" }

  # THE contract with the app: env var -> value. The platform layer writes it into the Kubernetes
  # Secret `flywheel-env` (orchestration.k8s.env_secret), which every Dagster pod and step pod
  # gets as environment, and configs/cluster.yaml reads these variables. DAGSTER_PG_PASSWORD is
  # deliberately not here: RDS rotates it in Secrets Manager (db_master_user_secret_arn), so the
  # platform layer reads it from there.
  flywheel_env = {
    FLYWHEEL_PROFILE       = "cluster"
    FLYWHEEL_ARTIFACT_ROOT = module.storage.artifact_root
    FLYWHEEL_IMAGE         = local.images["dagster"]
    FLYWHEEL_TRAINER_IMAGE = local.images["trainer"]
    FLYWHEEL_SANDBOX_IMAGE = local.images["sandbox"]
    MLFLOW_TRACKING_URI    = "http://${local.mlflow_service}.${var.namespace}.svc.cluster.local:${local.mlflow_port}"
    DAGSTER_PG_HOST        = module.database.endpoint
    DAGSTER_PG_DB          = module.database.dagster_database_name
    DAGSTER_PG_USER        = module.database.master_username
    AWS_REGION             = var.region
  }
}

# --- Network and cluster -------------------------------------------------------------------------

module "network" {
  source = "../../../modules/network"

  cluster_name       = var.name
  vpc_cidr           = var.vpc_cidr
  az_count           = var.az_count
  single_nat_gateway = var.single_nat_gateway
}

module "eks" {
  source = "../../../modules/eks"

  cluster_name           = var.name
  kubernetes_version     = var.kubernetes_version
  private_subnet_ids     = module.network.private_subnet_ids
  endpoint_public_access = var.endpoint_public_access
  public_access_cidrs    = var.public_access_cidrs
  admin_principal_arns   = var.admin_principal_arns

  cpu_instance_types = var.cpu_instance_types
  gpu_instance_types = var.gpu_instance_types
  gpu_accelerator    = var.gpu_accelerator
  gpu_max_nodes      = var.gpu_max_nodes
  gpus_per_node      = var.gpus_per_node
  gpu_capacity_type  = var.gpu_capacity_type

  sandbox_instance_types = var.sandbox_instance_types
  sandbox_max_nodes      = var.sandbox_max_nodes
}

# Without an access entry for whoever runs Terraform, the platform layer's kubernetes and helm
# providers are refused by the API. A check, not a precondition: CI may apply as a role that is
# not an admin on purpose, so this warns instead of failing the plan.
check "caller_is_a_cluster_admin" {
  data "aws_iam_session_context" "caller" {
    arn = data.aws_caller_identity.current.arn
  }

  assert {
    condition     = contains(var.admin_principal_arns, data.aws_iam_session_context.caller.issuer_arn)
    error_message = "The identity running Terraform (${data.aws_iam_session_context.caller.issuer_arn}) is not in admin_principal_arns: it will not be able to reach the cluster's API, and neither will the platform layer run as it."
  }
}

# --- Data: artifacts, database, images -----------------------------------------------------------

module "storage" {
  source = "../../../modules/storage"

  bucket_name     = var.bucket_name
  artifact_prefix = var.artifact_prefix
  force_destroy   = var.bucket_force_destroy
}

module "database" {
  source = "../../../modules/database"

  identifier         = "${var.name}-postgres"
  instance_class     = var.db_instance_class
  multi_az           = var.db_multi_az
  vpc_id             = module.network.vpc_id
  private_subnet_ids = module.network.private_subnet_ids
  # Pods use their node's security group (no security groups for pods), so the nodes' group is
  # the one source allowed: Dagster, MLflow and the step pods all run on those nodes.
  allowed_security_group_ids = [module.eks.node_security_group_id]
  deletion_protection        = var.db_deletion_protection
}

module "registry" {
  source = "../../../modules/registry"

  name_prefix  = var.name
  repositories = ["trainer", "dagster", "sandbox"]
  keep_images  = var.ecr_keep_images
  force_delete = var.ecr_force_delete
}

# --- Roles of the service accounts (IRSA) --------------------------------------------------------

# The step pods (orchestration.k8s.service_account): read and write everything under the
# artifact root: datasets, checkpoints, rollouts.
module "runner_role" {
  source = "../../../modules/irsa"

  role_name         = "${var.name}-runner"
  oidc_provider_arn = module.eks.oidc_provider_arn
  oidc_provider_url = module.eks.oidc_provider_url
  namespace         = var.namespace
  service_account   = var.runner_service_account
  bucket_arn        = module.storage.bucket_arn
  bucket_prefixes   = [var.artifact_prefix]
  kms_key_arn       = module.storage.kms_key_arn
}

# The MLflow server: its artifact store only.
module "mlflow_role" {
  source = "../../../modules/irsa"

  role_name         = "${var.name}-mlflow"
  oidc_provider_arn = module.eks.oidc_provider_arn
  oidc_provider_url = module.eks.oidc_provider_url
  namespace         = var.namespace
  service_account   = var.mlflow_service_account
  bucket_arn        = module.storage.bucket_arn
  bucket_prefixes   = [local.mlflow_prefix]
  kms_key_arn       = module.storage.kms_key_arn
}

# The cluster autoscaler, with the policy of its AWS guide
# (kubernetes/autoscaler: cluster-autoscaler/cloudprovider/aws/README.md). The Describe calls
# take no resource-level permissions, so they are allowed on "*"; the two calls that change
# capacity work only on Auto Scaling groups tagged as owned by this cluster (the eks module puts
# that tag on both node groups' groups), so the role cannot resize or empty anything else.
data "aws_iam_policy_document" "cluster_autoscaler" {
  statement {
    sid    = "DescribeScalingState"
    effect = "Allow"
    actions = [
      "autoscaling:DescribeAutoScalingGroups",
      "autoscaling:DescribeAutoScalingInstances",
      "autoscaling:DescribeLaunchConfigurations",
      "autoscaling:DescribeScalingActivities",
      "autoscaling:DescribeTags",
      "ec2:DescribeImages",
      "ec2:DescribeInstanceTypes",
      "ec2:DescribeLaunchTemplateVersions",
      "ec2:GetInstanceTypesFromInstanceRequirements",
    ]
    resources = ["*"]
  }

  # Managed node groups' labels and taints, read for scale-from-zero templates.
  statement {
    sid       = "DescribeOwnNodeGroups"
    effect    = "Allow"
    actions   = ["eks:DescribeNodegroup"]
    resources = ["arn:${data.aws_partition.current.partition}:eks:${var.region}:${data.aws_caller_identity.current.account_id}:nodegroup/${module.eks.cluster_name}/*/*"]
  }

  statement {
    sid    = "ScaleOwnNodeGroups"
    effect = "Allow"
    actions = [
      "autoscaling:SetDesiredCapacity",
      "autoscaling:TerminateInstanceInAutoScalingGroup",
    ]
    resources = ["arn:${data.aws_partition.current.partition}:autoscaling:${var.region}:${data.aws_caller_identity.current.account_id}:autoScalingGroup:*:autoScalingGroupName/*"]

    condition {
      test     = "StringEquals"
      variable = "aws:ResourceTag/k8s.io/cluster-autoscaler/${module.eks.cluster_name}"
      values   = ["owned"]
    }
  }
}

module "autoscaler_role" {
  source = "../../../modules/service_account_role"

  role_name         = "${var.name}-cluster-autoscaler"
  oidc_provider_arn = module.eks.oidc_provider_arn
  oidc_provider_url = module.eks.oidc_provider_url
  namespace         = "kube-system"
  service_account   = "cluster-autoscaler"
  policy_name       = "scale-own-node-groups"
  policy_json       = data.aws_iam_policy_document.cluster_autoscaler.json
}

# RDS rotates the master password in Secrets Manager (every 7 days by default), so a copy made
# at deploy time goes stale. This role reads that one secret, for the in-cluster component that
# keeps DAGSTER_PG_PASSWORD and MLflow's backend-store password in step with it (an External
# Secrets Operator SecretStore authenticating as this service account, or a sync job).
data "aws_iam_policy_document" "db_secret_reader" {
  statement {
    sid       = "ReadDatabaseSecret"
    effect    = "Allow"
    actions   = ["secretsmanager:GetSecretValue", "secretsmanager:DescribeSecret"]
    resources = [module.database.master_user_secret_arn]
  }

  # The secret is encrypted with the database module's key; only Secrets Manager may use it on
  # the role's behalf.
  statement {
    sid       = "DecryptDatabaseSecret"
    effect    = "Allow"
    actions   = ["kms:Decrypt"]
    resources = [module.database.kms_key_arn]

    condition {
      test     = "StringEquals"
      variable = "kms:ViaService"
      values   = ["secretsmanager.${var.region}.${data.aws_partition.current.dns_suffix}"]
    }
  }
}

module "db_secret_reader_role" {
  source = "../../../modules/service_account_role"

  role_name         = "${var.name}-db-secret-reader"
  oidc_provider_arn = module.eks.oidc_provider_arn
  oidc_provider_url = module.eks.oidc_provider_url
  namespace         = var.namespace
  service_account   = var.db_secret_reader_service_account
  policy_name       = "read-database-secret"
  policy_json       = data.aws_iam_policy_document.db_secret_reader.json
}
