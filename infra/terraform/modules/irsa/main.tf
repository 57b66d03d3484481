# An IAM role for one Kubernetes service account (IRSA): the step pods' flywheel-runner, or the
# MLflow server's own account. Each gets artifact access under its own prefixes and nothing else,
# so a compromised pod cannot reach other buckets, other prefixes, or other AWS services.

locals {
  # Condition keys of the cluster's OIDC provider are named after its issuer URL.
  subject          = "system:serviceaccount:${var.namespace}:${var.service_account}"
  bucket_region    = split(":", var.kms_key_arn)[3]
  object_resources = [for p in var.bucket_prefixes : "${var.bucket_arn}/${p}/*"]
  # s3fs lists both "<prefix>" (is it a directory?) and "<prefix>/..." (its contents).
  list_prefixes = flatten([for p in var.bucket_prefixes : [p, "${p}/*"]])
}

data "aws_partition" "current" {}

# StringEquals on both keys: `sub` pins the exact namespace and service account (any other pod's
# token is refused, even in the same namespace), `aud` refuses tokens minted for another audience.
data "aws_iam_policy_document" "trust" {
  statement {
    sid     = "ServiceAccountWebIdentity"
    effect  = "Allow"
    actions = ["sts:AssumeRoleWithWebIdentity"]

    principals {
      type        = "Federated"
      identifiers = [var.oidc_provider_arn]
    }

    condition {
      test     = "StringEquals"
      variable = "${var.oidc_provider_url}:sub"
      values   = [local.subject]
    }

    condition {
      test     = "StringEquals"
      variable = "${var.oidc_provider_url}:aud"
      values   = ["sts.amazonaws.com"]
    }
  }
}

resource "aws_iam_role" "this" {
  name                 = var.role_name
  description          = "IRSA role of ${local.subject}"
  assume_role_policy   = data.aws_iam_policy_document.trust.json
  permissions_boundary = var.permissions_boundary_arn
  tags                 = var.tags

  lifecycle {
    precondition {
      condition     = endswith(var.oidc_provider_arn, ":oidc-provider/${var.oidc_provider_url}")
      error_message = "oidc_provider_url must be the URL oidc_provider_arn was created for; otherwise no token ever matches the trust conditions."
    }

    precondition {
      condition     = var.secret_kms_key_arn == null || var.secret_arn != null
      error_message = "secret_kms_key_arn is only meaningful with secret_arn."
    }
  }
}

data "aws_iam_policy_document" "access" {
  # Listing is what s3fs does for ls/exists/glob; the prefix condition keeps the role from
  # enumerating keys outside its prefixes (a listing without a prefix is refused too).
  statement {
    sid       = "ListArtifactPrefixes"
    effect    = "Allow"
    actions   = ["s3:ListBucket"]
    resources = [var.bucket_arn]

    condition {
      test     = "StringLike"
      variable = "s3:prefix"
      values   = local.list_prefixes
    }
  }

  # DeleteObject: clearing stale files of a re-materialized asset; the bucket is versioned, so a
  # delete only adds a marker and stays recoverable. AbortMultipartUpload: a failed checkpoint
  # upload is cleaned up by the writer instead of waiting for the lifecycle rule.
  statement {
    sid    = "ReadWriteArtifacts"
    effect = "Allow"
    actions = [
      "s3:GetObject",
      "s3:PutObject",
      "s3:DeleteObject",
      "s3:AbortMultipartUpload",
    ]
    resources = local.object_resources
  }

  # SSE-KMS: uploads need GenerateDataKey, downloads Decrypt. kms:ViaService limits the key to
  # requests S3 makes on the role's behalf; the role cannot call KMS with it directly.
  statement {
    sid    = "UseArtifactKeyThroughS3"
    effect = "Allow"
    actions = [
      "kms:Decrypt",
      "kms:Encrypt",
      "kms:GenerateDataKey",
    ]
    resources = [var.kms_key_arn]

    condition {
      test     = "StringEquals"
      variable = "kms:ViaService"
      values   = ["s3.${local.bucket_region}.${data.aws_partition.current.dns_suffix}"]
    }
  }

  dynamic "statement" {
    for_each = var.secret_arn == null ? [] : [var.secret_arn]

    content {
      sid       = "ReadDatabaseSecret"
      effect    = "Allow"
      actions   = ["secretsmanager:GetSecretValue", "secretsmanager:DescribeSecret"]
      resources = [statement.value]
    }
  }

  # Only needed when the secret is encrypted with a customer-managed key (the database module's);
  # aws/secretsmanager is usable by any principal allowed to read the secret.
  dynamic "statement" {
    for_each = var.secret_arn != null && var.secret_kms_key_arn != null ? [var.secret_kms_key_arn] : []

    content {
      sid       = "DecryptDatabaseSecret"
      effect    = "Allow"
      actions   = ["kms:Decrypt"]
      resources = [statement.value]

      condition {
        test     = "StringEquals"
        variable = "kms:ViaService"
        values   = ["secretsmanager.${split(":", var.secret_arn)[3]}.${data.aws_partition.current.dns_suffix}"]
      }
    }
  }
}

# Inline, not a managed policy: it is specific to this role and is deleted with it, so it can never
# be attached to anything else.
resource "aws_iam_role_policy" "access" {
  name   = "artifact-access"
  role   = aws_iam_role.this.id
  policy = data.aws_iam_policy_document.access.json
}
