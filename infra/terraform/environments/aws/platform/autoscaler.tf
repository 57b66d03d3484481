# The cluster autoscaler: adds gpu nodes when GPU steps are pending and removes them when idle,
# the cpu group between its bounds. AWS-specific (Auto Scaling groups), hence here and not in
# modules/platform.

locals {
  kubernetes_minor = data.aws_eks_cluster.this.version

  # The name and namespace the infra layer's autoscaler role trusts.
  autoscaler_service_account = "cluster-autoscaler"
  autoscaler_namespace       = "kube-system"

  cluster_autoscaler_values = {
    cloudProvider = "aws"
    awsRegion     = local.infra.region
    # Finds both node groups by the tags the eks module puts on their Auto Scaling groups
    # (k8s.io/cluster-autoscaler/enabled and .../<cluster>). For the gpu group at zero nodes it
    # builds the would-be node from the node-template tags (label, taint, nvidia.com/gpu) and
    # eks:DescribeNodegroup, which is what lets a pending GPU pod scale it up from nothing.
    autoDiscovery = { clusterName = data.aws_eks_cluster.this.name }
    image         = { tag = local.cluster_autoscaler_image_tag }

    rbac = {
      serviceAccount = {
        create      = true
        name        = local.autoscaler_service_account
        annotations = { "eks.amazonaws.com/role-arn" = local.infra.autoscaler_role_arn }
      }
    }

    # Beside the platform's services on the always-on cpu nodes: never on a gpu node it might
    # remove, and up while the gpu group is at zero.
    nodeSelector      = module.platform.cpu_node_selector
    priorityClassName = "system-cluster-critical"

    extraArgs = {
      # Scale-down: an idle GPU node goes after scale_down_unneeded_time, not the default 10m,
      # and waits as long after a scale-up (not 10m) before it may be considered.
      "scale-down-unneeded-time"   = var.scale_down_unneeded_time
      "scale-down-delay-after-add" = var.scale_down_unneeded_time
      # Utilization without DaemonSets (device plugin, CNI, kube-proxy): a GPU node running only
      # those counts as empty.
      "ignore-daemonsets-utilization" = true
      # Of the groups that fit a pending pod, the one that leaves the least CPU and memory idle.
      expander = "least-waste"
    }
  }

  cluster_autoscaler_image_tag = lookup(var.cluster_autoscaler_image_tags, local.kubernetes_minor, null)
}

resource "helm_release" "cluster_autoscaler" {
  name       = "cluster-autoscaler"
  namespace  = local.autoscaler_namespace
  repository = "https://kubernetes.github.io/autoscaler"
  chart      = "cluster-autoscaler"
  version    = var.cluster_autoscaler_chart_version
  values     = [yamlencode(local.cluster_autoscaler_values)]

  lifecycle {
    precondition {
      condition     = local.cluster_autoscaler_image_tag != null
      error_message = "No cluster autoscaler image for Kubernetes ${local.kubernetes_minor}: add it to cluster_autoscaler_image_tags (the autoscaler must be the cluster's minor version)."
    }
  }
}
