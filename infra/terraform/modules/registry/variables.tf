variable "name_prefix" {
  description = "Prefix of the repository names (<prefix>-<repository>, e.g. flywheel-trainer as in docker/README.md) and of the KMS alias."
  type        = string
  default     = "flywheel"

  # ECR repository names are lowercase; the prefix is joined to each name with a hyphen.
  validation {
    condition     = can(regex("^[a-z][a-z0-9-]{0,38}[a-z0-9]$", var.name_prefix)) && !strcontains(var.name_prefix, "--")
    error_message = "name_prefix must be 2-40 lowercase letters, digits and single hyphens, starting with a letter and ending with a letter or digit."
  }
}

variable "repositories" {
  description = "Repositories to create, by image name: trainer (docker/trainer.Dockerfile), dagster (docker/dagster.Dockerfile), sandbox (docker/sandbox.Dockerfile)."
  type        = list(string)
  default     = ["trainer", "dagster", "sandbox"]
  nullable    = false

  validation {
    condition     = length(var.repositories) >= 1 && alltrue([for r in var.repositories : can(regex("^[a-z0-9]+([._-][a-z0-9]+)*$", r))])
    error_message = "repositories must hold at least one name of lowercase letters and digits, optionally separated by single '.', '_' or '-'."
  }

  validation {
    condition     = length(distinct(var.repositories)) == length(var.repositories)
    error_message = "repositories must not repeat a name."
  }
}

variable "keep_images" {
  description = "Tagged images each repository keeps; older ones are expired by the lifecycle policy. Enough to roll back a few releases: the trainer image is several GB, stored per repository."
  type        = number
  default     = 30

  validation {
    condition     = var.keep_images >= 1 && var.keep_images <= 10000 && floor(var.keep_images) == var.keep_images
    error_message = "keep_images must be a whole number between 1 and 10000."
  }
}

variable "force_delete" {
  description = "Let `terraform destroy` delete repositories that still hold images. Keep false outside throwaway environments."
  type        = bool
  default     = false
  nullable    = false
}

variable "tags" {
  description = "Tags added to every resource of the module."
  type        = map(string)
  default     = {}
  nullable    = false
}
