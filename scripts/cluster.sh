#!/usr/bin/env bash
# The deployment guide's repo commands (docs/deploy.md), each reading what it needs from the
# Terraform outputs so nothing is copied by hand:
#
#   scripts/cluster.sh kubeconfig   kubectl access to the EKS cluster (aws eks update-kubeconfig)
#   scripts/cluster.sh images       build the three images and push them to the ECR repositories
#   scripts/cluster.sh env          the flywheel-env variables, as `export` lines (for a shell that
#                                   runs the cluster profile's commands, e.g. pipelines.instance)
#   scripts/cluster.sh ui           port-forward the Dagster UI (:3000) and MLflow (:5000) to this machine
#
# Needs terraform, and per command aws, docker or kubectl. INFRA_DIR and PLATFORM_DIR name the two
# root modules when they are not the repository's environments/aws ones.
set -euo pipefail
cd "$(dirname "$0")/.."

INFRA_DIR=${INFRA_DIR:-infra/terraform/environments/aws/infra}
PLATFORM_DIR=${PLATFORM_DIR:-infra/terraform/environments/aws/platform}

die() { echo "cluster.sh: $*" >&2; exit 1; }

infra_output() {
  # -raw only prints strings; maps come out as JSON with -json.
  terraform -chdir="$INFRA_DIR" output "$@" || die "no Terraform output $* in $INFRA_DIR: run terraform apply there first (docs/deploy.md, step 2)"
}

# One value of the infra layer's flywheel_env output (the contract with configs/cluster.yaml).
flywheel_env() {
  local outputs
  outputs=$(infra_output -json flywheel_env)
  python3 <<<"$outputs" -c 'import json, sys; env = json.load(sys.stdin); print(env[sys.argv[1]])' "$1"
}

case "${1:-}" in
  kubeconfig)
    # Assigned first: a failing $(...) inside a command's arguments would not stop the script.
    region=$(infra_output -raw region)
    cluster=$(infra_output -raw cluster_name)
    aws eks update-kubeconfig --region "$region" --name "$cluster"
    ;;
  images)
    image=$(flywheel_env FLYWHEEL_IMAGE)
    region=$(infra_output -raw region)
    aws ecr get-login-password --region "$region" | docker login --username AWS --password-stdin "${image%%/*}"
    # The nodes are x86_64 (ami_type AL2023_x86_64_*): build for it whatever the workstation is.
    for pair in trainer:FLYWHEEL_TRAINER_IMAGE dagster:FLYWHEEL_IMAGE sandbox:FLYWHEEL_SANDBOX_IMAGE; do
      name=${pair%%:*}
      ref=$(flywheel_env "${pair#*:}")
      [ -n "$ref" ] || die "flywheel_env has no ${pair#*:}"
      echo "[cluster] building $name -> $ref"
      docker build --platform linux/amd64 -f "docker/$name.Dockerfile" \
        --build-arg SOURCE_URL="$(git remote get-url origin 2>/dev/null || echo unknown)" \
        --build-arg REVISION="$(git rev-parse HEAD 2>/dev/null || echo unknown)" -t "$ref" .
      # The repositories have immutable tags: a second push of the same tag is refused, so a new
      # build needs a new image_tag (terraform apply -var image_tag=...).
      docker push "$ref"
    done
    ;;
  env)
    outputs=$(infra_output -json flywheel_env)
    python3 <<<"$outputs" -c '
import json, shlex, sys
for name, value in sorted(json.load(sys.stdin).items()):
    print(f"export {name}={shlex.quote(value)}")'
    ;;
  ui)
    # The platform layer's outputs hold the port-forward commands (Service names and ports are the
    # charts' and live there, not here).
    dagster=$(terraform -chdir="$PLATFORM_DIR" output -raw dagster_port_forward_command) \
      || die "no Terraform output dagster_port_forward_command in $PLATFORM_DIR: apply the platform layer first (docs/deploy.md, step 5)"
    mlflow=$(terraform -chdir="$PLATFORM_DIR" output -raw mlflow_port_forward_command)
    echo "[cluster] $dagster"
    echo "[cluster] $mlflow"
    echo "[cluster] Dagster UI on http://localhost:${dagster##*:}, MLflow on http://localhost:${mlflow##*:} (Ctrl-C stops both)"
    $dagster &
    $mlflow &
    trap 'kill $(jobs -p) 2>/dev/null || true' EXIT INT TERM
    wait
    ;;
  *)
    sed -n '2,12p' "$0" >&2
    exit 2
    ;;
esac
