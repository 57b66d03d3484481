provider "aws" {
  region = var.region

  # Every resource the provider creates carries these; the eks module also copies them onto the
  # instances and volumes the node groups launch.
  default_tags {
    tags = merge(var.tags, {
      Project     = "agentic-flywheel"
      Environment = var.name
      ManagedBy   = "terraform"
    })
  }
}
