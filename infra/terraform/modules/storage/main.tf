# The artifact bucket of the cluster profile: storage.root (configs/cluster.yaml) is the
# artifact_root output. Datasets (Parquet), checkpoints and MLflow artifacts all live here, so
# the defaults lean towards keeping data: versioning on, no force_destroy, TLS only.

locals {
  access_log_prefix = coalesce(var.access_log_prefix, "s3-access-logs/${var.bucket_name}/")
}

# A customer-managed key rather than aws/s3: its key policy and CloudTrail trail are ours, it can be
# disabled to cut off every reader at once, and IRSA policies can name it precisely. No key policy
# is set, so the default one applies and delegates access to IAM policies in this account (the
# irsa module grants the pods kms:Decrypt/Encrypt/GenerateDataKey on this key alone).
resource "aws_kms_key" "this" {
  #checkov:skip=CKV2_AWS_64:The default key policy is intended here: it delegates the key to IAM policies in this account, and an explicit policy would only restate its kms:* grant to the account root.
  description             = "SSE-KMS key of the ${var.bucket_name} artifact bucket"
  enable_key_rotation     = true
  deletion_window_in_days = 30
  tags                    = var.tags
}

resource "aws_kms_alias" "this" {
  name          = "alias/${var.bucket_name}-s3"
  target_key_id = aws_kms_key.this.key_id
}

resource "aws_s3_bucket" "this" {
  #checkov:skip=CKV_AWS_144:No cross-region replica: datasets and checkpoints are rebuilt by re-running the Dagster graph, versioning already undoes overwrites and deletes, and a second copy of every multi-GB checkpoint would double the storage bill.
  #checkov:skip=CKV2_AWS_62:Nothing consumes bucket events: Dagster sensors and MLflow find new objects by listing prefixes, and this stack has no Lambda, SQS or SNS target to notify.
  bucket        = var.bucket_name
  force_destroy = var.force_destroy
  tags          = var.tags
}

# ACLs disabled: access is decided by IAM and the bucket policy alone, and every object belongs to
# the bucket owner whoever uploaded it.
resource "aws_s3_bucket_ownership_controls" "this" {
  bucket = aws_s3_bucket.this.id

  rule {
    object_ownership = "BucketOwnerEnforced"
  }
}

resource "aws_s3_bucket_public_access_block" "this" {
  bucket = aws_s3_bucket.this.id

  block_public_acls       = true
  block_public_policy     = true
  ignore_public_acls      = true
  restrict_public_buckets = true
}

# Checkpoints and datasets are overwritten in place by re-materialized assets; versions make an
# overwrite or delete recoverable for noncurrent_version_expiration_days.
resource "aws_s3_bucket_versioning" "this" {
  bucket = aws_s3_bucket.this.id

  versioning_configuration {
    status = "Enabled"
  }
}

resource "aws_s3_bucket_server_side_encryption_configuration" "this" {
  bucket = aws_s3_bucket.this.id

  rule {
    apply_server_side_encryption_by_default {
      sse_algorithm     = "aws:kms"
      kms_master_key_id = aws_kms_key.this.arn
    }
    # Checkpoints and Parquet partitions are many objects; a bucket key is reused across them for a
    # while, so S3 calls KMS far less often (cost, and no KMS request throttling on large uploads).
    bucket_key_enabled = true
  }
}

resource "aws_s3_bucket_lifecycle_configuration" "this" {
  bucket = aws_s3_bucket.this.id

  # Rules on noncurrent versions are rejected until versioning is on.
  depends_on = [aws_s3_bucket_versioning.this]

  rule {
    id     = "abort-incomplete-multipart-uploads"
    status = "Enabled"

    filter {}

    abort_incomplete_multipart_upload {
      days_after_initiation = var.abort_incomplete_multipart_upload_days
    }
  }

  rule {
    id     = "expire-noncurrent-versions"
    status = "Enabled"

    filter {}

    noncurrent_version_expiration {
      noncurrent_days = var.noncurrent_version_expiration_days
    }

    # Once a deleted key's old versions have expired, its delete marker is all that is left; removing
    # it keeps listings (which s3fs walks) from growing without bound.
    expiration {
      expired_object_delete_marker = true
    }
  }

  dynamic "rule" {
    for_each = toset(var.infrequent_access_prefixes)

    content {
      id     = "standard-ia-${trimsuffix(replace(rule.value, "/", "-"), "-")}"
      status = "Enabled"

      filter {
        prefix = "${var.artifact_prefix}/${rule.value}"
      }

      transition {
        days          = var.infrequent_access_transition_days
        storage_class = "STANDARD_IA"
      }
    }
  }
}

# Deny (rather than omit an allow) so that no identity policy, however broad, can read or write
# over plain HTTP. s3:* is deliberate: a TLS guard must cover every S3 action, and AWS Config's
# s3-bucket-ssl-requests-only check looks for exactly this statement.
data "aws_iam_policy_document" "bucket" {
  statement {
    sid     = "DenyInsecureTransport"
    effect  = "Deny"
    actions = ["s3:*"]
    resources = [
      aws_s3_bucket.this.arn,
      "${aws_s3_bucket.this.arn}/*",
    ]

    principals {
      type        = "*"
      identifiers = ["*"]
    }

    condition {
      test     = "Bool"
      variable = "aws:SecureTransport"
      values   = ["false"]
    }
  }

  statement {
    sid     = "DenyOutdatedTls"
    effect  = "Deny"
    actions = ["s3:*"]
    resources = [
      aws_s3_bucket.this.arn,
      "${aws_s3_bucket.this.arn}/*",
    ]

    principals {
      type        = "*"
      identifiers = ["*"]
    }

    condition {
      test     = "NumericLessThan"
      variable = "s3:TlsVersion"
      values   = ["1.2"]
    }
  }
}

resource "aws_s3_bucket_policy" "this" {
  bucket = aws_s3_bucket.this.id
  policy = data.aws_iam_policy_document.bucket.json

  # Concurrent PutBucketPolicy and PutPublicAccessBlock calls on one bucket can fail with
  # OperationAborted; ordering them avoids it.
  depends_on = [aws_s3_bucket_public_access_block.this]
}

resource "aws_s3_bucket_logging" "this" {
  count = var.access_log_bucket == null ? 0 : 1

  bucket        = aws_s3_bucket.this.id
  target_bucket = var.access_log_bucket
  target_prefix = local.access_log_prefix

  lifecycle {
    precondition {
      condition     = var.access_log_bucket != var.bucket_name
      error_message = "access_log_bucket must differ from bucket_name: logging a bucket into itself logs every log delivery, without end."
    }
  }
}
