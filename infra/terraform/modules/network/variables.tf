variable "cluster_name" {
  description = "Name of the EKS cluster that will use this VPC. Used to name resources and in the kubernetes.io/cluster/<name> subnet tag the AWS load balancer integrations look for."
  type        = string

  validation {
    # EKS itself allows 100 characters, but the name is reused in IAM role and log group names,
    # whose limits are tighter once suffixes are added.
    condition     = can(regex("^[a-zA-Z][a-zA-Z0-9-]{0,39}$", var.cluster_name))
    error_message = "cluster_name must start with a letter and contain only letters, digits and hyphens (at most 40 characters)."
  }
}

variable "vpc_cidr" {
  description = "IPv4 CIDR block of the VPC. Subnets are carved from it with cidrsubnet: private subnets get an eighth each, public subnets share the last eighth."
  type        = string
  default     = "10.0.0.0/16"

  validation {
    condition     = can(cidrhost(var.vpc_cidr, 0))
    error_message = "vpc_cidr must be a valid IPv4 CIDR block, e.g. 10.0.0.0/16."
  }

  validation {
    # /16 is the largest block AWS accepts for a VPC; /22 is the smallest that still leaves
    # /28 public subnets (AWS's minimum subnet size) after the split described above.
    condition     = try(tonumber(split("/", var.vpc_cidr)[1]) >= 16 && tonumber(split("/", var.vpc_cidr)[1]) <= 22, false)
    error_message = "vpc_cidr must have a prefix length between /16 and /22."
  }

  validation {
    # A host address such as 10.0.0.1/16 would be silently normalised by AWS and then
    # show a diff on every plan.
    condition     = try(cidrsubnet(var.vpc_cidr, 0, 0) == var.vpc_cidr, false)
    error_message = "vpc_cidr must be a network address (no host bits set), e.g. 10.0.0.0/16 rather than 10.0.0.1/16."
  }
}

variable "az_count" {
  description = "Number of availability zones to spread subnets over (one private and one public subnet per zone)."
  type        = number
  default     = 3

  validation {
    # EKS refuses a control plane with subnets in fewer than two zones; the subnet layout
    # (eight slices of the VPC CIDR, one kept for public subnets) leaves room for at most six.
    condition     = var.az_count >= 2 && var.az_count <= 6 && floor(var.az_count) == var.az_count
    error_message = "az_count must be a whole number between 2 and 6."
  }
}

variable "single_nat_gateway" {
  description = "Route every private subnet through one NAT gateway (cheaper) instead of one per availability zone (survives a zone outage)."
  type        = bool
  default     = true
}

variable "flow_log_retention_days" {
  description = "Days the VPC flow logs are kept in CloudWatch Logs. Must be a retention period CloudWatch supports and at least a year."
  type        = number
  default     = 365

  validation {
    # Only these values are accepted by CloudWatch; 0 ("never expire") is excluded on purpose
    # so that the log group's cost stays bounded.
    condition     = contains([365, 400, 545, 731, 1096, 1827, 2192, 2557, 2922, 3288, 3653], var.flow_log_retention_days)
    error_message = "flow_log_retention_days must be one of 365, 400, 545, 731, 1096, 1827, 2192, 2557, 2922, 3288, 3653."
  }
}

variable "flow_log_traffic_type" {
  description = "Which traffic the VPC flow log records: ACCEPT, REJECT or ALL."
  type        = string
  default     = "ALL"

  validation {
    condition     = contains(["ACCEPT", "REJECT", "ALL"], var.flow_log_traffic_type)
    error_message = "flow_log_traffic_type must be ACCEPT, REJECT or ALL."
  }
}

variable "tags" {
  description = "Tags added to every resource this module creates."
  type        = map(string)
  default     = {}
}
