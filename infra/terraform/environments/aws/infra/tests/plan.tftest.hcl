# An offline plan of the whole environment against a mocked AWS provider: no credentials, no
# network, nothing created. It catches what `terraform validate` cannot: for_each keys that stay
# unknown until apply, failing preconditions and checks, module validations of planned values.
# Needs Terraform 1.7+ (mock providers):
#   terraform init -backend=false && terraform test
# tests/test_terraform_env.py runs it with the provider from the local plugin mirror.

mock_provider "aws" {
  # A mocked data source returns random strings; only the values the configuration inspects at
  # plan time are given real shapes here.

  # The network module's precondition compares az_count with the zones found.
  mock_data "aws_availability_zones" {
    defaults = {
      names = ["us-east-1a", "us-east-1b", "us-east-1c"]
    }
  }

  mock_data "aws_caller_identity" {
    defaults = {
      account_id = "123456789012"
      arn        = "arn:aws:sts::123456789012:assumed-role/platform-admin/ci"
    }
  }

  mock_data "aws_partition" {
    defaults = {
      partition  = "aws"
      dns_suffix = "amazonaws.com"
    }
  }

  # The provider still validates policy JSON when mocked.
  mock_data "aws_iam_policy_document" {
    defaults = {
      json = "{\"Version\":\"2012-10-17\",\"Statement\":[]}"
    }
  }

  # The role behind the caller's session, which the admin check looks for.
  mock_data "aws_iam_session_context" {
    defaults = {
      issuer_arn = "arn:aws:iam::123456789012:role/platform-admin"
    }
  }
}

# The values terraform.tfvars.example sets.
variables {
  region               = "us-east-1"
  bucket_name          = "example-org-flywheel-artifacts"
  image_tag            = "3f2c1ab"
  admin_principal_arns = ["arn:aws:iam::123456789012:role/platform-admin"]
}

run "plans_with_the_example_values" {
  command = plan

  assert {
    condition     = keys(output.flywheel_env) == ["AWS_REGION", "DAGSTER_PG_DB", "DAGSTER_PG_HOST", "DAGSTER_PG_USER", "FLYWHEEL_ARTIFACT_ROOT", "FLYWHEEL_IMAGE", "FLYWHEEL_PROFILE", "FLYWHEEL_SANDBOX_IMAGE", "FLYWHEEL_TRAINER_IMAGE", "MLFLOW_TRACKING_URI"]
    error_message = "flywheel_env must hold exactly the variables configs/cluster.yaml and the Dagster instance read."
  }

  assert {
    condition     = output.flywheel_env["FLYWHEEL_PROFILE"] == "cluster" && output.flywheel_env["AWS_REGION"] == "us-east-1"
    error_message = "flywheel_env must select the cluster profile in the environment's region."
  }

  assert {
    condition     = output.flywheel_env["MLFLOW_TRACKING_URI"] == "http://mlflow.flywheel.svc.cluster.local:5000"
    error_message = "MLFLOW_TRACKING_URI must be the MLflow Service in the app's namespace."
  }
}

# Someone who cannot reach the API is warned at plan time rather than at the platform layer.
run "warns_when_the_caller_is_not_a_cluster_admin" {
  command = plan

  variables {
    admin_principal_arns = ["arn:aws:iam::123456789012:role/someone-else"]
  }

  expect_failures = [check.caller_is_a_cluster_admin]
}
