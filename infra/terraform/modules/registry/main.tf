# The private ECR repositories of the platform's images (docker/): trainer (GPU steps and the SFT
# job), dagster (the user code and every CPU step) and sandbox (the code-execution tool). Deploys
# name an image by tag, so a tag must always mean the same bytes: tags are immutable, and a
# rebuilt image gets a new tag (docker/README.md tags with the commit).

# One customer-managed key for the three repositories: its use shows up in CloudTrail under our
# key, and disabling it cuts off every pull at once. ECR encrypts layers through grants it creates
# on the key when a repository is created, so the nodes pulling images need no KMS permission.
resource "aws_kms_key" "this" {
  #checkov:skip=CKV2_AWS_64:The default key policy is intended here: it delegates the key to IAM policies in this account, which is all ECR needs to create its grants, and an explicit policy would only restate that.
  description             = "Encryption of the ${var.name_prefix} ECR repositories"
  enable_key_rotation     = true
  deletion_window_in_days = 30
  tags                    = var.tags
}

resource "aws_kms_alias" "this" {
  name          = "alias/${var.name_prefix}-ecr"
  target_key_id = aws_kms_key.this.key_id
}

resource "aws_ecr_repository" "this" {
  for_each = toset(var.repositories)

  name = "${var.name_prefix}-${each.value}"
  # A pushed tag cannot be moved to other bytes: what ran yesterday under a tag is what runs today.
  image_tag_mutability = "IMMUTABLE"
  force_delete         = var.force_delete

  # Basic scanning of every pushed image against the OS package CVE database; findings show in the
  # console and EventBridge before the image reaches the cluster.
  image_scanning_configuration {
    scan_on_push = true
  }

  encryption_configuration {
    encryption_type = "KMS"
    kms_key         = aws_kms_key.this.arn
  }

  tags = var.tags
}

# Only tagged images are counted and expired. `docker buildx build --push` uploads an image index
# whose per-platform and attestation manifests are untagged: a rule on untagged images could
# delete the insides of an image whose tag is still deployed.
locals {
  lifecycle_policy = {
    rules = [{
      rulePriority = 1
      description  = "Keep the ${var.keep_images} most recently pushed tagged images"
      selection = {
        tagStatus      = "tagged"
        tagPatternList = ["*"]
        countType      = "imageCountMoreThan"
        countNumber    = var.keep_images
      }
      action = { type = "expire" }
    }]
  }
}

resource "aws_ecr_lifecycle_policy" "this" {
  for_each = aws_ecr_repository.this

  repository = each.value.name
  policy     = jsonencode(local.lifecycle_policy)
}
