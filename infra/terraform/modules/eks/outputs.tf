output "cluster_name" {
  description = "Name of the EKS cluster (for aws eks update-kubeconfig and the cluster autoscaler's discovery tag)."
  value       = aws_eks_cluster.this.name
}

output "cluster_arn" {
  description = "ARN of the EKS cluster."
  value       = aws_eks_cluster.this.arn
}

output "cluster_version" {
  description = "Kubernetes version of the control plane."
  value       = aws_eks_cluster.this.version
}

output "cluster_endpoint" {
  description = "URL of the Kubernetes API server."
  value       = aws_eks_cluster.this.endpoint
}

output "cluster_certificate_authority_data" {
  description = "Base64-encoded CA certificate of the API server, for kubeconfig and the kubernetes/helm providers."
  value       = aws_eks_cluster.this.certificate_authority[0].data
}

output "oidc_provider_arn" {
  description = "ARN of the IAM OIDC provider, the Federated principal in IRSA role trust policies."
  value       = aws_iam_openid_connect_provider.this.arn
}

output "oidc_provider_url" {
  description = "Issuer of the cluster's service account tokens without https://, as IRSA trust policy condition keys expect (<url>:sub, <url>:aud)."
  value       = replace(aws_eks_cluster.this.identity[0].oidc[0].issuer, "https://", "")
}

output "cluster_security_group_id" {
  description = "Security group EKS created for the control plane and attached to the managed nodes."
  value       = aws_eks_cluster.this.vpc_config[0].cluster_security_group_id
}

output "node_security_group_id" {
  description = "Security group of the nodes. The launch templates name none, so EKS gives the nodes the cluster security group: the same ID as cluster_security_group_id, exposed separately so callers (e.g. a database's ingress rule) need not know that."
  value       = aws_eks_cluster.this.vpc_config[0].cluster_security_group_id
}

output "node_role_arn" {
  description = "ARN of the IAM role of the node groups."
  value       = aws_iam_role.node.arn
}

output "cpu_node_group_name" {
  description = "Name of the cpu node group."
  value       = aws_eks_node_group.cpu.node_group_name
}

output "gpu_node_group_name" {
  description = "Name of the gpu node group."
  value       = aws_eks_node_group.gpu.node_group_name
}

output "sandbox_node_group_name" {
  description = "Name of the sandbox node group."
  value       = aws_eks_node_group.sandbox.node_group_name
}

output "secrets_kms_key_arn" {
  description = "ARN of the KMS key encrypting Kubernetes Secrets."
  value       = aws_kms_key.secrets.arn
}
