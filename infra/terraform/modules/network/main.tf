# VPC for the flywheel's EKS cluster: nodes live in private subnets and reach the internet
# (image registries, Hugging Face, S3 outside the gateway endpoint) through NAT; public
# subnets only hold the NAT gateway(s) and internet-facing load balancers.

data "aws_availability_zones" "available" {
  #checkov:skip=CKV_AWS_394:The module is region-agnostic, so it cannot allowlist zone names or IDs; subnets take the first az_count names of the provider's sorted list, and a zone AWS adds later gets a new letter that sorts after them, so no existing subnet moves.
  state = "available"

  # Local and Wavelength zones lack most instance types (and all GPU ones we use); keep to
  # the region's regular zones.
  filter {
    name   = "opt-in-status"
    values = ["opt-in-not-required"]
  }
}

data "aws_region" "current" {}

data "aws_caller_identity" "current" {}

data "aws_partition" "current" {}

locals {
  # min() keeps this local evaluable when the region has too few zones, so that the VPC's
  # precondition, not an index error, is what reports it.
  azs = slice(data.aws_availability_zones.available.names, 0, min(var.az_count, length(data.aws_availability_zones.available.names)))

  # Eight equal slices of the VPC: with the VPC CNI every pod takes a VPC address, so the
  # private subnets get a whole slice each (a /19 of a /16: ~8k pods per zone). The last slice
  # is split again for the public subnets, which only hold NAT gateways and load balancers.
  # Indexing by zone keeps existing subnets in place when az_count grows.
  private_subnet_cidrs = [for i in range(var.az_count) : cidrsubnet(var.vpc_cidr, 3, i)]
  public_subnet_cidrs  = [for i in range(var.az_count) : cidrsubnet(cidrsubnet(var.vpc_cidr, 3, 7), 3, i)]

  nat_gateway_count = var.single_nat_gateway ? 1 : var.az_count

  # The AWS load balancer controller and the in-tree service controller pick subnets by these
  # tags: elb for internet-facing load balancers, internal-elb for internal ones. "shared"
  # because the VPC outlives the cluster (it is not deleted with it).
  public_subnet_tags = {
    "kubernetes.io/cluster/${var.cluster_name}" = "shared"
    "kubernetes.io/role/elb"                    = "1"
  }
  private_subnet_tags = {
    "kubernetes.io/cluster/${var.cluster_name}" = "shared"
    "kubernetes.io/role/internal-elb"           = "1"
  }

  flow_log_group_name = "/aws/vpc-flow-log/${var.cluster_name}"
}

resource "aws_vpc" "this" {
  cidr_block = var.vpc_cidr

  # EKS requires both: nodes register under their private DNS names and the private API
  # endpoint is resolved through the VPC's resolver.
  enable_dns_support   = true
  enable_dns_hostnames = true

  tags = merge(var.tags, { Name = var.cluster_name })

  # Everything that indexes local.azs depends on the VPC, so checking here stops the plan
  # before any of them fails with a bare index error.
  lifecycle {
    precondition {
      condition     = length(data.aws_availability_zones.available.names) >= var.az_count
      error_message = "az_count is larger than the number of availability zones available in this region."
    }
  }
}

# With no ingress or egress blocks this strips every rule from the default security group,
# so anything launched without an explicit group is isolated rather than open to the VPC.
resource "aws_default_security_group" "default" {
  vpc_id = aws_vpc.this.id

  tags = merge(var.tags, { Name = "${var.cluster_name}-default-deny" })
}

resource "aws_subnet" "private" {
  count = var.az_count

  vpc_id            = aws_vpc.this.id
  cidr_block        = local.private_subnet_cidrs[count.index]
  availability_zone = local.azs[count.index]

  tags = merge(var.tags, local.private_subnet_tags, { Name = "${var.cluster_name}-private-${local.azs[count.index]}" })
}

resource "aws_subnet" "public" {
  count = var.az_count

  vpc_id            = aws_vpc.this.id
  cidr_block        = local.public_subnet_cidrs[count.index]
  availability_zone = local.azs[count.index]

  # Nothing but NAT gateways (Elastic IPs) and load balancers (their own addresses) belongs
  # here, so an instance landing in a public subnet by mistake must not become reachable.
  map_public_ip_on_launch = false

  tags = merge(var.tags, local.public_subnet_tags, { Name = "${var.cluster_name}-public-${local.azs[count.index]}" })
}

resource "aws_internet_gateway" "this" {
  vpc_id = aws_vpc.this.id

  tags = merge(var.tags, { Name = var.cluster_name })
}

resource "aws_eip" "nat" {
  count = local.nat_gateway_count

  domain = "vpc"

  tags = merge(var.tags, { Name = "${var.cluster_name}-nat-${local.azs[count.index]}" })

  # An EIP associated before the gateway exists cannot route; AWS rejects it.
  depends_on = [aws_internet_gateway.this]
}

resource "aws_nat_gateway" "this" {
  count = local.nat_gateway_count

  allocation_id = aws_eip.nat[count.index].id
  subnet_id     = aws_subnet.public[count.index].id

  tags = merge(var.tags, { Name = "${var.cluster_name}-${local.azs[count.index]}" })

  depends_on = [aws_internet_gateway.this]
}

resource "aws_route_table" "public" {
  vpc_id = aws_vpc.this.id

  tags = merge(var.tags, { Name = "${var.cluster_name}-public" })
}

resource "aws_route" "public_internet" {
  route_table_id         = aws_route_table.public.id
  destination_cidr_block = "0.0.0.0/0"
  gateway_id             = aws_internet_gateway.this.id
}

resource "aws_route_table_association" "public" {
  count = var.az_count

  subnet_id      = aws_subnet.public[count.index].id
  route_table_id = aws_route_table.public.id
}

# One route table per zone even with a single NAT gateway: switching single_nat_gateway off
# then only changes the default routes, not the tables and associations.
resource "aws_route_table" "private" {
  count = var.az_count

  vpc_id = aws_vpc.this.id

  tags = merge(var.tags, { Name = "${var.cluster_name}-private-${local.azs[count.index]}" })
}

resource "aws_route" "private_nat" {
  count = var.az_count

  route_table_id         = aws_route_table.private[count.index].id
  destination_cidr_block = "0.0.0.0/0"
  nat_gateway_id         = aws_nat_gateway.this[var.single_nat_gateway ? 0 : count.index].id
}

resource "aws_route_table_association" "private" {
  count = var.az_count

  subnet_id      = aws_subnet.private[count.index].id
  route_table_id = aws_route_table.private[count.index].id
}

# Checkpoints, datasets and MLflow artifacts go to S3; a gateway endpoint is free, whereas
# the same gigabytes through NAT are billed per GB processed.
resource "aws_vpc_endpoint" "s3" {
  vpc_id            = aws_vpc.this.id
  service_name      = "com.amazonaws.${data.aws_region.current.name}.s3"
  vpc_endpoint_type = "Gateway"
  route_table_ids   = concat(aws_route_table.private[*].id, [aws_route_table.public.id])

  tags = merge(var.tags, { Name = "${var.cluster_name}-s3" })
}

# --- Flow logs -------------------------------------------------------------------------------
# Kept for a year, encrypted with a key we control: they are the record of what the sandboxed
# agent workloads talked to.

data "aws_iam_policy_document" "flow_logs_key" {
  # A key policy's Resource can only be "*", which means the key the policy is attached to.
  #checkov:skip=CKV_AWS_109:This is a KMS key policy, where Resource "*" is the key itself, and kms:* for the account root is AWS's default administration statement that delegates to IAM.
  #checkov:skip=CKV_AWS_111:This is a KMS key policy, where Resource "*" is the key itself; the CloudWatch Logs statement is further limited to this one log group by its encryption-context condition.
  #checkov:skip=CKV_AWS_356:This is a KMS key policy, where Resource "*" is the only value KMS accepts and means the key the policy is attached to, not every resource.
  # Without this statement the key would be usable by nobody in the account but the service.
  statement {
    sid       = "AccountAdministration"
    actions   = ["kms:*"]
    resources = ["*"]

    principals {
      type        = "AWS"
      identifiers = ["arn:${data.aws_partition.current.partition}:iam::${data.aws_caller_identity.current.account_id}:root"]
    }
  }

  # CloudWatch Logs encrypts with the key on the log group's behalf; the encryption-context
  # condition limits that to this one log group.
  statement {
    sid = "CloudWatchLogsFlowLogGroup"
    actions = [
      "kms:Encrypt*",
      "kms:Decrypt*",
      "kms:ReEncrypt*",
      "kms:GenerateDataKey*",
      "kms:Describe*",
    ]
    resources = ["*"]

    principals {
      type        = "Service"
      identifiers = ["logs.${data.aws_region.current.name}.amazonaws.com"]
    }

    condition {
      test     = "ArnEquals"
      variable = "kms:EncryptionContext:aws:logs:arn"
      values   = ["arn:${data.aws_partition.current.partition}:logs:${data.aws_region.current.name}:${data.aws_caller_identity.current.account_id}:log-group:${local.flow_log_group_name}"]
    }
  }
}

resource "aws_kms_key" "flow_logs" {
  description             = "VPC flow logs of ${var.cluster_name}"
  enable_key_rotation     = true
  deletion_window_in_days = 30
  policy                  = data.aws_iam_policy_document.flow_logs_key.json

  tags = var.tags
}

resource "aws_kms_alias" "flow_logs" {
  name          = "alias/${var.cluster_name}-vpc-flow-logs"
  target_key_id = aws_kms_key.flow_logs.key_id
}

resource "aws_cloudwatch_log_group" "flow_logs" {
  name              = local.flow_log_group_name
  retention_in_days = var.flow_log_retention_days
  kms_key_id        = aws_kms_key.flow_logs.arn

  tags = var.tags
}

data "aws_iam_policy_document" "flow_logs_assume" {
  statement {
    actions = ["sts:AssumeRole"]

    principals {
      type        = "Service"
      identifiers = ["vpc-flow-logs.amazonaws.com"]
    }

    # Stops another account's flow log from borrowing this role (confused deputy).
    condition {
      test     = "StringEquals"
      variable = "aws:SourceAccount"
      values   = [data.aws_caller_identity.current.account_id]
    }
  }
}

resource "aws_iam_role" "flow_logs" {
  name               = "${var.cluster_name}-vpc-flow-logs"
  assume_role_policy = data.aws_iam_policy_document.flow_logs_assume.json

  tags = var.tags
}

data "aws_iam_policy_document" "flow_logs_write" {
  # Scoped to the one log group rather than logs:* on "*", which AWS's example policy uses.
  statement {
    actions = [
      "logs:CreateLogStream",
      "logs:PutLogEvents",
      "logs:DescribeLogGroups",
      "logs:DescribeLogStreams",
    ]
    resources = [
      aws_cloudwatch_log_group.flow_logs.arn,
      "${aws_cloudwatch_log_group.flow_logs.arn}:*",
    ]
  }
}

resource "aws_iam_role_policy" "flow_logs" {
  name   = "write-flow-logs"
  role   = aws_iam_role.flow_logs.id
  policy = data.aws_iam_policy_document.flow_logs_write.json
}

resource "aws_flow_log" "vpc" {
  vpc_id               = aws_vpc.this.id
  traffic_type         = var.flow_log_traffic_type
  log_destination_type = "cloud-watch-logs"
  log_destination      = aws_cloudwatch_log_group.flow_logs.arn
  iam_role_arn         = aws_iam_role.flow_logs.arn

  tags = merge(var.tags, { Name = var.cluster_name })

  # The role's permissions must exist before the first delivery attempt, or the flow log
  # starts in an error state.
  depends_on = [aws_iam_role_policy.flow_logs]
}
