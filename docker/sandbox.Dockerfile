# Image of the Docker verifier tier (verifiers/docker_sandbox.py::DockerSandbox): one throwaway
# container per call runs untrusted, model-written code as `python -I -c <bootstrap>`.
#
# Nothing is added to the Python base on purpose: no pip installs, no apt packages, no network
# tools (the slim base has neither curl nor wget), no project code. Fewer binaries and libraries
# are less to attack from inside, and the code under test sees the same standard library as on
# the trainer (same Python minor: 3.11, tests/test_dockerfiles.py checks it against DockerSandbox's
# default image).
#
# The isolation itself is applied at run time by verifiers/docker_sandbox.py, not here: network
# disabled, read-only root filesystem, a 16 MB tmpfs on /tmp as the only writable place, user
# 65534:65534, cap_drop ALL, no-new-privileges, memory/pids/CPU limits and ulimits (cpu, fsize,
# nofile, core). USER below only makes the image safe by default when run some other way.
#
# Build from the repository root:
#   docker buildx build --platform linux/amd64 -f docker/sandbox.Dockerfile -t REGISTRY/flywheel-sandbox:TAG .
FROM python:3.11.17-slim-bookworm

ARG SOURCE_URL=unknown
ARG REVISION=unknown
LABEL org.opencontainers.image.title="agentic-flywheel-sandbox" \
      org.opencontainers.image.description="Agentic flywheel Docker verifier tier: bare Python 3.11 for untrusted code, run by DockerSandbox with network off, read-only root, tmpfs /tmp and no capabilities" \
      org.opencontainers.image.source="${SOURCE_URL}" \
      org.opencontainers.image.revision="${REVISION}"

# `python -I` ignores PYTHON* variables; this covers any other use of the image (read-only root anyway).
ENV PYTHONDONTWRITEBYTECODE=1

WORKDIR /tmp

# nobody:nogroup, which Debian already has: no home, no shell, owns nothing in the image.
USER 65534:65534

# No HEALTHCHECK: a sandbox container lives for one `python -I -c` call and serves nothing.
#checkov:skip=CKV_DOCKER_2:One-shot container: DockerSandbox runs a single python -I -c call per container with the network off and removes it, so there is no long-running service to probe, and its own timeout ends a hung call.
