# The platform layer on AWS: modules/platform wired to what the infra layer (../infra) created,
# plus the AWS-only cluster autoscaler (autoscaler.tf). Apply it after the infra layer, from a
# machine that can reach the cluster's API (README.md).

data "terraform_remote_state" "infra" {
  backend = var.infra_state_backend
  config  = var.infra_state_config
}

locals {
  infra = data.terraform_remote_state.infra.outputs

  db_master = jsondecode(data.aws_secretsmanager_secret_version.db_master.secret_string)
}

data "aws_eks_cluster" "this" {
  name = local.infra.cluster_name
}

# The master password RDS manages. RDS rotates it (every 7 days by default), and the copies this
# layer writes into Kubernetes Secrets do not follow by themselves: re-apply this layer after each
# rotation (a scheduled CI job), which rewrites the Secrets and, through credentials_revision,
# restarts the Dagster and MLflow pods. Until then new connections fail with the old password.
# The infra layer's db_secret_reader role is there for an in-cluster alternative (an External
# Secrets Operator syncing this secret). Whatever is read here is stored in this layer's state,
# in clear: its backend must be encrypted and access-controlled (backend.tf.example).
data "aws_secretsmanager_secret_version" "db_master" {
  secret_id = local.infra.db_master_user_secret_arn
}

# The sandbox service's token: generated once and kept in this layer's state, like the database
# password it reads. Rotate it with `terraform apply -replace=random_password.sandbox_token`, then
# restart the service (`kubectl -n flywheel rollout restart deployment/flywheel-sandbox`); the
# step and training pods read it from flywheel-env when they start.
resource "random_password" "sandbox_token" {
  length  = 48
  special = false # it travels in an HTTP header
}

module "platform" {
  source = "../../../modules/platform"

  namespace = local.infra.namespace
  # The infra layer's contract with the app; FLYWHEEL_IMAGE is the Dagster image's one source.
  env           = local.infra.flywheel_env
  dagster_image = local.infra.flywheel_env["FLYWHEEL_IMAGE"]
  artifact_root = local.infra.artifact_root

  db_host               = local.infra.db_endpoint
  db_port               = local.infra.db_port
  db_username           = local.db_master.username
  db_password           = local.db_master.password
  dagster_database_name = local.infra.dagster_database_name
  mlflow_database_name  = local.infra.mlflow_database_name
  credentials_revision  = data.aws_secretsmanager_secret_version.db_master.version_id
  sandbox_token         = random_password.sandbox_token.result

  # The names the infra layer's IRSA roles trust (their sub condition), annotated with those
  # roles: eks.amazonaws.com/role-arn is how EKS hands a pod its service account's role.
  runner_service_account             = local.infra.runner_service_account
  runner_service_account_annotations = { "eks.amazonaws.com/role-arn" = local.infra.runner_role_arn }
  mlflow_service_account             = local.infra.mlflow_service_account
  mlflow_service_account_annotations = { "eks.amazonaws.com/role-arn" = local.infra.mlflow_role_arn }

  max_concurrent_runs = var.max_concurrent_runs
  gpu_pool_limit      = var.gpu_pool_limit
}

# The MLflow server's role may use only the infra layer's MLflow prefix; a server storing
# artifacts anywhere else would fail on its first upload.
check "mlflow_artifacts_under_the_mlflow_role_prefix" {
  assert {
    condition     = module.platform.mlflow_artifacts_destination == local.infra.mlflow_artifact_root
    error_message = "MLflow stores artifacts under ${module.platform.mlflow_artifacts_destination}, but its IAM role covers ${local.infra.mlflow_artifact_root}."
  }
}
