variable "cluster_name" {
  description = "Name of the EKS cluster; also prefixes its IAM roles, KMS aliases and launch templates."
  type        = string

  validation {
    # EKS itself allows 100 characters, but the name is reused in IAM role names
    # ("<name>-eks-node", at most 64 characters) and must match the network module's tags.
    condition     = can(regex("^[a-zA-Z][a-zA-Z0-9-]{0,39}$", var.cluster_name))
    error_message = "cluster_name must start with a letter and contain only letters, digits and hyphens (at most 40 characters)."
  }
}

variable "kubernetes_version" {
  description = "Kubernetes minor version of the control plane and node groups, e.g. \"1.35\". Pinned so that an upgrade is a reviewed change: EKS upgrades one minor at a time and cannot be rolled back."
  type        = string
  default     = "1.35"

  validation {
    # The floor: 1.33 and older are past EKS standard support (1.33's ended on 29 July 2026;
    # 1.34's ends on 2 December 2026, 1.35's on 27 March 2027), and a cluster left there pays
    # extended-support fees per hour. No ceiling: a minor EKS does not offer yet is refused by
    # the API at apply, and a ceiling here would only go stale.
    condition     = can(regex("^1\\.(3[4-9]|[4-9][0-9])$", var.kubernetes_version))
    error_message = "kubernetes_version must be a Kubernetes minor version such as \"1.35\", 1.34 or later."
  }
}

variable "private_subnet_ids" {
  description = "Private subnets (from the network module) for the control plane's network interfaces and the nodes."
  type        = list(string)

  validation {
    # EKS rejects a control plane whose subnets are not in at least two availability zones.
    condition     = length(var.private_subnet_ids) >= 2
    error_message = "private_subnet_ids needs at least two subnets, in different availability zones."
  }

  validation {
    condition     = alltrue([for id in var.private_subnet_ids : can(regex("^subnet-[0-9a-f]+$", id))])
    error_message = "private_subnet_ids must contain subnet IDs (subnet-...)."
  }
}

variable "endpoint_public_access" {
  description = "Expose the Kubernetes API endpoint on the internet (restricted to public_access_cidrs). Off by default: the API is reached from inside the VPC (VPN, bastion, CI runners in the VPC)."
  type        = bool
  default     = false
}

variable "public_access_cidrs" {
  description = "IPv4 CIDR blocks allowed to reach the public API endpoint. Required when endpoint_public_access is true; ignored otherwise."
  type        = list(string)
  default     = []

  validation {
    condition     = alltrue([for c in var.public_access_cidrs : can(cidrhost(c, 0))])
    error_message = "public_access_cidrs must contain valid IPv4 CIDR blocks, e.g. 203.0.113.0/24."
  }

  validation {
    # A /0 in any spelling (0.0.0.0/0, 1.2.3.4/0) opens the API server to the whole internet,
    # which is what turning on the public endpoint with an allow-list is meant to avoid.
    condition     = alltrue([for c in var.public_access_cidrs : try(tonumber(split("/", c)[1]) > 0, false)])
    error_message = "public_access_cidrs must not contain 0.0.0.0/0 (or any other /0): list the networks that need the API."
  }
}

variable "cluster_log_retention_days" {
  description = "Days the control plane logs (api, audit, authenticator, controllerManager, scheduler) are kept in CloudWatch Logs."
  type        = number
  default     = 365

  validation {
    # Only these values are accepted by CloudWatch; 0 ("never expire") is excluded on purpose,
    # audit logs of a busy cluster grow fast.
    condition     = contains([1, 3, 5, 7, 14, 30, 60, 90, 120, 150, 180, 365, 400, 545, 731, 1096, 1827, 2192, 2557, 2922, 3288, 3653], var.cluster_log_retention_days)
    error_message = "cluster_log_retention_days must be a retention period CloudWatch Logs supports (1, 3, 5, 7, 14, 30, 60, 90, 120, 150, 180, 365, 400, 545, 731, 1096, 1827, 2192, 2557, 2922, 3288 or 3653)."
  }
}

variable "cpu_instance_types" {
  description = "Instance types of the cpu node group (Dagster webserver/daemon, MLflow, CPU step pods)."
  type        = list(string)
  default     = ["m6i.2xlarge"]

  validation {
    condition     = length(var.cpu_instance_types) > 0
    error_message = "cpu_instance_types needs at least one instance type."
  }
}

variable "cpu_max_nodes" {
  description = "Maximum size of the cpu node group (it runs with min 1, desired 2)."
  type        = number
  default     = 6

  validation {
    # Two nodes are the group's desired size, so a smaller maximum is rejected by EKS.
    condition     = var.cpu_max_nodes >= 2 && floor(var.cpu_max_nodes) == var.cpu_max_nodes
    error_message = "cpu_max_nodes must be a whole number of at least 2 (the group's desired size)."
  }
}

variable "cpu_disk_size_gib" {
  description = "Size in GiB of the cpu nodes' root volume (gp3, encrypted), which also holds container images."
  type        = number
  default     = 100

  validation {
    condition     = var.cpu_disk_size_gib >= 20 && var.cpu_disk_size_gib <= 16384 && floor(var.cpu_disk_size_gib) == var.cpu_disk_size_gib
    error_message = "cpu_disk_size_gib must be a whole number between 20 (the AMI's size) and 16384 (gp3's limit)."
  }
}

variable "gpu_instance_types" {
  description = "Instance types of the gpu node group (rollout and training step pods). All should have gpus_per_node GPUs, since the autoscaler's scale-from-zero template assumes one shape."
  type        = list(string)
  default     = ["g5.2xlarge"]

  validation {
    condition     = length(var.gpu_instance_types) > 0
    error_message = "gpu_instance_types needs at least one instance type."
  }
}

variable "gpu_accelerator" {
  description = "Value of the GPU nodes' k8s.amazonaws.com/accelerator label (the cluster autoscaler only checks it is there; name the GPU of gpu_instance_types, e.g. nvidia-a10g for g5, nvidia-l40s for g6e, nvidia-a100 for p4d/p4de)."
  type        = string
  default     = "nvidia-a10g"

  validation {
    condition     = can(regex("^[a-z0-9]([-a-z0-9.]{0,61}[a-z0-9])?$", var.gpu_accelerator))
    error_message = "gpu_accelerator must be a Kubernetes label value: lowercase letters, digits, '-' and '.', at most 63 characters."
  }
}

variable "gpu_max_nodes" {
  description = "Maximum size of the gpu node group, which scales from zero. Keep it in step with orchestration.k8s.gpu_pool_limit (configs/schema.py), the number of GPU steps the app runs at once."
  type        = number
  default     = 4

  validation {
    # A maximum of 0 would leave GPU steps pending forever: the group could never scale up.
    condition     = var.gpu_max_nodes >= 1 && floor(var.gpu_max_nodes) == var.gpu_max_nodes
    error_message = "gpu_max_nodes must be a whole number of at least 1."
  }
}

variable "gpus_per_node" {
  description = "nvidia.com/gpu count of one gpu node, advertised to the cluster autoscaler so it can scale the group up from zero nodes."
  type        = number
  default     = 1

  validation {
    condition     = var.gpus_per_node >= 1 && var.gpus_per_node <= 8 && floor(var.gpus_per_node) == var.gpus_per_node
    error_message = "gpus_per_node must be a whole number between 1 and 8."
  }
}

variable "gpu_disk_size_gib" {
  description = "Size in GiB of the gpu nodes' root volume (gp3, encrypted): CUDA/vLLM images and cached model weights are large."
  type        = number
  default     = 200

  validation {
    condition     = var.gpu_disk_size_gib >= 100 && var.gpu_disk_size_gib <= 16384 && floor(var.gpu_disk_size_gib) == var.gpu_disk_size_gib
    error_message = "gpu_disk_size_gib must be a whole number between 100 (room for GPU images) and 16384 (gp3's limit)."
  }
}

variable "gpu_capacity_type" {
  description = "Purchase option of the gpu node group: ON_DEMAND, or SPOT (cheaper, but an interrupted node fails the step running on it)."
  type        = string
  default     = "ON_DEMAND"

  validation {
    condition     = contains(["ON_DEMAND", "SPOT"], var.gpu_capacity_type)
    error_message = "gpu_capacity_type must be ON_DEMAND or SPOT."
  }
}

variable "sandbox_instance_types" {
  description = "Instance types of the sandbox node group, where the sandbox service runs policy-written code (pipelines/k8s_manifests.py renders it: 3 CPUs a replica by default, so an 8-vCPU node holds two)."
  type        = list(string)
  default     = ["c6i.2xlarge"]

  validation {
    condition     = length(var.sandbox_instance_types) > 0
    error_message = "sandbox_instance_types needs at least one instance type."
  }
}

variable "sandbox_max_nodes" {
  description = "Maximum size of the sandbox node group (it runs with min 1). Keep it at least the sandbox service's maximum replicas divided by the replicas a node holds."
  type        = number
  default     = 4

  validation {
    condition     = var.sandbox_max_nodes >= 1 && floor(var.sandbox_max_nodes) == var.sandbox_max_nodes
    error_message = "sandbox_max_nodes must be a whole number of at least 1."
  }
}

variable "admin_principal_arns" {
  description = "IAM roles or users given cluster-admin on the Kubernetes API (an EKS access entry with AmazonEKSClusterAdminPolicy each): whoever runs Terraform, the platform layer's CI role, operators. Use the role ARN (arn:aws:iam::<account>:role/<name>), not the sts assumed-role ARN of a session."
  type        = list(string)

  validation {
    # No bootstrap admin exists (bootstrap_cluster_creator_admin_permissions = false): an empty
    # list would leave a cluster nobody can reach.
    condition     = length(var.admin_principal_arns) >= 1
    error_message = "admin_principal_arns needs at least one principal, or nobody can use the cluster's API."
  }

  validation {
    condition     = alltrue([for arn in var.admin_principal_arns : can(regex("^arn:aws[a-z-]*:iam::[0-9]{12}:(role|user)/[A-Za-z0-9+=,.@_/-]+$", arn))])
    error_message = "admin_principal_arns must hold IAM role or user ARNs (arn:aws:iam::<account>:role/<name>); for an assumed-role session (arn:aws:sts::...:assumed-role/<name>/<session>) give the role's ARN."
  }

  validation {
    condition     = length(distinct(var.admin_principal_arns)) == length(var.admin_principal_arns)
    error_message = "admin_principal_arns must not repeat a principal."
  }
}

variable "tags" {
  description = "Tags added to every resource this module creates."
  type        = map(string)
  default     = {}
}
