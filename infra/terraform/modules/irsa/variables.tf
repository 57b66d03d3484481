variable "role_name" {
  description = "Name of the IAM role, e.g. flywheel-runner (step pods) or flywheel-mlflow (the MLflow server)."
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
  description = "Issuer URL of the EKS cluster's OIDC provider without https://, e.g. oidc.eks.eu-west-1.amazonaws.com/id/ABC123; it prefixes the trust policy's condition keys."
  type        = string

  validation {
    condition     = can(regex("^[a-z0-9.-]+(/[A-Za-z0-9._-]+)*$", var.oidc_provider_url))
    error_message = "oidc_provider_url must be a host name with an optional path, without a scheme (no https://) or trailing slash."
  }
}

variable "namespace" {
  description = "Kubernetes namespace of the service account allowed to assume the role (orchestration.k8s.namespace: flywheel)."
  type        = string

  validation {
    condition     = length(var.namespace) <= 63 && can(regex("^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", var.namespace))
    error_message = "namespace must be a Kubernetes namespace name (RFC 1123 label)."
  }
}

variable "service_account" {
  description = "Kubernetes service account allowed to assume the role, e.g. flywheel-runner (orchestration.k8s.service_account) or the MLflow server's."
  type        = string

  # Also keeps wildcards out of the trust policy's sub condition.
  validation {
    condition     = length(var.service_account) <= 253 && can(regex("^[a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*$", var.service_account))
    error_message = "service_account must be a Kubernetes service account name (RFC 1123 subdomain)."
  }
}

variable "bucket_arn" {
  description = "ARN of the artifact bucket (bucket_arn output of the storage module)."
  type        = string

  validation {
    condition     = can(regex("^arn:aws[a-z-]*:s3:::[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$", var.bucket_arn))
    error_message = "bucket_arn must be an S3 bucket ARN (arn:aws:s3:::<bucket>), without an object path or wildcard."
  }
}

variable "bucket_prefixes" {
  description = "Key prefixes (no leading or trailing slash) the role may list, read, write and delete under, e.g. [\"flywheel\"] for the step pods or [\"flywheel/mlflow\"] for MLflow."
  type        = list(string)

  validation {
    condition     = length(var.bucket_prefixes) >= 1 && alltrue([for p in var.bucket_prefixes : can(regex("^[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)*$", p))])
    error_message = "bucket_prefixes must hold at least one prefix of path segments (letters, digits, '_', '.', '-') with no leading or trailing slash and no wildcard."
  }
}

variable "kms_key_arn" {
  description = "ARN of the KMS key encrypting the bucket (kms_key_arn output of the storage module)."
  type        = string

  validation {
    condition     = can(regex("^arn:aws[a-z-]*:kms:[a-z0-9-]+:[0-9]{12}:key/[0-9a-f-]+$", var.kms_key_arn))
    error_message = "kms_key_arn must be a KMS key ARN (arn:aws:kms:<region>:<account>:key/<id>), not an alias."
  }
}

variable "secret_arn" {
  description = "ARN of one Secrets Manager secret the role may read (the database module's master_user_secret_arn, for pods that fill the Postgres settings); null: no secret access."
  type        = string
  default     = null

  validation {
    condition     = var.secret_arn == null || can(regex("^arn:aws[a-z-]*:secretsmanager:[a-z0-9-]+:[0-9]{12}:secret:[^*?]+$", var.secret_arn))
    error_message = "secret_arn must be null or the full ARN of one Secrets Manager secret (no wildcards)."
  }
}

variable "secret_kms_key_arn" {
  description = "ARN of the customer-managed KMS key encrypting secret_arn (the database module's kms_key_arn); null when the secret uses aws/secretsmanager."
  type        = string
  default     = null

  validation {
    condition     = var.secret_kms_key_arn == null || can(regex("^arn:aws[a-z-]*:kms:[a-z0-9-]+:[0-9]{12}:key/[0-9a-f-]+$", var.secret_kms_key_arn))
    error_message = "secret_kms_key_arn must be null or a KMS key ARN (arn:aws:kms:<region>:<account>:key/<id>)."
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
