# Variables this root uses itself are validated here. The ones it only passes to a module (node
# types, sizes, the database class, ...) are validated by that module's own variable, so the rule
# lives in one place; tests/test_terraform_env.py checks these defaults against those rules.

# --- Required: no sensible default ---------------------------------------------------------------

variable "region" {
  description = "AWS region of the whole environment, e.g. us-east-1. Pick one with the GPU instance type (gpu_instance_types) in at least two availability zones."
  type        = string

  validation {
    condition     = can(regex("^[a-z]{2}(-gov|-iso[a-z]?)?-(north|south|east|west|central|northeast|northwest|southeast|southwest)-[0-9]$", var.region))
    error_message = "region must be an AWS region code such as us-east-1 or eu-central-1."
  }
}

variable "bucket_name" {
  description = "Name of the artifact bucket (datasets, checkpoints, MLflow artifacts). S3 names are global: include something of your own, e.g. <org>-flywheel-artifacts. Checked by the storage module."
  type        = string
}

variable "image_tag" {
  description = "Tag of the three images (trainer, dagster, sandbox) pushed to this environment's repositories, as docker/README.md builds them: the git commit, e.g. 3f2c1ab. The repositories' tags are immutable, so a new build needs a new tag."
  type        = string

  validation {
    condition     = can(regex("^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$", var.image_tag))
    error_message = "image_tag must be a Docker tag: 1-128 letters, digits, '_', '.' or '-', not starting with '.' or '-'."
  }

  # An immutable repository accepts `latest` exactly once, after which it can never move again.
  validation {
    condition     = var.image_tag != "latest"
    error_message = "image_tag must name a build (e.g. the git commit), not latest: the repositories' tags are immutable."
  }
}

variable "admin_principal_arns" {
  description = "IAM roles or users given cluster-admin on the Kubernetes API: whoever runs Terraform here and in the platform layer, CI roles, operators. Give a role's ARN (arn:aws:iam::<account>:role/<name>), not an assumed-role session's; `aws sts get-caller-identity` shows the session, `aws iam get-role` the role."
  type        = list(string)

  validation {
    condition     = length(var.admin_principal_arns) >= 1 && alltrue([for arn in var.admin_principal_arns : can(regex("^arn:aws[a-z-]*:iam::[0-9]{12}:(role|user)/[A-Za-z0-9+=,.@_/-]+$", arn))])
    error_message = "admin_principal_arns must hold at least one IAM role or user ARN (arn:aws:iam::<account>:role/<name>); for an assumed-role session (arn:aws:sts::...:assumed-role/<name>/<session>) give the role's ARN."
  }
}

# --- Names the app and the platform layer share --------------------------------------------------

variable "name" {
  description = "Name of the environment: the EKS cluster and VPC, and the prefix of the database, the repositories (<name>-trainer, ...) and the IAM roles."
  type        = string
  default     = "flywheel"

  # Lowercase and no double hyphen because the name also prefixes the RDS identifier and the ECR
  # repositories; at most 40 characters for the IAM role names built from it.
  validation {
    condition     = can(regex("^[a-z]([a-z0-9-]{0,38}[a-z0-9])?$", var.name)) && !strcontains(var.name, "--")
    error_message = "name must be 1-40 lowercase letters, digits and single hyphens, starting with a letter and not ending with a hyphen."
  }
}

variable "namespace" {
  description = "Kubernetes namespace of Dagster, MLflow and the step pods: orchestration.k8s.namespace of the app (configs/schema.py K8sConfig)."
  type        = string
  default     = "flywheel"

  validation {
    condition     = length(var.namespace) <= 63 && can(regex("^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", var.namespace))
    error_message = "namespace must be a Kubernetes namespace name: at most 63 lowercase letters, digits and '-', starting and ending with a letter or digit."
  }
}

variable "runner_service_account" {
  description = "Service account of the step pods, whose IAM role reads and writes the artifact root: orchestration.k8s.service_account of the app."
  type        = string
  default     = "flywheel-runner"

  validation {
    condition     = length(var.runner_service_account) <= 253 && can(regex("^[a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*$", var.runner_service_account))
    error_message = "runner_service_account must be a Kubernetes service account name (lowercase RFC 1123 subdomain)."
  }
}

variable "mlflow_service_account" {
  description = "Service account the platform layer runs the MLflow server as; its IAM role reads and writes the MLflow artifact prefix only."
  type        = string
  default     = "mlflow"

  validation {
    condition     = length(var.mlflow_service_account) <= 253 && can(regex("^[a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*$", var.mlflow_service_account))
    error_message = "mlflow_service_account must be a Kubernetes service account name (lowercase RFC 1123 subdomain)."
  }
}

variable "db_secret_reader_service_account" {
  description = "Service account (in namespace) whose IAM role may read the database's master secret: what keeps the Kubernetes copy of the rotated password current."
  type        = string
  default     = "db-secret-reader"

  validation {
    condition     = length(var.db_secret_reader_service_account) <= 253 && can(regex("^[a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*$", var.db_secret_reader_service_account))
    error_message = "db_secret_reader_service_account must be a Kubernetes service account name (lowercase RFC 1123 subdomain)."
  }
}

variable "artifact_prefix" {
  description = "Key prefix of the artifact root in the bucket (FLYWHEEL_ARTIFACT_ROOT is s3://<bucket_name>/<artifact_prefix>); the MLflow server writes under <artifact_prefix>/mlflow. Checked by the storage module."
  type        = string
  default     = "flywheel"
}

variable "tags" {
  description = "Tags added to every resource (the provider's default_tags, next to Project, Environment and ManagedBy), e.g. a cost center."
  type        = map(string)
  default     = {}
  nullable    = false
}

# --- Passed to the modules (validated there) -----------------------------------------------------

variable "kubernetes_version" {
  description = "Kubernetes minor version of the cluster (eks module). Upgrades go one minor at a time."
  type        = string
  default     = "1.35"
}

variable "vpc_cidr" {
  description = "IPv4 CIDR block of the VPC (network module); every pod takes an address from it."
  type        = string
  default     = "10.0.0.0/16"
}

variable "az_count" {
  description = "Availability zones the subnets span (network module); at least two, for EKS and RDS."
  type        = number
  default     = 3
}

variable "single_nat_gateway" {
  description = "One NAT gateway for all zones (cheaper) instead of one per zone (survives a zone outage)."
  type        = bool
  default     = true
  nullable    = false
}

variable "endpoint_public_access" {
  description = "Expose the Kubernetes API on the internet, restricted to public_access_cidrs. Off: the API (and so the platform layer) is reached from inside the VPC only (VPN, bastion, CI runner in the VPC)."
  type        = bool
  default     = false
  nullable    = false
}

variable "public_access_cidrs" {
  description = "CIDR blocks allowed to reach the public API endpoint when endpoint_public_access is true, e.g. your office's or CI's egress addresses."
  type        = list(string)
  default     = []
  nullable    = false
}

variable "cpu_instance_types" {
  description = "Instance types of the cpu node group (Dagster, MLflow, CPU steps)."
  type        = list(string)
  default     = ["m6i.2xlarge"]
}

variable "gpu_instance_types" {
  description = "Instance types of the gpu node group (rollout and training steps), all with gpus_per_node GPUs. The AL2023 NVIDIA AMI supports g4dn, g5, g6, g6e, p4d, p5 and others."
  type        = list(string)
  default     = ["g5.2xlarge"]
}

variable "gpu_accelerator" {
  description = "The GPU of gpu_instance_types, as the nodes' k8s.amazonaws.com/accelerator label (nvidia-a10g for g5, nvidia-l40s for g6e, nvidia-a100 for p4d/p4de)."
  type        = string
  default     = "nvidia-a10g"
}

variable "gpu_max_nodes" {
  description = "Maximum size of the gpu node group, which scales from zero; keep it at least orchestration.k8s.gpu_pool_limit of the app."
  type        = number
  default     = 4
}

variable "gpus_per_node" {
  description = "GPUs of one gpu node, advertised to the cluster autoscaler for scaling up from zero."
  type        = number
  default     = 1
}

variable "gpu_capacity_type" {
  description = "ON_DEMAND or SPOT for the gpu node group (SPOT is cheaper; an interruption fails the running step)."
  type        = string
  default     = "ON_DEMAND"
}

variable "sandbox_instance_types" {
  description = "Instance types of the sandbox node group, where the sandbox service runs policy-written code (two service replicas of 3 CPUs on an 8-vCPU node)."
  type        = list(string)
  default     = ["c6i.2xlarge"]
}

variable "sandbox_max_nodes" {
  description = "Maximum size of the sandbox node group (min 1); keep it at the sandbox service's maximum replicas / 2."
  type        = number
  default     = 4
}

variable "bucket_force_destroy" {
  description = "Let `terraform destroy` delete the artifact bucket with its objects. Keep false outside throwaway environments."
  type        = bool
  default     = false
  nullable    = false
}

variable "db_instance_class" {
  description = "RDS instance class of PostgreSQL (database module)."
  type        = string
  default     = "db.t4g.medium"
}

variable "db_multi_az" {
  description = "Run PostgreSQL with a standby in a second zone (about twice the cost; failover in a minute or two instead of a restore)."
  type        = bool
  default     = false
  nullable    = false
}

variable "db_deletion_protection" {
  description = "Refuse to delete the database until this is turned off in a separate apply."
  type        = bool
  default     = true
  nullable    = false
}

variable "ecr_keep_images" {
  description = "Tagged images each repository keeps (registry module); older ones expire."
  type        = number
  default     = 30
}

variable "ecr_force_delete" {
  description = "Let `terraform destroy` delete repositories that still hold images. Keep false outside throwaway environments."
  type        = bool
  default     = false
  nullable    = false
}
