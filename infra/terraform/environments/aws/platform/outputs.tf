output "namespace" {
  description = "Namespace of Dagster, MLflow and the step pods."
  value       = module.platform.namespace
}

output "update_kubeconfig_command" {
  description = "Command that adds the cluster to your kubeconfig (needed before the port-forward commands)."
  value       = "aws eks update-kubeconfig --region ${local.infra.region} --name ${data.aws_eks_cluster.this.name}"
}

output "dagster_webserver_service" {
  description = "ClusterIP Service of the Dagster webserver (not exposed outside the cluster)."
  value       = module.platform.dagster_webserver_service
}

output "dagster_port_forward_command" {
  description = "Run this, then open http://localhost:<port> for the Dagster UI."
  value       = module.platform.dagster_port_forward_command
}

output "mlflow_tracking_uri" {
  description = "MLflow tracking URI inside the cluster (MLFLOW_TRACKING_URI of the pods)."
  value       = module.platform.mlflow_tracking_uri
}

output "mlflow_port_forward_command" {
  description = "Run this, then open http://localhost:5000 for the MLflow UI (or set MLFLOW_TRACKING_URI=http://localhost:5000 locally)."
  value       = module.platform.mlflow_port_forward_command
}

output "cluster_autoscaler_image_tag" {
  description = "Cluster autoscaler image deployed, matching the cluster's Kubernetes minor version."
  value       = local.cluster_autoscaler_image_tag
}
