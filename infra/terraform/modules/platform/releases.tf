# The Helm releases. Values are plain maps in locals, passed once through yamlencode, so they can
# be read (and tested) as data. Keys were read from the charts' sources (the 2026 development
# branches, not the exact tags; `helm template` against the pinned versions is the final check):
#   dagster               dagster-io/dagster helm/dagster: schema/, templates/helpers/instance/*.tpl
#   mlflow                community-charts/helm-charts charts/mlflow: values.yaml, values.schema.json
#   nvidia-device-plugin  NVIDIA/k8s-device-plugin deployments/helm/nvidia-device-plugin/values.yaml

locals {
  dagster_image         = regex("^(?P<repository>.+):(?P<tag>[^:/]+)$", var.dagster_image)
  postgres_client_image = regex("^(?P<repository>.+):(?P<tag>[^:/]+)$", var.postgres_client_image)

  # Tags are commit hashes (docker/README.md): an image once pulled never changes under its tag.
  dagster_chart_image = {
    repository = local.dagster_image.repository
    tag        = local.dagster_image.tag
    pullPolicy = "IfNotPresent"
  }

  # Changes with the database password, so a re-apply after a rotation rolls the long-lived pods
  # (which read Secrets as env only at start); run and step pods start fresh anyway.
  pod_annotations = { "flywheel/credentials-revision" = var.credentials_revision }

  # --- Dagster ------------------------------------------------------------------------------

  # Release "dagster": the chart names the instance ConfigMap "<release>-instance", the name
  # pipelines/instance.py (INSTANCE_CONFIG_MAP) and its run launcher settings use, and the
  # webserver Service "<release>-webserver".
  dagster_release           = "dagster"
  dagster_webserver_service = "${local.dagster_release}-webserver"
  # dagster-webserver's own default port, not the chart's 80: the image runs as uid 10001, and a
  # non-root process may not bind below 1024 on nodes that keep the kernel's default.
  dagster_webserver_port = 3000
  # docker/dagster.Dockerfile's CMD: `dagster api grpc -m pipelines.definitions -h 0.0.0.0 -p 4000`.
  user_code_module = "pipelines.definitions"
  user_code_port   = 4000

  dagster_values = {
    global = {
      serviceAccountName   = var.runner_service_account
      postgresqlSecretName = local.dagster_postgres_secret
      dagsterHome          = "/opt/dagster/dagster_home" # pipelines/instance.py DAGSTER_HOME_IN_POD
    }
    # The account and its Role are this module's (main.tf), with the permissions dagster-k8s
    # uses rather than the chart's "*" on jobs, pods and events.
    serviceAccount = { create = false }
    rbacEnabled    = false
    telemetry      = { enabled = false }

    generatePostgresqlPasswordSecret = false
    postgresql = {
      enabled            = false
      postgresqlHost     = var.db_host
      postgresqlUsername = var.db_username
      postgresqlDatabase = var.dagster_database_name
      # The server refuses clients without TLS (rds.force_ssl on AWS); require it client-side too.
      postgresqlParams = { sslmode = "require" }
      service          = { port = var.db_port }
      # The chart's wait-for-database init container (pg_isready).
      image = {
        repository = local.postgres_client_image.repository
        tag        = local.postgres_client_image.tag
        pullPolicy = "IfNotPresent"
      }
    }

    dagsterWebserver = {
      image        = local.dagster_chart_image
      service      = { type = "ClusterIP", port = local.dagster_webserver_port }
      nodeSelector = var.cpu_node_selector
      annotations  = local.pod_annotations
      readinessProbe = {
        httpGet          = { path = "/server_info", port = local.dagster_webserver_port }
        periodSeconds    = 20
        timeoutSeconds   = 10
        successThreshold = 1
        failureThreshold = 3
      }
    }

    "dagster-user-deployments" = {
      enabled        = true
      enableSubchart = true
      serviceAccount = { create = false }
      rbacEnabled    = false
      deployments = [{
        name               = "flywheel"
        image              = local.dagster_chart_image
        dagsterApiGrpcArgs = ["-m", local.user_code_module]
        port               = local.user_code_port
        env                = [{ name = "FLYWHEEL_PROFILE", value = local.profile }]
        envSecrets         = [{ name = local.env_secret_name }]
        # Run pods get this deployment's image, env and envSecrets.
        includeConfigInLaunchedRuns = { enabled = true }
        nodeSelector                = var.cpu_node_selector
        annotations                 = local.pod_annotations
      }]
    }

    dagsterDaemon = {
      image        = local.dagster_chart_image
      nodeSelector = var.cpu_node_selector
      annotations  = local.pod_annotations
      runCoordinator = {
        enabled = true
        type    = "QueuedRunCoordinator"
        # No run_coordinator config at all: its limits are under `concurrency` below, as in
        # pipelines/instance.py, and Dagster refuses to start when max_concurrent_runs (which the
        # chart otherwise renders, as -1 when unset) appears next to a `concurrency` block.
        # Nulls delete the chart's defaults, so the template renders no `config:`.
        config = {
          queuedRunCoordinator = {
            maxConcurrentRuns             = null
            dequeueIntervalSeconds        = null
            dequeueUseThreads             = null
            dequeueNumWorkers             = null
            blockOpConcurrencyLimitedRuns = null
          }
        }
      }
      # pipelines/instance.py RUN_MONITORING.
      runMonitoring = { enabled = true, startTimeoutSeconds = 300, pollIntervalSeconds = 60 }
      # Rendered from additionalInstanceConfig instead: the chart's run_retries template writes
      # only enabled and max_retries, and retry_on_asset_or_op_failure defaults to true.
      runRetries = { enabled = false }
    }

    # pipelines/instance.py RUN_RETRIES, verbatim into dagster.yaml.
    additionalInstanceConfig = {
      run_retries = { enabled = true, max_retries = 1, retry_on_asset_or_op_failure = false }
    }

    # pipelines/instance.py cluster_settings: runs at once, and the `gpu` pool (the only pool the
    # assets use) limited through the default pool limit, per op.
    concurrency = {
      enabled = true
      runs    = { maxConcurrentRuns = var.max_concurrent_runs }
      pools   = { defaultLimit = var.gpu_pool_limit, granularity = "op" }
    }

    runLauncher = {
      type = "K8sRunLauncher"
      config = {
        k8sRunLauncher = {
          jobNamespace        = var.namespace
          loadInclusterConfig = true
          envSecrets          = [{ name = local.env_secret_name }]
          imagePullPolicy     = "IfNotPresent"
          # A run pod lives as long as its run and holds its state; a node autoscaler that
          # consolidates the CPU nodes must not evict it (it would fail the whole run).
          runK8sConfig = {
            podTemplateSpecMetadata = {
              annotations = { "cluster-autoscaler.kubernetes.io/safe-to-evict" = "false" }
            }
          }
        }
      }
    }
  }

  # --- MLflow -------------------------------------------------------------------------------

  # The Service is "<fullnameOverride>" on port service.port: exactly the host and port of
  # env MLFLOW_TRACKING_URI (checked by flywheel_env's precondition).
  mlflow_service      = "mlflow"
  mlflow_port         = 5000
  mlflow_host         = "${local.mlflow_service}.${var.namespace}.svc.cluster.local"
  mlflow_tracking_uri = "http://${local.mlflow_host}:${local.mlflow_port}"
  # The server proxies artifact uploads and downloads, so only its own identity needs access to
  # this prefix (on AWS the infra layer's MLflow role is scoped to exactly it).
  mlflow_artifacts_destination = "${var.artifact_root}/mlflow"

  # MLflow 3's server rejects Host headers other than localhost and private IPs unless listed
  # (DNS-rebinding protection), and in-cluster clients send the Service's DNS name. The list
  # replaces the defaults, so localhost stays in it for `kubectl port-forward`.
  mlflow_allowed_hosts = [
    local.mlflow_host,
    "${local.mlflow_host}:*",
    "${local.mlflow_service}.${var.namespace}.svc:*",
    "${local.mlflow_service}.${var.namespace}:*",
    "${local.mlflow_service}:*",
    "localhost",
    "localhost:*",
    "127.0.0.1:*",
  ]

  mlflow_values = {
    fullnameOverride = local.mlflow_service
    serviceAccount   = { create = false, name = var.mlflow_service_account }
    service          = { enabled = true, type = "ClusterIP", port = local.mlflow_port }

    backendStore = {
      databaseMigration = true
      postgres = {
        enabled  = true
        host     = var.db_host
        port     = var.db_port
        database = var.mlflow_database_name
      }
      existingDatabaseSecret = {
        name        = local.mlflow_database_secret
        usernameKey = "username"
        passwordKey = "password"
      }
    }

    artifactRoot = {
      proxiedArtifactStorage      = true
      defaultArtifactsDestination = local.mlflow_artifacts_destination
    }

    extraEnvVars = {
      # The chart connects through libpq's PG* variables; this makes TLS required, not preferred.
      PGSSLMODE                   = "require"
      MLFLOW_SERVER_ALLOWED_HOSTS = join(",", local.mlflow_allowed_hosts)
    }

    nodeSelector   = var.cpu_node_selector
    podAnnotations = local.pod_annotations
  }

  # --- NVIDIA device plugin -----------------------------------------------------------------

  # Advertises nvidia.com/gpu on the GPU nodes; without it no GPU pod is ever scheduled.
  device_plugin_values = {
    nodeSelector = var.gpu_node_selector
    tolerations  = var.gpu_tolerations
    # The chart's default affinity requires Node Feature Discovery labels, which nothing here
    # sets: it would keep the plugin off every node. Null deletes it; the node selector above
    # places the plugin instead.
    affinity = null
  }
}

resource "helm_release" "dagster" {
  name       = local.dagster_release
  namespace  = kubernetes_namespace_v1.this.metadata[0].name
  repository = "https://dagster-io.github.io/helm"
  chart      = "dagster"
  version    = var.dagster_chart_version
  values     = [yamlencode(local.dagster_values)]
  # The code server imports torch and the whole pipeline before it is ready.
  timeout = 900

  depends_on = [
    kubernetes_secret_v1.flywheel_env,
    kubernetes_secret_v1.dagster_postgresql,
    kubernetes_role_binding_v1.runner,
    kubernetes_service_account_v1.runner,
  ]
}

resource "helm_release" "mlflow" {
  name       = local.mlflow_service
  namespace  = kubernetes_namespace_v1.this.metadata[0].name
  repository = "https://community-charts.github.io/helm-charts"
  chart      = "mlflow"
  version    = var.mlflow_chart_version
  values     = [yamlencode(local.mlflow_values)]
  timeout    = 600

  depends_on = [
    kubernetes_job_v1.mlflow_database,
    kubernetes_secret_v1.mlflow_database,
    kubernetes_service_account_v1.mlflow,
  ]
}

resource "helm_release" "nvidia_device_plugin" {
  name       = "nvidia-device-plugin"
  namespace  = "kube-system"
  repository = "https://nvidia.github.io/k8s-device-plugin"
  chart      = "nvidia-device-plugin"
  version    = var.nvidia_device_plugin_chart_version
  values     = [yamlencode(local.device_plugin_values)]
  # A DaemonSet on a group that may have zero nodes: nothing to wait for until a GPU step runs.
  wait = false
}
