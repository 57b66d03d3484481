# The in-cluster platform of the `cluster` profile, on any Kubernetes: the namespace, the service
# accounts and the one Role the app's pods need, the Secret flywheel-env the app reads its
# configuration from, the MLflow database, and the Dagster, MLflow and NVIDIA device plugin
# releases (releases.tf). Cloud-specific pieces (identity annotations, the node autoscaler) come
# from the caller: environments/aws/platform on EKS.

locals {
  # The only profile whose executor is `k8s` (configs/cluster.yaml); the code server loads it.
  profile = "cluster"

  # orchestration.k8s.env_secret: the app gives this Secret to every step and Pipes pod as env.
  env_secret_name = "flywheel-env"

  # What configs/cluster.yaml reads through ${VAR} and what orchestration.k8s.postgres_env names,
  # minus DAGSTER_PG_PASSWORD, which comes from db_password.
  required_env_keys = [
    "FLYWHEEL_PROFILE",
    "FLYWHEEL_ARTIFACT_ROOT",
    "FLYWHEEL_IMAGE",
    "FLYWHEEL_TRAINER_IMAGE",
    "FLYWHEEL_SANDBOX_IMAGE",
    "MLFLOW_TRACKING_URI",
    "DAGSTER_PG_HOST",
    "DAGSTER_PG_DB",
    "DAGSTER_PG_USER",
  ]

  # The sandbox service's token reaches the clients (the step and training pods) here, under
  # sandbox.token_env of configs/cluster.yaml, and the service from its own Secret below.
  flywheel_env_secret = merge(var.env, { DAGSTER_PG_PASSWORD = var.db_password, FLYWHEEL_SANDBOX_TOKEN = var.sandbox_token })

  # The Secret and key the sandbox service reads its token from: pipelines/k8s_manifests.py
  # (SANDBOX_TOKEN_SECRET, SANDBOX_TOKEN_KEY) renders the service's Deployment with these.
  sandbox_token_secret = "flywheel-sandbox-token"
  sandbox_token_key    = "token"

  # The Secret the Dagster chart reads the instance's Postgres password from (its global
  # postgresqlSecretName): webserver, daemon, and run pods through the run launcher.
  dagster_postgres_secret = "dagster-postgresql-secret"
  # MLflow's backend-store credentials (the chart's existingDatabaseSecret), also the job's.
  mlflow_database_secret = "mlflow-database"
}

resource "kubernetes_namespace_v1" "this" {
  metadata {
    name = var.namespace
  }
}

# --- Identities -------------------------------------------------------------------------------

# Every Dagster pod runs as this account: the chart's webserver, daemon and code server (its
# global serviceAccountName), the run pods the K8sRunLauncher starts, the step pods of the
# k8s_job_executor and the training pods PipesK8sClient starts (pipelines/k8s.py). One account,
# because run and step pods are where the S3 access is needed and the daemon is what starts them.
resource "kubernetes_service_account_v1" "runner" {
  metadata {
    name        = var.runner_service_account
    namespace   = kubernetes_namespace_v1.this.metadata[0].name
    annotations = var.runner_service_account_annotations
  }
}

# The MLflow server never calls the Kubernetes API, so its pods get no API token (the IRSA web
# identity token is a separate projected volume and still mounted).
resource "kubernetes_service_account_v1" "mlflow" {
  metadata {
    name        = var.mlflow_service_account
    namespace   = kubernetes_namespace_v1.this.metadata[0].name
    annotations = var.mlflow_service_account_annotations
  }

  automount_service_account_token = false
}

# What dagster-k8s calls (its client.py and pipes.py): the run launcher and the k8s_job_executor
# create, watch and delete Jobs and read their status subresource; run monitoring and step
# health checks list pods and events and read logs; PipesK8sClient creates a bare pod, watches
# it, streams its log and deletes it; the multi-node launch adds an Indexed Job's headless
# Service. Namespaced and without wildcards: nothing cluster-wide, no
# Secrets read through the API. (Creating pods does let this account use the namespace's Secrets
# through a pod's env, which is why the namespace holds only what the app's pods already get.)
resource "kubernetes_role_v1" "runner" {
  metadata {
    name      = var.runner_service_account
    namespace = kubernetes_namespace_v1.this.metadata[0].name
  }

  rule {
    api_groups = ["batch"]
    resources  = ["jobs"]
    verbs      = ["create", "get", "list", "watch", "delete"]
  }

  rule {
    api_groups = ["batch"]
    resources  = ["jobs/status"]
    verbs      = ["get"]
  }

  rule {
    api_groups = [""]
    resources  = ["pods"]
    verbs      = ["create", "get", "list", "watch", "delete"]
  }

  rule {
    api_groups = [""]
    resources  = ["pods/log", "pods/status"]
    verbs      = ["get"]
  }

  rule {
    api_groups = [""]
    resources  = ["events"]
    verbs      = ["list"]
  }

  # The multi-node launch (pipelines/k8s_launch.py): each such step's headless Service, through
  # which its pods find rank 0; created and deleted with the step's Indexed Job.
  rule {
    api_groups = [""]
    resources  = ["services"]
    verbs      = ["create", "delete"]
  }
}

resource "kubernetes_role_binding_v1" "runner" {
  metadata {
    name      = var.runner_service_account
    namespace = kubernetes_namespace_v1.this.metadata[0].name
  }

  role_ref {
    api_group = "rbac.authorization.k8s.io"
    kind      = "Role"
    name      = kubernetes_role_v1.runner.metadata[0].name
  }

  subject {
    kind      = "ServiceAccount"
    name      = kubernetes_service_account_v1.runner.metadata[0].name
    namespace = kubernetes_namespace_v1.this.metadata[0].name
  }
}

# --- Secrets ------------------------------------------------------------------------------------

# The app's whole configuration from outside: configs/cluster.yaml's ${VAR} references and the
# instance's DAGSTER_PG_* variables. The preconditions keep it from disagreeing with what this
# module deploys, which would otherwise only show as runs failing to connect.
resource "kubernetes_secret_v1" "flywheel_env" {
  metadata {
    name      = local.env_secret_name
    namespace = kubernetes_namespace_v1.this.metadata[0].name
  }

  type = "Opaque"
  data = local.flywheel_env_secret

  lifecycle {
    precondition {
      condition     = length(setsubtract(local.required_env_keys, keys(var.env))) == 0
      error_message = "env lacks ${join(", ", setsubtract(local.required_env_keys, keys(var.env)))}: configs/cluster.yaml or the Dagster instance reads them."
    }

    precondition {
      condition     = lookup(var.env, "FLYWHEEL_PROFILE", "") == local.profile
      error_message = "env FLYWHEEL_PROFILE must be ${local.profile}, the profile the code server loads."
    }

    precondition {
      condition     = lookup(var.env, "MLFLOW_TRACKING_URI", "") == local.mlflow_tracking_uri
      error_message = "env MLFLOW_TRACKING_URI must be ${local.mlflow_tracking_uri}, the MLflow Service this module creates."
    }

    precondition {
      condition = (lookup(var.env, "DAGSTER_PG_HOST", "") == var.db_host
        && lookup(var.env, "DAGSTER_PG_DB", "") == var.dagster_database_name
      && lookup(var.env, "DAGSTER_PG_USER", "") == var.db_username)
      error_message = "env DAGSTER_PG_HOST, DAGSTER_PG_DB and DAGSTER_PG_USER must equal db_host, dagster_database_name and db_username: the chart's instance and the app's must be the same database."
    }

    precondition {
      condition     = lookup(var.env, "FLYWHEEL_IMAGE", "") == var.dagster_image && lookup(var.env, "FLYWHEEL_ARTIFACT_ROOT", "") == var.artifact_root
      error_message = "env FLYWHEEL_IMAGE and FLYWHEEL_ARTIFACT_ROOT must equal dagster_image and artifact_root."
    }
  }
}

resource "kubernetes_secret_v1" "dagster_postgresql" {
  metadata {
    name      = local.dagster_postgres_secret
    namespace = kubernetes_namespace_v1.this.metadata[0].name
  }

  type = "Opaque"
  # The key the chart reads (its secretKeyRef and the run launcher's postgres_password_secret).
  data = { "postgresql-password" = var.db_password }
}

resource "kubernetes_secret_v1" "mlflow_database" {
  metadata {
    name      = local.mlflow_database_secret
    namespace = kubernetes_namespace_v1.this.metadata[0].name
  }

  type = "Opaque"
  data = {
    username = var.db_username
    password = var.db_password
  }
}

# The sandbox service's shared secret alone, so that its pod (which runs policy-written code) gets
# nothing of flywheel-env: no database password, no bucket, no image references.
resource "kubernetes_secret_v1" "sandbox_token" {
  metadata {
    name      = local.sandbox_token_secret
    namespace = kubernetes_namespace_v1.this.metadata[0].name
  }

  type = "Opaque"
  data = { (local.sandbox_token_key) = var.sandbox_token }
}
