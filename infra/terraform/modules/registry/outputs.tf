output "repository_urls" {
  description = "Repository URL (<account>.dkr.ecr.<region>.amazonaws.com/<prefix>-<name>) by image name, e.g. repository_urls[\"trainer\"]."
  value       = { for name, repo in aws_ecr_repository.this : name => repo.repository_url }
}

output "repository_arns" {
  description = "Repository ARN by image name, for push policies of a CI role."
  value       = { for name, repo in aws_ecr_repository.this : name => repo.arn }
}

output "kms_key_arn" {
  description = "ARN of the KMS key encrypting the repositories."
  value       = aws_kms_key.this.arn
}
