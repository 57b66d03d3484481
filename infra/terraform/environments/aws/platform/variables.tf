# Everything about the cluster, the database, the images and the roles comes from the infra
# layer's state; these variables say where that state is and tune what is specific to this layer.

# --- Where the infra layer's state is ---------------------------------------------------------

variable "infra_state_backend" {
  description = "Backend of the infra layer's state (terraform_remote_state backend): local by default, s3 when ../infra uses its backend.tf.example."
  type        = string
  default     = "local"

  validation {
    condition     = contains(["local", "s3", "remote", "http", "kubernetes", "pg", "consul", "gcs", "azurerm"], var.infra_state_backend)
    error_message = "infra_state_backend must be a Terraform backend type such as local or s3."
  }
}

variable "infra_state_config" {
  description = "Configuration of that backend: {path = ...} for local (relative to this directory), {bucket, key, region} for s3 (the values in ../infra/backend.tf)."
  type        = map(string)
  default     = { path = "../infra/terraform.tfstate" }

  validation {
    condition     = length(var.infra_state_config) > 0
    error_message = "infra_state_config must configure the backend, e.g. {path = \"../infra/terraform.tfstate\"}."
  }
}

# --- Dagster instance (passed to modules/platform) ----------------------------------------------

variable "max_concurrent_runs" {
  description = "Runs the queued run coordinator lets run at once (orchestration.k8s.max_concurrent_runs)."
  type        = number
  default     = 4

  validation {
    condition     = var.max_concurrent_runs >= 1 && floor(var.max_concurrent_runs) == var.max_concurrent_runs
    error_message = "max_concurrent_runs must be a whole number of at least 1."
  }
}

variable "gpu_pool_limit" {
  description = "Steps in the `gpu` pool at once across all runs (orchestration.k8s.gpu_pool_limit): the infra layer's gpu_max_nodes times GPUs per node, so queued GPU steps wait for a slot instead of a node that can never come."
  type        = number
  default     = 4

  validation {
    condition     = var.gpu_pool_limit >= 1 && floor(var.gpu_pool_limit) == var.gpu_pool_limit
    error_message = "gpu_pool_limit must be a whole number of at least 1."
  }
}

# --- Cluster autoscaler -------------------------------------------------------------------------

variable "cluster_autoscaler_chart_version" {
  description = "Version of the cluster-autoscaler chart (https://kubernetes.github.io/autoscaler). 9.59.0 ships autoscaler 1.35; the image itself is chosen per cluster version from cluster_autoscaler_image_tags."
  type        = string
  default     = "9.59.0"

  validation {
    condition     = can(regex("^[0-9]+\\.[0-9]+\\.[0-9]+$", var.cluster_autoscaler_chart_version))
    error_message = "cluster_autoscaler_chart_version must be an exact version such as 9.59.0, not a range."
  }
}

variable "cluster_autoscaler_image_tags" {
  description = "Cluster autoscaler image tag by Kubernetes minor version. The autoscaler must be the cluster's minor (it simulates that version's scheduler); add a line before upgrading the cluster, or the plan fails."
  type        = map(string)
  default = {
    "1.34" = "v1.34.2"
    "1.35" = "v1.35.0"
  }

  validation {
    condition = length(var.cluster_autoscaler_image_tags) > 0 && alltrue([
      for minor, tag in var.cluster_autoscaler_image_tags :
      can(regex("^1\\.[0-9]+$", minor)) && can(regex("^v${replace(minor, ".", "\\.")}\\.[0-9]+$", tag))
    ])
    error_message = "cluster_autoscaler_image_tags must map minor versions such as \"1.35\" to tags of the same minor such as \"v1.35.0\"."
  }
}

variable "scale_down_unneeded_time" {
  description = "How long a node must be unneeded before the autoscaler removes it (its --scale-down-unneeded-time and --scale-down-delay-after-add). Shorter than the autoscaler's 10m default: an idle GPU node costs more per minute than restarting one costs in minutes."
  type        = string
  default     = "5m"

  validation {
    condition     = can(regex("^[0-9]+(s|m|h)$", var.scale_down_unneeded_time))
    error_message = "scale_down_unneeded_time must be a duration such as 5m, 300s or 1h."
  }
}
