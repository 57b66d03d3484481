terraform {
  # 1.6 is the oldest release whose validation/precondition semantics these modules were written against.
  required_version = ">= 1.6"

  required_providers {
    aws = {
      source  = "hashicorp/aws"
      version = "~> 5.0"
    }
  }
}
