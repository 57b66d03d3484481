variable "identifier" {
  description = "RDS instance identifier; also the base name of the instance's subnet group, parameter group, security group and KMS alias."
  type        = string

  validation {
    condition     = can(regex("^[a-z][a-z0-9-]{0,61}[a-z0-9]$", var.identifier)) && !strcontains(var.identifier, "--")
    error_message = "identifier must be 2-63 lowercase letters, digits and single hyphens, starting with a letter and not ending with a hyphen."
  }
}

variable "engine_version" {
  description = <<-EOT
    PostgreSQL version, pinned so a plan never changes the major version unasked. The parameter
    group family follows its major version. auto_minor_version_upgrade is on, so after AWS applies
    a minor upgrade in the maintenance window, raise this to the engine_version_actual output (or
    give only the major version, e.g. "16"): a plan does not downgrade an instance.
  EOT
  type        = string
  default     = "16.4"

  validation {
    condition     = can(regex("^[0-9]+(\\.[0-9]+)?$", var.engine_version)) && try(tonumber(split(".", var.engine_version)[0]) >= 14, false)
    error_message = "engine_version must be a PostgreSQL version such as \"16.4\" or \"16\", major version 14 or later."
  }
}

variable "instance_class" {
  description = "RDS instance class. The default burstable Graviton class fits Dagster's event log and MLflow's metadata at this platform's scale."
  type        = string
  default     = "db.t4g.medium"

  validation {
    condition     = can(regex("^db\\.[a-z0-9-]+\\.[a-z0-9]+$", var.instance_class))
    error_message = "instance_class must be an RDS instance class such as db.t4g.medium."
  }
}

variable "allocated_storage" {
  description = "Initial gp3 storage in GiB."
  type        = number
  default     = 50

  validation {
    condition     = var.allocated_storage >= 20 && var.allocated_storage <= 65536 && floor(var.allocated_storage) == var.allocated_storage
    error_message = "allocated_storage must be a whole number of GiB between 20 (the gp3 minimum) and 65536."
  }
}

variable "max_allocated_storage" {
  description = "Ceiling in GiB for storage autoscaling (Dagster's event log grows with every run); 0 disables autoscaling. Must exceed allocated_storage by at least 10%."
  type        = number
  default     = 200

  validation {
    condition     = var.max_allocated_storage == 0 || (var.max_allocated_storage <= 65536 && floor(var.max_allocated_storage) == var.max_allocated_storage)
    error_message = "max_allocated_storage must be 0 or a whole number of GiB up to 65536."
  }
}

variable "vpc_id" {
  description = "VPC of the EKS cluster; the database's security group is created in it."
  type        = string

  validation {
    condition     = can(regex("^vpc-[0-9a-f]+$", var.vpc_id))
    error_message = "vpc_id must be a VPC id (vpc-...)."
  }
}

variable "private_subnet_ids" {
  description = "Private subnets for the DB subnet group, in at least two availability zones (required by RDS, and by multi_az for the standby)."
  type        = list(string)

  validation {
    condition     = length(var.private_subnet_ids) >= 2 && alltrue([for s in var.private_subnet_ids : can(regex("^subnet-[0-9a-f]+$", s))])
    error_message = "private_subnet_ids must hold at least two subnet ids (subnet-...)."
  }
}

variable "allowed_security_group_ids" {
  description = "Security groups (EKS node or pod security groups of Dagster, the step pods and MLflow) allowed to reach PostgreSQL on 5432; nothing else may connect."
  type        = list(string)

  validation {
    condition     = length(var.allowed_security_group_ids) >= 1 && alltrue([for s in var.allowed_security_group_ids : can(regex("^sg-[0-9a-f]+$", s))])
    error_message = "allowed_security_group_ids must hold at least one security group id (sg-...)."
  }
}

variable "master_username" {
  description = "Master user name. Its password is generated and rotated by RDS in Secrets Manager (master_user_secret_arn output)."
  type        = string
  default     = "flywheel_admin"

  validation {
    condition     = can(regex("^[A-Za-z][A-Za-z0-9_]{0,62}$", var.master_username)) && !contains(["rdsadmin", "rdsrepladmin"], lower(var.master_username))
    error_message = "master_username must be 1-63 letters, digits or '_', start with a letter, and not be a role RDS reserves for itself (rdsadmin, rdsrepladmin)."
  }
}

variable "dagster_db_name" {
  description = "Database created with the instance for Dagster's run, event-log and schedule storage (DAGSTER_PG_DB)."
  type        = string
  default     = "dagster"

  validation {
    condition     = can(regex("^[a-z][a-z0-9_]{0,62}$", var.dagster_db_name))
    error_message = "dagster_db_name must be 1-63 lowercase letters, digits or '_', starting with a letter."
  }
}

variable "mlflow_db_name" {
  description = "Database of the MLflow server's backend store. Not created by Terraform: the deploy step creates it on this instance (see main.tf)."
  type        = string
  default     = "mlflow"

  validation {
    condition     = can(regex("^[a-z][a-z0-9_]{0,62}$", var.mlflow_db_name))
    error_message = "mlflow_db_name must be 1-63 lowercase letters, digits or '_', starting with a letter."
  }
}

variable "multi_az" {
  description = "Keep a synchronous standby in a second availability zone, so an AZ outage or maintenance does not stop every Dagster run."
  type        = bool
  default     = true
  nullable    = false
}

variable "backup_retention_period" {
  description = "Days of automated backups (point-in-time recovery window)."
  type        = number
  default     = 14

  validation {
    condition     = var.backup_retention_period >= 7 && var.backup_retention_period <= 35 && floor(var.backup_retention_period) == var.backup_retention_period
    error_message = "backup_retention_period must be a whole number of days from 7 to 35: a week of point-in-time recovery is the floor for the run history."
  }
}

variable "backup_window" {
  description = "Daily UTC window (hh24:mi-hh24:mi) for automated backups; must not overlap maintenance_window."
  type        = string
  default     = "03:00-04:00"

  validation {
    condition     = can(regex("^([01][0-9]|2[0-3]):[0-5][0-9]-([01][0-9]|2[0-3]):[0-5][0-9]$", var.backup_window))
    error_message = "backup_window must look like 03:00-04:00 (UTC)."
  }
}

variable "maintenance_window" {
  description = "Weekly UTC window (ddd:hh24:mi-ddd:hh24:mi) for minor version upgrades and other maintenance."
  type        = string
  default     = "sun:04:30-sun:05:30"

  validation {
    condition     = can(regex("^(mon|tue|wed|thu|fri|sat|sun):([01][0-9]|2[0-3]):[0-5][0-9]-(mon|tue|wed|thu|fri|sat|sun):([01][0-9]|2[0-3]):[0-5][0-9]$", var.maintenance_window))
    error_message = "maintenance_window must look like sun:04:30-sun:05:30 (UTC)."
  }
}

variable "deletion_protection" {
  description = "Refuse to delete the instance (through Terraform or the console) until this is turned off in a separate apply."
  type        = bool
  default     = true
  nullable    = false
}

variable "monitoring_interval" {
  description = "Seconds between enhanced-monitoring samples (OS metrics, through an IAM role this module creates); 0 turns enhanced monitoring off."
  type        = number
  default     = 60

  validation {
    condition     = contains([0, 1, 5, 10, 15, 30, 60], var.monitoring_interval)
    error_message = "monitoring_interval must be one of 0, 1, 5, 10, 15, 30, 60."
  }
}

variable "performance_insights_retention_period" {
  description = "Days Performance Insights data is kept: 7 (free tier), 731, or a multiple of 31 up to 713."
  type        = number
  default     = 7

  validation {
    condition     = var.performance_insights_retention_period == 7 || var.performance_insights_retention_period == 731 || (var.performance_insights_retention_period >= 31 && var.performance_insights_retention_period <= 713 && var.performance_insights_retention_period % 31 == 0)
    error_message = "performance_insights_retention_period must be 7, 731, or a multiple of 31 between 31 and 713."
  }
}

variable "log_retention_in_days" {
  description = "Retention of the exported postgresql and upgrade logs in CloudWatch Logs (RDS would otherwise create the log groups with no expiry). The connection log is an audit trail, so the default keeps a year, as the VPC flow logs do; shorter values are for throwaway environments."
  type        = number
  default     = 365

  validation {
    condition     = contains([1, 3, 5, 7, 14, 30, 60, 90, 120, 150, 180, 365, 400, 545, 731, 1096, 1827, 2192, 2557, 2922, 3288, 3653], var.log_retention_in_days)
    error_message = "log_retention_in_days must be a retention CloudWatch Logs accepts (1, 3, 5, 7, 14, 30, 60, 90, ... 3653)."
  }
}

variable "tags" {
  description = "Tags added to every resource of the module."
  type        = map(string)
  default     = {}
  nullable    = false
}
