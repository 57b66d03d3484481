# Cloud-agnostic inputs: names, images, the app's environment, the database's address and
# credentials, and service-account annotations (IRSA role ARNs on EKS, workload identity elsewhere).
# Defaults that mirror the app's configuration (configs/schema.py K8sConfig) are checked against it
# by tests/test_terraform_platform.py.

# --- Where and what ---------------------------------------------------------------------------

variable "namespace" {
  description = "Namespace of Dagster, MLflow, the step pods and the Secret flywheel-env (orchestration.k8s.namespace)."
  type        = string
  default     = "flywheel"

  validation {
    condition     = length(var.namespace) <= 63 && can(regex("^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", var.namespace))
    error_message = "namespace must be a Kubernetes namespace name (RFC 1123 label)."
  }
}

variable "env" {
  description = <<-EOT
    The app's environment, env var name -> value (on AWS the infra layer's flywheel_env output):
    stored with DAGSTER_PG_PASSWORD in the Secret flywheel-env, which every Dagster pod and step
    pod gets. It must name the same database, image, artifact root and MLflow address as the other
    inputs; the Secret's preconditions compare them.
  EOT
  type        = map(string)

  validation {
    condition     = alltrue([for name in keys(var.env) : can(regex("^[A-Z_][A-Z0-9_]*$", name))])
    error_message = "env keys must be environment variable names (upper case letters, digits and underscores)."
  }

  # The password comes from db_password, which the caller reads from the secret store at apply
  # time; a second copy here would be a plain, unrotated value in the caller's configuration.
  validation {
    condition     = !contains(keys(var.env), "DAGSTER_PG_PASSWORD")
    error_message = "env must not contain DAGSTER_PG_PASSWORD: the module adds it from db_password."
  }

  validation {
    condition     = !contains(keys(var.env), "FLYWHEEL_SANDBOX_TOKEN")
    error_message = "env must not contain FLYWHEEL_SANDBOX_TOKEN: the module adds it from sandbox_token."
  }
}

variable "dagster_image" {
  description = "The Dagster user-code image (docker/dagster.Dockerfile) as repository:tag: the code server, the webserver, the daemon, run pods and CPU step pods. The same value as env FLYWHEEL_IMAGE."
  type        = string

  # A tag, not a digest: the chart builds image references as repository:tag. Never `latest`:
  # runs launched from one code-server image must all execute that same image.
  validation {
    condition     = can(regex("^[a-z0-9.-]+(:[0-9]+)?(/[a-z0-9._-]+)+:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$", var.dagster_image)) && !endswith(var.dagster_image, ":latest")
    error_message = "dagster_image must be registry/repository:tag with an explicit tag other than latest."
  }
}

variable "postgres_client_image" {
  description = "Image with psql and pg_isready, for the job that creates the MLflow database and the Dagster chart's wait-for-database init container. ECR Public's mirror of the Docker official image, pinned to the database's major version."
  type        = string
  default     = "public.ecr.aws/docker/library/postgres:16.4-alpine"

  validation {
    condition     = can(regex("^[a-z0-9.-]+(:[0-9]+)?(/[a-z0-9._-]+)+:[0-9]+\\.[0-9]+[A-Za-z0-9_.-]*$", var.postgres_client_image))
    error_message = "postgres_client_image must be registry/repository:tag with a versioned tag such as 16.4-alpine."
  }
}

variable "artifact_root" {
  description = "The cluster profile's storage.root (env FLYWHEEL_ARTIFACT_ROOT), e.g. s3://bucket/flywheel. MLflow stores run artifacts under <artifact_root>/mlflow."
  type        = string

  validation {
    condition     = can(regex("^[a-z0-9]+://[^/\\s]+(/[^/\\s]+)*$", var.artifact_root))
    error_message = "artifact_root must be a URI such as s3://bucket/prefix, without a trailing slash."
  }
}

# --- Database ---------------------------------------------------------------------------------

variable "db_host" {
  description = "Host name of the PostgreSQL server holding Dagster's instance storage and MLflow's backend store (env DAGSTER_PG_HOST)."
  type        = string

  validation {
    condition     = can(regex("^[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?$", var.db_host))
    error_message = "db_host must be a host name without scheme or port."
  }
}

variable "db_port" {
  description = "Port of the PostgreSQL server."
  type        = number
  default     = 5432

  validation {
    condition     = var.db_port >= 1 && var.db_port <= 65535 && floor(var.db_port) == var.db_port
    error_message = "db_port must be a whole number from 1 to 65535."
  }
}

variable "db_username" {
  description = "User Dagster and MLflow connect as (env DAGSTER_PG_USER); it also creates the MLflow database."
  type        = string

  validation {
    condition     = can(regex("^[A-Za-z_][A-Za-z0-9_]{0,62}$", var.db_username))
    error_message = "db_username must be a PostgreSQL identifier (letters, digits, underscores; at most 63 characters)."
  }
}

variable "db_password" {
  description = "Password of db_username. It is written into three Kubernetes Secrets (and therefore into the state of the configuration calling this module)."
  type        = string
  sensitive   = true

  validation {
    condition     = length(var.db_password) >= 8
    error_message = "db_password must be at least 8 characters."
  }
}

variable "sandbox_token" {
  description = "Shared secret of the sandbox service (sandbox.kind http): written into the Secret flywheel-sandbox-token, which the service reads, and into flywheel-env as FLYWHEEL_SANDBOX_TOKEN, which its clients read (and so into the state of the configuration calling this module)."
  type        = string
  sensitive   = true

  # The service refuses tokens under 16 characters; a generated one is much longer. It travels in
  # an HTTP header, so no whitespace or control characters.
  validation {
    condition     = length(var.sandbox_token) >= 32 && can(regex("^[!-~]+$", var.sandbox_token))
    error_message = "sandbox_token must be at least 32 printable characters without spaces."
  }
}

variable "dagster_database_name" {
  description = "Database of Dagster's run, event-log and schedule storage (env DAGSTER_PG_DB); it must exist."
  type        = string

  validation {
    condition     = can(regex("^[a-z_][a-z0-9_]{0,62}$", var.dagster_database_name))
    error_message = "dagster_database_name must be a lower-case PostgreSQL identifier."
  }
}

variable "mlflow_database_name" {
  description = "Database of MLflow's backend store; a Kubernetes Job creates it when missing."
  type        = string
  default     = "mlflow"

  # Also what makes it safe to put into the job's SQL unquoted by the shell.
  validation {
    condition     = can(regex("^[a-z_][a-z0-9_]{0,62}$", var.mlflow_database_name))
    error_message = "mlflow_database_name must be a lower-case PostgreSQL identifier (letters, digits, underscores)."
  }
}

variable "credentials_revision" {
  description = "Opaque value that changes whenever db_password does (on AWS the secret's version id). It is a pod annotation of the Dagster and MLflow deployments, so a re-apply after a rotation restarts them with the new password; pods read Secrets as env only when they start."
  type        = string
  default     = ""
}

# --- Identities -------------------------------------------------------------------------------

variable "runner_service_account" {
  description = "Service account of the Dagster pods, run pods, step pods and Pipes training pods (orchestration.k8s.service_account). Its role here may manage jobs and pods in the namespace and nothing else."
  type        = string
  default     = "flywheel-runner"

  validation {
    condition     = length(var.runner_service_account) <= 253 && can(regex("^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", var.runner_service_account))
    error_message = "runner_service_account must be a Kubernetes name (lower case letters, digits and hyphens)."
  }
}

variable "runner_service_account_annotations" {
  description = "Annotations of the runner service account, e.g. {\"eks.amazonaws.com/role-arn\" = <runner role ARN>} for S3 through IRSA."
  type        = map(string)
  default     = {}
  nullable    = false
}

variable "mlflow_service_account" {
  description = "Service account of the MLflow server."
  type        = string
  default     = "mlflow"

  validation {
    condition     = length(var.mlflow_service_account) <= 253 && can(regex("^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", var.mlflow_service_account))
    error_message = "mlflow_service_account must be a Kubernetes name (lower case letters, digits and hyphens)."
  }
}

variable "mlflow_service_account_annotations" {
  description = "Annotations of the MLflow service account, e.g. {\"eks.amazonaws.com/role-arn\" = <MLflow role ARN>} for its artifact prefix."
  type        = map(string)
  default     = {}
  nullable    = false
}

# --- Scheduling -------------------------------------------------------------------------------

variable "cpu_node_selector" {
  description = "Labels of the always-on CPU nodes: the webserver, daemon, code server, MLflow and the database job run there."
  type        = map(string)
  default     = { "flywheel/node-pool" = "cpu" }

  validation {
    condition     = length(var.cpu_node_selector) > 0
    error_message = "cpu_node_selector must select at least one label."
  }
}

variable "gpu_node_selector" {
  description = "Labels of the GPU nodes (orchestration.k8s.gpu_node_selector); the NVIDIA device plugin runs only there."
  type        = map(string)
  default     = { "flywheel/node-pool" = "gpu" }

  validation {
    condition     = length(var.gpu_node_selector) > 0
    error_message = "gpu_node_selector must select at least one label."
  }
}

variable "gpu_tolerations" {
  description = "Tolerations for the GPU nodes' taints (orchestration.k8s.gpu_tolerations), given to the NVIDIA device plugin."
  type        = list(map(string))
  default     = [{ key = "nvidia.com/gpu", operator = "Exists", effect = "NoSchedule" }]

  validation {
    condition = length(var.gpu_tolerations) > 0 && alltrue([
      for t in var.gpu_tolerations : contains(["Exists", "Equal"], lookup(t, "operator", "Equal"))
      && contains(["NoSchedule", "PreferNoSchedule", "NoExecute"], lookup(t, "effect", "NoSchedule"))
      && length(setsubtract(keys(t), ["key", "operator", "value", "effect"])) == 0
    ])
    error_message = "gpu_tolerations must be Kubernetes tolerations: keys key/operator/value/effect, operator Exists or Equal, effect NoSchedule, PreferNoSchedule or NoExecute."
  }
}

# --- Dagster instance -------------------------------------------------------------------------

variable "max_concurrent_runs" {
  description = "Runs the queued run coordinator lets run at once (orchestration.k8s.max_concurrent_runs; pipelines/instance.py concurrency.runs)."
  type        = number
  default     = 4

  validation {
    condition     = var.max_concurrent_runs >= 1 && floor(var.max_concurrent_runs) == var.max_concurrent_runs
    error_message = "max_concurrent_runs must be a whole number of at least 1."
  }
}

variable "gpu_pool_limit" {
  description = "Steps in the `gpu` concurrency pool at once across all runs (orchestration.k8s.gpu_pool_limit; the GPU node group's maximum size), the instance's default pool limit."
  type        = number
  default     = 4

  validation {
    condition     = var.gpu_pool_limit >= 1 && floor(var.gpu_pool_limit) == var.gpu_pool_limit
    error_message = "gpu_pool_limit must be a whole number of at least 1."
  }
}

# --- Chart versions (exact: a range would let an apply pick up a new chart unreviewed) ----------

variable "dagster_chart_version" {
  description = "Version of the dagster chart (https://dagster-io.github.io/helm). Equal to the dagster version pyproject.toml pins: the chart's instance config and the code in the images must be the same release."
  type        = string
  default     = "1.13.27"

  validation {
    condition     = can(regex("^[0-9]+\\.[0-9]+\\.[0-9]+$", var.dagster_chart_version))
    error_message = "dagster_chart_version must be an exact version such as 1.13.27, not a range."
  }
}

variable "mlflow_chart_version" {
  description = "Version of the community-charts mlflow chart (https://community-charts.github.io/helm-charts)."
  type        = string
  default     = "1.11.7"

  validation {
    condition     = can(regex("^[0-9]+\\.[0-9]+\\.[0-9]+$", var.mlflow_chart_version))
    error_message = "mlflow_chart_version must be an exact version such as 1.11.7, not a range."
  }
}

variable "nvidia_device_plugin_chart_version" {
  description = "Version of the nvidia-device-plugin chart (https://nvidia.github.io/k8s-device-plugin); its image is the same release."
  type        = string
  default     = "0.19.0"

  validation {
    condition     = can(regex("^[0-9]+\\.[0-9]+\\.[0-9]+$", var.nvidia_device_plugin_chart_version))
    error_message = "nvidia_device_plugin_chart_version must be an exact version such as 0.19.0, not a range."
  }
}
