variable "bucket_name" {
  description = "Name of the artifact bucket (datasets, checkpoints, MLflow artifacts), e.g. agentic-flywheel-artifacts."
  type        = string

  # Dots are legal in S3 names but rejected here: the bucket policy forces TLS, and a dotted name
  # does not match the *.s3.<region>.amazonaws.com certificate under virtual-hosted addressing,
  # which s3fs/boto3 use by default.
  validation {
    condition     = length(var.bucket_name) >= 3 && length(var.bucket_name) <= 63 && can(regex("^[a-z0-9][a-z0-9-]*[a-z0-9]$", var.bucket_name))
    error_message = "bucket_name must be 3-63 characters of lowercase letters, digits and hyphens, starting and ending with a letter or digit (no dots: they break TLS with virtual-hosted addressing)."
  }

  validation {
    condition = !(
      startswith(var.bucket_name, "xn--") || startswith(var.bucket_name, "sthree-") || startswith(var.bucket_name, "amzn-s3-demo-") ||
      endswith(var.bucket_name, "-s3alias") || endswith(var.bucket_name, "--ol-s3") || endswith(var.bucket_name, "--x-s3") || endswith(var.bucket_name, "--table-s3")
    )
    error_message = "bucket_name uses a prefix (xn--, sthree-, amzn-s3-demo-) or suffix (-s3alias, --ol-s3, --x-s3, --table-s3) that S3 reserves."
  }
}

variable "artifact_prefix" {
  description = "Key prefix under which the platform writes (storage.root is s3://<bucket>/<artifact_prefix>), without leading or trailing slash."
  type        = string
  default     = "flywheel"

  validation {
    condition     = can(regex("^[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)*$", var.artifact_prefix))
    error_message = "artifact_prefix must be non-empty path segments of letters, digits, '_', '.', '-' separated by single slashes, with no leading or trailing slash."
  }
}

variable "force_destroy" {
  description = "Let `terraform destroy` delete a non-empty bucket. Keep false outside throwaway environments: the bucket holds every checkpoint and dataset."
  type        = bool
  default     = false
  nullable    = false
}

variable "noncurrent_version_expiration_days" {
  description = "Days an overwritten or deleted object version is kept (the undo window for an accidental overwrite) before it expires."
  type        = number
  default     = 30

  validation {
    condition     = var.noncurrent_version_expiration_days >= 1 && floor(var.noncurrent_version_expiration_days) == var.noncurrent_version_expiration_days
    error_message = "noncurrent_version_expiration_days must be a whole number of days, at least 1."
  }
}

variable "abort_incomplete_multipart_upload_days" {
  description = "Days after which unfinished multipart uploads (interrupted checkpoint or Parquet writes) are aborted so their parts stop being billed."
  type        = number
  default     = 7

  validation {
    condition     = var.abort_incomplete_multipart_upload_days >= 1 && floor(var.abort_incomplete_multipart_upload_days) == var.abort_incomplete_multipart_upload_days
    error_message = "abort_incomplete_multipart_upload_days must be a whole number of days, at least 1."
  }
}

variable "infrequent_access_prefixes" {
  description = "Key prefixes, relative to artifact_prefix, whose objects move to STANDARD_IA after infrequent_access_transition_days (old checkpoints are rarely read again)."
  type        = list(string)
  default     = ["checkpoints/"]
  nullable    = false

  validation {
    condition     = alltrue([for p in var.infrequent_access_prefixes : can(regex("^[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)*/$", p))])
    error_message = "Each infrequent_access_prefixes entry must be a relative key prefix ending in '/', e.g. \"checkpoints/\"."
  }

  validation {
    condition     = length(distinct(var.infrequent_access_prefixes)) == length(var.infrequent_access_prefixes)
    error_message = "infrequent_access_prefixes must not repeat a prefix (each becomes a lifecycle rule with an id derived from it)."
  }
}

variable "infrequent_access_transition_days" {
  description = "Days after creation at which objects under infrequent_access_prefixes transition to STANDARD_IA."
  type        = number
  default     = 30

  # S3 refuses a STANDARD_IA transition earlier than 30 days after creation.
  validation {
    condition     = var.infrequent_access_transition_days >= 30 && floor(var.infrequent_access_transition_days) == var.infrequent_access_transition_days
    error_message = "infrequent_access_transition_days must be a whole number of at least 30 (the S3 minimum for STANDARD_IA)."
  }
}

variable "access_log_bucket" {
  description = <<-EOT
    Existing bucket that receives S3 server access logs for this bucket; null disables access logging.
    Optional because the target must already exist in the same account and region, must not be this
    bucket (each log delivery would itself be logged), and must use SSE-S3 rather than SSE-KMS, so it
    is normally a shared logging bucket owned by another stack. CloudTrail data events are the
    alternative where one already records S3 access.
  EOT
  type        = string
  default     = null

  validation {
    condition     = var.access_log_bucket == null || can(regex("^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$", var.access_log_bucket))
    error_message = "access_log_bucket must be null or a valid S3 bucket name."
  }
}

variable "access_log_prefix" {
  description = "Key prefix of this bucket's access logs in access_log_bucket; null: s3-access-logs/<bucket_name>/."
  type        = string
  default     = null

  validation {
    condition     = var.access_log_prefix == null || can(regex("^([A-Za-z0-9_.-]+/)+$", var.access_log_prefix))
    error_message = "access_log_prefix must be null or a key prefix ending in '/'."
  }
}

variable "tags" {
  description = "Tags added to every resource of the module."
  type        = map(string)
  default     = {}
  nullable    = false
}
