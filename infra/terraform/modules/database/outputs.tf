output "endpoint" {
  description = "Host name of the instance (DAGSTER_PG_HOST, and the host of MLflow's backend store URI)."
  value       = aws_db_instance.this.address
}

output "port" {
  description = "PostgreSQL port."
  value       = aws_db_instance.this.port
}

output "master_user_secret_arn" {
  description = "ARN of the Secrets Manager secret (JSON with username and password) RDS manages for the master user."
  value       = aws_db_instance.this.master_user_secret[0].secret_arn
}

output "master_username" {
  description = "Master user name (also in the master secret)."
  value       = aws_db_instance.this.username
}

output "dagster_database_name" {
  description = "Database of Dagster's instance storage (DAGSTER_PG_DB), created with the instance."
  value       = aws_db_instance.this.db_name
}

output "mlflow_database_name" {
  description = "Database of MLflow's backend store; the deploy step creates it on this instance."
  value       = var.mlflow_db_name
}

output "security_group_id" {
  description = "Security group of the instance (ingress on 5432 from allowed_security_group_ids only)."
  value       = aws_security_group.this.id
}

output "kms_key_arn" {
  description = "KMS key encrypting the instance, its snapshots, Performance Insights and the master secret; readers of the secret need kms:Decrypt on it."
  value       = aws_kms_key.this.arn
}

output "resource_id" {
  description = "Resource id of the instance, the part of rds-db:connect ARNs that IAM database authentication policies name."
  value       = aws_db_instance.this.resource_id
}

output "engine_version_actual" {
  description = "PostgreSQL version running now; differs from engine_version after an automatic minor upgrade."
  value       = aws_db_instance.this.engine_version_actual
}
