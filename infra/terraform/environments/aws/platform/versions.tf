terraform {
  required_version = ">= 1.6"

  required_providers {
    aws = {
      source  = "hashicorp/aws"
      version = "~> 5.0"
    }
    # The same majors as modules/platform requires: kubernetes 3.x, and helm 3.x, whose provider
    # block takes `kubernetes = { ... }` as an attribute (providers.tf).
    kubernetes = {
      source  = "hashicorp/kubernetes"
      version = "~> 3.0"
    }
    helm = {
      source  = "hashicorp/helm"
      version = "~> 3.0"
    }
    # The sandbox service's token (main.tf).
    random = {
      source  = "hashicorp/random"
      version = "~> 3.6"
    }
  }

  # This layer's state holds the database master password: the Kubernetes Secrets it writes and
  # the Secrets Manager value it reads both land in it in clear. Local state (terraform.tfstate
  # here) is fine only on an encrypted disk of a trusted machine; for anything shared, copy
  # backend.tf.example to backend.tf (S3, encrypted with a KMS key, access limited to the people
  # and roles that apply this layer) before the first apply.
}
