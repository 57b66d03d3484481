"""Kubernetes manifests of the scale-out path (issue 23), rendered from a profile as plain dicts.

    python -m pipelines.k8s_manifests --profile cluster --out k8s/     # then: kubectl apply -f k8s/
    python -m pipelines.k8s_manifests --profile cluster --out k8s/ --job sft --nnodes 4
    python -m pipelines.k8s_manifests --profile cluster --out k8s/ --agent champion

The first writes the sandbox service (verifiers/sandbox_service.py) and what it needs: its
ServiceAccount, the seccomp profile (a ConfigMap), a Deployment on the sandbox node group, a
ClusterIP Service at the host and port of `sandbox.url`, a NetworkPolicy that admits only the step
and training-job pods, a HorizontalPodAutoscaler on CPU and a PodDisruptionBudget. The token
Secret is not rendered (a file would hold the secret): the platform layer creates it
(infra/terraform/modules/platform). `--job` adds a multi-node training job: an Indexed Job of
`nnodes` pods, each running torchrun over `orchestration.k8s.gpus_per_step` GPUs, and the
headless Service its pods find rank 0 through. `--agent ALIAS` adds the served agent: a Deployment
running `python -m pipelines.serve --alias ALIAS` (MLflow's model server on the registry version) and
its Service (docs/deploy.md, "Serving the champion").

Nothing here talks to a cluster. tests/pipelines/test_k8s_manifests.py validates every object against the
Kubernetes API's schemas (kubernetes-validate, strict) for the eks module's Kubernetes version.
docs/sandbox.md ("Bubblewrap in a Kubernetes pod") says why the service pod is shaped as it is;
docs/deploy.md ("Scaling out") how to apply this and what runs where.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

from configs import ConfigError, FlywheelConfig, load_profile, parse_override
from configs.schema import SandboxConfig
from pipelines.k8s import NO_EVICTION

PART_OF = {"app.kubernetes.io/part-of": "agentic-flywheel"}

# --- the sandbox service ------------------------------------------------------------------------

# The sandbox node group of infra/terraform/modules/eks: its label and its taint, which keeps
# every other pod off the nodes where policy-written code runs (tests compare both with the HCL).
SANDBOX_NODE_SELECTOR = {"flywheel/node-pool": "sandbox"}
SANDBOX_TOLERATIONS = [{"key": "flywheel/sandbox", "operator": "Exists", "effect": "NoSchedule"}]

# Written by the platform layer (infra/terraform/modules/platform); the same value is in flywheel-env
# under `sandbox.token_env`, which is how the step and training pods (the clients) get it.
SANDBOX_TOKEN_SECRET = "flywheel-sandbox-token"
SANDBOX_TOKEN_KEY = "token"
# The service reads its token from this file (the Secret, mounted read-only, mode 0400), never from
# its environment, where it would stay readable in /proc/<pid>/environ (verifiers/sandbox_service.py).
SANDBOX_TOKEN_DIR = "/var/run/secrets/flywheel/sandbox"
SANDBOX_TOKEN_FILE = f"{SANDBOX_TOKEN_DIR}/{SANDBOX_TOKEN_KEY}"

# verifiers/sandbox_service.py serves both without a token, so probes and scrapers need no secret.
HEALTH_PATH = "/healthz"
METRICS_PATH = "/metrics"

# Exactly what the pool needs, measured: the sandbox tests (tests/test_sandbox*.py) pass with only
# these five in the bounding set (capsh --drop of all others). SYS_ADMIN: bwrap's namespaces and
# mounts, the worker's scratch tmpfs; NET_ADMIN: bwrap brings up `lo` in the new network namespace
# (without it: "bwrap: loopback: Failed RTM_NEWADDR"; the runtime's default set lacks it);
# SETUID/SETGID: the per-slot uids; KILL: signalling every process of a call at the wall clock.
SANDBOX_CAPABILITIES = ["SYS_ADMIN", "NET_ADMIN", "SETUID", "SETGID", "KILL"]

# The Localhost seccomp profile is a path under the kubelet's seccomp root. The service pod's init
# container writes it there from the ConfigMap before the service container starts, so the pod
# brings its own profile to whichever node it lands on (the kubelet reads it at container creation).
KUBELET_SECCOMP_DIR = "/var/lib/kubelet/seccomp"
SECCOMP_PROFILE = "profiles/flywheel-sandbox.json"

# Refused to the whole service container with EPERM; everything else is allowed. Not the runtime's
# default plus pivot_root: that default is an allow list kept in containerd's source, not on the
# node. These are what Docker documents its default profile as blocking ("Significant syscalls
# blocked by the default profile"), minus what bwrap and the pool make (clone and unshare for the
# namespaces, mount, umount2, pivot_root, chroot, sethostname), plus io_uring (the service's event
# loop falls back without it) and pidfd_getfd. Checked by running tests/test_sandbox*.py under this
# list as a seccomp filter, with only SANDBOX_CAPABILITIES and a read-only root but for /tmp.
# The sandboxed code is also under the pool's own, tighter filter (verifiers/sandbox.py).
DENIED_SYSCALLS = {
    "modules, kexec, reboot": (
        "init_module",
        "finit_module",
        "delete_module",
        "create_module",
        "query_module",
        "get_kernel_syms",
        "kexec_load",
        "kexec_file_load",
        "reboot",
    ),
    "clocks": ("clock_settime", "clock_adjtime", "settimeofday", "stime"),
    "swap, accounting, quotas": ("swapon", "swapoff", "acct", "quotactl", "quotactl_fd"),
    "keyrings (outlive the call)": ("add_key", "request_key", "keyctl"),
    "other processes' memory": ("ptrace", "process_vm_readv", "process_vm_writev", "kcmp", "pidfd_getfd"),
    "kernel attack surface": (
        "bpf",
        "perf_event_open",
        "userfaultfd",
        "io_uring_setup",
        "io_uring_enter",
        "io_uring_register",
        "fanotify_init",
        "lookup_dcookie",
        "syslog",
    ),
    "inodes by handle (escapes a bind mount)": ("open_by_handle_at", "name_to_handle_at"),
    "joining other namespaces": ("setns",),
    "NUMA placement": ("mbind", "set_mempolicy", "get_mempolicy", "move_pages"),
    "obsolete": ("nfsservctl", "uselib", "ustat", "sysfs", "_sysctl", "vm86", "vm86old"),
}
# Names resolve per ABI, so a 32-bit call cannot slip past a 64-bit name.
SECCOMP_ARCHITECTURES = ["SCMP_ARCH_X86_64", "SCMP_ARCH_X86", "SCMP_ARCH_X32", "SCMP_ARCH_AARCH64", "SCMP_ARCH_ARM"]

# Who may call the service. dagster-k8s labels every step pod with its common labels plus
# app.kubernetes.io/component=step_worker (dagster_k8s.executor); training pods carry flywheel/job
# (the Pipes launcher's base_pod_meta, assets/launcher.py, and training_job below). Nothing else
# in the namespace (webserver, daemon, code server, MLflow, run pods) reaches it.
SANDBOX_CLIENTS = [
    {
        "podSelector": {
            "matchLabels": {"app.kubernetes.io/name": "dagster", "app.kubernetes.io/component": "step_worker"}
        }
    },
    {"podSelector": {"matchExpressions": [{"key": "flywheel/job", "operator": "Exists"}]}},
    {"podSelector": {"matchLabels": {"app.kubernetes.io/name": "flywheel-agent"}}},  # the served agent's code calls
]

SERVICE_OVERHEAD_MB = 512  # uvicorn, the pool's host side and its threads, next to the calls
TMP_MB = 64  # the host side's temp files (each worker's stderr log); the code never sees this /tmp


def seccomp_profile() -> dict[str, Any]:
    """The service container's Localhost seccomp profile (OCI/runc JSON)."""
    names = sorted({name for group in DENIED_SYSCALLS.values() for name in group})
    # EPERM
    return {
        "defaultAction": "SCMP_ACT_ALLOW",
        "architectures": list(SECCOMP_ARCHITECTURES),
        "syscalls": [{"names": names, "action": "SCMP_ACT_ERRNO", "errnoRet": 1}],
    }


def sandbox_address(cfg: FlywheelConfig) -> tuple[str, int]:
    """The Service's name and port, read from `sandbox.url`, so the profile's clients and the
    manifests cannot disagree: http://<name>.<namespace>.svc[.cluster.local]:<port>."""
    namespace = cfg.orchestration.k8s.namespace
    url = urlsplit(cfg.sandbox.url or "")
    name, _, domain = (url.hostname or "").partition(".")
    if (
        cfg.sandbox.kind != "http"
        or url.scheme != "http"
        or not name
        or domain not in (f"{namespace}.svc", f"{namespace}.svc.cluster.local")
    ):
        raise ValueError(
            f"the sandbox service needs sandbox.kind http and sandbox.url http://<service>.{namespace}.svc.cluster.local:<port> "
            f"(a Service in orchestration.k8s.namespace; the service speaks plain HTTP), got kind {cfg.sandbox.kind!r}, "
            f"url {cfg.sandbox.url!r}"
        )
    return name, url.port or 80


def service_resources(sandbox: SandboxConfig, workers: int) -> dict[str, dict[str, str]]:
    """A core per worker (a call is CPU-bound up to its limit; the HPA scales on this request).
    Memory: requested for one process per call at its RLIMIT_AS, limited at every call holding
    `max_processes` of them (RLIMIT_AS is per process: docs/sandbox.md, "Total memory per call")."""
    request_mb = workers * sandbox.memory_mb + SERVICE_OVERHEAD_MB + TMP_MB
    limit_mb = workers * sandbox.max_processes * sandbox.memory_mb + SERVICE_OVERHEAD_MB + TMP_MB
    return {"requests": {"cpu": str(workers), "memory": f"{request_mb}Mi"}, "limits": {"memory": f"{limit_mb}Mi"}}


def _meta(name: str, namespace: str, labels: dict[str, str]) -> dict[str, Any]:
    return {"name": name, "namespace": namespace, "labels": dict(labels)}


def _cluster_ip_service(meta: dict[str, Any], selector: dict[str, str], port: int) -> dict[str, Any]:
    """A Service inside the cluster only, from `port` to the pods' port named `http`."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": meta,
        "spec": {
            "type": "ClusterIP",
            "selector": selector,
            "ports": [{"name": "http", "port": port, "targetPort": "http", "protocol": "TCP"}],
        },
    }


def _health_probe(**timing: int) -> dict[str, Any]:
    return {"httpGet": {"path": HEALTH_PATH, "port": "http"}, "timeoutSeconds": 5, **timing}


def _service_container(cfg: FlywheelConfig, port: int, workers: int) -> dict[str, Any]:
    sandbox = cfg.sandbox
    # The service's limits are the profile's: the client compares them when it opens and refuses a mismatch.
    command = [
        "python",
        "-m",
        "verifiers.sandbox_service",
        "--host",
        "0.0.0.0",
        "--port",
        str(port),
        "--token-file",
        SANDBOX_TOKEN_FILE,
        "--pool-size",
        str(workers),
        "--timeout-s",
        str(sandbox.timeout_s),
        "--memory-mb",
        str(sandbox.memory_mb),
        "--max-processes",
        str(sandbox.max_processes),
        "--max-files",
        str(sandbox.max_files),
        "--max-output-bytes",
        str(sandbox.max_output_bytes),
    ]
    return {
        "name": "sandbox",
        "image": _image(cfg.orchestration.k8s.image, "orchestration.k8s.image"),
        "command": command,
        "ports": [{"name": "http", "containerPort": port, "protocol": "TCP"}],
        "readinessProbe": _health_probe(periodSeconds=10, failureThreshold=3),
        # /healthz fails once no worker is alive; a call would restart them, but a pod in that state is replaced.
        "livenessProbe": _health_probe(initialDelaySeconds=15, periodSeconds=20, failureThreshold=3),
        "resources": service_resources(sandbox, workers),
        "securityContext": {
            # root with the host's user namespace: bwrap is not setuid and creates no user namespace,
            # and the per-slot uids must exist (docs/sandbox.md). allowPrivilegeEscalation is left
            # unset: the API refuses false next to CAP_SYS_ADMIN; bwrap sets no_new_privs itself.
            "runAsUser": 0,
            "runAsGroup": 0,
            "runAsNonRoot": False,
            "privileged": False,
            "capabilities": {"drop": ["ALL"], "add": list(SANDBOX_CAPABILITIES)},
            "readOnlyRootFilesystem": True,
            "seccompProfile": {"type": "Localhost", "localhostProfile": SECCOMP_PROFILE},
            # the runtime's default AppArmor profile denies mount, which bwrap and the worker need
            "appArmorProfile": {"type": "Unconfined"},
        },
        "volumeMounts": [
            {"name": "tmp", "mountPath": "/tmp"},
            # From the Secret, never a literal, and as a file: not in the environment (SANDBOX_TOKEN_FILE)
            {"name": "sandbox-token", "mountPath": SANDBOX_TOKEN_DIR, "readOnly": True},
        ],
    }


def _profile_installer(cfg: FlywheelConfig) -> dict[str, Any]:
    """Init container: copies the profile into the kubelet's seccomp dir (rename: a second pod on
    the node never reads half a file). Root for the root-owned dir; no capability, no escalation."""
    target = f"/host-seccomp/{Path(SECCOMP_PROFILE).name}"
    return {
        "name": "seccomp-profile",
        "image": _image(cfg.orchestration.k8s.image, "orchestration.k8s.image"),
        "command": [
            "sh",
            "-c",
            f"cp /profile/{Path(SECCOMP_PROFILE).name} {target}.tmp && mv -f {target}.tmp {target}",
        ],
        "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}, "limits": {"memory": "32Mi"}},
        "securityContext": {
            "runAsUser": 0,
            "runAsNonRoot": False,
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "volumeMounts": [
            {"name": "seccomp-profile", "mountPath": "/profile", "readOnly": True},
            {"name": "host-seccomp", "mountPath": "/host-seccomp"},
        ],
    }


def _service_pod(
    cfg: FlywheelConfig, name: str, port: int, workers: int, labels: dict[str, str], profile: str
) -> dict[str, Any]:
    """The Deployment's pod template."""
    selector = {"app.kubernetes.io/name": name}
    profile_dir = f"{KUBELET_SECCOMP_DIR}/{Path(SECCOMP_PROFILE).parent}"
    return {
        "metadata": {
            "labels": dict(labels),
            "annotations": {
                # a new profile must reach new containers: the ConfigMap alone would not roll the pods
                "flywheel/seccomp-profile-sha256": hashlib.sha256(profile.encode()).hexdigest(),
                "prometheus.io/scrape": "true",
                "prometheus.io/port": str(port),
                "prometheus.io/path": METRICS_PATH,
            },
        },
        "spec": {
            "serviceAccountName": name,
            "automountServiceAccountToken": False,  # the service never calls the Kubernetes API
            "hostUsers": True,  # no pod user namespace: it maps too few uids for the per-slot uids
            "nodeSelector": dict(SANDBOX_NODE_SELECTOR),
            "tolerations": [dict(t) for t in SANDBOX_TOLERATIONS],
            "topologySpreadConstraints": [
                {
                    "maxSkew": 1,
                    "topologyKey": "kubernetes.io/hostname",
                    "whenUnsatisfiable": "ScheduleAnyway",
                    "labelSelector": {"matchLabels": selector},
                }
            ],
            "initContainers": [_profile_installer(cfg)],
            "containers": [_service_container(cfg, port, workers)],
            "volumes": [
                {"name": "tmp", "emptyDir": {"medium": "Memory", "sizeLimit": f"{TMP_MB}Mi"}},
                {"name": "seccomp-profile", "configMap": {"name": f"{name}-seccomp"}},
                {"name": "host-seccomp", "hostPath": {"path": profile_dir, "type": "DirectoryOrCreate"}},
                {
                    "name": "sandbox-token",
                    "secret": {
                        "secretName": SANDBOX_TOKEN_SECRET,
                        "items": [{"key": SANDBOX_TOKEN_KEY, "path": SANDBOX_TOKEN_KEY}],
                        "defaultMode": 0o400,  # the service (root) only; it refuses a file others can read
                    },
                },
            ],
        },
    }


def sandbox_service(
    cfg: FlywheelConfig, *, workers: int = 3, min_replicas: int = 2, max_replicas: int = 8, target_cpu_percent: int = 70
) -> list[dict[str, Any]]:
    """The sandbox service's objects, in the order `kubectl apply -f` should create them.

    workers: the pool size of one replica (`--pool-size`), one CPU each; 3 lets two replicas share
    one of the eks module's default sandbox nodes (c6i.2xlarge, 8 vCPUs). At least 2 replicas: the
    PodDisruptionBudget lets a drain take one at a time, which must not be the only one.
    max_replicas: the sandbox node group's maximum size times the replicas a node holds.
    """
    if not 2 <= min_replicas <= max_replicas or workers < 1:
        raise ValueError(
            f"the sandbox service needs 2 <= min_replicas <= max_replicas (one replica would be evicted whole by a node "
            f"drain) and workers >= 1, got {min_replicas}, {max_replicas}, {workers}"
        )
    name, port = sandbox_address(cfg)
    namespace = cfg.orchestration.k8s.namespace
    selector = {"app.kubernetes.io/name": name}
    labels = {**selector, "app.kubernetes.io/component": "sandbox", **PART_OF}
    meta = _meta(name, namespace, labels)
    profile = json.dumps(seccomp_profile(), indent=2, sort_keys=True)
    cpu_target = {"type": "Utilization", "averageUtilization": target_cpu_percent}
    return _plain(
        [
            {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta, "automountServiceAccountToken": False},
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": _meta(f"{name}-seccomp", namespace, labels),
                "data": {Path(SECCOMP_PROFILE).name: profile},
            },
            # No `replicas`: the HPA owns it, and a re-apply would reset it.
            {
                "apiVersion": "apps/v1",
                "kind": "Deployment",
                "metadata": meta,
                "spec": {
                    "selector": {"matchLabels": selector},
                    "revisionHistoryLimit": 3,
                    "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}},
                    "template": _service_pod(cfg, name, port, workers, labels, profile),
                },
            },
            _cluster_ip_service(meta, selector, port),
            # Ingress from the clients on the service's port only; no egress at all (the service needs
            # none, and a compromised one then reaches neither the API server, nor IMDS, nor the
            # internet). Kubelet probes come from the node and are not subject to it.
            {
                "apiVersion": "networking.k8s.io/v1",
                "kind": "NetworkPolicy",
                "metadata": meta,
                "spec": {
                    "podSelector": {"matchLabels": selector},
                    "policyTypes": ["Ingress", "Egress"],
                    "ingress": [{"from": SANDBOX_CLIENTS, "ports": [{"protocol": "TCP", "port": port}]}],
                    "egress": [],
                },
            },
            {
                "apiVersion": "autoscaling/v2",
                "kind": "HorizontalPodAutoscaler",
                "metadata": meta,
                "spec": {
                    "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": name},
                    "minReplicas": min_replicas,
                    "maxReplicas": max_replicas,
                    "metrics": [{"type": "Resource", "resource": {"name": "cpu", "target": cpu_target}}],
                },
            },
            {
                "apiVersion": "policy/v1",
                "kind": "PodDisruptionBudget",
                "metadata": meta,
                "spec": {"maxUnavailable": 1, "selector": {"matchLabels": selector}},
            },
        ]
    )


# --- a multi-node training job ------------------------------------------------------------------

RENDEZVOUS_PORT = 29500  # torchrun's --master-port default
# Pods of one Job may start minutes apart (GPU nodes scale from zero, the trainer image is large):
# rank 0 waits this long for the others (torchrun's static rendezvous waits 600 s by default).
RENDEZVOUS_TIMEOUT_S = 1800
_DNS_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


def torchrun_command(job: str, *, nnodes: int, gpus_per_node: int, master: str) -> list[str]:
    """torchrun (`python -m torch.distributed.run`, as assets/launcher.py runs it) with its static
    rendezvous: node rank = the pod's completion index, and rank 0's pod hosts the store at
    `master`. (The c10d backend ignores --node-rank and elects its store host by address.)"""
    return [
        "python",
        "-m",
        "torch.distributed.run",
        f"--nnodes={nnodes}",
        f"--nproc-per-node={gpus_per_node}",
        "--node-rank=$(NODE_RANK)",
        "--rdzv-backend=static",
        f"--master-addr={master}",
        f"--master-port={RENDEZVOUS_PORT}",
        f"--rdzv-conf=timeout={RENDEZVOUS_TIMEOUT_S}",
        "-m",
        "assets.jobs",
        job,
    ]


def _training_container(cfg: FlywheelConfig, job: str, nnodes: int, master: str, env: dict[str, str]) -> dict[str, Any]:
    k8s = cfg.orchestration.k8s
    gpus = str(k8s.gpus_per_step)
    resources = {kind: {**values, "nvidia.com/gpu": gpus} for kind, values in k8s.gpu_step_resources.items()}
    for kind in ("requests", "limits"):  # extended resources: request and limit must match
        resources.setdefault(kind, {"nvidia.com/gpu": gpus})
    completion_index = "metadata.annotations['batch.kubernetes.io/job-completion-index']"
    container: dict[str, Any] = {
        "name": "train",
        "image": _image(k8s.gpu_image or k8s.image, "orchestration.k8s.gpu_image"),
        "command": torchrun_command(job, nnodes=nnodes, gpus_per_node=k8s.gpus_per_step, master=master),
        "env": [
            {"name": "NODE_RANK", "valueFrom": {"fieldRef": {"fieldPath": completion_index}}},
            *({"name": key, "value": value} for key, value in env.items()),
        ],
        "ports": [{"name": "rendezvous", "containerPort": RENDEZVOUS_PORT, "protocol": "TCP"}],
        "resources": resources,
        # NCCL's and the DataLoader's shared memory: the runtime's /dev/shm is 64 MB. A memory-backed
        # emptyDir is sized to the pod's memory limit, and what is written there counts against it.
        "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"}],
    }
    if k8s.env_secret:
        container["envFrom"] = [{"secretRef": {"name": k8s.env_secret}}]
    return container


def training_job(
    cfg: FlywheelConfig, job: str, *, nnodes: int = 1, env: dict[str, str] | None = None, name: str | None = None
) -> list[dict[str, Any]]:
    """A headless Service and an Indexed Job of `nnodes` pods running `python -m assets.jobs <job>`
    under torchrun, `gpus_per_step` GPUs each. `env` is added to the container (a launcher's Dagster
    Pipes variables); `name` defaults to flywheel-<job> (with dashes). One node is nnodes=1."""
    k8s = cfg.orchestration.k8s
    name = name or f"flywheel-{job.replace('_', '-')}"
    # Pod hostnames are <name>-<index> and the Service is <name>: both must be DNS labels.
    if nnodes < 1 or not _DNS_LABEL.match(name) or len(f"{name}-{nnodes - 1}") > 63:
        raise ValueError(
            f"training job {name!r} with nnodes={nnodes}: need nnodes >= 1 and a DNS label name "
            f"(lower case, digits, '-') of at most {62 - len(str(nnodes - 1))} characters"
        )
    # The Job controller names the pod of index i `<name>-<i>`; with `subdomain` that is a DNS name
    # in the headless Service below: <name>-0.<name> from any pod of the namespace.
    master = f"{name}-0.{name}"
    labels = {"flywheel/job": job, **PART_OF}
    pod = {
        "metadata": {"labels": labels, "annotations": NO_EVICTION},
        "spec": {
            "subdomain": name,
            "restartPolicy": "Never",
            "serviceAccountName": k8s.service_account,
            "nodeSelector": k8s.gpu_node_selector,
            "tolerations": k8s.gpu_tolerations,
            "containers": [_training_container(cfg, job, nnodes, master, env or {})],
            "volumes": [{"name": "dshm", "emptyDir": {"medium": "Memory"}}],
        },
    }
    rendezvous = {"name": "rendezvous", "port": RENDEZVOUS_PORT, "targetPort": RENDEZVOUS_PORT, "protocol": "TCP"}
    return _plain(
        [
            # publishNotReadyAddresses: rank 0's DNS name exists as soon as its pod has an address.
            {
                "apiVersion": "v1",
                "kind": "Service",
                "metadata": _meta(name, k8s.namespace, labels),
                "spec": {
                    "clusterIP": "None",
                    "publishNotReadyAddresses": True,
                    "selector": {"batch.kubernetes.io/job-name": name},
                    "ports": [rendezvous],
                },
            },
            # backoffLimit 0: a failed rank fails the Job, and Dagster's retry policy reruns the step
            # (which resumes from its saved state), as for every other step pod (pipelines/k8s.py).
            {
                "apiVersion": "batch/v1",
                "kind": "Job",
                "metadata": _meta(name, k8s.namespace, labels),
                "spec": {
                    "completionMode": "Indexed",
                    "completions": nnodes,
                    "parallelism": nnodes,
                    "backoffLimit": 0,
                    "ttlSecondsAfterFinished": 24 * 3600,
                    "template": pod,
                },
            },
        ]
    )


# --- the served agent ---------------------------------------------------------------------------

AGENT_PORT = 8080


def agent_server(cfg: FlywheelConfig, *, alias: str, profile: str, replicas: int = 1) -> list[dict[str, Any]]:
    """A Deployment serving the registry version `alias` points at (`python -m pipelines.serve`,
    MLflow's model server on the agent model, training/agent/served.py) and its ClusterIP Service.
    Each pod resolves the alias when it starts: a rollout restart after a promotion or a rollback
    serves the new champion. The engine is the profile's (`rollout.engine`): vLLM on a GPU node, or
    HF on a CPU node. MLflow's and S3's settings and the sandbox token come from `env_secret`; the
    code the agent runs goes to the sandbox service, whose NetworkPolicy admits these pods."""
    k8s = cfg.orchestration.k8s
    name = "flywheel-agent"
    labels = {"app.kubernetes.io/name": name, "app.kubernetes.io/component": "agent", **PART_OF}
    gpu = cfg.rollout.engine == "vllm"
    if gpu:
        resources = {kind: {**values, "nvidia.com/gpu": "1"} for kind, values in k8s.gpu_step_resources.items()}
        for kind in ("requests", "limits"):  # extended resources: request and limit must match
            resources.setdefault(kind, {"nvidia.com/gpu": "1"})
    else:
        resources = k8s.cpu_step_resources
    container: dict[str, Any] = {
        "name": "agent",
        "image": _image(k8s.gpu_image or k8s.image if gpu else k8s.image, "orchestration.k8s.image"),
        "command": [
            "python",
            "-m",
            "pipelines.serve",
            "--profile",
            profile,
            "--alias",
            alias,
            "--host",
            "0.0.0.0",
            "--port",
            str(AGENT_PORT),
        ],
        "ports": [{"name": "http", "containerPort": AGENT_PORT, "protocol": "TCP"}],
        "resources": resources,
        # the model is downloaded from S3 and (vLLM) compiled before /ping answers: minutes, not seconds
        "startupProbe": {
            "httpGet": {"path": "/ping", "port": "http"},
            "periodSeconds": 10,
            "failureThreshold": 90,
        },
        "readinessProbe": {"httpGet": {"path": "/ping", "port": "http"}, "periodSeconds": 10},
        "livenessProbe": {"httpGet": {"path": "/health", "port": "http"}, "periodSeconds": 30, "timeoutSeconds": 10},
        "securityContext": {"allowPrivilegeEscalation": False, "runAsNonRoot": True},  # the image's USER (10001)
    }
    if k8s.env_secret:
        container["envFrom"] = [{"secretRef": {"name": k8s.env_secret}}]
    pod_spec: dict[str, Any] = {"serviceAccountName": k8s.service_account, "containers": [container]}
    if gpu:
        pod_spec |= {"nodeSelector": k8s.gpu_node_selector, "tolerations": k8s.gpu_tolerations}
    meta = _meta(name, k8s.namespace, labels)
    selector = {"app.kubernetes.io/name": name}
    return _plain(
        [
            {
                "apiVersion": "apps/v1",
                "kind": "Deployment",
                "metadata": meta,
                "spec": {
                    "replicas": replicas,
                    "selector": {"matchLabels": selector},
                    "template": {"metadata": {"labels": labels}, "spec": pod_spec},
                },
            },
            _cluster_ip_service(meta, selector, 80),
        ]
    )


def _plain(manifests: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Independent JSON-like dicts: no object shared between two places (YAML would write anchors
    for it, and a caller editing one manifest would edit another)."""
    return json.loads(json.dumps(manifests))


def _image(image: str | None, field: str) -> str:
    if not image:
        raise ValueError(f"rendering manifests needs an image: set {field}")
    return image


# --- all of it, and the CLI ---------------------------------------------------------------------


def render_all(
    cfg: FlywheelConfig,
    *,
    jobs: tuple[str, ...] = (),
    nnodes: int = 1,
    workers: int = 3,
    min_replicas: int = 2,
    max_replicas: int = 8,
    agent: str | None = None,
    profile: str = "cluster",
) -> list[dict[str, Any]]:
    """The sandbox service, then a training job per name in `jobs`, then the agent server for the
    alias `agent` (None: none)."""
    manifests = sandbox_service(cfg, workers=workers, min_replicas=min_replicas, max_replicas=max_replicas)
    for job in jobs:
        manifests += training_job(cfg, job, nnodes=nnodes)
    if agent:
        manifests += agent_server(cfg, alias=agent, profile=profile)
    return manifests


def write_manifests(manifests: list[dict[str, Any]], out: Path) -> list[Path]:
    """One YAML file per object, numbered so that `kubectl apply -f DIR` creates them in order."""
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for i, manifest in enumerate(manifests):
        path = out / f"{i:02d}-{manifest['kind'].lower()}-{manifest['metadata']['name']}.yaml"
        path.write_text(yaml.safe_dump(manifest, sort_keys=False))
        paths.append(path)
    return paths


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m pipelines.k8s_manifests",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--profile", default=None, help="profile (default: FLYWHEEL_PROFILE or tiny); the cluster one in practice"
    )
    parser.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="profile override, e.g. sandbox.timeout_s=3"
    )
    parser.add_argument("--out", required=True, type=Path, help="directory to write one YAML file per object into")
    parser.add_argument(
        "--job", action="append", default=[], help="also render a training job running `python -m assets.jobs JOB`"
    )
    parser.add_argument(
        "--nnodes",
        type=int,
        default=None,
        help="pods (nodes) of each training job, gpus_per_step GPUs each (default: orchestration.k8s.nnodes)",
    )
    parser.add_argument(
        "--agent",
        metavar="ALIAS",
        default=None,
        help="also render the agent server for the registry alias ALIAS (e.g. champion): pipelines/serve.py",
    )
    parser.add_argument(
        "--sandbox-workers", type=int, default=3, help="bubblewrap workers (and CPUs) per sandbox replica"
    )
    parser.add_argument(
        "--sandbox-min-replicas", type=int, default=2, help="the HPA's minimum (at least 2: the disruption budget)"
    )
    parser.add_argument(
        "--sandbox-max-replicas", type=int, default=8, help="the HPA's maximum; the sandbox node group must hold it"
    )
    args = parser.parse_args(argv)
    try:
        cfg = load_profile(args.profile, dict(parse_override(item) for item in args.set))
        manifests = render_all(
            cfg,
            jobs=tuple(args.job),
            nnodes=args.nnodes or cfg.orchestration.k8s.nnodes,
            workers=args.sandbox_workers,
            min_replicas=args.sandbox_min_replicas,
            max_replicas=args.sandbox_max_replicas,
            agent=args.agent,
            profile=args.profile or os.environ.get("FLYWHEEL_PROFILE", "cluster"),
        )
    except (ConfigError, ValueError) as exc:
        print(exc, file=sys.stderr)
        return 2
    for path in write_manifests(manifests, args.out):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
