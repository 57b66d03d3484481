output "bucket_name" {
  description = "Name of the artifact bucket."
  value       = aws_s3_bucket.this.id
}

output "bucket_arn" {
  description = "ARN of the artifact bucket (input of the irsa module)."
  value       = aws_s3_bucket.this.arn
}

output "kms_key_arn" {
  description = "ARN of the KMS key encrypting the bucket; readers and writers need kms:Decrypt/Encrypt/GenerateDataKey on it."
  value       = aws_kms_key.this.arn
}

output "artifact_root" {
  description = "storage.root of the cluster profile: s3://<bucket>/<artifact_prefix>."
  value       = "s3://${aws_s3_bucket.this.id}/${var.artifact_prefix}"

  # Consumers of the root (the Helm release's env) wait until objects written there are encrypted
  # with the module's key and the bucket is TLS-only and private.
  depends_on = [
    aws_s3_bucket_server_side_encryption_configuration.this,
    aws_s3_bucket_policy.this,
    aws_s3_bucket_public_access_block.this,
  ]
}
