# What the platform layer (../platform, through terraform_remote_state) and the operators read.
# flywheel_env is the contract with the app; the rest is what the in-cluster releases need to be
# configured (names, endpoints, role ARNs for service-account annotations).

output "flywheel_env" {
  description = "Environment of every Dagster and step pod, env var name -> value: the platform layer stores it in the Kubernetes Secret flywheel-env, and configs/cluster.yaml reads these variables. DAGSTER_PG_PASSWORD is not here: read it from db_master_user_secret_arn."
  value       = local.flywheel_env
}

output "region" {
  description = "AWS region of the environment."
  value       = var.region
}

output "cluster_name" {
  description = "Name of the EKS cluster (aws eks update-kubeconfig --name <cluster_name>; the cluster autoscaler's --node-group-auto-discovery tag)."
  value       = module.eks.cluster_name
}

output "cluster_endpoint" {
  description = "URL of the Kubernetes API server (host of the platform layer's kubernetes and helm providers)."
  value       = module.eks.cluster_endpoint
}

output "cluster_certificate_authority_data" {
  description = "Base64-encoded CA certificate of the API server (cluster_ca_certificate of the kubernetes and helm providers, after base64decode)."
  value       = module.eks.cluster_certificate_authority_data
}

output "kubernetes_version" {
  description = "Kubernetes minor version of the control plane: the cluster autoscaler's image must be the same minor."
  value       = module.eks.cluster_version
}

output "gpu_node_group_name" {
  description = "Name of the gpu node group."
  value       = module.eks.gpu_node_group_name
}

output "namespace" {
  description = "Namespace of Dagster, MLflow and the step pods (orchestration.k8s.namespace)."
  value       = var.namespace
}

output "artifact_root" {
  description = "The cluster profile's storage.root (FLYWHEEL_ARTIFACT_ROOT): s3://<bucket>/<artifact_prefix>."
  value       = module.storage.artifact_root
}

output "mlflow_artifact_root" {
  description = "Where the MLflow server stores run artifacts (its --artifacts-destination): s3://<bucket>/<artifact_prefix>/mlflow, the only prefix mlflow_role_arn may use."
  value       = "s3://${module.storage.bucket_name}/${local.mlflow_prefix}"
}

output "bucket_name" {
  description = "Name of the artifact bucket."
  value       = module.storage.bucket_name
}

output "db_endpoint" {
  description = "Host name of PostgreSQL, without port (DAGSTER_PG_HOST; the host of MLflow's backend-store URI)."
  value       = module.database.endpoint
}

output "db_port" {
  description = "Port of PostgreSQL."
  value       = module.database.port
}

output "db_master_username" {
  description = "User the app connects as (DAGSTER_PG_USER; also MLflow's backend-store user)."
  value       = module.database.master_username
}

output "db_master_user_secret_arn" {
  description = "Secrets Manager secret (JSON: username, password) that RDS manages and rotates for the master user: the source of DAGSTER_PG_PASSWORD and of MLflow's backend-store password."
  value       = module.database.master_user_secret_arn
}

output "dagster_database_name" {
  description = "Database of Dagster's instance storage (DAGSTER_PG_DB), created with the instance."
  value       = module.database.dagster_database_name
}

output "mlflow_database_name" {
  description = "Database of MLflow's backend store; the deploy step creates it (CREATE DATABASE) on first deploy."
  value       = module.database.mlflow_database_name
}

output "image_repositories" {
  description = "ECR repository URL by image: trainer, dagster, sandbox. docker/README.md pushes <url>:<image_tag> to them."
  value       = module.registry.repository_urls
}

output "image_tag" {
  description = "Tag of the images flywheel_env points at."
  value       = var.image_tag
}

output "runner_service_account" {
  description = "Service account of the step pods (orchestration.k8s.service_account); annotate it with runner_role_arn."
  value       = var.runner_service_account
}

output "runner_role_arn" {
  description = "IAM role of the step pods' service account (eks.amazonaws.com/role-arn annotation): the artifact root, nothing else."
  value       = module.runner_role.role_arn
}

output "mlflow_service_account" {
  description = "Service account to run the MLflow server as; annotate it with mlflow_role_arn."
  value       = var.mlflow_service_account
}

output "mlflow_role_arn" {
  description = "IAM role of the MLflow server's service account: the MLflow artifact prefix, nothing else."
  value       = module.mlflow_role.role_arn
}

output "autoscaler_role_arn" {
  description = "IAM role of the cluster autoscaler's service account kube-system/cluster-autoscaler: resize this cluster's node groups only."
  value       = module.autoscaler_role.role_arn
}

output "db_secret_reader_service_account" {
  description = "Service account (in namespace) allowed to read the database's master secret; annotate it with db_secret_reader_role_arn."
  value       = var.db_secret_reader_service_account
}

output "db_secret_reader_role_arn" {
  description = "IAM role that may read db_master_user_secret_arn (and decrypt it through Secrets Manager), for keeping the in-cluster copy of the rotated password current."
  value       = module.db_secret_reader_role.role_arn
}
