# An IAM role for one Kubernetes service account (IRSA) with a policy the caller writes, for the
# in-cluster controllers that need AWS APIs other than the artifact bucket (the irsa module's
# job): the cluster autoscaler, and whatever keeps the database password in sync with the secret
# RDS rotates. Only the trust policy is fixed here, and it is as tight as the irsa module's.

locals {
  subject = "system:serviceaccount:${var.namespace}:${var.service_account}"
}

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
  }
}

# Inline, not a managed policy: it belongs to this role alone and is deleted with it.
resource "aws_iam_role_policy" "this" {
  name   = var.policy_name
  role   = aws_iam_role.this.id
  policy = var.policy_json
}
