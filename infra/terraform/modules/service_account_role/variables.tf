variable "role_name" {
  description = "Name of the IAM role, e.g. flywheel-cluster-autoscaler."
  type        = string

  validation {
    condition     = can(regex("^[A-Za-z0-9+=,.@_-]{1,64}$", var.role_name))
    error_message = "role_name must be 1-64 characters of letters, digits and +=,.@_-."
  }
}

variable "oidc_provider_arn" {
  description = "ARN of the EKS cluster's IAM OIDC provider (arn:aws:iam::<account>:oidc-provider/<url>)."
  type        = string

  validation {
    condition     = can(regex("^arn:aws[a-z-]*:iam::[0-9]{12}:oidc-provider/[^*]+$", var.oidc_provider_arn))
    error_message = "oidc_provider_arn must be an IAM OIDC provider ARN (arn:aws:iam::<account>:oidc-provider/...)."
  }
}

variable "oidc_provider_url" {
  description = "Issuer URL of the EKS cluster's OIDC provider without https://; it prefixes the trust policy's condition keys."
  type        = string

  validation {
    condition     = can(regex("^[a-z0-9.-]+(/[A-Za-z0-9._-]+)*$", var.oidc_provider_url))
    error_message = "oidc_provider_url must be a host name with an optional path, without a scheme (no https://) or trailing slash."
  }
}

variable "namespace" {
  description = "Kubernetes namespace of the service account allowed to assume the role, e.g. kube-system."
  type        = string

  validation {
    condition     = length(var.namespace) <= 63 && can(regex("^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", var.namespace))
    error_message = "namespace must be a Kubernetes namespace name (RFC 1123 label)."
  }
}

variable "service_account" {
  description = "Kubernetes service account allowed to assume the role, e.g. cluster-autoscaler."
  type        = string

  # Also keeps wildcards out of the trust policy's sub condition.
  validation {
    condition     = length(var.service_account) <= 253 && can(regex("^[a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*$", var.service_account))
    error_message = "service_account must be a Kubernetes service account name (RFC 1123 subdomain)."
  }
}

variable "policy_name" {
  description = "Name of the role's inline policy, saying what it allows, e.g. scale-node-groups."
  type        = string

  validation {
    condition     = can(regex("^[A-Za-z0-9+=,.@_-]{1,128}$", var.policy_name))
    error_message = "policy_name must be 1-128 characters of letters, digits and +=,.@_-."
  }
}

variable "policy_json" {
  description = "The role's permissions: an IAM policy document in JSON, normally an aws_iam_policy_document's json attribute."
  type        = string

  validation {
    condition     = can(jsondecode(var.policy_json).Statement)
    error_message = "policy_json must be an IAM policy document (JSON with a Statement)."
  }
}

variable "permissions_boundary_arn" {
  description = "ARN of a permissions boundary policy to attach to the role, where the account requires one; null: none."
  type        = string
  default     = null

  validation {
    condition     = var.permissions_boundary_arn == null || can(regex("^arn:aws[a-z-]*:iam::([0-9]{12}|aws):policy/.+$", var.permissions_boundary_arn))
    error_message = "permissions_boundary_arn must be null or an IAM policy ARN."
  }
}

variable "tags" {
  description = "Tags added to every resource of the module."
  type        = map(string)
  default     = {}
  nullable    = false
}
