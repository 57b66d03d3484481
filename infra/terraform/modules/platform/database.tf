# MLflow's backend store needs its own database on the server Dagster uses; nothing else creates
# it (the database module creates only Dagster's, with the instance). A Job rather than a
# provisioner: it runs inside the cluster, the only place the private database is reachable from.

locals {
  # PostgreSQL has no CREATE DATABASE IF NOT EXISTS, hence look first, create only when missing,
  # so re-applies and a retried pod are no-ops. A connection failure fails the lookup and then
  # the CREATE too, so the Job fails (and retries) instead of passing without a database. The
  # name is safe inside the SQL: mlflow_database_name is validated as a plain identifier.
  create_mlflow_database = <<-EOT
    psql -v ON_ERROR_STOP=1 -tAc "SELECT 1 FROM pg_database WHERE datname = '$MLFLOW_DATABASE'" | grep -qx 1 \
      || psql -v ON_ERROR_STOP=1 -c "CREATE DATABASE \"$MLFLOW_DATABASE\""
  EOT

  postgres_client_uid = 70 # the postgres user of the Alpine postgres images
}

resource "kubernetes_job_v1" "mlflow_database" {
  metadata {
    name      = "mlflow-create-database"
    namespace = kubernetes_namespace_v1.this.metadata[0].name
  }

  spec {
    backoff_limit = 6

    template {
      metadata {
        labels = { "app.kubernetes.io/name" = "mlflow-create-database" }
      }

      spec {
        restart_policy                  = "Never"
        automount_service_account_token = false
        node_selector                   = var.cpu_node_selector

        security_context {
          run_as_non_root = true
          run_as_user     = local.postgres_client_uid
          run_as_group    = local.postgres_client_uid
        }

        container {
          name    = "create-database"
          image   = var.postgres_client_image
          command = ["/bin/sh", "-c", local.create_mlflow_database]

          env {
            name  = "PGHOST"
            value = var.db_host
          }
          env {
            name  = "PGPORT"
            value = tostring(var.db_port)
          }
          # Connect to Dagster's database, which exists from the start, to create MLflow's.
          env {
            name  = "PGDATABASE"
            value = var.dagster_database_name
          }
          # TLS required, not merely preferred: the password must not cross the network in clear.
          env {
            name  = "PGSSLMODE"
            value = "require"
          }
          env {
            name  = "MLFLOW_DATABASE"
            value = var.mlflow_database_name
          }
          env {
            name = "PGUSER"
            value_from {
              secret_key_ref {
                name = kubernetes_secret_v1.mlflow_database.metadata[0].name
                key  = "username"
              }
            }
          }
          env {
            name = "PGPASSWORD"
            value_from {
              secret_key_ref {
                name = kubernetes_secret_v1.mlflow_database.metadata[0].name
                key  = "password"
              }
            }
          }

          security_context {
            allow_privilege_escalation = false
            read_only_root_filesystem  = true
            capabilities {
              drop = ["ALL"]
            }
          }
        }
      }
    }
  }

  # The MLflow release depends on this resource: Terraform waits for the Job to succeed.
  wait_for_completion = true

  timeouts {
    create = "10m"
    update = "10m"
  }
}
