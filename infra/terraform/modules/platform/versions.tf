terraform {
  required_version = ">= 1.6"

  required_providers {
    # 3.x: the *_v1 resources used here are the names 3.x does not deprecate; their nested blocks
    # are the same as in 2.x.
    kubernetes = {
      source  = "hashicorp/kubernetes"
      version = "~> 3.0"
    }
    # 3.x: the caller configures it with `kubernetes = { ... }` (an attribute; 2.x took a block).
    # The releases below pass everything through `values`, which both majors accept the same way.
    helm = {
      source  = "hashicorp/helm"
      version = "~> 3.0"
    }
  }
}
