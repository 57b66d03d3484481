output "namespace" {
  description = "Namespace of Dagster, MLflow and the step pods."
  value       = kubernetes_namespace_v1.this.metadata[0].name
}

output "runner_service_account" {
  description = "Service account of the Dagster, run, step and Pipes pods (orchestration.k8s.service_account)."
  value       = kubernetes_service_account_v1.runner.metadata[0].name
}

output "env_secret_name" {
  description = "Secret holding the app's environment and DAGSTER_PG_PASSWORD (orchestration.k8s.env_secret)."
  value       = kubernetes_secret_v1.flywheel_env.metadata[0].name
}

output "dagster_instance_config_map" {
  description = "ConfigMap of the Dagster instance (dagster.yaml) the chart renders; pipelines/instance.py names it INSTANCE_CONFIG_MAP."
  value       = "${helm_release.dagster.name}-instance"
}

output "dagster_webserver_service" {
  description = "ClusterIP Service of the Dagster webserver."
  value       = local.dagster_webserver_service
}

output "dagster_webserver_port" {
  description = "Port of the Dagster webserver Service."
  value       = local.dagster_webserver_port
}

output "dagster_port_forward_command" {
  description = "Command that makes the Dagster UI reachable at http://localhost:<port> (the Service is cluster-internal)."
  value       = "kubectl -n ${kubernetes_namespace_v1.this.metadata[0].name} port-forward svc/${local.dagster_webserver_service} ${local.dagster_webserver_port}:${local.dagster_webserver_port}"
}

output "mlflow_tracking_uri" {
  description = "MLflow tracking URI inside the cluster (env MLFLOW_TRACKING_URI)."
  value       = local.mlflow_tracking_uri
}

output "mlflow_artifacts_destination" {
  description = "Where the MLflow server stores the artifacts it proxies: <artifact_root>/mlflow."
  value       = local.mlflow_artifacts_destination
}

output "mlflow_port_forward_command" {
  description = "Command that makes the MLflow UI reachable at http://localhost:<port> (the Service is cluster-internal)."
  value       = "kubectl -n ${kubernetes_namespace_v1.this.metadata[0].name} port-forward svc/${local.mlflow_service} ${local.mlflow_port}:${local.mlflow_port}"
}

output "cpu_node_selector" {
  description = "Node selector of the CPU nodes the platform's services run on, for cloud-specific releases placed beside them."
  value       = var.cpu_node_selector
}

output "sandbox_token_secret" {
  description = "Secret (key `token`) the sandbox service reads its shared secret from; pipelines/k8s_manifests.py renders the service with it."
  value       = kubernetes_secret_v1.sandbox_token.metadata[0].name
}
