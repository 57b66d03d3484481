# The cluster profile's PostgreSQL: Dagster's instance storage (pipelines/instance.py reads
# DAGSTER_PG_HOST/USER/PASSWORD/DB) and the MLflow server's backend store, on one RDS instance.
#
# Only the `dagster` database is created here (db_name). The `mlflow` database is created by the
# deploy step, which connects as the master user (password from the master_user_secret_arn secret)
# and runs CREATE DATABASE when it is missing: a postgresql provider would need network access from
# wherever Terraform runs to a database that is deliberately reachable only from the cluster.
#
# RDS rotates the master secret (every 7 days by default), so whatever fills DAGSTER_PG_PASSWORD
# must follow the secret (read it at deploy time, or sync it) rather than copy it once.

locals {
  port           = 5432
  major_version  = split(".", var.engine_version)[0]
  log_exports    = ["postgresql", "upgrade"]
  monitoring_on  = var.monitoring_interval > 0
  final_snapshot = "${var.identifier}-final"
}

data "aws_partition" "current" {}

data "aws_caller_identity" "current" {}

# One customer-managed key for everything the instance stores: data and automated backups,
# Performance Insights, and the master password's secret. A customer-managed key (not aws/rds)
# is what lets snapshots be shared with a backup account, and its use is ours to audit and revoke.
# The default key policy delegates to IAM in this account.
resource "aws_kms_key" "this" {
  #checkov:skip=CKV2_AWS_64:The default key policy is intended here: RDS, Performance Insights and Secrets Manager use the key on behalf of IAM principals in this account, which is exactly what the default policy delegates.
  description             = "Encryption of the ${var.identifier} RDS instance, its snapshots, Performance Insights and master secret"
  enable_key_rotation     = true
  deletion_window_in_days = 30
  tags                    = var.tags
}

resource "aws_kms_alias" "this" {
  name          = "alias/${var.identifier}-rds"
  target_key_id = aws_kms_key.this.key_id
}

resource "aws_db_subnet_group" "this" {
  name_prefix = "${var.identifier}-"
  description = "Private subnets of the ${var.identifier} PostgreSQL instance"
  subnet_ids  = var.private_subnet_ids
  tags        = var.tags

  lifecycle {
    create_before_destroy = true
  }
}

# No inline rules and no egress: Terraform removes the allow-all egress rule AWS adds to a new
# group, and RDS needs none (replies to allowed connections are stateful). Ingress rules are separate
# resources, one per source group, so adding a consumer does not rewrite the others.
resource "aws_security_group" "this" {
  name_prefix = "${var.identifier}-postgres-"
  description = "PostgreSQL ${var.identifier}: 5432 from the platform's security groups only"
  vpc_id      = var.vpc_id
  tags        = merge(var.tags, { Name = "${var.identifier}-postgres" })

  lifecycle {
    create_before_destroy = true
  }
}

resource "aws_vpc_security_group_ingress_rule" "postgres" {
  # Keyed by position, not by id: the EKS node group's id is unknown until the cluster exists, and
  # for_each keys must be known at plan time (a first `terraform plan` of the environment).
  for_each = { for i, id in var.allowed_security_group_ids : "source-${i}" => id }

  security_group_id            = aws_security_group.this.id
  description                  = "PostgreSQL from ${each.value}"
  ip_protocol                  = "tcp"
  from_port                    = local.port
  to_port                      = local.port
  referenced_security_group_id = each.value
  tags                         = var.tags
}

# A prefix plus create_before_destroy so a major version upgrade (new family) can attach the new
# group before the old one is deleted.
resource "aws_db_parameter_group" "this" {
  name_prefix = "${var.identifier}-postgres${local.major_version}-"
  family      = "postgres${local.major_version}"
  description = "PostgreSQL ${local.major_version} settings of ${var.identifier}: TLS only, connections logged"
  tags        = var.tags

  # Refuse, rather than accept, a client configured without TLS (sslmode=disable), so credentials
  # and run metadata never cross the VPC in clear text.
  parameter {
    name  = "rds.force_ssl"
    value = "1"
  }

  # Who connected from where, for the audit trail the postgresql log export keeps.
  parameter {
    name  = "log_connections"
    value = "1"
  }

  parameter {
    name  = "log_disconnections"
    value = "1"
  }

  lifecycle {
    create_before_destroy = true
  }
}

# Created ahead of the instance because RDS would create them on first export with no retention.
resource "aws_cloudwatch_log_group" "this" {
  #checkov:skip=CKV_AWS_158:CloudWatch Logs already encrypts these groups at rest with its own key; a customer-managed key would need a key policy admitting the logs service, which the module key's default policy lacks, and the groups hold connection, error and upgrade lines rather than table data.
  for_each = toset(local.log_exports)

  name              = "/aws/rds/instance/${var.identifier}/${each.value}"
  retention_in_days = var.log_retention_in_days
  tags              = var.tags
}

# Enhanced monitoring publishes OS metrics through a role the RDS monitoring service assumes; the
# source-account condition keeps another account's instance from using it (confused deputy).
data "aws_iam_policy_document" "monitoring_trust" {
  statement {
    effect  = "Allow"
    actions = ["sts:AssumeRole"]

    principals {
      type        = "Service"
      identifiers = ["monitoring.rds.amazonaws.com"]
    }

    condition {
      test     = "StringEquals"
      variable = "aws:SourceAccount"
      values   = [data.aws_caller_identity.current.account_id]
    }
  }
}

resource "aws_iam_role" "monitoring" {
  count = local.monitoring_on ? 1 : 0

  # A prefix: identifiers may be 63 characters, role names at most 64.
  name_prefix        = "rds-monitoring-"
  description        = "Enhanced monitoring of the ${var.identifier} RDS instance"
  assume_role_policy = data.aws_iam_policy_document.monitoring_trust.json
  tags               = var.tags
}

resource "aws_iam_role_policy_attachment" "monitoring" {
  count = local.monitoring_on ? 1 : 0

  role       = aws_iam_role.monitoring[0].name
  policy_arn = "arn:${data.aws_partition.current.partition}:iam::aws:policy/service-role/AmazonRDSEnhancedMonitoringRole"
}

resource "aws_db_instance" "this" {
  identifier     = var.identifier
  engine         = "postgres"
  engine_version = var.engine_version
  instance_class = var.instance_class
  port           = local.port

  db_name  = var.dagster_db_name
  username = var.master_username
  # RDS generates the password, stores it in Secrets Manager and rotates it there: it is never a
  # Terraform input, so it is in neither the configuration nor the state.
  manage_master_user_password   = true
  master_user_secret_kms_key_id = aws_kms_key.this.arn
  # Pods can log in with short-lived IAM tokens (rds-db:connect) instead of a stored password.
  iam_database_authentication_enabled = true

  storage_type          = "gp3"
  allocated_storage     = var.allocated_storage
  max_allocated_storage = var.max_allocated_storage
  storage_encrypted     = true
  kms_key_id            = aws_kms_key.this.arn

  db_subnet_group_name   = aws_db_subnet_group.this.name
  vpc_security_group_ids = [aws_security_group.this.id]
  publicly_accessible    = false
  multi_az               = var.multi_az
  parameter_group_name   = aws_db_parameter_group.this.name

  backup_retention_period = var.backup_retention_period
  backup_window           = var.backup_window
  maintenance_window      = var.maintenance_window
  copy_tags_to_snapshot   = true
  # A deleted instance keeps its automated backups until they age out, so a mistaken delete is
  # still recoverable to a point in time.
  delete_automated_backups = false
  deletion_protection      = var.deletion_protection
  skip_final_snapshot      = false
  # A fixed name on purpose: if a snapshot of that name is left from an earlier deletion, the next
  # deletion stops until someone decides what to keep, instead of silently adding another.
  final_snapshot_identifier = local.final_snapshot

  auto_minor_version_upgrade = true

  performance_insights_enabled          = true
  performance_insights_kms_key_id       = aws_kms_key.this.arn
  performance_insights_retention_period = var.performance_insights_retention_period

  enabled_cloudwatch_logs_exports = local.log_exports
  monitoring_interval             = var.monitoring_interval
  monitoring_role_arn             = local.monitoring_on ? aws_iam_role.monitoring[0].arn : null

  tags = var.tags

  depends_on = [
    aws_cloudwatch_log_group.this,
    aws_iam_role_policy_attachment.monitoring,
  ]

  lifecycle {
    precondition {
      condition     = var.max_allocated_storage == 0 || var.max_allocated_storage >= ceil(var.allocated_storage * 1.1)
      error_message = "max_allocated_storage must be 0 (no autoscaling) or at least 10% above allocated_storage."
    }

    precondition {
      condition     = var.dagster_db_name != var.mlflow_db_name
      error_message = "dagster_db_name and mlflow_db_name must differ: Dagster and MLflow both create tables named like `runs`."
    }
  }
}
