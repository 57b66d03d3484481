terraform {
  # 1.6: the modules' validation and precondition semantics. The S3 backend's native locking in
  # backend.tf.example (use_lockfile) needs 1.10.
  required_version = ">= 1.6"

  # The AWS provider only: this layer creates the cluster, so no kubernetes/helm provider can be
  # configured in the same run (it would need the cluster's endpoint before it exists). The
  # in-cluster releases are the platform layer (../platform), which reads this layer's outputs.
  required_providers {
    aws = {
      source  = "hashicorp/aws"
      version = "~> 5.0"
    }
  }

  # State is local (terraform.tfstate here) unless a backend.tf is added: copy
  # backend.tf.example for a shared S3 backend with locking before the first apply.
}
