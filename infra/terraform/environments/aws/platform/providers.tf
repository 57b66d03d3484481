provider "aws" {
  region = local.infra.region
}

locals {
  # A fresh token from `aws eks get-token` on every call, as whoever runs Terraform (an access
  # entry in the infra layer's admin_principal_arns): a token fetched once at plan time would
  # expire (15 minutes) during the releases' waits.
  cluster_exec = {
    api_version = "client.authentication.k8s.io/v1beta1"
    command     = "aws"
    args        = ["eks", "get-token", "--cluster-name", data.aws_eks_cluster.this.name, "--region", local.infra.region]
  }
}

# The API endpoint is private by default (the eks module's endpoint_public_access): run this
# layer from inside the VPC (VPN, bastion, a CI runner there) or from an allow-listed network.
provider "kubernetes" {
  host                   = data.aws_eks_cluster.this.endpoint
  cluster_ca_certificate = base64decode(data.aws_eks_cluster.this.certificate_authority[0].data)

  exec {
    api_version = local.cluster_exec.api_version
    command     = local.cluster_exec.command
    args        = local.cluster_exec.args
  }
}

# helm 3.x: `kubernetes` and `exec` are attributes (2.x: nested blocks).
provider "helm" {
  kubernetes = {
    host                   = data.aws_eks_cluster.this.endpoint
    cluster_ca_certificate = base64decode(data.aws_eks_cluster.this.certificate_authority[0].data)
    exec                   = local.cluster_exec
  }
}
